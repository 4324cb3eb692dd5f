//! MoNDE (seed 000's GPU-NDP baseline, Kim et al. DAC'24): hot experts on the GPU, the
//! others computed near data, each non-resident expert sent whichever way is cheaper:
//! its weights to the GPU, or its activations to the NDP unit of its DIMM.
//!
//! The same comparison at the offline profile's loads sets the layout: experts the NDP
//! would take are localized (NDP units compute only whole experts), spread over the DIMMs
//! heaviest first onto the least loaded one; the others stay striped, so their weight
//! migration reads at full host bandwidth. Per layer: a resident expert runs on the GPU; a
//! striped one is loaded; a localized one is moved by *weight migration* (eq. 2 with its
//! localized weights: PCIe or one DIMM's share of host bandwidth) or by *activation
//! migration* (the NDP time of eq. 4 plus the tokens' inputs and outputs over the DIMM's
//! host channel), whichever costs less.
//!
//! A key design decision: the choice is MoNDE's own per-expert comparison, not a makespan
//! schedule, and residency is the static profiled hot set; that is what distinguishes it
//! from the GPU-NDP point of TriMoE's ablation, which schedules the same two domains with
//! TriMoE's greedy makespan algorithm.

use crate::layout::NdpCosts;
use crate::policies::trimoe::top_by_profile;
use crate::{CostModel, Decision, Device, LayerView, Layout, Policy, Task, Transfer, TransferKind};

/// MoNDE.
#[derive(Debug, Clone)]
pub struct Monde {
    profile: Vec<Vec<f64>>,
    /// `[layer][expert]`: the DIMM holding it, if localized.
    home: Vec<Vec<Option<u16>>>,
}

impl Monde {
    /// A policy placing experts by `profile` (`[layer][expert]` tokens per step).
    pub fn new(profile: Vec<Vec<f64>>) -> Self {
        Self {
            profile,
            home: Vec::new(),
        }
    }

    fn activation_time(nc: &NdpCosts, tokens: u32) -> f64 {
        // BF16 inputs in and outputs back.
        let bytes = 2.0 * 2.0 * tokens as f64 * nc.cost().model.hidden as f64;
        nc.ndp(tokens) + bytes / nc.dimm_host_bw()
    }
}

impl Policy for Monde {
    fn name(&self) -> String {
        "monde".into()
    }

    fn initial_residency(&mut self, cost: &CostModel) -> Vec<(usize, u32)> {
        top_by_profile(&self.profile, cost.cache_slots_per_layer())
    }

    fn initial_layout(&mut self, cost: &CostModel) -> Option<Vec<(usize, u32, Layout)>> {
        let nc = NdpCosts::new(cost);
        let n = cost.model.n_experts;
        let units = nc.units() as usize;
        self.home = (0..cost.model.moe_layers())
            .map(|l| {
                let prof = self.profile.get(l);
                let w = |e: usize| prof.and_then(|p| p.get(e)).copied().unwrap_or(0.0);
                let tokens = |e: usize| w(e).round().max(1.0) as u32;
                let mut near: Vec<usize> = (0..n)
                    .filter(|&e| {
                        units > 0
                            && Self::activation_time(&nc, tokens(e))
                                <= nc.gpu_miss(tokens(e), Layout::Striped)
                    })
                    .collect();
                near.sort_by(|&a, &b| w(b).total_cmp(&w(a)).then(a.cmp(&b)));
                let mut load = vec![0.0f64; units];
                let mut home = vec![None; n];
                for e in near {
                    let d = (0..units)
                        .min_by(|&a, &b| load[a].total_cmp(&load[b]).then(a.cmp(&b)))
                        .unwrap_or(0);
                    load[d] += nc.ndp(tokens(e));
                    home[e] = Some(d as u16);
                }
                home
            })
            .collect();
        Some(
            self.home
                .iter()
                .enumerate()
                .flat_map(|(l, h)| {
                    h.iter()
                        .enumerate()
                        .filter_map(move |(e, &d)| d.map(|d| (l, e as u32, Layout::Localized(d))))
                })
                .collect(),
        )
    }

    fn decide(&mut self, view: &LayerView, cost: &CostModel) -> Decision {
        let nc = NdpCosts::new(cost);
        let n = cost.model.n_experts;
        if self.home.len() < view.n_moe_layers {
            self.initial_layout(cost);
        }
        let units = nc.units();
        let rows = view.rows_per_expert(n);
        let mut device = vec![Device::Gpu; n];
        let mut misses: Vec<usize> = Vec::new();
        for (e, r) in rows.iter().enumerate() {
            if r.is_empty() || view.is_resident(e as u32) {
                continue;
            }
            let t = r.len() as u32;
            match self.home[view.layer][e] {
                Some(home)
                    if home < units
                        && Self::activation_time(&nc, t)
                            <= nc.gpu_miss(t, Layout::Localized(home)) =>
                {
                    device[e] = Device::Ndp(home);
                }
                _ => misses.push(e),
            }
        }
        misses.sort_by_key(|&e| (std::cmp::Reverse(rows[e].len()), e));
        let mut d = Decision::default();
        for &e in &misses {
            d.transfers.push(Transfer {
                layer: view.layer,
                expert: e as u32,
                kind: TransferKind::Staged,
                priority: d.transfers.len() as u32,
            });
        }
        let mut tasks: Vec<Task> = crate::tasks_by_expert(view, n, |e, _| device[e as usize]);
        tasks.sort_by_key(|t| {
            misses
                .iter()
                .position(|&m| m == t.expert as usize)
                .map_or(0, |i| i + 1)
        });
        d.tasks = tasks;
        d
    }
}
