//! GGUF models: the configuration from GGUF metadata and the translation of Hugging Face
//! tensor names to llama.cpp's (`model.layers.3.self_attn.q_proj.weight` ->
//! `blk.3.attn_q.weight`).
//!
//! A key design decision made here is to build the same [`RawConfig`] a `config.json` would
//! give and reuse [`ModelConfig::from_raw`], so GGUF models get the same validation and the
//! same forward pass as safetensors ones. One difference is kept explicit: llama.cpp's
//! converter permutes the Q and K rows of `llama` models for its interleaved rotary, so
//! those models rotate interleaved pairs here too.
//!
//! The metadata is read as llama.cpp's graphs read it, not as the original config.json
//! meant it, so a GGUF computes what llama.cpp computes: `qwen3moe` always renormalizes the
//! top-k weights (llama.cpp ignores `norm_topk_prob`), `deepseek2` without
//! `expert_gating_func` uses softmax and without `expert_weights_norm` does not renormalize.
//! Checked against files written by llama.cpp's converter (llama-cpp-python 0.3.36) in
//! `crates/model/tests/gguf_fixtures.rs`.

use serde_json::json;
use strata_formats::gguf::{GgufFile, dequantize_row};

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
        // `glm4moe` files name the pre-FFN norm `post_attention_norm` (llama.cpp's
        // ATTN_POST_NORM), the other architectures `ffn_norm`.
        ("post_attention_layernorm", _) => {
            let post = format!("blk.{layer}.post_attention_norm.{suffix}");
            if exists(&post) {
                return Some((post, None));
            }
            "ffn_norm"
        }
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
    let keys = ArchKeys { g, arch };
    let key = |k: &str| keys.key(k);
    let u = |k: &str| keys.u(k);
    let f = |k: &str| keys.f(k);
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
        Arch::DeepseekV3 | Arch::Glm4Moe => grouped_moe_keys(&keys, hf_arch, &mut raw)?,
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
    if let Some(info) = g.tensor_info("rope_freqs.weight") {
        // The converter stores Llama 3 rope scaling as per-pair frequency divisors
        // (`rope_freqs`) instead of its parameters.
        let mut factors = vec![0.0f32; info.shape().iter().product()];
        dequantize_row(info.ggml_type, g.data(info), &mut factors)
            .map_err(|e| unsupported("rope_freqs.weight", e.to_string()))?;
        let theta = raw.rope_theta.unwrap_or(10000.0);
        let dim = u("rope.dimension_count")
            .or(raw.head_dim)
            .unwrap_or(hidden.unwrap_or(0) / n_heads.unwrap_or(1).max(1));
        raw.rope_scaling = Some(llama3_from_factors(&factors, theta, dim).ok_or_else(|| {
            unsupported(
                "rope_freqs.weight",
                format!("frequency factors {factors:?} are not a Llama 3 rope scaling"),
            )
        })?);
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

/// The metadata keys of a GGUF file's architecture (`{arch}.{name}`).
struct ArchKeys<'a> {
    g: &'a GgufFile,
    arch: &'a str,
}

impl ArchKeys<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    fn u(&self, k: &str) -> Option<usize> {
        self.g.get_u32(&self.key(k)).map(|v| v as usize)
    }

    fn f(&self, k: &str) -> Option<f64> {
        self.g.get_f32(&self.key(k)).map(f64::from)
    }
}

/// The router and attention keys of DeepSeek-V3 and GLM-4.5 files, which llama.cpp stores
/// in its own terms (gating function, bias tensor, MLA as MQA over the latent).
fn grouped_moe_keys(keys: &ArchKeys, hf_arch: Arch, raw: &mut RawConfig) -> Result<()> {
    // llama.cpp renormalizes only when the key is present and true.
    raw.norm_topk_prob = Some(
        keys.g
            .get_bool(&keys.key("expert_weights_norm"))
            .unwrap_or(false),
    );
    raw.scoring_func = Some(
        match keys.u("expert_gating_func") {
            Some(2) => "sigmoid",
            Some(1) => "softmax",
            None if hf_arch == Arch::Glm4Moe => "sigmoid",
            // llama.cpp's default for `deepseek2` files without the key (the early
            // DeepSeek-V2 conversions). A DeepSeek-V3 checkpoint whose config.json
            // lacks `scoring_func` converts to such a file and runs with softmax in
            // llama.cpp too.
            None => "softmax",
            Some(other) => {
                return Err(Error::Unsupported {
                    path: keys.g.path().to_owned(),
                    field: keys.key("expert_gating_func"),
                    message: format!("{other}"),
                });
            }
        }
        .to_owned(),
    );
    let bias = keys
        .g
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
        // Current converters store MLA as MQA over the latent: key_length is
        // kv_lora_rank + rope and value_length is kv_lora_rank; the per-head sizes
        // are in the `_mla` keys. Older files (with attn_kv_b) have only key_length
        // = nope + rope and value_length = v_head_dim.
        let k = keys
            .u("attention.key_length_mla")
            .or(keys.u("attention.key_length"));
        let v = keys
            .u("attention.value_length_mla")
            .or(keys.u("attention.value_length"));
        raw.qk_nope_head_dim = match (k, raw.qk_rope_head_dim) {
            (Some(k), Some(r)) if k > r => Some(k - r),
            _ => None,
        };
        raw.v_head_dim = v;
        raw.head_dim = raw.qk_rope_head_dim;
        // head_count_kv is 1 in the MQA form; the decompressed attention has one
        // key/value head per query head.
        raw.num_key_value_heads = raw.num_attention_heads;
    } else {
        raw.partial_rotary_factor = match (keys.u("rope.dimension_count"), raw.head_dim) {
            (Some(r), Some(h)) if h > 0 => Some(r as f64 / h as f64),
            _ => None,
        };
        raw.use_qk_norm = Some(keys.g.tensor_info("blk.0.attn_q_norm.weight").is_some());
        raw.attention_bias = Some(keys.g.tensor_info("blk.0.attn_q.bias").is_some());
    }
    Ok(())
}

/// Rebuilds DeepSeek's `kv_b_proj` (`[heads * (nope + v), lora]`, per head the `nope`
/// key rows then the `v` value rows) from llama.cpp's split form: `attn_k_b` is
/// `[heads, lora, nope]` (each head's key block transposed, for the absorbed-MLA matmul) and
/// `attn_v_b` is `[heads, v, lora]`. Returns the values and the number of rows.
pub(crate) fn kv_b_from_split(
    k_b: &[f32],
    k_shape: &[usize],
    v_b: &[f32],
    v_shape: &[usize],
) -> Option<(Vec<f32>, usize)> {
    let (&[heads, lora, nope], &[vh, v, vl]) = (k_shape, v_shape) else {
        return None;
    };
    if vh != heads || vl != lora || k_b.len() != heads * lora * nope || v_b.len() != vh * v * vl {
        return None;
    }
    let mut out = Vec::with_capacity(heads * (nope + v) * lora);
    for h in 0..heads {
        let kh = &k_b[h * lora * nope..][..lora * nope];
        for r in 0..nope {
            out.extend((0..lora).map(|c| kh[c * nope + r]));
        }
        out.extend_from_slice(&v_b[h * v * lora..][..v * lora]);
    }
    Some((out, heads * (nope + v)))
}

/// Llama 3 rope parameters that reproduce llama.cpp's per-pair frequency divisors
/// `factors` (`rope_freqs.weight`, `theta^(-2i/dim)` divided by `factors[i]`), or `None`
/// when no parameters do.
///
/// Only the divisors at the model's own frequencies matter, so any parameters that give
/// them are equivalent: with `original_max_position_embeddings = 1` the band edges are
/// `1/wavelength` values, read off the pairs that are not scaled (divisor 1), fully
/// scaled (divisor `factor`) or in between (a line through the in-between pairs). The
/// result is checked by recomputing every divisor as `rope.rs` does.
fn llama3_from_factors(factors: &[f32], theta: f64, dim: usize) -> Option<serde_json::Value> {
    if factors.len() != dim / 2 || factors.is_empty() {
        return None;
    }
    let inv_wavelen: Vec<f64> = (0..factors.len())
        .map(|i| {
            let f = 1.0 / (theta.powf((2 * i) as f64 / dim as f64) as f32);
            f64::from(f) / (2.0 * std::f64::consts::PI)
        })
        .collect();
    let d: Vec<f64> = factors.iter().map(|&v| f64::from(v)).collect();
    let factor = d.iter().copied().fold(1.0f64, f64::max);
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-5 * b.abs().max(1.0);
    // Smoothing weight of each in-between pair: 1/d = (1 - s)/factor + s.
    let mid: Vec<(f64, f64)> = d
        .iter()
        .zip(&inv_wavelen)
        .filter(|(v, _)| !close(**v, 1.0) && !close(**v, factor))
        .map(|(v, x)| (*x, (1.0 / v - 1.0 / factor) / (1.0 - 1.0 / factor)))
        .collect();
    // Fully scaled pairs need x < low, unscaled ones x > high.
    let x_scaled = d
        .iter()
        .zip(&inv_wavelen)
        .filter(|(v, _)| close(**v, factor) && factor > 1.0)
        .map(|(_, x)| *x)
        .fold(0.0f64, f64::max);
    let x_plain = d
        .iter()
        .zip(&inv_wavelen)
        .filter(|(v, _)| close(**v, 1.0))
        .map(|(_, x)| *x)
        .fold(f64::INFINITY, f64::min);
    let (low, high) = match mid.as_slice() {
        [] if factor <= 1.0 => return None,
        [] => {
            let low = if x_plain.is_finite() {
                (x_scaled + x_plain) / 2.0
            } else {
                x_scaled * 2.0
            };
            (low, low * (1.0 + 1e-6))
        }
        [(x, s)] => {
            // Put the upper edge halfway to the first unscaled pair; the line through it
            // and (x, s) gives the lower edge.
            let high = if x_plain.is_finite() {
                (x + x_plain) / 2.0
            } else {
                2.0 * x
            };
            ((x - s * high) / (1.0 - s), high)
        }
        [(x0, s0), (x1, s1), ..] => {
            let slope = (s1 - s0) / (x1 - x0);
            let low = x0 - s0 / slope;
            (low, low + 1.0 / slope)
        }
    };
    if !(low > x_scaled && high > low && high < x_plain) {
        return None;
    }
    // Recompute as rope.rs does (f32, wavelengths 2π/f, original context 1).
    let (fac, lo, hi) = (factor as f32, low as f32, high as f32);
    let ok = (0..factors.len()).all(|i| {
        let f = 1.0 / (theta.powf((2 * i) as f64 / dim as f64) as f32);
        let wavelen = 2.0 * std::f32::consts::PI / f;
        let scaled = if wavelen > 1.0 / lo {
            f / fac
        } else if wavelen < 1.0 / hi {
            f
        } else {
            let smooth = (1.0 / wavelen - lo) / (hi - lo);
            (1.0 - smooth) * f / fac + smooth * f
        };
        ((f / scaled) - factors[i]).abs() <= 1e-4 * factors[i].abs()
    });
    ok.then(|| {
        json!({
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": low,
            "high_freq_factor": high,
            "original_max_position_embeddings": 1.0,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::{hf_to_gguf, llama3_from_factors};

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
        // glm4moe's pre-FFN norm.
        let got = hf_to_gguf("model.layers.2.post_attention_layernorm.weight", |n| {
            n == "blk.2.post_attention_norm.weight"
        });
        assert_eq!(got, Some(("blk.2.post_attention_norm.weight".into(), None)));
        check(
            "model.layers.2.post_attention_layernorm.weight",
            Some(("blk.2.ffn_norm.weight", None)),
        );
        check("something.else", None);
    }

    #[test]
    fn kv_b_round_trip() {
        // Split a known kv_b the way llama.cpp's converter does and rebuild it.
        let (heads, nope, v, lora) = (3, 2, 4, 5);
        let kv_b: Vec<f32> = (0..heads * (nope + v) * lora).map(|i| i as f32).collect();
        let mut k_b = vec![0.0; heads * lora * nope];
        let mut v_b = vec![0.0; heads * v * lora];
        for h in 0..heads {
            for r in 0..nope + v {
                for c in 0..lora {
                    let x = kv_b[(h * (nope + v) + r) * lora + c];
                    if r < nope {
                        k_b[(h * lora + c) * nope + r] = x;
                    } else {
                        v_b[(h * v + r - nope) * lora + c] = x;
                    }
                }
            }
        }
        let (got, rows) =
            super::kv_b_from_split(&k_b, &[heads, lora, nope], &v_b, &[heads, v, lora]).unwrap();
        assert_eq!(rows, heads * (nope + v));
        assert_eq!(got, kv_b);
        assert!(super::kv_b_from_split(&k_b, &[heads, lora, nope], &v_b, &[2, v, lora]).is_none());
    }

    #[test]
    fn llama3_factors() {
        // The llama fixture's rope_freqs (factor 8, low 1, high 4, original context 40).
        let f = [1.0, 7.835_917_5, 8.0, 8.0, 8.0];
        let s = llama3_from_factors(&f, 10000.0, 10).unwrap();
        assert_eq!(s["factor"], 8.0);
        // Plain frequencies or values no Llama 3 scaling gives.
        assert!(llama3_from_factors(&[1.0; 5], 10000.0, 10).is_none());
        assert!(llama3_from_factors(&[8.0, 1.0, 8.0, 1.0, 8.0], 10000.0, 10).is_none());
        assert!(llama3_from_factors(&f, 10000.0, 12).is_none());
    }
}
