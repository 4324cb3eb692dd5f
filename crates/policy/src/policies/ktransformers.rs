//! KTransformers (seed 003): attention, dense layers and shared experts on the GPU, every
//! routed expert on the CPU, and expert deferral.
//!
//! With deferral `D`, in decode, each token's `D` lowest-weighted experts are *deferred*:
//! the CPU runs them after the immediate ones and their output joins the residual stream
//! one layer later (seed 003 section 4.1, `O_k = I_k + S_k + R_{k-1}^def + R_k^imm`), so
//! the GPU starts the next attention as soon as the immediate experts are done. A key
//! design decision, following the paper: deferral applies to decode only (in prefill the
//! deferred set covers almost every expert and doubles memory traffic) and never to the
//! last MoE layer, and at least one expert per token stays immediate.

use crate::{CostModel, Decision, Device, LayerView, Phase, Policy, Task};

/// KTransformers with `deferred` deferred experts per token (0 disables deferral).
#[derive(Debug, Clone)]
pub struct KTransformers {
    deferred: usize,
}

impl KTransformers {
    /// A policy deferring `deferred` experts per token in decode.
    pub fn new(deferred: usize) -> Self {
        Self { deferred }
    }
}

impl Policy for KTransformers {
    fn name(&self) -> String {
        if self.deferred == 0 {
            "ktransformers".into()
        } else {
            format!("ktransformers-defer{}", self.deferred)
        }
    }

    fn decide(&mut self, view: &LayerView, cost: &CostModel) -> Decision {
        let n = cost.model.n_experts;
        let k = view.top_k.max(1);
        let last = view.layer + 1 >= view.n_moe_layers;
        let d = if view.phase == Phase::Decode && !last {
            self.deferred.min(k - 1)
        } else {
            0
        };
        // rows[deferred][expert]
        let mut rows = [vec![Vec::new(); n], vec![Vec::new(); n]];
        for (t, (ids, w)) in view
            .ids
            .chunks_exact(k)
            .zip(view.weights.chunks_exact(k))
            .enumerate()
        {
            // Rank this token's experts by weight; the last `d` are deferred.
            let mut order: Vec<usize> = (0..k).collect();
            order.sort_by(|&a, &b| w[b].total_cmp(&w[a]).then(a.cmp(&b)));
            for (rank, &j) in order.iter().enumerate() {
                let deferred = rank >= k - d;
                if let Some(r) = rows[deferred as usize].get_mut(ids[j] as usize) {
                    r.push(t as u32);
                }
            }
        }
        let mut tasks = Vec::new();
        for (deferred, per_expert) in rows.into_iter().enumerate() {
            for (e, r) in per_expert.into_iter().enumerate() {
                if !r.is_empty() {
                    tasks.push(Task {
                        expert: e as u32,
                        device: Device::Cpu,
                        rows: r,
                        deferred: deferred == 1,
                    });
                }
            }
        }
        Decision {
            tasks,
            ..Decision::default()
        }
    }
}
