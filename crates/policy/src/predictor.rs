//! SMoE's token-wise expert predictor: per MoE layer, a linear map from the router input
//! hidden state at token `t` to the experts that layer picks at token `t + 1`.
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
    fn rejects_bad_samples() {
        let h = [1.0f32, 2.0];
        assert!(LinearPredictor::train(&[], 2, 4, 1.0).is_err());
        assert!(LinearPredictor::train(&[(&h[..], &[9][..])], 2, 4, 1.0).is_err());
        assert!(LinearPredictor::train(&[(&h[..1], &[1][..])], 2, 4, 1.0).is_err());
    }
}
