//! f32 vector primitives for the parts of a model step that stay in f32 (attention scores
//! and weighted sums over the KV cache, the generic ggml path), vectorised for AVX2 where the
//! CPU has it.
//!
//! Eight independent partial sums let the compiler vectorise without reassociation flags; the
//! same code compiled with AVX2 enabled is the fast path and without it the portable one, so
//! the two differ only in instruction width, not in the order of additions.

use crate::Isa;

/// `Σ a[i] · b[i]` over the common length.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    dot_with(Isa::selected(), a, b)
}

/// [`dot`] on `isa` (capped to what the CPU has).
pub fn dot_with(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa.min(crate::isa::detected()) >= Isa::Avx2 {
        // SAFETY: the CPU has AVX2 (checked above).
        return unsafe { dot_avx2(a, b) };
    }
    let _ = isa;
    dot_lanes(a, b)
}

/// `y[i] += alpha · x[i]` over the common length.
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if Isa::selected() >= Isa::Avx2 {
        // SAFETY: `Isa::Avx2` or better is only selected when the CPU has AVX2.
        unsafe { axpy_avx2(alpha, x, y) };
        return;
    }
    axpy_lanes(alpha, x, y);
}

/// `out[j] = x · rows[j · stride ..][.. x.len()]` for every `j < out.len()`: one query
/// against many keys of an attention cache, whose rows lie `stride` values apart.
///
/// Each row's products are summed in eight lanes, then the lanes first to last, then the
/// tail, as in [`dot`], but each product is fused into its sum (one rounding, and one
/// instruction where [`dot`] takes two: the prefill of a 512-token prompt spent 31% of its
/// time in these two attention kernels, 2026-11-28). Every path gives the same bits (the
/// portable one through `f32::mul_add`); one call per query instead of per key saves the
/// dispatch and keeps the query in registers.
///
/// # Panics
/// If the last row ends past `rows`.
pub fn dot_rows(x: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
    check_rows(x.len(), rows.len(), stride, out.len());
    #[cfg(target_arch = "x86_64")]
    if Isa::selected() >= Isa::Avx2 {
        // SAFETY: `Isa::Avx2` or better is only selected when the CPU has AVX2 and FMA.
        unsafe { dot_rows_avx2(x, rows, stride, out) };
        return;
    }
    dot_rows_lanes(x, rows, stride, out);
}

/// `y += Σ_j alpha[j] · rows[j · stride ..][.. y.len()]`: the weighted sum of an attention
/// cache's value rows.
///
/// The sum over `j` is formed in order, starting from zero, each product fused into it
/// (as in [`dot_rows`]), and added to `y` once; every path gives the same bits. `y` stays in
/// registers across the rows instead of being loaded and stored for each.
///
/// # Panics
/// If the last row ends past `rows`.
pub fn axpy_rows(alpha: &[f32], rows: &[f32], stride: usize, y: &mut [f32]) {
    check_rows(y.len(), rows.len(), stride, alpha.len());
    #[cfg(target_arch = "x86_64")]
    if Isa::selected() >= Isa::Avx2 {
        // SAFETY: `Isa::Avx2` or better is only selected when the CPU has AVX2 and FMA.
        unsafe { axpy_rows_avx2(alpha, rows, stride, y) };
        return;
    }
    axpy_rows_lanes(alpha, rows, stride, y);
}

/// [`dot_rows`] for two queries against the same rows, in one pass over them: query heads
/// that share a key head read its keys once (half the cache traffic of two calls). Each
/// output is bit for bit what [`dot_rows`] gives its query alone.
///
/// # Panics
/// If the queries' widths or the outputs' lengths differ, or the last row ends past `rows`.
pub fn dot_rows2(x: [&[f32]; 2], rows: &[f32], stride: usize, out: [&mut [f32]; 2]) {
    assert!(
        x[0].len() == x[1].len() && out[0].len() == out[1].len(),
        "two queries of {} and {} values, outputs of {} and {}",
        x[0].len(),
        x[1].len(),
        out[0].len(),
        out[1].len()
    );
    check_rows(x[0].len(), rows.len(), stride, out[0].len());
    #[cfg(target_arch = "x86_64")]
    if Isa::selected() >= Isa::Avx2 {
        // SAFETY: `Isa::Avx2` or better is only selected when the CPU has AVX2 and FMA.
        unsafe { dot_rows2_avx2(x, rows, stride, out) };
        return;
    }
    let [o0, o1] = out;
    dot_rows_lanes(x[0], rows, stride, o0);
    dot_rows_lanes(x[1], rows, stride, o1);
}

/// `sums[q] += Σ_j alpha[q][j] · rows[j]` for two sets of weights over the same rows, in one
/// pass over them (the value rows two query heads share), each product fused into the
/// running sum in order of `j`: [`axpy_rows`]'s sum, continued from `sums`. Called over
/// consecutive blocks of rows with zeroed sums, then added to `y`, it gives [`axpy_rows`]'s
/// bits (so a cache's rows can be walked in blocks that stay in cache).
///
/// # Panics
/// If the weights' counts or the sums' widths differ, or the last row ends past `rows`.
pub fn axpy_rows2(alpha: [&[f32]; 2], rows: &[f32], stride: usize, sums: [&mut [f32]; 2]) {
    assert!(
        alpha[0].len() == alpha[1].len() && sums[0].len() == sums[1].len(),
        "two weight sets of {} and {}, sums of {} and {}",
        alpha[0].len(),
        alpha[1].len(),
        sums[0].len(),
        sums[1].len()
    );
    check_rows(sums[0].len(), rows.len(), stride, alpha[0].len());
    #[cfg(target_arch = "x86_64")]
    if Isa::selected() >= Isa::Avx512 {
        // SAFETY: `Isa::Avx512` or better is only selected when the CPU has AVX-512 F.
        unsafe { axpy_rows2_avx512(alpha, rows, stride, sums) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if Isa::selected() >= Isa::Avx2 {
        // SAFETY: `Isa::Avx2` or better is only selected when the CPU has AVX2 and FMA.
        unsafe { axpy_rows2_avx2(alpha, rows, stride, sums) };
        return;
    }
    axpy_rows2_lanes(alpha, rows, stride, sums);
}

fn check_rows(width: usize, len: usize, stride: usize, n_rows: usize) {
    if n_rows > 0 {
        let end = (n_rows - 1) * stride + width;
        assert!(
            end <= len,
            "{n_rows} rows of {width} values, {stride} apart, need {end} values, got {len}"
        );
    }
}

#[inline(always)]
fn dot_rows_lanes(x: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
    let n = x.len();
    for (j, o) in out.iter_mut().enumerate() {
        *o = dot_fused_lanes(x, &rows[j * stride..j * stride + n]);
    }
}

/// [`dot_lanes`] with each product fused into its sum: one row of [`dot_rows`].
#[inline(always)]
fn dot_fused_lanes(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail = fused_tail(ac.remainder(), bc.remainder());
    for (a8, b8) in ac.zip(bc) {
        for l in 0..8 {
            acc[l] = a8[l].mul_add(b8[l], acc[l]);
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// The products past the last whole chunk of eight, fused into one sum in order.
#[inline(always)]
fn fused_tail(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0.0, |s, (x, y)| x.mul_add(*y, s))
}

/// Values of `y` summed at once: eight vectors of eight, within AVX2's sixteen registers.
const AXPY_CHUNK: usize = 64;

#[inline(always)]
fn axpy_rows_lanes(alpha: &[f32], rows: &[f32], stride: usize, y: &mut [f32]) {
    // Whole chunks at a fixed size, so that the sums stay in registers: with the width known
    // only at run time they lived on the stack, each row's add waiting on the last one's
    // store (the prefill's costliest loop, 2026-11-28).
    let mut c = 0;
    while c + AXPY_CHUNK <= y.len() {
        let mut acc = [0.0f32; AXPY_CHUNK];
        for (j, &a) in alpha.iter().enumerate() {
            let r: &[f32; AXPY_CHUNK] = rows[j * stride + c..][..AXPY_CHUNK]
                .try_into()
                .expect("a whole chunk");
            for (s, &v) in acc.iter_mut().zip(r) {
                *s = a.mul_add(v, *s);
            }
        }
        for (yi, s) in y[c..c + AXPY_CHUNK].iter_mut().zip(&acc) {
            *yi += s;
        }
        c += AXPY_CHUNK;
    }
    while c < y.len() {
        let w = (y.len() - c).min(AXPY_CHUNK);
        let mut acc = [0.0f32; AXPY_CHUNK];
        for (j, &a) in alpha.iter().enumerate() {
            let r = &rows[j * stride + c..j * stride + c + w];
            for (s, &v) in acc[..w].iter_mut().zip(r) {
                *s = a.mul_add(v, *s);
            }
        }
        for (yi, s) in y[c..c + w].iter_mut().zip(&acc) {
            *yi += s;
        }
        c += w;
    }
}

/// Values of each `y` summed at once by [`axpy_rows2_lanes`]: two sets of four vectors of
/// eight, as many registers as [`axpy_rows_lanes`] takes for one.
const AXPY2_CHUNK: usize = 32;

/// [`axpy_rows_lanes`]' sums for two sets of weights, continued from `sums`: every value gets
/// the same operations in the same order (the chunk width changes which values are summed
/// together, not how).
#[inline(always)]
fn axpy_rows2_lanes(alpha: [&[f32]; 2], rows: &[f32], stride: usize, sums: [&mut [f32]; 2]) {
    let [y0, y1] = sums;
    let mut c = 0;
    while c < y0.len() {
        let w = (y0.len() - c).min(AXPY2_CHUNK);
        let mut acc = [[0.0f32; AXPY2_CHUNK]; 2];
        acc[0][..w].copy_from_slice(&y0[c..c + w]);
        acc[1][..w].copy_from_slice(&y1[c..c + w]);
        if w == AXPY2_CHUNK {
            for (j, (&a0, &a1)) in alpha[0].iter().zip(alpha[1]).enumerate() {
                let r: &[f32; AXPY2_CHUNK] = rows[j * stride + c..][..AXPY2_CHUNK]
                    .try_into()
                    .expect("a whole chunk");
                for (l, &v) in r.iter().enumerate() {
                    acc[0][l] = a0.mul_add(v, acc[0][l]);
                    acc[1][l] = a1.mul_add(v, acc[1][l]);
                }
            }
        } else {
            for (j, (&a0, &a1)) in alpha[0].iter().zip(alpha[1]).enumerate() {
                let r = &rows[j * stride + c..j * stride + c + w];
                for (l, &v) in r.iter().enumerate() {
                    acc[0][l] = a0.mul_add(v, acc[0][l]);
                    acc[1][l] = a1.mul_add(v, acc[1][l]);
                }
            }
        }
        y0[c..c + w].copy_from_slice(&acc[0][..w]);
        y1[c..c + w].copy_from_slice(&acc[1][..w]);
        c += w;
    }
}

#[inline(always)]
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (a8, b8) in ac.zip(bc) {
        for l in 0..8 {
            acc[l] += a8[l] * b8[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[inline(always)]
fn axpy_lanes(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

/// [`dot_lanes`] compiled with AVX2 and FMA enabled.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes(a, b)
}

/// [`axpy_lanes`] compiled with AVX2 and FMA enabled.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn axpy_avx2(alpha: f32, x: &[f32], y: &mut [f32]) {
    axpy_lanes(alpha, x, y);
}

/// [`dot_rows_lanes`] on AVX2, four rows side by side: each row's sum is one chain of
/// dependent adds, so four interleaved chains keep the adder busy where one would wait on
/// its latency. Every row sees the same multiplications and additions in the same order as
/// in [`dot_lanes`] (separate multiply and add, lanes summed first to last, then the tail),
/// so the results are bit for bit those of [`dot`].
///
/// # Safety
/// The CPU must support AVX2 and FMA; the rows lie within `rows` ([`check_rows`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_rows_avx2(x: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = x.len();
    let whole = n - n % 8;
    let groups = out.len() / 4;
    for g in 0..groups {
        let at: [usize; 4] = std::array::from_fn(|i| (4 * g + i) * stride);
        let mut acc = [_mm256_setzero_ps(); 4];
        for c in (0..whole).step_by(8) {
            // SAFETY: `c + 8 <= n`, and each row `at[i] .. at[i] + n` lies within `rows`
            // (the caller checked the last one; the others end before it).
            unsafe {
                let xv = _mm256_loadu_ps(x.as_ptr().add(c));
                for (a, &r) in acc.iter_mut().zip(&at) {
                    let rv = _mm256_loadu_ps(rows.as_ptr().add(r + c));
                    *a = _mm256_fmadd_ps(xv, rv, *a);
                }
            }
        }
        for i in 0..4 {
            let mut lanes = [0.0f32; 8];
            // SAFETY: `lanes` holds 8 f32; unaligned store.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc[i]) };
            let tail = fused_tail(&x[whole..], &rows[at[i] + whole..at[i] + n]);
            out[4 * g + i] = lanes.iter().sum::<f32>() + tail;
        }
    }
    for j in 4 * groups..out.len() {
        out[j] = dot_fused_lanes(x, &rows[j * stride..j * stride + n]);
    }
}

/// [`axpy_rows_lanes`] compiled with AVX2 and FMA enabled.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn axpy_rows_avx2(alpha: &[f32], rows: &[f32], stride: usize, y: &mut [f32]) {
    axpy_rows_lanes(alpha, rows, stride, y);
}

/// [`dot_rows_avx2`] for two queries: four rows at a time, each row loaded once for both.
/// Every (query, row) pair sees the operations of [`dot_rows_avx2`] in its order.
///
/// # Safety
/// The CPU must support AVX2 and FMA; the rows lie within `rows` ([`check_rows`]); the
/// queries have the same width and the outputs the same length.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_rows2_avx2(x: [&[f32]; 2], rows: &[f32], stride: usize, out: [&mut [f32]; 2]) {
    use std::arch::x86_64::*;
    let n = x[0].len();
    let whole = n - n % 8;
    let groups = out[0].len() / 4;
    let [o0, o1] = out;
    for g in 0..groups {
        let at: [usize; 4] = std::array::from_fn(|i| (4 * g + i) * stride);
        let mut acc = [[_mm256_setzero_ps(); 4]; 2];
        for c in (0..whole).step_by(8) {
            // SAFETY: `c + 8 <= n` for both queries, and each row `at[i] .. at[i] + n` lies
            // within `rows` (the caller checked the last one; the others end before it).
            unsafe {
                let xv = [
                    _mm256_loadu_ps(x[0].as_ptr().add(c)),
                    _mm256_loadu_ps(x[1].as_ptr().add(c)),
                ];
                for (i, &r) in at.iter().enumerate() {
                    let rv = _mm256_loadu_ps(rows.as_ptr().add(r + c));
                    acc[0][i] = _mm256_fmadd_ps(xv[0], rv, acc[0][i]);
                    acc[1][i] = _mm256_fmadd_ps(xv[1], rv, acc[1][i]);
                }
            }
        }
        // The eight sums' lanes, first to last: a transpose, then seven vector adds.
        let sums = lane_sums([
            acc[0][0], acc[0][1], acc[0][2], acc[0][3], acc[1][0], acc[1][1], acc[1][2], acc[1][3],
        ]);
        let mut v = [0.0f32; 8];
        // SAFETY: `v` holds 8 f32; unaligned store.
        unsafe { _mm256_storeu_ps(v.as_mut_ptr(), sums) };
        for (q, o) in [&mut *o0, &mut *o1].into_iter().enumerate() {
            for i in 0..4 {
                let tail = match whole < n {
                    true => fused_tail(&x[q][whole..], &rows[at[i] + whole..at[i] + n]),
                    false => 0.0,
                };
                o[4 * g + i] = v[4 * q + i] + tail;
            }
        }
    }
    for j in 4 * groups..o0.len() {
        let row = &rows[j * stride..j * stride + n];
        o0[j] = dot_fused_lanes(x[0], row);
        o1[j] = dot_fused_lanes(x[1], row);
    }
}

/// Lane `k` of the result: the lanes of `acc[k]` summed first to last, as
/// `lanes.iter().sum()` adds them (its start, `-0.0`, leaves the first lane as it is).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
fn lane_sums(acc: [std::arch::x86_64::__m256; 8]) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // 8x8 transpose: t[l] holds lane `l` of every accumulator.
    let [a0, a1, a2, a3, a4, a5, a6, a7] = acc;
    let (u0, u1) = (_mm256_unpacklo_ps(a0, a1), _mm256_unpackhi_ps(a0, a1));
    let (u2, u3) = (_mm256_unpacklo_ps(a2, a3), _mm256_unpackhi_ps(a2, a3));
    let (u4, u5) = (_mm256_unpacklo_ps(a4, a5), _mm256_unpackhi_ps(a4, a5));
    let (u6, u7) = (_mm256_unpacklo_ps(a6, a7), _mm256_unpackhi_ps(a6, a7));
    let s0 = _mm256_shuffle_ps::<0x44>(u0, u2);
    let s1 = _mm256_shuffle_ps::<0xee>(u0, u2);
    let s2 = _mm256_shuffle_ps::<0x44>(u1, u3);
    let s3 = _mm256_shuffle_ps::<0xee>(u1, u3);
    let s4 = _mm256_shuffle_ps::<0x44>(u4, u6);
    let s5 = _mm256_shuffle_ps::<0xee>(u4, u6);
    let s6 = _mm256_shuffle_ps::<0x44>(u5, u7);
    let s7 = _mm256_shuffle_ps::<0xee>(u5, u7);
    let t = [
        _mm256_permute2f128_ps::<0x20>(s0, s4),
        _mm256_permute2f128_ps::<0x20>(s1, s5),
        _mm256_permute2f128_ps::<0x20>(s2, s6),
        _mm256_permute2f128_ps::<0x20>(s3, s7),
        _mm256_permute2f128_ps::<0x31>(s0, s4),
        _mm256_permute2f128_ps::<0x31>(s1, s5),
        _mm256_permute2f128_ps::<0x31>(s2, s6),
        _mm256_permute2f128_ps::<0x31>(s3, s7),
    ];
    t[1..].iter().fold(t[0], |s, &l| _mm256_add_ps(s, l))
}

/// [`axpy_rows2_lanes`] on AVX-512: 64 values of each sum at once in sixteen-lane registers
/// (every value still gets its own sum, in the same order: lanes never meet).
///
/// # Safety
/// The CPU must support AVX-512 F; the rows lie within `rows` ([`check_rows`]); the weight
/// sets have the same count and the outputs the same width.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn axpy_rows2_avx512(
    alpha: [&[f32]; 2],
    rows: &[f32],
    stride: usize,
    sums: [&mut [f32]; 2],
) {
    use std::arch::x86_64::*;
    const CHUNK: usize = 64;
    let width = sums[0].len();
    let whole = width - width % CHUNK;
    let [y0, y1] = sums;
    for c in (0..whole).step_by(CHUNK) {
        // SAFETY: `c + 64 <= width` values of each sum.
        let mut acc: [[__m512; 4]; 2] = unsafe {
            std::array::from_fn(|q| {
                let y = if q == 0 { &*y0 } else { &*y1 };
                std::array::from_fn(|v| _mm512_loadu_ps(y.as_ptr().add(c + 16 * v)))
            })
        };
        for (j, (&a0, &a1)) in alpha[0].iter().zip(alpha[1]).enumerate() {
            let (a0, a1) = (_mm512_set1_ps(a0), _mm512_set1_ps(a1));
            let [s0, s1] = &mut acc;
            for (v, (s0, s1)) in s0.iter_mut().zip(s1).enumerate() {
                // SAFETY: `c + 64 <= width`, and row `j` holds `width` values from
                // `j * stride` within `rows` (the caller checked the last row).
                let r = unsafe { _mm512_loadu_ps(rows.as_ptr().add(j * stride + c + 16 * v)) };
                *s0 = _mm512_fmadd_ps(a0, r, *s0);
                *s1 = _mm512_fmadd_ps(a1, r, *s1);
            }
        }
        for (y, acc) in [&mut *y0, &mut *y1].into_iter().zip(&acc) {
            for (v, s) in acc.iter().enumerate() {
                // SAFETY: `c + 16 v + 16 <= width` values of the sum.
                unsafe { _mm512_storeu_ps(y.as_mut_ptr().add(c + 16 * v), *s) };
            }
        }
    }
    if whole < width {
        // With no rows at all there is nothing to read.
        let rest = rows.get(whole..).unwrap_or_default();
        let tail = [&mut y0[whole..], &mut y1[whole..]];
        axpy_rows2_lanes(alpha, rest, stride, tail);
    }
}

/// [`axpy_rows2_lanes`] compiled with AVX2 and FMA enabled.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn axpy_rows2_avx2(alpha: [&[f32]; 2], rows: &[f32], stride: usize, sums: [&mut [f32]; 2]) {
    axpy_rows2_lanes(alpha, rows, stride, sums);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_matches_plain_sums() {
        for n in [0, 1, 7, 8, 9, 128, 131] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            for isa in Isa::available() {
                let got = dot_with(isa, &a, &b);
                assert!(
                    (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "{isa:?} n {n}"
                );
            }
            let mut y = b.clone();
            axpy(0.5, &a, &mut y);
            for i in 0..n {
                assert_eq!(y[i], b[i] + 0.5 * a[i], "axpy n {n} at {i}");
            }
        }
    }

    /// The row kernels: the same bits on the vector and portable paths, and close to plain
    /// sums, on ragged widths (below, at and past one register chunk), strides wider than a
    /// row, and zero rows.
    #[test]
    fn row_kernels_equal_per_row_calls() {
        for width in [1, 7, 8, 64, 72, 128, 131] {
            for n_rows in [0, 1, 3, 17] {
                let stride = width + 5;
                let len = n_rows * stride;
                let rows: Vec<f32> = (0..len).map(|i| (i as f32 * 0.013).sin()).collect();
                let x: Vec<f32> = (0..width).map(|i| (i as f32 * 0.7).cos()).collect();
                let alpha: Vec<f32> = (0..n_rows).map(|j| 0.1 + j as f32 * 0.03).collect();
                let mut scores = vec![f32::NAN; n_rows];
                dot_rows(&x, &rows, stride, &mut scores);
                let mut portable = vec![f32::NAN; n_rows];
                dot_rows_lanes(&x, &rows, stride, &mut portable);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&scores), bits(&portable), "dot_rows width {width}");
                let mut y = vec![0.0f32; width];
                axpy_rows(&alpha, &rows, stride, &mut y);
                let mut portable = vec![0.0f32; width];
                axpy_rows_lanes(&alpha, &rows, stride, &mut portable);
                assert_eq!(bits(&y), bits(&portable), "axpy_rows width {width}");
                // Both against plain sums in f64.
                let mut want_y = vec![0.0f64; width];
                for j in 0..n_rows {
                    let r = &rows[j * stride..j * stride + width];
                    let want: f64 = x.iter().zip(r).map(|(a, b)| f64::from(a * b)).sum();
                    let close = (f64::from(scores[j]) - want).abs() <= 1e-5 * (1.0 + want.abs());
                    assert!(
                        close,
                        "dot_rows width {width} row {j}: {} vs {want}",
                        scores[j]
                    );
                    for (w, &v) in want_y.iter_mut().zip(r) {
                        *w += f64::from(alpha[j]) * f64::from(v);
                    }
                }
                for (g, w) in y.iter().zip(&want_y) {
                    assert!(
                        (f64::from(*g) - w).abs() <= 1e-5 * (1.0 + w.abs()),
                        "axpy_rows"
                    );
                }
            }
        }
    }

    /// A two-weight-set kernel with its stride bound: weights, rows, sums.
    type TwoRows<'a> = dyn Fn([&[f32]; 2], &[f32], [&mut [f32]; 2]) + 'a;

    /// The two-query kernels: each query's results the same bits as the one-query kernels
    /// give it, on every path, on ragged widths, row counts around the four-row groups and
    /// the 32-value chunks, and zero rows.
    #[test]
    fn two_query_row_kernels_equal_two_calls() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for width in [1, 7, 8, 33, 64, 72, 128, 131] {
            for n_rows in [0, 1, 3, 4, 5, 17] {
                let stride = width + 3;
                let rows: Vec<f32> = (0..n_rows * stride)
                    .map(|i| (i as f32 * 0.029).sin())
                    .collect();
                let x: [Vec<f32>; 2] = std::array::from_fn(|q| {
                    (0..width)
                        .map(|i| ((i + 7 * q) as f32 * 0.3).cos())
                        .collect()
                });
                let alpha: [Vec<f32>; 2] = std::array::from_fn(|q| {
                    (0..n_rows).map(|j| 0.2 - (j + q) as f32 * 0.07).collect()
                });
                let mut s = [vec![f32::NAN; n_rows], vec![f32::NAN; n_rows]];
                let [s0, s1] = &mut s;
                dot_rows2([&x[0], &x[1]], &rows, stride, [s0, s1]);
                // The sums over two blocks of rows (the second may be empty), then added.
                let split = n_rows / 2;
                let (a0, a1) = (alpha[0].split_at(split), alpha[1].split_at(split));
                let sums_of = |two: &TwoRows<'_>| {
                    let mut s = [vec![0.0f32; width], vec![0.0f32; width]];
                    let [s0, s1] = &mut s;
                    two([a0.0, a1.0], &rows, [s0, s1]);
                    let [s0, s1] = &mut s;
                    two([a0.1, a1.1], &rows[split * stride..], [s0, s1]);
                    let base = [0.5f32, -0.25];
                    [0, 1].map(|q| s[q].iter().map(|v| base[q] + v).collect::<Vec<f32>>())
                };
                let y = sums_of(&|a, r, s| axpy_rows2(a, r, stride, s));
                let p = sums_of(&|a, r, s| axpy_rows2_lanes(a, r, stride, s));
                for q in 0..2 {
                    let mut want = vec![f32::NAN; n_rows];
                    dot_rows(&x[q], &rows, stride, &mut want);
                    let what = format!("width {width}, {n_rows} rows, query {q}");
                    assert_eq!(bits(&s[q]), bits(&want), "dot_rows2 {what}");
                    let mut want = vec![[0.5f32, -0.25][q]; width];
                    axpy_rows(&alpha[q], &rows, stride, &mut want);
                    assert_eq!(bits(&y[q]), bits(&want), "axpy_rows2 {what}");
                    assert_eq!(bits(&p[q]), bits(&want), "axpy_rows2 portable {what}");
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "need")]
    fn row_kernels_refuse_rows_past_the_end() {
        let mut out = [0.0f32; 3];
        dot_rows(&[1.0; 8], &[0.0; 20], 8, &mut out);
    }
}
