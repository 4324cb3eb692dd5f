//! The device side of the hybrid executor: the plan of one layer's device work
//! ([`GpuPlan`]: copies into slots, rounds of staged copies and (token, expert) pairs) and
//! the persistent worker thread that owns the device and runs it ([`Worker`],
//! [`DeviceSide`]).
//!
//! A key design decision: one persistent thread owns the device, the slots and its record
//! of what each slot holds, and runs jobs strictly in order. A prefetch copy queued before
//! a later layer's job is therefore complete before that job's kernels read the slot,
//! without events to track; the worker still checks, for every (token, expert) pair, that
//! its slot holds that expert before launching a kernel on it.

use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use strata_accel::{Buffer, Device, ExpertSlots, Op};

use crate::weights::HostExperts;
use crate::{Error, Result};

/// One (token, expert) pair computed on the device.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pair {
    pub(crate) row: u32,
    pub(crate) slot: u32,
    /// `(moe_layer, expert)` the slot must hold when the kernel runs.
    pub(crate) expert: (usize, u32),
    pub(crate) weight: f32,
    pub(crate) deferred: bool,
}

/// `(slot, moe_layer, expert)`: one expert copied into one slot.
pub(crate) type SlotCopy = (u32, usize, u32);

/// Device work of one layer: copies into cache slots, then rounds of staged copies and
/// kernels (round 0 also runs every resident expert).
#[derive(Debug, Default)]
pub(crate) struct GpuPlan {
    /// Copies into cache slots that this layer's GPU tasks read.
    pub(crate) uploads: Vec<SlotCopy>,
    /// Copies into cache slots for later layers or steps (prefetches), queued after this
    /// layer's job so they do not delay its results.
    pub(crate) later: Vec<SlotCopy>,
    /// Per round: staged copies, then the pairs to run.
    pub(crate) rounds: Vec<(Vec<SlotCopy>, Vec<Pair>)>,
    /// Experts streamed through the staging slots, in order.
    pub(crate) staged: Vec<u32>,
    /// The staging slots.
    pub(crate) staging: Vec<u32>,
}

impl GpuPlan {
    /// `(round, slot)` of a staged expert.
    pub(crate) fn staged_slot(&self, e: u32) -> Option<(usize, u32)> {
        let p = self.staged.iter().position(|&s| s == e)?;
        Some((p / self.staging.len(), self.staging[p % self.staging.len()]))
    }

    /// `(moe_layer, expert)` of every copy, in the order the log shows them.
    pub(crate) fn uploads_in_order(&self) -> Vec<(usize, u32)> {
        self.uploads
            .iter()
            .chain(&self.later)
            .chain(self.rounds.iter().flat_map(|r| &r.0))
            .map(|&(_, l, e)| (l, e))
            .collect()
    }

    /// Whether this layer has device work to wait for (copies it reads, or kernels).
    pub(crate) fn has_layer_work(&self) -> bool {
        !self.uploads.is_empty()
            || self
                .rounds
                .iter()
                .any(|r| !r.0.is_empty() || !r.1.is_empty())
    }
}

/// Where a layer's input rows are, and so where the device's share of its output goes.
pub(crate) enum LayerInput {
    /// On the host (`[t, hidden]`, empty when no kernel runs): uploaded, and the per-pair
    /// outputs read back and combined on the host.
    Host(Vec<f32>),
    /// Already on the device (`[t, hidden]` from offset 0): the outputs stay there and the
    /// caller combines them ([`DeviceCombine`]), with no read back.
    Device(Buffer),
}

/// The device's share of one layer's output.
#[derive(Debug, Default)]
pub(crate) struct GpuDone {
    /// Combined on the host (input on the host).
    pub(crate) out: Vec<f32>,
    pub(crate) deferred: Vec<f32>,
    /// Left on the device (input on the device): `(deferred, combine)`.
    pub(crate) combines: Vec<(bool, DeviceCombine)>,
}

/// Per-pair expert outputs left on the device, for the caller to add into its residual
/// stream: `out[t] += Σ_j weights[t, j] · y[pair_of[t, j]]` ([`Op::MoeCombine`]).
#[derive(Debug)]
pub struct DeviceCombine {
    /// The experts' outputs `[P + 1, hidden]`; the last row is zero where an entry pads.
    pub y: Arc<Buffer>,
    /// Weights `[tokens, k]` (0 where an entry pads).
    pub weights: Buffer,
    /// Row of `y` of each entry, u32 `[tokens, k]`.
    pub pair_of: Buffer,
    /// Tokens.
    pub tokens: u32,
    /// Entries per token.
    pub k: u32,
}

/// What the device worker did, summed (read by [`HybridExecutor::stats`]).
#[derive(Debug, Default, Clone)]
pub(crate) struct DeviceCounters {
    pub(crate) uploads: usize,
    pub(crate) bytes: u64,
    pub(crate) prefetched: usize,
    pub(crate) time: Duration,
}

/// A job of the device worker; jobs run in the order sent.
pub(crate) enum Job {
    /// One layer's device work; the result goes back on `reply`.
    Layer {
        plan: GpuPlan,
        x: LayerInput,
        t: usize,
        reply: mpsc::SyncSender<Result<GpuDone>>,
    },
    /// Copies for later layers or steps, nobody waiting; a failure is reported with the
    /// next layer's result.
    Copies(Vec<SlotCopy>),
    /// Answers once every job sent before it has run.
    Flush(mpsc::SyncSender<()>),
}

/// The persistent device worker: the sending end of its jobs and its thread.
pub(crate) struct Worker {
    /// Bounded: a layer waits to queue more once a step's worth of jobs (a layer's job
    /// and its prefetches, per MoE layer) is queued, so prefetches the device cannot keep
    /// up with slow the model down instead of piling up.
    jobs: mpsc::SyncSender<Job>,
    thread: Option<JoinHandle<()>>,
    counters: Arc<Mutex<DeviceCounters>>,
}

impl Worker {
    pub(crate) fn start(side: DeviceSide) -> Result<Worker> {
        let (jobs, rx) = mpsc::sync_channel(2 * side.host.n_layers().max(1));
        let counters = side.counters.clone();
        let thread = std::thread::Builder::new()
            .name("strata-exec-device".into())
            .spawn(move || side.serve(&rx))
            .map_err(|e| Error::Config(format!("cannot start the device worker: {e}")))?;
        Ok(Worker {
            jobs,
            thread: Some(thread),
            counters,
        })
    }

    pub(crate) fn send(&self, job: Job) -> Result<()> {
        self.jobs.send(job).map_err(|_| stopped())
    }

    /// Queues `plan`'s layer work on `x: [t, hidden]`; the result comes on the receiver.
    pub(crate) fn layer(
        &self,
        plan: GpuPlan,
        x: LayerInput,
        t: usize,
    ) -> Result<mpsc::Receiver<Result<GpuDone>>> {
        let (reply, rx) = mpsc::sync_channel(1);
        self.send(Job::Layer { plan, x, t, reply })?;
        Ok(rx)
    }

    /// Waits until every job sent so far has run.
    pub(crate) fn flush(&self) -> Result<()> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.send(Job::Flush(tx))?;
        rx.recv().map_err(|_| stopped())
    }

    pub(crate) fn counters(&self) -> DeviceCounters {
        lock(&self.counters).clone()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Closing the channel ends the worker once its queue is done.
        drop(std::mem::replace(&mut self.jobs, mpsc::sync_channel(0).0));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub(crate) fn stopped() -> Error {
    Error::Config("the device worker stopped".into())
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic mid-layer leaves counters, not memory, inconsistent: keep going.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the device worker owns: the device, the slots, what each slot holds.
pub(crate) struct DeviceSide {
    pub(crate) dev: Arc<dyn Device>,
    pub(crate) slots: Option<ExpertSlots>,
    pub(crate) host: Arc<HostExperts>,
    /// `(moe_layer, expert)` copied into each slot, as far as the worker knows.
    pub(crate) held: Vec<Option<(usize, u32)>>,
    pub(crate) counters: Arc<Mutex<DeviceCounters>>,
    /// A background copy's failure, reported with the next layer's result.
    pub(crate) failed: Option<Error>,
}

impl DeviceSide {
    /// Runs jobs until the executor is dropped.
    fn serve(mut self, jobs: &mpsc::Receiver<Job>) {
        for job in jobs {
            let started = Instant::now();
            match job {
                Job::Layer { plan, x, t, reply } => {
                    let done = match self.failed.take() {
                        Some(e) => Err(e),
                        None => self.layer(&plan, x, t),
                    };
                    self.counted(started);
                    // The executor waits on the reply; if it is gone, so is the work.
                    let _ = reply.send(done);
                }
                Job::Copies(copies) => {
                    for &(slot, layer, expert) in &copies {
                        match self.copy(slot, layer, expert) {
                            Ok(()) => lock(&self.counters).prefetched += 1,
                            Err(e) => {
                                self.failed.get_or_insert(e);
                            }
                        }
                    }
                    self.counted(started);
                }
                Job::Flush(reply) => {
                    let _ = reply.send(());
                }
            }
        }
    }

    fn counted(&self, started: Instant) {
        lock(&self.counters).time += started.elapsed();
    }

    /// Copies `expert` of `layer` from the host into `slot`.
    fn copy(&mut self, slot: u32, layer: usize, expert: u32) -> Result<()> {
        let slots = self.slots.as_ref().ok_or_else(no_slots)?;
        let held = self.held.get_mut(slot as usize).ok_or_else(no_slots)?;
        // Until the copy succeeds the slot holds nothing usable.
        *held = None;
        let bytes = self.host.expert_bytes(layer, expert)?;
        slots.refill_bytes(&*self.dev, slot, &bytes)?;
        *held = Some((layer, expert));
        let mut c = lock(&self.counters);
        c.uploads += 1;
        c.bytes += bytes.len() as u64;
        Ok(())
    }

    /// The device's share of a layer: copies, then per round the staged copies and the two
    /// expert kernels; then the per-pair outputs read back once and combined on the host,
    /// or, when the input is on the device, left there with the combines that add them.
    fn layer(&mut self, plan: &GpuPlan, x: LayerInput, t: usize) -> Result<GpuDone> {
        for &(slot, layer, expert) in &plan.uploads {
            self.copy(slot, layer, expert)?;
        }
        let (host_x, mut x_buf) = match x {
            LayerInput::Host(v) => (Some(v), None),
            LayerInput::Device(b) => (None, Some(b)),
        };
        // Input on the device: each round's outputs get a spare row, zeroed where a
        // combine pads a token's entries.
        let spare = usize::from(host_x.is_none());
        let mut rounds: Vec<(Vec<Pair>, Buffer)> = Vec::new();
        for (copies, pairs) in &plan.rounds {
            for &(slot, layer, expert) in copies {
                self.copy(slot, layer, expert)?;
            }
            if pairs.is_empty() {
                continue;
            }
            // The copies before this job ran in order: each slot must hold its expert now.
            for q in pairs {
                let held = self.held.get(q.slot as usize).copied().flatten();
                if held != Some(q.expert) {
                    return Err(Error::Config(format!(
                        "slot {} holds {held:?} when moe layer {} expert {} runs on it",
                        q.slot, q.expert.0, q.expert.1
                    )));
                }
            }
            let slots = self.slots.as_ref().ok_or_else(no_slots)?;
            let dev = &*self.dev;
            let h = slots.hidden as usize;
            let inter = slots.inter as usize;
            let xb = match x_buf.take() {
                Some(b) => b,
                None => {
                    let b = dev.alloc((t * h * 4) as u64, 0, "hybrid expert input")?;
                    dev.upload(&b, 0, &f32_bytes(host_x.as_deref().unwrap_or_default()))?;
                    b
                }
            };
            let mut pairs = pairs.clone();
            pairs.sort_by_key(|p| (p.slot, p.row));
            let p = pairs.len();
            let experts = 1 + pairs.windows(2).filter(|w| w[0].slot != w[1].slot).count();
            // A job's pairs are one layer's: its experts' format.
            let layer = pairs[0].expert.0;
            let format = self.host.format(layer).ok_or_else(|| {
                Error::Config(format!("moe layer {layer} has no experts on the host"))
            })?;
            let idx: Vec<u8> = pairs
                .iter()
                .flat_map(|q| [q.row, q.slot])
                .flat_map(u32::to_le_bytes)
                .collect();
            let pairs_buf = dev.alloc(idx.len() as u64, 0, "hybrid expert pairs")?;
            dev.upload(&pairs_buf, 0, &idx)?;
            let act = dev.alloc((p * inter * 4) as u64, 0, "hybrid expert activations")?;
            let y = dev.alloc(((p + spare) * h * 4) as u64, 0, "hybrid expert outputs")?;
            for (stage, input, output) in [(0, &xb, &act), (1, &act, &y)] {
                dev.enqueue(&Op::ExpertFfn {
                    x: input,
                    slots,
                    format,
                    pairs: &pairs_buf,
                    out: output,
                    n_pairs: p as u32,
                    experts: experts as u32,
                    stage,
                })?;
            }
            dev.submit()?;
            x_buf = Some(xb);
            rounds.push((pairs, y));
        }
        let Some(h) = self.slots.as_ref().map(|s| s.hidden as usize) else {
            return Ok(GpuDone::default());
        };
        match host_x {
            Some(_) => self.read_back(&rounds, t, h),
            None => Ok(GpuDone {
                combines: self.combines(rounds, t, h)?,
                ..GpuDone::default()
            }),
        }
    }

    /// The rounds' outputs gathered into one buffer and read back once (the layer's one
    /// wait for the device), weighted and summed per token on the host.
    fn read_back(&self, rounds: &[(Vec<Pair>, Buffer)], t: usize, h: usize) -> Result<GpuDone> {
        let mut done = GpuDone::default();
        let total: usize = rounds.iter().map(|(pairs, _)| pairs.len()).sum();
        if total == 0 {
            return Ok(done);
        }
        let dev = &*self.dev;
        let all = dev.alloc(
            (total * h * 4) as u64,
            0,
            "hybrid expert outputs, all rounds",
        )?;
        let mut at = 0u64;
        for (pairs, y) in rounds {
            let len = (pairs.len() * h * 4) as u64;
            dev.copy(y, 0, &all, at, len)?;
            at += len;
        }
        let bytes = dev.download_async(&all, 0, at)?.wait()?;
        let mut rows = bytes.chunks_exact(4 * h);
        for (pairs, _) in rounds {
            for (q, yr) in pairs.iter().zip(&mut rows) {
                let target = if q.deferred {
                    &mut done.deferred
                } else {
                    &mut done.out
                };
                if target.is_empty() {
                    *target = vec![0.0f32; t * h];
                }
                let row = &mut target[q.row as usize * h..][..h];
                for (o, c) in row.iter_mut().zip(yr.chunks_exact(4)) {
                    *o += q.weight * f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
        }
        Ok(done)
    }

    /// Each round's outputs left on the device, with the combines that add them: the
    /// immediate pairs' and the deferred pairs' apart, each token's entries in the order
    /// of the round's rows, padded to the round's most with the zeroed spare row.
    fn combines(
        &self,
        rounds: Vec<(Vec<Pair>, Buffer)>,
        t: usize,
        h: usize,
    ) -> Result<Vec<(bool, DeviceCombine)>> {
        let dev = &*self.dev;
        let mut out = Vec::new();
        for (pairs, y) in rounds {
            let spare = pairs.len() as u32;
            let y = Arc::new(y);
            let mut zeroed = false;
            for deferred in [false, true] {
                let mut entries: Vec<Vec<(u32, f32)>> = vec![Vec::new(); t];
                for (i, q) in pairs.iter().enumerate() {
                    if q.deferred == deferred {
                        entries[q.row as usize].push((i as u32, q.weight));
                    }
                }
                let k = entries.iter().map(Vec::len).max().unwrap_or(0);
                if k == 0 {
                    continue;
                }
                if !zeroed && entries.iter().any(|e| e.len() < k) {
                    dev.upload(&y, spare as u64 * h as u64 * 4, &vec![0u8; h * 4])?;
                    zeroed = true;
                }
                let padded: Vec<(u32, f32)> = entries
                    .iter()
                    .flat_map(|e| (0..k).map(|j| e.get(j).copied().unwrap_or((spare, 0.0))))
                    .collect();
                let rows: Vec<u8> = padded.iter().flat_map(|(i, _)| i.to_le_bytes()).collect();
                let weights: Vec<u8> = padded.iter().flat_map(|(_, w)| w.to_le_bytes()).collect();
                let pair_of = dev.alloc(rows.len() as u64, 0, "hybrid combine rows")?;
                dev.upload(&pair_of, 0, &rows)?;
                let w = dev.alloc(weights.len() as u64, 0, "hybrid combine weights")?;
                dev.upload(&w, 0, &weights)?;
                let combine = DeviceCombine {
                    y: y.clone(),
                    weights: w,
                    pair_of,
                    tokens: t as u32,
                    k: k as u32,
                };
                out.push((deferred, combine));
            }
        }
        Ok(out)
    }
}

fn no_slots() -> Error {
    Error::Config("a copy or kernel names a slot the device does not have".into())
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
