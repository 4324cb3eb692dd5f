//! SMoE (seed 004): hybrid CPU/GPU execution with dynamic expert caching.
//!
//! - Prefill (Algorithm 1): an expert not on the GPU is streamed there through the two
//!   ping-pong buffers when `T_cpu(e) > T_gpu(e) + T_pcie`, heaviest first; the rest run
//!   on the CPU. At the end of each layer's prefill, the layer's cache slots are filled
//!   with its most frequently activated experts (section IV-E).
//! - Decode: cached experts run on the GPU, misses on the CPU. A per-layer linear predictor
//!   maps the hidden state at token `t` to the experts of token `t + 1` (token-wise
//!   prefetch); copies replace least-frequently-used cached experts: *fixed-N* always
//!   brings the `N` best-predicted uncached experts, *adaptive* only the uncached ones among
//!   the top `N` predicted.
//! - SMoE-Flex: layers whose predictor is `None` do not prefetch (the caller disables the
//!   half with the lowest prediction accuracy).
//!
//! A key design decision: LFU counts every activation seen, prefill and decode, per layer,
//! as the paper's cache statistics do; ties go to the lower expert id so eviction is exact.

use crate::predictor::LinearPredictor;
use crate::{
    CostModel, Decision, Device, Eviction as Evict, LayerView, Phase, Policy, Transfer,
    TransferKind, tasks_by_expert,
};

/// SMoE's cache replacement rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eviction {
    /// Always replace `N` experts (the `N` best-predicted uncached ones).
    FixedN,
    /// Replace only the uncached experts among the top `N` predicted.
    Adaptive,
}

/// SMoE with `slots` cached experts per layer and `prefetch` = `N`.
#[derive(Debug, Clone)]
pub struct Smoe {
    slots: usize,
    prefetch: usize,
    eviction: Eviction,
    predictors: Vec<Option<LinearPredictor>>,
    name: String,
    freq: Vec<Vec<u64>>,
}

impl Smoe {
    /// A policy; `predictors[layer]` is `None` where prefetch is disabled.
    pub fn new(
        slots: usize,
        prefetch: usize,
        eviction: Eviction,
        predictors: Vec<Option<LinearPredictor>>,
    ) -> Self {
        Self {
            slots,
            prefetch,
            eviction,
            predictors,
            name: "smoe".into(),
            freq: Vec::new(),
        }
    }

    /// SMoE-Flex: keeps the predictors of the better half of layers by `accuracy`.
    pub fn flex(
        slots: usize,
        prefetch: usize,
        eviction: Eviction,
        predictors: Vec<Option<LinearPredictor>>,
        accuracy: &[f64],
    ) -> Self {
        let mut order: Vec<usize> = (0..predictors.len()).collect();
        order.sort_by(|&a, &b| {
            let (x, y) = (accuracy.get(a).copied(), accuracy.get(b).copied());
            y.unwrap_or(0.0)
                .total_cmp(&x.unwrap_or(0.0))
                .then(a.cmp(&b))
        });
        let keep = predictors.len().div_ceil(2);
        let mut predictors = predictors;
        for &l in &order[keep..] {
            predictors[l] = None;
        }
        Self {
            name: "smoe-flex".into(),
            ..Self::new(slots, prefetch, eviction, predictors)
        }
    }

    /// Activation count of `(layer, expert)` so far.
    pub fn frequency(&self, layer: usize, expert: u32) -> u64 {
        self.freq
            .get(layer)
            .and_then(|f| f.get(expert as usize))
            .copied()
            .unwrap_or(0)
    }

    fn lfu_victims(&self, layer: usize, resident: &[bool], protect: &[u32]) -> Vec<u32> {
        let f = &self.freq[layer];
        let mut v: Vec<u32> = (0..resident.len() as u32)
            .filter(|&e| resident[e as usize] && !protect.contains(&e))
            .collect();
        v.sort_by_key(|&e| (f[e as usize], e));
        v
    }

    fn prefill(&mut self, view: &LayerView, cost: &CostModel, d: &mut Decision) {
        let n = cost.model.n_experts;
        let l = view.layer;
        let t_pcie = cost.expert_transfer_time();
        let mut g = Vec::new();
        let mut tasks = tasks_by_expert(view, n, |e, tokens| {
            let t = tokens as u32;
            if view.is_resident(e) {
                Device::Gpu
            } else if cost.expert_time(Device::Cpu, t) > cost.expert_time(Device::Gpu, t) + t_pcie {
                g.push((tokens, e));
                Device::Gpu
            } else {
                Device::Cpu
            }
        });
        g.sort_by_key(|&(tokens, e)| (std::cmp::Reverse(tokens), e));
        let rank = |e: u32| g.iter().position(|&(_, x)| x == e).map_or(0, |p| p + 1);
        tasks.sort_by_key(|t| rank(t.expert));
        d.tasks = tasks;
        for (i, &(_, e)) in g.iter().enumerate() {
            d.transfers.push(Transfer {
                layer: l,
                expert: e,
                kind: TransferKind::Staged,
                priority: i as u32,
            });
        }
        // Initial cache: the layer's most frequent experts so far.
        let f = &self.freq[l];
        let mut best: Vec<u32> = (0..n as u32).filter(|&e| f[e as usize] > 0).collect();
        best.sort_by_key(|&e| (std::cmp::Reverse(f[e as usize]), e));
        best.truncate(self.slots);
        // Victims: cached experts outside the best set that this layer does not run on the
        // GPU right now (evictions happen before the layer's GPU work).
        let on_gpu: Vec<u32> = d
            .tasks
            .iter()
            .filter(|t| t.device == Device::Gpu)
            .map(|t| t.expert)
            .collect();
        let mut resident: Vec<bool> = (0..n as u32).map(|e| view.is_resident(e)).collect();
        let mut victims: Vec<u32> = (0..n as u32)
            .filter(|e| resident[*e as usize] && !best.contains(e) && !on_gpu.contains(e))
            .collect();
        victims.reverse();
        for e in best {
            if !resident[e as usize] {
                if resident.iter().filter(|&&r| r).count() >= self.slots {
                    let Some(v) = victims.pop() else { break };
                    resident[v as usize] = false;
                    d.evictions.push(Evict {
                        layer: l,
                        expert: v,
                    });
                }
                resident[e as usize] = true;
                d.transfers.push(Transfer {
                    layer: l,
                    expert: e,
                    kind: TransferKind::Prefetch,
                    priority: d.transfers.len() as u32,
                });
            }
        }
    }

    fn decode(&mut self, view: &LayerView, cost: &CostModel, d: &mut Decision) {
        let n = cost.model.n_experts;
        let l = view.layer;
        let mut tasks = tasks_by_expert(view, n, |e, _| {
            if view.is_resident(e) {
                Device::Gpu
            } else {
                Device::Cpu
            }
        });
        tasks.sort_by_key(|t| t.device != Device::Gpu);
        d.tasks = tasks;
        let Some(Some(p)) = self.predictors.get(l) else {
            return;
        };
        let (Some(hidden), tokens) = (view.hidden, view.tokens()) else {
            return;
        };
        if tokens == 0 || hidden.len() != tokens * p.dim() {
            return;
        }
        // Mean hidden state of the step's rows (one row at batch 1).
        let dim = p.dim();
        let mut h = vec![0.0f32; dim];
        for row in hidden.chunks_exact(dim) {
            for (a, b) in h.iter_mut().zip(row) {
                *a += b / tokens as f32;
            }
        }
        let ranking = p.top(&h, n);
        d.predicted = Some(ranking[..view.top_k.min(n)].to_vec());
        if self.slots == 0 || self.prefetch == 0 {
            return;
        }
        let mut resident: Vec<bool> = (0..n as u32).map(|e| view.is_resident(e)).collect();
        let window = match self.eviction {
            Eviction::FixedN => &ranking[..],
            Eviction::Adaptive => &ranking[..self.prefetch.min(n)],
        };
        let incoming: Vec<u32> = window
            .iter()
            .copied()
            .filter(|&e| !resident[e as usize])
            .take(self.prefetch)
            .collect();
        // Never evict what this step runs on the GPU, nor the best predictions.
        let mut protect: Vec<u32> = ranking[..view.top_k.max(self.prefetch).min(n)].to_vec();
        protect.extend(view.ids.iter().copied());
        let mut victims = self.lfu_victims(l, &resident, &protect).into_iter();
        for e in incoming {
            let count = resident.iter().filter(|&&r| r).count();
            if count >= self.slots {
                let Some(v) = victims.next() else { break };
                resident[v as usize] = false;
                d.evictions.push(Evict {
                    layer: l,
                    expert: v,
                });
            }
            resident[e as usize] = true;
            d.transfers.push(Transfer {
                layer: l,
                expert: e,
                kind: TransferKind::Prefetch,
                priority: d.transfers.len() as u32,
            });
        }
    }
}

impl Policy for Smoe {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn decide(&mut self, view: &LayerView, cost: &CostModel) -> Decision {
        let n = cost.model.n_experts;
        if self.freq.len() < view.n_moe_layers {
            self.freq = vec![vec![0; n]; view.n_moe_layers];
        }
        for &e in view.ids {
            if let Some(c) = self.freq[view.layer].get_mut(e as usize) {
                *c += 1;
            }
        }
        let mut d = Decision::default();
        match view.phase {
            Phase::Prefill => self.prefill(view, cost, &mut d),
            Phase::Decode => self.decode(view, cost, &mut d),
        }
        d
    }
}
