//! HybriMoE (DAC'25), as read from its released code (research/offload-systems.md).
//!
//! - Score cache: per (layer, expert) a score `S`; each step the experts the router picked
//!   get `S <- 0.5 s + 0.5 S` (`s` their mean routing weight over the step's tokens), the
//!   others `S <- 0.5 S`; a full layer evicts its lowest `S`.
//! - Scheduler: cached experts first, then uncached, each by descending token count; the
//!   GPU takes from the front, the CPU from the back, each expert going to whichever
//!   device would finish earlier (an uncached expert's GPU cost includes its copy).
//! - Prefetch: while layer `l` runs, the `prefetch` best-scored uncached experts of layer
//!   `l + 1` are copied (layer-wise prefetch).
//! - Prefill: the released scheduler computes on the CPU in decode only; in prefill every
//!   expert runs on the GPU, copied when not cached (research/offload-systems.md).
//! - Costs: either Strata's cost model, or the constants of the released code (GPU 0.5
//!   per expert, copy 0.418, CPU 0.79 + 1.0 per token, in its own units), which were set
//!   for small models and make copies look cheap next to a CPU expert.
//!
//! A key design decision: the released code scores the router's top `2k` from the full
//! softmax; the update uses them when the view carries them (`LayerView::candidates`: the
//! hybrid executor, traces of version 2) and the top `k` with their weights otherwise.
//! The policy mirrors the residency of layers other than the current one from its own
//! decisions (the executor applies every decision), so it can prefetch into them.

use crate::{
    CostModel, Decision, Device, Eviction, LayerView, Phase, Policy, Task, Transfer, TransferKind,
};

/// Which costs the scheduler compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HybriCosts {
    /// Strata's cost model for this hardware and model.
    Model,
    /// The constants of HybriMoE's released code.
    Released,
}

/// HybriMoE's score cache, earliest-finish scheduler and next-layer prefetch.
#[derive(Debug, Clone)]
pub struct HybriMoE {
    costs: HybriCosts,
    slots: usize,
    prefetch: usize,
    scores: Vec<Vec<f32>>,
    cached: Vec<Vec<bool>>,
}

impl HybriMoE {
    /// `slots` cached experts per layer, `prefetch` next-layer copies per step.
    pub fn new(slots: usize, prefetch: usize) -> Self {
        Self::with_costs(HybriCosts::Model, slots, prefetch)
    }

    /// As [`HybriMoE::new`], comparing the given costs.
    pub fn with_costs(costs: HybriCosts, slots: usize, prefetch: usize) -> Self {
        Self {
            costs,
            slots,
            prefetch,
            scores: Vec::new(),
            cached: Vec::new(),
        }
    }

    /// The current score of `(layer, expert)`.
    pub fn score(&self, layer: usize, expert: u32) -> f32 {
        self.scores
            .get(layer)
            .and_then(|s| s.get(expert as usize))
            .copied()
            .unwrap_or(0.0)
    }

    /// Updates layer `view.layer`'s scores: the router's top 2k with their scores when
    /// the view has them, else the chosen experts with their weights; the step's mean
    /// per expert is folded in with weight 1/2.
    fn update_scores(&mut self, view: &LayerView, n: usize) {
        let l = view.layer;
        let mut ssum = vec![0.0f32; n];
        let mut seen = vec![0usize; n];
        let (ids, scores) = match view.candidates {
            Some(c) => (c.ids, c.scores),
            None => (view.ids, view.weights),
        };
        for (&e, &w) in ids.iter().zip(scores) {
            if let (Some(s), Some(c)) = (ssum.get_mut(e as usize), seen.get_mut(e as usize)) {
                *s += w;
                *c += 1;
            }
        }
        for e in 0..n {
            let s = &mut self.scores[l][e];
            *s = if seen[e] == 0 {
                0.5 * *s
            } else {
                0.5 * (ssum[e] / seen[e] as f32) + 0.5 * *s
            };
        }
    }

    /// Prefetches the best-scored experts of layer `nl` that are not cached, evicting
    /// lower-scored ones when its slots are full.
    fn prefetch_next(&mut self, nl: usize, n: usize, d: &mut Decision) {
        let mut cand: Vec<u32> = (0..n as u32)
            .filter(|&e| !self.cached[nl][e as usize] && self.scores[nl][e as usize] > 0.0)
            .collect();
        cand.sort_by(|&a, &b| {
            self.scores[nl][b as usize]
                .total_cmp(&self.scores[nl][a as usize])
                .then(a.cmp(&b))
        });
        for e in cand.into_iter().take(self.prefetch) {
            let count = self.cached[nl].iter().filter(|&&c| c).count();
            if count >= self.slots {
                let Some(v) = self.lowest_scored(nl, |_| false) else {
                    break;
                };
                if self.scores[nl][v as usize] >= self.scores[nl][e as usize] {
                    break;
                }
                self.cached[nl][v as usize] = false;
                d.evictions.push(Eviction {
                    layer: nl,
                    expert: v,
                });
            }
            self.cached[nl][e as usize] = true;
            d.transfers.push(Transfer {
                layer: nl,
                expert: e,
                kind: TransferKind::Prefetch,
                priority: d.transfers.len() as u32,
            });
        }
    }

    fn gpu_cost(&self, cost: &CostModel, tokens: usize, cached: bool) -> f64 {
        match self.costs {
            HybriCosts::Model => {
                cost.expert_time(Device::Gpu, tokens as u32)
                    + if cached {
                        0.0
                    } else {
                        cost.expert_transfer_time()
                    }
            }
            HybriCosts::Released => 0.5 + if cached { 0.0 } else { 0.418 },
        }
    }

    fn cpu_cost(&self, cost: &CostModel, tokens: usize) -> f64 {
        match self.costs {
            HybriCosts::Model => cost.expert_time(Device::Cpu, tokens as u32),
            HybriCosts::Released => 0.79 + tokens as f64,
        }
    }

    fn lowest_scored(&self, layer: usize, keep: impl Fn(u32) -> bool) -> Option<u32> {
        let s = &self.scores[layer];
        (0..s.len() as u32)
            .filter(|&e| self.cached[layer][e as usize] && !keep(e))
            .min_by(|&a, &b| s[a as usize].total_cmp(&s[b as usize]).then(a.cmp(&b)))
    }
}

impl Policy for HybriMoE {
    fn name(&self) -> String {
        match self.costs {
            HybriCosts::Model => "hybrimoe".into(),
            HybriCosts::Released => "hybrimoe-released".into(),
        }
    }

    fn reads_candidates(&self) -> bool {
        true
    }

    fn decide(&mut self, view: &LayerView, cost: &CostModel) -> Decision {
        let n = cost.model.n_experts;
        let l = view.layer;
        if self.scores.len() < view.n_moe_layers {
            self.scores = vec![vec![0.0; n]; view.n_moe_layers];
            self.cached = vec![vec![false; n]; view.n_moe_layers];
        }
        for e in 0..n {
            self.cached[l][e] = view.is_resident(e as u32);
        }
        let rows = view.rows_per_expert(n);
        self.update_scores(view, n);
        // Earliest-finish two-ended assignment.
        let mut order: Vec<u32> = (0..n as u32)
            .filter(|&e| !rows[e as usize].is_empty())
            .collect();
        order.sort_by_key(|&e| {
            (
                !self.cached[l][e as usize],
                std::cmp::Reverse(rows[e as usize].len()),
                e,
            )
        });
        let (mut gpu_t, mut cpu_t) = (0.0, 0.0);
        let (mut i, mut j) = (0usize, order.len());
        let mut on_gpu = Vec::new();
        // Prefill: no CPU experts in the released code; everything on the GPU.
        if view.phase == Phase::Prefill {
            on_gpu.extend_from_slice(&order);
            i = j;
        }
        while i < j {
            let front = order[i];
            let back = order[j - 1];
            let g = self.gpu_cost(
                cost,
                rows[front as usize].len(),
                self.cached[l][front as usize],
            );
            let c = self.cpu_cost(cost, rows[back as usize].len());
            if gpu_t + g <= cpu_t + c {
                gpu_t += g;
                on_gpu.push(front);
                i += 1;
            } else {
                cpu_t += c;
                j -= 1;
            }
        }
        let mut d = Decision::default();
        let needed = |e: u32| !rows[e as usize].is_empty();
        for &e in &on_gpu {
            if self.cached[l][e as usize] {
                continue;
            }
            let count = self.cached[l].iter().filter(|&&c| c).count();
            let kind = if count < self.slots {
                TransferKind::OnDemand
            } else if let Some(v) = self.lowest_scored(l, needed) {
                self.cached[l][v as usize] = false;
                d.evictions.push(Eviction {
                    layer: l,
                    expert: v,
                });
                TransferKind::OnDemand
            } else {
                TransferKind::Staged
            };
            if kind == TransferKind::OnDemand {
                self.cached[l][e as usize] = true;
            }
            d.transfers.push(Transfer {
                layer: l,
                expert: e,
                kind,
                priority: d.transfers.len() as u32,
            });
        }
        if l + 1 < view.n_moe_layers && self.slots > 0 {
            self.prefetch_next(l + 1, n, &mut d);
        }
        let gpu_rank = |e: u32| on_gpu.iter().position(|&g| g == e);
        let mut tasks: Vec<Task> = rows
            .into_iter()
            .enumerate()
            .filter(|(_, r)| !r.is_empty())
            .map(|(e, r)| Task {
                expert: e as u32,
                device: if gpu_rank(e as u32).is_some() {
                    Device::Gpu
                } else {
                    Device::Cpu
                },
                rows: r,
                deferred: false,
            })
            .collect();
        tasks.sort_by_key(|t| gpu_rank(t.expert).unwrap_or(usize::MAX));
        d.tasks = tasks;
        d
    }
}
