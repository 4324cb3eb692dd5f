//! The one place that names a model's tensors in a checkpoint.
//!
//! Every reader of a checkpoint (the CPU [`crate::Model`], the whole-model GPU path and the
//! hybrid executor's host copy of the experts) asks here which tensors hold a layer's
//! weights, so a new layout (a new stacking of experts, an architecture's own prefix) is
//! taught once. Names are Hugging Face's; a GGUF's are translated underneath by
//! [`crate::gguf::hf_to_gguf`] and a converted model (`strata convert`) stores the names the
//! loader built, so both answer to the same questions through [`Source::has`].

use crate::config::SharedExpertConfig;
use crate::source::Source;

/// The token embedding (`.weight`: `[vocab, hidden]`).
pub const EMBED: &str = "model.embed_tokens";
/// The final RMSNorm's weight.
pub const FINAL_NORM: &str = "model.norm.weight";
/// The output projection (`.weight`: `[vocab, hidden]`), absent when tied to [`EMBED`].
pub const LM_HEAD: &str = "lm_head";

/// A SwiGLU MLP's gate, up and down projections below its prefix (dense MLPs, shared
/// experts and Hugging Face's per-expert tensors).
pub const MLP_PROJECTIONS: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];

/// One tensor of routed expert `e` as `strata convert` stores it below the layer's expert
/// prefix, `{prefix}.{e}.{part}`: `gate_up` and `down` in a packed format (gate and up rows
/// interleaved in strips, as the CPU kernels read them), or `gate`, `up` and `down` as they
/// were (GGUF blocks, or plain matrices).
pub fn converted_expert(prefix: &str, e: usize, part: ExpertPart) -> String {
    format!("{prefix}.{e}.{}", part.name())
}

/// The parts of a converted routed expert ([`converted_expert`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertPart {
    /// The packed gate and up projections, `[2 x padded inter, hidden]`.
    GateUp,
    /// The gate projection, `[inter, hidden]`.
    Gate,
    /// The up projection, `[inter, hidden]`.
    Up,
    /// The down projection, `[hidden, inter]`.
    Down,
}

impl ExpertPart {
    /// Its name in the tensor's.
    pub fn name(self) -> &'static str {
        match self {
            ExpertPart::GateUp => "gate_up",
            ExpertPart::Gate => "gate",
            ExpertPart::Up => "up",
            ExpertPart::Down => "down",
        }
    }
}

/// Mixtral's names for the same projections of its experts.
const MIXTRAL_PROJECTIONS: [&str; 3] = ["w1", "w3", "w2"];

/// The tensors of decoder layer `i` outside its feed-forward block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerNames {
    prefix: String,
}

impl LayerNames {
    /// Layer `i`.
    pub fn new(i: usize) -> LayerNames {
        LayerNames {
            prefix: format!("model.layers.{i}"),
        }
    }

    /// The attention block's tensors.
    pub fn attention(&self) -> AttentionNames {
        AttentionNames {
            prefix: format!("{}.self_attn", self.prefix),
        }
    }

    /// The RMSNorm weight before attention.
    pub fn attn_norm(&self) -> String {
        format!("{}.input_layernorm.weight", self.prefix)
    }

    /// The RMSNorm weight before the feed-forward block.
    pub fn ffn_norm(&self) -> String {
        format!("{}.post_attention_layernorm.weight", self.prefix)
    }

    /// A dense MLP's prefix (`gate_proj`, `up_proj`, `down_proj` below it).
    pub fn dense_mlp(&self) -> String {
        format!("{}.mlp", self.prefix)
    }

    /// Where this layer's mixture-of-experts block is stored in `src`: `mlp`, or Mixtral's
    /// `block_sparse_moe` when the checkpoint uses that name.
    pub fn moe(&self, src: &Source, shared: Option<&SharedExpertConfig>) -> MoeNames {
        let mixtral = format!("{}.block_sparse_moe", self.prefix);
        let block = if src.has(&format!("{mixtral}.gate.weight")) {
            mixtral
        } else {
            self.dense_mlp()
        };
        let experts = ExpertLayout::resolve(src, &block);
        let shared_name = shared.map(|s| {
            // Qwen2-MoE has one gated shared expert; DeepSeek and GLM an ungated set.
            let name = if s.gated {
                "shared_expert"
            } else {
                "shared_experts"
            };
            format!("{block}.{name}")
        });
        let shared_gate = shared
            .filter(|s| s.gated)
            .map(|_| format!("{block}.shared_expert_gate"));
        MoeNames {
            router: format!("{block}.gate"),
            correction_bias: format!("{block}.gate.e_score_correction_bias"),
            experts,
            shared: shared_name,
            shared_gate,
            block,
        }
    }
}

/// The tensors of one attention block. Projections are prefixes (`.weight`, and `.bias`
/// where the config says so); norms are full names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttentionNames {
    prefix: String,
}

impl AttentionNames {
    /// Query projection (without a compressed query).
    pub fn q(&self) -> String {
        format!("{}.q_proj", self.prefix)
    }

    /// Key projection (grouped-query attention).
    pub fn k(&self) -> String {
        format!("{}.k_proj", self.prefix)
    }

    /// Value projection (grouped-query attention).
    pub fn v(&self) -> String {
        format!("{}.v_proj", self.prefix)
    }

    /// Output projection.
    pub fn o(&self) -> String {
        format!("{}.o_proj", self.prefix)
    }

    /// Query compression (latent attention with `q_lora_rank`).
    pub fn q_a(&self) -> String {
        format!("{}.q_a_proj", self.prefix)
    }

    /// Query decompression (latent attention with `q_lora_rank`).
    pub fn q_b(&self) -> String {
        format!("{}.q_b_proj", self.prefix)
    }

    /// Latent and rotary key projection (latent attention).
    pub fn kv_a(&self) -> String {
        format!("{}.kv_a_proj_with_mqa", self.prefix)
    }

    /// Latent to per-head keys and values (latent attention).
    pub fn kv_b(&self) -> String {
        format!("{}.kv_b_proj", self.prefix)
    }

    /// Per-head query RMSNorm (Qwen3).
    pub fn q_norm(&self) -> String {
        format!("{}.q_norm.weight", self.prefix)
    }

    /// Per-head key RMSNorm (Qwen3).
    pub fn k_norm(&self) -> String {
        format!("{}.k_norm.weight", self.prefix)
    }

    /// RMSNorm of the compressed query.
    pub fn q_a_norm(&self) -> String {
        format!("{}.q_a_layernorm.weight", self.prefix)
    }

    /// RMSNorm of the latent.
    pub fn kv_a_norm(&self) -> String {
        format!("{}.kv_a_layernorm.weight", self.prefix)
    }
}

/// The tensors of one mixture-of-experts block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoeNames {
    /// The block's prefix (`model.layers.3.mlp`).
    pub block: String,
    /// The router (`.weight`: `[n_experts, hidden]`).
    pub router: String,
    /// DeepSeek-V3's routing bias `[n_experts]`, when the router has one.
    pub correction_bias: String,
    /// How the routed experts are stored.
    pub experts: ExpertLayout,
    /// The shared expert MLP's prefix, when the block has one.
    pub shared: Option<String>,
    /// The shared expert's scalar gate (`.weight`: `[1, hidden]`), when gated.
    pub shared_gate: Option<String>,
}

/// How a block's routed experts are stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExpertLayout {
    /// `gate_up: [E, 2I, H]` (gate rows, then up rows, per expert), `down: [E, H, I]`.
    Stacked {
        /// The fused gate/up tensor.
        gate_up: String,
        /// The down tensor.
        down: String,
    },
    /// One tensor per expert and projection: `{prefix}.{e}.{name}.weight` with the names of
    /// the gate, up and down projections (Mixtral's checkpoints say `w1`, `w3`, `w2`). A
    /// GGUF's stacked `*_exps` tensors are read this way too, one expert's slice each.
    PerExpert {
        /// `model.layers.3.mlp.experts`.
        prefix: String,
        /// Gate, up and down projection names.
        names: [&'static str; 3],
    },
    /// A converted model's experts (`strata convert`): `{prefix}.{e}.gate_up` (packed gate
    /// and up strips) and `{prefix}.{e}.down`, or plain `.gate`, `.up`, `.down`.
    Converted {
        /// `model.layers.3.mlp.experts`.
        prefix: String,
    },
}

impl ExpertLayout {
    fn resolve(src: &Source, block: &str) -> ExpertLayout {
        let prefix = format!("{block}.experts");
        if let Source::Strata(_) = src {
            return ExpertLayout::Converted { prefix };
        }
        let gate_up = format!("{prefix}.gate_up_proj");
        if src.has(&gate_up) {
            return ExpertLayout::Stacked {
                gate_up,
                down: format!("{prefix}.down_proj"),
            };
        }
        let names = if src.has(&format!("{prefix}.0.{}.weight", MIXTRAL_PROJECTIONS[0])) {
            MIXTRAL_PROJECTIONS
        } else {
            MLP_PROJECTIONS
        };
        ExpertLayout::PerExpert { prefix, names }
    }

    /// The prefix every expert's name starts with (`model.layers.3.mlp.experts`).
    pub fn prefix(&self) -> &str {
        match self {
            ExpertLayout::Stacked { gate_up, .. } => gate_up
                .strip_suffix(".gate_up_proj")
                .unwrap_or(gate_up.as_str()),
            ExpertLayout::PerExpert { prefix, .. } | ExpertLayout::Converted { prefix } => prefix,
        }
    }

    /// A tensor holding expert 0's first projection, whose stored type every expert shares.
    pub fn first_tensor(&self, src: &Source) -> String {
        match self {
            ExpertLayout::Stacked { gate_up, .. } => gate_up.clone(),
            ExpertLayout::PerExpert { prefix, names } => format!("{prefix}.0.{}.weight", names[0]),
            ExpertLayout::Converted { prefix } => {
                let packed = format!("{prefix}.0.gate_up");
                if src.has(&packed) {
                    packed
                } else {
                    format!("{prefix}.0.gate")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_names_follow_hugging_face() {
        let l = LayerNames::new(3);
        assert_eq!(l.attention().q(), "model.layers.3.self_attn.q_proj");
        assert_eq!(
            l.attention().kv_a_norm(),
            "model.layers.3.self_attn.kv_a_layernorm.weight"
        );
        assert_eq!(l.attn_norm(), "model.layers.3.input_layernorm.weight");
        assert_eq!(
            l.ffn_norm(),
            "model.layers.3.post_attention_layernorm.weight"
        );
        assert_eq!(l.dense_mlp(), "model.layers.3.mlp");
    }

    #[test]
    fn stacked_prefix_is_the_experts_prefix() {
        let s = ExpertLayout::Stacked {
            gate_up: "model.layers.1.mlp.experts.gate_up_proj".into(),
            down: "model.layers.1.mlp.experts.down_proj".into(),
        };
        assert_eq!(s.prefix(), "model.layers.1.mlp.experts");
    }
}
