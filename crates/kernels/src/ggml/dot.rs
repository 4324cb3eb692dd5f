//! Int8 dot products between unpacked weight rows (`super::unpack`) and activations
//! quantized per 32 values, on AVX2 or in portable Rust.
//!
//! Activations ([`Q8Rows`]) hold, per token, int8 values with one f32 scale `s` per 32 and,
//! per 16, `s · Σ q` (the term a weight min multiplies). A weight row holds int8 values with
//! a scale `d` and a min `m` per 16. Then
//!
//! `w · x = Σ_32-blocks s_b Σ_units d_u Σ q_w q_x + Σ_units m_u (s_b Σ q_x)`
//!
//! The inner sums are exact in integers; only the scales are applied in f32. ggml rounds
//! activations to int8 the same way for its quantized matmuls (`Q8_0`, `Q8_K`), so the
//! results sit as close to llama.cpp's as two int8 roundings can. A key design decision:
//! one activation block of 32 for every weight type (ggml uses 256 for k-quants), which
//! rounds more finely and lets rows whose length is not a multiple of 256 (Q8_0, Q4_0 ...)
//! share the code.

// Block layouts read best as index loops over the positions ggml's headers name.
#![allow(clippy::needless_range_loop)]

use crate::Isa;
use crate::buf::{AlignedBuf, SharedMut};
use crate::parallel_for;

use super::unpack::UNIT;

/// Activation values per scale for weights in blocks of 32.
pub(crate) const QBLOCK: usize = 32;

/// The order a [`Q8Rows`] row's int8 values lie in. Scales and sums are always in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Q8Layout {
    /// In order.
    Natural,
    /// Within every 128 values, their quarters in the order 0, 2, 1, 3: what the low nibbles,
    /// then the high nibbles, of 64 consecutive Q4_K or Q5_K value bytes hold (the two halves
    /// of two 64-value chunks), so that one 64-byte load of a block's values meets the
    /// activations of two `vpdpbusd` as they lie (the AVX-512 VNNI row-dot kernels of those
    /// types; rows of a multiple of 128 values).
    NibblePairs,
}

impl Q8Layout {
    /// Where value `p` of a row lies.
    pub(crate) fn position(self, p: usize) -> usize {
        match self {
            Q8Layout::Natural => p,
            Q8Layout::NibblePairs => {
                const QUARTER_AT: [usize; 4] = [0, 2, 1, 3];
                p / 128 * 128 + QUARTER_AT[p % 128 / 32] * 32 + p % 32
            }
        }
    }
}

/// `m` rows of `k` activations quantized for the int8 kernels.
pub(crate) struct Q8Rows {
    pub k: usize,
    m: usize,
    block: usize,
    layout: Q8Layout,
    /// `[m, k]` int8 values in `layout`, 32-byte aligned rows.
    q: AlignedBuf,
    /// `[m, k / 32]` scales (equal within a 256-value block when `block` is 256).
    s: Vec<f32>,
    /// `[m, k / 16]`: `s · Σ q` over each unit.
    sums: Vec<f32>,
    /// `[m, k / 16]`: `Σ q` over each unit (what the in-register kernels multiply by a
    /// block's integer mins and offsets).
    isums: Vec<i16>,
}

impl Q8Rows {
    /// Quantizes rows `row(0) .. row(m - 1)` (each `k` values, `k` a multiple of `block`)
    /// with one scale per `block` values: 32, or 256 for weights in 256-value blocks, whose
    /// kernels then apply a block's integer sub-scales before converting to f32 once per
    /// block (ggml's `Q8_K`); the values lie in `layout`. Prompts' rows are quantized on the
    /// pool: done on the calling thread alone, they left the other cores waiting for a tenth
    /// of a prefill.
    pub(crate) fn quantize<'x>(
        k: usize,
        block: usize,
        layout: Q8Layout,
        m: usize,
        row: impl Fn(usize) -> &'x [f32] + Sync,
    ) -> Q8Rows {
        debug_assert!(block.is_multiple_of(QBLOCK) && k.is_multiple_of(block));
        assert!(
            layout == Q8Layout::Natural || k.is_multiple_of(128),
            "{layout:?} activations need rows of a multiple of 128 values, not {k}"
        );
        let mut q = AlignedBuf::zeroed(m * k);
        let mut s = vec![0.0f32; m * k / QBLOCK];
        let mut sums = vec![0.0f32; m * k / UNIT];
        let mut isums = vec![0i16; m * k / UNIT];
        let (q_w, s_w) = (SharedMut::new(q.as_mut_slice()), SharedMut::new(&mut s));
        let (sums_w, isums_w) = (SharedMut::new(&mut sums), SharedMut::new(&mut isums));
        let per_task = QUANTIZE_ROWS_PER_TASK;
        parallel_for(m.div_ceil(per_task), |task| {
            for r in task * per_task..((task + 1) * per_task).min(m) {
                // SAFETY: row `r` of each buffer is written by this task alone.
                let (qr, sr, sumr, isumr) = unsafe {
                    (
                        q_w.part(r * k, k),
                        s_w.part(r * k / QBLOCK, k / QBLOCK),
                        sums_w.part(r * k / UNIT, k / UNIT),
                        isums_w.part(r * k / UNIT, k / UNIT),
                    )
                };
                quantize_row(row(r), block, qr, sr, sumr, isumr);
                if layout == Q8Layout::NibblePairs {
                    for values in qr.chunks_exact_mut(128) {
                        let (first, second) = values.split_at_mut(64);
                        first[32..].swap_with_slice(&mut second[..32]);
                    }
                }
            }
        });
        Q8Rows {
            k,
            m,
            block,
            layout,
            q,
            s,
            sums,
            isums,
        }
    }

    /// Number of rows.
    pub(crate) fn rows(&self) -> usize {
        self.m
    }

    /// Values per scale.
    pub(crate) fn block(&self) -> usize {
        self.block
    }

    /// The order of the int8 values.
    pub(crate) fn layout(&self) -> Q8Layout {
        self.layout
    }

    /// Row `r`'s int8 values, in [`Self::layout`].
    pub(crate) fn q(&self, r: usize) -> &[i8] {
        let b = &self.q.as_slice()[r * self.k..(r + 1) * self.k];
        // SAFETY: i8 and u8 have the same size, alignment and every bit pattern is valid.
        unsafe { std::slice::from_raw_parts(b.as_ptr().cast(), b.len()) }
    }

    /// Row `r`'s scale per 32 values.
    pub(crate) fn s(&self, r: usize) -> &[f32] {
        &self.s[r * self.k / QBLOCK..(r + 1) * self.k / QBLOCK]
    }

    /// Row `r`'s `s · Σ q` per 16 values.
    pub(crate) fn sums(&self, r: usize) -> &[f32] {
        &self.sums[r * self.k / UNIT..(r + 1) * self.k / UNIT]
    }

    /// Row `r`'s integer sums per 16 values.
    pub(crate) fn isums(&self, r: usize) -> &[i16] {
        &self.isums[r * self.k / UNIT..(r + 1) * self.k / UNIT]
    }

    /// The value the kernels multiply at `(r, p)`, as f32 (for reference computations).
    pub(crate) fn value(&self, r: usize, p: usize) -> f32 {
        self.q(r)[self.layout.position(p)] as f32 * self.s(r)[p / QBLOCK]
    }
}

/// Rows one task of [`Q8Rows::quantize`] takes: a decode's handful stays on one thread.
const QUANTIZE_ROWS_PER_TASK: usize = 8;

/// One activation row: int8 values `q`, a scale per 32 `s`, and per 16 values `s · Σ q`
/// (`sums`) and `Σ q` (`isums`).
fn quantize_row(
    x: &[f32],
    block: usize,
    q: &mut [u8],
    s: &mut [f32],
    sums: &mut [f32],
    isums: &mut [i16],
) {
    for (b, xb) in x.chunks_exact(block).enumerate() {
        let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let scale = amax / 127.0;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        let base = b * block;
        for (u, xu) in xb.chunks_exact(UNIT).enumerate() {
            let mut unit_sum = 0i32;
            for (j, &v) in xu.iter().enumerate() {
                let qi = round_half_away(v * inv);
                q[base + u * UNIT + j] = qi as i8 as u8;
                unit_sum += qi;
            }
            sums[base / UNIT + u] = scale * unit_sum as f32;
            // |Σ q| <= 16 · 127 fits i16.
            isums[base / UNIT + u] = unit_sum as i16;
        }
        s[base / QBLOCK..(base + block) / QBLOCK].fill(scale);
    }
}

/// `v.round() as i32` (halves away from zero, as C's `roundf` that ggml uses) for
/// `|v| < 2^23`, without the library call: the truncation and the fraction are exact there.
#[inline(always)]
fn round_half_away(v: f32) -> i32 {
    let t = v as i32;
    let frac = v - t as f32;
    t + (frac >= 0.5) as i32 - (frac <= -0.5) as i32
}

/// One unpacked weight row: values, and a scale and a min per 16 (`m` empty: no mins).
pub(crate) struct WRow<'a> {
    pub q: &'a [i8],
    pub d: &'a [f32],
    pub m: &'a [f32],
}

/// `out[j] = w · x[t0 + j]` for `out.len()` consecutive activation rows from `t0`.
pub(crate) fn dot_rows(isa: Isa, w: &WRow, a: &Q8Rows, t0: usize, out: &mut [f32]) {
    assert_eq!(
        a.layout(),
        Q8Layout::Natural,
        "unpacked rows meet values in order"
    );
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        for (c, o) in out.chunks_mut(4).enumerate() {
            let t = t0 + 4 * c;
            // SAFETY: `Isa::Avx2` or better is only selected when the CPU has AVX2 and FMA.
            unsafe {
                match o.len() {
                    4 => avx2::dot::<4>(w, a, t, o),
                    3 => avx2::dot::<3>(w, a, t, o),
                    2 => avx2::dot::<2>(w, a, t, o),
                    _ => avx2::dot::<1>(w, a, t, o),
                }
            }
        }
        return;
    }
    let _ = isa;
    for (j, o) in out.iter_mut().enumerate() {
        *o = dot_portable(w, a, t0 + j);
    }
}

/// Plain twin of the AVX2 kernel: exact integer sums per unit, scales in f32.
pub(crate) fn dot_portable(w: &WRow, a: &Q8Rows, t: usize) -> f32 {
    let (aq, s) = (a.q(t), a.s(t));
    let mut acc = 0.0f32;
    for (u, (wq, xq)) in
        w.q.chunks_exact(UNIT)
            .zip(aq.chunks_exact(UNIT))
            .enumerate()
    {
        let isum: i32 = wq.iter().zip(xq).map(|(&p, &q)| p as i32 * q as i32).sum();
        acc += w.d[u] * s[u / 2] * isum as f32;
    }
    acc + min_term(w, a.sums(t))
}

/// `Σ_u m_u · s Σ q_x`: the mins' share of a dot product (zero for types without mins).
fn min_term(w: &WRow, sums: &[f32]) -> f32 {
    w.m.iter().zip(sums).map(|(m, s)| m * s).sum()
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{Q8Rows, QBLOCK, WRow, min_term};

    /// `N` dot products of one weight row with activation rows `t .. t + N`.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot<const N: usize>(w: &WRow, a: &Q8Rows, t: usize, out: &mut [f32]) {
        let k = w.q.len();
        let xq: [&[i8]; N] = std::array::from_fn(|j| a.q(t + j));
        let xs: [&[f32]; N] = std::array::from_fn(|j| a.s(t + j));
        let mut acc = [_mm256_setzero_ps(); N];
        let ones = _mm256_set1_epi16(1);
        for b in 0..k / QBLOCK {
            // SAFETY: `w.q` and every `xq[j]` hold `k` values, so 32 bytes from `32 b` are in
            // bounds; unaligned loads.
            let wv = unsafe { _mm256_loadu_si256(w.q.as_ptr().add(b * QBLOCK).cast()) };
            let wa = _mm256_abs_epi8(wv);
            // Lanes 0-3 come from unit 2 b, lanes 4-7 from unit 2 b + 1.
            let dv = _mm256_set_m128(_mm_set1_ps(w.d[2 * b + 1]), _mm_set1_ps(w.d[2 * b]));
            for j in 0..N {
                // SAFETY: as above.
                let xv = unsafe { _mm256_loadu_si256(xq[j].as_ptr().add(b * QBLOCK).cast()) };
                // |w| (unsigned) times x with w's sign: the pair sums stay within i16 since
                // |x| <= 127 and |w| <= 128.
                let p16 = _mm256_maddubs_epi16(wa, _mm256_sign_epi8(xv, wv));
                let p32 = _mm256_madd_epi16(p16, ones);
                let scale = _mm256_mul_ps(dv, _mm256_set1_ps(xs[j][b]));
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32), scale, acc[j]);
            }
        }
        for j in 0..N {
            let lo = _mm256_castps256_ps128(acc[j]);
            let hi = _mm256_extractf128_ps::<1>(acc[j]);
            let s4 = _mm_add_ps(lo, hi);
            let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
            let s1 = _mm_add_ss(s2, _mm_shuffle_ps::<1>(s2, s2));
            out[j] = _mm_cvtss_f32(s1) + min_term(w, a.sums(t + j));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> u64 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *seed >> 33
    }

    #[test]
    fn every_path_matches_the_portable_dot() {
        let mut seed = 7;
        for k in [32, 64, 96, 256, 288] {
            let wq: Vec<i8> = (0..k).map(|_| lcg(&mut seed) as u8 as i8).collect();
            let d: Vec<f32> = (0..k / UNIT)
                .map(|i| 0.01 * (i % 5) as f32 - 0.02)
                .collect();
            let m: Vec<f32> = (0..k / UNIT).map(|i| 0.003 * (i % 3) as f32).collect();
            let x: Vec<f32> = (0..7 * k)
                .map(|_| (lcg(&mut seed) % 2001) as f32 / 1000.0 - 1.0)
                .collect();
            let a = Q8Rows::quantize(k, QBLOCK, Q8Layout::Natural, 7, |r| &x[r * k..(r + 1) * k]);
            for mins in [&m[..], &[][..]] {
                let w = WRow {
                    q: &wq,
                    d: &d,
                    m: mins,
                };
                let want: Vec<f32> = (0..7).map(|t| dot_portable(&w, &a, t)).collect();
                for isa in Isa::available() {
                    let mut got = vec![f32::NAN; 7];
                    dot_rows(isa, &w, &a, 0, &mut got);
                    for (g, wv) in got.iter().zip(&want) {
                        let tol = 1e-5 * (1.0 + wv.abs());
                        assert!((g - wv).abs() <= tol, "{isa:?} k {k}: {g} vs {wv}");
                    }
                }
                // The quantized activations round within half a step of the inputs.
                for p in 0..k {
                    let step = a.s(0)[p / QBLOCK];
                    assert!((a.value(0, p) - x[p]).abs() <= 0.5 * step + 1e-7);
                }
            }
        }
    }

    /// Nibble pairs hold the same values as the natural order, each at its position: the
    /// middle quarters of every 128 swapped.
    #[test]
    fn nibble_pairs_hold_the_natural_values_moved() {
        let (k, m) = (512, 2);
        let x: Vec<f32> = (0..m * k).map(|i| (i % 97) as f32 - 48.0).collect();
        let rows = |layout| Q8Rows::quantize(k, 256, layout, m, |r| &x[r * k..(r + 1) * k]);
        let (natural, pairs) = (rows(Q8Layout::Natural), rows(Q8Layout::NibblePairs));
        for r in 0..m {
            for p in 0..k {
                let at = Q8Layout::NibblePairs.position(p);
                assert_eq!(pairs.q(r)[at], natural.q(r)[p], "row {r} value {p}");
                assert_eq!(pairs.value(r, p), natural.value(r, p));
            }
            assert_eq!(pairs.isums(r), natural.isums(r));
        }
        let moved: Vec<usize> = [0, 31, 32, 63, 64, 95, 96, 127, 128, 160]
            .map(|p| Q8Layout::NibblePairs.position(p))
            .into();
        assert_eq!(moved, [0, 31, 64, 95, 32, 63, 96, 127, 128, 192]);
    }

    /// The inlined rounding equals `f32::round` (C's `roundf`) on every halfway case and
    /// their neighbours within the int8 range, and on a sweep of ordinary values.
    #[test]
    fn rounding_matches_roundf() {
        for i in -256..=256 {
            let half = i as f32 * 0.5;
            for v in [
                half,
                f32::from_bits(half.to_bits() + 1),
                f32::from_bits(half.to_bits().saturating_sub(1)),
            ] {
                assert_eq!(round_half_away(v), v.round() as i32, "{v:e}");
            }
        }
        for i in 0..100_000 {
            let v = (i as f32 * 0.002_71 - 135.0) * 0.999;
            assert_eq!(round_half_away(v), v.round() as i32, "{v:e}");
        }
    }
}
