//! Fiddler (ICLR'25): the most popular experts, from an offline profile, are pinned on the
//! GPU once; every other expert runs where it is cheaper, on the CPU or copied to the GPU
//! for this layer only (research/offload-systems.md: CPU cost grows with tokens, GPU cost
//! is a copy when not resident).
//!
//! A key design decision: pinning is global (the most activated (layer, expert) pairs of
//! the whole model, not a fixed number per layer), as Fiddler's profile-driven placement
//! does, and it never changes after the start.

use crate::{
    CostModel, Decision, Device, LayerView, Policy, Transfer, TransferKind, tasks_by_expert,
};

/// Static pinning from a profile plus a per-expert CPU/GPU choice.
#[derive(Debug, Clone)]
pub struct Fiddler {
    /// `profile[moe_layer][expert]`: activation counts.
    profile: Vec<Vec<u64>>,
}

impl Fiddler {
    /// A policy pinning by `profile[moe_layer][expert]` activation counts.
    pub fn new(profile: Vec<Vec<u64>>) -> Self {
        Self { profile }
    }
}

impl Policy for Fiddler {
    fn name(&self) -> String {
        "fiddler".into()
    }

    fn initial_residency(&mut self, cost: &CostModel) -> Vec<(usize, u32)> {
        let slots = (cost.gpu_expert_budget() / cost.expert_bytes().max(1)) as usize;
        let mut all: Vec<(u64, usize, u32)> = self
            .profile
            .iter()
            .enumerate()
            .flat_map(|(l, c)| c.iter().enumerate().map(move |(e, &n)| (n, l, e as u32)))
            .filter(|&(n, _, _)| n > 0)
            .collect();
        all.sort_by(|a, b| b.0.cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
        all.into_iter()
            .take(slots)
            .map(|(_, l, e)| (l, e))
            .collect()
    }

    fn decide(&mut self, view: &LayerView, cost: &CostModel) -> Decision {
        let mut copies = Vec::new();
        let mut tasks = tasks_by_expert(view, cost.model.n_experts, |e, n| {
            if view.is_resident(e) {
                return Device::Gpu;
            }
            let n = n as u32;
            let gpu = cost.expert_transfer_time() + cost.expert_time(Device::Gpu, n);
            if gpu < cost.expert_time(Device::Cpu, n) {
                copies.push(e);
                Device::Gpu
            } else {
                Device::Cpu
            }
        });
        // Resident GPU experts first, then the copied ones in copy order.
        tasks.sort_by_key(|t| {
            copies
                .iter()
                .position(|&c| c == t.expert)
                .map_or(0, |p| p + 1)
        });
        Decision {
            tasks,
            transfers: copies
                .iter()
                .enumerate()
                .map(|(i, &e)| Transfer {
                    layer: view.layer,
                    expert: e,
                    kind: TransferKind::Staged,
                    priority: i as u32,
                })
                .collect(),
            ..Decision::default()
        }
    }
}
