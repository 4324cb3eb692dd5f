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

use std::arch::x86_64::*;
use std::ops::Range;

use super::{correction, flush_span};
use crate::packed::{Activations, Kind, LINE, PackedMatrix, STRIP};

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
    assert!(crate::isa::detected() >= crate::isa::Isa::Avx512);
    // SAFETY: the features this function enables were detected just above; `run_block` checked
    // that rows, strips and `ks` lie within the activations and the packed matrix and that
    // `out` holds `rows.len()` rows of `ldo >= strips.len() * 16` floats.
    unsafe { block_impl(w, a, rows, strips, ks, out, ldo) }
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
    ///
    /// # Safety
    /// `pf_lines` must count lines that exist after the block in every strip of the tile.
    #[inline(always)]
    unsafe fn prefetch<const NS: usize>(&self, klines: usize, p: usize, next: &mut usize) {
        if p != *next {
            return;
        }
        *next += self.pf_every;
        if p < self.pf_lines {
            for s in 0..NS {
                // SAFETY: line `klines + p` of strip `s` lies within the packed data (caller);
                // a prefetch does not fault in any case.
                unsafe {
                    let q = self.w.add(s * self.sb + (klines + p) * LINE);
                    _mm_prefetch::<_MM_HINT_T0>(q as *const i8);
                }
            }
        }
    }
}

/// Extra inputs of the integer tiles.
struct IntTile<'a> {
    pm: &'a PackedMatrix,
    act: &'a Activations,
    row0: usize,
    strip0: usize,
    k0: usize,
    fs: usize,
}

/// Calls `$f::<MR, NS, PF>` for a runtime tile height, strip count and prefetch flag.
macro_rules! dispatch {
    ($f:ident, $mr:expr, $ns:expr, $pf:expr, $($arg:expr),*) => {
        if $pf {
            dispatch!(@ $f, $mr, $ns, true, $($arg),*)
        } else {
            dispatch!(@ $f, $mr, $ns, false, $($arg),*)
        }
    };
    (@ $f:ident, $mr:expr, $ns:expr, $pf:literal, $($arg:expr),*) => {
        match ($mr, $ns) {
            (1, 2) => $f::<1, 2, $pf>($($arg),*),
            (2, 2) => $f::<2, 2, $pf>($($arg),*),
            (3, 2) => $f::<3, 2, $pf>($($arg),*),
            (4, 2) => $f::<4, 2, $pf>($($arg),*),
            (1, _) => $f::<1, 4, $pf>($($arg),*),
            (2, _) => $f::<2, 4, $pf>($($arg),*),
            (3, _) => $f::<3, 4, $pf>($($arg),*),
            _ => $f::<4, 4, $pf>($($arg),*),
        }
    };
}

/// # Safety
/// AVX-512 F/BW/BF16/VNNI must be available and the ranges valid as `block` states.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx512vnni")]
unsafe fn block_impl(
    w: &PackedMatrix,
    a: &Activations,
    rows: Range<usize>,
    strips: Range<usize>,
    ks: Range<usize>,
    out: &mut [f32],
    ldo: usize,
) {
    let elem = w.kind.activation_bytes();
    let k_per_line = w.kind.k_per_line();
    // With two or more row tiles per panel, the tiles fetch the next `k` block of the same
    // strips while they compute this one, each prefetching every `n_tiles`-th line: the first
    // tile of a block then finds its lines on the way instead of waiting on DRAM (about 10%
    // at 32 tokens per expert, `bench moe --tokens 512`). With one tile it did not help.
    let pf_lines = (w.k_pad - ks.end).min(ks.len()) / k_per_line;
    let n_tiles = rows.len().div_ceil(4);
    let pf = pf_lines > 0 && n_tiles >= 2;
    let mut sg = strips.start;
    while sg < strips.end {
        let ns = if strips.end - sg >= 4 { 4 } else { 2 };
        let mut r = rows.start;
        while r < rows.end {
            let mr = (rows.end - r).min(4);
            let tile_idx = (r - rows.start) / 4;
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
                k0: ks.start,
                fs: flush_span(w, &ks),
            };
            // SAFETY: the tile covers `mr` rows and `ns` strips that exist (loop bounds), and
            // `klen` `k` from `ks.start`, all within the buffers.
            unsafe {
                match w.kind {
                    Kind::Bf16 => dispatch!(bf16_tile, mr, ns, pf, &t),
                    Kind::Int8 => dispatch!(int8_tile, mr, ns, pf, &t, &it),
                    Kind::Int4 => dispatch!(int4_tile, mr, ns, pf, &t, &it),
                }
            }
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
unsafe fn bf16_tile<const MR: usize, const NS: usize, const PF: bool>(t: &Tile) {
    let mut acc = [[_mm512_setzero_ps(); NS]; MR];
    let mut next_pf = t.pf_phase;
    for p in 0..t.klen / 2 {
        if PF {
            // SAFETY: `pf_lines` counts lines after the block (`block_impl`).
            unsafe { t.prefetch::<NS>(t.klen / 2, p, &mut next_pf) };
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

/// Converts the i32 sums of one flush span to f32 and accumulates them with the scales.
///
/// # Safety
/// As [`block_impl`].
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn flush<const MR: usize, const NS: usize>(
    acc: &[[__m512i; NS]; MR],
    accf: &mut [[__m512; NS]; MR],
    it: &IntTile,
    f0: usize,
) {
    let (w, a) = (it.pm, it.act);
    let g = f0 / w.group;
    for i in 0..MR {
        let r = it.row0 + i;
        let corr = _mm512_set1_epi32(correction(w, a, r, f0, it.fs));
        let xs = _mm512_set1_ps(a.scale_at(r, f0));
        for s in 0..NS {
            let sc = &w.scales[((it.strip0 + s) * w.groups + g) * STRIP..][..STRIP];
            // SAFETY: `sc` holds 16 floats.
            let scv = unsafe { _mm512_loadu_ps(sc.as_ptr()) };
            let v = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i][s], corr));
            accf[i][s] = _mm512_fmadd_ps(v, _mm512_mul_ps(scv, xs), accf[i][s]);
        }
    }
}

/// # Safety
/// As [`block_impl`].
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn store<const MR: usize, const NS: usize>(t: &Tile, accf: &[[__m512; NS]; MR]) {
    for (i, accf) in accf.iter().enumerate() {
        for (s, v) in accf.iter().enumerate() {
            // SAFETY: row `i`, strip `s` of the tile is within `out`.
            unsafe {
                let o = t.out.add(i * t.ldo + s * STRIP);
                _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), *v));
            }
        }
    }
}

/// # Safety
/// As [`block_impl`]; `t` covers `MR` valid rows and `NS` valid strips.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn int8_tile<const MR: usize, const NS: usize, const PF: bool>(t: &Tile, it: &IntTile) {
    let mut accf = [[_mm512_setzero_ps(); NS]; MR];
    let mut next_pf = t.pf_phase;
    let mut f = 0;
    while f < t.klen {
        let mut acc = [[_mm512_setzero_si512(); NS]; MR];
        for q in f / 4..(f + it.fs) / 4 {
            if PF {
                // SAFETY: `pf_lines` counts lines after the block (`block_impl`).
                unsafe { t.prefetch::<NS>(t.klen / 4, q, &mut next_pf) };
            }
            let mut wv = [_mm512_setzero_si512(); NS];
            for (s, wv) in wv.iter_mut().enumerate() {
                // SAFETY: quad line `q` of strip `s` lies in the packed data, 64-byte aligned.
                *wv = unsafe { _mm512_load_si512(t.w.add(s * t.sb + q * LINE) as *const __m512i) };
            }
            for (i, acc) in acc.iter_mut().enumerate() {
                // SAFETY: quad `q` of row `i` lies within the row's `k_pad` bytes.
                let x = unsafe { bcast4(t.a.add(i * t.lda + 4 * q)) };
                for s in 0..NS {
                    acc[s] = _mm512_dpbusd_epi32(acc[s], wv[s], x);
                }
            }
        }
        // SAFETY: as this function.
        unsafe { flush(&acc, &mut accf, it, it.k0 + f) };
        f += it.fs;
    }
    // SAFETY: as this function.
    unsafe { store(t, &accf) };
}

/// # Safety
/// As [`block_impl`]; `t` covers `MR` valid rows and `NS` valid strips.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn int4_tile<const MR: usize, const NS: usize, const PF: bool>(t: &Tile, it: &IntTile) {
    let nib = _mm512_set1_epi8(0x0f);
    let mut accf = [[_mm512_setzero_ps(); NS]; MR];
    let mut next_pf = t.pf_phase;
    let mut f = 0;
    while f < t.klen {
        let mut acc = [[_mm512_setzero_si512(); NS]; MR];
        for l in f / 8..(f + it.fs) / 8 {
            if PF {
                // SAFETY: `pf_lines` counts lines after the block (`block_impl`).
                unsafe { t.prefetch::<NS>(t.klen / 8, l, &mut next_pf) };
            }
            let mut lo = [_mm512_setzero_si512(); NS];
            let mut hi = [_mm512_setzero_si512(); NS];
            for s in 0..NS {
                // SAFETY: line `l` of strip `s` lies in the packed data, 64-byte aligned.
                let v =
                    unsafe { _mm512_load_si512(t.w.add(s * t.sb + l * LINE) as *const __m512i) };
                lo[s] = _mm512_and_si512(v, nib);
                hi[s] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib);
            }
            for (i, acc) in acc.iter_mut().enumerate() {
                // SAFETY: quads `2l` and `2l + 1` of row `i` lie within its `k_pad` bytes.
                let (x0, x1) = unsafe {
                    let p = t.a.add(i * t.lda + 8 * l);
                    (bcast4(p), bcast4(p.add(4)))
                };
                for s in 0..NS {
                    acc[s] = _mm512_dpbusd_epi32(acc[s], lo[s], x0);
                    acc[s] = _mm512_dpbusd_epi32(acc[s], hi[s], x1);
                }
            }
        }
        // SAFETY: as this function.
        unsafe { flush(&acc, &mut accf, it, it.k0 + f) };
        f += it.fs;
    }
    // SAFETY: as this function.
    unsafe { store(t, &accf) };
}
