//! GPU-only offloading with a per-layer LRU cache: the classic baseline.
//!
//! Every routed expert runs on the GPU. A missing expert is copied on demand and kept,
//! evicting the least recently used expert of its layer that this step does not need; when
//! the step needs more experts than the layer has slots (long prompts), the overflow is
//! streamed through the two ping-pong buffers instead. A key design decision: recency is
//! the step number of last use, ties broken by expert id, so eviction order is exact and
//! testable.

use crate::{CostModel, Decision, Device, Eviction, LayerView, Policy, Transfer, TransferKind};

/// GPU-only with on-demand loading and a per-layer LRU cache.
#[derive(Debug, Clone)]
pub struct GpuLru {
    slots: usize,
    /// `last_use[layer][expert]`: step of last use, `None` if never used.
    last_use: Vec<Vec<Option<usize>>>,
}

impl GpuLru {
    /// A policy with `slots` cached experts per MoE layer.
    pub fn new(slots: usize) -> Self {
        Self {
            slots,
            last_use: Vec::new(),
        }
    }
}

impl Policy for GpuLru {
    fn name(&self) -> String {
        "gpu-lru".into()
    }

    fn decide(&mut self, view: &LayerView, cost: &CostModel) -> Decision {
        let n = cost.model.n_experts;
        if self.last_use.len() < view.n_moe_layers {
            self.last_use = vec![vec![None; n]; view.n_moe_layers];
        }
        let rows = view.rows_per_expert(n);
        let needed: Vec<bool> = rows.iter().map(|r| !r.is_empty()).collect();
        let mut resident: Vec<bool> = (0..n as u32).map(|e| view.is_resident(e)).collect();
        let mut count = resident.iter().filter(|&&r| r).count();
        let mut d = Decision::default();
        // Misses, heaviest first so they are copied first.
        let mut misses: Vec<u32> = (0..n as u32)
            .filter(|&e| needed[e as usize] && !resident[e as usize])
            .collect();
        misses.sort_by_key(|&e| (std::cmp::Reverse(rows[e as usize].len()), e));
        let lru = &mut self.last_use[view.layer];
        for (prio, &e) in misses.iter().enumerate() {
            let kind = if count < self.slots {
                count += 1;
                TransferKind::OnDemand
            } else {
                // Oldest resident expert this step does not use.
                let victim = (0..n as u32)
                    .filter(|&v| resident[v as usize] && !needed[v as usize])
                    .min_by_key(|&v| (lru[v as usize], v));
                match victim {
                    Some(v) => {
                        resident[v as usize] = false;
                        d.evictions.push(Eviction {
                            layer: view.layer,
                            expert: v,
                        });
                        TransferKind::OnDemand
                    }
                    None => TransferKind::Staged,
                }
            };
            if kind == TransferKind::OnDemand {
                resident[e as usize] = true;
            }
            d.transfers.push(Transfer {
                layer: view.layer,
                expert: e,
                kind,
                priority: prio as u32,
            });
        }
        for (e, r) in rows.iter().enumerate() {
            if !r.is_empty() {
                lru[e] = Some(view.step);
            }
        }
        // Resident experts first (they start while the misses are copied), then the misses
        // in copy order.
        let mut tasks = crate::tasks_by_expert(view, n, |_, _| Device::Gpu);
        tasks.sort_by_key(|t| {
            misses
                .iter()
                .position(|&m| m == t.expert)
                .map_or(0, |p| p + 1)
        });
        d.tasks = tasks;
        d
    }
}
