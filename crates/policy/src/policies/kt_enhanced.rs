//! Enhanced KTransformers (seed 000's GPU-CPU baseline): every routed expert on the AMX
//! CPU, plus prefetching and on-demand loading of hot experts to the GPU (seed 000 section
//! 5.1.2, after HybriMoE).
//!
//! Per layer: a resident expert runs on the GPU. A non-resident one runs on the CPU unless
//! loading it is cheaper than computing it there (eq. 2 against eq. 3 with striped
//! weights); a loaded expert among the layer's predicted-hottest `slots` stays resident
//! (replacing the coldest unused resident), others are streamed. After the layer, the
//! predicted-hot experts that are not resident are prefetched, hottest first, while their
//! copies fit in the PCIe time the layer leaves idle (its CPU time minus its own copies).
//!
//! A key design decision: the hot set and the prefetch order come from the same EMA load
//! predictor as TriMoE's (alpha 0.3), so the comparison isolates the architecture (no NDP,
//! warm and cold experts both on the CPU) rather than the predictor.

use crate::layout::NdpCosts;
use crate::policies::hot::{HotExperts, Slots, hottest, predicted};
use crate::{
    CostModel, Decision, Device, LayerView, Layout, Phase, Policy, Task, Transfer, TransferKind,
};

/// Enhanced KTransformers.
#[derive(Debug, Clone)]
pub struct KtEnhanced {
    hot: HotExperts,
}

impl KtEnhanced {
    /// A policy whose initial residency and predictor start from `profile`
    /// (`[layer][expert]` tokens per step).
    pub fn new(profile: Vec<Vec<f64>>) -> Self {
        Self {
            hot: HotExperts::new(profile),
        }
    }
}

impl Policy for KtEnhanced {
    fn name(&self) -> String {
        "kt-enhanced".into()
    }

    fn initial_residency(&mut self, cost: &CostModel) -> Vec<(usize, u32)> {
        self.hot.initial_residency(cost)
    }

    fn initial_layout(&mut self, _cost: &CostModel) -> Option<Vec<(usize, u32, Layout)>> {
        Some(Vec::new())
    }

    fn decide(&mut self, view: &LayerView, cost: &CostModel) -> Decision {
        let nc = NdpCosts::new(cost);
        let n = cost.model.n_experts;
        let rows = view.rows_per_expert(n);
        let pred = self.hot.observe(view, &rows);
        let hot = hottest(pred, n, cost.cache_slots_per_layer());
        let mut on_gpu = vec![false; n];
        let mut loads: Vec<usize> = Vec::new();
        let mut cpu_time = 0.0;
        for (e, r) in rows.iter().enumerate() {
            if r.is_empty() {
                continue;
            }
            let t = r.len() as u32;
            if view.is_resident(e as u32) {
                on_gpu[e] = true;
            } else if nc.gpu_miss(t, Layout::Striped) < nc.cpu(t, Layout::Striped) {
                on_gpu[e] = true;
                loads.push(e);
            } else {
                cpu_time += nc.cpu(t, Layout::Striped);
            }
        }
        loads.sort_by_key(|&e| (std::cmp::Reverse(rows[e].len()), e));
        let mut slots = Slots::new(view, cost, pred, n, |e| !on_gpu[e] && !hot.contains(&e));
        let mut d = Decision::default();
        let mut pcie_used = 0.0;
        for &e in &loads {
            let kind = if hot.contains(&e) && slots.keep(&mut d) {
                TransferKind::OnDemand
            } else {
                TransferKind::Staged
            };
            pcie_used += nc.copy(Layout::Striped);
            d.transfers.push(Transfer {
                layer: view.layer,
                expert: e as u32,
                kind,
                priority: d.transfers.len() as u32,
            });
        }
        if view.phase == Phase::Decode {
            for &e in &hot {
                if view.is_resident(e as u32) || on_gpu[e] || predicted(pred, e) <= 0.0 {
                    continue;
                }
                if pcie_used + nc.copy(Layout::Striped) > cpu_time || !slots.keep(&mut d) {
                    break;
                }
                pcie_used += nc.copy(Layout::Striped);
                d.transfers.push(Transfer {
                    layer: view.layer,
                    expert: e as u32,
                    kind: TransferKind::Prefetch,
                    priority: d.transfers.len() as u32,
                });
            }
        }
        let mut tasks: Vec<Task> = crate::tasks_by_expert(view, n, |e, _| {
            if on_gpu[e as usize] {
                Device::Gpu
            } else {
                Device::Cpu
            }
        });
        tasks.sort_by_key(|t| {
            loads
                .iter()
                .position(|&m| m == t.expert as usize)
                .map_or(0, |i| i + 1)
        });
        d.tasks = tasks;
        d
    }
}
