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

/// One expert of a layer as the scheduler sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Job {
    /// Expert id.
    pub expert: u32,
    /// Tokens routed to it.
    pub tokens: u32,
    /// Its weights are on the GPU.
    pub resident: bool,
    /// Where its weights lie in host memory.
    pub layout: Layout,
}

/// A job's time on each path (eq. 1-4) and the DIMM time a host read of it costs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JobCost {
    /// On the GPU: eq. 1 if resident, else eq. 2.
    pub gpu: f64,
    /// Whether running it on the GPU reads host memory (a miss).
    pub gpu_reads: bool,
    /// On the CPU (eq. 3); infinite when the CPU takes no experts.
    pub cpu: f64,
    /// On the NDP unit of its DIMM (eq. 4), if localized on a DIMM with a unit.
    pub ndp: Option<(u16, f64)>,
    /// DIMM time of a host read: `None` for every DIMM (striped), or one DIMM.
    pub read: (Option<u16>, f64),
}

impl JobCost {
    /// The costs of `job` on the machine of `nc`; `cpu` false takes the CPU path away.
    pub fn of(nc: &NdpCosts, job: &Job, cpu: bool) -> Self {
        let units = nc.units();
        Self {
            gpu: if job.resident {
                nc.gpu_hit(job.tokens)
            } else {
                nc.gpu_miss(job.tokens, job.layout)
            },
            gpu_reads: !job.resident,
            cpu: if cpu {
                nc.cpu(job.tokens, job.layout)
            } else {
                f64::INFINITY
            },
            ndp: match job.layout {
                Layout::Localized(d) if d < units => Some((d, nc.ndp(job.tokens))),
                _ => None,
            },
            read: nc.contention(job.layout),
        }
    }

    /// Time on `device` (infinite where it cannot run).
    pub fn on(&self, device: Device) -> f64 {
        match device {
            Device::Gpu => self.gpu,
            Device::Cpu => self.cpu,
            Device::Ndp(d) => match self.ndp {
                Some((u, t)) if u == d => t,
                _ => f64::INFINITY,
            },
        }
    }

    /// The devices it can run on: GPU, CPU (if enabled), its NDP unit (if any).
    pub fn options(&self) -> impl Iterator<Item = Device> + '_ {
        [Device::Gpu, Device::Cpu]
            .into_iter()
            .chain(self.ndp.map(|(d, _)| Device::Ndp(d)))
            .filter(|&d| self.on(d).is_finite())
    }
}

/// An assignment of a layer's jobs to devices with the domain totals of eq. 5-6.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// The jobs' costs.
    pub costs: Vec<JobCost>,
    /// Where each job runs.
    pub device: Vec<Device>,
    gpu: f64,
    cpu: f64,
    /// Per NDP DIMM: its experts and the localized host reads it serves.
    dimm: Vec<f64>,
    /// Striped host reads, which occupy every DIMM.
    striped: f64,
}

impl Schedule {
    /// Every job on `device[i]` (each must be one of its options).
    pub fn new(costs: Vec<JobCost>, device: Vec<Device>, units: u16) -> Self {
        let mut s = Self {
            device: vec![Device::Gpu; costs.len()],
            costs,
            gpu: 0.0,
            cpu: 0.0,
            dimm: vec![0.0; units as usize],
            striped: 0.0,
        };
        for (i, d) in device.into_iter().enumerate() {
            s.device[i] = d;
            s.account(i, 1.0);
        }
        s
    }

    fn account(&mut self, i: usize, sign: f64) {
        let c = self.costs[i];
        let dev = self.device[i];
        let reads = match dev {
            Device::Gpu => {
                self.gpu += sign * c.gpu;
                c.gpu_reads
            }
            Device::Cpu => {
                self.cpu += sign * c.cpu;
                true
            }
            Device::Ndp(d) => {
                if let Some(x) = self.dimm.get_mut(d as usize) {
                    *x += sign * c.on(dev);
                }
                false
            }
        };
        if reads {
            match c.read.0 {
                None => self.striped += sign * c.read.1,
                Some(d) => {
                    if let Some(x) = self.dimm.get_mut(d as usize) {
                        *x += sign * c.read.1;
                    }
                }
            }
        }
    }

    fn push(&mut self, cost: JobCost, device: Device) {
        self.costs.push(cost);
        self.device.push(device);
        self.account(self.costs.len() - 1, 1.0);
    }

    fn pop(&mut self) {
        if !self.costs.is_empty() {
            self.account(self.costs.len() - 1, -1.0);
            self.costs.pop();
            self.device.pop();
        }
    }

    /// Moves job `i` to `device`.
    pub fn set(&mut self, i: usize, device: Device) {
        self.account(i, -1.0);
        self.device[i] = device;
        self.account(i, 1.0);
    }

    /// Replaces job `i`'s costs (after a layout or residency change), keeping its device
    /// if still possible, else its cheapest option.
    pub fn recost(&mut self, i: usize, cost: JobCost) {
        self.account(i, -1.0);
        self.costs[i] = cost;
        if !cost.on(self.device[i]).is_finite() {
            self.device[i] = cheapest(&cost);
        }
        self.account(i, 1.0);
    }

    /// GPU total (eq. 5).
    pub fn gpu(&self) -> f64 {
        self.gpu
    }

    /// CPU total (eq. 5).
    pub fn cpu(&self) -> f64 {
        self.cpu
    }

    /// DIMM `d`'s total (eq. 6).
    pub fn dimm(&self, d: u16) -> f64 {
        self.dimm.get(d as usize).map_or(0.0, |x| x + self.striped)
    }

    /// The global makespan (eq. 7).
    pub fn makespan(&self) -> f64 {
        self.domains().map(|(_, t)| t).fold(0.0, f64::max)
    }

    /// Every domain with its total, GPU, CPU, then the DIMMs in order.
    pub fn domains(&self) -> impl Iterator<Item = (Device, f64)> + '_ {
        [(Device::Gpu, self.gpu), (Device::Cpu, self.cpu)]
            .into_iter()
            .chain((0..self.dimm.len()).map(|d| (Device::Ndp(d as u16), self.dimm(d as u16))))
    }

    /// Sum of the domains' totals (the tie-breaker of migration benefits).
    pub fn total(&self) -> f64 {
        self.domains().map(|(_, t)| t).sum()
    }

    /// The device finishing last (first of equals in [`Schedule::domains`] order).
    pub fn bottleneck(&self) -> Device {
        let mut best = (Device::Gpu, f64::NEG_INFINITY);
        for (d, t) in self.domains() {
            if t > best.1 {
                best = (d, t);
            }
        }
        best.0
    }

    /// Places job `i` where the makespan is smallest (ties: smallest cost), returns it.
    fn place_best(&mut self, i: usize) -> Device {
        let mut best: Option<(f64, f64, Device)> = None;
        let opts: Vec<Device> = self.costs[i].options().collect();
        for d in opts {
            self.set(i, d);
            let key = (self.makespan(), self.costs[i].on(d));
            if best.is_none_or(|b| key.0 < b.0 - EPS || (key.0 <= b.0 + EPS && key.1 < b.1)) {
                best = Some((key.0, key.1, d));
            }
        }
        let d = best.map_or(Device::Gpu, |b| b.2);
        self.set(i, d);
        d
    }
}

/// Relative tolerance of makespan comparisons (the sums are of many small floats).
const EPS: f64 = 1e-12;

fn cheapest(c: &JobCost) -> Device {
    c.options()
        .min_by(|&a, &b| c.on(a).total_cmp(&c.on(b)))
        .unwrap_or(Device::Gpu)
}

/// The greedy initial assignment (list scheduling): jobs in decreasing order of their
/// cheapest path's time, each placed where the makespan so far grows least (ties: its
/// own smaller time, then GPU, CPU, NDP order).
pub fn greedy(costs: Vec<JobCost>, units: u16) -> Schedule {
    let mut order: Vec<usize> = (0..costs.len()).collect();
    let key = |i: usize| costs[i].on(cheapest(&costs[i]));
    order.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
    let mut partial = Schedule::new(Vec::new(), Vec::new(), units);
    let mut device = vec![Device::Gpu; costs.len()];
    for i in order {
        let c = costs[i];
        let mut best: Option<(f64, f64, Device)> = None;
        for d in c.options() {
            partial.push(c, d);
            let k = (partial.makespan(), c.on(d));
            partial.pop();
            if best.is_none_or(|b| k.0 < b.0 - EPS * b.0 || (k.0 <= b.0 + EPS * b.0 && k.1 < b.1)) {
                best = Some((k.0, k.1, d));
            }
        }
        let d = best.map_or(Device::Gpu, |b| b.2);
        partial.push(c, d);
        device[i] = d;
    }
    Schedule::new(costs, device, units)
}

/// Bottleneck-aware refinement; returns the moves made.
pub fn refine(s: &mut Schedule, max_iter: usize) -> usize {
    let mut moves = 0;
    while moves < max_iter {
        let current = s.makespan();
        let tol = EPS * current.max(1e-30);
        let b = s.bottleneck();
        let mut on_b: Vec<usize> = (0..s.device.len()).filter(|&i| s.device[i] == b).collect();
        on_b.sort_by(|&x, &y| {
            s.costs[y]
                .on(b)
                .total_cmp(&s.costs[x].on(b))
                .then(x.cmp(&y))
        });
        let mut improved = false;
        for i in on_b {
            let mut best: Option<(f64, f64, Device)> = None;
            let targets: Vec<Device> = s.costs[i].options().filter(|&d| d != b).collect();
            for t in targets {
                s.set(i, t);
                let key = (s.makespan(), s.costs[i].on(t));
                if best.is_none_or(|x| key.0 < x.0 - tol || (key.0 <= x.0 + tol && key.1 < x.1)) {
                    best = Some((key.0, key.1, t));
                }
            }
            match best {
                Some((ms, _, t)) if ms < current - tol => {
                    s.set(i, t);
                    improved = true;
                    break;
                }
                _ => s.set(i, b),
            }
        }
        if !improved {
            break;
        }
        moves += 1;
    }
    moves
}

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
mod tests {
    use super::*;
    use crate::{Hardware, ModelShape};

    fn job(gpu: f64, cpu: f64, ndp: Option<(u16, f64)>, read: (Option<u16>, f64)) -> JobCost {
        JobCost {
            gpu,
            gpu_reads: read.1 > 0.0,
            cpu,
            ndp,
            read,
        }
    }

    /// The smallest makespan over every assignment.
    fn brute(costs: &[JobCost], units: u16) -> f64 {
        let opts: Vec<Vec<Device>> = costs.iter().map(|c| c.options().collect()).collect();
        let mut idx = vec![0usize; costs.len()];
        let mut best = f64::INFINITY;
        loop {
            let dev = idx.iter().zip(&opts).map(|(&i, o)| o[i]).collect();
            best = best.min(Schedule::new(costs.to_vec(), dev, units).makespan());
            let mut k = 0;
            while k < idx.len() {
                idx[k] += 1;
                if idx[k] < opts[k].len() {
                    break;
                }
                idx[k] = 0;
                k += 1;
            }
            if k == idx.len() {
                return best;
            }
        }
    }

    fn solve(costs: &[JobCost], units: u16) -> (f64, f64) {
        let mut s = greedy(costs.to_vec(), units);
        let g = s.makespan();
        refine(&mut s, 100);
        (g, s.makespan())
    }

    #[test]
    fn greedy_and_refinement_reach_the_optimum_on_hand_made_layers() {
        let none = (None, 0.0);
        let cases: Vec<(&str, Vec<JobCost>, u16)> = vec![
            (
                "warm experts fill the cpu, cold ones the dimms",
                vec![
                    job(9.0, 2.0, None, (None, 0.5)),
                    job(9.0, 2.0, None, (None, 0.5)),
                    job(9.0, 6.0, Some((0, 3.0)), (Some(0), 2.0)),
                    job(9.0, 6.0, Some((1, 3.0)), (Some(1), 2.0)),
                    job(1.0, 4.0, None, none),
                ],
                2,
            ),
            (
                "a striped read on the cpu loads every dimm",
                vec![
                    job(6.0, 3.0, None, (None, 2.0)),
                    job(6.0, 3.0, None, (None, 2.0)),
                    job(5.0, 8.0, Some((0, 2.0)), (Some(0), 4.0)),
                    job(2.0, 8.0, Some((1, 1.0)), (Some(1), 4.0)),
                ],
                2,
            ),
            (
                "the list schedule is off by one expert; refinement moves it",
                vec![
                    job(0.75, 5.02, None, (None, 0.01)),
                    job(2.93, 1.57, None, (None, 0.09)),
                    job(1.32, 0.78, Some((0, 3.87)), (Some(0), 0.58)),
                    job(4.76, 0.56, None, (None, 0.10)),
                    job(5.10, 4.29, None, (None, 0.22)),
                    job(2.91, 1.54, Some((1, 1.90)), (Some(1), 0.03)),
                ],
                2,
            ),
            (
                "no cpu: gpu misses against one ndp unit",
                vec![
                    job(3.0, f64::INFINITY, Some((0, 4.0)), (Some(0), 1.0)),
                    job(3.0, f64::INFINITY, Some((0, 1.0)), (Some(0), 1.0)),
                    job(1.0, f64::INFINITY, Some((0, 2.0)), (Some(0), 0.5)),
                    job(2.0, f64::INFINITY, None, none),
                ],
                1,
            ),
        ];
        let mut fixed = 0;
        for (what, costs, units) in cases {
            let (g, r) = solve(&costs, units);
            let opt = brute(&costs, units);
            if g > opt + 1e-9 {
                fixed += 1;
            }
            assert!(r <= g + 1e-12, "{what}: refinement made it worse");
            assert!((r - opt).abs() < 1e-9, "{what}: {r} vs optimum {opt}");
        }
        assert_eq!(fixed, 1, "one case needs the refinement");
    }

    #[test]
    fn refinement_never_hurts_and_often_finds_the_optimum() {
        // Seeded LCG: random 6-expert layers on 2 DIMMs.
        let mut x: u64 = 12345;
        let mut rnd = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) as f64) / (1u64 << 31) as f64
        };
        let (mut optimal, mut fixed, trials) = (0, 0, 300);
        for _ in 0..trials {
            let costs: Vec<JobCost> = (0..6)
                .map(|_| {
                    let ndp = (rnd() < 0.5).then(|| ((rnd() * 2.0) as u16, 0.5 + 4.0 * rnd()));
                    let read = match ndp {
                        Some((d, _)) => (Some(d), 2.0 * rnd()),
                        None => (None, 0.3 * rnd()),
                    };
                    job(0.5 + 5.0 * rnd(), 0.5 + 5.0 * rnd(), ndp, read)
                })
                .collect();
            let (g, r) = solve(&costs, 2);
            let opt = brute(&costs, 2);
            assert!(r <= g + 1e-12 && r >= opt - 1e-9);
            if (r - opt).abs() < 1e-9 {
                optimal += 1;
                if g > opt + 1e-9 {
                    fixed += 1;
                }
            }
        }
        // 168 of 300 optimal, 37 of them thanks to the refinement, when written.
        assert!(fixed > 0);
        assert!(optimal * 2 >= trials, "{optimal}/{trials}");
    }

    fn cost() -> CostModel {
        let mut m = ModelShape::load("qwen3-30b-a3b").unwrap();
        m.n_experts = 8;
        m.n_layers = 1;
        CostModel::new(Hardware::load("trimoe-h100").unwrap(), m, 16.0, 16.0).unwrap()
    }

    fn policy(c: &CostModel, layout: Vec<Layout>, predicted: Vec<f64>) -> TriMoE {
        let mut p = TriMoE::new(TriMoEConfig::FULL, vec![predicted]);
        assert_eq!(layout.len(), c.model.n_experts);
        p.layout = vec![layout];
        p
    }

    #[test]
    fn rebalancing_moves_cold_experts_from_the_busiest_dimm() {
        let c = cost();
        let nc = NdpCosts::new(&c);
        // Four cold experts all on DIMM 0, three tokens each; the rest idle.
        let mut layout = vec![Layout::Striped; 8];
        for x in layout.iter_mut().take(4) {
            *x = Layout::Localized(0);
        }
        let p = policy(&c, layout, vec![3.0, 3.0, 3.0, 3.0, 0.0, 0.0, 0.0, 0.0]);
        let none = vec![false; 8];
        let moves = p.plan(&nc, 0, &none, &none, 1.0, 0);
        assert!(!moves.is_empty());
        let mut targets = Vec::new();
        for (m, _) in &moves {
            match *m {
                Move::Relayout(e, Layout::Localized(d)) => {
                    assert!(e < 4 && d != 0, "{m:?}");
                    targets.push(d);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        // Each move goes to the idlest DIMM of its time: never twice to the same one
        // while others are empty, and DIMM 0 keeps at least one expert.
        let mut t = targets.clone();
        t.sort_unstable();
        t.dedup();
        assert_eq!(t.len(), targets.len(), "{targets:?}");
        assert!(moves.len() < 4);
        // No window, no moves.
        assert!(p.plan(&nc, 0, &none, &none, 0.0, 0).is_empty());
    }

    #[test]
    fn the_window_grows_with_the_attention_context() {
        let c = cost();
        // Every expert localized on DIMM 0: striping or spreading them all would help, and
        // the overlap window decides how many moves run.
        let moves = |context: Option<usize>| {
            let mut p = policy(&c, vec![Layout::Localized(0); 8], vec![64.0; 8]);
            let tokens = 64;
            let ids: Vec<u32> = (0..tokens).flat_map(|_| 0..8u32).collect();
            let weights = vec![0.125f32; ids.len()];
            let resident = vec![false; 8];
            let view = LayerView {
                layer: 0,
                n_moe_layers: 1,
                phase: Phase::Decode,
                step: 1,
                top_k: 8,
                ids: &ids,
                weights: &weights,
                hidden: None,
                candidates: None,
                gpu: crate::GpuView {
                    resident: &resident,
                    free_bytes: 0,
                    busy_s: 0.0,
                },
                cpu_busy_s: 0.0,
                pcie_busy_s: 0.0,
                context,
            };
            let d = p.decide(&view, &c);
            assert!(d.predicted_load.is_some());
            d.migrations.len()
        };
        let (none, long) = (moves(None), moves(Some(1 << 20)));
        assert!(
            long > none,
            "{none} moves at no context, {long} at 1M tokens"
        );
    }

    #[test]
    fn relayouts_run_in_order_of_benefit_within_the_window() {
        let c = cost();
        let nc = NdpCosts::new(&c);
        // Experts 0 and 1 are warm but localized, so the host reads them at one DIMM's
        // share (eq. 2-3): striping them is the largest gain. Expert 2 (cold, striped) could
        // go to an NDP unit; experts 3 and 4 crowd DIMM 3.
        let mut layout = vec![Layout::Striped; 8];
        layout[0] = Layout::Localized(1);
        layout[1] = Layout::Localized(2);
        layout[3] = Layout::Localized(3);
        layout[4] = Layout::Localized(3);
        let pred = vec![60.0, 20.0, 1.0, 2.0, 2.0, 0.0, 0.0, 0.0];
        let p = policy(&c, layout, pred);
        let none = vec![false; 8];
        let all = p.plan(&nc, 0, &none, &none, 10.0, 0);
        assert!(all.len() >= 2, "{all:?}");
        assert!(
            matches!(all[0].0, Move::Relayout(0 | 1, Layout::Striped)),
            "{all:?}"
        );
        // Ranked by benefit: makespan reduction first, then summed device time.
        for w in all.windows(2) {
            let (a, b) = (w[0].1, w[1].1);
            assert!(a.0 > b.0 || (a.0 == b.0 && a.1 >= b.1), "{all:?}");
        }
        // A window of one move takes the most beneficial one.
        let one = p.plan(&nc, 0, &none, &none, nc.link_move() * 1.5, 0);
        assert_eq!(one.len(), 1, "{one:?}");
        assert_eq!(one[0].0, all[0].0);
    }
}
