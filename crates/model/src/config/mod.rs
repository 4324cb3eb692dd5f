//! Model configuration: the hub's `config.json`, read into one normalised description.
//!
//! [`RawConfig`] mirrors the union of the fields that the supported architectures' configs
//! use (names as on the hub); [`ModelConfig::from_raw`] turns it into the shapes and switches
//! the forward pass reads: attention kind, rotary embedding, and per layer whether the
//! feed-forward is dense or a mixture of experts with which router.
//!
//! A key design decision made here is that every field that changes the math and is not
//! implemented is an error naming the field, rather than silently ignored: a model that
//! loads computes what the reference computes, or it does not load.
//!
//! Its parts: `raw` mirrors the hub's file, `normalise` checks it and derives the shapes
//! and switches shared by all architectures, `ffn` decides each layer's feed-forward block
//! and router per architecture.

mod ffn;
mod normalise;
mod raw;

use std::path::{Path, PathBuf};

use serde::Deserialize;

pub(crate) use normalise::yarn_mscale;
pub use raw::RawConfig;

use crate::{Error, Result};

/// Architectures this engine implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize)]
pub enum Arch {
    /// `LlamaForCausalLM` (also Mistral-style dense models).
    Llama,
    /// `Qwen2ForCausalLM`.
    Qwen2,
    /// `Qwen2MoeForCausalLM`.
    Qwen2Moe,
    /// `Qwen3MoeForCausalLM`.
    Qwen3Moe,
    /// `MixtralForCausalLM`.
    Mixtral,
    /// `DeepseekV2ForCausalLM`.
    DeepseekV2,
    /// `DeepseekV3ForCausalLM` (also Kimi-K2).
    DeepseekV3,
    /// `Glm4MoeForCausalLM` (GLM-4.5).
    Glm4Moe,
}

impl Arch {
    /// The class name used in `architectures`.
    pub fn hf_name(self) -> &'static str {
        match self {
            Arch::Llama => "LlamaForCausalLM",
            Arch::Qwen2 => "Qwen2ForCausalLM",
            Arch::Qwen2Moe => "Qwen2MoeForCausalLM",
            Arch::Qwen3Moe => "Qwen3MoeForCausalLM",
            Arch::Mixtral => "MixtralForCausalLM",
            Arch::DeepseekV2 => "DeepseekV2ForCausalLM",
            Arch::DeepseekV3 => "DeepseekV3ForCausalLM",
            Arch::Glm4Moe => "Glm4MoeForCausalLM",
        }
    }

    fn from_names(architectures: &[String], model_type: Option<&str>) -> Option<Arch> {
        let by_class = architectures.iter().find_map(|a| match a.as_str() {
            "LlamaForCausalLM" | "MistralForCausalLM" => Some(Arch::Llama),
            "Qwen2ForCausalLM" => Some(Arch::Qwen2),
            "Qwen2MoeForCausalLM" => Some(Arch::Qwen2Moe),
            "Qwen3MoeForCausalLM" => Some(Arch::Qwen3Moe),
            "MixtralForCausalLM" => Some(Arch::Mixtral),
            "DeepseekV2ForCausalLM" => Some(Arch::DeepseekV2),
            "DeepseekV3ForCausalLM" | "KimiK2ForCausalLM" => Some(Arch::DeepseekV3),
            "Glm4MoeForCausalLM" => Some(Arch::Glm4Moe),
            _ => None,
        });
        by_class.or(match model_type.unwrap_or("") {
            "llama" | "mistral" => Some(Arch::Llama),
            "qwen2" => Some(Arch::Qwen2),
            "qwen2_moe" => Some(Arch::Qwen2Moe),
            "qwen3_moe" => Some(Arch::Qwen3Moe),
            "mixtral" => Some(Arch::Mixtral),
            "deepseek_v2" => Some(Arch::DeepseekV2),
            "deepseek_v3" | "kimi_k2" => Some(Arch::DeepseekV3),
            "glm4_moe" => Some(Arch::Glm4Moe),
            _ => None,
        })
    }
}

/// How rotary embedding pairs dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize)]
pub enum RopeStyle {
    /// Dimension `i` pairs with `i + d/2` (GPT-NeoX, `rotate_half`).
    Neox,
    /// Dimension `2i` pairs with `2i + 1` (GPT-J, DeepSeek MLA, llama GGUF).
    Interleaved,
}

/// Frequency scaling of the rotary embedding.
#[derive(Debug, Clone, PartialEq, serde::Serialize, Deserialize)]
pub enum RopeScaling {
    /// Plain `theta^(-2i/d)`.
    None,
    /// Position interpolation: frequencies divided by `factor`.
    Linear {
        /// Divisor of every frequency.
        factor: f64,
    },
    /// Llama 3's band-wise scaling.
    Llama3 {
        /// Scaling of low frequencies.
        factor: f64,
        /// Wavelength band parameters.
        low_freq_factor: f64,
        /// Wavelength band parameters.
        high_freq_factor: f64,
        /// Context length at pretraining.
        original_max_position_embeddings: f64,
    },
    /// YaRN (NTK-by-parts) with attention temperature.
    Yarn {
        /// Context extension factor.
        factor: f64,
        /// Context length at pretraining.
        original_max_position_embeddings: f64,
        /// Ramp boundary (extrapolation).
        beta_fast: f64,
        /// Ramp boundary (interpolation).
        beta_slow: f64,
        /// Factor applied to cos/sin.
        attention_factor: f64,
        /// Whether the correction range is rounded to whole dimensions.
        truncate: bool,
        /// DeepSeek's `mscale_all_dim` (scales the attention softmax by `mscale^2`).
        mscale_all_dim: f64,
    },
}

/// Rotary position embedding.
#[derive(Debug, Clone, PartialEq, serde::Serialize, Deserialize)]
pub struct RopeConfig {
    /// Base of the frequencies.
    pub theta: f64,
    /// Number of rotated dimensions per head (the first `dim` of each head's rotary part).
    pub dim: usize,
    /// Pairing of dimensions.
    pub style: RopeStyle,
    /// Frequency scaling.
    pub scaling: RopeScaling,
}

/// Self-attention variants. Each variant's settings are their own type, so that the layer
/// graph ([`crate::LayerGraph`]) hands a backend exactly the settings of the variant it runs.
/// (The JSON form is that of struct variants: `{"Gqa": {"n_heads": ..}}`.)
#[derive(Debug, Clone, PartialEq, serde::Serialize, Deserialize)]
pub enum AttentionConfig {
    /// Grouped-query attention (MHA and MQA are special cases).
    Gqa(GqaConfig),
    /// Multi-head latent attention (DeepSeek-V2/V3).
    Mla(MlaConfig),
}

/// Grouped-query attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct GqaConfig {
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Dimension of each head.
    pub head_dim: usize,
    /// Bias on q, k, v projections.
    pub qkv_bias: bool,
    /// Bias on the output projection.
    pub o_bias: bool,
    /// RMSNorm over each head of q and k before rotary (Qwen3, GLM-4.5 `use_qk_norm`).
    pub qk_norm: bool,
    /// Attend only to the last `w` positions.
    pub sliding_window: Option<usize>,
}

/// Multi-head latent attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct MlaConfig {
    /// Query heads.
    pub n_heads: usize,
    /// Rank of the query compression, if queries are compressed.
    pub q_lora_rank: Option<usize>,
    /// Rank of the key/value compression.
    pub kv_lora_rank: usize,
    /// Per-head query/key dimensions without rotary.
    pub qk_nope_head_dim: usize,
    /// Per-head query/key dimensions with rotary (the key part is shared by all heads).
    pub qk_rope_head_dim: usize,
    /// Per-head value dimension.
    pub v_head_dim: usize,
    /// Bias on `kv_a_proj_with_mqa`, `q_a_proj`/`q_proj`? (`attention_bias`).
    pub bias: bool,
}

impl GqaConfig {
    /// Width of one position's keys (and of its values): every KV head's.
    pub fn kv_width(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}

impl MlaConfig {
    /// DeepSeek's `q_a_layernorm` and `kv_a_layernorm` use a fixed epsilon, not
    /// `rms_norm_eps`.
    pub const NORM_EPS: f32 = 1e-6;

    /// Length of one head's query-key dot product: non-rotary plus rotary dimensions.
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }
}

impl AttentionConfig {
    /// Number of query heads.
    pub fn n_heads(&self) -> usize {
        match self {
            AttentionConfig::Gqa(c) => c.n_heads,
            AttentionConfig::Mla(c) => c.n_heads,
        }
    }

    /// Length of the query-key dot product of one head: `head_dim` for GQA, the non-rotary
    /// plus the rotary dimensions for MLA.
    pub fn qk_head_dim(&self) -> usize {
        match self {
            AttentionConfig::Gqa(c) => c.head_dim,
            AttentionConfig::Mla(c) => c.qk_head_dim(),
        }
    }

    /// Widths of one layer's two cache buffers per position: (keys, values) for GQA,
    /// (compressed latent, the rotary key all heads share) for MLA.
    pub fn cache_widths(&self) -> (usize, usize) {
        match self {
            AttentionConfig::Gqa(c) => (c.kv_width(), c.kv_width()),
            AttentionConfig::Mla(c) => (c.kv_lora_rank, c.qk_rope_head_dim),
        }
    }

    /// Values one layer's KV cache holds per position (both [`Self::cache_widths`]).
    pub fn kv_elems(&self) -> usize {
        let (a, b) = self.cache_widths();
        a + b
    }
}

/// How router logits become expert choices and weights.
#[derive(Debug, Clone, PartialEq, serde::Serialize, Deserialize)]
pub struct RouterConfig {
    /// Number of routed experts.
    pub n_experts: usize,
    /// Experts chosen per token.
    pub top_k: usize,
    /// Softmax or sigmoid of the logits.
    pub scoring: Scoring,
    /// Add `e_score_correction_bias` to the scores for selection only (DeepSeek-V3 `noaux_tc`).
    pub correction_bias: bool,
    /// Group-limited selection: experts split into `n_group` groups, only the best `topk_group`
    /// groups are eligible.
    pub groups: Option<GroupLimit>,
    /// Renormalise the chosen weights to sum to one.
    pub norm_topk_prob: bool,
    /// Multiply the final weights by this factor.
    pub scaling_factor: f32,
}

/// Router scoring function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize)]
pub enum Scoring {
    /// Softmax over all experts.
    Softmax,
    /// Independent sigmoid per expert.
    Sigmoid,
}

/// Group-limited expert selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct GroupLimit {
    /// Number of groups.
    pub n_group: usize,
    /// Groups kept per token.
    pub topk_group: usize,
    /// How a group is scored.
    pub group_score: GroupScore,
}

/// How a group of experts is scored for group-limited routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize)]
pub enum GroupScore {
    /// Highest score in the group (DeepSeek-V2 `group_limited_greedy`).
    Max,
    /// Sum of the two highest (bias-corrected) scores (DeepSeek-V3 `noaux_tc`).
    Top2Sum,
}

/// Shared experts that every token goes through.
#[derive(Debug, Clone, PartialEq, serde::Serialize, Deserialize)]
pub struct SharedExpertConfig {
    /// Intermediate size of the shared MLP.
    pub intermediate: usize,
    /// Scaled by `sigmoid(shared_expert_gate(x))` (Qwen2-MoE).
    pub gated: bool,
}

/// A mixture-of-experts feed-forward block.
#[derive(Debug, Clone, PartialEq, serde::Serialize, Deserialize)]
pub struct MoeConfig {
    /// Router.
    pub router: RouterConfig,
    /// Intermediate size of each routed expert.
    pub intermediate: usize,
    /// Shared experts, if any.
    pub shared: Option<SharedExpertConfig>,
}

/// The feed-forward block of one layer.
#[derive(Debug, Clone, PartialEq, serde::Serialize, Deserialize)]
pub enum FfnConfig {
    /// Dense SwiGLU MLP with this intermediate size.
    Dense(usize),
    /// Mixture of experts.
    Moe(MoeConfig),
}

/// Everything the forward pass needs to know about a model, normalised across architectures.
#[derive(Debug, Clone, PartialEq, serde::Serialize, Deserialize)]
pub struct ModelConfig {
    /// Architecture.
    pub arch: Arch,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Residual stream width.
    pub hidden_size: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// `lm_head` shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Self-attention.
    pub attention: AttentionConfig,
    /// Rotary embedding.
    pub rope: RopeConfig,
    /// Feed-forward block per layer.
    pub layers: Vec<FfnConfig>,
    /// Longest context the model was configured for.
    pub max_position_embeddings: usize,
    /// End-of-sequence token ids from the config.
    pub eos_token_ids: Vec<u32>,
    /// Beginning-of-sequence token id from the config.
    pub bos_token_id: Option<u32>,
    /// Block size `[rows, cols]` of FP8 weights' `weight_scale_inv` (DeepSeek-V3 FP8).
    pub fp8_block: Option<[usize; 2]>,
}

impl ModelConfig {
    /// Reads and normalises `config.json` at `path`.
    pub fn load(path: &Path) -> Result<ModelConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Config {
            path: path.to_owned(),
            message: format!("cannot read config: {e}"),
        })?;
        let raw: RawConfig = serde_json::from_str(&text).map_err(|e| Error::Config {
            path: path.to_owned(),
            message: format!("invalid config JSON: {e}"),
        })?;
        Self::from_raw(&raw, path)
    }

    /// Number of decoder layers.
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// Softmax scale of attention scores: `1/sqrt(d_qk)`, times YaRN's `mscale²` for MLA
    /// (DeepSeek's `mscale_all_dim`).
    pub fn attention_scale(&self) -> f32 {
        match self.attention {
            AttentionConfig::Gqa(c) => 1.0 / (c.head_dim as f32).sqrt(),
            AttentionConfig::Mla(c) => {
                let base = 1.0 / (c.qk_head_dim() as f64).sqrt();
                let m = match self.rope.scaling {
                    RopeScaling::Yarn {
                        factor,
                        mscale_all_dim,
                        ..
                    } if mscale_all_dim != 0.0 => yarn_mscale(factor, mscale_all_dim),
                    _ => 1.0,
                };
                (base * m * m) as f32
            }
        }
    }
}

/// Path of `config.json` inside a model directory.
pub fn config_path(dir: &Path) -> PathBuf {
    dir.join("config.json")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> ModelConfig {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
        ModelConfig::load(&config_path(&dir.join(name))).unwrap()
    }

    /// The attention sizes the KV cache, the policies' shapes and the softmax use, against
    /// values worked out by hand from each fixture's config.json.
    #[test]
    fn attention_sizes_and_scale_follow_the_config() {
        // Qwen3-MoE: 2 KV heads of 12, a key and a value each.
        let qwen = fixture("qwen3_moe");
        assert_eq!(qwen.attention.qk_head_dim(), 12);
        assert_eq!(qwen.attention.kv_elems(), 2 * 2 * 12);
        assert_eq!(qwen.attention_scale(), 1.0 / 12f32.sqrt());
        // DeepSeek-V2 (MLA): latent 18 plus rotary key 6 cached; q·k over 10 + 6; YaRN
        // factor 4 with mscale_all_dim 0.707 scales the softmax by mscale².
        let ds = fixture("deepseek_v2");
        assert_eq!(ds.attention.qk_head_dim(), 16);
        assert_eq!(ds.attention.kv_elems(), 18 + 6);
        let m = 0.1 * 0.707 * 4f64.ln() + 1.0;
        assert_eq!(ds.attention_scale(), (m * m / 4.0) as f32);
        // DeepSeek-V3, YaRN in transformers 5's `rope_parameters` (mscale_all_dim 0.7).
        let v3 = fixture("deepseek_v3");
        let m = 0.1 * 0.7 * 4f64.ln() + 1.0;
        assert_eq!(v3.attention_scale(), (1.0 / 22f64.sqrt() * m * m) as f32);
    }
}
