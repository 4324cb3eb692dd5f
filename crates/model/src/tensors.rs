//! The tensors each block of a model reads from a checkpoint, with their shapes: an
//! attention block's projections and norms ([`AttentionTensors`]), a SwiGLU MLP's
//! ([`MlpTensors`]), a mixture-of-experts block's router and shared expert
//! ([`MoeTensors`]) and its stacked routed experts ([`StackedExperts`]).
//!
//! A key design decision made here is that these are plain data, built from a block's
//! names ([`crate::names`]) and its config, which every loader maps to its own buffers:
//! the CPU [`crate::Model`] to [`crate::linear::Linear`]s, the accelerator model of
//! `strata-exec` to device matrices. The shape arithmetic of every architecture is written
//! here once, so the two cannot disagree about what a checkpoint must hold.

use crate::config::{AttentionConfig, GqaConfig, MlaConfig, MoeConfig};
use crate::names::{self, AttentionNames, MoeNames};

/// A linear layer's tensors: `{name}.weight` `[rows, cols]` (the `nn.Linear` layout,
/// `rows` outputs of `cols` inputs) and, when `bias`, `{name}.bias` `[rows]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatrixSpec {
    /// The prefix of the weight and bias names (`model.layers.0.self_attn.q_proj`).
    pub name: String,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// Whether a bias is stored.
    pub bias: bool,
}

impl MatrixSpec {
    /// `{name}.weight` `[rows, cols]`, with `{name}.bias` when `bias`.
    pub fn new(name: impl Into<String>, rows: usize, cols: usize, bias: bool) -> MatrixSpec {
        MatrixSpec {
            name: name.into(),
            rows,
            cols,
            bias,
        }
    }

    /// The weight's name, `{name}.weight`.
    pub fn weight(&self) -> String {
        format!("{}.weight", self.name)
    }

    /// The weight's shape, `[rows, cols]`.
    pub fn shape(&self) -> [usize; 2] {
        [self.rows, self.cols]
    }
}

/// A tensor read whole by its full name, of exactly `shape` (norm weights, biases, an
/// expert stack).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// The tensor's name.
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
}

impl TensorSpec {
    /// Tensor `name` of `shape`.
    pub fn new(name: impl Into<String>, shape: &[usize]) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            shape: shape.to_vec(),
        }
    }
}

/// The tensors of one attention block, one variant per attention kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttentionTensors {
    /// Grouped-query attention.
    Gqa(GqaTensors),
    /// Multi-head latent attention.
    Mla(MlaTensors),
}

/// Grouped-query attention's tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GqaTensors {
    /// `q_proj` `[n_heads * head_dim, hidden]`.
    pub q: MatrixSpec,
    /// `k_proj` `[n_kv_heads * head_dim, hidden]`.
    pub k: MatrixSpec,
    /// `v_proj` `[n_kv_heads * head_dim, hidden]`.
    pub v: MatrixSpec,
    /// `o_proj` `[hidden, n_heads * head_dim]`.
    pub o: MatrixSpec,
    /// Per-head query RMSNorm `[head_dim]` (`qk_norm`).
    pub q_norm: Option<TensorSpec>,
    /// Per-head key RMSNorm `[head_dim]` (`qk_norm`).
    pub k_norm: Option<TensorSpec>,
}

/// Multi-head latent attention's tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MlaTensors {
    /// `q_a_proj` `[q_lora_rank, hidden]` and `q_a_layernorm` `[q_lora_rank]`, when queries
    /// are compressed.
    pub q_a: Option<(MatrixSpec, TensorSpec)>,
    /// `q_b_proj` `[n_heads * qk_head_dim, q_lora_rank]` after compression, else `q_proj`
    /// `[n_heads * qk_head_dim, hidden]`; never biased.
    pub q: MatrixSpec,
    /// `kv_a_proj_with_mqa` `[kv_lora_rank + qk_rope_head_dim, hidden]`.
    pub kv_a: MatrixSpec,
    /// `kv_a_layernorm` `[kv_lora_rank]`.
    pub kv_a_norm: TensorSpec,
    /// `kv_b_proj.weight` `[n_heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]`, read
    /// whole in f32: it is absorbed per head into queries and outputs.
    pub kv_b: TensorSpec,
    /// `o_proj` `[hidden, n_heads * v_head_dim]`.
    pub o: MatrixSpec,
}

impl AttentionTensors {
    /// The tensors of the attention block named `n`, shaped by `cfg` for residual width
    /// `hidden`.
    pub fn new(n: &AttentionNames, cfg: &AttentionConfig, hidden: usize) -> AttentionTensors {
        match cfg {
            AttentionConfig::Gqa(c) => AttentionTensors::Gqa(GqaTensors::new(n, c, hidden)),
            AttentionConfig::Mla(c) => AttentionTensors::Mla(MlaTensors::new(n, c, hidden)),
        }
    }
}

impl GqaTensors {
    fn new(n: &AttentionNames, c: &GqaConfig, hidden: usize) -> GqaTensors {
        let (q_w, kv_w) = (c.n_heads * c.head_dim, c.kv_width());
        let norm = |name: String| c.qk_norm.then(|| TensorSpec::new(name, &[c.head_dim]));
        GqaTensors {
            q: MatrixSpec::new(n.q(), q_w, hidden, c.qkv_bias),
            k: MatrixSpec::new(n.k(), kv_w, hidden, c.qkv_bias),
            v: MatrixSpec::new(n.v(), kv_w, hidden, c.qkv_bias),
            o: MatrixSpec::new(n.o(), hidden, q_w, c.o_bias),
            q_norm: norm(n.q_norm()),
            k_norm: norm(n.k_norm()),
        }
    }
}

impl MlaTensors {
    fn new(n: &AttentionNames, c: &MlaConfig, hidden: usize) -> MlaTensors {
        let q_w = c.n_heads * c.qk_head_dim();
        let (q_a, q) = match c.q_lora_rank {
            Some(r) => (
                Some((
                    MatrixSpec::new(n.q_a(), r, hidden, c.bias),
                    TensorSpec::new(n.q_a_norm(), &[r]),
                )),
                MatrixSpec::new(n.q_b(), q_w, r, false),
            ),
            None => (None, MatrixSpec::new(n.q(), q_w, hidden, false)),
        };
        let kv_b_rows = c.n_heads * (c.qk_nope_head_dim + c.v_head_dim);
        let kv_a_rows = c.kv_lora_rank + c.qk_rope_head_dim;
        MlaTensors {
            q_a,
            q,
            kv_a: MatrixSpec::new(n.kv_a(), kv_a_rows, hidden, c.bias),
            kv_a_norm: TensorSpec::new(n.kv_a_norm(), &[c.kv_lora_rank]),
            kv_b: TensorSpec::new(format!("{}.weight", n.kv_b()), &[kv_b_rows, c.kv_lora_rank]),
            o: MatrixSpec::new(n.o(), hidden, c.n_heads * c.v_head_dim, c.bias),
        }
    }
}

/// A SwiGLU MLP's projections: gate and up `[inter, hidden]`, down `[hidden, inter]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MlpTensors {
    /// The prefix the projections are named below (`model.layers.0.mlp`); a converted
    /// model (`strata convert`) stores a dense MLP or shared expert as a set of one there.
    pub prefix: String,
    /// Gate projection `[inter, hidden]`.
    pub gate: MatrixSpec,
    /// Up projection `[inter, hidden]`.
    pub up: MatrixSpec,
    /// Down projection `[hidden, inter]`.
    pub down: MatrixSpec,
}

impl MlpTensors {
    /// A dense MLP or shared expert `{prefix}.gate_proj`, `.up_proj`, `.down_proj`.
    pub fn new(prefix: &str, hidden: usize, inter: usize) -> MlpTensors {
        MlpTensors::named(prefix.to_owned(), names::MLP_PROJECTIONS, hidden, inter)
    }

    /// Routed expert `e` stored one tensor per projection
    /// ([`names::ExpertLayout::PerExpert`]): `{prefix}.{e}.{names[i]}`.
    pub fn expert(
        prefix: &str,
        names: [&str; 3],
        e: usize,
        hidden: usize,
        inter: usize,
    ) -> MlpTensors {
        MlpTensors::named(format!("{prefix}.{e}"), names, hidden, inter)
    }

    fn named(prefix: String, names: [&str; 3], hidden: usize, inter: usize) -> MlpTensors {
        let [gate, up, down] = names.map(|p| format!("{prefix}.{p}"));
        MlpTensors {
            gate: MatrixSpec::new(gate, inter, hidden, false),
            up: MatrixSpec::new(up, inter, hidden, false),
            down: MatrixSpec::new(down, hidden, inter, false),
            prefix,
        }
    }

    /// The residual width.
    pub fn hidden(&self) -> usize {
        self.down.rows
    }

    /// The intermediate size.
    pub fn inter(&self) -> usize {
        self.gate.rows
    }
}

/// A block's `n` routed experts stacked in two tensors ([`names::ExpertLayout::Stacked`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackedExperts {
    /// `[n, 2 * inter, hidden]`: each expert's gate rows, then its up rows.
    pub gate_up: TensorSpec,
    /// `[n, hidden, inter]`.
    pub down: TensorSpec,
}

impl StackedExperts {
    /// `n` experts of intermediate size `inter` stored in tensors `gate_up` and `down`.
    pub fn new(gate_up: &str, down: &str, n: usize, hidden: usize, inter: usize) -> StackedExperts {
        StackedExperts {
            gate_up: TensorSpec::new(gate_up, &[n, 2 * inter, hidden]),
            down: TensorSpec::new(down, &[n, hidden, inter]),
        }
    }
}

/// A mixture-of-experts block's tensors besides its routed experts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoeTensors {
    /// The router `[n_experts, hidden]`, computed in f32 (its choices must not flip).
    pub router: MatrixSpec,
    /// The routing bias `[n_experts]` (DeepSeek-V3's `e_score_correction_bias`).
    pub correction_bias: Option<TensorSpec>,
    /// The shared expert MLP.
    pub shared: Option<MlpTensors>,
    /// The shared expert's scalar gate `[1, hidden]`, computed in f32.
    pub shared_gate: Option<MatrixSpec>,
}

impl MoeTensors {
    /// The tensors of the block named `n`, shaped by `cfg` for residual width `hidden`.
    pub fn new(n: &MoeNames, cfg: &MoeConfig, hidden: usize) -> MoeTensors {
        let n_experts = cfg.router.n_experts;
        let shared = match (&cfg.shared, &n.shared) {
            (Some(s), Some(prefix)) => Some(MlpTensors::new(prefix, hidden, s.intermediate)),
            _ => None,
        };
        MoeTensors {
            router: MatrixSpec::new(n.router.as_str(), n_experts, hidden, false),
            correction_bias: cfg
                .router
                .correction_bias
                .then(|| TensorSpec::new(n.correction_bias.as_str(), &[n_experts])),
            shared_gate: shared
                .as_ref()
                .and(n.shared_gate.as_ref())
                .map(|g| MatrixSpec::new(g.as_str(), 1, hidden, false)),
            shared,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::LayerNames;

    #[test]
    fn latent_attention_shapes_follow_the_config() {
        let cfg = AttentionConfig::Mla(MlaConfig {
            n_heads: 4,
            q_lora_rank: Some(24),
            kv_lora_rank: 16,
            qk_nope_head_dim: 8,
            qk_rope_head_dim: 4,
            v_head_dim: 6,
            bias: true,
        });
        let AttentionTensors::Mla(t) =
            AttentionTensors::new(&LayerNames::new(2).attention(), &cfg, 32)
        else {
            panic!("latent attention expected");
        };
        let (q_a, q_a_norm) = t.q_a.expect("compressed queries");
        assert_eq!(
            q_a,
            MatrixSpec::new("model.layers.2.self_attn.q_a_proj", 24, 32, true)
        );
        assert_eq!(q_a_norm.shape, [24]);
        assert_eq!(
            t.q,
            MatrixSpec::new("model.layers.2.self_attn.q_b_proj", 48, 24, false)
        );
        assert_eq!((t.kv_a.rows, t.kv_a.cols, t.kv_a.bias), (20, 32, true));
        assert_eq!(
            t.kv_b,
            TensorSpec::new("model.layers.2.self_attn.kv_b_proj.weight", &[56, 16])
        );
        assert_eq!((t.o.rows, t.o.cols), (32, 24));
    }

    #[test]
    fn experts_are_named_below_their_index() {
        let t = MlpTensors::expert("m.experts", ["w1", "w3", "w2"], 5, 8, 3);
        assert_eq!(t.gate.weight(), "m.experts.5.w1.weight");
        assert_eq!(
            (t.up.name.as_str(), t.up.rows, t.up.cols),
            ("m.experts.5.w3", 3, 8)
        );
        assert_eq!((t.down.rows, t.down.cols), (8, 3));
    }
}
