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
//! A key design decision: the simulator checks every decision instead of trusting it: each
//! routed (token, expert) pair computed exactly once, GPU experts resident or copied,
//! expert memory never over the budget. A policy bug is an error naming the step and layer.

use strata_policy::layout::NdpCosts;
use strata_policy::{
    Candidates, CostModel, Decision, Device, GpuView, LayerView, Layout, Phase, Policy,
    TransferKind,
};

use crate::report::{Lane, Op, Report};
use crate::workload::Workload;
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

fn check_coverage(
    d: &Decision,
    ids: &[u32],
    k: usize,
    n: usize,
) -> std::result::Result<(), String> {
    let mut want = vec![0u32; n];
    let mut pairs: Vec<(u32, u32)> = Vec::with_capacity(ids.len());
    for (i, &e) in ids.iter().enumerate() {
        if (e as usize) < n {
            want[e as usize] += 1;
            pairs.push(((i / k.max(1)) as u32, e));
        }
    }
    let mut got: Vec<(u32, u32)> = d
        .tasks
        .iter()
        .flat_map(|t| t.rows.iter().map(move |&r| (r, t.expert)))
        .collect();
    pairs.sort_unstable();
    got.sort_unstable();
    if pairs != got {
        return Err(format!(
            "tasks cover {} (token, expert) pairs, the routing has {}, or they differ",
            got.len(),
            pairs.len()
        ));
    }
    Ok(())
}

/// Simulates `policy` on `workload` with `cost`.
pub fn simulate(policy: &mut dyn Policy, cost: &CostModel, workload: &Workload) -> Result<Report> {
    let name = policy.name();
    let m = &cost.model;
    let n = m.n_experts;
    let n_moe = workload.moe_layers();
    if workload.n_experts != n || workload.top_k != m.top_k || n_moe != m.moe_layers() {
        return Err(Error::Mismatch(format!(
            "workload has {n_moe} MoE layers of {} experts top-{}, model has {} of {n} top-{}",
            workload.n_experts,
            workload.top_k,
            m.moe_layers(),
            m.top_k
        )));
    }
    let budget = cost.gpu_expert_budget();
    let eb = cost.expert_bytes();
    let mut sim = Sim {
        lanes: Lanes {
            free: vec![0.0; 4 + cost.hw.ndp.as_ref().map_or(0, |n| n.units as usize)],
        },
        ops: Vec::new(),
        resident: vec![vec![None; n]; n_moe],
        used: 0,
        peak: 0,
        step: 0,
        layer: 0,
    };
    for (l, e) in policy.initial_residency(cost) {
        if l >= n_moe || e as usize >= n {
            return Err(sim.err(
                &name,
                format!("initial residency names expert ({l}, {e}) out of range"),
            ));
        }
        if sim.resident[l][e as usize].is_none() {
            sim.used += eb;
            sim.resident[l][e as usize] = Some(0.0);
        }
    }
    if sim.used > budget {
        return Err(sim.err(
            &name,
            format!("initial residency uses {} bytes, budget {budget}", sim.used),
        ));
    }
    sim.peak = sim.used;
    let nc = NdpCosts::new(cost);
    let mut layouts = match policy.initial_layout(cost) {
        None => None,
        Some(init) => {
            let mut now = vec![vec![Layout::Striped; n]; n_moe];
            for (l, e, x) in init {
                check_layout(&nc, x).map_err(|msg| sim.err(&name, msg))?;
                *now.get_mut(l)
                    .and_then(|v| v.get_mut(e as usize))
                    .ok_or_else(|| {
                        sim.err(
                            &name,
                            format!("initial layout names expert ({l}, {e}) out of range"),
                        )
                    })? = x;
            }
            Some(Layouts {
                now,
                moving: vec![vec![None; n]; n_moe],
            })
        }
    };
    let units = nc.units();
    let mut reads = vec![0.0f64; units as usize];
    let mut report = Report::new(&name, cost, n_moe);
    let mut t = 0.0f64;
    // Attention, dense layers, shared experts and the head: the GPU, or the CPU without one.
    let host = match cost.dense_device() {
        Device::Gpu => Lane::Gpu,
        _ => Lane::Cpu,
    };
    let mut pending_pred: Vec<Option<(usize, Vec<u32>)>> = vec![None; n_moe];
    let mut pending_load: Vec<Option<(usize, Vec<f64>)>> = vec![None; n_moe];
    // A routed expert's matmuls: gate, up and down projections, 2 FLOPs per weight.
    let expert_flops = |tokens: usize| 2.0 * m.expert_params() as f64 * tokens as f64;
    let mut resident_now = vec![false; n];
    for (si, step) in workload.steps.iter().enumerate() {
        sim.step = si;
        let step_start = t;
        let mut x_ready = t;
        let mut deferred_end: Option<f64> = None;
        let ctx = step.context + step.tokens / 2;
        let mut layer_times = vec![0.0; n_moe];
        for li in 0..m.n_layers {
            let layer_start = x_ready;
            sim.layer = li;
            let attn_end = sim.run_op(
                host,
                x_ready,
                cost.attention_time(step.tokens, ctx),
                "attention".into(),
                0.0,
            );
            if li < m.dense_layers || li - m.dense_layers >= n_moe {
                x_ready = sim.run_op(
                    host,
                    attn_end,
                    cost.dense_mlp_time(step.tokens),
                    "dense mlp".into(),
                    0.0,
                );
                continue;
            }
            let l = li - m.dense_layers;
            let r = &step.layers[l];
            for (e, slot) in resident_now.iter_mut().enumerate() {
                *slot = sim.resident[l][e].is_some();
            }
            let now = |lane: Lane, s: &Sim| (s.lanes.free[Lanes::idx(lane)] - attn_end).max(0.0);
            let view = LayerView {
                layer: l,
                n_moe_layers: n_moe,
                phase: step.phase,
                step: si,
                top_k: workload.top_k,
                ids: &r.ids,
                weights: &r.weights,
                hidden: r.hidden.as_deref(),
                candidates: r.candidates.as_ref().map(|c| Candidates {
                    per_token: c.per_token,
                    ids: &c.ids,
                    scores: &c.scores,
                }),
                gpu: GpuView {
                    resident: &resident_now,
                    free_bytes: budget.saturating_sub(sim.used),
                    busy_s: now(Lane::Gpu, &sim),
                },
                cpu_busy_s: now(Lane::Cpu, &sim),
                pcie_busy_s: now(Lane::Pcie, &sim),
                context: Some(ctx),
            };
            let d = policy.decide(&view, cost);
            check_coverage(&d, &r.ids, workload.top_k, n).map_err(|msg| sim.err(&name, msg))?;
            // Prediction accuracy against this step, then remember the new prediction.
            if let Some((req, pred)) = pending_pred[l].take()
                && req == step.request
                && step.phase == Phase::Decode
            {
                let mut actual = r.ids.clone();
                actual.sort_unstable();
                actual.dedup();
                let hit = actual.iter().filter(|e| pred.contains(e)).count();
                report.add_prediction(hit, actual.len());
            }
            if let Some(p) = &d.predicted {
                pending_pred[l] = Some((step.request, p.clone()));
            }
            // Predicted loads against the loads this step realised.
            if let Some((req, pred)) = pending_load[l].take()
                && req == step.request
                && step.phase == Phase::Decode
            {
                let mut loads = vec![0u32; n];
                for &e in &r.ids {
                    if let Some(x) = loads.get_mut(e as usize) {
                        *x += 1;
                    }
                }
                report.add_load_prediction(&pred, &loads);
            }
            if let Some(p) = &d.predicted_load {
                pending_load[l] = Some((step.request, p.clone()));
            }
            // Hits: activations whose expert was on the GPU when the layer was decided.
            for task in &d.tasks {
                let hit = resident_now[task.expert as usize];
                report.add_activations(
                    step.phase,
                    task.rows.len(),
                    hit,
                    task.device == Device::Gpu,
                );
            }
            // Evictions first; an expert this layer runs on the GPU must stay.
            for ev in &d.evictions {
                if ev.layer == l
                    && d.tasks
                        .iter()
                        .any(|t| t.device == Device::Gpu && t.expert == ev.expert)
                    && !d.transfers.iter().any(|t| {
                        t.layer == l && t.expert == ev.expert && t.kind != TransferKind::Prefetch
                    })
                {
                    return Err(sim.err(
                        &name,
                        format!("evicts expert {} that it runs on the GPU", ev.expert),
                    ));
                }
                let slot = sim
                    .resident
                    .get_mut(ev.layer)
                    .and_then(|v| v.get_mut(ev.expert as usize))
                    .ok_or_else(|| Error::Policy {
                        policy: name.clone(),
                        step: si,
                        layer: li,
                        msg: format!("evicts ({}, {}) out of range", ev.layer, ev.expert),
                    })?;
                if slot.take().is_some() {
                    sim.used -= eb;
                }
            }
            // GPU tasks need their weights: resident or copied by this decision.
            let mut copy_of: Vec<Option<usize>> = vec![None; n];
            for (i, tr) in d.transfers.iter().enumerate() {
                if tr.layer == l && tr.kind != TransferKind::Prefetch {
                    copy_of[tr.expert as usize] = Some(i);
                }
            }
            let gpu_tasks: Vec<&strata_policy::Task> =
                d.tasks.iter().filter(|t| t.device == Device::Gpu).collect();
            for task in &gpu_tasks {
                if sim.resident[l][task.expert as usize].is_none()
                    && copy_of[task.expert as usize].is_none()
                {
                    return Err(sim.err(
                        &name,
                        format!(
                            "expert {} runs on the GPU but is neither resident nor copied",
                            task.expert
                        ),
                    ));
                }
            }
            // Predictor and shared experts right after attention.
            let mut gpu_imm = attn_end;
            if d.predicted.is_some() {
                gpu_imm = sim.run_op(
                    host,
                    attn_end,
                    cost.predictor_time(step.tokens),
                    "predictor".into(),
                    0.0,
                );
            }
            if m.n_shared > 0 {
                gpu_imm = sim.run_flops(
                    host,
                    attn_end,
                    cost.shared_time(step.tokens),
                    "shared experts".into(),
                    0.0,
                    m.n_shared as f64 * expert_flops(step.tokens),
                );
            }
            // Copies and GPU experts, each lane in its own order.
            let mut order: Vec<usize> = (0..d.transfers.len()).collect();
            order.sort_by_key(|&i| d.transfers[i].priority);
            let mut copy_end: Vec<Option<f64>> = vec![None; d.transfers.len()];
            let staged: Vec<usize> = order
                .iter()
                .copied()
                .filter(|&i| d.transfers[i].kind == TransferKind::Staged)
                .collect();
            let mut staged_done: Vec<Option<f64>> = vec![None; staged.len()];
            let (mut ti, mut gi) = (0usize, 0usize);
            let mut gpu_def: f64 = 0.0;
            while ti < order.len() || gi < gpu_tasks.len() {
                let mut progressed = false;
                if gi < gpu_tasks.len() {
                    let task = gpu_tasks[gi];
                    let e = task.expert as usize;
                    let weights = match copy_of[e] {
                        Some(c) => copy_end[c],
                        None => sim.resident[l][e],
                    };
                    if let Some(w) = weights {
                        let dur = cost.expert_time(Device::Gpu, task.rows.len() as u32);
                        let end = sim.run_flops(
                            Lane::Gpu,
                            attn_end.max(w),
                            dur,
                            format!("expert {e}"),
                            w,
                            expert_flops(task.rows.len()),
                        );
                        if task.deferred {
                            gpu_def = gpu_def.max(end);
                        } else {
                            gpu_imm = gpu_imm.max(end);
                        }
                        if let Some(c) = copy_of[e]
                            && let Some(s) = staged.iter().position(|&x| x == c)
                        {
                            staged_done[s] = Some(end);
                        }
                        gi += 1;
                        progressed = true;
                    }
                }
                if ti < order.len() {
                    let i = order[ti];
                    let tr = d.transfers[i];
                    let buffer_free = match staged.iter().position(|&x| x == i) {
                        Some(s) if s >= 2 => staged_done[s - 2],
                        _ => Some(attn_end),
                    };
                    if let Some(ready) = buffer_free {
                        if tr.kind != TransferKind::Staged {
                            let slot = sim
                                .resident
                                .get(tr.layer)
                                .and_then(|v| v.get(tr.expert as usize))
                                .ok_or_else(|| Error::Policy {
                                    policy: name.clone(),
                                    step: si,
                                    layer: li,
                                    msg: format!(
                                        "copies ({}, {}) out of range",
                                        tr.layer, tr.expert
                                    ),
                                })?;
                            if slot.is_none() {
                                sim.used += eb;
                                if sim.used > budget {
                                    return Err(sim.err(
                                        &name,
                                        format!(
                                            "GPU expert memory {} bytes over the budget {budget}",
                                            sim.used
                                        ),
                                    ));
                                }
                                sim.peak = sim.peak.max(sim.used);
                            }
                        }
                        let dur = match layouts.as_mut() {
                            Some(ly) => {
                                let x = ly.at(tr.layer, tr.expert as usize, attn_end);
                                add_reads(&nc, x, &mut reads);
                                nc.copy(x)
                            }
                            None => cost.expert_transfer_time(),
                        };
                        let end = sim.run_op(
                            Lane::Pcie,
                            ready.max(attn_end),
                            dur,
                            format!("copy {}:{}", tr.layer, tr.expert),
                            0.0,
                        );
                        report.pcie_bytes += eb;
                        copy_end[i] = Some(end);
                        if tr.kind != TransferKind::Staged {
                            sim.resident[tr.layer][tr.expert as usize] = Some(end);
                        }
                        ti += 1;
                        progressed = true;
                    }
                }
                if !progressed {
                    return Err(sim.err(
                        &name,
                        "copies and GPU experts wait on each other (inconsistent order)".into(),
                    ));
                }
            }
            // CPU experts: immediate first, then deferred.
            let mut cpu_imm: Option<f64> = None;
            let mut cpu_def: Option<f64> = None;
            for deferred in [false, true] {
                for task in d
                    .tasks
                    .iter()
                    .filter(|t| t.device == Device::Cpu && t.deferred == deferred)
                {
                    let tokens = task.rows.len() as u32;
                    let dur = match layouts.as_mut() {
                        Some(ly) => {
                            let x = ly.at(l, task.expert as usize, attn_end);
                            add_reads(&nc, x, &mut reads);
                            nc.cpu(tokens, x)
                        }
                        None => cost.expert_time(Device::Cpu, tokens),
                    };
                    let end = sim.run_flops(
                        Lane::Cpu,
                        attn_end,
                        dur,
                        format!("expert {}", task.expert),
                        0.0,
                        expert_flops(task.rows.len()),
                    );
                    let slot = if deferred { &mut cpu_def } else { &mut cpu_imm };
                    *slot = Some(slot.map_or(end, |x: f64| x.max(end)));
                }
            }
            // Layout moves, in the background on the DIMM-Link.
            for mv in &d.migrations {
                let Some(ly) = layouts.as_mut() else {
                    return Err(sim.err(
                        &name,
                        "migrates experts without stating an initial layout".into(),
                    ));
                };
                check_layout(&nc, mv.to).map_err(|msg| sim.err(&name, msg))?;
                let e = mv.expert as usize;
                if mv.layer >= n_moe || e >= n {
                    return Err(
                        sim.err(&name, format!("migrates ({}, {e}) out of range", mv.layer))
                    );
                }
                ly.at(mv.layer, e, attn_end);
                let end = sim.run_op(
                    Lane::Link,
                    attn_end,
                    nc.link_move(),
                    format!("move {}:{e} to {:?}", mv.layer, mv.to),
                    0.0,
                );
                ly.moving[mv.layer][e] = Some((mv.to, end));
            }
            // NDP experts, each on its unit, once its weights are localized there.
            let mut ndp_imm: Option<f64> = None;
            let mut ndp_def: Option<f64> = None;
            for task in &d.tasks {
                let Device::Ndp(u) = task.device else {
                    continue;
                };
                if u >= units {
                    return Err(sim.err(
                        &name,
                        format!(
                            "expert {} on NDP unit {u}, the machine has {units}",
                            task.expert
                        ),
                    ));
                }
                let mut ready = attn_end;
                if let Some(ly) = layouts.as_mut() {
                    let e = task.expert as usize;
                    let x = ly.at(l, e, attn_end);
                    match ly.moving[l][e] {
                        _ if x == Layout::Localized(u) => {}
                        Some((Layout::Localized(v), end)) if v == u => ready = ready.max(end),
                        _ => {
                            return Err(sim.err(
                                &name,
                                format!(
                                    "expert {e} runs on NDP unit {u} but its weights are {x:?}"
                                ),
                            ));
                        }
                    }
                }
                let dur = cost.expert_time(task.device, task.rows.len() as u32);
                let end = sim.run_flops(
                    Lane::Ndp(u),
                    ready,
                    dur,
                    format!("expert {}", task.expert),
                    0.0,
                    expert_flops(task.rows.len()),
                );
                let slot = if task.deferred {
                    &mut ndp_def
                } else {
                    &mut ndp_imm
                };
                *slot = Some(slot.map_or(end, |x: f64| x.max(end)));
            }
            // Each DIMM serves the host reads of the layer after its own experts (eq. 6).
            for (u, r) in reads.iter_mut().enumerate() {
                if *r > 0.0 {
                    let end =
                        sim.run_op(Lane::Ndp(u as u16), attn_end, *r, "host reads".into(), 0.0);
                    ndp_imm = Some(ndp_imm.map_or(end, |x: f64| x.max(end)));
                    *r = 0.0;
                }
            }
            let mut moe_end = gpu_imm
                .max(cpu_imm.unwrap_or(attn_end))
                .max(ndp_imm.unwrap_or(attn_end));
            if let Some(prev) = deferred_end {
                moe_end = moe_end.max(prev);
            }
            if cpu_imm.is_some() || cpu_def.is_some() || ndp_imm.is_some() || ndp_def.is_some() {
                moe_end += cost.hw.sync_s;
            }
            let def = cpu_def
                .into_iter()
                .chain(ndp_def)
                .chain((gpu_def > 0.0).then_some(gpu_def))
                .fold(None, |a: Option<f64>, b| Some(a.map_or(b, |x| x.max(b))));
            deferred_end = def;
            layer_times[l] = moe_end - layer_start;
            x_ready = moe_end;
        }
        if let Some(dl) = deferred_end {
            x_ready = x_ready.max(dl);
        }
        sim.layer = m.n_layers;
        let head_rows = if step.phase == Phase::Prefill {
            1
        } else {
            step.tokens
        };
        t = sim.run_op(
            host,
            x_ready,
            cost.head_time(head_rows),
            "lm head".into(),
            0.0,
        );
        report.add_step(step.phase, step.tokens, t - step_start, &layer_times);
    }
    report.finish(sim.ops, sim.peak, budget);
    Ok(report)
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
