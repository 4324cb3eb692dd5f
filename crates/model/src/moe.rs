//! Feed-forward blocks: the dense SwiGLU MLP and the mixture-of-experts block with its
//! router variants (softmax or sigmoid scores, bias-corrected and group-limited selection,
//! renormalisation and scaling) and shared experts.
//!
//! A key design decision made here is that routing ([`route`]) is a pure function of the
//! router logits, separate from expert execution ([`MoeBlock::run_experts`]): placement
//! policies, traces and the simulator consume the same routing the forward pass uses.
//! Where the routed experts run is not decided here either: a block with an
//! [`ExpertExecutor`] installed ([`MoeBlock::set_executor`]) hands each step's routing to it
//! (the hybrid CPU/GPU executor of `strata-exec`); without one it runs the fused CPU path.

use std::fmt;
use std::sync::Arc;

use strata_kernels::ggml::{GgmlExperts, fused_moe_ggml};
use strata_kernels::moe::{ExpertBatch, MoeOptions, fused_moe_grouped, group_by_expert};
use strata_kernels::{Expert, MoeExperts, PackedFormat, dense_mlp, fused_moe};

use crate::Result;
use crate::attention::SeqSpan;
use crate::config::{GroupScore, MoeConfig, RouterConfig, Scoring};
use crate::linear::{Linear, Loader};
use crate::ops::{sigmoid, silu_mul};

/// `down(silu(gate(x)) * up(x))`.
#[derive(Debug)]
pub struct Mlp {
    /// Gate projection `[inter, hidden]`.
    pub gate: Linear,
    /// Up projection `[inter, hidden]`.
    pub up: Linear,
    /// Down projection `[hidden, inter]`.
    pub down: Linear,
}

impl Mlp {
    /// Loads `{prefix}.{gate,up,down}_proj` as a dense layer.
    pub fn load(ld: &Loader, prefix: &str, hidden: usize, inter: usize) -> Result<Mlp> {
        Ok(Mlp {
            gate: ld.linear(&format!("{prefix}.gate_proj"), inter, hidden, false)?,
            up: ld.linear(&format!("{prefix}.up_proj"), inter, hidden, false)?,
            down: ld.linear(&format!("{prefix}.down_proj"), hidden, inter, false)?,
        })
    }

    /// Loads a routed expert `{prefix}.{gate,up,down}` (names given) in the expert format.
    fn load_expert(
        ld: &Loader,
        prefix: &str,
        names: [&str; 3],
        hidden: usize,
        inter: usize,
    ) -> Result<Mlp> {
        Ok(Mlp {
            gate: ld.expert_linear(&format!("{prefix}.{}", names[0]), inter, hidden)?,
            up: ld.expert_linear(&format!("{prefix}.{}", names[1]), inter, hidden)?,
            down: ld.expert_linear(&format!("{prefix}.{}", names[2]), hidden, inter)?,
        })
    }

    /// `x: [m, hidden]` -> `[m, hidden]`.
    pub fn forward(&self, x: &[f32], m: usize) -> Vec<f32> {
        let mut g = self.gate.forward(x, m);
        let u = self.up.forward(x, m);
        silu_mul(&mut g, &u);
        self.down.forward(&g, m)
    }

    /// Parameter count.
    pub fn params(&self) -> usize {
        [&self.gate, &self.up, &self.down]
            .iter()
            .map(|l| l.n_out * l.k_in)
            .sum()
    }

    /// Bytes of weights.
    pub fn weight_bytes(&self) -> usize {
        self.gate.weight_bytes() + self.up.weight_bytes() + self.down.weight_bytes()
    }
}

/// SwiGLU MLPs of one shape (routed experts, or a single dense MLP / shared expert) in
/// one of the engine's executable forms.
#[derive(Debug)]
pub enum ExpertSet {
    /// Plain matmuls per expert: the f32 reference path.
    Plain(Vec<Mlp>),
    /// Packed for the fused CPU MoE kernel (BF16, INT8 or INT4).
    Packed(MoeExperts),
    /// ggml blocks read in place by the fused ggml MoE kernel (a GGUF's experts).
    Ggml(GgmlExperts),
}

impl ExpertSet {
    /// Keeps `mlps` as they are (`fmt` is `None`) or packs them, dropping the originals.
    /// MLPs whose weights are all ggml blocks become a [`ExpertSet::Ggml`] set whatever
    /// `fmt` says: their kernels read the blocks in place.
    pub fn new(
        mlps: Vec<Mlp>,
        hidden: usize,
        inter: usize,
        fmt: Option<PackedFormat>,
    ) -> Result<ExpertSet> {
        let blocks = |f: fn(&Mlp) -> &Linear| mlps.iter().map(|m| f(m).ggml().cloned()).collect();
        let (gate, up, down): (Option<Vec<_>>, Option<Vec<_>>, Option<Vec<_>>) =
            (blocks(|m| &m.gate), blocks(|m| &m.up), blocks(|m| &m.down));
        if let (Some(gate), Some(up), Some(down)) = (gate, up, down)
            && !mlps.is_empty()
        {
            return Ok(ExpertSet::Ggml(GgmlExperts::new(
                gate, up, down, hidden, inter,
            )?));
        }
        let Some(fmt) = fmt else {
            return Ok(ExpertSet::Plain(mlps));
        };
        let packed = mlps
            .iter()
            .map(
                |m| match (m.gate.bf16_slice(), m.up.bf16_slice(), m.down.bf16_slice()) {
                    (Some(g), Some(u), Some(d)) => Expert::pack(g, u, d, hidden, inter, fmt),
                    _ => Expert::pack(
                        &m.gate.weight_f32(),
                        &m.up.weight_f32(),
                        &m.down.weight_f32(),
                        hidden,
                        inter,
                        fmt,
                    ),
                },
            )
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ExpertSet::Packed(MoeExperts::new(hidden, inter, packed)?))
    }

    /// Number of MLPs.
    pub fn len(&self) -> usize {
        match self {
            ExpertSet::Plain(v) => v.len(),
            ExpertSet::Packed(p) => p.len(),
            ExpertSet::Ggml(g) => g.len(),
        }
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of weights (packed bytes include scales).
    pub fn weight_bytes(&self) -> usize {
        match self {
            ExpertSet::Plain(v) => v.iter().map(Mlp::weight_bytes).sum(),
            ExpertSet::Packed(p) => p.experts().iter().map(|e| e.bytes()).sum(),
            ExpertSet::Ggml(g) => g.bytes(),
        }
    }

    /// Weighted sum of the routed experts' outputs for `x: [T, hidden]`, `[T, hidden]`.
    pub fn run(&self, x: &[f32], routing: &Routing) -> Result<Vec<f32>> {
        let t = routing.tokens();
        let hidden = x.len() / t.max(1);
        let mut out = vec![0.0f32; x.len()];
        match self {
            ExpertSet::Packed(p) => fused_moe(p, x, &routing.ids, &routing.weights, &mut out)?,
            ExpertSet::Ggml(g) => {
                let batches =
                    group_by_expert(g.len(), &routing.ids, &routing.weights, routing.top_k)?;
                fused_moe_ggml(g, x, &batches, &mut out, &MoeOptions::default())?;
            }
            ExpertSet::Plain(experts) => {
                let k = routing.top_k;
                let mut rows_of: Vec<Vec<(usize, f32)>> = vec![Vec::new(); experts.len()];
                for (i, (&e, &w)) in routing.ids.iter().zip(&routing.weights).enumerate() {
                    rows_of[e as usize].push((i / k, w));
                }
                for (expert, rows) in experts.iter().zip(&rows_of) {
                    if rows.is_empty() {
                        continue;
                    }
                    let mut xs = Vec::with_capacity(rows.len() * hidden);
                    for &(r, _) in rows {
                        xs.extend_from_slice(&x[r * hidden..(r + 1) * hidden]);
                    }
                    let y = expert.forward(&xs, rows.len());
                    for (&(r, w), yr) in rows.iter().zip(y.chunks_exact(hidden)) {
                        for (o, v) in out[r * hidden..(r + 1) * hidden].iter_mut().zip(yr) {
                            *o += w * v;
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Adds `Σ w · expert(x[row])` over the given (expert, rows, weights) `batches` into
    /// `out: [T, hidden]`: the CPU's share of a step whose experts are split across devices.
    pub fn run_batches(&self, x: &[f32], batches: &[ExpertBatch], out: &mut [f32]) -> Result<()> {
        match self {
            ExpertSet::Packed(p) => {
                let opts = MoeOptions {
                    accumulate: true,
                    ..MoeOptions::default()
                };
                fused_moe_grouped(p, x, batches, out, &opts)?;
            }
            ExpertSet::Ggml(g) => {
                let opts = MoeOptions {
                    accumulate: true,
                    ..MoeOptions::default()
                };
                fused_moe_ggml(g, x, batches, out, &opts)?;
            }
            ExpertSet::Plain(experts) => {
                let hidden = experts.first().map_or(0, |m| m.gate.k_in);
                let t = x.len() / hidden.max(1);
                if out.len() != x.len() {
                    return Err(crate::Error::Input(format!(
                        "expert output has {} values, expected {} like the input",
                        out.len(),
                        x.len()
                    )));
                }
                for b in batches {
                    let expert = experts.get(b.expert).ok_or_else(|| {
                        crate::Error::Input(format!(
                            "expert {} routed, expected below {}",
                            b.expert,
                            experts.len()
                        ))
                    })?;
                    if let Some(&r) = b.tokens.iter().find(|&&r| r as usize >= t) {
                        return Err(crate::Error::Input(format!(
                            "token {r} routed to expert {}, expected below {t}",
                            b.expert
                        )));
                    }
                    let mut xs = Vec::with_capacity(b.tokens.len() * hidden);
                    for &r in &b.tokens {
                        let r = r as usize;
                        xs.extend_from_slice(&x[r * hidden..(r + 1) * hidden]);
                    }
                    let y = expert.forward(&xs, b.tokens.len());
                    for ((&r, &w), yr) in
                        b.tokens.iter().zip(&b.weights).zip(y.chunks_exact(hidden))
                    {
                        let r = r as usize;
                        for (o, v) in out[r * hidden..(r + 1) * hidden].iter_mut().zip(yr) {
                            *o += w * v;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Every token of `x: [T, hidden]` through MLP 0 (a dense MLP or shared expert).
    pub fn dense(&self, x: &[f32], t: usize) -> Result<Vec<f32>> {
        match self {
            ExpertSet::Plain(v) => Ok(v[0].forward(x, t)),
            ExpertSet::Packed(p) => {
                let mut out = vec![0.0f32; x.len()];
                dense_mlp(p, x, &mut out, false)?;
                Ok(out)
            }
            ExpertSet::Ggml(g) => {
                let all = ExpertBatch {
                    expert: 0,
                    tokens: (0..t as u32).collect(),
                    weights: vec![1.0; t],
                };
                let mut out = vec![0.0f32; x.len()];
                fused_moe_ggml(g, x, &[all], &mut out, &MoeOptions::default())?;
                Ok(out)
            }
        }
    }
}

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

/// Indices of the `k` largest values, largest first (ties to the lower index).
fn top_indices(v: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[b].total_cmp(&v[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// One MoE layer's routed-expert work of one forward pass, handed to an [`ExpertExecutor`].
#[derive(Debug, Clone, Copy)]
pub struct ExpertCall<'a> {
    /// Index of the block among the model's MoE layers (`0..n_moe_layers`).
    pub moe_layer: usize,
    /// Router input hidden states `[T, hidden]` of the routed tokens.
    pub x: &'a [f32],
    /// The routing of every token.
    pub routing: &'a Routing,
    /// The block's routed experts in the CPU's executable form.
    pub experts: &'a ExpertSet,
    /// The batch layout of the forward pass: each sequence's rows and the position of its
    /// first new token. Empty when the block runs outside a model's forward pass.
    pub spans: &'a [SeqSpan],
}

impl ExpertCall<'_> {
    /// Sequences with tokens in this step.
    pub fn n_seqs(&self) -> usize {
        self.spans.iter().filter(|s| s.len > 0).count()
    }

    /// Whether this step decodes: every sequence in it adds exactly one token after tokens
    /// already in its cache. `None` when the batch layout is unknown (empty
    /// [`ExpertCall::spans`]). A step that mixes decodes with prompt chunks is not a decode.
    pub fn is_decode(&self) -> Option<bool> {
        let mut seqs = self.spans.iter().filter(|s| s.len > 0).peekable();
        seqs.peek()?;
        Some(seqs.all(|s| s.len == 1 && s.start_pos > 0))
    }
}

/// Computes the routed experts of MoE blocks in place of the fused CPU path: given the
/// routing of a step it decides nothing itself but may run pieces on other devices, defer
/// some outputs to a later layer, and so on.
pub trait ExpertExecutor: Send + Sync + fmt::Debug {
    /// Adds the routed experts' weighted outputs of `call` into `out: [T, hidden]` (zeroed
    /// by the caller).
    fn run(&self, call: ExpertCall<'_>, out: &mut [f32]) -> Result<()>;
}

/// A mixture-of-experts feed-forward block.
#[derive(Debug)]
pub struct MoeBlock {
    /// Configuration.
    pub cfg: MoeConfig,
    router: Linear,
    correction_bias: Option<Vec<f32>>,
    /// Routed experts.
    pub experts: ExpertSet,
    shared: Option<ExpertSet>,
    shared_gate: Option<Linear>,
    /// Parameters of one routed expert.
    expert_params: usize,
    /// Best-scored experts per token to keep in the routing (0: none).
    n_candidates: usize,
    /// Where the routed experts run, with this block's MoE layer index; `None`: the CPU.
    executor: Option<(usize, Arc<dyn ExpertExecutor>)>,
}

impl MoeBlock {
    /// Loads the block of layer `layer`; `mlp` is `model.layers.N.mlp` (or
    /// `block_sparse_moe` for Mixtral checkpoints). Experts may be stored one tensor per
    /// expert (`experts.E.gate_proj`, or Mixtral's `w1/w3/w2`) or stacked
    /// (`experts.gate_up_proj: [E, 2I, H]`, `experts.down_proj: [E, H, I]`).
    pub fn load(ld: &Loader, mlp: &str, cfg: &MoeConfig, hidden: usize) -> Result<MoeBlock> {
        let n = cfg.router.n_experts;
        let inter = cfg.intermediate;
        let router = ld.linear_f32(&format!("{mlp}.gate"), n, hidden)?;
        let correction_bias = if cfg.router.correction_bias {
            Some(ld.f32(&format!("{mlp}.gate.e_score_correction_bias"), &[n])?)
        } else {
            None
        };
        let stacked = format!("{mlp}.experts.gate_up_proj");
        let load = || -> Result<Vec<Mlp>> {
            Ok(if ld.has(&stacked) {
                let gu = ld.tensor(&stacked)?;
                gu.expect_shape(&[n, 2 * inter, hidden])?;
                let down = ld.tensor(&format!("{mlp}.experts.down_proj"))?;
                down.expect_shape(&[n, hidden, inter])?;
                (0..n)
                    .map(|e| {
                        Ok(Mlp {
                            gate: ld.linear_from(&gu, e * 2 * inter, inter, hidden, None, true)?,
                            up: ld.linear_from(
                                &gu,
                                e * 2 * inter + inter,
                                inter,
                                hidden,
                                None,
                                true,
                            )?,
                            down: ld.linear_from(&down, e * hidden, hidden, inter, None, true)?,
                        })
                    })
                    .collect::<Result<Vec<_>>>()?
            } else {
                // Mixtral checkpoints name the projections w1 (gate), w3 (up), w2 (down).
                let names = if ld.has(&format!("{mlp}.experts.0.w1.weight")) {
                    ["w1", "w3", "w2"]
                } else {
                    ["gate_proj", "up_proj", "down_proj"]
                };
                (0..n)
                    .map(|e| {
                        Mlp::load_expert(ld, &format!("{mlp}.experts.{e}"), names, hidden, inter)
                    })
                    .collect::<Result<Vec<_>>>()?
            })
        };
        let expert_params = 3 * hidden * inter;
        let experts = ld.expert_set(
            &format!("{mlp}.experts"),
            n,
            hidden,
            inter,
            ld.expert_format(),
            load,
        )?;
        let (shared, shared_gate) = match &cfg.shared {
            None => (None, None),
            Some(s) => {
                let name = if s.gated {
                    "shared_expert"
                } else {
                    "shared_experts"
                };
                let fmt = ld.dense_format(&format!("{mlp}.{name}.gate_proj.weight"));
                let prefix = format!("{mlp}.{name}");
                let load = || Ok(vec![Mlp::load(ld, &prefix, hidden, s.intermediate)?]);
                let set = ld.expert_set(&prefix, 1, hidden, s.intermediate, fmt, load)?;
                let gate = if s.gated {
                    Some(ld.linear_f32(&format!("{mlp}.shared_expert_gate"), 1, hidden)?)
                } else {
                    None
                };
                (Some(set), gate)
            }
        };
        Ok(MoeBlock {
            cfg: cfg.clone(),
            router,
            correction_bias,
            experts,
            shared,
            shared_gate,
            expert_params,
            n_candidates: 0,
            executor: None,
        })
    }

    /// Hands this block's routed experts to `executor` as MoE layer `moe_layer` (`None`:
    /// back to the fused CPU path).
    pub fn set_executor(&mut self, moe_layer: usize, executor: Option<Arc<dyn ExpertExecutor>>) {
        self.executor = executor.map(|e| (moe_layer, e));
    }

    /// Keeps each token's `n` best-scored experts in the routing this block returns
    /// ([`Routing::candidates`]; 0: none, the default).
    pub fn set_candidates(&mut self, n: usize) {
        self.n_candidates = n;
    }

    /// Router decisions for `x: [T, hidden]` (router computed in f32).
    pub fn route(&self, x: &[f32], t: usize) -> Routing {
        let logits = self.router.forward(x, t);
        route_with_candidates(
            &self.cfg.router,
            &logits,
            self.correction_bias.as_deref(),
            self.n_candidates,
        )
    }

    /// Weighted sum of the routed experts' outputs, `[T, hidden]`, for a batch laid out as
    /// `spans` (which the executor sees; may be empty).
    pub fn run_experts(&self, x: &[f32], routing: &Routing, spans: &[SeqSpan]) -> Result<Vec<f32>> {
        let Some((moe_layer, exec)) = &self.executor else {
            return self.experts.run(x, routing);
        };
        let mut out = vec![0.0f32; x.len()];
        let call = ExpertCall {
            moe_layer: *moe_layer,
            x,
            routing,
            experts: &self.experts,
            spans,
        };
        exec.run(call, &mut out)?;
        Ok(out)
    }

    /// The whole block: routed experts plus shared experts, `[T, hidden]`.
    pub fn forward(&self, x: &[f32], t: usize) -> Result<Vec<f32>> {
        let routing = self.route(x, t);
        self.forward_routed(x, t, &routing, &[])
    }

    /// The whole block with the routing already decided (by [`MoeBlock::route`]), for a
    /// batch laid out as `spans` (may be empty: unknown).
    pub fn forward_routed(
        &self,
        x: &[f32],
        t: usize,
        routing: &Routing,
        spans: &[SeqSpan],
    ) -> Result<Vec<f32>> {
        let mut out = self.run_experts(x, routing, spans)?;
        if let Some(shared) = &self.shared {
            let y = shared.dense(x, t)?;
            let hidden = self.router.k_in;
            let gates = self.shared_gate.as_ref().map(|g| g.forward(x, t));
            for (r, (o, yr)) in out
                .chunks_exact_mut(hidden)
                .zip(y.chunks_exact(hidden))
                .enumerate()
            {
                let g = gates.as_ref().map_or(1.0, |g| sigmoid(g[r]));
                for (a, b) in o.iter_mut().zip(yr) {
                    *a += g * b;
                }
            }
        }
        Ok(out)
    }

    /// (total, active per token) parameters.
    pub fn params(&self) -> (usize, usize) {
        let per_expert = self.expert_params;
        let router = self.router.n_out * self.router.k_in;
        let shared = self
            .cfg
            .shared
            .as_ref()
            .map_or(0, |s| 3 * s.intermediate * self.router.k_in)
            + self.shared_gate.as_ref().map_or(0, |g| g.k_in);
        (
            router + shared + per_expert * self.experts.len(),
            router + shared + per_expert * self.cfg.router.top_k,
        )
    }

    /// Bytes of weights.
    pub fn weight_bytes(&self) -> usize {
        self.experts.weight_bytes()
            + self.shared.as_ref().map_or(0, ExpertSet::weight_bytes)
            + self.router.weight_bytes()
    }
}

/// A layer's feed-forward block.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // One per layer: the variants' sizes do not matter.
pub enum Ffn {
    /// Dense MLP (one MLP that every token goes through).
    Dense(ExpertSet),
    /// Mixture of experts.
    Moe(MoeBlock),
}

impl Ffn {
    /// `x: [T, hidden]` -> `[T, hidden]`.
    pub fn forward(&self, x: &[f32], t: usize) -> Result<Vec<f32>> {
        match self {
            Ffn::Dense(m) => m.dense(x, t),
            Ffn::Moe(m) => m.forward(x, t),
        }
    }

    /// Loads a dense MLP `{prefix}.{gate,up,down}_proj`.
    pub fn load_dense(ld: &Loader, prefix: &str, hidden: usize, inter: usize) -> Result<Ffn> {
        let fmt = ld.dense_format(&format!("{prefix}.gate_proj.weight"));
        let load = || Ok(vec![Mlp::load(ld, prefix, hidden, inter)?]);
        Ok(Ffn::Dense(
            ld.expert_set(prefix, 1, hidden, inter, fmt, load)?,
        ))
    }
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

    fn mlps(n: usize, hidden: usize, inter: usize) -> Vec<Mlp> {
        let mut seed = 7u32;
        let mut v = |len: usize| -> Vec<f32> {
            (0..len)
                .map(|_| {
                    seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
                })
                .collect()
        };
        (0..n)
            .map(|_| Mlp {
                gate: Linear::from_f32(v(inter * hidden), inter, hidden, None),
                up: Linear::from_f32(v(inter * hidden), inter, hidden, None),
                down: Linear::from_f32(v(hidden * inter), hidden, inter, None),
            })
            .collect()
    }

    #[test]
    fn batches_split_across_two_calls_sum_to_the_fused_run() {
        let (n, hidden, inter, t) = (5, 12, 7, 3);
        let routing = Routing {
            top_k: 2,
            ids: vec![0, 3, 3, 1, 4, 0],
            weights: vec![0.7, 0.3, 0.6, 0.4, 0.9, 0.1],
            candidates: None,
        };
        let x: Vec<f32> = (0..t * hidden).map(|i| (i as f32 * 0.37).sin()).collect();
        for fmt in [None, Some(PackedFormat::Bf16)] {
            let set = ExpertSet::new(mlps(n, hidden, inter), hidden, inter, fmt).unwrap();
            let want = set.run(&x, &routing).unwrap();
            let batches =
                strata_kernels::moe::group_by_expert(n, &routing.ids, &routing.weights, 2).unwrap();
            let (a, b) = batches.split_at(2);
            let mut got = vec![0.0f32; t * hidden];
            set.run_batches(&x, a, &mut got).unwrap();
            set.run_batches(&x, b, &mut got).unwrap();
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 1e-5, "{fmt:?}: {g} vs {w}");
            }
            let bad = [ExpertBatch {
                expert: 0,
                tokens: vec![t as u32],
                weights: vec![1.0],
            }];
            assert!(set.run_batches(&x, &bad, &mut got).is_err());
        }
    }

    #[test]
    fn a_step_is_a_decode_when_every_sequence_adds_one_token_to_its_cache() {
        let set = ExpertSet::new(mlps(2, 4, 3), 4, 3, None).unwrap();
        let routing = Routing {
            top_k: 1,
            ids: vec![],
            weights: vec![],
            candidates: None,
        };
        let span = |row, len, start_pos| SeqSpan {
            row,
            len,
            start_pos,
        };
        let call = |spans: &[SeqSpan]| {
            let c = ExpertCall {
                moe_layer: 0,
                x: &[],
                routing: &routing,
                experts: &set,
                spans,
            };
            (c.is_decode(), c.n_seqs())
        };
        let decodes = [span(0, 1, 7), span(1, 0, 3), span(1, 1, 12), span(2, 1, 1)];
        assert_eq!(call(&decodes), (Some(true), 3));
        // A one-token prompt, a prompt chunk beside decodes, an unknown layout.
        assert_eq!(call(&[span(0, 1, 0)]), (Some(false), 1));
        assert_eq!(call(&[span(0, 1, 5), span(1, 4, 0)]), (Some(false), 2));
        assert_eq!(call(&[]), (None, 0));
        assert_eq!(call(&[span(0, 0, 4)]), (None, 0));
    }
}
