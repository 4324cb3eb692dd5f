//! Packed weight matrices: BF16, INT8 and INT4 in one tile-friendly layout, and `y = x · Wᵀ`.
//!
//! [`PackedMatrix::pack`] takes row-major weights `W: [n, k]` (the Hugging Face `nn.Linear`
//! layout) once at load and rewrites them into *strips* of 16 output columns. A strip holds all
//! of `k` as a run of 64-byte lines, each line one VNNI row for 16 columns:
//!
//! | format | one 64-byte line holds                      | k per line |
//! |--------|---------------------------------------------|------------|
//! | BF16   | 16 columns x 2 consecutive k (bf16 pairs)   | 2          |
//! | INT8   | 16 columns x 4 consecutive k (u8 quads)     | 4          |
//! | INT4   | two INT8 lines, low nibble then high nibble | 8          |
//!
//! That line is exactly one row of an AMX B tile (`tdpbf16ps`, `tdpbsud`), and exactly one zmm
//! for AVX-512 `vdpbf16ps`/`vpdpbusd` with the activation pair or quad broadcast, so all paths
//! read the same bytes. Kernels walk a panel of a few strips over a block of `k` sized to stay
//! in L2 while every token row streams over it.
//!
//! Integers are stored *unsigned with an offset* (INT8 `q + 128`, INT4 `q + 8`) so that both
//! AVX-512 VNNI (`u8 x s8`) and AMX (`tdpbsud`: `s8 x u8`) multiply them with signed int8
//! activations directly; the offset times the activation sum is subtracted at each scale
//! flush. Scales are symmetric: per output row (INT8 without group) or per `group` of `k`.
//!
//! Activations are converted per call: to BF16 (round to nearest even), or to int8 with one
//! scale per token (`amax / 127`; per 32 values for the GGUF INT8 tiles, whose weight scales
//! are per 32 too). `n` is padded to a multiple of 32 (two strips: an AMX
//! 32x32 output block) and `k` to the tile depth, with zeros.
//!
//! A matrix owns its bytes when packed at load, or views them in a memory-mapped file
//! written by `strata convert` ([`PackedMatrix::from_stored`]): the kernels read both
//! through the same pointer, so a converted model loads by mapping, without repacking.
//! [`LAYOUT_VERSION`] names this layout; files record it and refuse another.

use std::ptr::NonNull;
use std::sync::Arc;

use half::bf16;

use crate::buf::{ALIGN, AlignedBuf, SharedMut};
use crate::error::{KernelError, check_len};
use crate::isa::Isa;
use crate::parallel_for;

mod activations;
pub(crate) mod micro;

pub(crate) use activations::Activations;
use micro::Kernel;

/// Output columns per strip (one AMX tile / one zmm of f32).
pub(crate) const STRIP: usize = 16;
/// Bytes per packed line.
pub(crate) const LINE: usize = 64;
/// Activation sums are kept per this many `k`, the smallest group.
pub(crate) const XSUM_UNIT: usize = 32;
/// Token rows are padded to this (two AMX A tiles).
pub(crate) const M_ALIGN: usize = 32;

/// Version of the packed layout (strip order, line contents, integer offsets, scale order).
/// Any change to how [`PackedMatrix::pack`] arranges bytes or scales must increment it:
/// converted model files record it and are refused when it differs.
pub const LAYOUT_VERSION: u32 = 1;

/// How a [`PackedMatrix`] stores its weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PackedFormat {
    /// Brain float 16, activations rounded to BF16.
    Bf16,
    /// Symmetric int8, one scale per output row (`group: None`) or per `group` of `k`.
    Int8 {
        /// Scale group along `k`: 32, 64 or 128, or `None` for one scale per row.
        group: Option<usize>,
    },
    /// Symmetric int4 in `[-8, 7]`, one scale per `group` of `k` (32, 64 or 128).
    Int4 {
        /// Scale group along `k`.
        group: usize,
    },
}

impl PackedFormat {
    /// Short name: `bf16`, `int8`, `int8g64`, `int4g32`...
    pub fn name(&self) -> String {
        match self {
            PackedFormat::Bf16 => "bf16".into(),
            PackedFormat::Int8 { group: None } => "int8".into(),
            PackedFormat::Int8 { group: Some(g) } => format!("int8g{g}"),
            PackedFormat::Int4 { group } => format!("int4g{group}"),
        }
    }

    fn validate(&self, op: &'static str) -> Result<(), KernelError> {
        let g = match self {
            PackedFormat::Bf16 | PackedFormat::Int8 { group: None } => return Ok(()),
            PackedFormat::Int8 { group: Some(g) } | PackedFormat::Int4 { group: g } => *g,
        };
        if matches!(g, 32 | 64 | 128) {
            Ok(())
        } else {
            Err(KernelError::Group { op, got: g })
        }
    }
}

/// The element kinds a weight matrix can be packed from.
pub trait PackSource: Copy + Sync {
    /// The value as f32.
    fn to_f32(self) -> f32;
}

impl PackSource for f32 {
    fn to_f32(self) -> f32 {
        self
    }
}

impl PackSource for bf16 {
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}

/// Storage kind, without the group parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Bf16,
    Int8,
    Int4,
}

impl Kind {
    /// `k` values per packed line of a strip: a BF16 pair, an INT8 quad, two INT4 quads.
    pub(crate) fn k_per_line(self) -> usize {
        match self {
            Kind::Bf16 => 2,
            Kind::Int8 => 4,
            Kind::Int4 => 8,
        }
    }

    /// Bytes per `k` of the activations this kind multiplies: BF16, or int8 for both integer
    /// kinds.
    pub(crate) fn activation_bytes(self) -> usize {
        if self == Kind::Bf16 { 2 } else { 1 }
    }
}

/// A weight matrix `[n, k]` packed for the kernels; see the module docs for the layout.
#[derive(Clone)]
pub struct PackedMatrix {
    pub(crate) fmt: PackedFormat,
    pub(crate) kind: Kind,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) n_pad: usize,
    pub(crate) k_pad: usize,
    /// `k` per scale: the group, or `k_pad` for per-row scales and BF16.
    pub(crate) group: usize,
    pub(crate) groups: usize,
    pub(crate) strip_bytes: usize,
    pub(crate) data: PackedBytes,
    /// `[strip][group][16]`.
    pub(crate) scales: PackedScales,
    /// What the stored integers exceed the values by ([`micro::offset`] of the kind, or 0
    /// for the INT8 tiles of values that are never negative: [`PackedMatrix::unsigned`]).
    pub(crate) offset: i32,
}

/// Bytes that stay at one address, unchanged, for as long as their owner lives: a read-only
/// memory map of a converted model file.
///
/// # Safety
///
/// Implementors guarantee that [`StableBytes::stable_bytes`] returns the same slice (address
/// and length) on every call, and that those bytes are not modified while the value lives:
/// matrices keep a pointer into them.
pub unsafe trait StableBytes: Send + Sync {
    /// The bytes.
    fn stable_bytes(&self) -> &[u8];
}

// SAFETY: the address and length are fixed at allocation; the bytes change only through
// `as_mut_slice`, which needs `&mut self`, so never while a matrix shares the buffer through
// an `Arc` (a cache slot is refilled only once its `Arc` is unique again).
unsafe impl StableBytes for crate::AlignedBuf {
    fn stable_bytes(&self) -> &[u8] {
        self.as_slice()
    }
}

/// What keeps a matrix's bytes alive: an owned buffer, or the mapped file.
type Keep = Arc<dyn Send + Sync>;

/// The packed values: a pointer fixed at construction (so the kernels' hot paths read it
/// directly) and the owner that keeps it valid.
#[derive(Clone)]
pub(crate) struct PackedBytes {
    ptr: NonNull<u8>,
    len: usize,
    mapped: bool,
    _keep: Keep,
}

// SAFETY: the bytes are immutable once built and kept alive by `_keep`, which is Send + Sync.
unsafe impl Send for PackedBytes {}
// SAFETY: as for Send: shared access only reads immutable bytes.
unsafe impl Sync for PackedBytes {}

impl PackedBytes {
    fn owned(buf: AlignedBuf) -> Self {
        let buf = Arc::new(buf);
        Self {
            ptr: NonNull::new(buf.as_ptr().cast_mut()).expect("aligned buffers are non-null"),
            len: buf.len(),
            mapped: false,
            _keep: buf,
        }
    }

    /// The bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` immutable bytes while `_keep` lives (an owned
        // buffer, or mapped bytes whose `StableBytes` contract fixes their address).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// Pointer to the first byte (64-byte aligned).
    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

/// The scales, owned or viewed in mapped bytes; derefs to `[f32]`.
#[derive(Clone)]
pub(crate) struct PackedScales {
    ptr: NonNull<f32>,
    len: usize,
    _keep: Keep,
}

// SAFETY: as for `PackedBytes`.
unsafe impl Send for PackedScales {}
// SAFETY: as for `PackedBytes`.
unsafe impl Sync for PackedScales {}

impl PackedScales {
    fn owned(v: Vec<f32>) -> Self {
        let v = Arc::new(v);
        Self {
            ptr: NonNull::new(v.as_ptr().cast_mut()).expect("vector pointers are non-null"),
            len: v.len(),
            _keep: v,
        }
    }
}

impl std::ops::Deref for PackedScales {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        // SAFETY: `ptr` is valid and 4-byte aligned for `len` immutable floats while `_keep`
        // lives (checked at construction for mapped bytes; every bit pattern is a float).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

/// Sizes of a matrix's packed form, from its format and shape alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackedLayout {
    kind: Kind,
    pub(crate) n_pad: usize,
    pub(crate) k_pad: usize,
    group: usize,
    groups: usize,
    pub(crate) strip_bytes: usize,
    /// Bytes of packed values.
    pub data_bytes: usize,
    /// Number of f32 scales.
    pub scales: usize,
}

impl PackedLayout {
    /// The layout of an `[n, k]` matrix packed in `fmt`.
    pub fn new(fmt: PackedFormat, n: usize, k: usize) -> Result<Self, KernelError> {
        fmt.validate("packed layout")?;
        Ok(Self::sizes(fmt, n, k))
    }

    /// [`PackedLayout::new`] without checking the group: also the INT8 tiles with a scale per
    /// 16 of the ggml types that have one (their activations carry sums per 16; not a
    /// format a model is packed or stored in).
    pub(crate) fn sizes(fmt: PackedFormat, n: usize, k: usize) -> Self {
        let (kind, k_align, group) = match fmt {
            PackedFormat::Bf16 => (Kind::Bf16, 32, None),
            PackedFormat::Int8 { group } => (Kind::Int8, group.unwrap_or(64).max(64), group),
            PackedFormat::Int4 { group } => (Kind::Int4, group.max(64), Some(group)),
        };
        let n_pad = n.div_ceil(2 * STRIP) * 2 * STRIP;
        let k_pad = k.div_ceil(k_align).max(1) * k_align;
        let group = group.unwrap_or(k_pad);
        let groups = k_pad / group;
        let strips = n_pad / STRIP;
        let strip_bytes = match kind {
            Kind::Bf16 => k_pad * STRIP * 2,
            Kind::Int8 => k_pad * STRIP,
            Kind::Int4 => k_pad * STRIP / 2,
        };
        Self {
            kind,
            n_pad,
            k_pad,
            group,
            groups,
            strip_bytes,
            data_bytes: strips * strip_bytes,
            scales: strips * groups * STRIP,
        }
    }
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedMatrix")
            .field("format", &self.fmt.name())
            .field("n", &self.n)
            .field("k", &self.k)
            .finish()
    }
}

impl PackedMatrix {
    /// Packs row-major weights `w: [n_out, k_in]` into `fmt`.
    pub fn pack<T: PackSource>(
        w: &[T],
        n_out: usize,
        k_in: usize,
        fmt: PackedFormat,
    ) -> Result<Self, KernelError> {
        const OP: &str = "pack";
        fmt.validate(OP)?;
        check_len(OP, "weights", n_out * k_in, w.len())?;
        let l = PackedLayout::new(fmt, n_out, k_in)?;
        let (kind, k_pad, group, groups, strip_bytes) =
            (l.kind, l.k_pad, l.group, l.groups, l.strip_bytes);
        let strips = l.n_pad / STRIP;
        let mut data = AlignedBuf::zeroed(strips * strip_bytes);
        let mut scales = vec![0.0f32; strips * groups * STRIP];
        {
            let data_w = SharedMut::new(data.as_mut_slice());
            let scales_w = SharedMut::new(&mut scales);
            parallel_for(strips, |s| {
                // SAFETY: strip `s` owns bytes `s * strip_bytes ..` and scales
                // `s * groups * 16 ..` exclusively; each task packs one strip.
                let (bytes, sc) = unsafe {
                    (
                        data_w.part(s * strip_bytes, strip_bytes),
                        scales_w.part(s * groups * STRIP, groups * STRIP),
                    )
                };
                pack_strip(w, n_out, k_in, k_pad, kind, group, s, bytes, sc);
            });
        }
        Ok(Self::with_storage(
            fmt,
            n_out,
            k_in,
            l,
            PackedBytes::owned(data),
            PackedScales::owned(scales),
        ))
    }

    fn with_storage(
        fmt: PackedFormat,
        n: usize,
        k: usize,
        l: PackedLayout,
        data: PackedBytes,
        scales: PackedScales,
    ) -> Self {
        Self {
            fmt,
            kind: l.kind,
            n,
            k,
            n_pad: l.n_pad,
            k_pad: l.k_pad,
            group: l.group,
            groups: l.groups,
            strip_bytes: l.strip_bytes,
            data,
            scales,
            offset: micro::offset(l.kind),
        }
    }

    /// The same INT8 matrix with its integers stored as they are (`q`, not `q + 128`): the
    /// tiles of ggml types whose values are never negative (`q` in 0..32), whose sums then
    /// need no offset correction (10% of the Q4_K tile kernel's time on an Ice Lake,
    /// 2026-11-30).
    pub(crate) fn unsigned(mut self) -> Self {
        debug_assert_eq!(self.kind, Kind::Int8, "unsigned storage is an INT8 form");
        self.offset = 0;
        self
    }

    /// A matrix over bytes stored by [`PackedMatrix::data_bytes`] and
    /// [`PackedMatrix::scale_bytes`] (of a matrix packed in `fmt` from `[n, k]` weights under
    /// this [`LAYOUT_VERSION`]): `data` and `scales` are byte ranges of `owner`'s bytes. Nothing
    /// is copied; `owner` stays alive while the matrix does. Fails unless both ranges are in
    /// bounds, 64-byte aligned in memory and exactly as long as the layout says.
    pub fn from_stored(
        owner: Arc<dyn StableBytes>,
        fmt: PackedFormat,
        n: usize,
        k: usize,
        data: std::ops::Range<usize>,
        scales: std::ops::Range<usize>,
    ) -> Result<Self, KernelError> {
        let l = PackedLayout::new(fmt, n, k)?;
        Self::over_bytes(owner, fmt, l, n, k, data, scales)
    }

    /// [`PackedMatrix::from_stored`] in layout `l` (of `fmt`, `[n, k]`), its group unchecked:
    /// the ggml tiles' views.
    pub(crate) fn over_bytes(
        owner: Arc<dyn StableBytes>,
        fmt: PackedFormat,
        l: PackedLayout,
        n: usize,
        k: usize,
        data: std::ops::Range<usize>,
        scales: std::ops::Range<usize>,
    ) -> Result<Self, KernelError> {
        const OP: &str = "stored packed matrix";
        if cfg!(target_endian = "big") {
            return Err(KernelError::Mismatch {
                op: OP,
                what: "stored scales are little-endian and this machine is big-endian".into(),
            });
        }
        let bytes = owner.stable_bytes();
        let region = |what: &str, r: &std::ops::Range<usize>, want: usize| {
            let err = |why: String| KernelError::Mismatch {
                op: OP,
                what: format!("{what} bytes {}..{}: {why}", r.start, r.end),
            };
            if r.start > r.end || r.end > bytes.len() {
                return Err(err(format!("past the end of {} bytes", bytes.len())));
            }
            if r.len() != want {
                return Err(err(format!(
                    "expected {want} bytes for {} [{n}, {k}], got {}",
                    fmt.name(),
                    r.len()
                )));
            }
            let ptr = bytes[r.start..].as_ptr();
            if !(ptr as usize).is_multiple_of(ALIGN) {
                return Err(err(format!("not {ALIGN}-byte aligned")));
            }
            Ok(NonNull::new(ptr.cast_mut()).expect("slice pointers are non-null"))
        };
        let dptr = region("packed", &data, l.data_bytes)?;
        let sptr = region("scale", &scales, l.scales * 4)?;
        let keep: Keep = Arc::new(owner.clone());
        Ok(Self::with_storage(
            fmt,
            n,
            k,
            l,
            PackedBytes {
                ptr: dptr,
                len: l.data_bytes,
                mapped: true,
                _keep: keep.clone(),
            },
            PackedScales {
                ptr: sptr.cast(),
                len: l.scales,
                _keep: keep,
            },
        ))
    }

    /// The packed values as stored (for writing a converted model).
    pub fn data_bytes(&self) -> &[u8] {
        self.data.as_slice()
    }

    /// The scales as little-endian bytes (for writing a converted model).
    pub fn scale_bytes(&self) -> Vec<u8> {
        self.scales.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// Whether the bytes are viewed in mapped memory rather than owned.
    pub fn is_mapped(&self) -> bool {
        self.data.mapped
    }

    /// The packed format.
    pub fn format(&self) -> PackedFormat {
        self.fmt
    }

    /// Output features `n`.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input features `k`.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Bytes a full pass over the weights reads: packed values plus scales.
    pub fn bytes(&self) -> usize {
        self.data.len()
            + if self.kind == Kind::Bf16 {
                0
            } else {
                self.scales.len() * 4
            }
    }

    pub(crate) fn strips(&self) -> usize {
        self.n_pad / STRIP
    }

    /// The weights as they are used, `[n, k]` row-major f32 (quantization error included).
    pub fn dequantize(&self) -> Vec<f32> {
        let mut w = vec![0.0f32; self.n * self.k];
        for j in 0..self.n {
            for p in 0..self.k {
                w[j * self.k + p] = self.weight(j, p);
            }
        }
        w
    }

    /// The dequantized weight `W[j, p]`.
    fn weight(&self, j: usize, p: usize) -> f32 {
        match self.kind {
            Kind::Bf16 => {
                let (s, c) = (j / STRIP, j % STRIP);
                let strip = &self.data.as_slice()[s * self.strip_bytes..];
                let off = (p / 2) * LINE + c * 4 + (p % 2) * 2;
                bf16_bits_to_f32(u16::from_le_bytes([strip[off], strip[off + 1]]))
            }
            Kind::Int8 | Kind::Int4 => self.int_value(j, p) as f32 * self.scale(j, p),
        }
    }

    /// The integer of `W[j, p]` without the storage offset (INT8 and INT4).
    fn int_value(&self, j: usize, p: usize) -> i32 {
        let (s, c) = (j / STRIP, j % STRIP);
        let strip = &self.data.as_slice()[s * self.strip_bytes..(s + 1) * self.strip_bytes];
        let quad = p / 4;
        if self.kind == Kind::Int8 {
            return i32::from(strip[quad * LINE + c * 4 + p % 4]) - self.offset;
        }
        let b = strip[(quad / 2) * LINE + c * 4 + p % 4];
        let q = if quad.is_multiple_of(2) {
            b & 0xf
        } else {
            b >> 4
        };
        i32::from(q) - 8
    }

    /// The scale of `W[j, p]` (INT8 and INT4).
    fn scale(&self, j: usize, p: usize) -> f32 {
        self.scales[((j / STRIP) * self.groups + p / self.group) * STRIP + j % STRIP]
    }

    /// Row `j`'s integers without the storage offset (`k` of them) and its scales, one per
    /// group of `k` (one for the row when the format has no groups): what a device that
    /// lays the values out by rows stores. `None` for BF16.
    pub fn int_row(&self, j: usize) -> Option<(Vec<i8>, Vec<f32>)> {
        if self.kind == Kind::Bf16 || j >= self.n {
            return None;
        }
        let q = (0..self.k).map(|p| self.int_value(j, p) as i8).collect();
        let groups = self.k.div_ceil(self.group);
        let scales = (0..groups).map(|g| self.scale(j, g * self.group)).collect();
        Some((q, scales))
    }

    fn check_args(
        &self,
        op: &'static str,
        x: &[f32],
        m: usize,
        out: &[f32],
    ) -> Result<(), KernelError> {
        check_len(op, "x", m * self.k, x.len())?;
        check_len(op, "out", m * self.n, out.len())
    }

    /// `out[m, n] = x[m, k] · Wᵀ` on the selected instruction-set path ([`Isa::selected`]).
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<(), KernelError> {
        self.matmul_with(Isa::selected(), x, m, out)
    }

    /// [`PackedMatrix::matmul`] on a given path; a path the CPU lacks falls back to a lower one.
    pub fn matmul_with(
        &self,
        isa: Isa,
        x: &[f32],
        m: usize,
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        self.check_args("matmul", x, m, out)?;
        self.matmul_on(Kernel::Isa(isa.min(crate::isa::detected())), x, m, out);
        Ok(())
    }

    /// [`PackedMatrix::matmul_with`] on `kernel` (available), arguments checked.
    pub(crate) fn matmul_on(&self, kernel: Kernel, x: &[f32], m: usize, out: &mut [f32]) {
        let a = Activations::quantize(self, m, kernel, |r| &x[r * self.k..(r + 1) * self.k]);
        let n_blocks = self.strips().div_ceil(micro::N_BLOCK_STRIPS);
        let m_chunks = m.div_ceil(micro::M_CHUNK);
        let out_w = SharedMut::new(out);
        parallel_for(m_chunks * n_blocks, |t| {
            let (mc, nb) = (t / n_blocks, t % n_blocks);
            let rows = mc * micro::M_CHUNK..((mc + 1) * micro::M_CHUNK).min(m);
            let s0 = nb * micro::N_BLOCK_STRIPS;
            let strips = s0..(s0 + micro::N_BLOCK_STRIPS).min(self.strips());
            let ldo = strips.len() * STRIP;
            let mut tile = vec![0.0f32; rows.len() * ldo];
            micro::run_block(kernel, self, &a, rows.clone(), strips, &mut tile, ldo);
            let c0 = s0 * STRIP;
            let cols = ldo.min(self.n - c0);
            for (i, r) in rows.enumerate() {
                // SAFETY: task (mc, nb) writes only rows of chunk mc and columns of block nb,
                // a region no other task touches.
                let dst = unsafe { out_w.part(r * self.n + c0, cols) };
                dst.copy_from_slice(&tile[i * ldo..i * ldo + cols]);
            }
        });
    }

    /// Plain reference for [`PackedMatrix::matmul`]: the same activation rounding, then f32
    /// dot products with the dequantized weights.
    pub fn matmul_ref(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<(), KernelError> {
        self.check_args("matmul_ref", x, m, out)?;
        let a = Activations::quantize(self, m, Kernel::Isa(Isa::Portable), |r| {
            &x[r * self.k..(r + 1) * self.k]
        });
        let w = self.dequantize();
        for i in 0..m {
            let xi: Vec<f32> = (0..self.k).map(|p| a.value(i, p)).collect();
            for j in 0..self.n {
                let wj = &w[j * self.k..(j + 1) * self.k];
                out[i * self.n + j] = xi.iter().zip(wj).map(|(a, b)| a * b).sum();
            }
        }
        Ok(())
    }
}

pub(crate) fn bf16_bits_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// Symmetric quantization step for values with absolute maximum `amax` and `qmax` levels.
fn quant_scale(amax: f32, qmax: f32) -> f32 {
    if amax > 0.0 { amax / qmax } else { 1.0 }
}

/// Packs output strip `s` (columns `16 s .. 16 s + 16`) into `bytes` and `sc`.
#[allow(clippy::too_many_arguments)]
fn pack_strip<T: PackSource>(
    w: &[T],
    n: usize,
    k: usize,
    k_pad: usize,
    kind: Kind,
    group: usize,
    s: usize,
    bytes: &mut [u8],
    sc: &mut [f32],
) {
    let groups = k_pad / group;
    let mut row = vec![0.0f32; k_pad];
    let mut q = vec![0i32; k_pad];
    for c in 0..STRIP {
        let j = s * STRIP + c;
        if j >= n {
            // Padding columns: value zero (the stored offset), scale zero.
            match kind {
                Kind::Bf16 => {}
                Kind::Int8 => (0..k_pad).for_each(|p| bytes[(p / 4) * LINE + c * 4 + p % 4] = 128),
                Kind::Int4 => (0..k_pad / 8).for_each(|l| {
                    for t in 0..4 {
                        bytes[l * LINE + c * 4 + t] = 0x88;
                    }
                }),
            }
            continue;
        }
        for (r, v) in row.iter_mut().zip(&w[j * k..(j + 1) * k]) {
            *r = v.to_f32();
        }
        row[k..].fill(0.0);
        match kind {
            Kind::Bf16 => {
                for (p, v) in row.iter().enumerate() {
                    let off = (p / 2) * LINE + c * 4 + (p % 2) * 2;
                    bytes[off..off + 2]
                        .copy_from_slice(&bf16::from_f32(*v).to_bits().to_le_bytes());
                }
            }
            Kind::Int8 | Kind::Int4 => {
                let qmax = if kind == Kind::Int8 { 127.0 } else { 7.0 };
                for g in 0..groups {
                    let span = g * group..(g + 1) * group;
                    let amax = row[span.clone()].iter().fold(0.0f32, |a, v| a.max(v.abs()));
                    let scale = quant_scale(amax, qmax);
                    sc[g * STRIP + c] = scale;
                    for p in span {
                        q[p] = ((row[p] / scale).round() as i32)
                            .clamp(-(qmax as i32) - 1, qmax as i32);
                    }
                }
                for p in 0..k_pad {
                    let quad = p / 4;
                    if kind == Kind::Int8 {
                        bytes[quad * LINE + c * 4 + p % 4] = (q[p] + 128) as u8;
                    } else {
                        let off = (quad / 2) * LINE + c * 4 + p % 4;
                        let nib = (q[p] + 8) as u8;
                        bytes[off] |= if quad.is_multiple_of(2) {
                            nib
                        } else {
                            nib << 4
                        };
                    }
                }
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
