//! Hot-expert bookkeeping shared by [`super::Klotski`] and [`super::KtEnhanced`]: an EMA of
//! each layer's loads seeded from an offline profile, the `slots` experts it predicts
//! hottest (the ones allowed to stay resident), and a slot allocator that makes room for
//! one of them by evicting the coldest resident expert the layer does not use.
//!
//! A key design decision: both baselines rank with the same predictor as TriMoE (alpha
//! 0.3), so a comparison between them isolates the architecture, not the predictor.

use std::vec;

use crate::policies::trimoe::top_by_profile;
use crate::predictor::EmaPredictor;
use crate::{CostModel, Decision, Eviction, LayerView, Phase};

/// An offline profile and the EMA predictor it seeds.
#[derive(Debug, Clone)]
pub(crate) struct HotExperts {
    profile: Vec<Vec<f64>>,
    ema: EmaPredictor,
}

impl HotExperts {
    /// Bookkeeping starting from `profile` (`[layer][expert]` tokens per step).
    pub(crate) fn new(profile: Vec<Vec<f64>>) -> Self {
        Self {
            ema: EmaPredictor::from_profile(EmaPredictor::ALPHA, profile.clone()),
            profile,
        }
    }

    /// The profile's `slots` busiest experts of every layer, `(layer, expert)`.
    pub(crate) fn initial_residency(&self, cost: &CostModel) -> Vec<(usize, u32)> {
        top_by_profile(&self.profile, cost.cache_slots_per_layer())
    }

    /// Folds a decode step's loads (`rows[e]`: the rows routed to expert `e`) into the
    /// predictor and returns the layer's predicted tokens per expert.
    pub(crate) fn observe(&mut self, view: &LayerView, rows: &[Vec<u32>]) -> &[f64] {
        if view.phase == Phase::Decode {
            let loads: Vec<u32> = rows.iter().map(|r| r.len() as u32).collect();
            self.ema.update(view.layer, &loads);
        }
        self.ema.predicted(view.layer)
    }
}

/// Predicted tokens of expert `e` (0 beyond the prediction's shape).
pub(crate) fn predicted(pred: &[f64], e: usize) -> f64 {
    pred.get(e).copied().unwrap_or(0.0)
}

/// The `slots` experts of `0..n` with the highest prediction, hottest first (ties: lower id).
pub(crate) fn hottest(pred: &[f64], n: usize, slots: usize) -> Vec<usize> {
    let p = |e: usize| predicted(pred, e);
    let mut hot: Vec<usize> = (0..n).collect();
    hot.sort_by(|&a, &b| p(b).total_cmp(&p(a)).then(a.cmp(&b)));
    hot.truncate(slots);
    hot
}

/// Free expert slots of one layer, refilled by evicting victims coldest first.
pub(crate) struct Slots {
    layer: usize,
    free: usize,
    victims: vec::IntoIter<usize>,
}

impl Slots {
    /// The layer's free slots, with the resident experts of `0..n` that `evictable` allows
    /// as victims, coldest predicted first.
    pub(crate) fn new(
        view: &LayerView,
        cost: &CostModel,
        pred: &[f64],
        n: usize,
        evictable: impl Fn(usize) -> bool,
    ) -> Self {
        let p = |e: usize| predicted(pred, e);
        let mut victims: Vec<usize> = (0..n)
            .filter(|&e| view.is_resident(e as u32) && evictable(e))
            .collect();
        victims.sort_by(|&a, &b| p(a).total_cmp(&p(b)).then(a.cmp(&b)));
        Self {
            layer: view.layer,
            free: (view.gpu.free_bytes / cost.expert_bytes().max(1)) as usize,
            victims: victims.into_iter(),
        }
    }

    /// Takes a slot for an expert that is to stay resident, evicting the next victim into
    /// `d` when none is free; `false` when no slot can be had.
    pub(crate) fn keep(&mut self, d: &mut Decision) -> bool {
        if self.free == 0
            && let Some(v) = self.victims.next()
        {
            d.evictions.push(Eviction {
                layer: self.layer,
                expert: v as u32,
            });
            self.free += 1;
        }
        if self.free > 0 {
            self.free -= 1;
            true
        } else {
            false
        }
    }
}
