//! Each layer's feed-forward block per architecture: dense or a mixture of experts, and
//! the router that chooses the experts.

use super::normalise::Ctx;
use super::{
    Arch, FfnConfig, GroupLimit, GroupScore, MoeConfig, RawConfig, RouterConfig, Scoring,
    SharedExpertConfig,
};
use crate::{Error, Result};

/// Layer `layer`'s feed-forward block.
pub(super) fn ffn_config(raw: &RawConfig, cx: &Ctx, arch: Arch, layer: usize) -> Result<FfnConfig> {
    let dense = || {
        cx.need(raw.intermediate_size, "intermediate_size")
            .map(FfnConfig::Dense)
    };
    let n_experts = raw
        .num_experts
        .or(raw.n_routed_experts)
        .or(raw.num_local_experts);
    let moe_inter = || cx.need(raw.moe_intermediate_size, "moe_intermediate_size");
    let top_k = || cx.need(raw.num_experts_per_tok, "num_experts_per_tok");
    let softmax_router = |n_experts: usize, top_k: usize, norm: bool| RouterConfig {
        n_experts,
        top_k,
        scoring: Scoring::Softmax,
        correction_bias: false,
        groups: None,
        norm_topk_prob: norm,
        scaling_factor: 1.0,
    };
    let cfg = match arch {
        Arch::Llama | Arch::Qwen2 => return dense(),
        Arch::Qwen2Moe | Arch::Qwen3Moe => {
            let n = n_experts.unwrap_or(0);
            let step = raw.decoder_sparse_step.unwrap_or(1).max(1);
            let mlp_only = raw.mlp_only_layers.as_deref().unwrap_or(&[]);
            if mlp_only.contains(&layer) || n == 0 || !(layer + 1).is_multiple_of(step) {
                return dense();
            }
            let router = softmax_router(n, top_k()?, raw.norm_topk_prob.unwrap_or(false));
            let shared = match (arch, raw.shared_expert_intermediate_size) {
                (Arch::Qwen2Moe, Some(i)) if i > 0 => Some(SharedExpertConfig {
                    intermediate: i,
                    gated: true,
                }),
                _ => None,
            };
            MoeConfig {
                router,
                intermediate: moe_inter()?,
                shared,
            }
        }
        Arch::Mixtral => MoeConfig {
            router: softmax_router(cx.need(n_experts, "num_local_experts")?, top_k()?, true),
            intermediate: cx.need(raw.intermediate_size, "intermediate_size")?,
            shared: None,
        },
        Arch::DeepseekV2 | Arch::DeepseekV3 | Arch::Glm4Moe => {
            let first_dense = raw.first_k_dense_replace.unwrap_or(0);
            let freq = raw.moe_layer_freq.unwrap_or(1).max(1);
            let n = n_experts.unwrap_or(0);
            if n == 0 || layer < first_dense || !layer.is_multiple_of(freq) {
                return dense();
            }
            grouped_moe(raw, cx, arch, n)?
        }
    };
    check_router(cx, &cfg.router)?;
    Ok(FfnConfig::Moe(cfg))
}

/// Top-k and group limits that fit the number of experts.
fn check_router(cx: &Ctx, router: &RouterConfig) -> Result<()> {
    if router.top_k == 0 || router.top_k > router.n_experts {
        return Err(cx.err(format!(
            "num_experts_per_tok ({}) must be between 1 and the number of experts ({})",
            router.top_k, router.n_experts
        )));
    }
    if let Some(g) = router.groups
        && (g.n_group == 0
            || !router.n_experts.is_multiple_of(g.n_group)
            || g.topk_group == 0
            || g.topk_group > g.n_group
            || g.topk_group * (router.n_experts / g.n_group) < router.top_k)
    {
        return Err(cx.err(format!(
            "n_group ({}) / topk_group ({}) do not fit {} experts with top-{}",
            g.n_group, g.topk_group, router.n_experts, router.top_k
        )));
    }
    Ok(())
}

/// The routed experts of DeepSeek-V2/V3 and GLM-4.5: softmax or sigmoid scores, optionally
/// group-limited and bias-corrected, plus shared experts.
fn grouped_moe(raw: &RawConfig, cx: &Ctx, arch: Arch, n: usize) -> Result<MoeConfig> {
    let moe_inter = || cx.need(raw.moe_intermediate_size, "moe_intermediate_size");
    let default_method = if arch == Arch::DeepseekV2 {
        "greedy"
    } else {
        "noaux_tc"
    };
    let method = raw.topk_method.as_deref().unwrap_or(default_method);
    let scoring = match raw.scoring_func.as_deref() {
        None if arch == Arch::DeepseekV2 => Scoring::Softmax,
        None => Scoring::Sigmoid,
        Some("softmax") => Scoring::Softmax,
        Some("sigmoid") => Scoring::Sigmoid,
        Some(other) => {
            return Err(cx.unsupported(
                "scoring_func",
                format!("`{other}`; supported: softmax, sigmoid"),
            ));
        }
    };
    let group = |score| {
        Ok::<_, Error>(Some(GroupLimit {
            n_group: cx.need(raw.n_group, "n_group")?,
            topk_group: cx.need(raw.topk_group, "topk_group")?,
            group_score: score,
        }))
    };
    let (groups, correction_bias) = match method {
        "greedy" => (None, false),
        "group_limited_greedy" => (group(GroupScore::Max)?, false),
        "noaux_tc" => (group(GroupScore::Top2Sum)?, true),
        other => {
            return Err(cx.unsupported(
                "topk_method",
                format!("`{other}`; supported: greedy, group_limited_greedy, noaux_tc"),
            ));
        }
    };
    // transformers' DeepSeek-V2 router always scales and never renormalises.
    let norm = arch != Arch::DeepseekV2 && raw.norm_topk_prob.unwrap_or(false);
    let shared = raw
        .n_shared_experts
        .filter(|&s| s > 0)
        .map(|s| -> Result<_> {
            Ok(SharedExpertConfig {
                intermediate: moe_inter()? * s,
                gated: false,
            })
        });
    Ok(MoeConfig {
        router: RouterConfig {
            n_experts: n,
            top_k: cx.need(raw.num_experts_per_tok, "num_experts_per_tok")?,
            scoring,
            correction_bias,
            groups,
            norm_topk_prob: norm,
            scaling_factor: raw.routed_scaling_factor.unwrap_or(1.0) as f32,
        },
        intermediate: moe_inter()?,
        shared: shared.transpose()?,
    })
}
