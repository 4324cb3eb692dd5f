//! [`HybridExecutor`]: one MoE layer of one step at a time, the policy's decision executed
//! on the CPU kernels and the accelerator concurrently.
//!
//! Per layer: build the [`LayerView`] (routing, cache residency, free bytes), ask the
//! policy, check that its tasks cover every routed (token, expert) pair exactly once, apply
//! its evictions, assign slots to its transfers (a kept copy takes a cache slot; a staged
//! one goes through the ping-pong staging slots in rounds), then hand the GPU's tasks to
//! the device worker (uploads, `ExpertFfn` kernels, read back the per-pair outputs) while
//! the calling thread runs the CPU's tasks with the fused kernel, and add both into the
//! output in f32. Copies for later layers or steps (prefetches) go to the worker after the
//! layer's job and run in the background while the model goes on (at most a step's worth
//! of jobs queued). Deferred tasks accumulate into a side buffer that joins the output of
//! the next MoE layer (KTransformers, seed 003 section 4.1: `O_k = I_k + S_k +
//! R_{k-1}^def + R_k^imm`).
//!
//! A key design decision: the executor never decides. Whatever the policy returns is
//! executed as is, and what cannot be (a copy that the fixed slot count cannot hold, a GPU
//! task whose expert is neither resident nor copied) is not silently replaced by a guess:
//! it is refused (the copy) or run on the CPU (the task) and counted in [`ExecStats`], which
//! tests require to stay zero for the shipped policies.
//!
//! Another: the device worker is one persistent thread that owns the device, the slots and
//! its record of what each slot holds, and runs jobs strictly in order. A prefetch copy
//! queued before a later layer's job is therefore complete before that job's kernels read
//! the slot, without events to track; the worker still checks, for every (token, expert)
//! pair, that its slot holds that expert before launching a kernel on it.

use std::fmt;
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use strata_accel::{Buffer, Device, ExpertSlots, Op, OpKind};
use strata_kernels::moe::ExpertBatch;
use strata_model::moe::{ExpertCall, ExpertExecutor};
use strata_policy::{
    Candidates, CostModel, Decision, Device as Place, GpuView, LayerView, Phase, Policy,
    TransferKind,
};

use crate::cache::SlotCache;
use crate::weights::HostExperts;
use crate::{Error, Result};

/// How the executor runs.
#[derive(Debug, Clone, Default)]
pub struct ExecOptions {
    /// Bytes of device memory for expert weights (cache and staging slots).
    pub vram_budget: u64,
    /// The phase every step is reported in; `None`: from the step's batch layout, decode
    /// when every sequence adds exactly one token to its cache, else prefill (a step whose
    /// layout the model does not give: decode when it has one token).
    pub phase: Option<Phase>,
    /// Keep a [`LayerRecord`] of every layer ([`HybridExecutor::take_log`]).
    pub record: bool,
}

/// What happened, summed over the run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExecStats {
    /// Forward passes (steps).
    pub steps: usize,
    /// MoE layers executed.
    pub layers: usize,
    /// Expert tasks run on the GPU.
    pub gpu_experts: usize,
    /// Expert tasks run on the CPU.
    pub cpu_experts: usize,
    /// (token, expert) pairs computed on the GPU.
    pub gpu_pairs: usize,
    /// (token, expert) pairs computed on the CPU.
    pub cpu_pairs: usize,
    /// Tasks whose output was deferred to the next layer.
    pub deferred_experts: usize,
    /// GPU tasks whose expert was resident when the policy decided.
    pub hits: usize,
    /// GPU tasks whose expert had to be copied.
    pub misses: usize,
    /// Expert copies to the device (cache, staging and initial).
    pub uploads: usize,
    /// Bytes of those copies.
    pub upload_bytes: u64,
    /// Copies placed before the first step (the policy's initial residency).
    pub initial_uploads: usize,
    /// Copies through the staging slots.
    pub staged: usize,
    /// Copies the device worker ran in the background, with no layer waiting on them:
    /// prefetches for later layers or steps, and the initial residency.
    pub prefetched: usize,
    /// Experts the policy evicted.
    pub evictions: usize,
    /// Copies refused: no free slot, no staging slot, or staged without a GPU task.
    pub refused_transfers: usize,
    /// GPU tasks run on the CPU because their expert was not on the device.
    pub fallbacks: usize,
    /// Most experts resident at once.
    pub peak_resident: usize,
    /// Bytes of the expert slots allocated on the device.
    pub slot_bytes_allocated: u64,
    /// Time the device worker spent (uploads, kernels, read-back).
    pub gpu_time: Duration,
    /// Time the CPU kernels spent.
    pub cpu_time: Duration,
}

impl ExecStats {
    /// GPU tasks served from the cache, `hits / (hits + misses)`.
    pub fn hit_rate(&self) -> f64 {
        self.hits as f64 / (self.hits + self.misses).max(1) as f64
    }
}

impl fmt::Display for ExecStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "gpu hit rate {:.1}% ({} hits, {} misses), uploads {} ({:.2} MiB, {} initial, {} staged, \
             {} in the background), \
             evictions {}, experts gpu {} / cpu {} ({} deferred), pairs gpu {} / cpu {}, \
             time gpu {:.1} ms / cpu {:.1} ms, refused {}, fallbacks {}",
            100.0 * self.hit_rate(),
            self.hits,
            self.misses,
            self.uploads,
            self.upload_bytes as f64 / (1 << 20) as f64,
            self.initial_uploads,
            self.staged,
            self.prefetched,
            self.evictions,
            self.gpu_experts,
            self.cpu_experts,
            self.deferred_experts,
            self.gpu_pairs,
            self.cpu_pairs,
            self.gpu_time.as_secs_f64() * 1e3,
            self.cpu_time.as_secs_f64() * 1e3,
            self.refused_transfers,
            self.fallbacks,
        )
    }
}

/// One executed layer, for tests and traces.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerRecord {
    /// Step.
    pub step: usize,
    /// MoE layer.
    pub moe_layer: usize,
    /// The phase the policy was told.
    pub phase: Phase,
    /// Sequences with tokens in the step (0: the model gave no batch layout).
    pub seqs: usize,
    /// The attention context the policy was told (`None`: no batch layout).
    pub context: Option<usize>,
    /// The policy's decision.
    pub decision: Decision,
    /// `(expert, deferred)` of the tasks run on the GPU.
    pub gpu_tasks: Vec<(u32, bool)>,
    /// `(expert, deferred)` of the tasks run on the CPU.
    pub cpu_tasks: Vec<(u32, bool)>,
    /// `(moe_layer, expert)` copied to the device, in order.
    pub uploads: Vec<(usize, u32)>,
    /// Experts resident after the layer.
    pub resident: usize,
}

/// The hybrid CPU + accelerator executor of a model's routed experts.
#[derive(Debug)]
pub struct HybridExecutor {
    state: Mutex<State>,
}

struct State {
    worker: Worker,
    /// Bytes of one device slot (0: no slots).
    slot_bytes: u64,
    cache: SlotCache,
    host: Arc<HostExperts>,
    policy: Box<dyn Policy + Send>,
    cost: CostModel,
    phase: Option<Phase>,
    calls: usize,
    step: usize,
    /// Deferred output of the previous MoE layer: `(moe_layer, [T, hidden])`.
    pending: Option<(usize, Vec<f32>)>,
    stats: ExecStats,
    log: Option<Vec<LayerRecord>>,
}

impl fmt::Debug for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("State")
            .field("policy", &self.policy.name())
            .field("cache", &self.cache)
            .field("step", &self.step)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// One (token, expert) pair computed on the device.
#[derive(Debug, Clone, Copy)]
struct Pair {
    row: u32,
    slot: u32,
    /// `(moe_layer, expert)` the slot must hold when the kernel runs.
    expert: (usize, u32),
    weight: f32,
    deferred: bool,
}

/// `(slot, moe_layer, expert)`: one expert copied into one slot.
type SlotCopy = (u32, usize, u32);

/// Device work of one layer: copies into cache slots, then rounds of staged copies and
/// kernels (round 0 also runs every resident expert).
#[derive(Debug, Default)]
struct GpuPlan {
    /// Copies into cache slots that this layer's GPU tasks read.
    uploads: Vec<SlotCopy>,
    /// Copies into cache slots for later layers or steps (prefetches), queued after this
    /// layer's job so they do not delay its results.
    later: Vec<SlotCopy>,
    /// Per round: staged copies, then the pairs to run.
    rounds: Vec<(Vec<SlotCopy>, Vec<Pair>)>,
}

impl GpuPlan {
    /// Whether this layer has device work to wait for (copies it reads, or kernels).
    fn has_layer_work(&self) -> bool {
        !self.uploads.is_empty()
            || self
                .rounds
                .iter()
                .any(|r| !r.0.is_empty() || !r.1.is_empty())
    }
}

/// The device's share of one layer's output.
#[derive(Debug, Default)]
struct GpuDone {
    out: Vec<f32>,
    deferred: Vec<f32>,
}

/// What the device worker did, summed (read by [`HybridExecutor::stats`]).
#[derive(Debug, Default, Clone)]
struct DeviceCounters {
    uploads: usize,
    bytes: u64,
    prefetched: usize,
    time: Duration,
}

/// A job of the device worker; jobs run in the order sent.
enum Job {
    /// One layer's device work; the result goes back on `reply`.
    Layer {
        plan: GpuPlan,
        x: Vec<f32>,
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
struct Worker {
    /// Bounded: a layer waits to queue more once a step's worth of jobs (a layer's job
    /// and its prefetches, per MoE layer) is queued, so prefetches the device cannot keep
    /// up with slow the model down instead of piling up.
    jobs: mpsc::SyncSender<Job>,
    thread: Option<JoinHandle<()>>,
    counters: Arc<Mutex<DeviceCounters>>,
}

impl Worker {
    fn start(side: DeviceSide) -> Result<Worker> {
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

    fn send(&self, job: Job) -> Result<()> {
        self.jobs.send(job).map_err(|_| stopped())
    }

    /// Queues `plan`'s layer work on `x: [t, hidden]`; the result comes on the receiver.
    fn layer(
        &self,
        plan: GpuPlan,
        x: Vec<f32>,
        t: usize,
    ) -> Result<mpsc::Receiver<Result<GpuDone>>> {
        let (reply, rx) = mpsc::sync_channel(1);
        self.send(Job::Layer { plan, x, t, reply })?;
        Ok(rx)
    }

    /// Waits until every job sent so far has run.
    fn flush(&self) -> Result<()> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.send(Job::Flush(tx))?;
        rx.recv().map_err(|_| stopped())
    }

    fn counters(&self) -> DeviceCounters {
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

fn stopped() -> Error {
    Error::Config("the device worker stopped".into())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic mid-layer leaves counters, not memory, inconsistent: keep going.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl HybridExecutor {
    /// An executor on `dev` running `policy` (priced by `cost`, whose GPU expert budget
    /// must be the cache part of `opts.vram_budget`: see [`crate::cost_model`] and
    /// [`HybridExecutor::cache_bytes`]), reading expert weights from `host`. Places the
    /// policy's initial residency on the device.
    pub fn new(
        dev: Arc<dyn Device>,
        host: HostExperts,
        policy: Box<dyn Policy + Send>,
        cost: CostModel,
        opts: &ExecOptions,
    ) -> Result<HybridExecutor> {
        let op = OpKind::ExpertFfn(host.wtype());
        if !dev.supports_op(op) {
            return Err(Error::Config(format!(
                "{} does not run {op}, which the experts need",
                dev.info().name
            )));
        }
        let slot = Self::slot_bytes(&host);
        let n_slots = u32::try_from(opts.vram_budget / slot.max(1)).unwrap_or(u32::MAX);
        let cache = SlotCache::new(n_slots);
        let slots = if n_slots > 0 {
            Some(ExpertSlots::new(
                &*dev,
                n_slots,
                host.hidden() as u32,
                host.inter() as u32,
                host.wtype(),
            )?)
        } else {
            None
        };
        if cost.model.n_experts != host.n_experts() || cost.model.moe_layers() != host.n_layers() {
            return Err(Error::Config(format!(
                "cost model of {} moe layers x {} experts, the checkpoint has {} x {}",
                cost.model.moe_layers(),
                cost.model.n_experts,
                host.n_layers(),
                host.n_experts()
            )));
        }
        let host = Arc::new(host);
        let slot_bytes = slots.as_ref().map_or(0, ExpertSlots::slot_bytes);
        let worker = Worker::start(DeviceSide {
            held: vec![None; slots.as_ref().map_or(0, |s| s.n_slots as usize)],
            dev,
            slots,
            host: host.clone(),
            counters: Arc::default(),
            failed: None,
        })?;
        let mut st = State {
            worker,
            slot_bytes,
            cache,
            host,
            policy,
            cost,
            phase: opts.phase,
            calls: 0,
            step: 0,
            pending: None,
            stats: ExecStats {
                slot_bytes_allocated: n_slots as u64 * slot,
                ..ExecStats::default()
            },
            log: opts.record.then(Vec::new),
        };
        let initial = st.policy.initial_residency(&st.cost);
        let mut copies = Vec::new();
        for (layer, expert) in initial {
            match st.cache.insert(layer, expert) {
                Some(s) => copies.push((s, layer, expert)),
                None => st.stats.refused_transfers += 1,
            }
        }
        if !copies.is_empty() {
            // In the background, ahead of every layer's job.
            st.stats.initial_uploads = copies.len();
            st.worker.send(Job::Copies(copies))?;
        }
        st.stats.peak_resident = st.cache.len();
        Ok(HybridExecutor {
            state: Mutex::new(st),
        })
    }

    /// Bytes of one expert slot for `host`'s experts.
    pub fn slot_bytes(host: &HostExperts) -> u64 {
        let elems = 3 * host.hidden() * host.inter();
        host.wtype().bytes(elems + elems % 2)
    }

    /// The part of `vram_budget` that caches experts (the rest, at most two slots, stages
    /// them): what the cost model's GPU expert budget must be.
    pub fn cache_bytes(host: &HostExperts, vram_budget: u64) -> u64 {
        let slot = Self::slot_bytes(host);
        let n = vram_budget / slot.max(1);
        n.saturating_sub(2) * slot
    }

    /// Statistics so far (once the copies in flight are done).
    pub fn stats(&self) -> ExecStats {
        let st = self.lock();
        // A stopped worker has nothing in flight: its counters are final.
        let _ = st.worker.flush();
        let dev = st.worker.counters();
        ExecStats {
            uploads: dev.uploads,
            upload_bytes: dev.bytes,
            prefetched: dev.prefetched,
            gpu_time: dev.time,
            ..st.stats.clone()
        }
    }

    /// The layers executed since the last call (empty unless [`ExecOptions::record`]).
    pub fn take_log(&self) -> Vec<LayerRecord> {
        self.lock()
            .log
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// The policy's name.
    pub fn policy_name(&self) -> String {
        self.lock().policy.name()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.state)
    }
}

impl ExpertExecutor for HybridExecutor {
    fn run(&self, call: ExpertCall<'_>, out: &mut [f32]) -> strata_model::Result<()> {
        self.lock()
            .run(call, out)
            .map_err(|e| strata_model::Error::Executor(Box::new(e)))
    }
}

impl State {
    fn bad(&self, layer: usize, msg: String) -> Error {
        Error::Decision {
            policy: self.policy.name(),
            layer,
            msg,
        }
    }

    fn run(&mut self, call: ExpertCall<'_>, out: &mut [f32]) -> Result<()> {
        let l = call.moe_layer;
        let routing = call.routing;
        let k = routing.top_k.max(1);
        let t = routing.tokens();
        let n = self.host.n_experts();
        let h = self.host.hidden();
        if call.x.len() != t * h || out.len() != t * h || routing.weights.len() != t * k {
            return Err(Error::Config(format!(
                "moe layer {l}: {} tokens of width {h} expected, got {} inputs and {} outputs",
                t,
                call.x.len(),
                out.len()
            )));
        }
        if l == 0 {
            if self.calls > 0 {
                self.step += 1;
            }
            // A pass that stopped early leaves its deferred output behind: not ours.
            self.pending = None;
        }
        self.calls += 1;
        let decode = call.is_decode().unwrap_or(t == 1);
        let phase = self.phase.unwrap_or(if decode {
            Phase::Decode
        } else {
            Phase::Prefill
        });
        let resident = self.cache.resident(l, n);
        let slot_bytes = self.slot_bytes;
        // The longest sequence's: the attention that bounds this step.
        let context = call.spans.iter().map(|s| s.start_pos + s.len).max();
        let view = LayerView {
            layer: l,
            n_moe_layers: self.host.n_layers(),
            phase,
            step: self.step,
            top_k: k,
            ids: &routing.ids,
            weights: &routing.weights,
            hidden: Some(call.x),
            candidates: routing.candidates.as_ref().map(|c| Candidates {
                per_token: c.per_token,
                ids: &c.ids,
                scores: &c.scores,
            }),
            gpu: GpuView {
                resident: &resident,
                free_bytes: self.cache.free_slots() as u64 * slot_bytes,
                busy_s: 0.0,
            },
            cpu_busy_s: 0.0,
            pcie_busy_s: 0.0,
            context,
        };
        let decision = self.policy.decide(&view, &self.cost);

        // Every routed pair exactly once, with its combine weight.
        let mut covered = vec![false; t * k];
        let mut weights_of = Vec::with_capacity(decision.tasks.len());
        for task in &decision.tasks {
            let mut w = Vec::with_capacity(task.rows.len());
            for &r in &task.rows {
                let r = r as usize;
                let j = (r < t)
                    .then(|| (0..k).find(|&j| routing.ids[r * k + j] == task.expert))
                    .flatten()
                    .ok_or_else(|| {
                        self.bad(
                            l,
                            format!("expert {} is not routed from token {r}", task.expert),
                        )
                    })?;
                if std::mem::replace(&mut covered[r * k + j], true) {
                    return Err(self.bad(
                        l,
                        format!("token {r} to expert {} assigned twice", task.expert),
                    ));
                }
                w.push(routing.weights[r * k + j]);
            }
            weights_of.push(w);
        }
        if let Some(p) = covered.iter().position(|c| !c) {
            return Err(self.bad(
                l,
                format!("token {} to expert {} not assigned", p / k, routing.ids[p]),
            ));
        }

        for ev in &decision.evictions {
            if self.cache.evict(ev.layer, ev.expert) {
                self.stats.evictions += 1;
            }
        }
        let gpu_experts: Vec<u32> = decision
            .tasks
            .iter()
            .filter(|t| t.device == Place::Gpu)
            .map(|t| t.expert)
            .collect();
        let mut transfers = decision.transfers.clone();
        transfers.sort_by_key(|tr| tr.priority);
        let mut plan = GpuPlan::default();
        let mut staged: Vec<u32> = Vec::new();
        for tr in &transfers {
            let now = tr.layer == l;
            let keep = match tr.kind {
                TransferKind::Staged => false,
                TransferKind::OnDemand | TransferKind::Prefetch => true,
            };
            if keep && self.cache.slot_of(tr.layer, tr.expert).is_none() {
                if let Some(s) = self.cache.insert(tr.layer, tr.expert) {
                    if now && gpu_experts.contains(&tr.expert) {
                        plan.uploads.push((s, tr.layer, tr.expert));
                    } else {
                        plan.later.push((s, tr.layer, tr.expert));
                    }
                    continue;
                }
            } else if keep || self.cache.slot_of(tr.layer, tr.expert).is_some() {
                // Already resident: kept copies are done, staged ones would be wasted.
                continue;
            }
            // Staged, or a kept copy with no free slot: stream it if this layer needs it.
            if now && gpu_experts.contains(&tr.expert) && !staged.contains(&tr.expert) {
                staged.push(tr.expert);
            } else {
                self.stats.refused_transfers += 1;
            }
        }
        let staging = self.cache.staging_slots();
        if staging.is_empty() && !staged.is_empty() {
            self.stats.refused_transfers += staged.len();
            staged.clear();
        }
        let staged_slot = |e: u32| -> Option<(usize, u32)> {
            let p = staged.iter().position(|&s| s == e)?;
            Some((p / staging.len(), staging[p % staging.len()]))
        };
        let n_rounds = if staged.is_empty() {
            1
        } else {
            staged.len().div_ceil(staging.len())
        };
        plan.rounds = (0..n_rounds)
            .map(|r| {
                let copies = staged
                    .iter()
                    .enumerate()
                    .skip(r * staging.len().max(1))
                    .take(staging.len())
                    .map(|(p, &e)| (staging[p % staging.len()], l, e))
                    .collect();
                (copies, Vec::new())
            })
            .collect();

        // Split the tasks.
        let mut cpu_now: Vec<ExpertBatch> = Vec::new();
        let mut cpu_later: Vec<ExpertBatch> = Vec::new();
        let mut record_gpu = Vec::new();
        let mut record_cpu = Vec::new();
        for (task, w) in decision.tasks.iter().zip(weights_of) {
            if task.deferred {
                self.stats.deferred_experts += 1;
            }
            if task.device == Place::Gpu {
                if resident.get(task.expert as usize) == Some(&true) {
                    self.stats.hits += 1;
                } else {
                    self.stats.misses += 1;
                }
                let at = match self.cache.slot_of(l, task.expert) {
                    Some(s) => Some((0, s)),
                    None => staged_slot(task.expert),
                };
                if let Some((round, slot)) = at {
                    let pairs = &mut plan.rounds[round].1;
                    pairs.extend(task.rows.iter().zip(&w).map(|(&row, &weight)| Pair {
                        row,
                        slot,
                        expert: (l, task.expert),
                        weight,
                        deferred: task.deferred,
                    }));
                    self.stats.gpu_experts += 1;
                    self.stats.gpu_pairs += task.rows.len();
                    record_gpu.push((task.expert, task.deferred));
                    continue;
                }
                self.stats.fallbacks += 1;
            }
            self.stats.cpu_experts += 1;
            self.stats.cpu_pairs += task.rows.len();
            record_cpu.push((task.expert, task.deferred));
            let mut rows: Vec<(u32, f32)> = task.rows.iter().copied().zip(w).collect();
            rows.sort_by_key(|&(r, _)| r);
            let batch = ExpertBatch {
                expert: task.expert as usize,
                tokens: rows.iter().map(|&(r, _)| r).collect(),
                weights: rows.iter().map(|&(_, w)| w).collect(),
            };
            if task.deferred {
                cpu_later.push(batch);
            } else {
                cpu_now.push(batch);
            }
        }
        cpu_now.sort_by_key(|b| b.expert);
        cpu_later.sort_by_key(|b| b.expert);

        // Run both devices at once: the worker the device's share, this thread the CPU's on
        // the kernels' pool; the prefetches queue behind the layer and run in the background.
        let mut log_uploads: Vec<(usize, u32)> = Vec::new();
        if self.log.is_some() {
            log_uploads.extend(
                plan.uploads
                    .iter()
                    .chain(&plan.later)
                    .map(|&(_, l, e)| (l, e)),
            );
            log_uploads.extend(
                plan.rounds
                    .iter()
                    .flat_map(|r| r.0.iter().map(|&(_, l, e)| (l, e))),
            );
        }
        self.stats.staged += plan.rounds.iter().map(|r| r.0.len()).sum::<usize>();
        let later_copies = std::mem::take(&mut plan.later);
        let device = if plan.has_layer_work() {
            let x = if plan.rounds.iter().any(|r| !r.1.is_empty()) {
                call.x.to_vec()
            } else {
                Vec::new()
            };
            Some(self.worker.layer(plan, x, t)?)
        } else {
            None
        };
        if !later_copies.is_empty() {
            self.worker.send(Job::Copies(later_copies))?;
        }
        let mut later = vec![0.0f32; if cpu_later.is_empty() { 0 } else { t * h }];
        let started = Instant::now();
        let cpu = call
            .experts
            .run_batches(call.x, &cpu_now, out)
            .and_then(|()| match cpu_later.is_empty() {
                true => Ok(()),
                false => call.experts.run_batches(call.x, &cpu_later, &mut later),
            });
        self.stats.cpu_time += started.elapsed();
        let gpu = match device {
            Some(rx) => rx.recv().map_err(|_| stopped())??,
            None => GpuDone::default(),
        };
        cpu?;
        add(out, &gpu.out);
        if let Some((from, def)) = self.pending.take() {
            if from + 1 != l || def.len() != out.len() {
                return Err(self.bad(
                    l,
                    format!("deferred output of moe layer {from} does not fit this layer"),
                ));
            }
            add(out, &def);
        }
        let mut deferred = later;
        if deferred.is_empty() {
            deferred = gpu.deferred;
        } else {
            add(&mut deferred, &gpu.deferred);
        }
        if !deferred.is_empty() {
            if l + 1 >= self.host.n_layers() {
                // No later layer to join: the output cannot wait.
                add(out, &deferred);
            } else {
                self.pending = Some((l, deferred));
            }
        }
        self.stats.layers += 1;
        self.stats.steps = self.step + 1;
        self.stats.peak_resident = self.stats.peak_resident.max(self.cache.len());
        if let Some(log) = &mut self.log {
            log.push(LayerRecord {
                step: self.step,
                moe_layer: l,
                phase,
                seqs: call.n_seqs(),
                context,
                decision,
                gpu_tasks: record_gpu,
                cpu_tasks: record_cpu,
                uploads: log_uploads,
                resident: self.cache.len(),
            });
        }
        Ok(())
    }
}

/// `a += b` (nothing when `b` is empty).
fn add(a: &mut [f32], b: &[f32]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x += y;
    }
}

/// What the device worker owns: the device, the slots, what each slot holds.
struct DeviceSide {
    dev: Arc<dyn Device>,
    slots: Option<ExpertSlots>,
    host: Arc<HostExperts>,
    /// `(moe_layer, expert)` copied into each slot, as far as the worker knows.
    held: Vec<Option<(usize, u32)>>,
    counters: Arc<Mutex<DeviceCounters>>,
    /// A background copy's failure, reported with the next layer's result.
    failed: Option<Error>,
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
                        None => self.layer(&plan, &x, t),
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
        let bytes = self.host.slot_bytes(layer, expert, slots)?;
        slots.refill_bytes(&*self.dev, slot, &bytes)?;
        *held = Some((layer, expert));
        let mut c = lock(&self.counters);
        c.uploads += 1;
        c.bytes += bytes.len() as u64;
        Ok(())
    }

    /// The device's share of a layer: copies, then per round the staged copies and the two
    /// expert kernels, then the per-pair outputs read back and combined on the host.
    fn layer(&mut self, plan: &GpuPlan, x: &[f32], t: usize) -> Result<GpuDone> {
        let mut done = GpuDone::default();
        for &(slot, layer, expert) in &plan.uploads {
            self.copy(slot, layer, expert)?;
        }
        let mut reads = Vec::new();
        let mut x_buf = None;
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
            if x_buf.is_none() {
                let b = dev.alloc((t * h * 4) as u64, 0, "hybrid expert input")?;
                dev.upload(&b, 0, &f32_bytes(x))?;
                x_buf = Some(b);
            }
            let Some(xb) = &x_buf else { continue };
            let mut pairs = pairs.clone();
            pairs.sort_by_key(|p| (p.slot, p.row));
            let p = pairs.len();
            let idx: Vec<u8> = pairs
                .iter()
                .flat_map(|q| [q.row, q.slot])
                .flat_map(u32::to_le_bytes)
                .collect();
            let pairs_buf = dev.alloc(idx.len() as u64, 0, "hybrid expert pairs")?;
            dev.upload(&pairs_buf, 0, &idx)?;
            let act = dev.alloc((p * inter * 4) as u64, 0, "hybrid expert activations")?;
            let y = dev.alloc((p * h * 4) as u64, 0, "hybrid expert outputs")?;
            for (stage, input, output) in [(0, xb, &act), (1, &act, &y)] {
                dev.enqueue(&Op::ExpertFfn {
                    x: input,
                    slots,
                    pairs: &pairs_buf,
                    out: output,
                    n_pairs: p as u32,
                    stage,
                })?;
            }
            dev.submit()?;
            let read = dev.download_async(&y, 0, (p * h * 4) as u64)?;
            reads.push((read, pairs, [pairs_buf, act, y], h));
        }
        for (read, pairs, bufs, h) in reads {
            let bytes = read.wait()?;
            drop::<[Buffer; 3]>(bufs);
            for (q, yr) in pairs.iter().zip(bytes.chunks_exact(4 * h)) {
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
}

fn no_slots() -> Error {
    Error::Config("a copy or kernel names a slot the device does not have".into())
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
