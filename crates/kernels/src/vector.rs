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

    #[test]
    #[should_panic(expected = "need")]
    fn row_kernels_refuse_rows_past_the_end() {
        let mut out = [0.0f32; 3];
        dot_rows(&[1.0; 8], &[0.0; 20], 8, &mut out);
    }
}
