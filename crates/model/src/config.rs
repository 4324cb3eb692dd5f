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

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

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

/// The fields of a hub `config.json` that the supported architectures use.
#[derive(Debug, Clone, Deserialize, Default)]
#[allow(missing_docs)]
pub struct RawConfig {
    #[serde(default)]
    pub architectures: Vec<String>,
    pub model_type: Option<String>,
    pub vocab_size: Option<usize>,
    pub hidden_size: Option<usize>,
    pub num_hidden_layers: Option<usize>,
    pub num_attention_heads: Option<usize>,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub intermediate_size: Option<usize>,
    pub rms_norm_eps: Option<f64>,
    pub hidden_act: Option<String>,
    pub max_position_embeddings: Option<usize>,
    pub tie_word_embeddings: Option<bool>,
    pub attention_bias: Option<bool>,
    pub mlp_bias: Option<bool>,
    pub rope_theta: Option<f64>,
    pub rope_scaling: Option<Value>,
    pub rope_parameters: Option<Value>,
    pub partial_rotary_factor: Option<f64>,
    pub rope_interleave: Option<bool>,
    pub sliding_window: Option<Value>,
    pub use_sliding_window: Option<bool>,
    pub bos_token_id: Option<Value>,
    pub eos_token_id: Option<Value>,
    // Mixture of experts.
    pub num_experts: Option<usize>,
    pub num_local_experts: Option<usize>,
    pub n_routed_experts: Option<usize>,
    pub num_experts_per_tok: Option<usize>,
    pub moe_intermediate_size: Option<usize>,
    pub shared_expert_intermediate_size: Option<usize>,
    pub n_shared_experts: Option<usize>,
    pub norm_topk_prob: Option<bool>,
    pub decoder_sparse_step: Option<usize>,
    pub mlp_only_layers: Option<Vec<usize>>,
    pub first_k_dense_replace: Option<usize>,
    pub moe_layer_freq: Option<usize>,
    pub topk_method: Option<String>,
    pub scoring_func: Option<String>,
    pub n_group: Option<usize>,
    pub topk_group: Option<usize>,
    pub routed_scaling_factor: Option<f64>,
    // Multi-head latent attention.
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: Option<usize>,
    pub qk_nope_head_dim: Option<usize>,
    pub qk_rope_head_dim: Option<usize>,
    pub v_head_dim: Option<usize>,
    // GLM-4.5.
    pub use_qk_norm: Option<bool>,
    // Quantized checkpoints.
    pub quantization_config: Option<Value>,
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

/// Self-attention variants.
#[derive(Debug, Clone, PartialEq, serde::Serialize, Deserialize)]
pub enum AttentionConfig {
    /// Grouped-query attention (MHA and MQA are special cases).
    Gqa {
        /// Query heads.
        n_heads: usize,
        /// Key/value heads.
        n_kv_heads: usize,
        /// Dimension of each head.
        head_dim: usize,
        /// Bias on q, k, v projections.
        qkv_bias: bool,
        /// Bias on the output projection.
        o_bias: bool,
        /// RMSNorm over each head of q and k before rotary (Qwen3, GLM-4.5 `use_qk_norm`).
        qk_norm: bool,
        /// Attend only to the last `w` positions.
        sliding_window: Option<usize>,
    },
    /// Multi-head latent attention (DeepSeek-V2/V3).
    Mla {
        /// Query heads.
        n_heads: usize,
        /// Rank of the query compression, if queries are compressed.
        q_lora_rank: Option<usize>,
        /// Rank of the key/value compression.
        kv_lora_rank: usize,
        /// Per-head query/key dimensions without rotary.
        qk_nope_head_dim: usize,
        /// Per-head query/key dimensions with rotary (the key part is shared by all heads).
        qk_rope_head_dim: usize,
        /// Per-head value dimension.
        v_head_dim: usize,
        /// Bias on `kv_a_proj_with_mqa`, `q_a_proj`/`q_proj`? (`attention_bias`).
        bias: bool,
    },
}

impl AttentionConfig {
    /// Number of query heads.
    pub fn n_heads(&self) -> usize {
        match self {
            AttentionConfig::Gqa { n_heads, .. } | AttentionConfig::Mla { n_heads, .. } => *n_heads,
        }
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

struct Ctx<'a> {
    path: &'a Path,
}

impl Ctx<'_> {
    fn err(&self, message: impl Into<String>) -> Error {
        Error::Config {
            path: self.path.to_owned(),
            message: message.into(),
        }
    }
    fn unsupported(&self, field: &str, message: impl Into<String>) -> Error {
        Error::Unsupported {
            path: self.path.to_owned(),
            field: field.to_owned(),
            message: message.into(),
        }
    }
    fn need<T: Copy>(&self, v: Option<T>, field: &str) -> Result<T> {
        v.ok_or_else(|| self.err(format!("missing required field `{field}`")))
    }
}

fn token_ids(v: &Option<Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|n| vec![n as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64())
            .map(|n| n as u32)
            .collect(),
        _ => Vec::new(),
    }
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

    /// Normalises a parsed config; `path` is used in error messages.
    pub fn from_raw(raw: &RawConfig, path: &Path) -> Result<ModelConfig> {
        let cx = Ctx { path };
        let arch = Arch::from_names(&raw.architectures, raw.model_type.as_deref()).ok_or_else(|| {
            cx.unsupported(
                "architectures",
                format!(
                    "{:?} (model_type {:?}); supported: Llama, Qwen2, Qwen2-MoE, Qwen3-MoE, Mixtral, DeepSeek-V2/V3, GLM-4.5",
                    raw.architectures, raw.model_type
                ),
            )
        })?;
        if let Some(act) = &raw.hidden_act
            && act != "silu"
        {
            return Err(
                cx.unsupported("hidden_act", format!("`{act}`, only `silu` is implemented"))
            );
        }
        if raw.mlp_bias == Some(true) {
            return Err(cx.unsupported("mlp_bias", "biases on MLP projections are not implemented"));
        }
        let fp8_block = match &raw.quantization_config {
            None => None,
            Some(q) => {
                let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("?");
                let fmt = q.get("fmt").and_then(Value::as_str).unwrap_or("e4m3");
                let block: Option<Vec<usize>> = q
                    .get("weight_block_size")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_u64)
                            .map(|v| v as usize)
                            .collect()
                    });
                match (method, fmt, block.as_deref()) {
                    ("fp8", "e4m3", Some(&[bn, bk])) if bn > 0 && bk > 0 => Some([bn, bk]),
                    ("fp8", "e4m3", _) => {
                        return Err(cx.unsupported(
                            "quantization_config.weight_block_size",
                            "FP8 checkpoints need two positive block sizes (e.g. [128, 128])",
                        ));
                    }
                    ("fp8", other, _) => {
                        return Err(cx.unsupported(
                            "quantization_config.fmt",
                            format!("`{other}`; FP8 weights must be e4m3"),
                        ));
                    }
                    (other, _, _) => {
                        return Err(cx.unsupported(
                            "quantization_config.quant_method",
                            format!("`{other}`; supported: fp8 (block-scaled e4m3)"),
                        ));
                    }
                }
            }
        };
        let hidden = cx.need(raw.hidden_size, "hidden_size")?;
        let n_layers = cx.need(raw.num_hidden_layers, "num_hidden_layers")?;
        let n_heads = cx.need(raw.num_attention_heads, "num_attention_heads")?;
        let vocab_size = cx.need(raw.vocab_size, "vocab_size")?;
        if hidden == 0 || n_layers == 0 || n_heads == 0 || vocab_size == 0 {
            return Err(cx.err("hidden_size, num_hidden_layers, num_attention_heads and vocab_size must be positive"));
        }
        let n_kv_heads = raw.num_key_value_heads.unwrap_or(n_heads);
        if n_kv_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) {
            return Err(cx.err(format!(
                "num_attention_heads ({n_heads}) must be a multiple of num_key_value_heads ({n_kv_heads})"
            )));
        }
        let is_mla = matches!(arch, Arch::DeepseekV2 | Arch::DeepseekV3);
        let head_dim = if is_mla {
            cx.need(raw.qk_rope_head_dim, "qk_rope_head_dim")?
        } else {
            raw.head_dim.unwrap_or(hidden / n_heads)
        };
        let attention = if is_mla {
            AttentionConfig::Mla {
                n_heads,
                q_lora_rank: raw.q_lora_rank,
                kv_lora_rank: cx.need(raw.kv_lora_rank, "kv_lora_rank")?,
                qk_nope_head_dim: cx.need(raw.qk_nope_head_dim, "qk_nope_head_dim")?,
                qk_rope_head_dim: head_dim,
                v_head_dim: cx.need(raw.v_head_dim, "v_head_dim")?,
                bias: raw.attention_bias.unwrap_or(false),
            }
        } else {
            let qkv_bias = match arch {
                Arch::Qwen2 | Arch::Qwen2Moe => true,
                _ => raw.attention_bias.unwrap_or(false),
            };
            let o_bias = match arch {
                Arch::Llama => raw.attention_bias.unwrap_or(false),
                _ => false,
            };
            let qk_norm = match arch {
                Arch::Qwen3Moe => true,
                Arch::Glm4Moe => raw.use_qk_norm.unwrap_or(false),
                _ => false,
            };
            let sliding_window = match arch {
                Arch::Mixtral | Arch::Llama => raw.sliding_window.as_ref().and_then(Value::as_u64),
                _ if raw.use_sliding_window == Some(true) => {
                    return Err(cx.unsupported(
                        "use_sliding_window",
                        "per-layer sliding-window attention is not implemented",
                    ));
                }
                _ => None,
            };
            AttentionConfig::Gqa {
                n_heads,
                n_kv_heads,
                head_dim,
                qkv_bias,
                o_bias,
                qk_norm,
                sliding_window: sliding_window.map(|w| w as usize),
            }
        };
        let max_position_embeddings = raw.max_position_embeddings.unwrap_or(4096);
        let rope = rope_config(raw, &cx, arch, head_dim, max_position_embeddings)?;
        let layers = (0..n_layers)
            .map(|i| ffn_config(raw, &cx, arch, i))
            .collect::<Result<Vec<_>>>()?;
        Ok(ModelConfig {
            arch,
            vocab_size,
            hidden_size: hidden,
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6) as f32,
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            attention,
            rope,
            layers,
            max_position_embeddings,
            eos_token_ids: token_ids(&raw.eos_token_id),
            bos_token_id: token_ids(&raw.bos_token_id).first().copied(),
            fp8_block,
        })
    }

    /// Number of decoder layers.
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }
}

fn get_f64(obj: &Value, key: &str) -> Option<f64> {
    obj.get(key).and_then(Value::as_f64)
}

fn rope_config(
    raw: &RawConfig,
    cx: &Ctx,
    arch: Arch,
    head_dim: usize,
    max_pos: usize,
) -> Result<RopeConfig> {
    // transformers 5 writes `rope_parameters` (with `rope_theta` inside); hub configs have
    // `rope_theta` plus an optional `rope_scaling`. Both describe the same thing.
    let (params, field) = match (&raw.rope_parameters, &raw.rope_scaling) {
        (Some(p @ Value::Object(_)), _) => (p.clone(), "rope_parameters"),
        (_, Some(s @ Value::Object(_))) => (s.clone(), "rope_scaling"),
        _ => (Value::Object(Default::default()), "rope_scaling"),
    };
    let theta = get_f64(&params, "rope_theta")
        .or(raw.rope_theta)
        .unwrap_or(10000.0);
    let partial = get_f64(&params, "partial_rotary_factor")
        .or(raw.partial_rotary_factor)
        .unwrap_or(match arch {
            Arch::Glm4Moe => 0.5,
            _ => 1.0,
        });
    let dim = (head_dim as f64 * partial) as usize;
    if dim == 0 || !dim.is_multiple_of(2) || dim > head_dim {
        return Err(cx.err(format!(
            "rotary dimension {dim} (head_dim {head_dim} x partial_rotary_factor {partial}) must be even and positive"
        )));
    }
    let style = match arch {
        Arch::DeepseekV2 => RopeStyle::Interleaved,
        Arch::DeepseekV3 if raw.rope_interleave.unwrap_or(true) => RopeStyle::Interleaved,
        _ => RopeStyle::Neox,
    };
    let kind = params
        .get("rope_type")
        .or_else(|| params.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let need = |key: &str| {
        get_f64(&params, key).ok_or_else(|| {
            cx.err(format!(
                "`{field}.{key}` is required for rope type `{kind}`"
            ))
        })
    };
    let original =
        || get_f64(&params, "original_max_position_embeddings").unwrap_or(max_pos as f64);
    let scaling = match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear {
            factor: need("factor")?,
        },
        "llama3" => RopeScaling::Llama3 {
            factor: need("factor")?,
            low_freq_factor: need("low_freq_factor")?,
            high_freq_factor: need("high_freq_factor")?,
            original_max_position_embeddings: original(),
        },
        "yarn" => {
            let original_max = original();
            let factor = get_f64(&params, "factor").unwrap_or(max_pos as f64 / original_max);
            let mscale = get_f64(&params, "mscale").unwrap_or(0.0);
            let mscale_all_dim = get_f64(&params, "mscale_all_dim").unwrap_or(0.0);
            let attention_factor = match get_f64(&params, "attention_factor") {
                Some(a) => a,
                None if mscale != 0.0 && mscale_all_dim != 0.0 => {
                    yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
                }
                None => yarn_mscale(factor, 1.0),
            };
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: original_max,
                beta_fast: get_f64(&params, "beta_fast")
                    .filter(|&b| b != 0.0)
                    .unwrap_or(32.0),
                beta_slow: get_f64(&params, "beta_slow")
                    .filter(|&b| b != 0.0)
                    .unwrap_or(1.0),
                attention_factor,
                truncate: params
                    .get("truncate")
                    .and_then(Value::as_bool)
                    .unwrap_or(true),
                mscale_all_dim,
            }
        }
        other => {
            return Err(cx.unsupported(
                &format!("{field}.rope_type"),
                format!("`{other}`; supported: default, linear, llama3, yarn"),
            ));
        }
    };
    Ok(RopeConfig {
        theta,
        dim,
        style,
        scaling,
    })
}

/// YaRN's attention temperature `0.1 · m · ln(s) + 1` (1 when `s <= 1`).
pub fn yarn_mscale(scale: f64, m: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * m * scale.ln() + 1.0
    }
}

fn ffn_config(raw: &RawConfig, cx: &Ctx, arch: Arch, layer: usize) -> Result<FfnConfig> {
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
    let check_topk = |router: &RouterConfig| -> Result<()> {
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
            MoeConfig {
                router: RouterConfig {
                    n_experts: n,
                    top_k: top_k()?,
                    scoring,
                    correction_bias,
                    groups,
                    norm_topk_prob: norm,
                    scaling_factor: raw.routed_scaling_factor.unwrap_or(1.0) as f32,
                },
                intermediate: moe_inter()?,
                shared: shared.transpose()?,
            }
        }
    };
    check_topk(&cfg.router)?;
    Ok(FfnConfig::Moe(cfg))
}

/// Path of `config.json` inside a model directory.
pub fn config_path(dir: &Path) -> PathBuf {
    dir.join("config.json")
}
