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

use crate::Result;
use crate::attention::SeqSpan;
use crate::config::{MoeConfig, RouterConfig};
use crate::experts::{ExpertSet, Mlp};
use crate::linear::{Linear, Loader};
use crate::names::{ExpertLayout, MoeNames};
use crate::ops::sigmoid;
use crate::routing::{Routing, route_with_candidates};
use crate::tensors::{MlpTensors, MoeTensors, StackedExperts};

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

/// A MoE block's router: its gate matrix, selection rule and correction bias, shared (a
/// clone is cheap). An executor that fetches experts ahead applies the next layer's router
/// to this layer's hidden states to guess what it will route ([`Model::moe_routers`]).
///
/// [`Model::moe_routers`]: crate::Model::moe_routers
#[derive(Debug, Clone)]
pub struct Router {
    cfg: RouterConfig,
    gate: Arc<Linear>,
    correction_bias: Option<Arc<[f32]>>,
}

impl Router {
    /// Router decisions for `x: [T, hidden]` (computed in f32), keeping each token's
    /// `n_candidates` best-scored experts ([`Routing::candidates`]; 0: none).
    pub fn route(&self, x: &[f32], t: usize, n_candidates: usize) -> Routing {
        let logits = self.gate.forward(x, t);
        route_with_candidates(
            &self.cfg,
            &logits,
            self.correction_bias.as_deref(),
            n_candidates,
        )
    }

    /// Routed experts to choose from.
    pub fn n_experts(&self) -> usize {
        self.cfg.n_experts
    }

    /// Experts per token.
    pub fn top_k(&self) -> usize {
        self.cfg.top_k
    }
}

/// A mixture-of-experts feed-forward block.
#[derive(Debug)]
pub struct MoeBlock {
    /// Configuration.
    pub cfg: MoeConfig,
    router: Router,
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
    /// Loads the block whose tensors `names` gives ([`LayerNames::moe`]).
    ///
    /// [`LayerNames::moe`]: crate::names::LayerNames::moe
    pub fn load(ld: &Loader, names: &MoeNames, cfg: &MoeConfig, hidden: usize) -> Result<MoeBlock> {
        let n = cfg.router.n_experts;
        let inter = cfg.intermediate;
        let t = MoeTensors::new(names, cfg, hidden);
        let gate = ld.linear_f32(&t.router.name, t.router.rows, t.router.cols)?;
        let correction_bias = match &t.correction_bias {
            Some(b) => Some(ld.f32(&b.name, &b.shape)?.into()),
            None => None,
        };
        let router = Router {
            cfg: cfg.router.clone(),
            gate: Arc::new(gate),
            correction_bias,
        };
        let load = || -> Result<Vec<Mlp>> {
            match &names.experts {
                ExpertLayout::Stacked { gate_up, down } => {
                    let s = StackedExperts::new(gate_up, down, n, hidden, inter);
                    let gu = ld.tensor(&s.gate_up.name)?;
                    gu.expect_shape(&s.gate_up.shape)?;
                    let down = ld.tensor(&s.down.name)?;
                    down.expect_shape(&s.down.shape)?;
                    (0..n)
                        .map(|e| {
                            let at = e * 2 * inter;
                            Ok(Mlp {
                                gate: ld.linear_from(&gu, at, inter, hidden, None, true)?,
                                up: ld.linear_from(&gu, at + inter, inter, hidden, None, true)?,
                                down: ld.linear_from(
                                    &down,
                                    e * hidden,
                                    hidden,
                                    inter,
                                    None,
                                    true,
                                )?,
                            })
                        })
                        .collect()
                }
                ExpertLayout::PerExpert { prefix, names } => (0..n)
                    .map(|e| {
                        let t = MlpTensors::expert(prefix, *names, e, hidden, inter);
                        Mlp::load_expert(ld, &t)
                    })
                    .collect(),
                // Read by the loader's own path for converted models.
                ExpertLayout::Converted { .. } => Ok(Vec::new()),
            }
        };
        let expert_params = 3 * hidden * inter;
        let experts = ld.expert_set(
            names.experts.prefix(),
            n,
            hidden,
            inter,
            ld.expert_format(),
            load,
        )?;
        let shared = match &t.shared {
            Some(s) => Some(dense_set(ld, s)?),
            None => None,
        };
        let shared_gate = match &t.shared_gate {
            Some(g) => Some(ld.linear_f32(&g.name, g.rows, g.cols)?),
            None => None,
        };
        Ok(MoeBlock {
            cfg: cfg.clone(),
            router,
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

    /// Best-scored experts per token this block keeps in its routing (0: none).
    pub fn candidates(&self) -> usize {
        self.n_candidates
    }

    /// Router decisions for `x: [T, hidden]` (router computed in f32).
    pub fn route(&self, x: &[f32], t: usize) -> Routing {
        self.router.route(x, t, self.n_candidates)
    }

    /// The block's router.
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// Weighted sum of the routed experts' outputs, `[T, hidden]`, for a batch laid out as
    /// `spans` (which the executor sees; may be empty).
    pub fn run_experts(&self, x: &[f32], routing: &Routing, spans: &[SeqSpan]) -> Result<Vec<f32>> {
        let Some((_, exec)) = &self.executor else {
            return self.experts.run(x, routing);
        };
        let mut out = vec![0.0f32; x.len()];
        exec.run(self.expert_call(x, routing, spans), &mut out)?;
        Ok(out)
    }

    /// What this block hands its executor for `x` routed by `routing` (as MoE layer 0 when
    /// none is installed).
    pub fn expert_call<'a>(
        &'a self,
        x: &'a [f32],
        routing: &'a Routing,
        spans: &'a [SeqSpan],
    ) -> ExpertCall<'a> {
        ExpertCall {
            moe_layer: self.executor.as_ref().map_or(0, |(l, _)| *l),
            x,
            routing,
            experts: &self.experts,
            spans,
        }
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
            let hidden = self.router.gate.k_in;
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
        let router = self.router.gate.n_out * self.router.gate.k_in;
        let shared = self
            .cfg
            .shared
            .as_ref()
            .map_or(0, |s| 3 * s.intermediate * self.router.gate.k_in)
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
            + self.router.gate.weight_bytes()
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
    /// Loads a dense MLP `{prefix}.{gate,up,down}_proj`.
    pub fn load_dense(ld: &Loader, prefix: &str, hidden: usize, inter: usize) -> Result<Ffn> {
        Ok(Ffn::Dense(dense_set(
            ld,
            &MlpTensors::new(prefix, hidden, inter),
        )?))
    }
}

/// A dense MLP or shared expert `t` as a set of one, in the dense weights' format.
fn dense_set(ld: &Loader, t: &MlpTensors) -> Result<ExpertSet> {
    let fmt = ld.dense_format(&t.gate.weight());
    let load = || Ok(vec![Mlp::load(ld, t)?]);
    ld.expert_set(&t.prefix, 1, t.hidden(), t.inter(), fmt, load)
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_kernels::PackedFormat;
    use strata_kernels::moe::ExpertBatch;

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
