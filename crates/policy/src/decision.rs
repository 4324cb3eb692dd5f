//! What makes a [`Decision`] executable, and the order its copies run in: pure functions of
//! the decision and the [`LayerView`] it answers, shared by the hybrid executor
//! (`strata-exec`) and the simulator (`strata-sim`).
//!
//! [`Decision::check`] refuses a decision that no executor could carry out as stated: a
//! routed (token, expert) pair computed twice or not at all, a task on an expert the token
//! was not routed to, a GPU expert whose weights are neither resident nor copied by the
//! decision, an eviction of an expert the layer runs on the GPU, a copy, eviction or
//! migration naming an expert the model does not have. [`TransferPlan`] is the link's
//! order of the copies and which copy brings each of the layer's GPU experts.
//!
//! A key design decision: the check looks only at the view and the decision, never at a
//! machine. What depends on the machine (the GPU memory budget, the number of NDP units,
//! the DIMMs a layout names, slots an executor could not find) stays with the executor or
//! the simulator, which treat it as they must: a simulator refuses, a real executor runs
//! the task on the CPU and counts it.

use crate::{Decision, Device, LayerView, TransferKind};

/// Why a decision cannot be executed; the message names the token, expert or layer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecisionError {
    /// A task names a token that is not in the step, or an expert the token was not
    /// routed to.
    #[error("expert {expert} is not routed from token {token}")]
    NotRouted {
        /// Token row.
        token: u32,
        /// Expert id.
        expert: u32,
    },
    /// Two tasks (or one task twice) compute the same routed pair.
    #[error("token {token} to expert {expert} assigned twice")]
    AssignedTwice {
        /// Token row.
        token: u32,
        /// Expert id.
        expert: u32,
    },
    /// A routed pair is computed by no task.
    #[error(
        "token {token} to expert {expert} not assigned ({assigned} of {routed} routed pairs are)"
    )]
    NotAssigned {
        /// Token row.
        token: u32,
        /// Expert id.
        expert: u32,
        /// Routed pairs the tasks compute.
        assigned: usize,
        /// Routed pairs of the layer.
        routed: usize,
    },
    /// A GPU task's expert is not resident and the decision copies it for this layer only
    /// as a prefetch, or not at all.
    #[error("expert {expert} runs on the GPU but is neither resident nor copied")]
    NotOnGpu {
        /// Expert id.
        expert: u32,
    },
    /// An eviction drops an expert the layer runs on the GPU, and no copy brings it back.
    #[error("evicts expert {expert} that it runs on the GPU")]
    EvictsRunning {
        /// Expert id.
        expert: u32,
    },
    /// A copy, eviction or migration names a layer or expert the model does not have.
    #[error("{what} ({layer}, {expert}) out of range")]
    OutOfRange {
        /// `copies`, `evicts` or `migrates`.
        what: &'static str,
        /// MoE layer.
        layer: usize,
        /// Expert id.
        expert: u32,
    },
}

impl LayerView<'_> {
    /// Experts of the layer (one residency flag each).
    pub fn n_experts(&self) -> usize {
        self.gpu.resident.len()
    }

    /// Index into `ids` and `weights` of the pair routing `token` to `expert`, if routed.
    pub fn pair_index(&self, token: u32, expert: u32) -> Option<usize> {
        let k = self.top_k.max(1);
        let t = token as usize;
        (t < self.tokens())
            .then(|| (t * k..(t + 1) * k).find(|&p| self.ids[p] == expert))
            .flatten()
    }
}

impl Decision {
    /// Checks that the decision can be executed as stated for `view` (see the module
    /// docs); the first problem found is the error.
    pub fn check(&self, view: &LayerView) -> Result<(), DecisionError> {
        self.check_coverage(view)?;
        self.check_ranges(view)?;
        let plan = TransferPlan::new(self, view.layer, view.n_experts());
        let copied = |e: u32| plan.copy_of.get(e as usize).copied().flatten().is_some();
        let on_gpu = |e: u32| {
            self.tasks
                .iter()
                .any(|t| t.device == Device::Gpu && t.expert == e)
        };
        if let Some(ev) = self
            .evictions
            .iter()
            .find(|ev| ev.layer == view.layer && on_gpu(ev.expert) && !copied(ev.expert))
        {
            return Err(DecisionError::EvictsRunning { expert: ev.expert });
        }
        match self
            .tasks
            .iter()
            .find(|t| t.device == Device::Gpu && !view.is_resident(t.expert) && !copied(t.expert))
        {
            Some(t) => Err(DecisionError::NotOnGpu { expert: t.expert }),
            None => Ok(()),
        }
    }

    /// Every routed pair exactly once.
    fn check_coverage(&self, view: &LayerView) -> Result<(), DecisionError> {
        let mut covered = vec![false; view.ids.len()];
        for task in &self.tasks {
            for &token in &task.rows {
                let expert = task.expert;
                let p = view
                    .pair_index(token, expert)
                    .ok_or(DecisionError::NotRouted { token, expert })?;
                if std::mem::replace(&mut covered[p], true) {
                    return Err(DecisionError::AssignedTwice { token, expert });
                }
            }
        }
        match covered.iter().position(|c| !c) {
            Some(p) => Err(DecisionError::NotAssigned {
                token: (p / view.top_k.max(1)) as u32,
                expert: view.ids[p],
                assigned: covered.iter().filter(|&&c| c).count(),
                routed: covered.len(),
            }),
            None => Ok(()),
        }
    }

    /// Copies, evictions and migrations name experts of the model.
    fn check_ranges(&self, view: &LayerView) -> Result<(), DecisionError> {
        let named = self
            .transfers
            .iter()
            .map(|t| ("copies", t.layer, t.expert))
            .chain(self.evictions.iter().map(|e| ("evicts", e.layer, e.expert)))
            .chain(
                self.migrations
                    .iter()
                    .map(|m| ("migrates", m.layer, m.expert)),
            );
        for (what, layer, expert) in named {
            if layer >= view.n_moe_layers || expert as usize >= view.n_experts() {
                return Err(DecisionError::OutOfRange {
                    what,
                    layer,
                    expert,
                });
            }
        }
        Ok(())
    }
}

/// How a decision's copies run: one at a time on the link, by priority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferPlan {
    /// Indices into the decision's transfers in the order they run: by priority, lower
    /// first, ties in the decision's order.
    pub order: Vec<usize>,
    /// `[n_experts]`: the copy (index into the transfers) that brings each expert of the
    /// layer for this step, an on-demand or staged one (the last, when several do).
    pub copy_of: Vec<Option<usize>>,
    /// The staged copies (indices into the transfers) in link order: they stream through
    /// ping-pong buffers, so the `i`-th reuses the buffer of the `i - buffers`-th.
    pub staged: Vec<usize>,
}

impl TransferPlan {
    /// The plan of `d`'s copies for MoE layer `layer` of `n_experts` experts.
    pub fn new(d: &Decision, layer: usize, n_experts: usize) -> TransferPlan {
        let mut order: Vec<usize> = (0..d.transfers.len()).collect();
        order.sort_by_key(|&i| d.transfers[i].priority);
        let mut copy_of = vec![None; n_experts];
        for (i, tr) in d.transfers.iter().enumerate() {
            if tr.layer == layer
                && tr.kind != TransferKind::Prefetch
                && let Some(c) = copy_of.get_mut(tr.expert as usize)
            {
                *c = Some(i);
            }
        }
        let staged = order
            .iter()
            .copied()
            .filter(|&i| d.transfers[i].kind == TransferKind::Staged)
            .collect();
        TransferPlan {
            order,
            copy_of,
            staged,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Eviction, GpuView, Migration, Phase, Task, Transfer};

    /// Two tokens, top-2: token 0 to experts 1 and 2, token 1 to experts 2 and 3; expert 2
    /// resident.
    fn check(d: &Decision, expected: Result<(), DecisionError>) {
        let resident = [false, false, true, false];
        let view = LayerView {
            layer: 1,
            n_moe_layers: 2,
            phase: Phase::Decode,
            step: 0,
            top_k: 2,
            ids: &[1, 2, 2, 3],
            weights: &[0.6, 0.4, 0.7, 0.3],
            hidden: None,
            candidates: None,
            gpu: GpuView {
                resident: &resident,
                free_bytes: 0,
                busy_s: 0.0,
            },
            cpu_busy_s: 0.0,
            pcie_busy_s: 0.0,
            context: None,
        };
        let got = d.check(&view);
        if let Err(e) = &got {
            assert!(!e.to_string().is_empty());
        }
        assert_eq!(got, expected, "{d:?}");
    }

    fn task(expert: u32, device: Device, rows: &[u32]) -> Task {
        Task {
            expert,
            device,
            rows: rows.to_vec(),
            deferred: false,
        }
    }

    fn copy(layer: usize, expert: u32, kind: TransferKind, priority: u32) -> Transfer {
        Transfer {
            layer,
            expert,
            kind,
            priority,
        }
    }

    /// Every pair once: experts 1 and 3 on the CPU, 2 (resident) on the GPU.
    fn valid() -> Decision {
        Decision {
            tasks: vec![
                task(1, Device::Cpu, &[0]),
                task(2, Device::Gpu, &[0, 1]),
                task(3, Device::Cpu, &[1]),
            ],
            ..Decision::default()
        }
    }

    #[test]
    fn a_valid_decision_passes() {
        check(&valid(), Ok(()));
        // A GPU expert copied on demand or staged for this layer needs no residency.
        for kind in [TransferKind::OnDemand, TransferKind::Staged] {
            let mut d = valid();
            d.tasks[0].device = Device::Gpu;
            d.transfers.push(copy(1, 1, kind, 0));
            check(&d, Ok(()));
        }
        // An eviction of a GPU expert that a copy brings back.
        let mut d = valid();
        d.evictions.push(Eviction {
            layer: 1,
            expert: 2,
        });
        d.transfers.push(copy(1, 2, TransferKind::OnDemand, 0));
        check(&d, Ok(()));
    }

    #[test]
    fn each_invalid_decision_is_refused_with_its_reason() {
        let mut d = valid();
        d.tasks[0].rows = vec![1];
        check(
            &d,
            Err(DecisionError::NotRouted {
                token: 1,
                expert: 1,
            }),
        );
        d.tasks[0].rows = vec![2];
        check(
            &d,
            Err(DecisionError::NotRouted {
                token: 2,
                expert: 1,
            }),
        );

        let mut d = valid();
        d.tasks.push(task(3, Device::Gpu, &[1]));
        check(
            &d,
            Err(DecisionError::AssignedTwice {
                token: 1,
                expert: 3,
            }),
        );

        let mut d = valid();
        d.tasks.remove(1);
        let e = DecisionError::NotAssigned {
            token: 0,
            expert: 2,
            assigned: 2,
            routed: 4,
        };
        assert_eq!(
            e.to_string(),
            "token 0 to expert 2 not assigned (2 of 4 routed pairs are)"
        );
        check(&d, Err(e));

        // On the GPU without its weights; a prefetch or another layer's copy is no help.
        let mut d = valid();
        d.tasks[2].device = Device::Gpu;
        check(&d, Err(DecisionError::NotOnGpu { expert: 3 }));
        d.transfers.push(copy(1, 3, TransferKind::Prefetch, 0));
        d.transfers.push(copy(0, 3, TransferKind::OnDemand, 1));
        check(&d, Err(DecisionError::NotOnGpu { expert: 3 }));

        let mut d = valid();
        d.evictions.push(Eviction {
            layer: 1,
            expert: 2,
        });
        check(&d, Err(DecisionError::EvictsRunning { expert: 2 }));
        // Evicting it from another layer is fine.
        d.evictions[0].layer = 0;
        check(&d, Ok(()));

        let out_of_range = |what, layer, expert| {
            Err(DecisionError::OutOfRange {
                what,
                layer,
                expert,
            })
        };
        let mut d = valid();
        d.transfers.push(copy(2, 0, TransferKind::Prefetch, 0));
        check(&d, out_of_range("copies", 2, 0));
        let mut d = valid();
        d.evictions.push(Eviction {
            layer: 0,
            expert: 4,
        });
        check(&d, out_of_range("evicts", 0, 4));
        let mut d = valid();
        d.migrations.push(Migration {
            layer: 0,
            expert: 9,
            to: crate::Layout::Striped,
        });
        check(&d, out_of_range("migrates", 0, 9));
    }

    #[test]
    fn the_plan_orders_copies_by_priority_and_finds_each_experts_copy() {
        let d = Decision {
            transfers: vec![
                copy(1, 0, TransferKind::Prefetch, 3),
                copy(1, 1, TransferKind::Staged, 1),
                copy(0, 2, TransferKind::OnDemand, 0),
                copy(1, 3, TransferKind::Staged, 1),
                copy(1, 2, TransferKind::OnDemand, 2),
            ],
            ..valid()
        };
        assert_eq!(
            TransferPlan::new(&d, 1, 4),
            TransferPlan {
                order: vec![2, 1, 3, 4, 0],
                copy_of: vec![None, Some(1), Some(4), Some(3)],
                staged: vec![1, 3],
            }
        );
    }
}
