//! Workloads: the routing of every token at every MoE layer, step by step, from a recorded
//! trace or from a synthetic generator.
//!
//! Key types: [`Workload`] (steps of one or more requests), [`Step`], [`LayerRouting`],
//! [`SyntheticParams`]. The generator draws each token's experts from a per-layer Zipf
//! popularity whose exponent grows linearly with depth (deeper layers more skewed, seed 004
//! figure 5), keeps each of the previous token's experts with probability `persistence`
//! (token-to-token patterns, seed 004 figure 6), and gives each token a router-input hidden
//! state `h = sum_j w_j E[id_j] + noise` so a linear predictor has something real to learn.
//!
//! A key design decision: the defaults are calibrated against the seeds' statistics and
//! checked by a test (`synthetic_matches_the_seed_statistics`): in the deepest layer the
//! coldest 70% of experts take about 10% of activations and the hottest 30% most of the
//! rest (seed 000 figure 3), and the shallowest layer is close to uniform.

use strata_policy::Phase;

use strata_policy::rng::SplitMix;

/// One MoE layer's routing in one step.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerRouting {
    /// Chosen experts `[tokens * top_k]`, each token's in descending weight order.
    pub ids: Vec<u32>,
    /// Their weights.
    pub weights: Vec<f32>,
    /// Router input `[tokens * hidden_dim]`, when recorded.
    pub hidden: Option<Vec<f32>>,
    /// The router's best-scored experts per token, when recorded (trace version 2).
    pub candidates: Option<Candidates>,
}

/// Each token's `per_token` best-scored experts with their router scores, best first.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidates {
    /// Candidates per token.
    pub per_token: usize,
    /// Expert ids `[tokens * per_token]`.
    pub ids: Vec<u32>,
    /// Router scores `[tokens * per_token]`.
    pub scores: Vec<f32>,
}

/// One forward pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Request (sequence) it belongs to.
    pub request: usize,
    /// Prefill or decode.
    pub phase: Phase,
    /// New tokens.
    pub tokens: usize,
    /// Tokens already in the KV cache.
    pub context: usize,
    /// Per MoE layer.
    pub layers: Vec<LayerRouting>,
}

/// A whole run's routing.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// Routed experts per layer.
    pub n_experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Width of the recorded hidden states (0: none).
    pub hidden_dim: usize,
    /// Steps in order.
    pub steps: Vec<Step>,
}

impl Workload {
    /// MoE layers.
    pub fn moe_layers(&self) -> usize {
        self.steps.first().map_or(0, |s| s.layers.len())
    }

    /// Activation counts `[layer][expert]` over all steps (a profile, as Fiddler uses).
    pub fn profile(&self) -> Vec<Vec<u64>> {
        let mut p = vec![vec![0u64; self.n_experts]; self.moe_layers()];
        for s in &self.steps {
            for (l, r) in s.layers.iter().enumerate() {
                for &e in &r.ids {
                    if let Some(c) = p[l].get_mut(e as usize) {
                        *c += 1;
                    }
                }
            }
        }
        p
    }

    /// Predictor training pairs per layer: (mean hidden state of a decode step, experts of
    /// the request's next decode step).
    pub fn predictor_samples(&self) -> Vec<Vec<(Vec<f32>, Vec<u32>)>> {
        let mut out = vec![Vec::new(); self.moe_layers()];
        if self.hidden_dim == 0 {
            return out;
        }
        let d = self.hidden_dim;
        for pair in self.steps.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            if a.request != b.request || a.phase != Phase::Decode || b.phase != Phase::Decode {
                continue;
            }
            for (l, (ra, rb)) in a.layers.iter().zip(&b.layers).enumerate() {
                let Some(h) = &ra.hidden else { continue };
                let mut mean = vec![0.0f32; d];
                let rows = (h.len() / d).max(1);
                for row in h.chunks_exact(d) {
                    for (m, x) in mean.iter_mut().zip(row) {
                        *m += x / rows as f32;
                    }
                }
                let mut ids = rb.ids.clone();
                ids.sort_unstable();
                ids.dedup();
                out[l].push((mean, ids));
            }
        }
        out
    }
}

/// Parameters of the synthetic routing generator.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticParams {
    /// MoE layers.
    pub moe_layers: usize,
    /// Routed experts per layer.
    pub n_experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Zipf exponent of expert popularity at the first MoE layer.
    pub skew_first: f64,
    /// Zipf exponent at the last MoE layer (linear in between).
    pub skew_last: f64,
    /// Probability that each of a token's experts is chosen again by the next token.
    pub persistence: f64,
    /// Width of the synthetic hidden states (0: none).
    pub hidden_dim: usize,
    /// Standard deviation of the hidden-state noise relative to the signal.
    pub noise: f64,
    /// Requests, each a prefill then decode steps.
    pub requests: usize,
    /// Prompt tokens per request.
    pub prompt_tokens: usize,
    /// Decode steps per request.
    pub decode_tokens: usize,
    /// Seed of the popularity (the "model"): keep it fixed to draw new prompts from the
    /// same model.
    pub model_seed: u64,
    /// Seed of the token draws.
    pub seed: u64,
}

impl SyntheticParams {
    /// Defaults calibrated to the seeds for a model of this shape.
    pub fn calibrated(moe_layers: usize, n_experts: usize, top_k: usize) -> Self {
        Self {
            moe_layers,
            n_experts,
            top_k,
            skew_first: 0.2,
            skew_last: 1.2,
            persistence: 0.5,
            hidden_dim: n_experts.clamp(16, 256),
            noise: 0.3,
            requests: 1,
            prompt_tokens: 32,
            decode_tokens: 32,
            model_seed: 1,
            seed: 2,
        }
    }
}

/// The synthetic "model": per-layer popularity and hidden-state embeddings.
struct SynthModel {
    /// `[layer]`: cumulative popularity over experts.
    cdf: Vec<Vec<f64>>,
    /// `[layer][expert * dim]`.
    embed: Vec<Vec<f32>>,
}

impl SynthModel {
    fn new(p: &SyntheticParams) -> Self {
        let mut rng = SplitMix::new(p.model_seed);
        let mut cdf = Vec::new();
        let mut embed = Vec::new();
        for l in 0..p.moe_layers {
            let frac = if p.moe_layers > 1 {
                l as f64 / (p.moe_layers - 1) as f64
            } else {
                1.0
            };
            let s = p.skew_first + (p.skew_last - p.skew_first) * frac;
            let mut perm: Vec<usize> = (0..p.n_experts).collect();
            for i in (1..perm.len()).rev() {
                perm.swap(i, rng.below(i + 1));
            }
            let mut w = vec![0.0; p.n_experts];
            for (rank, &e) in perm.iter().enumerate() {
                w[e] = 1.0 / ((rank + 1) as f64).powf(s);
            }
            let total: f64 = w.iter().sum();
            let mut acc = 0.0;
            cdf.push(
                w.iter()
                    .map(|x| {
                        acc += x / total;
                        acc
                    })
                    .collect(),
            );
            let scale = 1.0 / (p.hidden_dim.max(1) as f64).sqrt();
            embed.push(
                (0..p.n_experts * p.hidden_dim)
                    .map(|_| (rng.normal() * scale) as f32)
                    .collect(),
            );
        }
        Self { cdf, embed }
    }

    fn draw(&self, layer: usize, rng: &mut SplitMix) -> u32 {
        let c = &self.cdf[layer];
        let u = rng.uniform() * c.last().copied().unwrap_or(1.0);
        c.partition_point(|&x| x < u).min(c.len() - 1) as u32
    }
}

/// Generates a workload: per request one prefill step of `prompt_tokens`, then
/// `decode_tokens` single-token steps.
pub fn synthetic(p: &SyntheticParams) -> Workload {
    let model = SynthModel::new(p);
    let mut rng = SplitMix::new(p.seed);
    let k = p.top_k.min(p.n_experts);
    let d = p.hidden_dim;
    let mut steps = Vec::new();
    for request in 0..p.requests {
        let mut prev: Vec<Vec<u32>> = vec![Vec::new(); p.moe_layers];
        let token = |rng: &mut SplitMix, prev: &mut Vec<Vec<u32>>, out: &mut [LayerRouting]| {
            for (l, lr) in out.iter_mut().enumerate() {
                let mut ids: Vec<u32> = prev[l]
                    .iter()
                    .copied()
                    .filter(|_| rng.uniform() < p.persistence)
                    .collect();
                while ids.len() < k {
                    let e = model.draw(l, rng);
                    if !ids.contains(&e) {
                        ids.push(e);
                    }
                }
                let mut w: Vec<f32> = (0..k)
                    .map(|_| (-rng.uniform().max(1e-12).ln()) as f32)
                    .collect();
                w.sort_by(|a, b| b.total_cmp(a));
                let sum: f32 = w.iter().sum();
                w.iter_mut().for_each(|x| *x /= sum);
                if d > 0 {
                    let h = lr.hidden.get_or_insert_with(Vec::new);
                    let base = h.len();
                    h.resize(base + d, 0.0);
                    for (&e, &we) in ids.iter().zip(&w) {
                        let row = &model.embed[l][e as usize * d..(e as usize + 1) * d];
                        for (x, r) in h[base..].iter_mut().zip(row) {
                            *x += we * r;
                        }
                    }
                    let s = p.noise / (d as f64).sqrt();
                    for x in &mut h[base..] {
                        *x += (rng.normal() * s) as f32;
                    }
                }
                lr.ids.extend_from_slice(&ids);
                lr.weights.extend_from_slice(&w);
                prev[l] = ids;
            }
        };
        let empty = || LayerRouting {
            ids: Vec::new(),
            weights: Vec::new(),
            hidden: None,
            candidates: None,
        };
        let mut layers: Vec<LayerRouting> = (0..p.moe_layers).map(|_| empty()).collect();
        for _ in 0..p.prompt_tokens {
            token(&mut rng, &mut prev, &mut layers);
        }
        if p.prompt_tokens > 0 {
            steps.push(Step {
                request,
                phase: Phase::Prefill,
                tokens: p.prompt_tokens,
                context: 0,
                layers,
            });
        }
        for i in 0..p.decode_tokens {
            let mut layers: Vec<LayerRouting> = (0..p.moe_layers).map(|_| empty()).collect();
            token(&mut rng, &mut prev, &mut layers);
            steps.push(Step {
                request,
                phase: Phase::Decode,
                tokens: 1,
                context: p.prompt_tokens + i,
                layers,
            });
        }
    }
    Workload {
        n_experts: p.n_experts,
        top_k: k,
        hidden_dim: d,
        steps,
    }
}
