//! Routing: which experts each token goes to, with what weight, as a pure function of the
//! router logits ([`route`]). Placement policies, traces and the simulator consume the same
//! routing the forward pass uses.

use crate::config::{GroupScore, RouterConfig, Scoring};
use crate::ops::sigmoid;

/// The experts chosen for each token of a batch: `ids[t * k + j]`, `weights[t * k + j]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Routing {
    /// Experts per token.
    pub top_k: usize,
    /// Chosen expert ids, `[T, k]`.
    pub ids: Vec<u32>,
    /// Combine weights, `[T, k]`.
    pub weights: Vec<f32>,
    /// The router's best-scored experts per token, when asked for
    /// ([`MoeBlock::set_candidates`]): placement policies that score experts beyond the
    /// chosen ones (HybriMoE's top `2k`) read them.
    pub candidates: Option<Candidates>,
}

/// The `per_token` experts with the highest router scores of every token, best first:
/// `ids[t * per_token + j]` with its score (softmax or sigmoid probability, before any
/// bias, group limit or renormalisation) in `scores[t * per_token + j]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Candidates {
    /// Candidates per token.
    pub per_token: usize,
    /// Expert ids, `[T, per_token]`.
    pub ids: Vec<u32>,
    /// Router scores, `[T, per_token]`.
    pub scores: Vec<f32>,
}

impl Routing {
    /// Number of tokens routed.
    pub fn tokens(&self) -> usize {
        self.ids.len() / self.top_k.max(1)
    }

    /// Tokens per expert.
    pub fn load(&self, n_experts: usize) -> Vec<usize> {
        let mut load = vec![0; n_experts];
        for &e in &self.ids {
            load[e as usize] += 1;
        }
        load
    }
}

/// Chooses experts for every token from router `logits: [T, n_experts]`.
pub fn route(cfg: &RouterConfig, logits: &[f32], bias: Option<&[f32]>) -> Routing {
    route_with_candidates(cfg, logits, bias, 0)
}

/// [`route`], also keeping each token's `n_candidates` best-scored experts
/// ([`Routing::candidates`]; 0: none).
pub fn route_with_candidates(
    cfg: &RouterConfig,
    logits: &[f32],
    bias: Option<&[f32]>,
    n_candidates: usize,
) -> Routing {
    let n = cfg.n_experts;
    let k = cfg.top_k;
    let t = logits.len() / n;
    let n_candidates = n_candidates.min(n);
    let mut routing = Routing {
        top_k: k,
        ids: Vec::with_capacity(t * k),
        weights: Vec::with_capacity(t * k),
        candidates: (n_candidates > 0).then(|| Candidates {
            per_token: n_candidates,
            ids: Vec::with_capacity(t * n_candidates),
            scores: Vec::with_capacity(t * n_candidates),
        }),
    };
    let mut scores = vec![0.0f32; n];
    let mut choice = vec![0.0f32; n];
    let mut order: Vec<usize> = Vec::with_capacity(n);
    for row in logits.chunks_exact(n) {
        match cfg.scoring {
            Scoring::Softmax => {
                scores.copy_from_slice(row);
                crate::ops::softmax(&mut scores);
            }
            Scoring::Sigmoid => {
                for (s, &l) in scores.iter_mut().zip(row) {
                    *s = sigmoid(l);
                }
            }
        }
        if let Some(c) = &mut routing.candidates {
            for e in top_indices(&scores, n_candidates) {
                c.ids.push(e as u32);
                c.scores.push(scores[e]);
            }
        }
        choice.copy_from_slice(&scores);
        if let (true, Some(b)) = (cfg.correction_bias, bias) {
            for (c, b) in choice.iter_mut().zip(b) {
                *c += b;
            }
        }
        if let Some(g) = cfg.groups {
            let size = n / g.n_group;
            let group_scores: Vec<f32> = choice
                .chunks_exact(size)
                .map(|grp| match g.group_score {
                    GroupScore::Max => grp.iter().copied().fold(f32::NEG_INFINITY, f32::max),
                    GroupScore::Top2Sum => {
                        let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
                        for &v in grp {
                            if v > a {
                                b = a;
                                a = v;
                            } else if v > b {
                                b = v;
                            }
                        }
                        if size == 1 { a } else { a + b }
                    }
                })
                .collect();
            let kept = top_indices(&group_scores, g.topk_group);
            for (gi, grp) in choice.chunks_exact_mut(size).enumerate() {
                if !kept.contains(&gi) {
                    grp.fill(f32::NEG_INFINITY);
                }
            }
        }
        order.clear();
        order.extend(top_indices(&choice, k));
        let sum: f32 = order.iter().map(|&e| scores[e]).sum();
        for &e in &order {
            let mut w = scores[e];
            if cfg.norm_topk_prob {
                w /= sum
                    + if cfg.scoring == Scoring::Sigmoid {
                        1e-20
                    } else {
                        0.0
                    };
            }
            routing.ids.push(e as u32);
            routing.weights.push(w * cfg.scaling_factor);
        }
    }
    routing
}

/// Indices of the `k` largest values, largest first (ties to the lower index): the `k` first
/// selected, then only they sorted (a whole sort of every token's scores was 1% of a 512-token
/// prefill, on the thread the others wait for).
fn top_indices(v: &[f32], k: usize) -> Vec<usize> {
    let order = |&a: &usize, &b: &usize| v[b].total_cmp(&v[a]).then(a.cmp(&b));
    let mut idx: Vec<usize> = (0..v.len()).collect();
    if k < idx.len() {
        idx.select_nth_unstable_by(k, order);
        idx.truncate(k);
    }
    idx.sort_unstable_by(order);
    idx
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GroupLimit;

    fn router(scoring: Scoring) -> RouterConfig {
        RouterConfig {
            n_experts: 6,
            top_k: 2,
            scoring,
            correction_bias: false,
            groups: None,
            norm_topk_prob: false,
            scaling_factor: 1.0,
        }
    }

    #[test]
    fn softmax_topk_picks_largest_and_normalises() {
        let mut cfg = router(Scoring::Softmax);
        cfg.norm_topk_prob = true;
        let r = route(&cfg, &[0.0, 3.0, 1.0, 2.5, -1.0, 0.5], None);
        assert_eq!(r.ids, vec![1, 3]);
        assert!((r.weights.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(r.weights[0] > r.weights[1]);
    }

    #[test]
    fn candidates_are_the_best_scores_before_bias_and_renormalisation() {
        let mut cfg = router(Scoring::Softmax);
        cfg.norm_topk_prob = true;
        cfg.correction_bias = true;
        let logits = [0.0, 3.0, 1.0, 2.5, -1.0, 0.5, 1.0, 0.0, 0.0, 0.0, 0.0, 2.0];
        let bias = [5.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let r = route_with_candidates(&cfg, &logits, Some(&bias), 4);
        assert_eq!(r.ids, route(&cfg, &logits, Some(&bias)).ids);
        let c = r.candidates.unwrap();
        assert_eq!(c.per_token, 4);
        assert_eq!(c.ids, vec![1, 3, 2, 5, 5, 0, 1, 2]);
        let mut p = logits[..6].to_vec();
        crate::ops::softmax(&mut p);
        assert!((c.scores[0] - p[1]).abs() < 1e-6 && c.scores[0] > c.scores[1]);
        assert!(
            route_with_candidates(&cfg, &logits, None, 0)
                .candidates
                .is_none()
        );
    }

    #[test]
    fn group_limit_excludes_losing_groups() {
        // Groups of 2: {0,1} {2,3} {4,5}; the best single expert (5) is in a group whose
        // top-2 sum loses, so with one group kept it must not be chosen.
        let mut cfg = router(Scoring::Sigmoid);
        cfg.groups = Some(GroupLimit {
            n_group: 3,
            topk_group: 1,
            group_score: GroupScore::Top2Sum,
        });
        let r = route(&cfg, &[2.0, 2.0, 0.0, 0.0, -5.0, 3.0], None);
        assert_eq!(r.ids, vec![0, 1]);
    }

    #[test]
    fn correction_bias_changes_choice_not_weight() {
        let mut cfg = router(Scoring::Sigmoid);
        cfg.correction_bias = true;
        let logits = [1.0, 0.0, 0.0, 0.0, 0.0, 0.9];
        let bias = [0.0, 0.0, 0.0, 0.0, 0.0, 0.5];
        let r = route(&cfg, &logits, Some(&bias));
        assert_eq!(r.ids, vec![5, 0]);
        assert!((r.weights[0] - sigmoid(0.9)).abs() < 1e-6);
    }

    #[test]
    fn top_indices_are_the_head_of_the_whole_order() {
        // Ties (to the lower index), NaN and infinities, every k.
        let v = [
            0.5,
            -1.0,
            0.5,
            f32::NAN,
            2.0,
            f32::NEG_INFINITY,
            0.5,
            3.0,
            -0.0,
            0.0,
        ];
        let mut all: Vec<usize> = (0..v.len()).collect();
        all.sort_by(|&a, &b| v[b].total_cmp(&v[a]).then(a.cmp(&b)));
        for k in 0..=v.len() + 1 {
            assert_eq!(top_indices(&v, k), all[..k.min(v.len())], "k {k}");
        }
    }
}
