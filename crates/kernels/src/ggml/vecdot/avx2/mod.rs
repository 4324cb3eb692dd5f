//! The AVX2 kernels: safe entry points, the helpers every kernel shares, and the kernels by
//! block family (`kquants`: 256-value blocks with integer sub-scales; `small`: 32-value
//! blocks with an f16 scale).

// Per-token accumulators read best indexed by the token, as the activation rows are.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::{Q8Layout, Q8Rows, Tokens, rows};
use kquants::{q2_k_n, q3_k_n, q4_k_n, q5_k_n, q6_k_n};
use small::{iq4_nl_n, iq4_xs_n, q4_0_n, q4_1_n, q5_0_n, q5_1_n, q8_0_n};

mod kquants;
mod small;

/// Safe entry points: check that the rows, the activations and the token range agree
/// (the kernels' loads rely on it), then run the kernel four tokens at a time. Tokens are
/// the outer loop: four tokens' activations stay in L1 while the block's rows pass by
/// (and the rows, a few KiB, stay in L1 for the next four tokens).
macro_rules! entry {
    ($name:ident, $kernel:ident, $block_bytes:literal, $values:literal, $act:literal) => {
        pub(super) fn $name(
            src: &[u8],
            n_rows: usize,
            a: &Q8Rows,
            tokens: Range<usize>,
            tile: &mut [f32],
        ) {
            let rb = src.len() / n_rows.max(1);
            assert!(
                rb * n_rows == src.len()
                    && rb.is_multiple_of($block_bytes)
                    && rb / $block_bytes * $values == a.k
                    && a.block() == $act
                    && a.layout() == Q8Layout::Natural
                    && tokens.end <= a.rows()
                    && tile.len() == tokens.len() * n_rows,
                "{n_rows} rows of {rb} bytes against {} activations of {} per {}, \
                 tokens {tokens:?}, tile {}",
                a.rows(),
                a.k,
                a.block(),
                tile.len()
            );
            for t in tokens.clone().step_by(4) {
                let at = (t - tokens.start) * n_rows;
                let tile = &mut tile[at..];
                // SAFETY: `kernel` hands these out only for `Isa::Avx2` or better, which is
                // selected only on CPUs with AVX2, FMA and F16C; the lengths were checked
                // above.
                unsafe {
                    match (tokens.end - t).min(4) {
                        4 => rows_at(src, rb, &Tokens::<4>::new(a, t), tile, $kernel::<4>),
                        3 => rows_at(src, rb, &Tokens::<3>::new(a, t), tile, $kernel::<3>),
                        2 => rows_at(src, rb, &Tokens::<2>::new(a, t), tile, $kernel::<2>),
                        _ => rows_at(src, rb, &Tokens::<1>::new(a, t), tile, $kernel::<1>),
                    }
                }
            }
        }
    };
}

/// A kernel: one row of whole blocks against `N` resolved activation rows.
type Kernel<const N: usize> = unsafe fn(&[u8], &Tokens<N>, &mut [f32; N]);

/// Every row of `src` (`rb` bytes each) against the `N` tokens of `xt`: token `j`'s result
/// for row `r` goes to `tile[j · rows + r]`.
///
/// # Safety
/// The CPU has what `kernel` needs; each row is whole blocks matching the activations'
/// length.
#[inline(always)]
unsafe fn rows_at<const N: usize>(
    src: &[u8],
    rb: usize,
    xt: &Tokens<N>,
    tile: &mut [f32],
    kernel: Kernel<N>,
) {
    let n_rows = src.len() / rb;
    for (r, ahead) in rows(n_rows, rb) {
        // The next row of this run into L1 while this one computes.
        if let Some(a) = ahead {
            for line in src[a * rb..(a + 1) * rb].chunks(64) {
                // SAFETY: a prefetch reads nothing architecturally and never faults.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
            }
        }
        let mut o = [0.0f32; N];
        // SAFETY: the caller's guarantees (`rows` yields rows below `n_rows`).
        unsafe { kernel(&src[r * rb..(r + 1) * rb], xt, &mut o) };
        for (j, v) in o.iter().enumerate() {
            tile[j * n_rows + r] = *v;
        }
    }
}

// name, kernel, block bytes, values per block, activation values per scale
entry!(q2_k, q2_k_n, 84, 256, 32);
entry!(q3_k, q3_k_n, 110, 256, 32);
entry!(q4_k, q4_k_n, 144, 256, 256);
entry!(q5_k, q5_k_n, 176, 256, 256);
entry!(q6_k, q6_k_n, 210, 256, 256);
entry!(q8_0, q8_0_n, 34, 32, 32);
entry!(q4_0, q4_0_n, 18, 32, 32);
entry!(q4_1, q4_1_n, 20, 32, 32);
entry!(q5_0, q5_0_n, 22, 32, 32);
entry!(q5_1, q5_1_n, 24, 32, 32);
entry!(iq4_nl, iq4_nl_n, 18, 32, 32);
entry!(iq4_xs, iq4_xs_n, 136, 256, 32);

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn f16_at(b: &[u8], i: usize) -> f32 {
    let bits = u16::from_le_bytes([b[i], b[i + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(v: __m256) -> f32 {
    let s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps::<1>(s2, s2)))
}

/// 32 bytes at `p`.
///
/// # Safety
/// `p .. p + 32` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 32 readable bytes; unaligned load.
    unsafe { _mm256_loadu_si256(p.cast()) }
}

impl<const N: usize> Tokens<'_, N> {
    /// Token `j`'s 32 values from position `p`.
    ///
    /// # Safety
    /// `p + 32 <= k` (the rows' length).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn x(&self, j: usize, p: usize) -> __m256i {
        // SAFETY: every row holds `k` values and the caller keeps `p + 32 <= k`.
        unsafe { load(self.q[j].as_ptr().add(p).cast()) }
    }

    /// Token `j`'s integer sums per 16 over the 256-value block `i`, as 16 i16 lanes.
    ///
    /// # Safety
    /// `256 (i + 1) <= k`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn isums(&self, j: usize, i: usize) -> __m256i {
        // SAFETY: a row has `k / 16` sums and block `i` has 16 of them.
        unsafe { _mm256_loadu_si256(self.isums[j].as_ptr().add(16 * i).cast()) }
    }
}

/// 16 bytes of packed nibbles as 32 values: the low nibbles, then the high ones (the order
/// of ggml's 32-value blocks).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn nibbles(q: __m128i) -> __m256i {
    _mm256_and_si256(
        _mm256_set_m128i(_mm_srli_epi16::<4>(q), q),
        _mm256_set1_epi8(0x0f),
    )
}

/// Byte `i` is 0x10 where bit `i` of `bits` is set: the fifth bit of Q5_0 / Q5_1 values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bit4_of_each(bits: u32) -> __m256i {
    let v = _mm256_set1_epi32(bits as i32);
    // Byte i takes byte i / 8 of `bits` (each 128-bit lane holds all four).
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3,
        3, 3,
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, spread), bit), bit);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// The 6-bit scales and mins of a Q4_K / Q5_K block from its 12 packed bytes: the eight
/// scales as i16 in both 128-bit lanes (for [`lane16`]), and the mins as 16 i16, each
/// twice (one per 16 values, matching the activations' sums).
///
/// Packing (ggml's `get_scale_min_k4`): bytes 0-3 hold scales 0-3 in their low 6 bits,
/// bytes 4-7 mins 0-3; bytes 8-11 hold scales 4-7 (low nibble) and mins 4-7 (high
/// nibble), whose top 2 bits are the top bits of bytes 0-3 and 4-7. Rearranged with
/// 32-bit masks into 8 scale bytes and 8 min bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn k4_scales(b: &[u8]) -> (__m256i, __m256i) {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let w = |i: usize| u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
    let (w0, w1, w2) = (w(0), w(1), w(2));
    let scales_lo = w0 & LOW6;
    let scales_hi = (w2 & LOW4) | (((w0 >> 6) & LOW2) << 4);
    let mins_lo = w1 & LOW6;
    let mins_hi = ((w2 >> 4) & LOW4) | (((w1 >> 6) & LOW2) << 4);
    let v = _mm_set_epi32(
        mins_hi as i32,
        mins_lo as i32,
        scales_hi as i32,
        scales_lo as i32,
    );
    let scales = _mm_cvtepu8_epi16(v);
    let mins = _mm_cvtepu8_epi16(_mm_srli_si128::<8>(v));
    let mins16 = _mm256_set_m128i(
        _mm_unpackhi_epi16(mins, mins),
        _mm_unpacklo_epi16(mins, mins),
    );
    (_mm256_broadcastsi128_si256(scales), mins16)
}

/// i16 lane `l` (0-7) of each 128-bit half of `v`, in every lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn lane16(v: __m256i, l: usize) -> __m256i {
    let pick = (0x0100 + 0x0202 * l) as i16;
    _mm256_shuffle_epi8(v, _mm256_set1_epi16(pick))
}

/// The i8 scales `u` and `u + 1` of the 16 in `sc` as i16, each in eight lanes: the
/// multipliers of a 32-value group whose two halves of 16 have their own scales (after
/// `maddubs`, lanes 0-7 hold values 0-15).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn pair_scales(sc: __m128i, u: usize) -> __m256i {
    const BYTES: i64 = 0x0101_0101_0101_0101;
    let pick = _mm_set_epi64x(BYTES * (u as i64 + 1), BYTES * u as i64);
    _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc, pick))
}
