//! Expert predictors. [`LinearPredictor`] is SMoE's token-wise predictor: per MoE layer, a
//! linear map from the router input hidden state at token `t` to the experts that layer
//! picks at token `t + 1`. [`EmaPredictor`] is TriMoE's load predictor (seed 000 eq. 8): an
//! exponential moving average of each expert's tokens per decode step.
//!
//! A key design decision: SMoE trains `Linear(hidden -> n_experts)` with BCE and SGD; here
//! the same linear model is fitted in closed form by ridge regression on multi-hot targets
//! (`W = (X'X + lambda I)^-1 X'Y`, bias as an extra input). It ranks experts the same way
//! a linear BCE model does to first order, needs no learning-rate schedule, is
//! deterministic, and fits a few hundred samples in milliseconds.

use crate::{Error, Result};

/// A linear next-token expert predictor for one layer.
#[derive(Debug, Clone, PartialEq)]
pub struct LinearPredictor {
    dim: usize,
    n_experts: usize,
    /// `[n_experts][dim + 1]`, bias last.
    w: Vec<f32>,
}

impl LinearPredictor {
    /// Fits on `(hidden at t, expert ids at t + 1)` pairs; `hidden.len()` must be `dim`.
    pub fn train(
        samples: &[(&[f32], &[u32])],
        dim: usize,
        n_experts: usize,
        ridge: f64,
    ) -> Result<Self> {
        let bad = |msg: String| Error::Config {
            policy: "smoe predictor",
            msg,
        };
        if samples.is_empty() {
            return Err(bad("no training samples".into()));
        }
        let m = dim + 1;
        let mut xtx = vec![0.0f64; m * m];
        let mut xty = vec![0.0f64; m * n_experts];
        let mut x = vec![0.0f64; m];
        for (h, ids) in samples {
            if h.len() != dim {
                return Err(bad(format!(
                    "hidden state of {} values, expected {dim}",
                    h.len()
                )));
            }
            for (xi, &hi) in x.iter_mut().zip(h.iter()) {
                *xi = hi as f64;
            }
            x[dim] = 1.0;
            for i in 0..m {
                for j in 0..=i {
                    xtx[i * m + j] += x[i] * x[j];
                }
            }
            for &e in *ids {
                let e = e as usize;
                if e >= n_experts {
                    return Err(bad(format!("expert id {e} out of range 0..{n_experts}")));
                }
                for i in 0..m {
                    xty[i * n_experts + e] += x[i];
                }
            }
        }
        for i in 0..m {
            for j in 0..i {
                xtx[j * m + i] = xtx[i * m + j];
            }
            xtx[i * m + i] += ridge.max(1e-9);
        }
        let l =
            cholesky(&xtx, m).ok_or_else(|| bad("ridge system is not positive definite".into()))?;
        let mut w = vec![0.0f32; n_experts * m];
        let mut col = vec![0.0f64; m];
        for e in 0..n_experts {
            for i in 0..m {
                col[i] = xty[i * n_experts + e];
            }
            chol_solve(&l, m, &mut col);
            for i in 0..m {
                w[e * m + i] = col[i] as f32;
            }
        }
        Ok(Self { dim, n_experts, w })
    }

    /// Input dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// A score per expert for hidden state `h` (`dim` values).
    pub fn scores(&self, h: &[f32]) -> Vec<f32> {
        let m = self.dim + 1;
        (0..self.n_experts)
            .map(|e| {
                let row = &self.w[e * m..(e + 1) * m];
                row[..self.dim]
                    .iter()
                    .zip(h)
                    .map(|(a, b)| a * b)
                    .sum::<f32>()
                    + row[self.dim]
            })
            .collect()
    }

    /// The `k` best-scored experts, best first (ties by lower id).
    pub fn top(&self, h: &[f32], k: usize) -> Vec<u32> {
        let s = self.scores(h);
        let mut ids: Vec<u32> = (0..self.n_experts as u32).collect();
        ids.sort_by(|&a, &b| s[b as usize].total_cmp(&s[a as usize]).then(a.cmp(&b)));
        ids.truncate(k);
        ids
    }

    /// Mean fraction of each sample's experts found in the predicted top `k`.
    pub fn accuracy(&self, samples: &[(&[f32], &[u32])], k: usize) -> f64 {
        if samples.is_empty() {
            return 0.0;
        }
        let mut acc = 0.0;
        for (h, ids) in samples {
            let p = self.top(h, k);
            let hit = ids.iter().filter(|e| p.contains(e)).count();
            acc += hit as f64 / ids.len().max(1) as f64;
        }
        acc / samples.len() as f64
    }
}

/// TriMoE's expert load predictor: per MoE layer and expert, an exponential moving average
/// of the tokens routed to it per step, `EMA(t) = alpha F(t) + (1 - alpha) EMA(t - 1)`
/// (seed 000 eq. 8, `alpha = 0.3`).
///
/// A layer's first observation sets its average directly (an average started at zero
/// would predict every expert cold for the first steps), unless the predictor was seeded
/// with an offline profile.
#[derive(Debug, Clone, PartialEq)]
pub struct EmaPredictor {
    alpha: f64,
    /// `[layer][expert]`: predicted tokens per step.
    ema: Vec<Vec<f64>>,
    /// `[layer]`: has a value (observed or profiled).
    seeded: Vec<bool>,
}

impl EmaPredictor {
    /// The paper's smoothing factor.
    pub const ALPHA: f64 = 0.3;

    /// A predictor with no history for `layers` layers of `experts` experts.
    pub fn new(alpha: f64, layers: usize, experts: usize) -> Self {
        Self {
            alpha: alpha.clamp(0.0, 1.0),
            ema: vec![vec![0.0; experts]; layers],
            seeded: vec![false; layers],
        }
    }

    /// A predictor starting from an offline profile, `[layer][expert]` tokens per step.
    pub fn from_profile(alpha: f64, profile: Vec<Vec<f64>>) -> Self {
        let seeded = vec![true; profile.len()];
        Self {
            alpha: alpha.clamp(0.0, 1.0),
            ema: profile,
            seeded,
        }
    }

    /// Folds in one step's observed tokens per expert of `layer` (`loads[e]`); layers or
    /// experts beyond the predictor's shape grow it.
    pub fn update(&mut self, layer: usize, loads: &[u32]) {
        if self.ema.len() <= layer {
            self.ema.resize(layer + 1, Vec::new());
            self.seeded.resize(layer + 1, false);
        }
        let row = &mut self.ema[layer];
        if row.len() < loads.len() {
            row.resize(loads.len(), 0.0);
        }
        let a = if self.seeded[layer] { self.alpha } else { 1.0 };
        for (m, &f) in row.iter_mut().zip(loads) {
            *m = a * f as f64 + (1.0 - a) * *m;
        }
        self.seeded[layer] = true;
    }

    /// Predicted tokens per expert of `layer` at the next step (empty if never seen).
    pub fn predicted(&self, layer: usize) -> &[f64] {
        self.ema.get(layer).map_or(&[], |r| r.as_slice())
    }
}

/// Lower-triangular Cholesky factor of the `m x m` matrix `a`, or `None` if not SPD.
fn cholesky(a: &[f64], m: usize) -> Option<Vec<f64>> {
    let mut l = vec![0.0f64; m * m];
    for i in 0..m {
        for j in 0..=i {
            let mut s = a[i * m + j];
            for k in 0..j {
                s -= l[i * m + k] * l[j * m + k];
            }
            if i == j {
                if s <= 0.0 {
                    return None;
                }
                l[i * m + i] = s.sqrt();
            } else {
                l[i * m + j] = s / l[j * m + j];
            }
        }
    }
    Some(l)
}

/// Solves `L L' x = b` in place.
fn chol_solve(l: &[f64], m: usize, b: &mut [f64]) {
    for i in 0..m {
        let mut s = b[i];
        for k in 0..i {
            s -= l[i * m + k] * b[k];
        }
        b[i] = s / l[i * m + i];
    }
    for i in (0..m).rev() {
        let mut s = b[i];
        for k in i + 1..m {
            s -= l[k * m + i] * b[k];
        }
        b[i] = s / l[i * m + i];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_a_linear_mapping() {
        // Expert e is "on" when h[e % 4] is large: a linear predictor must rank it first.
        let mut hs = Vec::new();
        let mut ys = Vec::new();
        for s in 0..64u32 {
            let hot = s % 4;
            let mut h = vec![0.1f32; 4];
            h[hot as usize] = 1.0;
            hs.push(h);
            ys.push(vec![hot, hot + 4]);
        }
        let samples: Vec<(&[f32], &[u32])> = hs
            .iter()
            .zip(&ys)
            .map(|(h, y)| (h.as_slice(), y.as_slice()))
            .collect();
        let p = LinearPredictor::train(&samples, 4, 8, 1e-3).unwrap();
        let mut top = p.top(&hs[2], 2);
        top.sort();
        assert_eq!(top, vec![2, 6]);
        assert!((p.accuracy(&samples, 2) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn ema_follows_eq_8() {
        let mut p = EmaPredictor::new(EmaPredictor::ALPHA, 1, 3);
        assert_eq!(p.predicted(0), &[0.0, 0.0, 0.0]);
        assert!(p.predicted(5).is_empty());
        // The first step sets the average, later steps blend with alpha = 0.3.
        p.update(0, &[10, 0, 4]);
        assert_eq!(p.predicted(0), &[10.0, 0.0, 4.0]);
        p.update(0, &[0, 10, 4]);
        let want = [7.0, 3.0, 4.0];
        for (g, w) in p.predicted(0).iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "{g} vs {w}");
        }
        // A constant load is a fixed point; a step change converges geometrically.
        for _ in 0..40 {
            p.update(0, &[0, 10, 4]);
        }
        assert!(p.predicted(0)[0] < 1e-5 && (p.predicted(0)[1] - 10.0).abs() < 1e-5);
        assert!((p.predicted(0)[2] - 4.0).abs() < 1e-12);
        // A profile-seeded layer blends from the first observation; new layers grow.
        let mut q = EmaPredictor::from_profile(0.3, vec![vec![10.0, 0.0]]);
        q.update(0, &[0, 0]);
        assert!((q.predicted(0)[0] - 7.0).abs() < 1e-12);
        q.update(2, &[5]);
        assert_eq!(q.predicted(2), &[5.0]);
    }

    #[test]
    fn rejects_bad_samples() {
        let h = [1.0f32, 2.0];
        assert!(LinearPredictor::train(&[], 2, 4, 1.0).is_err());
        assert!(LinearPredictor::train(&[(&h[..], &[9][..])], 2, 4, 1.0).is_err());
        assert!(LinearPredictor::train(&[(&h[..1], &[1][..])], 2, 4, 1.0).is_err());
    }
}
