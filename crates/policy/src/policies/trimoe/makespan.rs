//! TriMoE's makespan scheduler (seed 000, eq. 5-7): one layer's experts as jobs with a time
//! on each path, assigned greedily (list scheduling) and refined at the bottleneck. Generic
//! over any set of jobs and devices' costs, so the offline layout, the per-step schedule and
//! the predicted schedule all run it.

use crate::layout::NdpCosts;
use crate::{Device, Layout};

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

    pub(super) fn account(&mut self, i: usize, sign: f64) {
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

    pub(super) fn push(&mut self, cost: JobCost, device: Device) {
        self.costs.push(cost);
        self.device.push(device);
        self.account(self.costs.len() - 1, 1.0);
    }

    pub(super) fn pop(&mut self) {
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
    pub(super) fn place_best(&mut self, i: usize) -> Device {
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
pub(super) const EPS: f64 = 1e-12;

pub(super) fn cheapest(c: &JobCost) -> Device {
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
