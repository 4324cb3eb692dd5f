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
}
