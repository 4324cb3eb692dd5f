//! A whole model on one accelerator: [`GpuModel`] holds every weight on the device (dense
//! weights as matrices, routed experts in [`ExpertSlots`]) and runs `strata_model`'s layer
//! graph ([`LayerGraph`], driven by `strata_model::forward_pass` as the CPU's `Model` is),
//! kernel by kernel, with the KV cache on the device ([`GpuCache`]). Its weights are held
//! per layer in one variant per variant of the graph.
//!
//! Supported: every architecture of `strata_model` (Llama, Qwen2, Qwen2-MoE, Qwen3-MoE,
//! Mixtral, GLM-4.5 with grouped-query attention; DeepSeek-V2/V3 with multi-head latent
//! attention, latent cache and absorbed `kv_b_proj`) and every router variant; one
//! sequence per cache, several sequences per forward pass ([`GpuModel::forward_batch`]),
//! and the engine's `Backend` (`backend.rs`), so the scheduler serves it.
//!
//! A key design decision made here is that weights keep the form they are stored in: a
//! GGUF's quantized blocks go to the device as the file holds them (Q4_0, Q5_0, Q8_0, Q4_K,
//! Q5_K, Q6_K, IQ4_XS; the kernels decode them, so a Q4_K model takes its file's bytes of
//! device memory), its other quantized types are dequantized to F16, BF16 and F16 stay two
//! per word and everything else is f32; activations are f32, so the device computes what
//! an exact reader of the file computes. Routing stays on the device (the routed rows are
//! grouped by expert there); in the hybrid layout (`hybrid.rs`) the routed experts stay on
//! the host and each MoE layer reads its routing back once, the point at which the hybrid
//! executor's policy decides where each expert runs.

mod backend;
mod forward;
mod hybrid;

use std::cell::RefCell;
use std::path::Path;
use std::sync::{Arc, RwLock};

use strata_accel::{Buffer, Device, ExpertFormat, ExpertSlots, TopKParams, WeightType};
use strata_model::config::{AttentionConfig, FfnConfig, GroupScore, ModelConfig, Scoring};
use strata_model::model::open;
use strata_model::moe::MoeBlock;
use strata_model::names::{self, AttentionNames, ExpertLayout, LayerNames};
use strata_model::rope::Rope;
use strata_model::source::Source;
use strata_model::tensors::{AttentionTensors, MatrixSpec, MlpTensors, MoeTensors, TensorSpec};
use strata_model::{Head, LayerGraph, LogitsWanted, RoutingTap};

use crate::HybridExecutor;
use crate::weights::{
    converted_expert, converted_int_parts, converted_int_type, device_f16_bytes, device_type,
    expert_bytes, expert_format, quantized_rows, stored_values,
};
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
    routed: Routed,
    params: TopKParams,
    shared: Option<Mlp>,
    shared_gate: Option<Matrix>,
}

/// Where a MoE layer's routed experts are computed.
#[derive(Debug)]
enum Routed {
    /// On the device, every expert in its own slot.
    Device {
        slots: ExpertSlots,
        /// How the routed experts are stored in their slots.
        format: ExpertFormat,
    },
    /// On the host (`--device hybrid`, `hybrid.rs`): the CPU's kernels, or the executor
    /// installed on the block, compute them from the router input read back once per layer.
    Host(Box<MoeBlock>),
}

/// A layer's feed-forward weights, one variant per feed-forward block of the layer graph.
#[derive(Debug)]
enum Ffn {
    Dense(Box<Mlp>),
    Moe(Box<Moe>),
}

/// A layer's attention weights, one variant per attention kind of the layer graph (whose
/// [`AttentionTensors`] give the shapes).
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

#[derive(Debug)]
struct Layer {
    attn_norm: Buffer,
    attn: Attn,
    ffn_norm: Buffer,
    ffn: Ffn,
}

/// The device KV cache of one sequence (and its rotary table), allocated for its whole
/// capacity up front.
#[derive(Debug)]
pub struct GpuCache {
    dev: Arc<dyn Device>,
    k: Vec<Buffer>,
    v: Vec<Buffer>,
    /// How `k` and `v` store values: F32 or F16.
    kv_type: WeightType,
    /// Values per position of each layer's two buffers.
    widths: Vec<(usize, usize)>,
    rope_table: Buffer,
    len: usize,
    capacity: usize,
}

/// One sequence's part of [`GpuModel::forward_batch`].
#[derive(Debug)]
pub struct GpuSeq<'a> {
    /// New tokens to run.
    pub tokens: &'a [u32],
    /// The sequence's cache; the new tokens are appended.
    pub cache: &'a mut GpuCache,
    /// Which logits to return.
    pub logits: LogitsWanted,
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
    graph: LayerGraph,
    embed: Matrix,
    layers: Vec<Layer>,
    norm: Buffer,
    lm_head: Option<Matrix>,
    rope: Rope,
    scale: f32,
    eps: f32,
    /// How the KV caches store values: F16 (half the memory, as llama.cpp's default) when
    /// every layer's cache rows have an even width, else F32.
    kv_type: WeightType,
    /// Sees every MoE layer's routing (the server's live view); set on a shared model,
    /// hence the lock.
    tap: RwLock<Option<Arc<dyn RoutingTap>>>,
    /// The hybrid executor behind the host experts when it runs on this model's device: it
    /// reads each MoE layer's input where it is and leaves its outputs there.
    beside: Option<Arc<HybridExecutor>>,
    /// How its weights are stored on the device.
    weight_types: Vec<WeightType>,
}

fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// About how many bytes `src`'s weights take on the device, and in the file: a GGUF's
/// blocks as stored where the device's kernels read the type, its other block types as F16,
/// floats and a converted model's packed integers as stored (those whose rows or groups the
/// device does not read are widened to f32 there: the figure is a lower bound for them).
fn device_weight_bytes(src: &Source) -> (u64, u64) {
    let mut need = 0u64;
    let mut file = 0u64;
    for (dtype, bytes) in src.stored_tensors() {
        let b = bytes as u64;
        file += b;
        need += device_f16_bytes(&dtype, b).unwrap_or(b);
    }
    (need, file)
}

/// The f32 values of little-endian `bytes` (a download).
fn f32s(bytes: &[u8]) -> impl Iterator<Item = f32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

/// The u32 values of little-endian `bytes` (a download).
fn u32s(bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

struct Loader<'a> {
    dev: &'a dyn Device,
    src: &'a Source,
    /// FP8 block size (`quantization_config.weight_block_size`): FP8 tensors are read
    /// with their `weight_scale_inv` scales applied.
    fp8_block: Option<[usize; 2]>,
    /// The weight types uploaded so far (the kernels to prepare).
    types: RefCell<Vec<WeightType>>,
}

impl<'a> Loader<'a> {
    fn tensor(&self, name: &str) -> Result<strata_model::source::Tensor<'a>> {
        Ok(self.src.tensor_fp8(name, self.fp8_block)?)
    }

    /// Tensor `name` of exactly `shape`, in f32.
    fn f32_tensor(&self, name: &str, shape: &[usize]) -> Result<Buffer> {
        let t = self.tensor(name)?;
        t.expect_shape(shape)?;
        self.f32_buffer(&t.to_f32()?, name)
    }

    fn f32_buffer(&self, v: &[f32], label: &str) -> Result<Buffer> {
        let b = self.dev.alloc(v.len() as u64 * 4, 0, label)?;
        self.dev.upload(&b, 0, &to_bytes(v))?;
        Ok(b)
    }

    fn values(&self, v: &[f32], wtype: WeightType, k: usize, label: &str) -> Result<Buffer> {
        self.upload(&wtype.encode(v)?, wtype, k, label)
    }

    /// A matrix with rows of `k` values stored in `wtype` on the device.
    fn upload(&self, bytes: &[u8], wtype: WeightType, k: usize, label: &str) -> Result<Buffer> {
        let b = self
            .dev
            .alloc(bytes.len() as u64, wtype.row_granule(k), label)?;
        self.dev.upload(&b, 0, bytes)?;
        let mut types = self.types.borrow_mut();
        if !types.contains(&wtype) {
            types.push(wtype);
        }
        Ok(b)
    }

    /// The matrix `m` (and its bias), in f32 when `force_f32` (routers), else as
    /// [`device_type`] says: a GGUF's blocks as the file holds them.
    fn matrix(&self, m: &MatrixSpec, force_f32: bool) -> Result<Matrix> {
        let (n, k) = (m.rows, m.cols);
        let name = m.weight();
        let t = self.tensor(&name)?;
        t.expect_shape(&[n, k])?;
        let wtype = if force_f32 {
            WeightType::F32
        } else {
            device_type(&t, k)
        };
        let buf = if wtype.is_quantized() {
            let mut bytes = quantized_rows(&t, 0..n, wtype)?;
            bytes.resize(bytes.len().next_multiple_of(4), 0);
            self.upload(&bytes, wtype, k, &name)?
        } else {
            self.values(&stored_values(&t)?.0, wtype, k, &name)?
        };
        let bias = if m.bias {
            Some(self.f32_tensor(&format!("{}.bias", m.name), &[n])?)
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

    fn attention(&self, a: &AttentionNames, cfg: &AttentionConfig, h: usize) -> Result<Attn> {
        let vector = |v: &TensorSpec| self.f32_tensor(&v.name, &v.shape);
        Ok(match AttentionTensors::new(a, cfg, h) {
            AttentionTensors::Gqa(t) => Attn::Gqa {
                q: self.matrix(&t.q, false)?,
                k: self.matrix(&t.k, false)?,
                v: self.matrix(&t.v, false)?,
                o: self.matrix(&t.o, false)?,
                q_norm: t.q_norm.as_ref().map(vector).transpose()?,
                k_norm: t.k_norm.as_ref().map(vector).transpose()?,
            },
            AttentionTensors::Mla(t) => {
                let q_a = match &t.q_a {
                    Some((q_a, norm)) => Some((self.matrix(q_a, false)?, vector(norm)?)),
                    None => None,
                };
                let q = self.matrix(&t.q, false)?;
                let kv_b = vector(&t.kv_b)?;
                Attn::Mla {
                    q_a,
                    q,
                    kv_a: self.matrix(&t.kv_a, false)?,
                    kv_a_norm: vector(&t.kv_a_norm)?,
                    kv_b,
                    o: self.matrix(&t.o, false)?,
                }
            }
        })
    }

    fn mlp(&self, t: &MlpTensors) -> Result<Mlp> {
        if let Source::Strata(_) = self.src {
            let (h, inter) = (t.hidden(), t.inter());
            if let Some(wtype) = converted_int_type(self.src, &t.prefix, h, inter)? {
                let [g, u, d] = converted_int_parts(self.src, &t.prefix, [0, h, inter], wtype)?;
                let m = |bytes: &[u8], n: usize, k: usize, part: &str| -> Result<Matrix> {
                    Ok(Matrix {
                        buf: self.upload(bytes, wtype, k, &format!("{}.{part}", t.prefix))?,
                        wtype,
                        n,
                        k,
                        bias: None,
                    })
                };
                return Ok(Mlp {
                    gate: m(&g, inter, h, "gate")?,
                    up: m(&u, inter, h, "up")?,
                    down: m(&d, h, inter, "down")?,
                });
            }
            let x = converted_expert(self.src, &t.prefix, 0, h, inter)?;
            let m = |v: &[f32], n: usize, k: usize, part: &str| -> Result<Matrix> {
                Ok(Matrix {
                    buf: self.values(v, x.wtype, k, &format!("{}.{part}", t.prefix))?,
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
            gate: self.matrix(&t.gate, false)?,
            up: self.matrix(&t.up, false)?,
            down: self.matrix(&t.down, false)?,
        })
    }

    /// Every routed expert of a block stored as `layout` into its own slot, and how they
    /// are stored.
    fn experts(
        &self,
        layout: &ExpertLayout,
        n: usize,
        h: usize,
        inter: usize,
    ) -> Result<(ExpertSlots, ExpertFormat)> {
        if n == 0 {
            return Err(Error::Config(format!(
                "{}: a mixture of experts with no experts",
                layout.prefix()
            )));
        }
        let format = expert_format(self.src, self.fp8_block, layout, h, inter)?;
        let slots = ExpertSlots::new(self.dev, n as u32, h as u32, inter as u32, &[format])?;
        for e in 0..n {
            let bytes = expert_bytes(self.src, self.fp8_block, layout, [e, n, h, inter], format)?;
            slots.refill_bytes(self.dev, e as u32, &bytes)?;
        }
        Ok((slots, format))
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

    /// [`GpuModel::load`] onto the first accelerator, its allocations held within
    /// `vram_budget` bytes when given (`--device gpu`, `strata.LLM(device='gpu')`), its
    /// kernels compiled ([`GpuModel::prepare_kernels`]).
    /// A model that does not fit the budget is refused with what its weights take there
    /// and what to do instead.
    pub fn load_on_first_device(path: &Path, vram_budget: Option<u64>) -> Result<GpuModel> {
        let dev = strata_accel::open(&strata_accel::DeviceOptions {
            vram_budget,
            ..Default::default()
        })?;
        let (config, src) = open(path)?;
        let loaded = GpuModel::from_source(dev, config, &src);
        if let Ok(gpu) = &loaded {
            gpu.prepare_kernels();
        }
        match loaded {
            Err(Error::Accel(strata_accel::Error::OutOfBudget { budget, .. })) => {
                let (need, file) = device_weight_bytes(&src);
                let size = |b: u64| match b {
                    b if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
                    b => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
                };
                Err(Error::Config(format!(
                    "{} does not fit the device budget of {}: its weights take about {} there \
                     ({} in the file), before the KV cache and scratch; raise --vram-budget \
                     above that, or run --device hybrid, which keeps the routed experts in \
                     host memory",
                    path.display(),
                    size(budget),
                    size(need),
                    size(file),
                )))
            }
            r => r,
        }
    }

    /// Builds the model on `dev` from a parsed config and its tensors.
    pub fn from_source(
        dev: Arc<dyn Device>,
        config: ModelConfig,
        src: &Source,
    ) -> Result<GpuModel> {
        GpuModel::build(dev, config, src, None)
    }

    /// Builds the model on `dev` with every weight there but the routed experts, which
    /// `host` holds (one block per MoE layer, in order: [`strata_model::model::load_moe_blocks`]).
    fn build(
        dev: Arc<dyn Device>,
        config: ModelConfig,
        src: &Source,
        host: Option<Vec<MoeBlock>>,
    ) -> Result<GpuModel> {
        let mut host = host.map(Vec::into_iter);
        let graph = LayerGraph::new(&config, src);
        let scale = config.attention_scale();
        let ld = Loader {
            dev: &*dev,
            src,
            fp8_block: config.fp8_block,
            types: RefCell::new(Vec::new()),
        };
        let h = config.hidden_size;
        let v = config.vocab_size;
        let embed = ld.matrix(&MatrixSpec::new(names::EMBED, v, h, false), false)?;
        let mut layers = Vec::with_capacity(graph.layers().len());
        for (i, node) in graph.layers().iter().enumerate() {
            let ln = LayerNames::new(i);
            let ffn = match &node.ffn {
                FfnConfig::Dense(inter) => {
                    let t = MlpTensors::new(&ln.dense_mlp(), h, *inter);
                    Ffn::Dense(Box::new(ld.mlp(&t)?))
                }
                FfnConfig::Moe(moe) => {
                    let mn = ln.moe(src, moe.shared.as_ref());
                    let t = MoeTensors::new(&mn, moe, h);
                    let r = &moe.router;
                    let n = r.n_experts;
                    let shared = t.shared.as_ref().map(|s| ld.mlp(s)).transpose()?;
                    let shared_gate = t.shared_gate.as_ref();
                    let shared_gate = shared_gate.map(|g| ld.matrix(g, true)).transpose()?;
                    let routed = match host.as_mut() {
                        Some(blocks) => Routed::Host(Box::new(blocks.next().ok_or_else(|| {
                            Error::Config(format!("no host experts for layer {i}"))
                        })?)),
                        None => {
                            let (slots, format) =
                                ld.experts(&mn.experts, n, h, moe.intermediate)?;
                            Routed::Device { slots, format }
                        }
                    };
                    Ffn::Moe(Box::new(Moe {
                        router: ld.matrix(&t.router, true)?,
                        correction_bias: match &t.correction_bias {
                            Some(b) => Some(ld.f32_tensor(&b.name, &b.shape)?),
                            None => None,
                        },
                        routed,
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
                attn_norm: ld.f32_tensor(&ln.attn_norm(), &[h])?,
                attn: ld.attention(&ln.attention(), &node.attention, h)?,
                ffn_norm: ld.f32_tensor(&ln.ffn_norm(), &[h])?,
                ffn,
            });
        }
        let norm = ld.f32_tensor(names::FINAL_NORM, &[h])?;
        let lm_head = match graph.head() {
            Head::Tied => None,
            Head::Own => Some(ld.matrix(&MatrixSpec::new(names::LM_HEAD, v, h, false), false)?),
        };
        dev.synchronize()?;
        let weight_types = ld.types.into_inner();
        let even = graph.layers().iter().all(|l| {
            let (a, b) = l.attention.cache_widths();
            a % 2 == 0 && b % 2 == 0
        });
        Ok(GpuModel {
            kv_type: if even {
                WeightType::F16
            } else {
                WeightType::F32
            },
            rope: Rope::new(&config.rope),
            eps: config.rms_norm_eps,
            graph,
            scale,
            config,
            embed,
            layers,
            norm,
            lm_head,
            dev,
            tap: RwLock::new(None),
            beside: None,
            weight_types,
        })
    }

    /// Compiles the kernels this model dispatches, on every core
    /// ([`Device::prepare_kernels`]), so its first request does not wait for them.
    pub fn prepare_kernels(&self) {
        self.dev.prepare_kernels(&self.weight_types);
    }

    /// The device the model runs on.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.dev
    }

    /// An empty cache for up to `capacity` positions, its values in F16 where every layer's
    /// rows have an even width (else f32).
    pub fn new_cache(&self, capacity: usize) -> Result<GpuCache> {
        self.new_cache_as(capacity, self.kv_type)
    }

    /// [`GpuModel::new_cache`] storing values as `kv_type` (F32, or F16 where the widths
    /// allow it): tests check the kernels against f32 references with F32 caches.
    pub fn new_cache_as(&self, capacity: usize, kv_type: WeightType) -> Result<GpuCache> {
        if !(kv_type == WeightType::F32 || kv_type == self.kv_type) {
            return Err(Error::Config(format!(
                "a {} KV cache: this model's cache rows allow {} or f32",
                kv_type.name(),
                self.kv_type.name()
            )));
        }
        let mut k = Vec::with_capacity(self.layers.len());
        let mut v = Vec::with_capacity(self.layers.len());
        let mut widths = Vec::with_capacity(self.layers.len());
        for layer in self.graph.layers() {
            let (wa, wb) = layer.attention.cache_widths();
            widths.push((wa, wb));
            let bytes = |w: usize| kv_type.bytes(capacity.max(1) * w).next_multiple_of(4);
            k.push(self.dev.alloc(bytes(wa), 0, "key cache")?);
            v.push(self.dev.alloc(bytes(wb), 0, "value cache")?);
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
            dev: Arc::clone(&self.dev),
            k,
            v,
            kv_type,
            widths,
            rope_table,
            len: 0,
            capacity,
        })
    }
}
