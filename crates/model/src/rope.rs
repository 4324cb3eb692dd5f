//! Rotary position embedding: frequencies (default, linear, Llama 3, YaRN) and their
//! application in NEOX (half-split) or interleaved (pairwise) style.
//!
//! Frequencies are computed the way transformers computes them (in f32 after an f64 power),
//! so angles at large positions round the same way as the reference.

use crate::config::{RopeConfig, RopeScaling, RopeStyle};

/// Precomputed inverse frequencies and the cos/sin scale of one model's rotary embedding.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
    /// Factor on cos and sin (YaRN's attention temperature; 1 otherwise).
    attention_factor: f32,
    style: RopeStyle,
    dim: usize,
}

impl Rope {
    /// Builds the frequencies for `cfg`.
    pub fn new(cfg: &RopeConfig) -> Rope {
        let dim = cfg.dim;
        let base: Vec<f32> = (0..dim / 2)
            .map(|i| 1.0 / (cfg.theta.powf((2 * i) as f64 / dim as f64) as f32))
            .collect();
        let mut attention_factor = 1.0f32;
        let inv_freq = match &cfg.scaling {
            RopeScaling::None => base,
            RopeScaling::Linear { factor } => base.iter().map(|f| f / *factor as f32).collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old,
            } => {
                let (factor, low, high, old) = (
                    *factor as f32,
                    *low_freq_factor as f32,
                    *high_freq_factor as f32,
                    *old as f32,
                );
                let low_wavelen = old / low;
                let high_wavelen = old / high;
                base.iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f32::consts::PI / f;
                        if wavelen > low_wavelen {
                            f / factor
                        } else if wavelen < high_wavelen {
                            f
                        } else {
                            let smooth = (old / wavelen - low) / (high - low);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: old,
                beta_fast,
                beta_slow,
                attention_factor: af,
                truncate,
                ..
            } => {
                attention_factor = *af as f32;
                let d = dim as f64;
                let correction_dim = |rot: f64| {
                    d * (old / (rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * cfg.theta.ln())
                };
                let (mut low, mut high) = (correction_dim(*beta_fast), correction_dim(*beta_slow));
                if *truncate {
                    low = low.floor();
                    high = high.ceil();
                }
                let low = low.max(0.0);
                let mut high = high.min(d - 1.0);
                if low == high {
                    high += 0.001;
                }
                base.iter()
                    .enumerate()
                    .map(|(i, &extrapolation)| {
                        let interpolation = extrapolation / *factor as f32;
                        let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0) as f32;
                        let extrapolation_factor = 1.0 - ramp;
                        interpolation * (1.0 - extrapolation_factor)
                            + extrapolation * extrapolation_factor
                    })
                    .collect()
            }
        };
        Rope {
            inv_freq,
            attention_factor,
            style: cfg.style,
            dim,
        }
    }

    /// Number of rotated dimensions.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Fills `cos` and `sin` (each `dim / 2` long) for position `pos`.
    pub fn cos_sin(&self, pos: usize, cos: &mut [f32], sin: &mut [f32]) {
        for (i, &f) in self.inv_freq.iter().enumerate() {
            let angle = pos as f32 * f;
            cos[i] = angle.cos() * self.attention_factor;
            sin[i] = angle.sin() * self.attention_factor;
        }
    }

    /// Rotates the first `dim` values of `x` (one head) in place.
    pub fn apply(&self, x: &mut [f32], cos: &[f32], sin: &[f32]) {
        let half = self.dim / 2;
        match self.style {
            RopeStyle::Neox => {
                for i in 0..half {
                    let (a, b) = (x[i], x[i + half]);
                    x[i] = a * cos[i] - b * sin[i];
                    x[i + half] = b * cos[i] + a * sin[i];
                }
            }
            RopeStyle::Interleaved => {
                for i in 0..half {
                    let (a, b) = (x[2 * i], x[2 * i + 1]);
                    x[2 * i] = a * cos[i] - b * sin[i];
                    x[2 * i + 1] = b * cos[i] + a * sin[i];
                }
            }
        }
    }
}
