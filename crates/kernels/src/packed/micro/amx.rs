//! AMX micro-kernel: 32x32 output blocks from two A tiles (token rows) and two B tiles
//! (strips), `tdpbf16ps` for BF16 and `tdpbsud` (signed activations x unsigned weights) for
//! INT8 and INT4.
//!
//! Tile registers: `tmm0..3` accumulators (16 x 16 f32/i32), `tmm4..5` activations (16 rows x
//! one `k` step), `tmm6..7` weights (one `k` step x 16 columns, the packed lines as they are).
//! The accumulators stay in the tiles for a whole `k` run and are stored once per block (BF16,
//! per-row INT8) or per scale group. INT4 panels are first unpacked to the INT8 line layout in
//! a per-thread scratch buffer, once per panel, and then reused by every 32-row block of the
//! task.
//!
//! A key design decision: the tile program is written once, against [`TileUnit`] (configure,
//! zero, load, dot product, store, release), and runs on two units: the hardware
//! ([`super::amx_hw`], stable `asm!`, only where [`crate::isa::detected`] found AMX) and a
//! software model of the tiles (`amx_soft`, test builds, any CPU). The tests run every format
//! through the software unit, so the tiling, packing, strides and edge handling below are
//! checked on machines without AMX; only the instruction encoding and the hardware's own
//! arithmetic are left to an AMX machine. Every operand is a slice that ends where the
//! program means the tile's data to end, so a unit can check each load and store against it.

use std::cell::RefCell;
use std::ops::Range;

use super::{correction, flush_span};
use crate::buf::AlignedBuf;
use crate::packed::{Activations, Kind, LINE, PackedMatrix, STRIP};

/// Tile registers of palette 1.
pub(super) const TILES: usize = 8;
/// Rows of a tile register.
pub(super) const MAX_ROWS: usize = 16;
/// Bytes per tile row.
pub(super) const MAX_COLSB: usize = 64;

/// The 64-byte `ldtilecfg` operand: palette, start row, then bytes per row and rows of each
/// tile (16 slots, of which palette 1 names 8; the others must stay zero).
#[repr(C, align(64))]
pub(super) struct TileCfg {
    pub(super) palette: u8,
    pub(super) start_row: u8,
    pub(super) reserved: [u8; 14],
    pub(super) colsb: [u16; 16],
    pub(super) rows: [u8; 16],
}

impl TileCfg {
    /// The kernel's configuration for a `k` step of `kstep_bytes` bytes per activation row
    /// (64, or 32 for INT groups of 32).
    fn new(kstep_bytes: usize) -> Self {
        let mut c = TileCfg {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        for t in 0..4 {
            c.colsb[t] = 64;
            c.rows[t] = 16;
        }
        for t in 4..6 {
            c.colsb[t] = kstep_bytes as u16;
            c.rows[t] = 16;
        }
        for t in 6..8 {
            c.colsb[t] = 64;
            c.rows[t] = (kstep_bytes / 4) as u8;
        }
        c
    }
}

/// The shape of each tile under a loaded configuration (rows 0: not configured).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Shape {
    pub(super) rows: [u8; TILES],
    pub(super) colsb: [u16; TILES],
}

impl Shape {
    /// No configuration loaded (the init state).
    pub(super) const NONE: Shape = Shape {
        rows: [0; TILES],
        colsb: [0; TILES],
    };

    /// Decodes `cfg`, panicking where `ldtilecfg` would raise #GP (as we read the SDM): a
    /// palette other than 1 (we never load palette 0), a non-zero start row or reserved byte,
    /// more than 16 rows or 64 bytes per row, rows without bytes or bytes without rows, and any
    /// setting for slots 8..15, which palette 1 does not have.
    pub(super) fn of(cfg: &TileCfg) -> Shape {
        assert!(
            cfg.palette == 1,
            "tile program: ldtilecfg with palette {}, expected 1",
            cfg.palette
        );
        assert!(
            cfg.start_row == 0 && cfg.reserved.iter().all(|&b| b == 0),
            "tile program: ldtilecfg with a start row or reserved bytes set"
        );
        let mut s = Shape::NONE;
        for t in 0..16 {
            let (rows, colsb) = (cfg.rows[t], cfg.colsb[t]);
            assert!(
                t < TILES || (rows == 0 && colsb == 0),
                "tile program: ldtilecfg sets slot {t}, palette 1 has {TILES} tiles"
            );
            assert!(
                usize::from(rows) <= MAX_ROWS
                    && usize::from(colsb) <= MAX_COLSB
                    && (rows == 0) == (colsb == 0),
                "tile program: ldtilecfg gives tmm{t} {rows} rows of {colsb} bytes, expected \
                 both zero or at most {MAX_ROWS} rows of at most {MAX_COLSB} bytes"
            );
            if t < TILES {
                s.rows[t] = rows;
                s.colsb[t] = colsb;
            }
        }
        s
    }

    /// Checks a `tileloadd` / `tilestored` (`op`) of tile `t` with row `stride` on an operand
    /// slice of `len` bytes: panics if `t` is not configured or if its rows x bytes per row at
    /// `stride` do not lie within the slice. The panic is out of line, so on the hardware the
    /// check costs a multiply, an add and two compares.
    #[inline(always)]
    pub(super) fn check_span(&self, op: &'static str, t: usize, stride: usize, len: usize) {
        let (rows, colsb) = (usize::from(self.rows[t]), usize::from(self.colsb[t]));
        if rows == 0 || (rows - 1) * stride + colsb > len {
            span_error(op, t, rows, colsb, stride, len);
        }
    }
}

#[cold]
#[inline(never)]
fn span_error(op: &str, t: usize, rows: usize, colsb: usize, stride: usize, len: usize) -> ! {
    if rows == 0 {
        panic!("tile program: {op} tmm{t}, which is not configured");
    }
    panic!(
        "tile program: {op} tmm{t} ({rows} rows of {colsb} bytes, stride {stride}) spans {} \
         bytes, the operand has {len}",
        (rows - 1) * stride + colsb
    );
}

/// The tile operations the kernel uses. The tile numbers are constants, as in the instruction
/// encodings. Loads and stores take the operand as a slice from its first byte: a unit checks
/// that the configured rows and bytes per row, at `stride`, lie within it.
pub(super) trait TileUnit {
    /// `ldtilecfg`: loads a palette-1 configuration.
    fn configure(&mut self, cfg: &TileCfg);
    /// `tilezero tmmT`.
    fn zero<const T: u8>(&mut self);
    /// `tileloadd tmmT, [src + stride]`.
    fn load<const T: u8>(&mut self, src: &[u8], stride: usize);
    /// `tdpbf16ps tmmC, tmmA, tmmB`.
    fn dpbf16ps<const C: u8, const A: u8, const B: u8>(&mut self);
    /// `tdpbsud tmmC, tmmA, tmmB`.
    fn dpbsud<const C: u8, const A: u8, const B: u8>(&mut self);
    /// `tilestored [dst + stride], tmmT`.
    fn store<const T: u8>(&mut self, dst: &mut [u8], stride: usize);
    /// `tilerelease`.
    fn release(&mut self);
}

/// Bytes per row of [`CBlock`]: 32 f32 or i32.
const C_STRIDE: usize = 128;

/// One 32x32 block of f32 or i32 results (as their bits), row stride [`C_STRIDE`].
#[repr(C, align(64))]
struct CBlock([u8; 32 * C_STRIDE]);

impl CBlock {
    /// The 32 elements of row `i`.
    #[inline(always)]
    fn row(&self, i: usize) -> impl Iterator<Item = u32> + '_ {
        self.0[i * C_STRIDE..][..C_STRIDE]
            .chunks_exact(4)
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// Zeroes the accumulators, runs `steps` `k` steps over the A tiles `a` (16 rows each, row
/// stride `lda`, step `astep` bytes) and the B panels `b` (step `bstep` bytes), with
/// `tdpbf16ps` if `BF16` else `tdpbsud`, and stores the 32x32 result to `c`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn tile_loop<U: TileUnit, const BF16: bool>(
    u: &mut U,
    a: [&[u8]; 2],
    lda: usize,
    b: [&[u8]; 2],
    steps: usize,
    astep: usize,
    bstep: usize,
    c: &mut CBlock,
) {
    u.zero::<0>();
    u.zero::<1>();
    u.zero::<2>();
    u.zero::<3>();
    for s in 0..steps {
        u.load::<4>(&a[0][s * astep..], lda);
        u.load::<5>(&a[1][s * astep..], lda);
        u.load::<6>(&b[0][s * bstep..], LINE);
        u.load::<7>(&b[1][s * bstep..], LINE);
        if BF16 {
            u.dpbf16ps::<0, 4, 6>();
            u.dpbf16ps::<1, 4, 7>();
            u.dpbf16ps::<2, 5, 6>();
            u.dpbf16ps::<3, 5, 7>();
        } else {
            u.dpbsud::<0, 4, 6>();
            u.dpbsud::<1, 4, 7>();
            u.dpbsud::<2, 5, 6>();
            u.dpbsud::<3, 5, 7>();
        }
    }
    let c = &mut c.0;
    u.store::<0>(c, C_STRIDE);
    u.store::<1>(&mut c[64..], C_STRIDE);
    u.store::<2>(&mut c[16 * C_STRIDE..], C_STRIDE);
    u.store::<3>(&mut c[16 * C_STRIDE + 64..], C_STRIDE);
}

/// Adds a span's integer sums to `out`: row `i < nrows`, column `j` of the 32x32 block gains
/// `(c[i][j] - corr[i]) · sc[j] · xs[i]` (row `i` of `out` at `i · ldo`).
#[inline(always)]
fn flush_rows(
    c: &CBlock,
    nrows: usize,
    corr: &[i32; 32],
    xs: &[f32; 32],
    sc: &[f32; 32],
    out: &mut [f32],
    ldo: usize,
) {
    for i in 0..nrows {
        let o = &mut out[i * ldo..][..32];
        for ((o, v), s) in o.iter_mut().zip(c.row(i)).zip(sc) {
            *o += (v as i32).wrapping_sub(corr[i]) as f32 * s * xs[i];
        }
    }
}

/// [`flush_rows`] compiled with AVX-512, 16 results an instruction.
///
/// # Safety
/// The CPU has AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn flush_rows_avx512(
    c: &CBlock,
    nrows: usize,
    corr: &[i32; 32],
    xs: &[f32; 32],
    sc: &[f32; 32],
    out: &mut [f32],
    ldo: usize,
) {
    flush_rows(c, nrows, corr, xs, sc, out, ldo);
}

/// [`flush_rows`], vectorised where the CPU has AVX-512 (the same results: each is computed
/// alone). In baseline x86-64 code the flush, one per scale group, took several times the
/// group's `tdpbsud`.
fn flush(
    c: &CBlock,
    nrows: usize,
    corr: &[i32; 32],
    xs: &[f32; 32],
    sc: &[f32; 32],
    out: &mut [f32],
    ldo: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if crate::isa::Isa::selected() >= crate::isa::Isa::Avx512 {
        // SAFETY: AVX-512 F was detected (`selected` is at most what the CPU has).
        return unsafe { flush_rows_avx512(c, nrows, corr, xs, sc, out, ldo) };
    }
    flush_rows(c, nrows, corr, xs, sc, out, ldo);
}

/// Adds a BF16 block's f32 sums to `out` (rows `i < nrows` at `i · ldo`, 32 columns).
#[inline(always)]
fn add_rows(c: &CBlock, nrows: usize, out: &mut [f32], ldo: usize) {
    for i in 0..nrows {
        let o = &mut out[i * ldo..][..32];
        for (o, v) in o.iter_mut().zip(c.row(i)) {
            *o += f32::from_bits(v);
        }
    }
}

/// [`add_rows`] compiled with AVX-512.
///
/// # Safety
/// The CPU has AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn add_rows_avx512(c: &CBlock, nrows: usize, out: &mut [f32], ldo: usize) {
    add_rows(c, nrows, out, ldo);
}

/// [`add_rows`], vectorised where the CPU has AVX-512: once per `k` block it is a tenth to
/// a third of the block's `tdpbf16ps` (`k` of 2,048 to 768) in baseline x86-64 code.
fn add(c: &CBlock, nrows: usize, out: &mut [f32], ldo: usize) {
    #[cfg(target_arch = "x86_64")]
    if crate::isa::Isa::selected() >= crate::isa::Isa::Avx512 {
        // SAFETY: AVX-512 F was detected (`selected` is at most what the CPU has).
        return unsafe { add_rows_avx512(c, nrows, out, ldo) };
    }
    add_rows(c, nrows, out, ldo);
}

thread_local! {
    /// INT4 panels unpacked to INT8 lines, reused across calls on this thread.
    static SCRATCH: RefCell<AlignedBuf> = RefCell::new(AlignedBuf::zeroed(0));
}

/// Runs one `k` block on tile unit `u`; see [`super::run_block`] for the contract, plus:
/// `rows.start` a multiple of 32 and the activations padded to whole 32-row blocks.
#[allow(clippy::too_many_arguments)]
pub(super) fn block<U: TileUnit>(
    u: &mut U,
    w: &PackedMatrix,
    a: &Activations,
    rows: Range<usize>,
    strips: Range<usize>,
    ks: Range<usize>,
    out: &mut [f32],
    ldo: usize,
) {
    assert!(
        rows.start.is_multiple_of(32) && a.m_pad.is_multiple_of(32),
        "AMX blocks read whole 32-row blocks: rows {rows:?}, activations padded to {} rows",
        a.m_pad
    );
    let kstep_bytes = match w.kind {
        Kind::Bf16 => 64,
        _ => w.group.min(64),
    };
    u.configure(&TileCfg::new(kstep_bytes));
    let mut c = CBlock([0; 32 * C_STRIDE]);
    let elem = w.kind.activation_bytes();
    let (act, lda) = (a.data.as_slice(), a.lda);
    let data = w.data.as_slice();
    // The lines of strips `sp` and `sp + 1` over `ks`, as the B tiles read them.
    let k_per_line = if w.kind == Kind::Bf16 { 2 } else { 4 };
    let lines = ks.start / k_per_line * LINE..ks.end / k_per_line * LINE;
    let stored = |sp: usize| -> [&[u8]; 2] {
        [
            &data[sp * w.strip_bytes..][lines.clone()],
            &data[(sp + 1) * w.strip_bytes..][lines.clone()],
        ]
    };
    // One 32x32 output block: rows `r0 ..`, strips `sp`, `sp + 1`.
    let mut run = |u: &mut U, sp: usize, r0: usize, b: [&[u8]; 2]| {
        // The two A tiles: 16 rows each from `k = ks.start` to the end of their rows.
        let k0 = ks.start * elem;
        let at = [
            &act[r0 * lda + k0..(r0 + 16) * lda],
            &act[(r0 + 16) * lda + k0..(r0 + 32) * lda],
        ];
        let nrows = (rows.end - r0).min(32);
        let o = &mut out[(r0 - rows.start) * ldo + (sp - strips.start) * STRIP..];
        if w.kind == Kind::Bf16 {
            tile_loop::<U, true>(u, at, lda, b, ks.len() / 32, 64, 1024, &mut c);
            add(&c, nrows, o, ldo);
            return;
        }
        let fs = flush_span(w, &ks);
        for f0 in ks.clone().step_by(fs) {
            let rel = f0 - ks.start;
            let span = rel / 4 * LINE..(rel + fs) / 4 * LINE;
            tile_loop::<U, false>(
                u,
                [&at[0][rel..], &at[1][rel..]],
                lda,
                [&b[0][span.clone()], &b[1][span]],
                fs / kstep_bytes,
                kstep_bytes,
                kstep_bytes / 4 * LINE,
                &mut c,
            );
            let g = f0 / w.group;
            let mut sc = [0.0f32; 2 * STRIP];
            for (h, sc) in sc.chunks_exact_mut(STRIP).enumerate() {
                sc.copy_from_slice(&w.scales[((sp + h) * w.groups + g) * STRIP..][..STRIP]);
            }
            // The activations' scales of the span, their place found once per span: two
            // divisions a row were as costly as the span's products.
            let (stride, col) = a.scale_column(f0);
            let (mut corr, mut xs) = ([0i32; 32], [0.0f32; 32]);
            for i in 0..nrows {
                corr[i] = correction(w, a, r0 + i, f0, fs);
                xs[i] = a.scale[(r0 + i) * stride + col];
            }
            flush(&c, nrows, &corr, &xs, &sc, o, ldo);
        }
    };
    if w.kind == Kind::Int4 {
        // Each strip pair unpacked once, then reused by every row block.
        SCRATCH.with_borrow_mut(|scratch| {
            for sp in strips.clone().step_by(2) {
                let len = ks.len() / 4 * LINE;
                unpack_int4(w, sp, &ks, scratch);
                let (b0, rest) = scratch.as_slice().split_at(len);
                for r0 in rows.clone().step_by(32) {
                    run(u, sp, r0, [b0, &rest[..len]]);
                }
            }
        });
    } else {
        // Row blocks outside: a block's activations (32 rows over `ks`) are reread from L2 by
        // each strip pair while the panel streams past; with the strips outside, every pair
        // reread all the task's rows, which outgrow L2 at a few hundred tokens (measured on
        // the AMX Xeon, 512 tokens: 0.65-0.67 -> 0.83-0.89 TFLOPS best of twelve rounds).
        for r0 in rows.clone().step_by(32) {
            for sp in strips.clone().step_by(2) {
                run(u, sp, r0, stored(sp));
            }
        }
    }
    u.release();
}

/// Unpacks the INT4 lines of strips `sp`, `sp + 1` over `ks` into INT8 lines in `scratch`:
/// strip `sp + h` at `h * ks.len() / 4` lines.
fn unpack_int4(w: &PackedMatrix, sp: usize, ks: &Range<usize>, scratch: &mut AlignedBuf) {
    let lines = ks.len() / 4;
    if scratch.len() < 2 * lines * LINE {
        *scratch = AlignedBuf::zeroed(2 * lines * LINE);
    }
    let dst = scratch.as_mut_slice();
    let data = w.data.as_slice();
    for h in 0..2 {
        let src = &data[(sp + h) * w.strip_bytes + ks.start / 8 * LINE..][..lines / 2 * LINE];
        let d = &mut dst[h * lines * LINE..][..lines * LINE];
        for (l, s) in src.chunks_exact(LINE).enumerate() {
            let (lo, hi) = d[2 * l * LINE..(2 * l + 2) * LINE].split_at_mut(LINE);
            for ((lo, hi), s) in lo.iter_mut().zip(hi.iter_mut()).zip(s) {
                *lo = s & 0xf;
                *hi = s >> 4;
            }
        }
    }
}
