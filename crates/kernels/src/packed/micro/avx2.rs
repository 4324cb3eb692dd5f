//! AVX2 micro-kernels: 256-bit f32 FMA for BF16, `vpmaddubsw` + `vpmaddwd` for INT8 and INT4.
//!
//! Each packed 64-byte line is two ymm: columns 0-7 and 8-15 of a strip, each lane a bf16 pair
//! or a u8 quad. The matching activation pair or quad of a token is broadcast to all lanes.
//!
//! - BF16: a lane's pair widens to two f32 with a shift (`k` even) and a mask (`k` odd), for
//!   weights and activations alike, and two FMAs advance 8 columns by 2 `k`.
//! - INT8: weights are stored `q + 128`; `xor 0x80` gives the signed `q` in `[-128, 127]`.
//!   `vpmaddubsw` multiplies `|q|` (unsigned, at most 128) by `x · sign(q)` (`vpsignb`, exact
//!   since `quantize_i8` clamps activations to `[-127, 127]`), so each i16 pair sum is at most
//!   `2 · 128 · 127 = 32512 < 32767` and never saturates; `vpmaddwd` with ones widens the pairs to
//!   i32. The sum is `Σ q · x` directly: no offset correction at the flush, and it equals the
//!   portable kernel's `Σ (q + 128) · x - 128 · Σ x` exactly.
//! - INT4: the nibbles (`q + 8` in `[0, 15]`) are split in registers (`and`, `srli`) and
//!   multiplied unsigned: a pair sums to at most `2 · 15 · 127 = 3810`, and the two nibble lines'
//!   pairs (`7620`) are added in i16 before `vpmaddwd`. The offset is corrected at the flush
//!   as in the portable kernel.
//!
//! A key design decision: the register tile is 2 tokens x 2 strips (one token x 4 strips when a
//! call has a single token, the decode case), which fits the 16 ymm registers with the
//! broadcast activations and the widened weights of one half line, the largest tile that does.

// Register tiles are indexed `[row][strip][half]` as in the math, with the strip and half
// also naming the packed line to load.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::{correction, flush_span};
use crate::packed::{Activations, Kind, LINE, PackedMatrix, STRIP};

/// Columns per ymm of f32 or i32.
const HALF: usize = STRIP / 2;

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
    assert!(crate::isa::detected() >= crate::isa::Isa::Avx2);
    // SAFETY: AVX2 and FMA were detected just above; `run_block` checked that rows, strips and
    // `ks` lie within the activations and the packed matrix and that `out` holds `rows.len()`
    // rows of `ldo >= strips.len() * 16` floats.
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
}

impl Tile {
    /// Half `h` of line `l` of strip `s`.
    ///
    /// # Safety
    /// The line must lie within the packed data; lines are 64-byte aligned (aligned buffer,
    /// strip and line sizes multiples of 64).
    #[inline(always)]
    unsafe fn line(&self, s: usize, l: usize, h: usize) -> __m256i {
        // SAFETY: as the caller guarantees; a 32-byte half of an aligned line is aligned.
        unsafe { _mm256_load_si256(self.w.add(s * self.sb + l * LINE + h * 32) as *const __m256i) }
    }

    /// The 4 activation bytes of row `i` at byte `b`, broadcast to all 8 lanes.
    ///
    /// # Safety
    /// The bytes must lie within the row.
    #[inline(always)]
    unsafe fn bcast(&self, i: usize, b: usize) -> __m256i {
        // SAFETY: as the caller guarantees; unaligned read. AVX is enabled in every caller.
        unsafe { _mm256_set1_epi32((self.a.add(i * self.lda + b) as *const i32).read_unaligned()) }
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
    /// Whether the flush subtracts the stored offset times the activation sum (INT4).
    correct: bool,
}

/// Calls `$f::<MR, NS>` for a runtime tile height and strip count.
macro_rules! dispatch {
    ($f:ident, $mr:expr, $ns:expr, $($arg:expr),*) => {
        match ($mr, $ns) {
            (1, 4) => $f::<1, 4>($($arg),*),
            (1, _) => $f::<1, 2>($($arg),*),
            _ => $f::<2, 2>($($arg),*),
        }
    };
}

/// # Safety
/// AVX2 and FMA must be available and the ranges valid as `block` states.
#[target_feature(enable = "avx2,fma")]
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
    let mut sg = strips.start;
    while sg < strips.end {
        let ns = if rows.len() == 1 && strips.end - sg >= 4 {
            4
        } else {
            2
        };
        let mut r = rows.start;
        while r < rows.end {
            let mr = (rows.end - r).min(2);
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
                }
            };
            let it = IntTile {
                pm: w,
                act: a,
                row0: r,
                strip0: sg,
                k0: ks.start,
                fs: flush_span(w, &ks),
                correct: w.kind == Kind::Int4,
            };
            // SAFETY: the tile covers `mr` rows and `ns` strips that exist (loop bounds), and
            // `klen` `k` from `ks.start`, all within the buffers.
            unsafe {
                match w.kind {
                    Kind::Bf16 => dispatch!(bf16_tile, mr, ns, &t),
                    Kind::Int8 => dispatch!(int8_tile, mr, ns, &t, &it),
                    Kind::Int4 => dispatch!(int4_tile, mr, ns, &t, &it),
                }
            }
            r += mr;
        }
        sg += ns;
    }
}

/// Adds the `MR x NS` tile of f32 sums into `out`.
///
/// # Safety
/// As [`block_impl`]; `t` covers `MR` valid rows and `NS` valid strips.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn store<const MR: usize, const NS: usize>(t: &Tile, acc: &[[[__m256; 2]; NS]; MR]) {
    for (i, acc) in acc.iter().enumerate() {
        for (s, acc) in acc.iter().enumerate() {
            for (h, v) in acc.iter().enumerate() {
                // SAFETY: row `i`, columns `16 s + 8 h ..` of the tile are within `out`.
                unsafe {
                    let o = t.out.add(i * t.ldo + s * STRIP + h * HALF);
                    _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), *v));
                }
            }
        }
    }
}

/// # Safety
/// As [`block_impl`]; `t` covers `MR` valid rows and `NS` valid strips.
#[target_feature(enable = "avx2,fma")]
unsafe fn bf16_tile<const MR: usize, const NS: usize>(t: &Tile) {
    let high = _mm256_set1_epi32(0xffff_0000_u32 as i32);
    // bf16 pair lanes to f32: the low bf16 shifted up, the high one masked in place.
    let even = |v: __m256i| _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v));
    let odd = |v: __m256i| _mm256_castsi256_ps(_mm256_and_si256(v, high));
    let mut acc = [[[_mm256_setzero_ps(); 2]; NS]; MR];
    for p in 0..t.klen / 2 {
        let mut x0 = [_mm256_setzero_ps(); MR];
        let mut x1 = [_mm256_setzero_ps(); MR];
        for i in 0..MR {
            // SAFETY: pair `p` of row `i` lies within the row's `k_pad` bf16 values.
            let pair = unsafe { t.bcast(i, 4 * p) };
            (x0[i], x1[i]) = (even(pair), odd(pair));
        }
        for s in 0..NS {
            for h in 0..2 {
                // SAFETY: line `p` of strip `s` of the block lies in the packed data.
                let v = unsafe { t.line(s, p, h) };
                let (we, wo) = (even(v), odd(v));
                for i in 0..MR {
                    let a = _mm256_fmadd_ps(we, x0[i], acc[i][s][h]);
                    acc[i][s][h] = _mm256_fmadd_ps(wo, x1[i], a);
                }
            }
        }
    }
    // SAFETY: as this function.
    unsafe { store(t, &acc) };
}

/// Converts the i32 sums of one flush span to f32 and accumulates them with the scales: the
/// arithmetic of the AVX-512 tiles' flush (`avx512::flush`), bit for bit. Where an activation
/// scale covers several spans, the spans' sums times their weight scales gather in `part`,
/// which joins `accf` times the activation scale after its last span (or the block's,
/// `last`).
///
/// # Safety
/// As [`block_impl`].
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn flush<const MR: usize, const NS: usize>(
    acc: &[[[__m256i; 2]; NS]; MR],
    part: &mut [[[__m256; 2]; NS]; MR],
    accf: &mut [[[__m256; 2]; NS]; MR],
    it: &IntTile,
    f0: usize,
    last: bool,
) {
    let (w, a) = (it.pm, it.act);
    let g = f0 / w.group;
    let shared = a.spans_per_scale(it.fs) > 1;
    // Found once per flush, not per row (`Activations::scale_at` divides twice).
    let (stride, col) = a.scale_column(f0);
    let apply = !shared || last || (f0 + it.fs).is_multiple_of(a.scale_group);
    for i in 0..MR {
        let r = it.row0 + i;
        let corr = if it.correct {
            correction(w, a, r, f0, it.fs)
        } else {
            0
        };
        let corr = _mm256_set1_epi32(corr);
        let xs = _mm256_set1_ps(a.scale[r * stride + col]);
        for s in 0..NS {
            let sc = &w.scales[((it.strip0 + s) * w.groups + g) * STRIP..][..STRIP];
            for h in 0..2 {
                // SAFETY: `sc` holds 16 floats.
                let scv = unsafe { _mm256_loadu_ps(sc.as_ptr().add(h * HALF)) };
                let v = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[i][s][h], corr));
                if !shared {
                    accf[i][s][h] = _mm256_fmadd_ps(v, _mm256_mul_ps(scv, xs), accf[i][s][h]);
                    continue;
                }
                part[i][s][h] = _mm256_fmadd_ps(v, scv, part[i][s][h]);
                if apply {
                    accf[i][s][h] = _mm256_fmadd_ps(part[i][s][h], xs, accf[i][s][h]);
                    part[i][s][h] = _mm256_setzero_ps();
                }
            }
        }
    }
}

/// # Safety
/// As [`block_impl`]; `t` covers `MR` valid rows and `NS` valid strips.
#[target_feature(enable = "avx2,fma")]
unsafe fn int8_tile<const MR: usize, const NS: usize>(t: &Tile, it: &IntTile) {
    // The stored byte less the offset: `q + 128` flipped, or an unsigned matrix's `q`.
    let flip = _mm256_set1_epi8(if it.pm.offset == 0 { 0 } else { i8::MIN });
    let ones = _mm256_set1_epi16(1);
    let mut accf = [[[_mm256_setzero_ps(); 2]; NS]; MR];
    let mut part = accf;
    let mut f = 0;
    while f < t.klen {
        let mut acc = [[[_mm256_setzero_si256(); 2]; NS]; MR];
        for q in f / 4..(f + it.fs) / 4 {
            let mut x = [_mm256_setzero_si256(); MR];
            for (i, x) in x.iter_mut().enumerate() {
                // SAFETY: quad `q` of row `i` lies within the row's `k_pad` bytes.
                *x = unsafe { t.bcast(i, 4 * q) };
            }
            for s in 0..NS {
                for h in 0..2 {
                    // SAFETY: quad line `q` of strip `s` lies in the packed data.
                    let signed = _mm256_xor_si256(unsafe { t.line(s, q, h) }, flip);
                    let magnitude = _mm256_abs_epi8(signed);
                    for i in 0..MR {
                        // |q| · (x · sign q) = q · x, pairs within i16 (module docs).
                        let xs = _mm256_sign_epi8(x[i], signed);
                        let pairs = _mm256_maddubs_epi16(magnitude, xs);
                        let sums = _mm256_madd_epi16(pairs, ones);
                        acc[i][s][h] = _mm256_add_epi32(acc[i][s][h], sums);
                    }
                }
            }
        }
        let f0 = it.k0 + f;
        f += it.fs;
        // SAFETY: as this function.
        unsafe { flush(&acc, &mut part, &mut accf, it, f0, f >= t.klen) };
    }
    // SAFETY: as this function.
    unsafe { store(t, &accf) };
}

/// # Safety
/// As [`block_impl`]; `t` covers `MR` valid rows and `NS` valid strips.
#[target_feature(enable = "avx2,fma")]
unsafe fn int4_tile<const MR: usize, const NS: usize>(t: &Tile, it: &IntTile) {
    let nib = _mm256_set1_epi8(0x0f);
    let ones = _mm256_set1_epi16(1);
    let mut accf = [[[_mm256_setzero_ps(); 2]; NS]; MR];
    let mut part = accf;
    let mut f = 0;
    while f < t.klen {
        let mut acc = [[[_mm256_setzero_si256(); 2]; NS]; MR];
        for l in f / 8..(f + it.fs) / 8 {
            let mut x0 = [_mm256_setzero_si256(); MR];
            let mut x1 = [_mm256_setzero_si256(); MR];
            for i in 0..MR {
                // SAFETY: quads `2l` and `2l + 1` of row `i` lie within its `k_pad` bytes.
                (x0[i], x1[i]) = unsafe { (t.bcast(i, 8 * l), t.bcast(i, 8 * l + 4)) };
            }
            for s in 0..NS {
                for h in 0..2 {
                    // SAFETY: line `l` of strip `s` lies in the packed data.
                    let v = unsafe { t.line(s, l, h) };
                    let lo = _mm256_and_si256(v, nib);
                    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib);
                    for i in 0..MR {
                        // Each product pair is at most 3810 in magnitude, their sum 7620.
                        let pairs = _mm256_add_epi16(
                            _mm256_maddubs_epi16(lo, x0[i]),
                            _mm256_maddubs_epi16(hi, x1[i]),
                        );
                        let sums = _mm256_madd_epi16(pairs, ones);
                        acc[i][s][h] = _mm256_add_epi32(acc[i][s][h], sums);
                    }
                }
            }
        }
        let f0 = it.k0 + f;
        f += it.fs;
        // SAFETY: as this function.
        unsafe { flush(&acc, &mut part, &mut accf, it, f0, f >= t.klen) };
    }
    // SAFETY: as this function.
    unsafe { store(t, &accf) };
}
