//! From [`RawConfig`] to [`ModelConfig`]: required fields, the checks that apply to every
//! architecture, attention and rotary embedding; each layer's feed-forward block is
//! decided in `ffn`.

use std::path::Path;

use serde_json::Value;

use super::ffn::ffn_config;
use super::raw::token_ids;
use super::{
    Arch, AttentionConfig, GqaConfig, MlaConfig, ModelConfig, RawConfig, RopeConfig, RopeScaling,
    RopeStyle,
};
use crate::{Error, Result};

/// Where errors point: the config file being normalised.
pub(super) struct Ctx<'a> {
    path: &'a Path,
}

impl Ctx<'_> {
    pub(super) fn err(&self, message: impl Into<String>) -> Error {
        Error::Config {
            path: self.path.to_owned(),
            message: message.into(),
        }
    }
    pub(super) fn unsupported(&self, field: &str, message: impl Into<String>) -> Error {
        Error::Unsupported {
            path: self.path.to_owned(),
            field: field.to_owned(),
            message: message.into(),
        }
    }
    pub(super) fn need<T: Copy>(&self, v: Option<T>, field: &str) -> Result<T> {
        v.ok_or_else(|| self.err(format!("missing required field `{field}`")))
    }
}

impl ModelConfig {
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
        let fp8_block = fp8_block(raw, &cx)?;
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
        let (attention, head_dim) = attention_config(raw, &cx, arch, hidden, n_heads, n_kv_heads)?;
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
}

/// The block size of FP8 weights' scales, the only quantization implemented.
fn fp8_block(raw: &RawConfig, cx: &Ctx) -> Result<Option<[usize; 2]>> {
    Ok(match &raw.quantization_config {
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
    })
}

/// Self-attention and the per-head dimension the rotary embedding applies to.
fn attention_config(
    raw: &RawConfig,
    cx: &Ctx,
    arch: Arch,
    hidden: usize,
    n_heads: usize,
    n_kv_heads: usize,
) -> Result<(AttentionConfig, usize)> {
    let is_mla = matches!(arch, Arch::DeepseekV2 | Arch::DeepseekV3);
    let head_dim = if is_mla {
        cx.need(raw.qk_rope_head_dim, "qk_rope_head_dim")?
    } else {
        raw.head_dim.unwrap_or(hidden / n_heads)
    };
    let attention = if is_mla {
        AttentionConfig::Mla(MlaConfig {
            n_heads,
            q_lora_rank: raw.q_lora_rank,
            kv_lora_rank: cx.need(raw.kv_lora_rank, "kv_lora_rank")?,
            qk_nope_head_dim: cx.need(raw.qk_nope_head_dim, "qk_nope_head_dim")?,
            qk_rope_head_dim: head_dim,
            v_head_dim: cx.need(raw.v_head_dim, "v_head_dim")?,
            bias: raw.attention_bias.unwrap_or(false),
        })
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
        AttentionConfig::Gqa(GqaConfig {
            n_heads,
            n_kv_heads,
            head_dim,
            qkv_bias,
            o_bias,
            qk_norm,
            sliding_window: sliding_window.map(|w| w as usize),
        })
    };
    Ok((attention, head_dim))
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
