//! [`GgmlMatrix`]: a weight matrix `[n, k]` in one of ggml's block formats, computed where it
//! lies (usually a memory-mapped GGUF file), and `y = x · Wᵀ` on it.
//!
//! Three paths, chosen per call by the type, the instruction set and the token count:
//! - **integer** (Q4_0 ... Q8_0, Q2_K ... Q6_K, IQ4_NL, IQ4_XS): on AVX2, each task runs the
//!   type's in-register kernel (`super::vecdot`) over a block of weight rows and a chunk of
//!   tokens, four tokens at a time, reading each weight byte once per four tokens. The
//!   portable path decodes the block of rows into int8 values with per-16 scales in a
//!   per-thread scratch (`super::unpack`), then takes the same integer dot products
//!   (`super::dot`).
//! - **generic** (F32, F16, BF16 and any other type the reference dequantizer reads, such as
//!   the grid-based i-quants): rows are dequantized to f32 in scratch and multiplied in f32.
//!   [`GgmlMatrix::has_fast_kernel`] tells them apart (`strata info` names the slow ones).
//! - **tiles** (any type, many tokens, AVX-512 or AMX): 64-row tiles decoded to packed INT8
//!   (integer types) or BF16 and multiplied by the packed micro-kernels (`super::tiles`).
//!
//! Nothing is copied or repacked at load: a matrix is a byte range of its owner, so a mapped
//! file's pages stay shared and evictable, and experts that are never routed are never read.

use std::ops::Range;
use std::sync::Arc;

use crate::buf::SharedMut;
use crate::error::check_len;
use crate::packed::micro::Kernel;
use crate::packed::{Activations, StableBytes};
use crate::{Isa, KernelError, parallel_for, vector};

use super::dot::{Q8Layout, Q8Rows, WRow, dot_rows};
use super::scratch::with_scratch;
use super::tiles::{self, TileFormat};
use super::unpack::{UNIT, decoder, unpack_rows};
use super::vecdot;
use super::{GgmlType, dequantize_row};

/// Weight rows per task on the in-register kernels: long sequential runs of one matrix per
/// thread, which the hardware prefetcher follows (decode at 128 rows was 1.18x faster than
/// at 16 on Zen 1, `docs/benchmarks.md`).
const ROW_BLOCK_IN_REGISTER: usize = 128;
/// Weight rows decoded per task into scratch (the portable and generic paths), small enough
/// for the decoded rows to stay in L1/L2.
const ROW_BLOCK_DECODED: usize = 16;
/// Tasks per thread a call aims for at least, when its rows allow: with fewer, the last
/// tasks leave threads waiting (a decode's 576-row matrix in blocks of 128 made five tasks
/// for two threads, one of them idle a fifth of the call).
const MIN_TASKS_PER_THREAD: usize = 4;

/// Weight rows per task: at most `most`, fewer when that gives each thread
/// [`MIN_TASKS_PER_THREAD`] tasks over `chunks` token chunks, in multiples of 8.
fn balanced_rows(n: usize, most: usize, chunks: usize) -> usize {
    let want = MIN_TASKS_PER_THREAD * crate::num_threads();
    let row_blocks = want.div_ceil(chunks.max(1));
    n.div_ceil(row_blocks)
        .next_multiple_of(8)
        .clamp(8.min(most), most)
}

/// Tokens per task: a task's activations (`TOKEN_CHUNK · k` bytes) stay in L2 while its
/// decoded rows (`ROW_BLOCK_DECODED · k` bytes plus scales) stay in L1/L2.
const TOKEN_CHUNK: usize = 64;

/// Bytes owned by a matrix built from a vector (tests, weights derived at load).
struct OwnedBytes(Vec<u8>);

// SAFETY: the vector is never modified or reallocated after construction.
unsafe impl StableBytes for OwnedBytes {
    fn stable_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// A `[n, k]` matrix of ggml blocks (row-major, each row `k / block_size` whole blocks).
#[derive(Clone)]
pub struct GgmlMatrix {
    ty: GgmlType,
    n: usize,
    k: usize,
    owner: Arc<dyn StableBytes>,
    range: Range<usize>,
    /// `Some(has_mins)` for types with an integer form.
    decoder: Option<bool>,
}

impl std::fmt::Debug for GgmlMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgmlMatrix")
            .field("ty", &self.ty)
            .field("n", &self.n)
            .field("k", &self.k)
            .field("bytes", &self.range.len())
            .finish()
    }
}

impl GgmlMatrix {
    /// The matrix stored in `owner`'s bytes `range` (exactly `n` rows of `k` values of `ty`).
    /// Fails, naming what is wrong, unless the type can be computed, `k` is a whole number
    /// of blocks and the range holds exactly the matrix.
    pub fn from_stored(
        owner: Arc<dyn StableBytes>,
        ty: GgmlType,
        n: usize,
        k: usize,
        range: Range<usize>,
    ) -> Result<Self, KernelError> {
        const OP: &str = "ggml matrix";
        let bad = |what: String| KernelError::Mismatch { op: OP, what };
        if !ty.can_dequantize() {
            return Err(bad(format!("tensor type {ty} has no kernel")));
        }
        let row_bytes = ty
            .row_bytes(k as u64)
            .ok_or_else(|| bad(format!("rows of {k} values are not whole {ty} blocks")))?;
        let want = (row_bytes as usize)
            .checked_mul(n)
            .ok_or_else(|| bad(format!("[{n}, {k}] {ty} overflows")))?;
        let have = owner.stable_bytes().len();
        if range.start > range.end || range.end > have {
            return Err(bad(format!(
                "bytes {}..{} past the end of {have}",
                range.start, range.end
            )));
        }
        if range.len() != want {
            return Err(bad(format!(
                "[{n}, {k}] {ty} needs {want} bytes, got {}",
                range.len()
            )));
        }
        Ok(Self {
            ty,
            n,
            k,
            owner,
            range,
            decoder: decoder(ty),
        })
    }

    /// A matrix owning `bytes`.
    pub fn from_vec(ty: GgmlType, n: usize, k: usize, bytes: Vec<u8>) -> Result<Self, KernelError> {
        let len = bytes.len();
        Self::from_stored(Arc::new(OwnedBytes(bytes)), ty, n, k, 0..len)
    }

    /// Rows `rows` of this matrix as a matrix of their own (one expert of a stacked tensor),
    /// sharing the bytes.
    pub fn rows(&self, rows: Range<usize>) -> Result<Self, KernelError> {
        if rows.start > rows.end || rows.end > self.n {
            return Err(KernelError::Mismatch {
                op: "ggml matrix rows",
                what: format!("rows {}..{} of {}", rows.start, rows.end, self.n),
            });
        }
        let rb = self.row_bytes();
        let start = self.range.start + rows.start * rb;
        Ok(Self {
            n: rows.len(),
            range: start..start + rows.len() * rb,
            owner: self.owner.clone(),
            ..*self
        })
    }

    /// The same matrix stored in `owner`'s bytes from `start` (an expert read from its file
    /// into a cache slot): fails as [`GgmlMatrix::from_stored`] does when they do not hold it.
    pub fn in_owner(&self, owner: Arc<dyn StableBytes>, start: usize) -> Result<Self, KernelError> {
        Self::from_stored(
            owner,
            self.ty,
            self.n,
            self.k,
            start..start + self.range.len(),
        )
    }

    /// Where the bytes lie in their owner: for a matrix of a mapped file, its bytes' offsets
    /// in the file.
    pub fn stored_range(&self) -> Range<usize> {
        self.range.clone()
    }

    /// Bytes of the owner (a mapped file's length).
    pub fn owner_len(&self) -> usize {
        self.owner.stable_bytes().len()
    }

    /// Block type.
    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// Rows (output features).
    pub fn n(&self) -> usize {
        self.n
    }

    /// Columns (input features).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Whether the int8 kernels compute this type (otherwise it is dequantized to f32 per
    /// row block, several times slower).
    pub fn has_fast_kernel(&self) -> bool {
        self.decoder.is_some()
    }

    /// The stored bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.owner.stable_bytes()[self.range.clone()]
    }

    fn row_bytes(&self) -> usize {
        self.k / self.ty.block_size() * self.ty.block_bytes()
    }

    /// Row `i` dequantized into `out` (`k` values): an embedding lookup.
    pub fn dequantize_row(&self, i: usize, out: &mut [f32]) -> Result<(), KernelError> {
        check_len("ggml row", "out", self.k, out.len())?;
        if i >= self.n {
            return Err(KernelError::Mismatch {
                op: "ggml row",
                what: format!("row {i} of {}", self.n),
            });
        }
        let rb = self.row_bytes();
        dequantize_row(self.ty, &self.bytes()[i * rb..(i + 1) * rb], out).map_err(|e| {
            KernelError::Mismatch {
                op: "ggml row",
                what: e.to_string(),
            }
        })
    }

    /// All values as f32 (tests and weights the model derives at load).
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; self.n * self.k];
        if self.k > 0 {
            for (i, row) in out.chunks_exact_mut(self.k).enumerate() {
                self.dequantize_row(i, row)
                    .expect("validated at construction");
            }
        }
        out
    }

    /// `out[m, n] = x[m, k] · Wᵀ` on the selected instruction-set path.
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<(), KernelError> {
        self.matmul_with(Isa::selected(), x, m, out)
    }

    /// [`GgmlMatrix::matmul`] on `isa` (capped to what the CPU has).
    pub fn matmul_with(
        &self,
        isa: Isa,
        x: &[f32],
        m: usize,
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        check_len("ggml matmul", "x", m * self.k, x.len())?;
        check_len("ggml matmul", "out", m * self.n, out.len())?;
        let isa = isa.min(crate::isa::detected());
        self.matmul_as(isa, self.form(isa, m), x, m, out);
        Ok(())
    }

    /// [`GgmlMatrix::matmul_with`] in `form` (arguments checked, `isa` available).
    pub(crate) fn matmul_as(&self, isa: Isa, form: Form, x: &[f32], m: usize, out: &mut [f32]) {
        let input = self.input(form, m, |r| &x[r * self.k..(r + 1) * self.k]);
        let out_w = SharedMut::new(out);
        let chunk = form.token_chunk();
        let chunks = m.div_ceil(chunk);
        let row_block = match form {
            Form::Tiles(..) => self.row_block(isa, form),
            _ => balanced_rows(self.n, self.row_block(isa, form), chunks),
        };
        let n_blocks = self.n.div_ceil(row_block);
        parallel_for(n_blocks * chunks, |task| {
            let (c, b) = (task / n_blocks, task % n_blocks);
            let rows = b * row_block..((b + 1) * row_block).min(self.n);
            let tokens = c * chunk..((c + 1) * chunk).min(m);
            self.block(isa, &input, rows.clone(), tokens.clone(), |t, vals| {
                // SAFETY: task (c, b) alone writes rows `rows` of the tokens of chunk `c`.
                let dst = unsafe { out_w.part(t * self.n + rows.start, rows.len()) };
                dst.copy_from_slice(vals);
            });
        });
    }

    /// How a call with `m` tokens on `isa` (available) computes.
    pub(crate) fn form(&self, isa: Isa, m: usize) -> Form {
        match tiles::tile_for(isa, m, self.ty) {
            Some((kernel, fmt)) => Form::Tiles(kernel, fmt),
            None => self.block_form(isa),
        }
    }

    /// How a call computes along `path` on `isa` (available, and one of
    /// [`GgmlPath::available`] there).
    pub(crate) fn form_on(&self, isa: Isa, path: GgmlPath) -> Form {
        match path {
            GgmlPath::RowDot => self.block_form(isa),
            // The VNNI tiles, as the default path runs them below AMX's BF16 tiles.
            GgmlPath::Int8Tiles => Form::Tiles(Kernel::Isa(isa.min(Isa::Avx512)), TileFormat::Int8),
            GgmlPath::Bf16Tiles => Form::Tiles(Kernel::Isa(isa), TileFormat::Bf16),
        }
    }

    /// The block kernels' form on `isa`: int8 activations for the types with an integer form
    /// (in the order the in-register kernel reads them), f32 for the others.
    fn block_form(&self, isa: Isa) -> Form {
        match self.decoder {
            Some(_) => Form::Q8(
                vecdot::activation_block(self.ty),
                vecdot::kernel(isa, self.ty).map_or(Q8Layout::Natural, |k| k.layout),
            ),
            None => Form::F32,
        }
    }

    /// Weight rows one task takes on `isa` in `form`.
    pub(crate) fn row_block(&self, isa: Isa, form: Form) -> usize {
        match form {
            Form::Tiles(..) => tiles::TILE_ROWS,
            _ if vecdot::kernel(isa, self.ty).is_some() => ROW_BLOCK_IN_REGISTER,
            _ => ROW_BLOCK_DECODED,
        }
    }

    /// Activations converted for `form` (one of this matrix's forms).
    pub(crate) fn input<'x>(
        &self,
        form: Form,
        m: usize,
        row: impl Fn(usize) -> &'x [f32] + Sync,
    ) -> Input {
        match form {
            Form::Q8(block, layout) => Input::Q8(Q8Rows::quantize(self.k, block, layout, m, row)),
            Form::F32 => Input::F32((0..m).flat_map(|r| row(r).iter().copied()).collect()),
            Form::Tiles(kernel, fmt) => Input::Tiles(
                tiles::activations(self.ty, self.k, m, kernel, fmt, row),
                kernel,
                fmt,
            ),
        }
    }

    /// Rows `rows` of `W` times the activation rows `tokens` of `input`; `emit(t, values)`
    /// receives each token's results for those rows.
    pub(crate) fn block(
        &self,
        isa: Isa,
        input: &Input,
        rows: Range<usize>,
        tokens: Range<usize>,
        mut emit: impl FnMut(usize, &[f32]),
    ) {
        let (k, nr, nt) = (self.k, rows.len(), tokens.len());
        let rb = self.row_bytes();
        let src = &self.bytes()[rows.start * rb..rows.end * rb];
        if let Input::Tiles(a, kernel, fmt) = input {
            let w = tiles::Rows {
                ty: self.ty,
                n: nr,
                k,
                bytes: src,
            };
            return tiles::block(w, *kernel, *fmt, a, tokens, emit);
        }
        with_scratch(|s| {
            s.tile.clear();
            s.tile.resize(nt * nr, 0.0);
            match (input, self.decoder) {
                (Input::Q8(a), Some(_)) if let Some(k) = vecdot::kernel(isa, self.ty) => {
                    (k.dot)(src, nr, a, tokens.clone(), &mut s.tile);
                }
                (Input::Q8(a), Some(mins)) => {
                    s.q.resize(nr * k, 0);
                    s.d.resize(nr * k / UNIT, 0.0);
                    s.m.resize(nr * k / UNIT, 0.0);
                    unpack_rows(isa, self.ty, src, &mut s.q, &mut s.d, &mut s.m);
                    s.col.clear();
                    s.col.resize(nt, 0.0);
                    for r in 0..nr {
                        let w = WRow {
                            q: &s.q[r * k..(r + 1) * k],
                            d: &s.d[r * k / UNIT..(r + 1) * k / UNIT],
                            m: if mins {
                                &s.m[r * k / UNIT..(r + 1) * k / UNIT]
                            } else {
                                &[]
                            },
                        };
                        dot_rows(isa, &w, a, tokens.start, &mut s.col);
                        for (j, v) in s.col.iter().enumerate() {
                            s.tile[j * nr + r] = *v;
                        }
                    }
                }
                (Input::F32(x), _) => {
                    s.f.resize(nr * k, 0.0);
                    dequantize_row(self.ty, src, &mut s.f).expect("validated at construction");
                    for (j, t) in tokens.clone().enumerate() {
                        let xr = &x[t * k..(t + 1) * k];
                        for r in 0..nr {
                            s.tile[j * nr + r] =
                                vector::dot_with(isa, &s.f[r * k..(r + 1) * k], xr);
                        }
                    }
                }
                (Input::Q8(_), None) | (Input::Tiles(..), _) => {
                    unreachable!("inputs are made by `input` for this type")
                }
            }
            for (j, t) in tokens.enumerate() {
                emit(t, &s.tile[j * nr..(j + 1) * nr]);
            }
        });
    }

    /// Plain reference for [`GgmlMatrix::matmul`]: the same activation rounding, then f32
    /// dot products with the reference dequantizer's weights, in order.
    pub fn matmul_ref(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<(), KernelError> {
        check_len("ggml matmul_ref", "x", m * self.k, x.len())?;
        check_len("ggml matmul_ref", "out", m * self.n, out.len())?;
        let form = self.form(Isa::Portable, m);
        let input = self.input(form, m, |r| &x[r * self.k..(r + 1) * self.k]);
        let w = self.dequantize();
        for t in 0..m {
            let xt: Vec<f32> = match &input {
                Input::Q8(a) => (0..self.k).map(|p| a.value(t, p)).collect(),
                Input::F32(v) => v[t * self.k..(t + 1) * self.k].to_vec(),
                Input::Tiles(..) => unreachable!("the portable path has no tiles"),
            };
            for j in 0..self.n {
                let wj = &w[j * self.k..(j + 1) * self.k];
                out[t * self.n + j] = xt.iter().zip(wj).map(|(a, b)| a * b).sum();
            }
        }
        Ok(())
    }
}

/// A way for GGUF matrices to compute, fixed by a benchmark
/// ([`crate::ggml::fused_moe_ggml_along`]); by default each call picks one by its type, token
/// count and CPU ([`GgmlPath::default_for`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlPath {
    /// The block kernels on the weights as stored: integer row-dot kernels, or rows
    /// dequantized to f32 for types without an integer form.
    RowDot,
    /// 64-row tiles decoded to INT8 for the VNNI micro-kernels (AVX-512 or AVX-VNNI).
    Int8Tiles,
    /// 64-row tiles decoded to BF16 for the AVX-512 or AMX micro-kernels.
    Bf16Tiles,
}

impl GgmlPath {
    /// The paths `isa` runs.
    pub fn available(isa: Isa) -> Vec<GgmlPath> {
        let mut paths = vec![GgmlPath::RowDot];
        if isa >= Isa::AvxVnni {
            paths.push(GgmlPath::Int8Tiles);
        }
        if isa >= Isa::Avx512 {
            paths.push(GgmlPath::Bf16Tiles);
        }
        paths
    }

    /// The path's name in benchmark tables.
    pub fn name(self) -> &'static str {
        match self {
            GgmlPath::RowDot => "row-dot",
            GgmlPath::Int8Tiles => "int8-tiles",
            GgmlPath::Bf16Tiles => "bf16-tiles",
        }
    }

    /// The path a call of `ty` with `tokens` tokens takes by default on `isa`.
    pub fn default_for(isa: Isa, ty: GgmlType, tokens: usize) -> GgmlPath {
        match tiles::tile_for(isa, tokens, ty) {
            Some((_, TileFormat::Int8)) => GgmlPath::Int8Tiles,
            Some((_, TileFormat::Bf16)) => GgmlPath::Bf16Tiles,
            None => GgmlPath::RowDot,
        }
    }
}

/// How a [`GgmlMatrix`] call computes: its activations' form decides the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    /// Int8 activations per this many values in this order, integer dot products on the
    /// blocks.
    Q8(usize, Q8Layout),
    /// F32 activations, rows dequantized to f32 (types without an integer form).
    F32,
    /// Weight tiles decoded to packed BF16 or INT8 for the packed micro-kernels, activations
    /// converted to match.
    Tiles(Kernel, TileFormat),
}

impl Form {
    /// Tokens per task: all of a long prompt's tokens share each decoded tile.
    pub(crate) fn token_chunk(self) -> usize {
        match self {
            Form::Tiles(..) => tiles::TILE_TOKENS,
            Form::Q8(..) | Form::F32 => TOKEN_CHUNK,
        }
    }
}

/// Activations converted for a [`GgmlMatrix`] in one [`Form`].
pub(crate) enum Input {
    Q8(Q8Rows),
    F32(Vec<f32>),
    Tiles(Activations, Kernel, TileFormat),
}
