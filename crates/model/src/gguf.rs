//! GGUF models: the configuration from GGUF metadata and the translation of Hugging Face
//! tensor names to llama.cpp's (`model.layers.3.self_attn.q_proj.weight` ->
//! `blk.3.attn_q.weight`).
//!
//! A key design decision made here is to build the same [`RawConfig`] a `config.json` would
//! give and reuse [`ModelConfig::from_raw`], so GGUF models get the same validation and the
//! same forward pass as safetensors ones. One difference is kept explicit: llama.cpp's
//! converter permutes the Q and K rows of `llama` models for its interleaved rotary, so
//! those models rotate interleaved pairs here too.

use serde_json::json;
use strata_formats::gguf::GgufFile;

use crate::config::{Arch, ModelConfig, RawConfig, RopeStyle};
use crate::{Error, Result};

/// Translates a Hugging Face tensor name into the GGUF tensor holding it, and the expert
/// index when it is one expert of a stacked `*_exps` tensor. `exists` says whether a GGUF
/// tensor name is present (for names with two possible layouts).
pub fn hf_to_gguf(name: &str, exists: impl Fn(&str) -> bool) -> Option<(String, Option<usize>)> {
    let global = match name {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(g) = global {
        return Some((g.to_owned(), None));
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (module, suffix) = rest.rsplit_once('.')?; // suffix: weight | bias | e_score_correction_bias
    let blk = |n: &str| Some((format!("blk.{layer}.{n}.{suffix}"), None));
    if let Some(expert_rest) = module.strip_prefix("mlp.experts.") {
        let (e, proj) = expert_rest.split_once('.')?;
        let e: usize = e.parse().ok()?;
        let base = match proj {
            "gate_proj" => "ffn_gate",
            "up_proj" => "ffn_up",
            "down_proj" => "ffn_down",
            _ => return None,
        };
        let stacked = format!("blk.{layer}.{base}_exps.{suffix}");
        if exists(&stacked) {
            return Some((stacked, Some(e)));
        }
        // Older Mixtral GGUFs store one tensor per expert.
        return Some((format!("blk.{layer}.{base}.{e}.{suffix}"), None));
    }
    let gguf = match (module, suffix) {
        ("input_layernorm", _) => "attn_norm",
        ("post_attention_layernorm", _) => "ffn_norm",
        ("self_attn.q_proj", _) => "attn_q",
        ("self_attn.k_proj", _) => "attn_k",
        ("self_attn.v_proj", _) => "attn_v",
        ("self_attn.o_proj", _) => "attn_output",
        ("self_attn.q_norm", _) => "attn_q_norm",
        ("self_attn.k_norm", _) => "attn_k_norm",
        ("self_attn.q_a_proj", _) => "attn_q_a",
        ("self_attn.q_a_layernorm", _) => "attn_q_a_norm",
        ("self_attn.q_b_proj", _) => "attn_q_b",
        ("self_attn.kv_a_proj_with_mqa", _) => "attn_kv_a_mqa",
        ("self_attn.kv_a_layernorm", _) => "attn_kv_a_norm",
        ("self_attn.kv_b_proj", _) => "attn_kv_b",
        ("mlp.gate_proj", _) => "ffn_gate",
        ("mlp.up_proj", _) => "ffn_up",
        ("mlp.down_proj", _) => "ffn_down",
        ("mlp.gate", "weight") => "ffn_gate_inp",
        ("mlp.gate", "e_score_correction_bias") => {
            return Some((format!("blk.{layer}.exp_probs_b.bias"), None));
        }
        ("mlp.shared_expert.gate_proj" | "mlp.shared_experts.gate_proj", _) => "ffn_gate_shexp",
        ("mlp.shared_expert.up_proj" | "mlp.shared_experts.up_proj", _) => "ffn_up_shexp",
        ("mlp.shared_expert.down_proj" | "mlp.shared_experts.down_proj", _) => "ffn_down_shexp",
        ("mlp.shared_expert_gate", _) => "ffn_gate_inp_shexp",
        _ => return None,
    };
    blk(gguf)
}

/// Reads the model configuration from GGUF metadata.
pub fn config_from_gguf(g: &GgufFile) -> Result<ModelConfig> {
    let path = g.path();
    let unsupported = |field: &str, message: String| Error::Unsupported {
        path: path.to_owned(),
        field: field.to_owned(),
        message,
    };
    let arch = g
        .architecture()
        .ok_or_else(|| unsupported("general.architecture", "missing".into()))?;
    let key = |k: &str| format!("{arch}.{k}");
    let u = |k: &str| g.get_u32(&key(k)).map(|v| v as usize);
    let f = |k: &str| g.get_f32(&key(k)).map(f64::from);
    let has_experts = u("expert_count").unwrap_or(0) > 0;
    let hf_arch = match arch {
        "llama" if has_experts => Arch::Mixtral,
        "llama" => Arch::Llama,
        "qwen2" => Arch::Qwen2,
        "qwen2moe" => Arch::Qwen2Moe,
        "qwen3moe" => Arch::Qwen3Moe,
        "deepseek2" => Arch::DeepseekV3,
        "glm4moe" => Arch::Glm4Moe,
        other => {
            return Err(unsupported(
                "general.architecture",
                format!(
                    "`{other}`; supported: llama, qwen2, qwen2moe, qwen3moe, deepseek2, glm4moe"
                ),
            ));
        }
    };
    let vocab = g
        .get_str_array("tokenizer.ggml.tokens")
        .map(|t| t.len())
        .or(u("vocab_size"))
        .or_else(|| g.tensor_info("token_embd.weight").map(|t| t.shape()[0]));
    let n_layers = u("block_count").map(|n| n - u("nextn_predict_layers").unwrap_or(0));
    let n_heads = u("attention.head_count");
    let hidden = u("embedding_length");
    let mut raw = RawConfig {
        architectures: vec![hf_arch.hf_name().to_owned()],
        vocab_size: vocab,
        hidden_size: hidden,
        num_hidden_layers: n_layers,
        num_attention_heads: n_heads,
        num_key_value_heads: u("attention.head_count_kv"),
        head_dim: u("attention.key_length"),
        intermediate_size: u("feed_forward_length"),
        rms_norm_eps: f("attention.layer_norm_rms_epsilon"),
        max_position_embeddings: u("context_length"),
        tie_word_embeddings: Some(g.tensor_info("output.weight").is_none()),
        rope_theta: f("rope.freq_base"),
        num_experts: u("expert_count"),
        num_experts_per_tok: u("expert_used_count"),
        moe_intermediate_size: u("expert_feed_forward_length"),
        shared_expert_intermediate_size: u("expert_shared_feed_forward_length"),
        n_shared_experts: u("expert_shared_count"),
        first_k_dense_replace: u("leading_dense_block_count"),
        routed_scaling_factor: f("expert_weights_scale"),
        n_group: u("expert_group_count"),
        topk_group: u("expert_group_used_count"),
        q_lora_rank: u("attention.q_lora_rank"),
        kv_lora_rank: u("attention.kv_lora_rank"),
        qk_rope_head_dim: u("rope.dimension_count"),
        v_head_dim: u("attention.value_length"),
        ..RawConfig::default()
    };
    match hf_arch {
        Arch::Mixtral => raw.intermediate_size = u("feed_forward_length"),
        Arch::Qwen3Moe => raw.norm_topk_prob = Some(true),
        Arch::Qwen2Moe => raw.norm_topk_prob = Some(false),
        Arch::DeepseekV3 | Arch::Glm4Moe => {
            raw.norm_topk_prob = g.get_bool(&key("expert_weights_norm"));
            raw.scoring_func = Some(
                match u("expert_gating_func") {
                    Some(2) => "sigmoid",
                    Some(1) => "softmax",
                    None if hf_arch == Arch::Glm4Moe => "sigmoid",
                    None => "softmax",
                    Some(other) => {
                        return Err(unsupported(&key("expert_gating_func"), format!("{other}")));
                    }
                }
                .to_owned(),
            );
            let bias = g
                .tensors()
                .iter()
                .any(|t| t.name.ends_with("exp_probs_b.bias"));
            let groups = raw.n_group.unwrap_or(1) > 1;
            raw.topk_method = Some(
                match (bias, groups) {
                    (true, _) => "noaux_tc",
                    (false, true) => "group_limited_greedy",
                    (false, false) => "greedy",
                }
                .to_owned(),
            );
            if bias && !groups {
                raw.n_group = Some(1);
                raw.topk_group = Some(1);
            }
            if hf_arch == Arch::DeepseekV3 {
                // key_length is nope + rope for MLA.
                raw.qk_nope_head_dim = match (u("attention.key_length"), raw.qk_rope_head_dim) {
                    (Some(k), Some(r)) if k > r => Some(k - r),
                    _ => None,
                };
                raw.num_key_value_heads = n_heads;
                if g.tensor_info("blk.0.attn_kv_b.weight").is_none()
                    && g.tensor_info("blk.0.attn_k_b.weight").is_some()
                {
                    return Err(unsupported(
                        "blk.N.attn_k_b",
                        "MLA GGUFs with split attn_k_b/attn_v_b tensors are not supported yet"
                            .into(),
                    ));
                }
            } else {
                raw.partial_rotary_factor = match (u("rope.dimension_count"), raw.head_dim) {
                    (Some(r), Some(h)) if h > 0 => Some(r as f64 / h as f64),
                    _ => None,
                };
                raw.use_qk_norm = Some(g.tensor_info("blk.0.attn_q_norm.weight").is_some());
                raw.attention_bias = Some(g.tensor_info("blk.0.attn_q.bias").is_some());
            }
        }
        Arch::Llama | Arch::Qwen2 => {}
        Arch::DeepseekV2 => unreachable!("deepseek2 GGUFs are read as DeepseekV3"),
    }
    if let Some(kind) = g.get_str(&key("rope.scaling.type")) {
        let mut s = json!({"rope_type": kind});
        if let Some(factor) = f("rope.scaling.factor") {
            s["factor"] = json!(factor);
        }
        if let Some(orig) = u("rope.scaling.original_context_length") {
            s["original_max_position_embeddings"] = json!(orig);
        }
        if let Some(m) = f("rope.scaling.yarn_log_multiplier") {
            // llama.cpp stores 0.1 * mscale_all_dim.
            s["mscale"] = json!(m * 10.0);
            s["mscale_all_dim"] = json!(m * 10.0);
        }
        if kind != "none" {
            raw.rope_scaling = Some(s);
        }
    }
    let mut cfg = ModelConfig::from_raw(&raw, path)?;
    if arch == "llama" {
        cfg.rope.style = RopeStyle::Interleaved;
    }
    let special = strata_formats::gguf::tokenizer::special_tokens(g);
    cfg.bos_token_id = special.bos;
    cfg.eos_token_ids = special.eos.into_iter().chain(special.eot).collect();
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::hf_to_gguf;

    fn check(hf: &str, want: Option<(&str, Option<usize>)>) {
        let got = hf_to_gguf(hf, |n| n.contains("_exps"));
        assert_eq!(got, want.map(|(n, e)| (n.to_owned(), e)), "{hf}");
    }

    #[test]
    fn names() {
        check(
            "model.embed_tokens.weight",
            Some(("token_embd.weight", None)),
        );
        check(
            "model.layers.3.self_attn.q_proj.bias",
            Some(("blk.3.attn_q.bias", None)),
        );
        check(
            "model.layers.2.mlp.experts.5.down_proj.weight",
            Some(("blk.2.ffn_down_exps.weight", Some(5))),
        );
        check(
            "model.layers.0.mlp.gate.weight",
            Some(("blk.0.ffn_gate_inp.weight", None)),
        );
        check(
            "model.layers.1.mlp.gate.e_score_correction_bias",
            Some(("blk.1.exp_probs_b.bias", None)),
        );
        check(
            "model.layers.1.mlp.shared_expert_gate.weight",
            Some(("blk.1.ffn_gate_inp_shexp.weight", None)),
        );
        check("model.layers.x.mlp.gate.weight", None);
        check("something.else", None);
    }
}
