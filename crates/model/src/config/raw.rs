//! The hub's `config.json` as written: the union of the fields the supported
//! architectures use, under their hub names, before any checking.

use serde::Deserialize;
use serde_json::Value;

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

/// Token ids given as one number or a list of numbers (`eos_token_id`).
pub(super) fn token_ids(v: &Option<Value>) -> Vec<u32> {
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
