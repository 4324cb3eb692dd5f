//! A model's size from its normalised config alone: parameter counts
//! ([`ModelConfig::param_counts`]) and the shape of its mixture-of-experts layers
//! ([`ModelConfig::moe_shape`]), which the cost models of the placement policies price.
//!
//! A key design decision: these read the config, never the weights, so they answer at
//! once for models far larger than memory (`strata info`), and every caller that needs a
//! model's shape (the hybrid executor's cost model, `info`) derives it here, once.

use crate::config::{AttentionConfig, FfnConfig, GqaConfig, MlaConfig, ModelConfig};

/// The shape of a model's mixture-of-experts layers and what surrounds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeShape {
    /// Hidden size.
    pub hidden: usize,
    /// Intermediate size of one routed expert.
    pub moe_intermediate: usize,
    /// Routed experts per MoE layer.
    pub n_experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Shared experts per MoE layer, in routed-expert widths (rounded up).
    pub n_shared: usize,
    /// Transformer layers.
    pub n_layers: usize,
    /// Layers with a dense MLP instead of a MoE block.
    pub dense_layers: usize,
    /// Intermediate size of the first dense MLP (0: none).
    pub dense_intermediate: usize,
    /// Attention heads.
    pub n_heads: usize,
    /// Query/key head dimension (MLA: the non-rotary and rotary parts together).
    pub head_dim: usize,
    /// Parameters of one layer's attention projections.
    pub attn_params: usize,
    /// Values cached per token and layer (keys and values; MLA: latent and rotary key).
    pub kv_elems: usize,
    /// Vocabulary size.
    pub vocab: usize,
}

impl ModelConfig {
    /// Parameters `(total, active per token)` from the config alone: the counts of
    /// [`crate::Model::param_counts`] (routed experts counted top-k times in `active`).
    pub fn param_counts(&self) -> (usize, usize) {
        let h = self.hidden_size;
        let embed = self.vocab_size * h;
        let head = if self.tie_word_embeddings { 0 } else { embed };
        let attn = self.attention_params();
        let (mut total, mut active) = (embed + head + h, embed + head + h);
        for layer in &self.layers {
            let (t, a) = match layer {
                FfnConfig::Dense(inter) => (3 * h * inter, 3 * h * inter),
                FfnConfig::Moe(m) => {
                    let r = &m.router;
                    let fixed = r.n_experts * h
                        + m.shared
                            .as_ref()
                            .map_or(0, |s| 3 * s.intermediate * h + if s.gated { h } else { 0 });
                    let expert = 3 * h * m.intermediate;
                    (fixed + expert * r.n_experts, fixed + expert * r.top_k)
                }
            };
            total += attn + 2 * h + t;
            active += attn + 2 * h + a;
        }
        (total, active)
    }

    /// Attention parameters of one layer.
    fn attention_params(&self) -> usize {
        let h = self.hidden_size;
        match &self.attention {
            AttentionConfig::Gqa(GqaConfig {
                n_heads,
                n_kv_heads,
                head_dim,
                ..
            }) => 2 * (n_heads + n_kv_heads) * head_dim * h,
            AttentionConfig::Mla(MlaConfig {
                n_heads,
                q_lora_rank,
                kv_lora_rank,
                qk_nope_head_dim,
                qk_rope_head_dim,
                v_head_dim,
                ..
            }) => {
                let qk = qk_nope_head_dim + qk_rope_head_dim;
                let q = match q_lora_rank {
                    Some(r) => r * h + n_heads * qk * r,
                    None => n_heads * qk * h,
                };
                q + (kv_lora_rank + qk_rope_head_dim) * h
                    + n_heads * (qk_nope_head_dim + v_head_dim) * kv_lora_rank
                    + h * n_heads * v_head_dim
            }
        }
    }

    /// The shape of the model's MoE layers (those of the first MoE block); `None` for a
    /// dense model.
    pub fn moe_shape(&self) -> Option<MoeShape> {
        let moe = self.layers.iter().find_map(|l| match l {
            FfnConfig::Moe(m) => Some(m),
            FfnConfig::Dense(_) => None,
        })?;
        let dense = || {
            self.layers.iter().filter_map(|l| match l {
                FfnConfig::Dense(i) => Some(*i),
                FfnConfig::Moe(_) => None,
            })
        };
        Some(MoeShape {
            hidden: self.hidden_size,
            moe_intermediate: moe.intermediate,
            n_experts: moe.router.n_experts,
            top_k: moe.router.top_k,
            n_shared: moe
                .shared
                .as_ref()
                .map_or(0, |s| s.intermediate.div_ceil(moe.intermediate.max(1))),
            n_layers: self.layers.len(),
            dense_layers: dense().count(),
            dense_intermediate: dense().next().unwrap_or(0),
            n_heads: self.attention.n_heads(),
            head_dim: self.attention.qk_head_dim(),
            attn_params: self.attention_params(),
            kv_elems: self.attention.kv_elems(),
            vocab: self.vocab_size,
        })
    }
}
