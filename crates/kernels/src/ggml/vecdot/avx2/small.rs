//! 32-value blocks with one f16 scale (Q8_0, Q4_0, ...) against activations quantized per
//! 32: one conversion to f32 per block and token.

#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::{Q8Rows, Tokens, f16_at, hsum, load};

/// `N` tokens' products with one block of 32 signed weights `w` scaled by `d`:
/// `|w|` times `x` with `w`'s sign (pair sums stay within i16: |x| <= 127, |w| <= 128).
///
/// # Safety
/// Block `b` of 32 lies within the rows of `xt`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn signed_block<const N: usize>(
    w: __m256i,
    d: f32,
    xt: &Tokens<N>,
    b: usize,
    acc: &mut [__m256; N],
) {
    let ones = _mm256_set1_epi16(1);
    let wa = _mm256_abs_epi8(w);
    for j in 0..N {
        // SAFETY: the caller guarantees block `b` lies within the rows.
        let xv = unsafe { xt.x(j, 32 * b) };
        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wa, _mm256_sign_epi8(xv, w)), ones);
        let scale = _mm256_set1_ps(d * xt.s[j][b]);
        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc[j]);
    }
}

/// Q8_0: `{f16 d; i8 qs[32]}`.
///
/// # Safety
/// As [`q4_k_n`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q8_0_n<const N: usize>(row: &[u8], a: &Q8Rows, t: usize, out: &mut [f32]) {
    let xt = Tokens::<N>::new(a, t);
    let mut acc = [_mm256_setzero_ps(); N];
    for (b, x) in row.chunks_exact(34).enumerate() {
        // SAFETY: bytes 2..34 of the block; block `b` and the rows exist (caller).
        unsafe { signed_block(load(x.as_ptr().add(2)), f16_at(x, 0), &xt, b, &mut acc) };
    }
    for j in 0..N {
        out[j] = hsum(acc[j]);
    }
}

/// Q4_0: `{f16 d; u8 qs[16]}`, values `d · (q - 8)`, low nibbles first.
///
/// # Safety
/// As [`q4_k_n`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_0_n<const N: usize>(row: &[u8], a: &Q8Rows, t: usize, out: &mut [f32]) {
    let xt = Tokens::<N>::new(a, t);
    let (m4, eight) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(8));
    let mut acc = [_mm256_setzero_ps(); N];
    for (b, x) in row.chunks_exact(18).enumerate() {
        // SAFETY: bytes 2..18 of the 18-byte block.
        let q = unsafe { _mm_loadu_si128(x.as_ptr().add(2).cast()) };
        let both = _mm256_set_m128i(_mm_srli_epi16::<4>(q), q);
        let w = _mm256_sub_epi8(_mm256_and_si256(both, m4), eight);
        // SAFETY: block `b` and the rows exist (caller).
        unsafe { signed_block(w, f16_at(x, 0), &xt, b, &mut acc) };
    }
    for j in 0..N {
        out[j] = hsum(acc[j]);
    }
}
