//! The discrete-event core: per-device timelines, the data dependencies of a forward pass,
//! and the policy in the loop.
//!
//! Each device (GPU stream, CPU expert pool, PCIe host-to-device link, NDP units) is a
//! timeline that runs one operation at a time in issue order; an operation starts when its
//! device is free and its inputs are ready (list scheduling, the exact discrete-event
//! result for in-order queues). Per layer: attention (and router) on the GPU; the policy's
//! [`Decision`]; evictions; copies on PCIe (ping-pong buffers for staged experts: copy
//! `i` waits for the GPU to finish staged expert `i - 2`); predictor and shared experts on
//! the GPU; routed experts on their devices, each GPU expert after its weights land; then
//! the combine, which also waits for the previous layer's deferred experts.
//!
//! NDP machines: when the policy states an initial layout ([`Policy::initial_layout`]),
//! every expert's layout is tracked. Host reads are priced by layout (a GPU copy takes
//! the slower of PCIe and the DRAM read, a CPU expert the slower of compute and the read)
//! and each DIMM's lane is charged the reads it served after its NDP experts (seed 000
//! eq. 6); an NDP expert must be localized on its unit's DIMM; migrations run one after
//! another on the DIMM-Link lane and take effect when they land (an NDP expert waits for
//! its move to its DIMM, host reads use the old layout until then).
//!
//! Metrics beyond time: each expert operation records the FLOPs it executes (for FLOP
//! utilisation), and when a decision carries predicted per-expert loads
//! (`Decision::predicted_load`) they are scored against the loads the same layer realises
//! at the request's next decode step ([`crate::report::hot_overlap`]). Views state the
//! attention context the step is priced with.
//!
//! A key design decision: the simulator checks every decision instead of trusting it, with
//! the executor's check ([`Decision::check`]: each routed (token, expert) pair computed
//! exactly once, GPU experts resident or copied) and the machine's limits (expert memory
//! never over the budget, NDP units and DIMMs that exist). A policy bug is an error naming
//! the step and layer.

use strata_policy::layout::NdpCosts;
use strata_policy::{
    Candidates, CostModel, Decision, Device, GpuView, LayerView, Layout, Phase, Policy, Task,
    Transfer, TransferKind, TransferPlan,
};

use crate::report::{Lane, Op, Report};
use crate::workload::{Step, Workload};
use crate::{Error, Result};

struct Lanes {
    /// GPU, CPU, PCIe, DIMM-Link, then one per NDP unit.
    free: Vec<f64>,
}

impl Lanes {
    fn idx(l: Lane) -> usize {
        match l {
            Lane::Gpu => 0,
            Lane::Cpu => 1,
            Lane::Pcie => 2,
            Lane::Link => 3,
            Lane::Ndp(u) => 4 + u as usize,
        }
    }
}

/// Expert layouts of an NDP run: `[layer][expert]` the current one and a move in flight
/// (target, landing time).
struct Layouts {
    now: Vec<Vec<Layout>>,
    moving: Vec<Vec<Option<(Layout, f64)>>>,
}

impl Layouts {
    /// The layout of `(l, e)` at time `t`, landing a finished move.
    fn at(&mut self, l: usize, e: usize, t: f64) -> Layout {
        if let Some((to, end)) = self.moving[l][e]
            && end <= t
        {
            self.now[l][e] = to;
            self.moving[l][e] = None;
        }
        self.now[l][e]
    }
}

struct Sim {
    lanes: Lanes,
    ops: Vec<Op>,
    /// `[layer][expert]`: when the resident copy is usable.
    resident: Vec<Vec<Option<f64>>>,
    used: u64,
    peak: u64,
    step: usize,
    layer: usize,
}

impl Sim {
    fn run_op(
        &mut self,
        lane: Lane,
        ready: f64,
        dur: f64,
        name: String,
        weights_ready: f64,
    ) -> f64 {
        self.run_flops(lane, ready, dur, name, weights_ready, 0.0)
    }

    /// [`Sim::run_op`] for an operation that executes `flops` (the expert matmuls, which
    /// the FLOP utilisation counts).
    fn run_flops(
        &mut self,
        lane: Lane,
        ready: f64,
        dur: f64,
        name: String,
        weights_ready: f64,
        flops: f64,
    ) -> f64 {
        let i = Lanes::idx(lane);
        let start = self.lanes.free[i].max(ready);
        let end = start + dur.max(0.0);
        self.lanes.free[i] = end;
        self.ops.push(Op {
            lane,
            start,
            end,
            name,
            step: self.step,
            layer: self.layer,
            weights_ready,
            flops,
        });
        end
    }

    fn err(&self, policy: &str, msg: String) -> Error {
        Error::Policy {
            policy: policy.to_string(),
            step: self.step,
            layer: self.layer,
            msg,
        }
    }
}

/// Simulates `policy` on `workload` with `cost`.
pub fn simulate(policy: &mut dyn Policy, cost: &CostModel, workload: &Workload) -> Result<Report> {
    let m = &cost.model;
    let n_moe = workload.moe_layers();
    if workload.n_experts != m.n_experts || workload.top_k != m.top_k || n_moe != m.moe_layers() {
        return Err(Error::Mismatch(format!(
            "workload has {n_moe} MoE layers of {} experts top-{}, model has {} of {} top-{}",
            workload.n_experts,
            workload.top_k,
            m.moe_layers(),
            m.n_experts,
            m.top_k
        )));
    }
    let mut run = Run::new(policy, cost, workload)?;
    let mut t = 0.0f64;
    for (si, step) in workload.steps.iter().enumerate() {
        t = run.step(si, step, t)?;
    }
    run.report.finish(run.sim.ops, run.sim.peak, run.budget);
    Ok(run.report)
}

/// Completion times of one device's experts in one layer: those the layer's output waits
/// for and those deferred to the next layer (`None`: none ran).
#[derive(Clone, Copy, Default)]
struct Ends {
    now: Option<f64>,
    deferred: Option<f64>,
}

impl Ends {
    fn add(&mut self, deferred: bool, end: f64) {
        let slot = if deferred {
            &mut self.deferred
        } else {
            &mut self.now
        };
        *slot = Some(slot.map_or(end, |x: f64| x.max(end)));
    }
}

/// One simulation: the policy, the machine's timelines and what the report collects.
struct Run<'a> {
    policy: &'a mut dyn Policy,
    name: String,
    cost: &'a CostModel,
    top_k: usize,
    n_moe: usize,
    budget: u64,
    /// Bytes of one routed expert.
    eb: u64,
    sim: Sim,
    nc: NdpCosts<'a>,
    /// Expert layouts, when the policy states them (NDP machines).
    layouts: Option<Layouts>,
    /// Per NDP unit: DIMM time of the host reads of the current layer.
    reads: Vec<f64>,
    report: Report,
    /// Attention, dense layers, shared experts and the head: the GPU, or the CPU without one.
    host: Lane,
    /// Per MoE layer: the last predicted experts and loads, with their request.
    pending_pred: Vec<Option<(usize, Vec<u32>)>>,
    pending_load: Vec<Option<(usize, Vec<f64>)>>,
    /// Scratch: residency of the layer being decided.
    resident_now: Vec<bool>,
}

impl<'a> Run<'a> {
    /// Places the policy's initial residency and layouts.
    fn new(policy: &'a mut dyn Policy, cost: &'a CostModel, workload: &Workload) -> Result<Self> {
        let n = cost.model.n_experts;
        let n_moe = workload.moe_layers();
        let name = policy.name();
        let nc = NdpCosts::new(cost);
        let mut run = Run {
            name: name.clone(),
            cost,
            top_k: workload.top_k,
            n_moe,
            budget: cost.gpu_expert_budget(),
            eb: cost.expert_bytes(),
            sim: Sim {
                lanes: Lanes {
                    free: vec![0.0; 4 + cost.hw.ndp.as_ref().map_or(0, |n| n.units as usize)],
                },
                ops: Vec::new(),
                resident: vec![vec![None; n]; n_moe],
                used: 0,
                peak: 0,
                step: 0,
                layer: 0,
            },
            nc,
            layouts: None,
            reads: vec![0.0f64; nc.units() as usize],
            report: Report::new(&name, cost, n_moe),
            host: match cost.dense_device() {
                Device::Gpu => Lane::Gpu,
                _ => Lane::Cpu,
            },
            pending_pred: vec![None; n_moe],
            pending_load: vec![None; n_moe],
            resident_now: vec![false; n],
            policy,
        };
        run.place_initial()?;
        Ok(run)
    }

    fn err(&self, msg: String) -> Error {
        self.sim.err(&self.name, msg)
    }

    /// The policy's initial residency (within the budget) and layouts.
    fn place_initial(&mut self) -> Result<()> {
        let n = self.resident_now.len();
        for (l, e) in self.policy.initial_residency(self.cost) {
            if l >= self.n_moe || e as usize >= n {
                return Err(self.err(format!(
                    "initial residency names expert ({l}, {e}) out of range"
                )));
            }
            if self.sim.resident[l][e as usize].is_none() {
                self.sim.used += self.eb;
                self.sim.resident[l][e as usize] = Some(0.0);
            }
        }
        if self.sim.used > self.budget {
            return Err(self.err(format!(
                "initial residency uses {} bytes, budget {}",
                self.sim.used, self.budget
            )));
        }
        self.sim.peak = self.sim.used;
        if let Some(init) = self.policy.initial_layout(self.cost) {
            let mut now = vec![vec![Layout::Striped; n]; self.n_moe];
            for (l, e, x) in init {
                check_layout(&self.nc, x).map_err(|msg| self.err(msg))?;
                *now.get_mut(l)
                    .and_then(|v| v.get_mut(e as usize))
                    .ok_or_else(|| {
                        self.err(format!(
                            "initial layout names expert ({l}, {e}) out of range"
                        ))
                    })? = x;
            }
            self.layouts = Some(Layouts {
                now,
                moving: vec![vec![None; n]; self.n_moe],
            });
        }
        Ok(())
    }

    /// A routed expert's matmuls: gate, up and down projections, 2 FLOPs per weight.
    fn expert_flops(&self, tokens: usize) -> f64 {
        2.0 * self.cost.model.expert_params() as f64 * tokens as f64
    }

    /// One forward pass starting at `t`; returns when its head is done.
    fn step(&mut self, si: usize, step: &Step, t: f64) -> Result<f64> {
        let (cost, host) = (self.cost, self.host);
        let m = &cost.model;
        self.sim.step = si;
        let step_start = t;
        let mut x_ready = t;
        let mut deferred_end: Option<f64> = None;
        let ctx = step.context + step.tokens / 2;
        let mut layer_times = vec![0.0; self.n_moe];
        for li in 0..m.n_layers {
            let layer_start = x_ready;
            self.sim.layer = li;
            let attn_end = self.sim.run_op(
                host,
                x_ready,
                cost.attention_time(step.tokens, ctx),
                "attention".into(),
                0.0,
            );
            if li < m.dense_layers || li - m.dense_layers >= self.n_moe {
                x_ready = self.sim.run_op(
                    host,
                    attn_end,
                    cost.dense_mlp_time(step.tokens),
                    "dense mlp".into(),
                    0.0,
                );
                continue;
            }
            let l = li - m.dense_layers;
            let (moe_end, def) = self.moe_layer(si, step, l, attn_end, ctx, deferred_end)?;
            deferred_end = def;
            layer_times[l] = moe_end - layer_start;
            x_ready = moe_end;
        }
        if let Some(dl) = deferred_end {
            x_ready = x_ready.max(dl);
        }
        self.sim.layer = m.n_layers;
        let head_rows = if step.phase == Phase::Prefill {
            1
        } else {
            step.tokens
        };
        let t = self.sim.run_op(
            host,
            x_ready,
            cost.head_time(head_rows),
            "lm head".into(),
            0.0,
        );
        self.report
            .add_step(step.phase, step.tokens, t - step_start, &layer_times);
        Ok(t)
    }

    /// MoE layer `l` after its attention ends at `attn_end`: the policy's decision, then
    /// every device's share. Returns when the layer's output is ready and when its
    /// deferred experts end.
    fn moe_layer(
        &mut self,
        si: usize,
        step: &Step,
        l: usize,
        attn_end: f64,
        ctx: usize,
        prev_deferred: Option<f64>,
    ) -> Result<(f64, Option<f64>)> {
        let d = self.decide(si, step, l, attn_end, ctx)?;
        self.score(step, l, &d);
        for ev in &d.evictions {
            if self.sim.resident[ev.layer][ev.expert as usize]
                .take()
                .is_some()
            {
                self.sim.used -= self.eb;
            }
        }
        let gpu = self.gpu_share(&d, l, attn_end, step.tokens)?;
        let cpu = self.cpu_share(&d, l, attn_end);
        self.migrate(&d, attn_end)?;
        let ndp = self.ndp_share(&d, l, attn_end)?;
        let mut moe_end = gpu
            .now
            .unwrap_or(attn_end)
            .max(cpu.now.unwrap_or(attn_end))
            .max(ndp.now.unwrap_or(attn_end));
        if let Some(prev) = prev_deferred {
            moe_end = moe_end.max(prev);
        }
        if cpu.now.is_some()
            || cpu.deferred.is_some()
            || ndp.now.is_some()
            || ndp.deferred.is_some()
        {
            moe_end += self.cost.hw.sync_s;
        }
        let def = cpu
            .deferred
            .into_iter()
            .chain(ndp.deferred)
            .chain(gpu.deferred.filter(|&g| g > 0.0))
            .fold(None, |a: Option<f64>, b| Some(a.map_or(b, |x| x.max(b))));
        Ok((moe_end, def))
    }

    /// Shows the policy layer `l` and checks its decision.
    fn decide(
        &mut self,
        si: usize,
        step: &Step,
        l: usize,
        attn_end: f64,
        ctx: usize,
    ) -> Result<Decision> {
        let r = &step.layers[l];
        for (e, slot) in self.resident_now.iter_mut().enumerate() {
            *slot = self.sim.resident[l][e].is_some();
        }
        let sim = &self.sim;
        let now = |lane: Lane| (sim.lanes.free[Lanes::idx(lane)] - attn_end).max(0.0);
        let view = LayerView {
            layer: l,
            n_moe_layers: self.n_moe,
            phase: step.phase,
            step: si,
            top_k: self.top_k,
            ids: &r.ids,
            weights: &r.weights,
            hidden: r.hidden.as_deref(),
            candidates: r.candidates.as_ref().map(|c| Candidates {
                per_token: c.per_token,
                ids: &c.ids,
                scores: &c.scores,
            }),
            gpu: GpuView {
                resident: &self.resident_now,
                free_bytes: self.budget.saturating_sub(sim.used),
                busy_s: now(Lane::Gpu),
            },
            cpu_busy_s: now(Lane::Cpu),
            pcie_busy_s: now(Lane::Pcie),
            context: Some(ctx),
        };
        let d = self.policy.decide(&view, self.cost);
        d.check(&view).map_err(|e| self.err(e.to_string()))?;
        Ok(d)
    }

    /// Scores the previous predictions of layer `l` against this step, remembers the new
    /// ones, and counts the activations and cache hits.
    fn score(&mut self, step: &Step, l: usize, d: &Decision) {
        let r = &step.layers[l];
        let decode_of_same = |req: usize| req == step.request && step.phase == Phase::Decode;
        if let Some((req, pred)) = self.pending_pred[l].take()
            && decode_of_same(req)
        {
            let mut actual = r.ids.clone();
            actual.sort_unstable();
            actual.dedup();
            let hit = actual.iter().filter(|e| pred.contains(e)).count();
            self.report.add_prediction(hit, actual.len());
        }
        if let Some(p) = &d.predicted {
            self.pending_pred[l] = Some((step.request, p.clone()));
        }
        if let Some((req, pred)) = self.pending_load[l].take()
            && decode_of_same(req)
        {
            let mut loads = vec![0u32; self.resident_now.len()];
            for &e in &r.ids {
                if let Some(x) = loads.get_mut(e as usize) {
                    *x += 1;
                }
            }
            self.report.add_load_prediction(&pred, &loads);
        }
        if let Some(p) = &d.predicted_load {
            self.pending_load[l] = Some((step.request, p.clone()));
        }
        // Hits: activations whose expert was on the GPU when the layer was decided.
        for task in &d.tasks {
            let hit = self.resident_now[task.expert as usize];
            self.report.add_activations(
                step.phase,
                task.rows.len(),
                hit,
                task.device == Device::Gpu,
            );
        }
    }

    /// The predictor and shared experts, then the copies on PCIe and the GPU experts, each
    /// lane in its own order. `deferred` is `Some(0.0)` when no GPU expert is deferred.
    fn gpu_share(&mut self, d: &Decision, l: usize, attn_end: f64, tokens: usize) -> Result<Ends> {
        let (cost, host) = (self.cost, self.host);
        let mut gpu_imm = attn_end;
        if d.predicted.is_some() {
            gpu_imm = self.sim.run_op(
                host,
                attn_end,
                cost.predictor_time(tokens),
                "predictor".into(),
                0.0,
            );
        }
        if cost.model.n_shared > 0 {
            gpu_imm = self.sim.run_flops(
                host,
                attn_end,
                cost.shared_time(tokens),
                "shared experts".into(),
                0.0,
                cost.model.n_shared as f64 * self.expert_flops(tokens),
            );
        }
        let plan = TransferPlan::new(d, l, self.resident_now.len());
        let gpu_tasks: Vec<&Task> = d.tasks.iter().filter(|t| t.device == Device::Gpu).collect();
        let mut copy_end: Vec<Option<f64>> = vec![None; d.transfers.len()];
        let mut staged_done: Vec<Option<f64>> = vec![None; plan.staged.len()];
        let (mut ti, mut gi) = (0usize, 0usize);
        let mut gpu_def: f64 = 0.0;
        while ti < plan.order.len() || gi < gpu_tasks.len() {
            let mut progressed = false;
            if gi < gpu_tasks.len() {
                let task = gpu_tasks[gi];
                let e = task.expert as usize;
                let weights = match plan.copy_of[e] {
                    Some(c) => copy_end[c],
                    None => self.sim.resident[l][e],
                };
                if let Some(w) = weights {
                    let dur = cost.expert_time(Device::Gpu, task.rows.len() as u32);
                    let end = self.sim.run_flops(
                        Lane::Gpu,
                        attn_end.max(w),
                        dur,
                        format!("expert {e}"),
                        w,
                        self.expert_flops(task.rows.len()),
                    );
                    if task.deferred {
                        gpu_def = gpu_def.max(end);
                    } else {
                        gpu_imm = gpu_imm.max(end);
                    }
                    if let Some(c) = plan.copy_of[e]
                        && let Some(s) = plan.staged.iter().position(|&x| x == c)
                    {
                        staged_done[s] = Some(end);
                    }
                    gi += 1;
                    progressed = true;
                }
            }
            if ti < plan.order.len() {
                let i = plan.order[ti];
                // Two ping-pong buffers: a staged copy waits for the expert two before it.
                let buffer_free = match plan.staged.iter().position(|&x| x == i) {
                    Some(s) if s >= 2 => staged_done[s - 2],
                    _ => Some(attn_end),
                };
                if let Some(ready) = buffer_free {
                    copy_end[i] = Some(self.copy(d.transfers[i], ready, attn_end)?);
                    ti += 1;
                    progressed = true;
                }
            }
            if !progressed {
                return Err(self
                    .err("copies and GPU experts wait on each other (inconsistent order)".into()));
            }
        }
        Ok(Ends {
            now: Some(gpu_imm),
            deferred: Some(gpu_def),
        })
    }

    /// One copy on PCIe once its buffer is free at `ready`; a kept copy takes expert
    /// memory, which must stay within the budget. Returns when it lands.
    fn copy(&mut self, tr: Transfer, ready: f64, attn_end: f64) -> Result<f64> {
        if tr.kind != TransferKind::Staged
            && self.sim.resident[tr.layer][tr.expert as usize].is_none()
        {
            self.sim.used += self.eb;
            if self.sim.used > self.budget {
                return Err(self.err(format!(
                    "GPU expert memory {} bytes over the budget {}",
                    self.sim.used, self.budget
                )));
            }
            self.sim.peak = self.sim.peak.max(self.sim.used);
        }
        let dur = match self.layouts.as_mut() {
            Some(ly) => {
                let x = ly.at(tr.layer, tr.expert as usize, attn_end);
                add_reads(&self.nc, x, &mut self.reads);
                self.nc.copy(x)
            }
            None => self.cost.expert_transfer_time(),
        };
        let end = self.sim.run_op(
            Lane::Pcie,
            ready.max(attn_end),
            dur,
            format!("copy {}:{}", tr.layer, tr.expert),
            0.0,
        );
        self.report.pcie_bytes += self.eb;
        if tr.kind != TransferKind::Staged {
            self.sim.resident[tr.layer][tr.expert as usize] = Some(end);
        }
        Ok(end)
    }

    /// The CPU's experts: immediate first, then deferred.
    fn cpu_share(&mut self, d: &Decision, l: usize, attn_end: f64) -> Ends {
        let mut ends = Ends::default();
        for deferred in [false, true] {
            for task in d
                .tasks
                .iter()
                .filter(|t| t.device == Device::Cpu && t.deferred == deferred)
            {
                let tokens = task.rows.len() as u32;
                let dur = match self.layouts.as_mut() {
                    Some(ly) => {
                        let x = ly.at(l, task.expert as usize, attn_end);
                        add_reads(&self.nc, x, &mut self.reads);
                        self.nc.cpu(tokens, x)
                    }
                    None => self.cost.expert_time(Device::Cpu, tokens),
                };
                let flops = self.expert_flops(task.rows.len());
                let end = self.sim.run_flops(
                    Lane::Cpu,
                    attn_end,
                    dur,
                    format!("expert {}", task.expert),
                    0.0,
                    flops,
                );
                ends.add(deferred, end);
            }
        }
        ends
    }

    /// Layout moves, in the background on the DIMM-Link.
    fn migrate(&mut self, d: &Decision, attn_end: f64) -> Result<()> {
        for mv in &d.migrations {
            if self.layouts.is_none() {
                return Err(self.err("migrates experts without stating an initial layout".into()));
            }
            check_layout(&self.nc, mv.to).map_err(|msg| self.err(msg))?;
            let e = mv.expert as usize;
            let end = self.sim.run_op(
                Lane::Link,
                attn_end,
                self.nc.link_move(),
                format!("move {}:{e} to {:?}", mv.layer, mv.to),
                0.0,
            );
            if let Some(ly) = self.layouts.as_mut() {
                ly.at(mv.layer, e, attn_end);
                ly.moving[mv.layer][e] = Some((mv.to, end));
            }
        }
        Ok(())
    }

    /// NDP experts, each on its unit once its weights are localized there; then each DIMM
    /// serves the host reads of the layer after its own experts (eq. 6).
    fn ndp_share(&mut self, d: &Decision, l: usize, attn_end: f64) -> Result<Ends> {
        let units = self.nc.units();
        let mut ends = Ends::default();
        for task in &d.tasks {
            let Device::Ndp(u) = task.device else {
                continue;
            };
            if u >= units {
                return Err(self.err(format!(
                    "expert {} on NDP unit {u}, the machine has {units}",
                    task.expert
                )));
            }
            let mut ready = attn_end;
            if let Some(ly) = self.layouts.as_mut() {
                let e = task.expert as usize;
                let x = ly.at(l, e, attn_end);
                match ly.moving[l][e] {
                    _ if x == Layout::Localized(u) => {}
                    Some((Layout::Localized(v), end)) if v == u => ready = ready.max(end),
                    _ => {
                        return Err(self.sim.err(
                            &self.name,
                            format!("expert {e} runs on NDP unit {u} but its weights are {x:?}"),
                        ));
                    }
                }
            }
            let dur = self.cost.expert_time(task.device, task.rows.len() as u32);
            let flops = self.expert_flops(task.rows.len());
            let end = self.sim.run_flops(
                Lane::Ndp(u),
                ready,
                dur,
                format!("expert {}", task.expert),
                0.0,
                flops,
            );
            ends.add(task.deferred, end);
        }
        for (u, r) in self.reads.iter_mut().enumerate() {
            if *r > 0.0 {
                let end =
                    self.sim
                        .run_op(Lane::Ndp(u as u16), attn_end, *r, "host reads".into(), 0.0);
                ends.add(false, end);
                *r = 0.0;
            }
        }
        Ok(ends)
    }
}

/// Adds the DIMM time of one host read of an expert laid out as `x` to `reads` (per unit).
fn add_reads(nc: &NdpCosts, x: Layout, reads: &mut [f64]) {
    match nc.contention(x) {
        (None, t) => reads.iter_mut().for_each(|r| *r += t),
        (Some(d), t) => {
            if let Some(r) = reads.get_mut(d as usize) {
                *r += t;
            }
        }
    }
}

/// A layout must name a DIMM the machine has.
fn check_layout(nc: &NdpCosts, x: Layout) -> std::result::Result<(), String> {
    match x {
        Layout::Localized(d) if u32::from(d) >= nc.dimms() => Err(format!(
            "layout {x:?} names a DIMM the machine does not have ({} DIMMs)",
            nc.dimms()
        )),
        _ => Ok(()),
    }
}
