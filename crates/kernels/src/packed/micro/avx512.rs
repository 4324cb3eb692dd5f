//! AVX-512 micro-kernels: `vdpbf16ps` for BF16, `vpdpbusd` (VNNI) for INT8 and INT4.
//!
//! Each packed 64-byte line is one zmm: 16 columns times a bf16 pair or a u8 quad. The
//! matching activation pair or quad of a token is broadcast to all lanes, so one instruction
//! advances 16 columns by 2 (BF16) or 4 (INT8) `k`. A register tile of up to 4 tokens x 4 strips
//! (16 accumulators) reuses each weight load 4 times and each broadcast 4 times. INT4 lines are
//! split into their two nibble lines in registers (`and`, `srli`) before the dot products.
//!
//! This path is the decode path (few tokens per expert): there the loads of weight lines from
//! DRAM bound the speed, and the register tile only needs to keep up with memory.
//!
//! The INT8 and INT4 tiles are written against the VNNI instruction trait
//! ([`crate::vnni_unit::Vnni`]): the CPU's AVX-512 unit here, its AVX-VNNI unit on CPUs
//! without AVX-512 ([`block_avx_vnni`]: 2 tokens x 2 strips, the tile whose accumulators fit
//! the 16 ymm registers as two halves each), the software unit in tests ([`block_soft`]), so
//! that they run on every machine. The BF16 tile is AVX-512 only, on `vdpbf16ps` where the
//! CPU runs it faster than f32 FMA ([`crate::isa::bf16_dot_on_dpbf16`]), else on FMA.

use std::arch::x86_64::*;
use std::ops::Range;

use super::flush_span;
use crate::packed::{Activations, Kind, LINE, PackedMatrix, STRIP};
use crate::vnni_unit::{Avx512Vnni, AvxVnni, Vnni};

mod spans;
use spans::{SpanPlan, SpanScales, Sums, flush, start_span};

/// Safe entry point; see [`super::run_block`] for the contract.
pub(super) fn block(
    w: &PackedMatrix,
    a: &Activations,
    rows: Range<usize>,
    strips: Range<usize>,
    ks: Range<usize>,
    out: &mut [f32],
    ldo: usize,
) {
    let unit = Avx512Vnni::detect().expect("AVX-512 VNNI");
    let dpbf16 = crate::isa::bf16_dot_on_dpbf16();
    // SAFETY: the unit exists, so the features this function enables were detected, and
    // `dpbf16` only where the CPU has AVX-512 BF16; `run_block` checked that rows, strips and
    // `ks` lie within the activations and the packed matrix and that `out` holds
    // `rows.len()` rows of `ldo >= strips.len() * 16` floats.
    unsafe { block_impl(unit, dpbf16, w, a, rows, strips, ks, out, ldo) }
}

/// [`block`] with BF16 weights on `vdpbf16ps` if `dpbf16` (the CPU must have AVX-512 BF16),
/// else on f32 FMA, whichever the CPU's own path takes, so that the tests check both where
/// they can run.
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
pub(super) fn block_bf16_on(
    dpbf16: bool,
    w: &PackedMatrix,
    a: &Activations,
    rows: Range<usize>,
    strips: Range<usize>,
    ks: Range<usize>,
    out: &mut [f32],
    ldo: usize,
) {
    let unit = Avx512Vnni::detect().expect("AVX-512 VNNI");
    assert!(!dpbf16 || crate::isa::has_avx512_bf16(), "no AVX-512 BF16");
    // SAFETY: as in `block`; AVX-512 BF16 is available if `dpbf16` (asserted).
    unsafe { block_impl(unit, dpbf16, w, a, rows, strips, ks, out, ldo) }
}

/// [`block`] for INT8 and INT4 weights on AVX-VNNI (AVX2 CPUs with the VEX `vpdpbusd`).
pub(super) fn block_avx_vnni(
    w: &PackedMatrix,
    a: &Activations,
    rows: Range<usize>,
    strips: Range<usize>,
    ks: Range<usize>,
    out: &mut [f32],
    ldo: usize,
) {
    assert!(w.kind != Kind::Bf16, "AVX-VNNI has no BF16 dot product");
    let unit = AvxVnni::detect().expect("AVX-VNNI");
    // SAFETY: the unit exists, so the features `block_avx_vnni_impl` enables were detected;
    // the ranges as in `block`.
    unsafe { block_avx_vnni_impl(unit, w, a, rows, strips, ks, out, ldo) }
}

/// [`block`] for INT8 and INT4 weights on the software VNNI unit, which every machine runs.
#[cfg(test)]
pub(super) fn block_soft(
    w: &PackedMatrix,
    a: &Activations,
    rows: Range<usize>,
    strips: Range<usize>,
    ks: Range<usize>,
    out: &mut [f32],
    ldo: usize,
) {
    assert!(
        w.kind != Kind::Bf16,
        "the software unit has no BF16 dot product"
    );
    let unit = crate::vnni_unit::Soft;
    // SAFETY: the software unit needs nothing of the CPU; the ranges as in `block`.
    unsafe { block_soft_impl(unit, w, a, rows, strips, ks, out, ldo) }
}

/// Pointers and strides of one register tile.
struct Tile {
    /// Activation bytes of the first row at `k = ks.start`.
    a: *const u8,
    lda: usize,
    /// Packed line of the first strip at `k = ks.start`.
    w: *const u8,
    sb: usize,
    /// Number of `k` in the block.
    klen: usize,
    out: *mut f32,
    ldo: usize,
    /// Lines of the next `k` block (same strips) this tile helps prefetch: line `klines + p`
    /// of each strip at steps `p = pf_phase + j * pf_every` below `pf_lines`.
    pf_lines: usize,
    pf_every: usize,
    pf_phase: usize,
}

impl Tile {
    /// Prefetches line `klines + p` of each of the `NS` strips if step `p` is this tile's
    /// next one, `*next` (start it at `pf_phase`; steps must be visited in increasing order).
    /// A running step instead of `p % pf_every`: an integer division per step cost more than
    /// the prefetch saved.
    #[inline(always)]
    fn prefetch<U: Vnni, const NS: usize>(&self, u: U, klines: usize, p: usize, next: &mut usize) {
        if p != *next {
            return;
        }
        *next += self.pf_every;
        if p < self.pf_lines {
            for s in 0..NS {
                // A prefetch does not fault: any address will do.
                u.prefetch(self.w.wrapping_add(s * self.sb + (klines + p) * LINE));
            }
        }
    }

    /// Prefetches every line of this tile's share below step `end` not yet fetched (as
    /// [`Self::prefetch`] for each step up to `end`, checked once).
    #[inline(always)]
    fn prefetch_below<U: Vnni, const NS: usize>(
        &self,
        u: U,
        klines: usize,
        end: usize,
        next: &mut usize,
    ) {
        while *next < end {
            let p = *next;
            self.prefetch::<U, NS>(u, klines, p, next);
        }
    }
}

/// Quad steps per iteration of [`int8_tile`]'s span loop: every flush span (16 `k` or a
/// multiple) is a whole number of them, so the loop's counter and prefetch check run once per
/// four steps (a fifth of the loop's instructions at one step per iteration; the tile timing
/// did not move measurably on an Emerald Rapids core, 2026-12-01).
const INT8_STEPS: usize = 4;

/// Extra inputs of the integer tiles.
struct IntTile<'a> {
    pm: &'a PackedMatrix,
    act: &'a Activations,
    row0: usize,
    strip0: usize,
    fs: usize,
    plan: SpanPlan,
}

/// Calls `$f::<G.., MR, NS, PF>` (`G..` the generic arguments in brackets, possibly none)
/// for a runtime tile height, strip count and prefetch flag.
macro_rules! dispatch {
    ($f:ident [$($g:tt)*], $mr:expr, $ns:expr, $pf:expr, $($arg:expr),*) => {
        if $pf {
            dispatch!(@ $f [$($g)*], $mr, $ns, true, $($arg),*)
        } else {
            dispatch!(@ $f [$($g)*], $mr, $ns, false, $($arg),*)
        }
    };
    (@ $f:ident [$($g:tt)*], $mr:expr, $ns:expr, $pf:literal, $($arg:expr),*) => {
        match ($mr, $ns) {
            (1, 2) => $f::<$($g)* 1, 2, $pf>($($arg),*),
            (2, 2) => $f::<$($g)* 2, 2, $pf>($($arg),*),
            (3, 2) => $f::<$($g)* 3, 2, $pf>($($arg),*),
            (4, 2) => $f::<$($g)* 4, 2, $pf>($($arg),*),
            (1, _) => $f::<$($g)* 1, 4, $pf>($($arg),*),
            (2, _) => $f::<$($g)* 2, 4, $pf>($($arg),*),
            (3, _) => $f::<$($g)* 3, 4, $pf>($($arg),*),
            _ => $f::<$($g)* 4, 4, $pf>($($arg),*),
        }
    };
}

/// # Safety
/// `unit` exists (AVX-512 F/BW/VNNI are available), AVX-512 BF16 too if `dpbf16`, and the
/// ranges are valid as `block` states.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn block_impl(
    unit: Avx512Vnni,
    dpbf16: bool,
    w: &PackedMatrix,
    a: &Activations,
    rows: Range<usize>,
    strips: Range<usize>,
    ks: Range<usize>,
    out: &mut [f32],
    ldo: usize,
) {
    for_each_tile(w, a, rows, strips, ks, out, ldo, 4, |mr, ns, pf, t, it| {
        // SAFETY: the tile covers `mr` rows and `ns` strips that exist, and `klen` `k` from
        // `ks.start`, all within the buffers (`for_each_tile`); the unit's features are
        // enabled here, and AVX-512 BF16 is available if `dpbf16` (the caller).
        unsafe {
            match w.kind {
                Kind::Bf16 if dpbf16 => dispatch!(bf16_tile[], mr, ns, pf, unit, t),
                Kind::Bf16 => dispatch!(bf16_tile_fma[], mr, ns, pf, unit, t),
                Kind::Int8 => dispatch!(int8_tile_hw[], mr, ns, pf, unit, t, it),
                Kind::Int4 => dispatch!(int4_tile_hw[], mr, ns, pf, unit, t, it),
            }
        }
    });
}

/// # Safety
/// `unit` exists (AVX2, FMA, F16C and AVX-VNNI are available); the ranges are valid as
/// `block` states; INT8 or INT4 weights.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn block_avx_vnni_impl(
    unit: AvxVnni,
    w: &PackedMatrix,
    a: &Activations,
    rows: Range<usize>,
    strips: Range<usize>,
    ks: Range<usize>,
    out: &mut [f32],
    ldo: usize,
) {
    for_each_tile(w, a, rows, strips, ks, out, ldo, 2, |mr, ns, pf, t, it| {
        debug_assert!(mr <= 2 && ns == 2);
        // SAFETY: as in `block_impl`, with the unit's features enabled here.
        unsafe {
            match (w.kind, mr, pf) {
                (Kind::Bf16, ..) => unreachable!("checked by block_avx_vnni"),
                (Kind::Int8, 1, false) => int8_tile::<_, 1, 2, false>(unit, t, it),
                (Kind::Int8, 1, true) => int8_tile::<_, 1, 2, true>(unit, t, it),
                (Kind::Int8, _, false) => int8_tile::<_, 2, 2, false>(unit, t, it),
                (Kind::Int8, _, true) => int8_tile::<_, 2, 2, true>(unit, t, it),
                (Kind::Int4, 1, false) => int4_tile::<_, 1, 2, false>(unit, t, it),
                (Kind::Int4, 1, true) => int4_tile::<_, 1, 2, true>(unit, t, it),
                (Kind::Int4, _, false) => int4_tile::<_, 2, 2, false>(unit, t, it),
                (Kind::Int4, _, true) => int4_tile::<_, 2, 2, true>(unit, t, it),
            }
        }
    });
}

/// # Safety
/// The ranges are valid as `block` states; INT8 or INT4 weights.
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
unsafe fn block_soft_impl(
    unit: crate::vnni_unit::Soft,
    w: &PackedMatrix,
    a: &Activations,
    rows: Range<usize>,
    strips: Range<usize>,
    ks: Range<usize>,
    out: &mut [f32],
    ldo: usize,
) {
    use crate::vnni_unit::Soft;
    for_each_tile(w, a, rows, strips, ks, out, ldo, 4, |mr, ns, pf, t, it| {
        // SAFETY: as in `block_impl`; the software unit needs nothing of the CPU.
        unsafe {
            match w.kind {
                Kind::Bf16 => unreachable!("checked by block_soft"),
                Kind::Int8 => dispatch!(int8_tile[Soft,], mr, ns, pf, unit, t, it),
                Kind::Int4 => dispatch!(int4_tile[Soft,], mr, ns, pf, unit, t, it),
            }
        }
    });
}

/// Cuts the block into register tiles of up to `tile` rows by `tile` strips (4 or 2) and
/// hands each to `run(rows, strips, prefetch, tile, integer extras)`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn for_each_tile(
    w: &PackedMatrix,
    a: &Activations,
    rows: Range<usize>,
    strips: Range<usize>,
    ks: Range<usize>,
    out: &mut [f32],
    ldo: usize,
    tile: usize,
    mut run: impl FnMut(usize, usize, bool, &Tile, &IntTile),
) {
    let elem = w.kind.activation_bytes();
    let k_per_line = w.kind.k_per_line();
    // With two or more row tiles per panel, the tiles fetch the next `k` block of the same
    // strips while they compute this one, each prefetching every `n_tiles`-th line: the first
    // tile of a block then finds its lines on the way instead of waiting on DRAM (about 10%
    // at 32 tokens per expert, `bench moe --tokens 512`). With one tile it did not help.
    let pf_lines = (w.k_pad - ks.end).min(ks.len()) / k_per_line;
    let n_tiles = rows.len().div_ceil(tile);
    let pf = pf_lines > 0 && n_tiles >= 2;
    let fs = flush_span(w, &ks);
    let plan = SpanPlan::new(w, a, &ks, fs);
    let mut sg = strips.start;
    while sg < strips.end {
        let ns = if strips.end - sg >= 4 && tile >= 4 {
            4
        } else {
            2
        };
        let mut r = rows.start;
        while r < rows.end {
            let mr = (rows.end - r).min(tile);
            let tile_idx = (r - rows.start) / tile;
            // SAFETY: all offsets are in bounds: row `r < m_pad` and `ks.start < k_pad` within
            // the activations, strip `sg` within the packed data, and the output element
            // `(r - rows.start, sg - strips.start)` within `out` (see `block`).
            let t = unsafe {
                Tile {
                    a: a.data.as_ptr().add(r * a.lda + ks.start * elem),
                    lda: a.lda,
                    w: w.data
                        .as_ptr()
                        .add(sg * w.strip_bytes + ks.start / k_per_line * LINE),
                    sb: w.strip_bytes,
                    klen: ks.len(),
                    out: out
                        .as_mut_ptr()
                        .add((r - rows.start) * ldo + (sg - strips.start) * STRIP),
                    ldo,
                    pf_lines,
                    pf_every: n_tiles,
                    pf_phase: tile_idx,
                }
            };
            let it = IntTile {
                pm: w,
                act: a,
                row0: r,
                strip0: sg,
                fs,
                plan,
            };
            run(mr, ns, pf, &t, &it);
            r += mr;
        }
        sg += ns;
    }
}

/// Broadcasts the 4 bytes at `p` to all 16 lanes.
///
/// # Safety
/// `p` must be valid for reading 4 bytes.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn bcast4(p: *const u8) -> __m512i {
    // SAFETY: the caller guarantees 4 readable bytes; unaligned read.
    _mm512_set1_epi32(unsafe { (p as *const i32).read_unaligned() })
}

#[inline(always)]
fn as_bh(v: __m512i) -> __m512bh {
    // SAFETY: both are 64-byte plain vector types; every bit pattern is valid for either.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
}

/// # Safety
/// As [`block_impl`]; `t` covers `MR` valid rows and `NS` valid strips.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn bf16_tile<const MR: usize, const NS: usize, const PF: bool>(u: Avx512Vnni, t: &Tile) {
    let mut acc = [[_mm512_setzero_ps(); NS]; MR];
    let mut next_pf = t.pf_phase;
    for p in 0..t.klen / 2 {
        if PF {
            t.prefetch::<_, NS>(u, t.klen / 2, p, &mut next_pf);
        }
        let mut wv = [_mm512_setzero_si512(); NS];
        for (s, wv) in wv.iter_mut().enumerate() {
            // SAFETY: line `p` of strip `s` of the block lies in the packed data; lines are
            // 64-byte aligned (aligned buffer, strip and line sizes multiples of 64).
            *wv = unsafe { _mm512_load_si512(t.w.add(s * t.sb + p * LINE) as *const __m512i) };
        }
        for (i, acc) in acc.iter_mut().enumerate() {
            // SAFETY: pair `p` of row `i` lies within the row's `k_pad` bf16 values.
            let x = as_bh(unsafe { bcast4(t.a.add(i * t.lda + 4 * p)) });
            for s in 0..NS {
                acc[s] = _mm512_dpbf16_ps(acc[s], x, as_bh(wv[s]));
            }
        }
    }
    // SAFETY: as this function.
    unsafe { add_sums(t, &acc) };
}

/// [`bf16_tile`] on CPUs without AVX-512 BF16 (Ice Lake, Cascade Lake): each bf16 pair of a
/// line or a broadcast is widened to two f32 (the low one shifted up, the high one masked in
/// place), then two FMAs. Same products; the sums round after every FMA, as `vdpbf16ps`'s do
/// after every pair.
///
/// # Safety
/// As [`block_impl`]; `t` covers `MR` valid rows and `NS` valid strips.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn bf16_tile_fma<const MR: usize, const NS: usize, const PF: bool>(u: Avx512Vnni, t: &Tile) {
    let high = _mm512_set1_epi32(0xffff_0000_u32 as i32);
    let even = |v: __m512i| _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v));
    let odd = |v: __m512i| _mm512_castsi512_ps(_mm512_and_si512(v, high));
    let mut acc = [[_mm512_setzero_ps(); NS]; MR];
    let mut next_pf = t.pf_phase;
    for p in 0..t.klen / 2 {
        if PF {
            t.prefetch::<_, NS>(u, t.klen / 2, p, &mut next_pf);
        }
        let mut x = [(_mm512_setzero_ps(), _mm512_setzero_ps()); MR];
        for (i, x) in x.iter_mut().enumerate() {
            // SAFETY: pair `p` of row `i` lies within the row's `k_pad` bf16 values.
            let pair = unsafe { bcast4(t.a.add(i * t.lda + 4 * p)) };
            *x = (even(pair), odd(pair));
        }
        for s in 0..NS {
            // SAFETY: as in `bf16_tile`.
            let v = unsafe { _mm512_load_si512(t.w.add(s * t.sb + p * LINE) as *const __m512i) };
            let (we, wo) = (even(v), odd(v));
            for (acc, x) in acc.iter_mut().zip(&x) {
                acc[s] = _mm512_fmadd_ps(wo, x.1, _mm512_fmadd_ps(we, x.0, acc[s]));
            }
        }
    }
    // SAFETY: as this function.
    unsafe { add_sums(t, &acc) };
}

/// Adds a BF16 tile's sums to the output.
///
/// # Safety
/// AVX-512 F must be available; `t` covers `MR` valid rows and `NS` valid strips.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn add_sums<const MR: usize, const NS: usize>(t: &Tile, acc: &[[__m512; NS]; MR]) {
    for (i, acc) in acc.iter().enumerate() {
        for (s, acc) in acc.iter().enumerate() {
            // SAFETY: row `i`, strip `s` of the tile is within `out`.
            unsafe {
                let o = t.out.add(i * t.ldo + s * STRIP);
                _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), *acc));
            }
        }
    }
}

/// Adds the tile's sums into the output.
///
/// # Safety
/// `t` covers `MR` rows and `NS` strips within the output.
#[inline(always)]
unsafe fn store<U: Vnni, const MR: usize, const NS: usize>(
    u: U,
    t: &Tile,
    accf: &[[U::F; NS]; MR],
) {
    for (i, accf) in accf.iter().enumerate() {
        for (s, v) in accf.iter().enumerate() {
            // SAFETY: row `i`, strip `s` of the tile is within `out` (caller).
            unsafe {
                let o = t.out.add(i * t.ldo + s * STRIP);
                u.storef(o, u.addf(u.loadf(o), *v));
            }
        }
    }
}

/// The INT8 tile on the CPU's unit. Not inlined into the block loop: inlined, how its
/// variants were compiled moved with unrelated changes (Q4_K's tile at 444-496 GOPS across
/// three builds of the per-256 flush, 2026-12-01).
///
/// # Safety
/// As [`int8_tile`]; the unit's features are enabled here.
#[inline(never)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn int8_tile_hw<const MR: usize, const NS: usize, const PF: bool>(
    u: Avx512Vnni,
    t: &Tile,
    it: &IntTile,
) {
    // SAFETY: the caller's guarantee.
    unsafe { int8_tile::<_, MR, NS, PF>(u, t, it) }
}

/// The INT4 tile on the CPU's unit, not inlined for the same reason as [`int8_tile_hw`].
///
/// # Safety
/// As [`int4_tile`]; the unit's features are enabled here.
#[inline(never)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn int4_tile_hw<const MR: usize, const NS: usize, const PF: bool>(
    u: Avx512Vnni,
    t: &Tile,
    it: &IntTile,
) {
    // SAFETY: the caller's guarantee.
    unsafe { int4_tile::<_, MR, NS, PF>(u, t, it) }
}

/// # Safety
/// `U` runs on this CPU (inlined into a function with its features); `t` covers `MR` valid
/// rows and `NS` valid strips, as [`block`] states.
#[inline(always)]
unsafe fn int8_tile<U: Vnni, const MR: usize, const NS: usize, const PF: bool>(
    u: U,
    t: &Tile,
    it: &IntTile,
) {
    // SAFETY: the caller's guarantee.
    unsafe {
        if it.plan.shared_scales() {
            int8_tile_on::<_, MR, NS, PF, true>(u, t, it)
        } else {
            int8_tile_on::<_, MR, NS, PF, false>(u, t, it)
        }
    }
}

/// [`int8_tile`] with activation scales `SHARED` by several spans or not (see [`flush`]).
///
/// # Safety
/// As [`int8_tile`].
#[inline(always)]
unsafe fn int8_tile_on<
    U: Vnni,
    const MR: usize,
    const NS: usize,
    const PF: bool,
    const SHARED: bool,
>(
    u: U,
    t: &Tile,
    it: &IntTile,
) {
    let mut sums = Sums::new(u);
    let mut sc = SpanScales::new(it, MR, NS);
    let mut next_pf = t.pf_phase;
    let mut f = 0;
    assert!(it.fs.is_multiple_of(4 * INT8_STEPS) && t.klen.is_multiple_of(it.fs));
    while f < t.klen {
        let mut acc = start_span::<_, MR, NS>(u, it, &sc);
        let mut q0 = f / 4;
        while q0 < (f + it.fs) / 4 {
            if PF {
                t.prefetch_below::<_, NS>(u, t.klen / 4, q0 + INT8_STEPS, &mut next_pf);
            }
            for q in q0..q0 + INT8_STEPS {
                let mut wv = [u.zero(); NS];
                for (s, wv) in wv.iter_mut().enumerate() {
                    // SAFETY: quad line `q` of strip `s` lies in the packed data.
                    *wv = unsafe { u.load(t.w.add(s * t.sb + q * LINE)) };
                }
                for (i, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: quad `q` of row `i` lies within the row's `k_pad` bytes.
                    let x = u.splat32(unsafe { quad(t.a.add(i * t.lda + 4 * q)) });
                    for s in 0..NS {
                        acc[s] = u.dpbusd(acc[s], wv[s], x);
                    }
                }
            }
            q0 += INT8_STEPS;
        }
        f += it.fs;
        flush::<_, MR, NS, SHARED>(u, &acc, &mut sc, &mut sums, f >= t.klen);
    }
    // SAFETY: as this function.
    unsafe { store(u, t, sums.total()) };
}

/// # Safety
/// As [`int8_tile`].
#[inline(always)]
unsafe fn int4_tile<U: Vnni, const MR: usize, const NS: usize, const PF: bool>(
    u: U,
    t: &Tile,
    it: &IntTile,
) {
    // SAFETY: the caller's guarantee.
    unsafe {
        if it.plan.shared_scales() {
            int4_tile_on::<_, MR, NS, PF, true>(u, t, it)
        } else {
            int4_tile_on::<_, MR, NS, PF, false>(u, t, it)
        }
    }
}

/// [`int4_tile`] with activation scales `SHARED` by several spans or not (see [`flush`]).
///
/// # Safety
/// As [`int4_tile`].
#[inline(always)]
unsafe fn int4_tile_on<
    U: Vnni,
    const MR: usize,
    const NS: usize,
    const PF: bool,
    const SHARED: bool,
>(
    u: U,
    t: &Tile,
    it: &IntTile,
) {
    let nib = u.splat8(0x0f);
    let mut sums = Sums::new(u);
    let mut sc = SpanScales::new(it, MR, NS);
    let mut next_pf = t.pf_phase;
    let mut f = 0;
    while f < t.klen {
        let mut acc = start_span::<_, MR, NS>(u, it, &sc);
        for l in f / 8..(f + it.fs) / 8 {
            if PF {
                t.prefetch::<_, NS>(u, t.klen / 8, l, &mut next_pf);
            }
            let mut lo = [u.zero(); NS];
            let mut hi = [u.zero(); NS];
            for s in 0..NS {
                // SAFETY: line `l` of strip `s` lies in the packed data.
                let v = unsafe { u.load(t.w.add(s * t.sb + l * LINE)) };
                lo[s] = u.and(v, nib);
                hi[s] = u.and(u.srli16::<4>(v), nib);
            }
            for (i, acc) in acc.iter_mut().enumerate() {
                // SAFETY: quads `2l` and `2l + 1` of row `i` lie within its `k_pad` bytes.
                let (x0, x1) = unsafe {
                    let p = t.a.add(i * t.lda + 8 * l);
                    (u.splat32(quad(p)), u.splat32(quad(p.add(4))))
                };
                for s in 0..NS {
                    acc[s] = u.dpbusd(acc[s], lo[s], x0);
                    acc[s] = u.dpbusd(acc[s], hi[s], x1);
                }
            }
        }
        f += it.fs;
        flush::<_, MR, NS, SHARED>(u, &acc, &mut sc, &mut sums, f >= t.klen);
    }
    // SAFETY: as this function.
    unsafe { store(u, t, sums.total()) };
}

/// The 4 bytes at `p`, little-endian.
///
/// # Safety
/// `p` must be valid for reading 4 bytes.
#[inline(always)]
unsafe fn quad(p: *const u8) -> u32 {
    // SAFETY: the caller guarantees 4 readable bytes; unaligned read.
    unsafe { (p as *const u32).read_unaligned() }
}
