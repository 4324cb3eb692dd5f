//! Attention's f32 kernels for a block of queries against a block of cached keys and values:
//! the scores of every (query, key) pair, the softmax's exponentials, and the
//! probability-weighted sums of the value rows.
//!
//! A prompt's attention is a product of small matrices (the query heads that share a key
//! head, times the rows of a task, against a block of cache rows), so the fast paths are
//! register tiles of outer products: 8 queries x 32 keys of scores per pass over the head's
//! values (the keys transposed first, so that each step is a query value broadcast times 32
//! keys' values), 4 queries x 64 values of weighted sums per pass over the cache rows. One or
//! two queries against the cache at a time ([`crate::vector::dot_rows2`]) reload every key
//! for every pair of queries and sum each pair's lanes alone: a 512-token prefill spent 14% of
//! its time there (2026-11-30, Ice Lake); 4 x 4 dot products summed across their lanes at the
//! end, 5.3% (2026-12-01, Emerald Rapids); the outer products, 2.9%.
//!
//! [`mix`] gives the same bits on every path (each value's sum is one chain of fused
//! multiply-adds in key order, as [`crate::vector::axpy_rows2`]'s); so does [`exp_shifted`]
//! (one polynomial, the same operations in every lane, summed in sixteen lanes). [`scores`]
//! is one chain of fused multiply-adds per pair on AVX-512 and sums as
//! [`crate::vector::dot_rows2`] elsewhere: the paths agree to rounding, and every query's
//! scores are the same whichever other queries share its tile.

use crate::Isa;
use crate::vector::{axpy_rows2, dot_rows, dot_rows2};

/// `out[i · nk + j] = q[i · d ..][.. d] · keys[j · stride ..][.. d]` for `i < nq`, `j < nk`,
/// where `d = q.len() / nq`: the scores of `nq` queries (contiguous) against `nk` cache rows
/// `stride` values apart.
///
/// # Panics
/// If `q` is not `nq` rows, `out` not `nq · nk` values, or the last key ends past `keys`.
pub fn scores(q: &[f32], nq: usize, keys: &[f32], stride: usize, nk: usize, out: &mut [f32]) {
    scores_on(Isa::selected(), q, nq, keys, stride, nk, out);
}

/// [`scores`] on `isa` (capped to what the CPU has).
fn scores_on(
    isa: Isa,
    q: &[f32],
    nq: usize,
    keys: &[f32],
    stride: usize,
    nk: usize,
    out: &mut [f32],
) {
    let d = check_block("scores", q.len(), nq, keys.len(), stride, nk);
    assert_eq!(out.len(), nq * nk, "scores of {nq} x {nk}");
    if d == 0 || nk == 0 {
        // Empty rows: every score is the empty sum.
        out.fill(0.0);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa.min(crate::isa::detected()) >= Isa::Avx512 && d.is_multiple_of(16) {
        // SAFETY: the CPU has AVX-512 F (`isa` is capped to what was detected); the shapes
        // were checked above.
        return unsafe { x86::scores(q, nq, d, keys, stride, nk, out) };
    }
    let _ = isa;
    let mut rows = out.chunks_exact_mut(nk);
    let mut queries = q.chunks_exact(d);
    while let (Some(o0), Some(q0)) = (rows.next(), queries.next()) {
        match (rows.next(), queries.next()) {
            (Some(o1), Some(q1)) => dot_rows2([q0, q1], keys, stride, [o0, o1]),
            _ => dot_rows(q0, keys, stride, o0),
        }
    }
}

/// `out[i · d ..][.. d] += Σ_j p[i · nk + j] · values[j · stride ..][.. d]` for `i < nq`,
/// `d = out.len() / nq`: each query's probability-weighted sum of `nk` value rows, continued
/// from `out` one fused multiply-add per row, in order of `j`.
///
/// # Panics
/// If `p` is not `nq · nk` values, `out` not `nq` rows, or the last row ends past `values`.
pub fn mix(p: &[f32], nq: usize, values: &[f32], stride: usize, nk: usize, out: &mut [f32]) {
    mix_on(Isa::selected(), p, nq, values, stride, nk, out);
}

/// [`mix`] on `isa` (capped to what the CPU has).
fn mix_on(
    isa: Isa,
    p: &[f32],
    nq: usize,
    values: &[f32],
    stride: usize,
    nk: usize,
    out: &mut [f32],
) {
    let d = check_block("mix", out.len(), nq, values.len(), stride, nk);
    assert_eq!(p.len(), nq * nk, "weights of {nq} x {nk}");
    if nq == 0 || nk == 0 || d == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa.min(crate::isa::detected()) >= Isa::Avx512 {
        // SAFETY: the CPU has AVX-512 F (`isa` is capped to what was detected); the shapes
        // were checked above.
        return unsafe { x86::mix(p, nq, d, values, stride, nk, out) };
    }
    let _ = isa;
    let mut sums = out.chunks_exact_mut(d);
    let mut weights = p.chunks_exact(nk);
    while let (Some(s0), Some(p0)) = (sums.next(), weights.next()) {
        match (sums.next(), weights.next()) {
            (Some(s1), Some(p1)) => axpy_rows2([p0, p1], values, stride, [s0, s1]),
            _ => {
                // The odd query pairs with a copy of itself, whose sums are dropped.
                let mut copy = s0.to_vec();
                axpy_rows2([p0, p0], values, stride, [s0, &mut copy]);
            }
        }
    }
}

/// Checks a block's shapes and returns the width `d` of the `n` contiguous rows in `len`
/// values, against `rows` cache rows `stride` apart in `cache_len` values.
fn check_block(
    op: &str,
    len: usize,
    n: usize,
    cache_len: usize,
    stride: usize,
    rows: usize,
) -> usize {
    let d = len.checked_div(n).unwrap_or(0);
    assert_eq!(d * n, len, "{op}: {len} values are not {n} rows");
    if rows > 0 && d > 0 {
        let end = (rows - 1) * stride + d;
        assert!(
            stride >= d && end <= cache_len,
            "{op}: {rows} rows of {d} values, {stride} apart, need {end} values, got {cache_len}"
        );
    }
    d
}

/// `log2(e)` and `ln 2` in two parts (the high part exact in 9 bits, so `n · LN2_HI` is
/// exact for the exponents `exp` meets): the range reduction of [`exp`].
const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// The minimax polynomial of `(e^r - 1 - r) / r²` on `|r| <= ln2 / 2` (Cephes' `expf`
/// coefficients, highest degree first): about 1 ulp over the range.
const POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];
/// Below this `e^x` is under `f32`'s smallest normal; inputs are clamped to it (the softmax
/// only meets `x <= 0`, where that is a weight of 1e-38 instead of 0).
const EXP_MIN: f32 = -87.0;
const EXP_MAX: f32 = 88.0;

/// `e^x` by range reduction (`x = n ln2 + r`) and a polynomial: the scalar twin of the vector
/// forms, operation for operation, so every path gives the same bits.
#[inline(always)]
// Not `clamp`: a NaN goes to `EXP_MIN` here, as in the vector `max`.
#[allow(clippy::manual_clamp)]
pub fn exp(x: f32) -> f32 {
    let x = x.max(EXP_MIN).min(EXP_MAX);
    let n = (x * LOG2E).round_ties_even();
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    let p = POLY[1..].iter().fold(POLY[0], |p, &c| p.mul_add(r, c));
    let y = p.mul_add(r * r, r) + 1.0;
    // `n` is an integer in [-126, 127] after the clamp: `2^n` is a normal float.
    y * f32::from_bits(((n as i32 + 127) << 23) as u32)
}

/// Lanes of [`exp_shifted`]'s sum.
const SUM_LANES: usize = 16;

/// The largest of `init` and the values of `x`, NaN ignored (as [`f32::max`] ignores it): a
/// softmax row's shift. In sixteen independent lanes, so that it vectorises where a chain of
/// `f32::max` waited on each comparison (1.5% of a 512-token prefill, 2026-12-01).
pub fn max(x: &[f32], init: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if Isa::selected() >= Isa::Avx512 {
        // SAFETY: `Isa::Avx512` is only selected where the CPU has AVX-512 F.
        return unsafe { x86::max_avx512(x, init) };
    }
    max_body(x, init)
}

/// [`max`]'s loop, compiled for each instruction set.
#[inline(always)]
fn max_body(x: &[f32], init: f32) -> f32 {
    let mut lanes = [init; SUM_LANES];
    let mut chunks = x.chunks_exact(SUM_LANES);
    for chunk in &mut chunks {
        for (l, &v) in lanes.iter_mut().zip(chunk) {
            *l = l.max(v);
        }
    }
    let m = chunks.remainder().iter().fold(init, |m, &v| m.max(v));
    lanes.into_iter().fold(m, f32::max)
}

/// `x[i] = e^(x[i] - shift)` ([`exp`]) for every value; returns their sum, formed in sixteen
/// lanes (value `i` into lane `i % 16` of the whole sixteens), the lanes added first to last,
/// then the rest in order: the same bits on every path.
pub fn exp_shifted(x: &mut [f32], shift: f32) -> f32 {
    exp_shifted_on(Isa::selected(), x, shift)
}

/// [`exp_shifted`] on `isa` (capped to what the CPU has).
fn exp_shifted_on(isa: Isa, x: &mut [f32], shift: f32) -> f32 {
    let isa = isa.min(crate::isa::detected());
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        // SAFETY: the CPU has AVX-512 F (`isa` is capped to what was detected).
        return unsafe { x86::exp_shifted_avx512(x, shift) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        // SAFETY: the CPU has AVX2 and FMA (`isa` is capped to what was detected).
        return unsafe { x86::exp_shifted_avx2(x, shift) };
    }
    exp_shifted_ref(x, shift)
}

/// The portable [`exp_shifted`].
pub fn exp_shifted_ref(x: &mut [f32], shift: f32) -> f32 {
    let whole = x.len() - x.len() % SUM_LANES;
    let mut lanes = [0.0f32; SUM_LANES];
    for chunk in x[..whole].chunks_exact_mut(SUM_LANES) {
        for (l, v) in lanes.iter_mut().zip(chunk) {
            *v = exp(*v - shift);
            *l += *v;
        }
    }
    tail_sum(lanes, &mut x[whole..], shift)
}

/// The lanes added first to last, then [`exp`] of the tail's values added in order.
#[inline(always)]
fn tail_sum(lanes: [f32; SUM_LANES], tail: &mut [f32], shift: f32) -> f32 {
    let mut sum = lanes[1..].iter().fold(lanes[0], |s, &l| s + l);
    for v in tail {
        *v = exp(*v - shift);
        sum += *v;
    }
    sum
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{EXP_MAX, EXP_MIN, LN2_HI, LN2_LO, LOG2E, POLY, SUM_LANES, tail_sum};

    /// Bytes of cache rows a kernel keeps in L1 (of 32-48 KiB) while all queries pass.
    const L1_BYTES: usize = 8 * 1024;

    /// Keys per run of [`scores`]: transposed, `d x KEY_RUN` floats stay in L1 while every
    /// query passes over them.
    const KEY_RUN: usize = 32;

    /// [`super::scores`] as outer products: each run of [`KEY_RUN`] keys transposed (`kt`:
    /// value `c` of every key side by side), then register tiles of up to 8 queries x 32
    /// keys, one query value broadcast times a row of `kt` per step. Each score is one chain
    /// of fused multiply-adds in order of the values, whatever the other queries of its tile.
    ///
    /// # Safety
    /// AVX-512 F must be available; `d` is a multiple of 16 and the shapes were checked.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn scores(
        q: &[f32],
        nq: usize,
        d: usize,
        keys: &[f32],
        stride: usize,
        nk: usize,
        out: &mut [f32],
    ) {
        let mut kt = vec![0.0f32; d * KEY_RUN];
        for j0 in (0..nk).step_by(KEY_RUN) {
            let n = (nk - j0).min(KEY_RUN);
            // SAFETY: keys below `nk` hold `d` values from `j * stride` (the caller), `kt`
            // holds `d` rows of `KEY_RUN`.
            unsafe { transpose_keys(keys, stride, j0..j0 + n, d, &mut kt) };
            let mut i0 = 0;
            while i0 < nq {
                let mi = (nq - i0).min(8);
                // SAFETY: as this function; queries `i0 .. i0 + mi` lie below `nq`, `kt` holds
                // `d` rows of `KEY_RUN`, keys `j0 .. j0 + n` of `out`'s rows lie below `nk`.
                unsafe {
                    match mi {
                        8 => score_run::<8>(q, i0, d, &kt, out, nk, j0, n),
                        7 => score_run::<7>(q, i0, d, &kt, out, nk, j0, n),
                        6 => score_run::<6>(q, i0, d, &kt, out, nk, j0, n),
                        5 => score_run::<5>(q, i0, d, &kt, out, nk, j0, n),
                        4 => score_run::<4>(q, i0, d, &kt, out, nk, j0, n),
                        3 => score_run::<3>(q, i0, d, &kt, out, nk, j0, n),
                        2 => score_run::<2>(q, i0, d, &kt, out, nk, j0, n),
                        _ => score_run::<1>(q, i0, d, &kt, out, nk, j0, n),
                    }
                }
                i0 += mi;
            }
        }
    }

    /// Writes keys `run` (at most [`KEY_RUN`], `d` values each, `stride` apart) side by side
    /// into `kt`: row `c` holds value `c` of each key, zero past the run's keys.
    ///
    /// # Safety
    /// AVX-512 F must be available; `d` is a multiple of 16, the keys lie within `keys` and
    /// `kt` holds `d * KEY_RUN` values.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn transpose_keys(
        keys: &[f32],
        stride: usize,
        run: std::ops::Range<usize>,
        d: usize,
        kt: &mut [f32],
    ) {
        for half in 0..KEY_RUN / 16 {
            let first = run.start + 16 * half;
            for c0 in (0..d).step_by(16) {
                let rows: [__m512i; 16] = std::array::from_fn(|j| {
                    if first + j < run.end {
                        // SAFETY: key `first + j` of the run holds values `c0 .. c0 + 16`.
                        unsafe {
                            _mm512_castps_si512(_mm512_loadu_ps(
                                keys.as_ptr().add((first + j) * stride + c0),
                            ))
                        }
                    } else {
                        _mm512_setzero_si512()
                    }
                });
                for (c, v) in crate::transpose::dwords16(rows).into_iter().enumerate() {
                    // SAFETY: row `c0 + c` of `kt`, keys `16 half .. + 16`, lie within it.
                    unsafe {
                        let at = kt.as_mut_ptr().add((c0 + c) * KEY_RUN + 16 * half);
                        _mm512_storeu_ps(at, _mm512_castsi512_ps(v));
                    }
                }
            }
        }
    }

    /// Queries `i0 .. i0 + MQ` against the `n` keys of a transposed run `kt` (keys `j0 ..` of
    /// `out`'s rows, `nk` wide).
    ///
    /// # Safety
    /// As [`scores`], for this tile.
    #[target_feature(enable = "avx512f")]
    #[inline]
    #[allow(clippy::too_many_arguments)]
    unsafe fn score_run<const MQ: usize>(
        q: &[f32],
        i0: usize,
        d: usize,
        kt: &[f32],
        out: &mut [f32],
        nk: usize,
        j0: usize,
        n: usize,
    ) {
        let mut acc = [[_mm512_setzero_ps(); 2]; MQ];
        for c in 0..d {
            // SAFETY: row `c` of `kt` holds `KEY_RUN` (32) floats; query rows below `nq`
            // hold `d` values (the caller).
            unsafe {
                let row = kt.as_ptr().add(c * KEY_RUN);
                let kv = [_mm512_loadu_ps(row), _mm512_loadu_ps(row.add(16))];
                for (i, acc) in acc.iter_mut().enumerate() {
                    let w = _mm512_set1_ps(*q.get_unchecked((i0 + i) * d + c));
                    acc[0] = _mm512_fmadd_ps(w, kv[0], acc[0]);
                    acc[1] = _mm512_fmadd_ps(w, kv[1], acc[1]);
                }
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            for (v, acc) in acc.iter().enumerate() {
                let cols = n.saturating_sub(16 * v).min(16);
                if cols == 0 {
                    break;
                }
                let mask = ((1u32 << cols) - 1) as __mmask16;
                // SAFETY: columns `j0 + 16 v .. + cols` of query row `i0 + i` lie within `out`.
                unsafe {
                    let o = out.as_mut_ptr().add((i0 + i) * nk + j0 + 16 * v);
                    _mm512_mask_storeu_ps(o, mask, *acc);
                }
            }
        }
    }

    /// [`super::mix`] in register tiles of 4 queries x 64 values (then 16 at a time, then
    /// masked), each value's sum one chain of FMAs in order of the rows.
    ///
    /// # Safety
    /// AVX-512 F must be available; the shapes were checked.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn mix(
        p: &[f32],
        nq: usize,
        d: usize,
        values: &[f32],
        stride: usize,
        nk: usize,
        out: &mut [f32],
    ) {
        // Value rows in runs that stay in L1 while every query passes over them, the sums
        // stored and reloaded between runs.
        let run = (L1_BYTES / (4 * d).max(1)).max(4);
        for r0 in (0..nk).step_by(run) {
            let rows = r0..nk.min(r0 + run);
            let mut i0 = 0;
            while i0 < nq {
                let mi = (nq - i0).min(4);
                let mut c = 0;
                while c < d {
                    let (width, vecs) = match d - c {
                        64.. => (64, 4),
                        16.. => (16, 1),
                        rest => (rest, 1),
                    };
                    let mask: __mmask16 = if width < 16 {
                        ((1u32 << width) - 1) as u16
                    } else {
                        !0
                    };
                    // SAFETY: rows `i0 .. i0 + mi` of `out` and `p`, values `c .. c + width` of
                    // each row and of the first `nk` value rows lie within the slices (checked by
                    // the caller); the masked forms touch only the first `width` lanes.
                    unsafe {
                        match (mi, vecs) {
                            (4, 4) => {
                                mix_tile::<4, 4>(p, i0, nk, &rows, values, stride, out, d, c, mask)
                            }
                            (4, _) => {
                                mix_tile::<4, 1>(p, i0, nk, &rows, values, stride, out, d, c, mask)
                            }
                            (3, 4) => {
                                mix_tile::<3, 4>(p, i0, nk, &rows, values, stride, out, d, c, mask)
                            }
                            (3, _) => {
                                mix_tile::<3, 1>(p, i0, nk, &rows, values, stride, out, d, c, mask)
                            }
                            (2, 4) => {
                                mix_tile::<2, 4>(p, i0, nk, &rows, values, stride, out, d, c, mask)
                            }
                            (2, _) => {
                                mix_tile::<2, 1>(p, i0, nk, &rows, values, stride, out, d, c, mask)
                            }
                            (_, 4) => {
                                mix_tile::<1, 4>(p, i0, nk, &rows, values, stride, out, d, c, mask)
                            }
                            _ => {
                                mix_tile::<1, 1>(p, i0, nk, &rows, values, stride, out, d, c, mask)
                            }
                        }
                    }
                    c += width;
                }
                i0 += mi;
            }
        }
    }

    /// `MI` queries from `i0` by `NV` vectors of values from `c` (one vector masked to `mask`
    /// when `NV` is 1) of [`mix`], over value rows `rows` (of `nk`).
    ///
    /// # Safety
    /// As [`mix`], for this tile.
    #[target_feature(enable = "avx512f")]
    #[inline]
    #[allow(clippy::too_many_arguments)]
    unsafe fn mix_tile<const MI: usize, const NV: usize>(
        p: &[f32],
        i0: usize,
        nk: usize,
        rows: &std::ops::Range<usize>,
        values: &[f32],
        stride: usize,
        out: &mut [f32],
        d: usize,
        c: usize,
        mask: __mmask16,
    ) {
        let o = out.as_mut_ptr();
        // SAFETY: the tile's sums lie within `out` and its rows within `p` and `values`
        // (the caller); masked lanes are neither read nor written.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); NV]; MI];
            for (i, acc) in acc.iter_mut().enumerate() {
                for (v, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm512_maskz_loadu_ps(mask, o.add((i0 + i) * d + c + 16 * v));
                }
            }
            for j in rows.clone() {
                let row = values.as_ptr().add(j * stride + c);
                let vv: [__m512; NV] =
                    std::array::from_fn(|v| _mm512_maskz_loadu_ps(mask, row.add(16 * v)));
                for (i, acc) in acc.iter_mut().enumerate() {
                    let w = _mm512_set1_ps(*p.get_unchecked((i0 + i) * nk + j));
                    for v in 0..NV {
                        acc[v] = _mm512_fmadd_ps(w, vv[v], acc[v]);
                    }
                }
            }
            for (i, acc) in acc.iter().enumerate() {
                for (v, acc) in acc.iter().enumerate() {
                    _mm512_mask_storeu_ps(o.add((i0 + i) * d + c + 16 * v), mask, *acc);
                }
            }
        }
    }

    /// [`super::exp`] of sixteen values, operation for operation.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn exp16(x: __m512) -> __m512 {
        let x = _mm512_min_ps(
            _mm512_max_ps(x, _mm512_set1_ps(EXP_MIN)),
            _mm512_set1_ps(EXP_MAX),
        );
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
        );
        let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HI), x);
        let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_LO), r);
        let mut p = _mm512_set1_ps(POLY[0]);
        for &c in &POLY[1..] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let y = _mm512_add_ps(
            _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r),
            _mm512_set1_ps(1.0),
        );
        let e = _mm512_slli_epi32::<23>(_mm512_add_epi32(
            _mm512_cvtps_epi32(n),
            _mm512_set1_epi32(127),
        ));
        _mm512_mul_ps(y, _mm512_castsi512_ps(e))
    }

    /// [`super::max`] compiled for AVX-512.
    ///
    /// # Safety
    /// AVX-512 F must be available.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn max_avx512(x: &[f32], init: f32) -> f32 {
        super::max_body(x, init)
    }

    /// [`super::exp_shifted`] on AVX-512.
    ///
    /// # Safety
    /// AVX-512 F must be available.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn exp_shifted_avx512(x: &mut [f32], shift: f32) -> f32 {
        let whole = x.len() - x.len() % SUM_LANES;
        let s = _mm512_set1_ps(shift);
        let mut acc = _mm512_setzero_ps();
        for chunk in x[..whole].chunks_exact_mut(SUM_LANES) {
            // SAFETY: the chunk holds 16 floats.
            unsafe {
                let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(chunk.as_ptr()), s));
                _mm512_storeu_ps(chunk.as_mut_ptr(), e);
                acc = _mm512_add_ps(acc, e);
            }
        }
        let mut lanes = [0.0f32; SUM_LANES];
        // SAFETY: `lanes` holds 16 floats.
        unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), acc) };
        tail_sum(lanes, &mut x[whole..], shift)
    }

    /// [`super::exp`] of eight values, operation for operation.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn exp8(x: __m256) -> __m256 {
        let x = _mm256_min_ps(
            _mm256_max_ps(x, _mm256_set1_ps(EXP_MIN)),
            _mm256_set1_ps(EXP_MAX),
        );
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
        );
        let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), x);
        let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
        let mut p = _mm256_set1_ps(POLY[0]);
        for &c in &POLY[1..] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let y = _mm256_add_ps(
            _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
            _mm256_set1_ps(1.0),
        );
        let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        ));
        _mm256_mul_ps(y, _mm256_castsi256_ps(e))
    }

    /// [`super::exp_shifted`] on AVX2: the sixteen lanes as two registers.
    ///
    /// # Safety
    /// AVX2 and FMA must be available.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn exp_shifted_avx2(x: &mut [f32], shift: f32) -> f32 {
        let whole = x.len() - x.len() % SUM_LANES;
        let s = _mm256_set1_ps(shift);
        let mut acc = [_mm256_setzero_ps(); 2];
        for chunk in x[..whole].chunks_exact_mut(SUM_LANES) {
            for (h, acc) in acc.iter_mut().enumerate() {
                // SAFETY: the chunk holds 16 floats: 8 at `8 h`.
                unsafe {
                    let at = chunk.as_mut_ptr().add(8 * h);
                    let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(at), s));
                    _mm256_storeu_ps(at, e);
                    *acc = _mm256_add_ps(*acc, e);
                }
            }
        }
        let mut lanes = [0.0f32; SUM_LANES];
        // SAFETY: `lanes` holds 16 floats: two stores of 8.
        unsafe {
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc[0]);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8), acc[1]);
        }
        tail_sum(lanes, &mut x[whole..], shift)
    }
}

#[cfg(test)]
mod tests;
