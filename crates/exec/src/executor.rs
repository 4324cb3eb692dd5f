//! [`HybridExecutor`]: one MoE layer of one step at a time, the policy's decision executed
//! on the CPU kernels and the accelerator concurrently.
//!
//! Per layer: build the [`LayerView`] (routing, cache residency, free bytes), ask the
//! policy, check its decision ([`Decision::check`], the simulator's check), apply
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
//! A key design decision: the executor never decides. A decision that is not executable
//! as stated is an error; what a valid decision asks and the device cannot do (a copy that
//! the fixed slot count cannot hold) is not silently replaced by a guess: the copy is
//! refused and its task runs on the CPU, both counted in [`ExecStats`], which tests require
//! to stay zero for the shipped policies.
//!
//! Another: the device work runs on one persistent worker thread, in order (see
//! [`crate::worker`]), so a prefetch queued before a layer is done when the layer reads it.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use strata_accel::{Buffer, Device, ExpertSlots, OpKind};
use strata_kernels::moe::ExpertBatch;
use strata_model::experts::ExpertSet;
use strata_model::moe::{ExpertCall, ExpertExecutor};
use strata_policy::{
    Candidates, CostModel, Decision, Device as Place, GpuView, LayerView, Phase, Policy,
    TransferKind, TransferPlan,
};

use crate::cache::SlotCache;
use crate::exec_stats::ExecStats;
use crate::ssd::SsdTier;
use crate::weights::HostExperts;
use crate::worker::{
    DeviceCombine, DeviceSide, GpuDone, GpuPlan, Job, LayerInput, Pair, Worker, lock, stopped,
};
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
    /// Three tiers: the DRAM expert cache the CPU's tasks compute from (a model larger
    /// than memory); the host experts' uploads should read through it too
    /// ([`HostExperts::read_through`]). `None`: the experts as the model holds them.
    pub host_tier: Option<Arc<SsdTier>>,
}

/// What [`HybridExecutor::run_on_device`] leaves to the caller.
#[derive(Debug, Default)]
pub struct DeviceShare {
    /// The device's outputs to add into the residual stream now.
    pub combines: Vec<DeviceCombine>,
    /// The experts this layer deferred to the CPU, not yet run.
    pub deferred: Option<DeferredExperts>,
}

/// Routed experts a layer deferred to the CPU, handed back unrun so that the caller runs
/// them while the device works on the next layer (KTransformers' deferral, seed 003
/// section 4.1: the CPU computes `R_{k-1}^def` as the GPU runs layer `k`'s attention);
/// their output joins the next MoE layer's.
#[derive(Debug)]
pub struct DeferredExperts {
    /// The MoE layer that deferred them.
    pub moe_layer: usize,
    x: Vec<f32>,
    batches: Vec<ExpertBatch>,
    /// The DRAM expert cache they compute from (three tiers).
    tier: Option<Arc<SsdTier>>,
}

impl DeferredExperts {
    /// Their weighted outputs, `[T, hidden]`, on `experts` (the routed experts of the
    /// block that deferred them), or from the DRAM expert cache that holds them.
    pub fn run(&self, experts: &ExpertSet) -> Result<Vec<f32>> {
        let mut out = vec![0.0f32; self.x.len()];
        run_cpu(
            self.tier.as_deref(),
            (experts, self.moe_layer),
            &self.x,
            &self.batches,
            &mut out,
            None,
        )?;
        Ok(out)
    }
}

/// Adds `batches` of MoE layer `l` (`experts`) on the rows of `x` into `out` on the CPU:
/// from `tier`'s slots (three tiers; `guess`: read ahead for the next layer, skipping the
/// experts marked) or from `experts` as the model holds them. The same bits either way.
fn run_cpu(
    tier: Option<&SsdTier>,
    (experts, l): (&ExpertSet, usize),
    x: &[f32],
    batches: &[ExpertBatch],
    out: &mut [f32],
    guess: Option<&[bool]>,
) -> Result<()> {
    match tier {
        Some(t) => t.run_batches(l, x, batches, out, guess),
        None if batches.is_empty() => Ok(()),
        None => Ok(experts.run_batches(x, batches, out)?),
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
    /// The accelerator (its worker thread holds it too), for its traffic counters.
    device: Arc<dyn Device>,
}

struct State {
    worker: Worker,
    /// Bytes of one device slot (0: no slots).
    slot_bytes: u64,
    cache: SlotCache,
    host: Arc<HostExperts>,
    policy: Box<dyn Policy + Send>,
    cost: CostModel,
    tier: Option<Arc<SsdTier>>,
    phase: Option<Phase>,
    calls: usize,
    step: usize,
    /// Deferred output of the previous MoE layer: `(moe_layer, [T, hidden])`.
    pending: Option<(usize, Vec<f32>)>,
    /// The device's deferred share of the previous MoE layer, left on the device
    /// ([`HybridExecutor::run_on_device`]).
    pending_device: Option<(usize, Vec<DeviceCombine>)>,
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
        for f in host.formats() {
            for op in [0, 1].map(|stage| OpKind::ExpertFfn(f.stage_type(stage))) {
                if !dev.supports_op(op) {
                    return Err(Error::Config(format!(
                        "{} does not run {op}, which the experts need",
                        dev.info().name
                    )));
                }
            }
        }
        let slot = host.slot_bytes();
        let n_slots = u32::try_from(opts.vram_budget / slot.max(1)).unwrap_or(u32::MAX);
        let cache = SlotCache::new(n_slots);
        let slots = if n_slots > 0 {
            Some(ExpertSlots::new(
                &*dev,
                n_slots,
                host.hidden() as u32,
                host.inter() as u32,
                &host.formats(),
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
        let slot_bytes = slots.as_ref().map_or(0, |s| s.slot_bytes);
        let device = dev.clone();
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
            tier: opts.host_tier.clone(),
            phase: opts.phase,
            calls: 0,
            step: 0,
            pending: None,
            pending_device: None,
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
            device,
        })
    }

    /// The part of `vram_budget` that caches experts (the rest, at most two slots, stages
    /// them): what the cost model's GPU expert budget must be.
    pub fn cache_bytes(host: &HostExperts, vram_budget: u64) -> u64 {
        let slot = host.slot_bytes();
        let n = vram_budget / slot.max(1);
        n.saturating_sub(2) * slot
    }

    /// The accelerator it runs on.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
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

    /// The experts the device cache holds (or is copying in), per MoE layer: what the
    /// policy sees as resident.
    pub fn resident_experts(&self) -> Vec<Vec<u32>> {
        let st = self.lock();
        let n_experts = st.host.n_experts();
        (0..st.host.n_layers())
            .map(|layer| {
                let held = st.cache.resident(layer, n_experts);
                (0..n_experts as u32)
                    .filter(|&e| held[e as usize])
                    .collect()
            })
            .collect()
    }

    /// The DRAM expert cache below the device's (three tiers), if any.
    pub fn host_tier(&self) -> Option<Arc<SsdTier>> {
        self.lock().tier.clone()
    }

    /// The policy's name.
    pub fn policy_name(&self) -> String {
        self.lock().policy.name()
    }

    /// Whether the policy reads the router's candidates ([`Policy::reads_candidates`]).
    pub fn reads_candidates(&self) -> bool {
        self.lock().policy.reads_candidates()
    }

    /// [`ExpertExecutor::run`] for a model whose layer input is already on this executor's
    /// device, in `x` (`[T, hidden]` from offset 0: the rows `call.x` holds). `out` gets
    /// the CPU's immediate share; the device's share stays on the device, returned as
    /// combines for the caller to add into its residual stream now (this layer's immediate
    /// share and the previous MoE layer's deferred one); the experts deferred to the CPU
    /// come back unrun, for the caller to run while the device works and to add into the
    /// next MoE layer's output. So the layer waits for the device only to read its input
    /// back, once (the hybrid layout's one round trip per MoE layer), and the device
    /// computes its experts while the CPU computes its own.
    pub fn run_on_device(
        &self,
        call: ExpertCall<'_>,
        x: Buffer,
        out: &mut [f32],
    ) -> Result<DeviceShare> {
        self.lock().run(call, Some(x), out)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.state)
    }
}

impl ExpertExecutor for HybridExecutor {
    fn run(&self, call: ExpertCall<'_>, out: &mut [f32]) -> strata_model::Result<()> {
        // Input on the host: the device's share comes back combined into `out`.
        let left_over = self.lock().run(call, None, out);
        match left_over {
            Ok(share) if share.combines.is_empty() && share.deferred.is_none() => Ok(()),
            Ok(_) => Err(Error::Config(
                "a layer run from the host left expert work to its caller".into(),
            )),
            Err(e) => Err(e),
        }
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

    /// One layer, its input on the host or (`x_dev`) also on the device: see
    /// [`HybridExecutor::run_on_device`].
    fn run(
        &mut self,
        call: ExpertCall<'_>,
        x_dev: Option<Buffer>,
        out: &mut [f32],
    ) -> Result<DeviceShare> {
        let l = call.moe_layer;
        let t = call.routing.tokens();
        let h = self.host.hidden();
        if call.x.len() != t * h
            || out.len() != t * h
            || call.routing.weights.len() != t * call.routing.top_k.max(1)
        {
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
            self.pending_device = None;
        }
        self.calls += 1;
        let decode = call.is_decode().unwrap_or(t == 1);
        let phase = self.phase.unwrap_or(if decode {
            Phase::Decode
        } else {
            Phase::Prefill
        });
        let resident = self.cache.resident(l, self.host.n_experts());
        // The longest sequence's: the attention that bounds this step.
        let context = call.spans.iter().map(|s| s.start_pos + s.len).max();
        let (decision, weights_of) = self.decide(&call, phase, &resident, context)?;
        let mut plan = self.plan_copies(&decision, l);
        let mut split = self.split_tasks(&decision, weights_of, l, &resident, &mut plan);
        let log_uploads = match self.log.is_some() {
            true => plan.uploads_in_order(),
            false => Vec::new(),
        };
        let share = self.execute(&call, x_dev, plan, &mut split, out)?;
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
                gpu_tasks: split.record_gpu,
                cpu_tasks: split.record_cpu,
                uploads: log_uploads,
                resident: self.cache.len(),
            });
        }
        Ok(share)
    }

    /// Shows the policy the layer and checks its decision; returns it with each task's
    /// combine weights (in the order of its rows).
    fn decide(
        &mut self,
        call: &ExpertCall<'_>,
        phase: Phase,
        resident: &[bool],
        context: Option<usize>,
    ) -> Result<(Decision, Vec<Vec<f32>>)> {
        let l = call.moe_layer;
        let routing = call.routing;
        let view = LayerView {
            layer: l,
            n_moe_layers: self.host.n_layers(),
            phase,
            step: self.step,
            top_k: routing.top_k.max(1),
            ids: &routing.ids,
            weights: &routing.weights,
            hidden: Some(call.x),
            candidates: routing.candidates.as_ref().map(|c| Candidates {
                per_token: c.per_token,
                ids: &c.ids,
                scores: &c.scores,
            }),
            gpu: GpuView {
                resident,
                free_bytes: self.cache.free_slots() as u64 * self.slot_bytes,
                busy_s: 0.0,
            },
            cpu_busy_s: 0.0,
            pcie_busy_s: 0.0,
            context,
        };
        let decision = self.policy.decide(&view, &self.cost);
        decision
            .check(&view)
            .map_err(|e| self.bad(l, e.to_string()))?;
        let weights_of = decision
            .tasks
            .iter()
            .map(|task| {
                task.rows
                    .iter()
                    .filter_map(|&r| view.pair_index(r, task.expert))
                    .map(|p| routing.weights[p])
                    .collect()
            })
            .collect();
        Ok((decision, weights_of))
    }

    /// Applies the decision's evictions and gives its copies slots, in the link's order:
    /// a kept copy takes a cache slot, a staged one (or a kept one with no free slot) goes
    /// through the staging slots in rounds if this layer runs its expert on the GPU.
    /// Copies that fit nowhere are refused.
    fn plan_copies(&mut self, decision: &Decision, l: usize) -> GpuPlan {
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
        let order = TransferPlan::new(decision, l, self.host.n_experts()).order;
        let mut plan = GpuPlan::default();
        let mut staged: Vec<u32> = Vec::new();
        for tr in order.into_iter().map(|i| decision.transfers[i]) {
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
        plan.staged = staged;
        plan.staging = staging;
        self.stats.staged += plan.rounds.iter().map(|r| r.0.len()).sum::<usize>();
        plan
    }

    /// Splits the tasks: the GPU's become pairs of the plan's rounds (on the CPU when their
    /// expert found no slot), the CPU's become kernel batches, immediate or deferred.
    fn split_tasks(
        &mut self,
        decision: &Decision,
        weights_of: Vec<Vec<f32>>,
        l: usize,
        resident: &[bool],
        plan: &mut GpuPlan,
    ) -> Split {
        let mut split = Split::default();
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
                    None => plan.staged_slot(task.expert),
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
                    split.record_gpu.push((task.expert, task.deferred));
                    continue;
                }
                self.stats.fallbacks += 1;
            }
            self.stats.cpu_experts += 1;
            self.stats.cpu_pairs += task.rows.len();
            split.record_cpu.push((task.expert, task.deferred));
            let mut rows: Vec<(u32, f32)> = task.rows.iter().copied().zip(w).collect();
            rows.sort_by_key(|&(r, _)| r);
            let batch = ExpertBatch {
                expert: task.expert as usize,
                tokens: rows.iter().map(|&(r, _)| r).collect(),
                weights: rows.iter().map(|&(_, w)| w).collect(),
            };
            if task.deferred {
                split.cpu_later.push(batch);
            } else {
                split.cpu_now.push(batch);
            }
        }
        split.cpu_now.sort_by_key(|b| b.expert);
        split.cpu_later.sort_by_key(|b| b.expert);
        split
    }

    /// Runs both devices at once: the worker the device's share, this thread the CPU's on
    /// the kernels' pool; the prefetches queue behind the layer and run in the background.
    /// Then adds the device's share, the previous layer's deferred output, and keeps this
    /// layer's deferred output for the next. With the input on the device (`x_dev`), the
    /// device's shares are returned as combines instead, and the CPU's deferred experts
    /// unrun (but the last MoE layer's: no later layer to join).
    fn execute(
        &mut self,
        call: &ExpertCall<'_>,
        x_dev: Option<Buffer>,
        mut plan: GpuPlan,
        split: &mut Split,
        out: &mut [f32],
    ) -> Result<DeviceShare> {
        let l = call.moe_layer;
        let t = call.routing.tokens();
        let last = l + 1 >= self.host.n_layers();
        let handed_back = match &x_dev {
            Some(_) if !last && !split.cpu_later.is_empty() => Some(DeferredExperts {
                moe_layer: l,
                x: call.x.to_vec(),
                batches: std::mem::take(&mut split.cpu_later),
                tier: self.tier.clone(),
            }),
            _ => None,
        };
        let later_copies = std::mem::take(&mut plan.later);
        let device = if plan.has_layer_work() {
            let x = match x_dev {
                Some(b) => LayerInput::Device(b),
                None if plan.rounds.iter().any(|r| !r.1.is_empty()) => {
                    LayerInput::Host(call.x.to_vec())
                }
                None => LayerInput::Host(Vec::new()),
            };
            Some(self.worker.layer(plan, x, t)?)
        } else {
            None
        };
        if !later_copies.is_empty() {
            self.worker.send(Job::Copies(later_copies))?;
        }
        let (cpu_now, cpu_later) = (&split.cpu_now, &split.cpu_later);
        let mut later = vec![0.0f32; if cpu_later.is_empty() { 0 } else { out.len() }];
        let started = Instant::now();
        // Under three tiers the DRAM cache reads ahead what the next layer's router picks,
        // but the experts the device holds.
        let next_on_device = match (&self.tier, last) {
            (Some(_), false) => self.cache.resident(l + 1, self.host.n_experts()),
            _ => Vec::new(),
        };
        let tier = self.tier.as_deref();
        let experts = (call.experts, l);
        let cpu = run_cpu(tier, experts, call.x, cpu_now, out, Some(&next_on_device))
            .and_then(|()| run_cpu(tier, experts, call.x, cpu_later, &mut later, None));
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
            if last {
                // No later layer to join: the output cannot wait.
                add(out, &deferred);
            } else {
                self.pending = Some((l, deferred));
            }
        }
        let (later, now): (Vec<_>, Vec<_>) = gpu.combines.into_iter().partition(|c| c.0);
        let mut combines: Vec<DeviceCombine> = now.into_iter().map(|c| c.1).collect();
        if let Some((from, def)) = self.pending_device.take() {
            if from + 1 != l {
                return Err(self.bad(
                    l,
                    format!("deferred device output of moe layer {from} does not fit this layer"),
                ));
            }
            combines.extend(def);
        }
        let later: Vec<DeviceCombine> = later.into_iter().map(|c| c.1).collect();
        if last {
            combines.extend(later);
        } else if !later.is_empty() {
            self.pending_device = Some((l, later));
        }
        Ok(DeviceShare {
            combines,
            deferred: handed_back,
        })
    }
}

/// A layer's tasks split by where they run.
#[derive(Debug, Default)]
struct Split {
    cpu_now: Vec<ExpertBatch>,
    cpu_later: Vec<ExpertBatch>,
    /// `(expert, deferred)` of the tasks run on the GPU, for the log.
    record_gpu: Vec<(u32, bool)>,
    /// `(expert, deferred)` of the tasks run on the CPU, for the log.
    record_cpu: Vec<(u32, bool)>,
}

/// `a += b` (nothing when `b` is empty).
fn add(a: &mut [f32], b: &[f32]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x += y;
    }
}
