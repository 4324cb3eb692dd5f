//! TriMoE (seed 000): hot experts on the GPU, warm experts on the AMX CPU, cold experts on
//! the NDP unit of the DIMM that holds them, scheduled by a bottleneck-aware greedy
//! makespan algorithm, with prediction-driven prefetch, relayout and rebalancing.
//!
//! Per layer and step:
//! 1. **Costs** (eq. 1-4, [`NdpCosts`]): GPU hit, GPU miss (compute, PCIe and the DRAM read
//!    of the expert's layout), CPU (compute or the layout's DRAM read), NDP (compute or the
//!    internal read; only on the DIMM where the expert is localized).
//! 2. **Makespan** (eq. 5-7, [`Schedule`]): GPU and CPU sum their experts; each DIMM sums its
//!    NDP experts plus the host reads it serves (striped reads touch every DIMM, localized
//!    ones their DIMM); the makespan is the largest of them.
//! 3. **Greedy** ([`greedy`]): list scheduling, costliest expert first, each where the
//!    makespan so far grows least (the paper names a greedy makespan assignment without
//!    its order; this is the classic one), then **refinement**
//!    ([`refine`]): take the bottleneck device's costliest expert and move it to whichever
//!    other device gives the smallest new makespan (ties: the smallest increase on the
//!    receiving device); if it cannot improve, try its next costliest; stop when nothing on
//!    the bottleneck improves or after the iteration cap.
//! 4. **Prediction** (decode): the EMA predictor ([`EmaPredictor`], alpha 0.3) is updated
//!    with the step's loads; a predicted schedule of the next step's loads ranks candidate
//!    moves: prefetch of predicted-hot experts over PCIe, relayout (localized <-> striped)
//!    of experts whose predicted device prefers the other layout, and rebalancing of cold
//!    experts from the busiest to the idlest DIMM. Each candidate's benefit is the predicted
//!    makespan reduction (then the reduction of the summed device time), and candidates run
//!    in benefit order while their summed time fits the overlap window: the layer's GPU
//!    work (attention at the view's context length, shared experts, its GPU experts).
//!    The decision carries the predicted loads, which the simulator scores.
//!
//! A key design decision: the offline layout is the same algorithm run on the offline
//! profile ([`TriMoE::new`]), localizing the coldest experts one at a time on the least
//! loaded DIMM while that lowers the profiled makespan, so static and dynamic placement
//! share one objective and no hot/warm/cold threshold exists anywhere: a class is simply
//! the device the schedule picks. The iteration cap (`2 x experts`) and the overlap window
//! are the only limits, both named by the paper without a value.

use crate::layout::NdpCosts;
use crate::predictor::EmaPredictor;
use crate::{
    CostModel, Decision, Device, Eviction, LayerView, Layout, Migration, Phase, Policy, Task,
    Transfer, TransferKind,
};

mod makespan;

pub use makespan::{Job, JobCost, Schedule, greedy, refine};

/// Which of TriMoE's parts are on (the ablation of seed 000 figure 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TriMoEConfig {
    /// The CPU takes experts (off: a GPU-NDP system).
    pub cpu: bool,
    /// Bottleneck-aware refinement after the greedy assignment.
    pub refine: bool,
    /// Prediction-driven prefetch, relayout and rebalancing.
    pub dynamic: bool,
}

impl TriMoEConfig {
    /// Everything on.
    pub const FULL: Self = Self {
        cpu: true,
        refine: true,
        dynamic: true,
    };
}

/// A candidate background move, as ranked by [`TriMoE`].
#[derive(Debug, Clone, Copy, PartialEq)]
enum Move {
    Prefetch(u32),
    Relayout(u32, Layout),
}

/// The TriMoE policy.
#[derive(Debug, Clone)]
pub struct TriMoE {
    cfg: TriMoEConfig,
    /// `[layer][expert]` offline tokens per step.
    profile: Vec<Vec<f64>>,
    ema: EmaPredictor,
    /// `[layer][expert]` as this policy has ordered them.
    layout: Vec<Vec<Layout>>,
}

impl TriMoE {
    /// A policy with the parts `cfg` enables and an offline profile `[layer][expert]` of
    /// mean tokens per decode step, which sets the initial residency, the initial layout and
    /// the predictor's starting point.
    pub fn new(cfg: TriMoEConfig, profile: Vec<Vec<f64>>) -> Self {
        Self {
            cfg,
            ema: EmaPredictor::from_profile(EmaPredictor::ALPHA, profile.clone()),
            profile,
            layout: Vec::new(),
        }
    }

    fn jobs_cost(&self, nc: &NdpCosts, jobs: &[Job]) -> Vec<JobCost> {
        jobs.iter()
            .map(|j| JobCost::of(nc, j, self.cfg.cpu))
            .collect()
    }

    fn schedule(&self, nc: &NdpCosts, jobs: &[Job]) -> Schedule {
        let mut s = greedy(self.jobs_cost(nc, jobs), nc.units());
        if self.cfg.refine {
            refine(&mut s, 2 * nc.cost().model.n_experts);
        }
        s
    }

    /// The offline layout of one layer from its profile: coldest first, localize each
    /// expert on the least loaded DIMM while that lowers the profiled makespan.
    fn offline_layout(&self, nc: &NdpCosts, layer: usize, resident: &[bool]) -> Vec<Layout> {
        let n = nc.cost().model.n_experts;
        let mut layout = vec![Layout::Striped; n];
        let units = nc.units();
        let Some(prof) = self.profile.get(layer) else {
            return layout;
        };
        if units == 0 {
            return layout;
        }
        let jobs: Vec<Job> = (0..n)
            .map(|e| Job {
                expert: e as u32,
                tokens: prof.get(e).copied().unwrap_or(0.0).round().max(1.0) as u32,
                resident: resident.get(e).copied().unwrap_or(false),
                layout: Layout::Striped,
            })
            .collect();
        let mut s = self.schedule(nc, &jobs);
        let mut order: Vec<usize> = (0..n).filter(|&e| !jobs[e].resident).collect();
        order.sort_by(|&a, &b| prof[a].total_cmp(&prof[b]).then(a.cmp(&b)));
        for e in order {
            let before = (s.makespan(), s.total());
            let (old_cost, old_dev) = (s.costs[e], s.device[e]);
            let d = idlest_dimm(&s, units);
            let job = Job {
                layout: Layout::Localized(d),
                ..jobs[e]
            };
            s.recost(e, JobCost::of(nc, &job, self.cfg.cpu));
            s.place_best(e);
            if better((s.makespan(), s.total()), before) {
                layout[e] = Layout::Localized(d);
            } else {
                s.recost(e, old_cost);
                s.set(e, old_dev);
            }
        }
        layout
    }

    /// Ranks prefetches and relayouts for the next step of `layer` and returns the ones
    /// fitting the window, in order, each with its ranked benefit (makespan, then summed
    /// device time, seconds).
    fn plan(
        &self,
        nc: &NdpCosts,
        layer: usize,
        resident: &[bool],
        busy_gpu: &[bool],
        window: f64,
        slots: usize,
    ) -> Vec<(Move, (f64, f64))> {
        let n = nc.cost().model.n_experts;
        let pred = self.ema.predicted(layer);
        let layout = &self.layout[layer];
        let units = nc.units();
        let jobs: Vec<Job> = (0..n)
            .map(|e| Job {
                expert: e as u32,
                tokens: pred.get(e).copied().unwrap_or(0.0).round() as u32,
                resident: resident[e],
                layout: layout[e],
            })
            .collect();
        let active: Vec<usize> = (0..n).filter(|&e| jobs[e].tokens > 0).collect();
        let act_jobs: Vec<Job> = active.iter().map(|&e| jobs[e]).collect();
        let mut s = self.schedule(nc, &act_jobs);
        // Hot set: the predicted-busiest experts that fit the GPU's slots.
        let mut by_load = active.clone();
        by_load.sort_by(|&a, &b| pred[b].total_cmp(&pred[a]).then(a.cmp(&b)));
        by_load.truncate(slots);
        let mut cands: Vec<(f64, f64, Move)> = Vec::new();
        let eval = |s: &mut Schedule, i: usize, job: Job| -> (f64, f64) {
            let before = (s.makespan(), s.total());
            let (old_cost, old_dev) = (s.costs[i], s.device[i]);
            s.recost(i, JobCost::of(nc, &job, self.cfg.cpu));
            s.place_best(i);
            let after = (s.makespan(), s.total());
            s.recost(i, old_cost);
            s.set(i, old_dev);
            (before.0 - after.0, before.1 - after.1)
        };
        for &e in &by_load {
            if resident[e] || busy_gpu[e] {
                continue;
            }
            let i = active.iter().position(|&x| x == e).unwrap_or(0);
            let (dm, dt) = eval(
                &mut s,
                i,
                Job {
                    resident: true,
                    ..act_jobs[i]
                },
            );
            cands.push((dm, dt, Move::Prefetch(e as u32)));
        }
        if units > 0 {
            let busiest = (0..units)
                .max_by(|&a, &b| s.dimm(a).total_cmp(&s.dimm(b)).then(b.cmp(&a)))
                .unwrap_or(0);
            let idlest = idlest_dimm(&s, units);
            for (i, &e) in active.iter().enumerate() {
                let to = match (layout[e], s.device[i]) {
                    // On the GPU or CPU but localized: stripe it.
                    (Layout::Localized(_), Device::Gpu | Device::Cpu) => Layout::Striped,
                    // Striped: localize on the idlest DIMM if the NDP would take it.
                    (Layout::Striped, _) => Layout::Localized(idlest),
                    // Rebalancing: from the busiest DIMM to the idlest.
                    (Layout::Localized(d), Device::Ndp(_)) if d == busiest && d != idlest => {
                        Layout::Localized(idlest)
                    }
                    _ => continue,
                };
                let (dm, dt) = eval(
                    &mut s,
                    i,
                    Job {
                        layout: to,
                        ..act_jobs[i]
                    },
                );
                cands.push((dm, dt, Move::Relayout(e as u32, to)));
            }
        }
        let worth = |dm: f64, dt: f64| dm > 1e-12 || (dm >= -1e-15 && dt > 1e-12);
        cands.retain(|c| worth(c.0, c.1));
        cands.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.total_cmp(&a.1)));
        // Execute in benefit order, each re-checked on the schedule the earlier ones
        // changed, while each resource's summed time fits the window.
        let (mut pcie_left, mut link_left) = (window, window);
        let mut out = Vec::new();
        for (dm, dt, mut mv) in cands {
            // A move onto a DIMM goes to the idlest one as the earlier moves left them.
            if let Move::Relayout(e, Layout::Localized(_)) = mv {
                let Some(i) = active.iter().position(|&x| x == e as usize) else {
                    continue;
                };
                let from = match layout[e as usize] {
                    Layout::Localized(d) => Some(d),
                    Layout::Striped => None,
                };
                let to = (0..units)
                    .filter(|&d| Some(d) != from)
                    .min_by(|&a, &b| s.dimm(a).total_cmp(&s.dimm(b)).then(a.cmp(&b)));
                match to {
                    Some(d) if s.device[i] != Device::Ndp(d) => {
                        mv = Move::Relayout(e, Layout::Localized(d));
                    }
                    _ => continue,
                }
            }
            let (e, job, t, left) = match mv {
                Move::Prefetch(e) => (
                    e,
                    Job {
                        resident: true,
                        ..jobs[e as usize]
                    },
                    nc.copy(layout[e as usize]),
                    &mut pcie_left,
                ),
                Move::Relayout(e, to) => (
                    e,
                    Job {
                        layout: to,
                        ..jobs[e as usize]
                    },
                    nc.link_move(),
                    &mut link_left,
                ),
            };
            if t > *left {
                continue;
            }
            let Some(i) = active.iter().position(|&x| x == e as usize) else {
                continue;
            };
            let before = (s.makespan(), s.total());
            let (old_cost, old_dev) = (s.costs[i], s.device[i]);
            s.recost(i, JobCost::of(nc, &job, self.cfg.cpu));
            s.place_best(i);
            if better((s.makespan(), s.total()), before) {
                *left -= t;
                out.push((mv, (dm, dt)));
            } else {
                s.recost(i, old_cost);
                s.set(i, old_dev);
            }
        }
        out
    }
}

fn better(after: (f64, f64), before: (f64, f64)) -> bool {
    let tol = 1e-12 * before.0.max(1e-30);
    after.0 < before.0 - tol || (after.0 <= before.0 + tol && after.1 < before.1 - tol)
}

fn idlest_dimm(s: &Schedule, units: u16) -> u16 {
    (0..units)
        .min_by(|&a, &b| s.dimm(a).total_cmp(&s.dimm(b)).then(a.cmp(&b)))
        .unwrap_or(0)
}

impl Policy for TriMoE {
    fn name(&self) -> String {
        match self.cfg {
            TriMoEConfig::FULL => "trimoe".into(),
            TriMoEConfig { cpu: false, .. } => "trimoe-gpu-ndp".into(),
            TriMoEConfig { refine: false, .. } => "trimoe-cpu-greedy".into(),
            TriMoEConfig { dynamic: false, .. } => "trimoe-refine".into(),
        }
    }

    fn initial_residency(&mut self, cost: &CostModel) -> Vec<(usize, u32)> {
        top_by_profile(&self.profile, cost.cache_slots_per_layer())
    }

    fn initial_layout(&mut self, cost: &CostModel) -> Option<Vec<(usize, u32, Layout)>> {
        let nc = NdpCosts::new(cost);
        let n = cost.model.n_experts;
        let resident = self.initial_residency(cost);
        let mut out = Vec::new();
        self.layout = (0..cost.model.moe_layers())
            .map(|l| {
                let mut r = vec![false; n];
                for &(rl, e) in &resident {
                    if rl == l {
                        r[e as usize] = true;
                    }
                }
                self.offline_layout(&nc, l, &r)
            })
            .collect();
        for (l, row) in self.layout.iter().enumerate() {
            for (e, &x) in row.iter().enumerate() {
                if x != Layout::Striped {
                    out.push((l, e as u32, x));
                }
            }
        }
        Some(out)
    }

    fn decide(&mut self, view: &LayerView, cost: &CostModel) -> Decision {
        let nc = NdpCosts::new(cost);
        let n = cost.model.n_experts;
        if self.layout.len() < view.n_moe_layers {
            self.layout
                .resize(view.n_moe_layers, vec![Layout::Striped; n]);
        }
        let rows = view.rows_per_expert(n);
        let active: Vec<usize> = (0..n).filter(|&e| !rows[e].is_empty()).collect();
        let jobs: Vec<Job> = active
            .iter()
            .map(|&e| Job {
                expert: e as u32,
                tokens: rows[e].len() as u32,
                resident: view.is_resident(e as u32),
                layout: self.layout[view.layer][e],
            })
            .collect();
        let s = self.schedule(&nc, &jobs);
        let mut d = Decision::default();
        let mut busy_gpu = vec![false; n];
        // GPU: hits first, then the misses heaviest first, streamed through the buffers.
        let mut gpu: Vec<usize> = (0..jobs.len())
            .filter(|&i| s.device[i] == Device::Gpu)
            .collect();
        gpu.sort_by_key(|&i| {
            (
                !jobs[i].resident,
                std::cmp::Reverse(jobs[i].tokens),
                jobs[i].expert,
            )
        });
        for &i in &gpu {
            let e = jobs[i].expert;
            busy_gpu[e as usize] = true;
            if !jobs[i].resident {
                d.transfers.push(Transfer {
                    layer: view.layer,
                    expert: e,
                    kind: TransferKind::Staged,
                    priority: d.transfers.len() as u32,
                });
            }
        }
        let order = gpu
            .iter()
            .copied()
            .chain((0..jobs.len()).filter(|&i| s.device[i] != Device::Gpu));
        for i in order {
            let e = jobs[i].expert;
            d.tasks.push(Task {
                expert: e,
                device: s.device[i],
                rows: rows[e as usize].clone(),
                deferred: false,
            });
        }
        if self.cfg.dynamic && view.phase == Phase::Decode {
            let loads: Vec<u32> = rows.iter().map(|r| r.len() as u32).collect();
            self.ema.update(view.layer, &loads);
            let resident: Vec<bool> = (0..n as u32).map(|e| view.is_resident(e)).collect();
            // The overlap window: this layer's GPU work, attention at the context the
            // caller states (zero when it states none).
            let window = cost.attention_time(view.tokens(), view.context.unwrap_or(0))
                + cost.shared_time(view.tokens())
                + s.gpu();
            let slots = cost.cache_slots_per_layer();
            let moves: Vec<Move> = self
                .plan(&nc, view.layer, &resident, &busy_gpu, window, slots)
                .into_iter()
                .map(|m| m.0)
                .collect();
            self.apply(view, cost, &moves, &resident, &busy_gpu, &mut d);
            d.predicted_load = Some(self.ema.predicted(view.layer).to_vec());
        }
        d
    }
}

impl TriMoE {
    /// Turns planned moves into copies, evictions and migrations, and records the new
    /// layouts.
    fn apply(
        &mut self,
        view: &LayerView,
        cost: &CostModel,
        moves: &[Move],
        resident: &[bool],
        busy_gpu: &[bool],
        d: &mut Decision,
    ) {
        let eb = cost.expert_bytes().max(1);
        let mut free = (view.gpu.free_bytes / eb) as usize;
        let pred = self.ema.predicted(view.layer);
        let prefetched: Vec<u32> = moves
            .iter()
            .filter_map(|m| match m {
                Move::Prefetch(e) => Some(*e),
                _ => None,
            })
            .collect();
        // Victims: resident, idle on the GPU this layer, not being prefetched; coldest first.
        let mut victims: Vec<u32> = (0..resident.len() as u32)
            .filter(|&e| resident[e as usize] && !busy_gpu[e as usize] && !prefetched.contains(&e))
            .collect();
        victims.sort_by(|&a, &b| {
            let (pa, pb) = (
                pred.get(a as usize).copied().unwrap_or(0.0),
                pred.get(b as usize).copied().unwrap_or(0.0),
            );
            pa.total_cmp(&pb).then(a.cmp(&b))
        });
        let mut victims = victims.into_iter();
        for &mv in moves {
            match mv {
                Move::Prefetch(e) => {
                    if free == 0 {
                        let Some(v) = victims.next() else { continue };
                        // Only a colder expert makes room.
                        if pred.get(v as usize) >= pred.get(e as usize) {
                            continue;
                        }
                        d.evictions.push(Eviction {
                            layer: view.layer,
                            expert: v,
                        });
                        free += 1;
                    }
                    free -= 1;
                    d.transfers.push(Transfer {
                        layer: view.layer,
                        expert: e,
                        kind: TransferKind::Prefetch,
                        priority: d.transfers.len() as u32,
                    });
                }
                Move::Relayout(e, to) => {
                    self.layout[view.layer][e as usize] = to;
                    d.migrations.push(Migration {
                        layer: view.layer,
                        expert: e,
                        to,
                    });
                }
            }
        }
    }
}

/// The `slots` most profiled experts of every layer, `(layer, expert)`.
pub fn top_by_profile(profile: &[Vec<f64>], slots: usize) -> Vec<(usize, u32)> {
    let mut out = Vec::new();
    for (l, p) in profile.iter().enumerate() {
        let mut ids: Vec<usize> = (0..p.len()).filter(|&e| p[e] > 0.0).collect();
        ids.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
        out.extend(ids.into_iter().take(slots).map(|e| (l, e as u32)));
    }
    out
}

#[cfg(test)]
mod tests;
