//! A whole model on one accelerator: [`GpuModel`] holds every weight on the device (dense
//! weights as matrices, routed experts in [`ExpertSlots`]) and runs the same forward pass
//! as `strata_model::Model`, kernel by kernel, with the KV cache on the device
//! ([`GpuCache`]).
//!
//! Supported: every architecture of `strata_model` (Llama, Qwen2, Qwen2-MoE, Qwen3-MoE,
//! Mixtral, GLM-4.5 with grouped-query attention; DeepSeek-V2/V3 with multi-head latent
//! attention, latent cache and absorbed `kv_b_proj`) and every router variant; one
//! sequence per cache.
//!
//! A key design decision made here is that weights keep the precision they are stored in
//! (BF16 and F16 two per word, everything else f32) so the device computes what the CPU's
//! f32 reference computes from the same checkpoint, and that routing is read back to the
//! host once per MoE layer to group the routed rows by expert: the same point at which the
//! hybrid runtime's policy will decide where each expert runs.

use std::path::Path;
use std::sync::Arc;

use strata_model::Arch;
use strata_model::config::{
    AttentionConfig, FfnConfig, GroupScore, ModelConfig, RopeScaling, RopeStyle, Scoring,
    yarn_mscale,
};
use strata_model::model::open;
use strata_model::rope::Rope;
use strata_model::source::{Source, Tensor};

use crate::device::{Buffer, Device, ExpertSlots, Op, RopeKind, TopKParams, WeightType};
use crate::{Error, Result};

/// A matrix `[n, k]` on the device, with an optional f32 bias `[n]`.
#[derive(Debug)]
struct Matrix {
    buf: Buffer,
    wtype: WeightType,
    n: usize,
    k: usize,
    bias: Option<Buffer>,
}

#[derive(Debug)]
struct Mlp {
    gate: Matrix,
    up: Matrix,
    down: Matrix,
}

#[derive(Debug)]
struct Moe {
    router: Matrix,
    correction_bias: Option<Buffer>,
    slots: ExpertSlots,
    params: TopKParams,
    shared: Option<Mlp>,
    shared_gate: Option<Matrix>,
}

#[derive(Debug)]
enum Ffn {
    Dense(Box<Mlp>),
    Moe(Box<Moe>),
}

#[derive(Debug)]
enum Attn {
    Gqa {
        q: Matrix,
        k: Matrix,
        v: Matrix,
        o: Matrix,
        q_norm: Option<Buffer>,
        k_norm: Option<Buffer>,
    },
    Mla {
        /// `q_a_proj` and `q_a_layernorm` when queries are compressed.
        q_a: Option<(Matrix, Buffer)>,
        q: Matrix,
        kv_a: Matrix,
        kv_a_norm: Buffer,
        /// `kv_b_proj` in f32, absorbed by the kernel.
        kv_b: Buffer,
        o: Matrix,
    },
}

/// Attention shapes shared by all layers.
#[derive(Debug, Clone, Copy)]
enum Shape {
    Gqa {
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
        window: usize,
    },
    Mla {
        n_heads: usize,
        kv_lora: usize,
        nope: usize,
        rope: usize,
        v_dim: usize,
    },
}

impl Shape {
    /// Widths of the two cache buffers per position.
    fn cache_widths(self) -> (usize, usize) {
        match self {
            Shape::Gqa {
                n_kv_heads,
                head_dim,
                ..
            } => (n_kv_heads * head_dim, n_kv_heads * head_dim),
            Shape::Mla { kv_lora, rope, .. } => (kv_lora, rope),
        }
    }
}

/// DeepSeek's `q_a_layernorm` and `kv_a_layernorm` use a fixed epsilon.
const MLA_NORM_EPS: f32 = 1e-6;

#[derive(Debug)]
struct Layer {
    attn_norm: Buffer,
    attn: Attn,
    ffn_norm: Buffer,
    ffn: Ffn,
}

/// The device KV cache of one sequence (and its rotary table).
#[derive(Debug)]
pub struct GpuCache {
    k: Vec<Buffer>,
    v: Vec<Buffer>,
    rope_table: Buffer,
    len: usize,
    capacity: usize,
}

impl GpuCache {
    /// Positions cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Most positions it can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

/// A model whose weights and KV cache live on one accelerator.
#[derive(Debug)]
pub struct GpuModel {
    dev: Arc<dyn Device>,
    /// Normalised configuration.
    pub config: ModelConfig,
    embed: Matrix,
    layers: Vec<Layer>,
    norm: Buffer,
    lm_head: Option<Matrix>,
    rope: Rope,
    shape: Shape,
    scale: f32,
    eps: f32,
}

/// Storage type that holds a stored dtype exactly (a converted model's packed BF16 is
/// BF16; its int8/int4 matrices are dequantized, which f32 holds exactly).
fn wtype_of(dtype: &str) -> WeightType {
    match dtype {
        "BF16" | "packed bf16" => WeightType::Bf16,
        "F16" => WeightType::F16,
        _ => WeightType::F32,
    }
}

/// The values of `t` and the storage type that holds them exactly: a converted model's
/// packed matrices are dequantized (the values its CPU kernels use), others read as
/// stored.
fn stored_values(t: &Tensor) -> Result<(Vec<f32>, WeightType)> {
    let wtype = wtype_of(&t.dtype_name());
    match t.stored_packed() {
        Some(p) => Ok((p?.dequantize(), wtype)),
        None => Ok((t.to_f32()?, wtype)),
    }
}

/// Rows of one gate or up strip in the fused gate/up matrix of a packed expert
/// (`strata_kernels::Expert::pack`: row `32 b + c` is gate row `16 b + c`, row
/// `32 b + 16 + c` is up row `16 b + c`).
const STRIP: usize = 16;

/// One expert's weights as f32 values, and the storage type that holds them exactly.
#[derive(Debug, Clone)]
pub struct ExpertValues {
    /// Gate projection `[inter, hidden]`.
    pub gate: Vec<f32>,
    /// Up projection `[inter, hidden]`.
    pub up: Vec<f32>,
    /// Down projection `[hidden, inter]`.
    pub down: Vec<f32>,
    /// Storage type on the device.
    pub wtype: WeightType,
}

/// Expert `e` of the set `prefix` (`model.layers.3.mlp.experts`, or a dense MLP / shared
/// expert as a set of one: `model.layers.0.mlp`) of a converted model (`strata convert`):
/// packed `{prefix}.{e}.gate_up` (gate and up strips interleaved) and `{prefix}.{e}.down`,
/// or plain `{prefix}.{e}.gate`, `.up`, `.down`. Other sources have no such tensors.
pub fn converted_expert(
    src: &Source,
    prefix: &str,
    e: usize,
    hidden: usize,
    inter: usize,
) -> Result<ExpertValues> {
    let get = |part: &str, shape: [usize; 2]| -> Result<(Vec<f32>, WeightType)> {
        let t = src.tensor(&format!("{prefix}.{e}.{part}"))?;
        t.expect_shape(&shape)?;
        stored_values(&t)
    };
    let (down, _) = get("down", [hidden, inter])?;
    if !src.has(&format!("{prefix}.{e}.gate_up")) {
        let (gate, wtype) = get("gate", [inter, hidden])?;
        let (up, _) = get("up", [inter, hidden])?;
        return Ok(ExpertValues {
            gate,
            up,
            down,
            wtype,
        });
    }
    let i_pad = inter.div_ceil(STRIP) * STRIP;
    let (gu, wtype) = get("gate_up", [2 * i_pad, hidden])?;
    let mut gate = Vec::with_capacity(inter * hidden);
    let mut up = Vec::with_capacity(inter * hidden);
    for i in 0..inter {
        let row = 2 * (i / STRIP) * STRIP + i % STRIP;
        gate.extend_from_slice(&gu[row * hidden..][..hidden]);
        up.extend_from_slice(&gu[(row + STRIP) * hidden..][..hidden]);
    }
    Ok(ExpertValues {
        gate,
        up,
        down,
        wtype,
    })
}

fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

struct Loader<'a> {
    dev: &'a dyn Device,
    src: &'a Source,
    /// FP8 block size (`quantization_config.weight_block_size`): FP8 tensors are read
    /// with their `weight_scale_inv` scales applied.
    fp8_block: Option<[usize; 2]>,
}

impl<'a> Loader<'a> {
    fn tensor(&self, name: &str) -> Result<strata_model::source::Tensor<'a>> {
        Ok(self.src.tensor_fp8(name, self.fp8_block)?)
    }

    fn vector(&self, name: &str, n: usize) -> Result<Buffer> {
        let t = self.tensor(name)?;
        t.expect_shape(&[n])?;
        self.f32_buffer(&t.to_f32()?, name)
    }

    fn f32_buffer(&self, v: &[f32], label: &str) -> Result<Buffer> {
        let b = self.dev.alloc(v.len() as u64 * 4, 0, label)?;
        self.dev.upload(&b, 0, &to_bytes(v))?;
        Ok(b)
    }

    fn values(&self, v: &[f32], wtype: WeightType, k: usize, label: &str) -> Result<Buffer> {
        let bytes = wtype.encode(v);
        let b = self
            .dev
            .alloc(bytes.len() as u64, wtype.row_granule(k), label)?;
        self.dev.upload(&b, 0, &bytes)?;
        Ok(b)
    }

    /// `{prefix}.weight: [n, k]` (+ `{prefix}.bias`), in f32 when `force_f32` (routers).
    fn matrix(
        &self,
        prefix: &str,
        n: usize,
        k: usize,
        bias: bool,
        force_f32: bool,
    ) -> Result<Matrix> {
        let name = format!("{prefix}.weight");
        let t = self.tensor(&name)?;
        t.expect_shape(&[n, k])?;
        let (values, stored) = stored_values(&t)?;
        let wtype = if force_f32 { WeightType::F32 } else { stored };
        let buf = self.values(&values, wtype, k, &name)?;
        let bias = if bias {
            Some(self.vector(&format!("{prefix}.bias"), n)?)
        } else {
            None
        };
        Ok(Matrix {
            buf,
            wtype,
            n,
            k,
            bias,
        })
    }

    fn attention(&self, a: &str, cfg: &AttentionConfig, h: usize) -> Result<Attn> {
        Ok(match *cfg {
            AttentionConfig::Gqa {
                n_heads,
                n_kv_heads,
                head_dim,
                qkv_bias,
                o_bias,
                qk_norm,
                ..
            } => {
                let (q_w, kv_w) = (n_heads * head_dim, n_kv_heads * head_dim);
                let norm = |name: &str| -> Result<Option<Buffer>> {
                    if qk_norm {
                        Ok(Some(self.vector(&format!("{a}.{name}.weight"), head_dim)?))
                    } else {
                        Ok(None)
                    }
                };
                Attn::Gqa {
                    q: self.matrix(&format!("{a}.q_proj"), q_w, h, qkv_bias, false)?,
                    k: self.matrix(&format!("{a}.k_proj"), kv_w, h, qkv_bias, false)?,
                    v: self.matrix(&format!("{a}.v_proj"), kv_w, h, qkv_bias, false)?,
                    o: self.matrix(&format!("{a}.o_proj"), h, q_w, o_bias, false)?,
                    q_norm: norm("q_norm")?,
                    k_norm: norm("k_norm")?,
                }
            }
            AttentionConfig::Mla {
                n_heads,
                q_lora_rank,
                kv_lora_rank,
                qk_nope_head_dim,
                qk_rope_head_dim,
                v_head_dim,
                bias,
            } => {
                let qk = qk_nope_head_dim + qk_rope_head_dim;
                let (q_a, q) = match q_lora_rank {
                    Some(r) => (
                        Some((
                            self.matrix(&format!("{a}.q_a_proj"), r, h, bias, false)?,
                            self.vector(&format!("{a}.q_a_layernorm.weight"), r)?,
                        )),
                        self.matrix(&format!("{a}.q_b_proj"), n_heads * qk, r, false, false)?,
                    ),
                    None => (
                        None,
                        self.matrix(&format!("{a}.q_proj"), n_heads * qk, h, false, false)?,
                    ),
                };
                let kv_b = self.tensor(&format!("{a}.kv_b_proj.weight"))?;
                kv_b.expect_shape(&[n_heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank])?;
                Attn::Mla {
                    q_a,
                    q,
                    kv_a: self.matrix(
                        &format!("{a}.kv_a_proj_with_mqa"),
                        kv_lora_rank + qk_rope_head_dim,
                        h,
                        bias,
                        false,
                    )?,
                    kv_a_norm: self.vector(&format!("{a}.kv_a_layernorm.weight"), kv_lora_rank)?,
                    kv_b: self.f32_buffer(&kv_b.to_f32()?, "kv_b_proj")?,
                    o: self.matrix(&format!("{a}.o_proj"), h, n_heads * v_head_dim, bias, false)?,
                }
            }
        })
    }

    fn mlp(&self, prefix: &str, h: usize, inter: usize) -> Result<Mlp> {
        if let Source::Strata(_) = self.src {
            let x = converted_expert(self.src, prefix, 0, h, inter)?;
            let m = |v: &[f32], n: usize, k: usize, part: &str| -> Result<Matrix> {
                Ok(Matrix {
                    buf: self.values(v, x.wtype, k, &format!("{prefix}.{part}"))?,
                    wtype: x.wtype,
                    n,
                    k,
                    bias: None,
                })
            };
            return Ok(Mlp {
                gate: m(&x.gate, inter, h, "gate")?,
                up: m(&x.up, inter, h, "up")?,
                down: m(&x.down, h, inter, "down")?,
            });
        }
        Ok(Mlp {
            gate: self.matrix(&format!("{prefix}.gate_proj"), inter, h, false, false)?,
            up: self.matrix(&format!("{prefix}.up_proj"), inter, h, false, false)?,
            down: self.matrix(&format!("{prefix}.down_proj"), h, inter, false, false)?,
        })
    }

    /// Every routed expert of `{mlp}` into its own slot.
    fn experts(
        &self,
        mlp: &str,
        n: usize,
        h: usize,
        inter: usize,
        arch: Arch,
    ) -> Result<ExpertSlots> {
        let stacked = format!("{mlp}.experts.gate_up_proj");
        let hi = h * inter;
        if let Source::Strata(_) = self.src {
            let prefix = format!("{mlp}.experts");
            let mut slots = None;
            for e in 0..n {
                let x = converted_expert(self.src, &prefix, e, h, inter)?;
                let s = match &slots {
                    Some(s) => s,
                    None => slots.insert(ExpertSlots::new(
                        self.dev,
                        n as u32,
                        h as u32,
                        inter as u32,
                        x.wtype,
                    )?),
                };
                s.refill(self.dev, e as u32, &x.gate, &x.up, &x.down)?;
            }
            return slots.ok_or_else(|| Error::Shape {
                op: "experts",
                message: format!("{mlp}: a mixture of experts with no experts"),
            });
        }
        if self.src.has(&stacked) {
            let gu = self.tensor(&stacked)?;
            gu.expect_shape(&[n, 2 * inter, h])?;
            let down = self.tensor(&format!("{mlp}.experts.down_proj"))?;
            down.expect_shape(&[n, h, inter])?;
            let slots = ExpertSlots::new(
                self.dev,
                n as u32,
                h as u32,
                inter as u32,
                wtype_of(&gu.dtype_name()),
            )?;
            for e in 0..n {
                let g_u = gu.rows_f32(e * 2 * inter, 2 * inter)?;
                let d = down.rows_f32(e * h, h)?;
                slots.refill(self.dev, e as u32, &g_u[..hi], &g_u[hi..], &d)?;
            }
            return Ok(slots);
        }
        let names = if arch == Arch::Mixtral && self.src.has(&format!("{mlp}.experts.0.w1.weight"))
        {
            ["w1", "w3", "w2"]
        } else {
            ["gate_proj", "up_proj", "down_proj"]
        };
        let mut slots = None;
        for e in 0..n {
            let get = |i: usize, shape: [usize; 2]| -> Result<(Vec<f32>, String)> {
                let t = self.tensor(&format!("{mlp}.experts.{e}.{}.weight", names[i]))?;
                t.expect_shape(&shape)?;
                Ok((t.to_f32()?, t.dtype_name()))
            };
            let (g, dtype) = get(0, [inter, h])?;
            let (u, _) = get(1, [inter, h])?;
            let (d, _) = get(2, [h, inter])?;
            if slots.is_none() {
                slots = Some(ExpertSlots::new(
                    self.dev,
                    n as u32,
                    h as u32,
                    inter as u32,
                    wtype_of(&dtype),
                )?);
            }
            if let Some(s) = &slots {
                s.refill(self.dev, e as u32, &g, &u, &d)?;
            }
        }
        slots.ok_or_else(|| Error::Shape {
            op: "experts",
            message: format!("{mlp}: a mixture of experts with no experts"),
        })
    }
}

impl GpuModel {
    /// Loads a Hugging Face directory, GGUF file or converted model (`strata convert`)
    /// onto `dev`. A converted model's weights are those its CPU kernels use: packed
    /// BF16 stays BF16, int8/int4 matrices are dequantized to f32 once at load (the
    /// device has no kernels for them; activations stay f32, so results differ from the
    /// CPU's per-token activation quantization by that rounding only).
    pub fn load(dev: Arc<dyn Device>, path: &Path) -> Result<GpuModel> {
        let (config, src) = open(path)?;
        GpuModel::from_source(dev, config, &src)
    }

    /// Builds the model on `dev` from a parsed config and its tensors.
    pub fn from_source(
        dev: Arc<dyn Device>,
        config: ModelConfig,
        src: &Source,
    ) -> Result<GpuModel> {
        let (shape, scale) = match config.attention {
            AttentionConfig::Gqa {
                n_heads,
                n_kv_heads,
                head_dim,
                sliding_window,
                ..
            } => (
                Shape::Gqa {
                    n_heads,
                    n_kv_heads,
                    head_dim,
                    window: sliding_window.unwrap_or(0),
                },
                1.0 / (head_dim as f32).sqrt(),
            ),
            AttentionConfig::Mla {
                n_heads,
                kv_lora_rank,
                qk_nope_head_dim,
                qk_rope_head_dim,
                v_head_dim,
                ..
            } => {
                // 1/sqrt(d_qk), times YaRN's mscale² (DeepSeek's `mscale_all_dim`).
                let base = 1.0 / ((qk_nope_head_dim + qk_rope_head_dim) as f64).sqrt();
                let m = match config.rope.scaling {
                    RopeScaling::Yarn {
                        factor,
                        mscale_all_dim,
                        ..
                    } if mscale_all_dim != 0.0 => yarn_mscale(factor, mscale_all_dim),
                    _ => 1.0,
                };
                (
                    Shape::Mla {
                        n_heads,
                        kv_lora: kv_lora_rank,
                        nope: qk_nope_head_dim,
                        rope: qk_rope_head_dim,
                        v_dim: v_head_dim,
                    },
                    (base * m * m) as f32,
                )
            }
        };
        let ld = Loader {
            dev: &*dev,
            src,
            fp8_block: config.fp8_block,
        };
        let h = config.hidden_size;
        let v = config.vocab_size;
        let embed = ld.matrix("model.embed_tokens", v, h, false, false)?;
        let mut layers = Vec::with_capacity(config.n_layers());
        for (i, ffn_cfg) in config.layers.iter().enumerate() {
            let p = format!("model.layers.{i}");
            let a = format!("{p}.self_attn");
            let ffn = match ffn_cfg {
                FfnConfig::Dense(inter) => {
                    Ffn::Dense(Box::new(ld.mlp(&format!("{p}.mlp"), h, *inter)?))
                }
                FfnConfig::Moe(moe) => {
                    let mlp = if config.arch == Arch::Mixtral
                        && src.has(&format!("{p}.block_sparse_moe.gate.weight"))
                    {
                        format!("{p}.block_sparse_moe")
                    } else {
                        format!("{p}.mlp")
                    };
                    let r = &moe.router;
                    let n = r.n_experts;
                    let shared = match &moe.shared {
                        None => None,
                        Some(s) => {
                            let name = if s.gated {
                                "shared_expert"
                            } else {
                                "shared_experts"
                            };
                            Some(ld.mlp(&format!("{mlp}.{name}"), h, s.intermediate)?)
                        }
                    };
                    let shared_gate = match &moe.shared {
                        Some(s) if s.gated => Some(ld.matrix(
                            &format!("{mlp}.shared_expert_gate"),
                            1,
                            h,
                            false,
                            true,
                        )?),
                        _ => None,
                    };
                    Ffn::Moe(Box::new(Moe {
                        router: ld.matrix(&format!("{mlp}.gate"), n, h, false, true)?,
                        correction_bias: if r.correction_bias {
                            Some(ld.vector(&format!("{mlp}.gate.e_score_correction_bias"), n)?)
                        } else {
                            None
                        },
                        slots: ld.experts(&mlp, n, h, moe.intermediate, config.arch)?,
                        params: TopKParams {
                            n_experts: n as u32,
                            k: r.top_k as u32,
                            sigmoid: r.scoring == Scoring::Sigmoid,
                            groups: r.groups.map(|g| {
                                (
                                    g.n_group as u32,
                                    g.topk_group as u32,
                                    g.group_score == GroupScore::Top2Sum,
                                )
                            }),
                            norm: r.norm_topk_prob,
                            scaling: r.scaling_factor,
                        },
                        shared,
                        shared_gate,
                    }))
                }
            };
            layers.push(Layer {
                attn_norm: ld.vector(&format!("{p}.input_layernorm.weight"), h)?,
                attn: ld.attention(&a, &config.attention, h)?,
                ffn_norm: ld.vector(&format!("{p}.post_attention_layernorm.weight"), h)?,
                ffn,
            });
        }
        let norm = ld.vector("model.norm.weight", h)?;
        let lm_head = if config.tie_word_embeddings && !src.has("lm_head.weight") {
            None
        } else {
            Some(ld.matrix("lm_head", v, h, false, false)?)
        };
        dev.synchronize()?;
        Ok(GpuModel {
            rope: Rope::new(&config.rope),
            eps: config.rms_norm_eps,
            shape,
            scale,
            config,
            embed,
            layers,
            norm,
            lm_head,
            dev,
        })
    }

    /// The device the model runs on.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.dev
    }

    /// An empty cache for up to `capacity` positions.
    pub fn new_cache(&self, capacity: usize) -> Result<GpuCache> {
        let (wa, wb) = self.shape.cache_widths();
        let mut k = Vec::with_capacity(self.layers.len());
        let mut v = Vec::with_capacity(self.layers.len());
        for _ in &self.layers {
            k.push(
                self.dev
                    .alloc((capacity.max(1) * wa * 4) as u64, 0, "key cache")?,
            );
            v.push(
                self.dev
                    .alloc((capacity.max(1) * wb * 4) as u64, 0, "value cache")?,
            );
        }
        let half = self.rope.dim() / 2;
        let (mut c, mut s) = (vec![0.0; half], vec![0.0; half]);
        let mut table = Vec::with_capacity(capacity * 2 * half);
        for p in 0..capacity.max(1) {
            self.rope.cos_sin(p, &mut c, &mut s);
            table.extend_from_slice(&c);
            table.extend_from_slice(&s);
        }
        let rope_table = self.dev.alloc(table.len() as u64 * 4, 0, "rope table")?;
        self.dev.upload(&rope_table, 0, &to_bytes(&table))?;
        Ok(GpuCache {
            k,
            v,
            rope_table,
            len: 0,
            capacity,
        })
    }

    fn scratch(&self, n: usize, label: &str) -> Result<Buffer> {
        self.dev.alloc(n as u64 * 4, 0, label)
    }

    fn matmul(&self, x: &Buffer, w: &Matrix, m: usize) -> Result<Buffer> {
        let out = self.scratch(m * w.n, "matmul output")?;
        self.dev.enqueue(&Op::Matmul {
            x,
            w: &w.buf,
            wtype: w.wtype,
            bias: w.bias.as_ref(),
            out: &out,
            m: m as u32,
            n: w.n as u32,
            k: w.k as u32,
        })?;
        Ok(out)
    }

    fn rms_norm(
        &self,
        x: &Buffer,
        w: &Buffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<Buffer> {
        let out = self.scratch(rows * dim, "norm output")?;
        self.dev.enqueue(&Op::RmsNorm {
            x,
            w,
            out: &out,
            rows: rows as u32,
            dim: dim as u32,
            eps,
        })?;
        Ok(out)
    }

    /// `down(silu(gate x) * up x)`.
    fn mlp(&self, x: &Buffer, m: &Mlp, t: usize) -> Result<Buffer> {
        let g = self.matmul(x, &m.gate, t)?;
        let u = self.matmul(x, &m.up, t)?;
        self.dev.enqueue(&Op::SiluMul {
            x: &g,
            y: &u,
            n: (t * m.gate.n) as u32,
        })?;
        self.matmul(&g, &m.down, t)
    }

    /// Runs `tokens` through the model after the cached positions, appending to `cache`;
    /// returns the logits of every new position, `[tokens, vocab]`.
    pub fn forward(&self, tokens: &[u32], cache: &mut GpuCache) -> Result<Vec<f32>> {
        self.forward_rows(tokens, cache, false)
    }

    /// [`GpuModel::forward`] returning only the last position's logits `[vocab]`
    /// (generation: the LM head runs on one row).
    pub fn forward_last(&self, tokens: &[u32], cache: &mut GpuCache) -> Result<Vec<f32>> {
        self.forward_rows(tokens, cache, true)
    }

    fn forward_rows(&self, tokens: &[u32], cache: &mut GpuCache, last: bool) -> Result<Vec<f32>> {
        let t = tokens.len();
        let (h, v) = (self.config.hidden_size, self.config.vocab_size);
        if let Some(&bad) = tokens.iter().find(|&&id| id as usize >= v) {
            return Err(Error::Shape {
                op: "forward",
                message: format!("token id {bad} is out of range for a vocabulary of {v}"),
            });
        }
        if cache.len + t > cache.capacity {
            return Err(Error::Shape {
                op: "forward",
                message: format!(
                    "{} cached + {t} new positions exceed the cache capacity of {}",
                    cache.len, cache.capacity
                ),
            });
        }
        if t == 0 {
            return Ok(Vec::new());
        }
        let dev = &*self.dev;
        let ids = dev.alloc(t as u64 * 4, 0, "token ids")?;
        dev.upload(
            &ids,
            0,
            &tokens
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect::<Vec<u8>>(),
        )?;
        let positions: Vec<u8> = (cache.len..cache.len + t)
            .flat_map(|p| (p as u32).to_le_bytes())
            .collect();
        let pos = dev.alloc(t as u64 * 4, 0, "positions")?;
        dev.upload(&pos, 0, &positions)?;
        let x = self.scratch(t * h, "residual")?;
        dev.enqueue(&Op::Embed {
            table: &self.embed.buf,
            wtype: self.embed.wtype,
            ids: &ids,
            out: &x,
            rows: t as u32,
            dim: h as u32,
        })?;
        for (li, layer) in self.layers.iter().enumerate() {
            let hs = self.rms_norm(&x, &layer.attn_norm, t, h, self.eps)?;
            let o = self.attention(&layer.attn, li, &hs, &pos, cache, t)?;
            dev.enqueue(&Op::Add {
                x: &x,
                y: &o,
                gate: None,
                n: (t * h) as u32,
                dim: h as u32,
            })?;
            let hs = self.rms_norm(&x, &layer.ffn_norm, t, h, self.eps)?;
            match &layer.ffn {
                Ffn::Dense(m) => {
                    let y = self.mlp(&hs, m, t)?;
                    dev.enqueue(&Op::Add {
                        x: &x,
                        y: &y,
                        gate: None,
                        n: (t * h) as u32,
                        dim: h as u32,
                    })?;
                }
                Ffn::Moe(moe) => self.moe(&x, &hs, moe, t)?,
            }
        }
        cache.len += t;
        let (x, rows) = if last && t > 1 {
            let row = self.scratch(h, "last row")?;
            dev.copy(&x, ((t - 1) * h * 4) as u64, &row, 0, (h * 4) as u64)?;
            (row, 1)
        } else {
            (x, t)
        };
        let xs = self.rms_norm(&x, &self.norm, rows, h, self.eps)?;
        let logits = self.matmul(&xs, self.lm_head.as_ref().unwrap_or(&self.embed), rows)?;
        let bytes = dev.download(&logits, 0, (rows * v * 4) as u64)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Rotates `heads` heads of `stride` values per row of `x`, from `offset` on.
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        x: &Buffer,
        pos: &Buffer,
        cache: &GpuCache,
        t: usize,
        heads: usize,
        stride: usize,
        offset: usize,
    ) -> Result<()> {
        self.dev.enqueue(&Op::Rope {
            x,
            positions: pos,
            table: &cache.rope_table,
            rows: t as u32,
            n_heads: heads as u32,
            head_stride: stride as u32,
            offset: offset as u32,
            half: (self.rope.dim() / 2) as u32,
            kind: match self.config.rope.style {
                RopeStyle::Neox => RopeKind::Neox,
                RopeStyle::Interleaved => RopeKind::Interleaved,
            },
        })
    }

    /// Self-attention of layer `li` for `hs: [t, hidden]`, appending to the cache;
    /// returns the output projection `[t, hidden]`.
    fn attention(
        &self,
        attn: &Attn,
        li: usize,
        hs: &Buffer,
        pos: &Buffer,
        cache: &GpuCache,
        t: usize,
    ) -> Result<Buffer> {
        let dev = &*self.dev;
        let (wa, wb) = self.shape.cache_widths();
        let (at_a, at_b) = ((cache.len * wa * 4) as u64, (cache.len * wb * 4) as u64);
        match (attn, self.shape) {
            (
                Attn::Gqa {
                    q,
                    k,
                    v,
                    o,
                    q_norm,
                    k_norm,
                },
                Shape::Gqa {
                    n_heads,
                    n_kv_heads,
                    head_dim,
                    window,
                },
            ) => {
                let mut qb = self.matmul(hs, q, t)?;
                let mut kb = self.matmul(hs, k, t)?;
                let vb = self.matmul(hs, v, t)?;
                if let Some(w) = q_norm {
                    qb = self.rms_norm(&qb, w, t * n_heads, head_dim, self.eps)?;
                }
                if let Some(w) = k_norm {
                    kb = self.rms_norm(&kb, w, t * n_kv_heads, head_dim, self.eps)?;
                }
                self.rope(&qb, pos, cache, t, n_heads, head_dim, 0)?;
                self.rope(&kb, pos, cache, t, n_kv_heads, head_dim, 0)?;
                dev.copy(&kb, 0, &cache.k[li], at_a, (t * wa * 4) as u64)?;
                dev.copy(&vb, 0, &cache.v[li], at_b, (t * wb * 4) as u64)?;
                let out = self.scratch(t * n_heads * head_dim, "attention output")?;
                dev.enqueue(&Op::Attention {
                    q: &qb,
                    k: &cache.k[li],
                    v: &cache.v[li],
                    out: &out,
                    n_tokens: t as u32,
                    start_pos: cache.len as u32,
                    n_heads: n_heads as u32,
                    n_kv_heads: n_kv_heads as u32,
                    head_dim: head_dim as u32,
                    window: window as u32,
                    scale: self.scale,
                })?;
                self.matmul(&out, o, t)
            }
            (
                Attn::Mla {
                    q_a,
                    q,
                    kv_a,
                    kv_a_norm,
                    kv_b,
                    o,
                },
                Shape::Mla {
                    n_heads,
                    kv_lora,
                    nope,
                    rope,
                    v_dim,
                },
            ) => {
                let qb = match q_a {
                    Some((q_a, norm)) => {
                        let c = self.matmul(hs, q_a, t)?;
                        let c = self.rms_norm(&c, norm, t, q_a.n, MLA_NORM_EPS)?;
                        self.matmul(&c, q, t)?
                    }
                    None => self.matmul(hs, q, t)?,
                };
                self.rope(&qb, pos, cache, t, n_heads, nope + rope, nope)?;
                // Split each row of kv_a's output into the latent and the rotary key.
                let kv = self.matmul(hs, kv_a, t)?;
                let latent = self.scratch(t * kv_lora, "latent")?;
                let k_rope = self.scratch(t * rope, "rotary key")?;
                let row = kv_lora + rope;
                for r in 0..t {
                    let src = (r * row * 4) as u64;
                    dev.copy(
                        &kv,
                        src,
                        &latent,
                        (r * kv_lora * 4) as u64,
                        (kv_lora * 4) as u64,
                    )?;
                    dev.copy(
                        &kv,
                        src + (kv_lora * 4) as u64,
                        &k_rope,
                        (r * rope * 4) as u64,
                        (rope * 4) as u64,
                    )?;
                }
                let latent = self.rms_norm(&latent, kv_a_norm, t, kv_lora, MLA_NORM_EPS)?;
                self.rope(&k_rope, pos, cache, t, 1, rope, 0)?;
                dev.copy(&latent, 0, &cache.k[li], at_a, (t * wa * 4) as u64)?;
                dev.copy(&k_rope, 0, &cache.v[li], at_b, (t * wb * 4) as u64)?;
                let out = self.scratch(t * n_heads * v_dim, "attention output")?;
                dev.enqueue(&Op::MlaAttention {
                    q: &qb,
                    latent: &cache.k[li],
                    k_rope: &cache.v[li],
                    kv_b,
                    out: &out,
                    n_tokens: t as u32,
                    start_pos: cache.len as u32,
                    n_heads: n_heads as u32,
                    kv_lora: kv_lora as u32,
                    nope: nope as u32,
                    rope: rope as u32,
                    v_dim: v_dim as u32,
                    scale: self.scale,
                })?;
                self.matmul(&out, o, t)
            }
            _ => Err(Error::Shape {
                op: "attention",
                message: "layer weights do not match the model's attention kind".into(),
            }),
        }
    }

    /// `x += routed experts (+ shared experts)` of `hs`.
    fn moe(&self, x: &Buffer, hs: &Buffer, moe: &Moe, t: usize) -> Result<()> {
        let dev = &*self.dev;
        let k = moe.params.k as usize;
        let h = self.config.hidden_size;
        if let Some(shared) = &moe.shared {
            let y = self.mlp(hs, shared, t)?;
            let gate = match &moe.shared_gate {
                Some(g) => Some(self.matmul(hs, g, t)?),
                None => None,
            };
            dev.enqueue(&Op::Add {
                x,
                y: &y,
                gate: gate.as_ref(),
                n: (t * h) as u32,
                dim: h as u32,
            })?;
        }
        let logits = self.matmul(hs, &moe.router, t)?;
        let ids = self.scratch(t * k, "expert ids")?;
        let weights = self.scratch(t * k, "expert weights")?;
        dev.enqueue(&Op::TopK {
            logits: &logits,
            bias: moe.correction_bias.as_ref(),
            ids: &ids,
            weights: &weights,
            tokens: t as u32,
            params: moe.params,
        })?;
        // Group the routed rows by expert on the host (the policy's decision point).
        let chosen: Vec<u32> = dev
            .download(&ids, 0, (t * k * 4) as u64)?
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let mut order: Vec<usize> = (0..t * k).collect();
        order.sort_by_key(|&p| chosen[p]);
        let mut pairs = Vec::with_capacity(2 * t * k * 4);
        let mut pair_of = vec![0u32; t * k];
        for (pi, &p) in order.iter().enumerate() {
            pairs.extend(((p / k) as u32).to_le_bytes());
            pairs.extend(chosen[p].to_le_bytes());
            pair_of[p] = pi as u32;
        }
        let pairs_buf = dev.alloc(pairs.len() as u64, 0, "expert pairs")?;
        dev.upload(&pairs_buf, 0, &pairs)?;
        let pair_of_buf = dev.alloc((t * k * 4) as u64, 0, "pair index")?;
        dev.upload(
            &pair_of_buf,
            0,
            &pair_of
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect::<Vec<u8>>(),
        )?;
        let inter = moe.slots.inter as usize;
        let act = self.scratch(t * k * inter, "expert activations")?;
        let y = self.scratch(t * k * h, "expert outputs")?;
        for (stage, input, out) in [(0, hs, &act), (1, &act, &y)] {
            dev.enqueue(&Op::ExpertFfn {
                x: input,
                slots: &moe.slots,
                pairs: &pairs_buf,
                out,
                n_pairs: (t * k) as u32,
                stage,
            })?;
        }
        dev.enqueue(&Op::MoeCombine {
            out: x,
            y: &y,
            weights: &weights,
            pair_of: &pair_of_buf,
            tokens: t as u32,
            hidden: h as u32,
            k: k as u32,
        })
    }
}
