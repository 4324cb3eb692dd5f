//! The accelerator interface, drawn like ggml's backend: a [`Device`] says what it is
//! ([`DeviceInfo`]: limits and features) and which operations it runs ([`Device::supports_op`]);
//! it hands out [`Buffer`]s from a pool under a memory budget, moves bytes to and from them
//! asynchronously with [`Event`]s to wait on, and records kernel launches ([`Op`]) that run in
//! submission order. [`ExpertSlots`] are fixed-size regions of one buffer refilled in place:
//! the expert cache of the hybrid runtime.
//!
//! A key design decision made here is that operations are plain data ([`Op`]) handed to one
//! `enqueue` method rather than one trait method per kernel: a backend (wgpu now, CUDA later)
//! implements one dispatcher, `supports_op` answers from the same enum, and a model written
//! against `dyn Device` (`strata_exec::GpuModel`) runs on any of them.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

pub use crate::expert::ExpertFormat;
pub use crate::wtype::WeightType;
use crate::{Error, Result};

/// Kinds of operation a device may support ([`Device::supports_op`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// Embedding row gather.
    Embed(WeightType),
    /// Dense `y = x·Wᵀ (+ b)`.
    Matmul(WeightType),
    /// RMSNorm of rows.
    RmsNorm,
    /// Rotary embedding, NEOX or interleaved, partial, any frequency scaling (host table).
    Rope,
    /// Causal grouped-query attention over a device KV cache (prefill and decode).
    Attention,
    /// Multi-head latent attention with absorbed `kv_b_proj` over a latent cache.
    MlaAttention,
    /// `x = silu(x) * y`.
    SiluMul,
    /// `x += y`, optionally scaled by a per-row sigmoid gate.
    Add,
    /// Router scores and top-k choice (softmax/sigmoid, bias, groups).
    TopK,
    /// Routed experts held in slots over their tokens, grouped by expert.
    ExpertFfn(WeightType),
    /// Weighted sum of the experts' outputs per token.
    MoeCombine,
    /// Routed entries grouped by expert, on the device.
    MoeGroup,
    /// Values stored into a KV cache (f32 or f16).
    CacheStore,
    /// A column range of every row, packed.
    CopyColumns,
    /// Chains of fused multiply-adds that measure the arithmetic peak (benchmarks).
    FmaPeak,
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpKind::Embed(t) => write!(f, "embed.{}", t.name()),
            OpKind::Matmul(t) => write!(f, "matmul.{}", t.name()),
            OpKind::ExpertFfn(t) => write!(f, "expert_ffn.{}", t.name()),
            OpKind::RmsNorm => f.write_str("rms_norm"),
            OpKind::Rope => f.write_str("rope"),
            OpKind::Attention => f.write_str("attention"),
            OpKind::MlaAttention => f.write_str("mla_attention"),
            OpKind::SiluMul => f.write_str("silu_mul"),
            OpKind::Add => f.write_str("add"),
            OpKind::TopK => f.write_str("topk"),
            OpKind::MoeCombine => f.write_str("moe_combine"),
            OpKind::MoeGroup => f.write_str("moe_group"),
            OpKind::CacheStore => f.write_str("cache_store"),
            OpKind::CopyColumns => f.write_str("copy_columns"),
            OpKind::FmaPeak => f.write_str("fma_peak"),
        }
    }
}

/// What a device is and what it can do.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceInfo {
    /// Index among the enumerated devices (`--device gpu:N`).
    pub index: usize,
    /// Adapter name (`llvmpipe (LLVM 15.0.6, 256 bits)`).
    pub name: String,
    /// Backend and graphics API (`wgpu/Vulkan`).
    pub backend: String,
    /// Discrete, integrated, virtual or CPU.
    pub device_type: String,
    /// Driver name and version.
    pub driver: String,
    /// Device memory in bytes, when the API reports it.
    pub memory: Option<u64>,
    /// Largest buffer range one kernel binding may cover; bigger tensors are split.
    pub max_binding: u64,
    /// Largest single buffer.
    pub max_buffer: u64,
    /// Native f16 arithmetic in shaders.
    pub shader_f16: bool,
    /// Subgroup (warp/wave) operations.
    pub subgroups: bool,
    /// Operations this device runs.
    pub ops: Vec<OpKind>,
}

/// How to open a device.
#[derive(Debug, Clone, Default)]
pub struct DeviceOptions {
    /// Which enumerated device (0 = first).
    pub index: usize,
    /// Memory budget in bytes for all buffers (`--vram-budget`); `None`: no budget.
    pub vram_budget: Option<u64>,
    /// Split splittable buffers (weights, tables, expert slots: those allocated with a
    /// granule) at this many bytes, below the device's binding limit; tests use it to
    /// exercise split tensors on small shapes.
    pub max_binding: Option<u64>,
    /// Reduce without subgroup operations even where the adapter has them (tests run the
    /// kernels both ways).
    pub no_subgroups: bool,
    /// Run quantized weights through the row kernels at every token count, never the tiled
    /// prefill kernels (tests and `strata bench device --no-tiles` compare the two).
    pub no_tiles: bool,
}

/// Memory in use under the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryUse {
    /// Bytes in live buffers.
    pub live: u64,
    /// Bytes of freed buffers the pool keeps for reuse.
    pub pooled: u64,
    /// The budget (`u64::MAX` when none was set).
    pub budget: u64,
}

/// A backend's buffer behind a [`Buffer`] handle.
pub trait RawBuffer: Any + Send + Sync + fmt::Debug {
    /// For the backend to recover its own type.
    fn as_any(&self) -> &dyn Any;
}

/// Device memory. Dropping it returns the memory to the device's pool.
#[derive(Debug)]
pub struct Buffer {
    bytes: u64,
    raw: Box<dyn RawBuffer>,
}

impl Buffer {
    /// Wraps a backend buffer of `bytes` bytes.
    pub fn new(bytes: u64, raw: Box<dyn RawBuffer>) -> Buffer {
        Buffer { bytes, raw }
    }

    /// Size in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The backend's buffer.
    pub fn raw(&self) -> &dyn RawBuffer {
        &*self.raw
    }
}

/// Completion of submitted work (an upload, a download or a batch of kernels).
#[derive(Debug, Clone)]
pub struct Event {
    done: Arc<AtomicBool>,
}

impl Event {
    /// A pending event and the flag its backend sets on completion.
    pub fn new() -> (Event, Arc<AtomicBool>) {
        let done = Arc::new(AtomicBool::new(false));
        (Event { done: done.clone() }, done)
    }

    /// Whether the work has completed (as last observed; [`Device::poll`] updates it).
    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }
}

/// Bytes on their way back from the device ([`Device::download_async`]).
pub struct Readback {
    event: Event,
    read: Box<dyn FnOnce() -> Result<Vec<u8>> + Send>,
}

impl Readback {
    /// A readback that completes with `event` and yields its bytes through `read` (which
    /// blocks until then).
    pub fn new(event: Event, read: Box<dyn FnOnce() -> Result<Vec<u8>> + Send>) -> Readback {
        Readback { event, read }
    }

    /// Completes when the bytes are on the host.
    pub fn event(&self) -> &Event {
        &self.event
    }

    /// Waits for the bytes.
    pub fn wait(self) -> Result<Vec<u8>> {
        (self.read)()
    }
}

impl fmt::Debug for Readback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Readback")
            .field("done", &self.event.is_done())
            .finish()
    }
}

/// RoPE pairing: rotate the two halves of a head (NeoX) or adjacent pairs (GPT-J).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeKind {
    /// `i` with `i + d/2`.
    Neox,
    /// `2i` with `2i + 1`.
    Interleaved,
}

/// Router settings of [`Op::TopK`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TopKParams {
    /// Experts.
    pub n_experts: u32,
    /// Chosen per token.
    pub k: u32,
    /// Sigmoid scores (else softmax).
    pub sigmoid: bool,
    /// `(n_group, topk_group, top2_sum)` group-limited selection.
    pub groups: Option<(u32, u32, bool)>,
    /// Renormalise the chosen weights.
    pub norm: bool,
    /// Final factor on the weights.
    pub scaling: f32,
}

/// Most experts per layer [`Op::MoeGroup`] groups (DeepSeek-V3 has 256, Qwen3-Next 512).
pub const MOE_GROUP_MAX_EXPERTS: u32 = 1024;

/// One range of f32 values for [`Op::CacheStore`]: `n` values of `src` from element `from`,
/// into the cache `dst` at element `at`.
#[derive(Debug, Clone, Copy)]
pub struct CacheWrite<'a> {
    /// Values, f32.
    pub src: &'a Buffer,
    /// First element read.
    pub from: u64,
    /// The cache.
    pub dst: &'a Buffer,
    /// First element written.
    pub at: u64,
    /// Elements.
    pub n: u64,
}

/// One kernel launch. Buffers hold f32 activations unless a [`WeightType`] says otherwise;
/// shapes are in elements.
#[derive(Debug)]
pub enum Op<'a> {
    /// `out[t, :] = table[ids[t], :]`, `table: [n_rows, dim]`.
    Embed {
        /// Embedding table (may be split across bindings at row boundaries).
        table: &'a Buffer,
        /// Its storage type.
        wtype: WeightType,
        /// Token ids, u32 `[rows]`.
        ids: &'a Buffer,
        /// Output `[rows, dim]`.
        out: &'a Buffer,
        /// Tokens.
        rows: u32,
        /// Row width.
        dim: u32,
    },
    /// `out[m, n] = x[m, k] · w[n, k]ᵀ (+ bias[n])`.
    Matmul {
        /// Input `[m, k]`.
        x: &'a Buffer,
        /// Weight `[n, k]` (may be split across bindings at row boundaries).
        w: &'a Buffer,
        /// Its storage type.
        wtype: WeightType,
        /// Bias `[n]`.
        bias: Option<&'a Buffer>,
        /// Output `[m, n]`.
        out: &'a Buffer,
        /// Rows of x.
        m: u32,
        /// Output features.
        n: u32,
        /// Input features.
        k: u32,
    },
    /// `out = rms_norm(x) * w` over rows of `dim`; with `residual`, `x += residual` first,
    /// in place and in the same dispatch (the residual add a norm follows).
    RmsNorm {
        /// Input `[rows, dim]` (updated in place with a residual).
        x: &'a Buffer,
        /// A block's output `[rows, dim]` to add into `x` first.
        residual: Option<&'a Buffer>,
        /// Gain `[dim]`.
        w: &'a Buffer,
        /// Output (a different buffer).
        out: &'a Buffer,
        /// Rows.
        rows: u32,
        /// Row width.
        dim: u32,
        /// Epsilon.
        eps: f32,
    },
    /// Rotates `x: [rows, n_heads * head_stride]` in place: in every head, the `2 * half`
    /// values from `offset` on, by the row's position; with `norm`, each head is first
    /// RMS-normalised (Qwen3's q_norm and k_norm) in the same pass.
    Rope {
        /// Data, rotated in place.
        x: &'a Buffer,
        /// Position of each row, u32 `[rows]`.
        positions: &'a Buffer,
        /// `[max_pos, 2 * half]`: cos then sin per position.
        table: &'a Buffer,
        /// Rows.
        rows: u32,
        /// Heads per row.
        n_heads: u32,
        /// Width of a head.
        head_stride: u32,
        /// First rotated value in a head.
        offset: u32,
        /// Rotated pairs per head.
        half: u32,
        /// Pairing.
        kind: RopeKind,
        /// The per-head norm's gain `[head_stride]` and epsilon, applied before rotating.
        norm: Option<(&'a Buffer, f32)>,
    },
    /// Causal attention of `q: [n_tokens, n_heads * hd]` (positions `start_pos..`) over
    /// the caches `k, v: [ctx, n_kv_heads * hd]` that already hold these tokens.
    Attention {
        /// Queries.
        q: &'a Buffer,
        /// Key cache.
        k: &'a Buffer,
        /// Value cache.
        v: &'a Buffer,
        /// How the caches store values: [`WeightType::F32`] or [`WeightType::F16`].
        cache: WeightType,
        /// Output `[n_tokens, n_heads * hd]`.
        out: &'a Buffer,
        /// New tokens.
        n_tokens: u32,
        /// Position of the first.
        start_pos: u32,
        /// Query heads.
        n_heads: u32,
        /// Key/value heads.
        n_kv_heads: u32,
        /// Head dimension (at most 256).
        head_dim: u32,
        /// Sliding window (0: none).
        window: u32,
        /// Score scale.
        scale: f32,
    },
    /// Causal multi-head latent attention of `q: [n_tokens, n_heads * (nope + rope)]`
    /// (rotary part already rotated) over the latent cache `latent: [ctx, l]` and rotary
    /// keys `k_rope: [ctx, rope]` that already hold these tokens, absorbing
    /// `kv_b: [n_heads * (nope + v), l]` (f32) into the query and the output.
    MlaAttention {
        /// Queries.
        q: &'a Buffer,
        /// Normalised latents.
        latent: &'a Buffer,
        /// Rotated shared keys.
        k_rope: &'a Buffer,
        /// How the two caches store values: [`WeightType::F32`] or [`WeightType::F16`].
        cache: WeightType,
        /// `kv_b_proj` weight, f32.
        kv_b: &'a Buffer,
        /// Output `[n_tokens, n_heads * v]`.
        out: &'a Buffer,
        /// New tokens.
        n_tokens: u32,
        /// Position of the first.
        start_pos: u32,
        /// Heads.
        n_heads: u32,
        /// Latent rank (at most 512).
        kv_lora: u32,
        /// Non-rotary query/key dims per head.
        nope: u32,
        /// Rotary dims (at most 64).
        rope: u32,
        /// Value dims per head.
        v_dim: u32,
        /// Score scale.
        scale: f32,
    },
    /// `x = silu(x) * y` over `n` values (`x` and `y` distinct buffers, as for every op).
    SiluMul {
        /// Gate, overwritten.
        x: &'a Buffer,
        /// Up.
        y: &'a Buffer,
        /// Values.
        n: u32,
    },
    /// `x += y`, or `x += sigmoid(gate[row]) * y` with rows of `dim`.
    Add {
        /// Accumulator.
        x: &'a Buffer,
        /// Addend.
        y: &'a Buffer,
        /// Per-row gate logits.
        gate: Option<&'a Buffer>,
        /// Values.
        n: u32,
        /// Row width (for the gate).
        dim: u32,
    },
    /// Router: `logits: [tokens, n_experts]` to `ids, weights: [tokens, k]`.
    TopK {
        /// Router logits.
        logits: &'a Buffer,
        /// Selection bias `[n_experts]`.
        bias: Option<&'a Buffer>,
        /// Chosen experts, u32.
        ids: &'a Buffer,
        /// Their weights.
        weights: &'a Buffer,
        /// Tokens.
        tokens: u32,
        /// Settings.
        params: TopKParams,
    },
    /// Routed experts held in `slots` over their rows: `stage 0` writes
    /// `act[p] = silu(x[row_p]·gate) * (x[row_p]·up)`, `stage 1` writes `y[p] = act[p]·downᵀ`.
    ExpertFfn {
        /// Stage input: activations `[T, hidden]` (stage 0) or `act: [P, inter]` (stage 1).
        x: &'a Buffer,
        /// The expert slots.
        slots: &'a ExpertSlots,
        /// How this layer's experts are stored in them.
        format: ExpertFormat,
        /// `(row, slot)` u32 pairs `[P, 2]`, sorted by slot.
        pairs: &'a Buffer,
        /// Output `[P, inter]` or `[P, hidden]`.
        out: &'a Buffer,
        /// Pairs.
        n_pairs: u32,
        /// Experts the pairs are spread over, at most (the layer's routed experts, or
        /// fewer where the caller knows): with many pairs per expert (prefill) a backend
        /// takes its tiled kernel.
        experts: u32,
        /// 0: gate and up, 1: down.
        stage: u32,
    },
    /// `out[t] += Σ_j weights[t, j] · y[pair_of[t, j]]`; with `norm`, each updated row's
    /// RMSNorm too (the next layer's attention norm, in the same dispatch).
    MoeCombine {
        /// Accumulator `[tokens, hidden]`.
        out: &'a Buffer,
        /// Experts' outputs `[P, hidden]`.
        y: &'a Buffer,
        /// Weights `[tokens, k]`.
        weights: &'a Buffer,
        /// Pair index of each (token, choice), u32 `[tokens, k]`.
        pair_of: &'a Buffer,
        /// Tokens.
        tokens: u32,
        /// Row width.
        hidden: u32,
        /// Choices per token.
        k: u32,
        /// The norm's gain `[hidden]`, its output `[tokens, hidden]` and epsilon.
        norm: Option<(&'a Buffer, &'a Buffer, f32)>,
    },
    /// Stores `writes` into KV caches held as `cache`: [`WeightType::F32`], a copy each, or
    /// [`WeightType::F16`], rounded to nearest (each write's `at` and `n` even), two writes
    /// per dispatch (a layer's keys and values in one).
    CacheStore {
        /// The writes.
        writes: &'a [CacheWrite<'a>],
        /// How the caches store values.
        cache: WeightType,
    },
    /// `dst[r, c] = src[r, first + c]` for `c < width`: one dispatch where a copy per row
    /// took one command each (MLA splits each row of its `kv_a` output into the latent and
    /// the rotary key).
    CopyColumns {
        /// Rows of `src_width` f32 values.
        src: &'a Buffer,
        /// Values per row of `src`.
        src_width: u32,
        /// First column copied.
        first: u32,
        /// `[rows, width]`.
        dst: &'a Buffer,
        /// Columns copied.
        width: u32,
        /// Rows.
        rows: u32,
    },
    /// Groups the routed entries `ids: [tokens, k]` (u32 experts below `n_experts`, at most
    /// [`MOE_GROUP_MAX_EXPERTS`]) by expert without the host: `pairs: [tokens * k, 2]` gets
    /// the (token, expert) pairs sorted by expert, one expert's in routing order (what
    /// [`Op::ExpertFfn`] reads), and `pair_of: [tokens, k]` each entry's position (what
    /// [`Op::MoeCombine`] reads).
    MoeGroup {
        /// Chosen experts, u32 `[tokens, k]`.
        ids: &'a Buffer,
        /// Output pairs, u32 `[tokens * k, 2]`.
        pairs: &'a Buffer,
        /// Output positions, u32 `[tokens, k]`.
        pair_of: &'a Buffer,
        /// Tokens.
        tokens: u32,
        /// Choices per token.
        k: u32,
        /// Experts of the layer.
        n_experts: u32,
    },
    /// The arithmetic peak: each of `workgroups * 64` invocations runs `iters` rounds of 16
    /// independent vec4 fused multiply-adds (128 FLOPs a round) in f16 when `half` (the
    /// device must report `shader_f16`), else f32, and writes one f32 to `out`.
    FmaPeak {
        /// Output `[workgroups * 64]` f32.
        out: &'a Buffer,
        /// Workgroups of 64 (at most the device's limit per dimension, 65535 in practice).
        workgroups: u32,
        /// Rounds per invocation.
        iters: u32,
        /// f16 arithmetic.
        half: bool,
    },
}

impl Op<'_> {
    /// The kind of this operation.
    pub fn kind(&self) -> OpKind {
        match self {
            Op::Embed { wtype, .. } => OpKind::Embed(*wtype),
            Op::Matmul { wtype, .. } => OpKind::Matmul(*wtype),
            Op::RmsNorm { .. } => OpKind::RmsNorm,
            Op::Rope { .. } => OpKind::Rope,
            Op::Attention { .. } => OpKind::Attention,
            Op::MlaAttention { .. } => OpKind::MlaAttention,
            Op::SiluMul { .. } => OpKind::SiluMul,
            Op::Add { .. } => OpKind::Add,
            Op::TopK { .. } => OpKind::TopK,
            Op::ExpertFfn { format, stage, .. } => OpKind::ExpertFfn(format.stage_type(*stage)),
            Op::MoeCombine { .. } => OpKind::MoeCombine,
            Op::MoeGroup { .. } => OpKind::MoeGroup,
            Op::CacheStore { .. } => OpKind::CacheStore,
            Op::CopyColumns { .. } => OpKind::CopyColumns,
            Op::FmaPeak { .. } => OpKind::FmaPeak,
        }
    }
}

/// An accelerator: memory, transfers, kernels and synchronisation.
///
/// Work is ordered: uploads, recorded kernels and downloads take effect in the order they
/// are issued, so a kernel recorded after an upload reads the uploaded bytes and an upload
/// issued after a kernel does not change what that kernel reads.
pub trait Device: Send + Sync + fmt::Debug {
    /// What this device is.
    fn info(&self) -> &DeviceInfo;

    /// Whether `op` runs on this device. Default: listed in [`DeviceInfo::ops`].
    fn supports_op(&self, op: OpKind) -> bool {
        self.info().ops.contains(&op)
    }

    /// Memory held under the budget.
    fn memory(&self) -> MemoryUse;

    /// Submissions and transfers so far.
    fn traffic(&self) -> crate::Traffic;

    /// Device time per kernel so far, where the backend times its dispatches
    /// (`STRATA_GPU_PROFILE=1`); `None` otherwise.
    fn kernel_times(&self) -> Option<crate::KernelTimes> {
        None
    }

    /// Compiles, in parallel, the kernels a model whose weights are stored as `weights`
    /// will dispatch, so its first step does not pay for them (a GPU driver compiles each
    /// kernel on first use, ~60 ms each on an H200 with a cold cache). Kernels that fail
    /// to compile are left for their first use to report.
    fn prepare_kernels(&self, weights: &[WeightType]) {
        let _ = weights;
    }

    /// A buffer of `bytes` bytes from the pool. With `granule > 0` it is split into bindings
    /// at multiples of `granule` bytes (rows or slots) when larger than the binding limit;
    /// with 0 it must fit one binding (activations, caches). Fails with
    /// [`crate::Error::OutOfBudget`] past the budget.
    fn alloc(&self, bytes: u64, granule: u64, label: &str) -> Result<Buffer>;

    /// Copies `data` into `buf` at `offset` without waiting for it to land, in order with
    /// the work recorded around it: kernels recorded before do not see the data, kernels
    /// recorded after do. A backend may send it with the next [`Device::submit`] rather than
    /// submit it alone; the returned event completes when it has landed ([`Device::wait`]
    /// on it submits what it needs).
    fn upload(&self, buf: &Buffer, offset: u64, data: &[u8]) -> Result<Event>;

    /// Starts reading `len` bytes of `buf` from `offset`, after all work issued before,
    /// without waiting: compute issued later may run meanwhile.
    fn download_async(&self, buf: &Buffer, offset: u64, len: u64) -> Result<Readback>;

    /// Reads `len` bytes of `buf` from `offset`, after all work issued before. Default:
    /// [`Device::download_async`] and wait.
    fn download(&self, buf: &Buffer, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.download_async(buf, offset, len)?.wait()
    }

    /// Copies bytes between buffers on the device, in order with kernels.
    fn copy(
        &self,
        src: &Buffer,
        src_offset: u64,
        dst: &Buffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<()>;

    /// Records a kernel launch; it runs at the next [`Device::submit`].
    fn enqueue(&self, op: &Op<'_>) -> Result<()>;

    /// Sends recorded work to the device (nothing when none is recorded); the event
    /// completes when all work sent so far has run.
    fn submit(&self) -> Result<Event>;

    /// Blocks until `event` completes.
    fn wait(&self, event: &Event) -> Result<()>;

    /// Updates events without blocking.
    fn poll(&self) -> Result<()>;

    /// Submits everything recorded and waits for it. Default: [`Device::submit`] then
    /// [`Device::wait`].
    fn synchronize(&self) -> Result<()> {
        let e = self.submit()?;
        self.wait(&e)
    }
}

/// `n` fixed-size regions of one buffer, each holding one expert, refilled in place. A slot
/// holds an expert of any [`ExpertFormat`] that fits it: a hybrid cache shares its slots
/// among layers whose experts are stored in different types, and each kernel launch says
/// the format of the layer it serves.
#[derive(Debug)]
pub struct ExpertSlots {
    /// The storage (split across bindings at slot boundaries).
    pub buffer: Buffer,
    /// Residual stream width.
    pub hidden: u32,
    /// Expert intermediate size.
    pub inter: u32,
    /// Number of slots.
    pub n_slots: u32,
    /// Bytes per slot (whole words).
    pub slot_bytes: u64,
}

impl ExpertSlots {
    /// Allocates `n_slots` slots large enough for experts in any of `formats`.
    pub fn new(
        dev: &dyn Device,
        n_slots: u32,
        hidden: u32,
        inter: u32,
        formats: &[ExpertFormat],
    ) -> Result<ExpertSlots> {
        let mut slot_bytes = 0;
        for f in formats {
            f.check(hidden, inter)?;
            slot_bytes = slot_bytes.max(f.bytes(hidden, inter));
        }
        let buffer = dev.alloc(slot_bytes * n_slots as u64, slot_bytes, "expert slots")?;
        Ok(ExpertSlots {
            buffer,
            hidden,
            inter,
            n_slots,
            slot_bytes,
        })
    }

    /// Starts refilling `slot` with an expert's weights (`gate`, `up`: `[inter, hidden]`,
    /// `down`: `[hidden, inter]`, f32) encoded in the float type `wtype`. Kernels issued
    /// after this call read the new expert; kernels issued before read the old one.
    pub fn refill(
        &self,
        dev: &dyn Device,
        slot: u32,
        wtype: WeightType,
        [gate, up, down]: [&[f32]; 3],
    ) -> Result<Event> {
        let hi = self.hidden as usize * self.inter as usize;
        if gate.len() != hi || up.len() != hi || down.len() != hi {
            return Err(Error::Shape {
                op: "expert slot refill",
                message: format!(
                    "expected 3 x {hi} values but got {}, {}, {}",
                    gate.len(),
                    up.len(),
                    down.len()
                ),
            });
        }
        let mut all = Vec::with_capacity(3 * hi + 1);
        all.extend_from_slice(gate);
        all.extend_from_slice(up);
        all.extend_from_slice(down);
        self.refill_bytes(dev, slot, &wtype.encode(&all)?)
    }

    /// [`ExpertSlots::refill`] from the three matrices' bytes as stored in `format` (the
    /// quantized blocks of a GGUF's expert, uploaded as they are in the file).
    pub fn refill_parts(
        &self,
        dev: &dyn Device,
        slot: u32,
        format: ExpertFormat,
        [gate, up, down]: [&[u8]; 3],
    ) -> Result<Event> {
        let [part, down_bytes] = format.part_bytes(self.hidden, self.inter);
        let want = [part, part, down_bytes];
        let got = [gate.len() as u64, up.len() as u64, down.len() as u64];
        if got != want {
            return Err(Error::Shape {
                op: "expert slot refill",
                message: format!("expected {want:?} bytes of gate, up, down but got {got:?}"),
            });
        }
        // One upload: uploads take whole words, and a part may end inside one.
        let mut whole = Vec::with_capacity(format.bytes(self.hidden, self.inter) as usize);
        whole.extend_from_slice(gate);
        whole.extend_from_slice(up);
        whole.extend_from_slice(down);
        whole.resize(whole.len().next_multiple_of(4), 0);
        self.refill_bytes(dev, slot, &whole)
    }

    /// [`ExpertSlots::refill`] from bytes already in a slot's layout (at most `slot_bytes`,
    /// whole words; the rest of the slot is left as it was).
    pub fn refill_bytes(&self, dev: &dyn Device, slot: u32, bytes: &[u8]) -> Result<Event> {
        let n = bytes.len() as u64;
        if slot >= self.n_slots || n > self.slot_bytes || !n.is_multiple_of(4) {
            return Err(Error::Shape {
                op: "expert slot refill",
                message: format!(
                    "slot {slot} of {}, expected at most {} bytes in whole words but got {n}",
                    self.n_slots, self.slot_bytes,
                ),
            });
        }
        dev.upload(&self.buffer, slot as u64 * self.slot_bytes, bytes)
    }
}
