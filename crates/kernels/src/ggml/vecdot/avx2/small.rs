//! Blocks computed 32 values at a time with one f32 scale each (Q8_0, Q4_0, Q4_1, Q5_0,
//! Q5_1, IQ4_NL, and IQ4_XS's sub-blocks) against activations quantized per 32: one
//! conversion to f32 per 32 values and token.

#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::{Tokens, bit4_of_each, f16_at, hsum, load, nibbles};
use crate::ggml::unpack::KVALUES_IQ4NL;

/// `N` tokens' products with one block of 32 signed weights `w` scaled by `d`:
/// `|w|` times `x` with `w`'s sign (pair sums stay within i16: |x| <= 127, |w| <= 128).
///
/// Always inlined and without a `target_feature` of its own: a `target_feature` function
/// is only ever inlined at the compiler's discretion, and a call per block (accumulators
/// through memory) cost a third of the kernel's time. Inlined into the kernels, it runs
/// with theirs.
///
/// # Safety
/// The CPU has AVX2 and FMA; block `b` of 32 lies within the rows of `xt`.
#[inline(always)]
unsafe fn signed_block<const N: usize>(
    w: __m256i,
    d: f32,
    xt: &Tokens<N>,
    b: usize,
    acc: &mut [__m256; N],
) {
    // SAFETY: the caller guarantees the CPU features and that block `b` lies within the
    // rows (values, and one scale per 32).
    unsafe {
        let ones = _mm256_set1_epi16(1);
        let wa = _mm256_abs_epi8(w);
        for j in 0..N {
            let xv = xt.x(j, 32 * b);
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wa, _mm256_sign_epi8(xv, w)), ones);
            let scale = _mm256_set1_ps(d * *xt.s[j].get_unchecked(b));
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc[j]);
        }
    }
}

/// Runs `$body` for every block of `$row` (`$size` bytes each), with `$x` the block's bytes,
/// `$b` its index and `$acc` one of two sets of accumulators, even blocks into one and odd
/// into the other; evaluates to their sum. With one set, each block's multiply-add waits
/// for the previous one's: a decode row (one token, 18 blocks) was one chain of latencies;
/// two chains overlap. For one or two tokens the chains interleave; from three on, the
/// tokens' own chains overlap already and two sets would spill registers, so the even
/// blocks run first, then the odd ones: the same sums in the same order. A token's result
/// therefore does not depend on the tokens computed beside it (a request's answer is the
/// same alone and in a batch). A macro, not a closure: the body must be compiled inside
/// the kernel, with its target features.
macro_rules! two_chains {
    ($n:expr, $row:expr, $size:expr, |$x:ident, $b:ident, $acc:ident| $body:block) => {{
        let (row, size) = ($row, $size);
        let mut even = [_mm256_setzero_ps(); $n];
        let mut odd = [_mm256_setzero_ps(); $n];
        if $n <= 2 {
            let mut pairs = row.chunks_exact(2 * size);
            for (p, pair) in pairs.by_ref().enumerate() {
                {
                    let ($x, $b, $acc) = (&pair[..size], 2 * p, &mut even);
                    $body
                }
                {
                    let ($x, $b, $acc) = (&pair[size..], 2 * p + 1, &mut odd);
                    $body
                }
            }
            let rest = pairs.remainder();
            if !rest.is_empty() {
                let ($x, $b, $acc) = (rest, row.len() / size - 1, &mut even);
                $body
            }
        } else {
            for (p, block) in row.chunks_exact(size).step_by(2).enumerate() {
                let ($x, $b, $acc) = (block, 2 * p, &mut even);
                $body
            }
            for (p, block) in row.chunks_exact(size).skip(1).step_by(2).enumerate() {
                let ($x, $b, $acc) = (block, 2 * p + 1, &mut odd);
                $body
            }
        }
        for j in 0..$n {
            even[j] = _mm256_add_ps(even[j], odd[j]);
        }
        even
    }};
}

/// Q8_0: `{f16 d; i8 qs[32]}`.
///
/// # Safety
/// AVX2, FMA and F16C; `row` is whole blocks matching the rows of `xt`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q8_0_n<const N: usize>(row: &[u8], xt: &Tokens<N>, out: &mut [f32; N]) {
    let acc = two_chains!(N, row, 34, |x, b, acc| {
        // SAFETY: bytes 2..34 of the block; block `b` and the rows exist (caller).
        unsafe { signed_block(load(x.as_ptr().add(2)), f16_at(x, 0), xt, b, acc) }
    });
    for j in 0..N {
        out[j] = hsum(acc[j]);
    }
}

/// Q4_0: `{f16 d; u8 qs[16]}`, values `d · (q - 8)`, low nibbles first.
///
/// # Safety
/// As [`q8_0_n`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_0_n<const N: usize>(row: &[u8], xt: &Tokens<N>, out: &mut [f32; N]) {
    let eight = _mm256_set1_epi8(8);
    let acc = two_chains!(N, row, 18, |x, b, acc| {
        // SAFETY: bytes 2..18 of the 18-byte block; block `b` and the rows exist
        // (caller).
        unsafe {
            let w = _mm256_sub_epi8(nibbles(load16(x.as_ptr().add(2))), eight);
            signed_block(w, f16_at(x, 0), xt, b, acc)
        }
    });
    for j in 0..N {
        out[j] = hsum(acc[j]);
    }
}

/// `N` tokens' products with one block of 32 unsigned weights `w` (at most 31) scaled by
/// `d`; for one or two tokens, whose blocks run in order, the block's min `m` times each
/// token's activation sum is added to `mins` here (more tokens: [`min_terms`]). Inlined as
/// [`signed_block`] is.
///
/// # Safety
/// The CPU has AVX2 and FMA; block `b` of 32 lies within the rows of `xt`.
#[inline(always)]
unsafe fn unsigned_block<const N: usize>(
    w: __m256i,
    d: f32,
    m: f32,
    xt: &Tokens<N>,
    b: usize,
    acc: &mut [__m256; N],
    mins: &mut [f32; N],
) {
    // SAFETY: the caller guarantees the CPU features and that block `b` lies within the
    // rows (values, one scale per 32 and one sum per 16).
    unsafe {
        let ones = _mm256_set1_epi16(1);
        for j in 0..N {
            let xv = xt.x(j, 32 * b);
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(w, xv), ones);
            let scale = _mm256_set1_ps(d * *xt.s[j].get_unchecked(b));
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc[j]);
            if N <= 2 {
                let sums = xt.sums[j].get_unchecked(2 * b..2 * b + 2);
                mins[j] += m * (sums[0] + sums[1]);
            }
        }
    }
}

/// `Σ_b m_b · Σ x_b` per token, over the blocks of `row` (`size` bytes each, the f16 min at
/// byte 2) in order, as [`unsigned_block`] adds them for one or two tokens: three or more
/// run the even blocks before the odd ones ([`two_chains!`]). A pass of its own costs a
/// decode row about a tenth of its time, so one or two tokens add them inline.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn min_terms<const N: usize>(row: &[u8], size: usize, xt: &Tokens<N>) -> [f32; N] {
    let mut mins = [0.0f32; N];
    for (b, x) in row.chunks_exact(size).enumerate() {
        let m = f16_at(x, 2);
        for j in 0..N {
            let sums = &xt.sums[j][2 * b..2 * b + 2];
            mins[j] += m * (sums[0] + sums[1]);
        }
    }
    mins
}

/// 16 bytes at `p`.
///
/// # Safety
/// `p .. p + 16` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load16(p: *const u8) -> __m128i {
    // SAFETY: the caller guarantees 16 readable bytes; unaligned load.
    unsafe { _mm_loadu_si128(p.cast()) }
}

/// Q4_1: `{f16 d, m; u8 qs[16]}`, values `d · q + m`.
///
/// # Safety
/// As [`q8_0_n`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_1_n<const N: usize>(row: &[u8], xt: &Tokens<N>, out: &mut [f32; N]) {
    let mut mins = [0.0f32; N];
    let acc = two_chains!(N, row, 20, |x, b, acc| {
        // SAFETY: bytes 4..20 of the 20-byte block; block `b` and the rows exist
        // (caller).
        unsafe {
            let w = nibbles(load16(x.as_ptr().add(4)));
            unsigned_block(w, f16_at(x, 0), f16_at(x, 2), xt, b, acc, &mut mins)
        }
    });
    if N > 2 {
        mins = min_terms(row, 20, xt);
    }
    for j in 0..N {
        out[j] = hsum(acc[j]) + mins[j];
    }
}

/// Q5_0: `{f16 d; u32 qh; u8 qs[16]}`, values `d · (q - 16)`, bit 4 of value `i` in bit `i`
/// of `qh`.
///
/// # Safety
/// As [`q8_0_n`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_0_n<const N: usize>(row: &[u8], xt: &Tokens<N>, out: &mut [f32; N]) {
    let acc = two_chains!(N, row, 22, |x, b, acc| {
        let qh = u32::from_le_bytes([x[2], x[3], x[4], x[5]]);
        // SAFETY: bytes 6..22 of the 22-byte block; block `b` and the rows exist
        // (caller).
        unsafe {
            let q = _mm256_or_si256(nibbles(load16(x.as_ptr().add(6))), bit4_of_each(qh));
            let w = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
            signed_block(w, f16_at(x, 0), xt, b, acc)
        }
    });
    for j in 0..N {
        out[j] = hsum(acc[j]);
    }
}

/// Q5_1: `{f16 d, m; u32 qh; u8 qs[16]}`, values `d · q + m`.
///
/// # Safety
/// As [`q8_0_n`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_1_n<const N: usize>(row: &[u8], xt: &Tokens<N>, out: &mut [f32; N]) {
    let mut mins = [0.0f32; N];
    let acc = two_chains!(N, row, 24, |x, b, acc| {
        let qh = u32::from_le_bytes([x[4], x[5], x[6], x[7]]);
        // SAFETY: bytes 8..24 of the 24-byte block; block `b` and the rows exist
        // (caller).
        unsafe {
            let w = _mm256_or_si256(nibbles(load16(x.as_ptr().add(8))), bit4_of_each(qh));
            unsigned_block(w, f16_at(x, 0), f16_at(x, 2), xt, b, acc, &mut mins)
        }
    });
    if N > 2 {
        mins = min_terms(row, 24, xt);
    }
    for j in 0..N {
        out[j] = hsum(acc[j]) + mins[j];
    }
}

/// The IQ4 grid in both 128-bit lanes, for `vpshufb` lookups.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn iq4_grid() -> __m256i {
    // SAFETY: the grid is 16 bytes.
    let g = unsafe { _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()) };
    _mm256_broadcastsi128_si256(g)
}

/// IQ4_NL: `{f16 d; u8 qs[16]}`, values `d · grid[q]`.
///
/// # Safety
/// As [`q8_0_n`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn iq4_nl_n<const N: usize>(row: &[u8], xt: &Tokens<N>, out: &mut [f32; N]) {
    let grid = iq4_grid();
    let acc = two_chains!(N, row, 18, |x, b, acc| {
        // SAFETY: bytes 2..18 of the 18-byte block; block `b` and the rows exist
        // (caller).
        unsafe {
            let w = _mm256_shuffle_epi8(grid, nibbles(load16(x.as_ptr().add(2))));
            signed_block(w, f16_at(x, 0), xt, b, acc)
        }
    });
    for j in 0..N {
        out[j] = hsum(acc[j]);
    }
}

/// IQ4_XS: `{f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]}`, 8 sub-blocks of 32 with a
/// 6-bit scale `ls` each (low 4 bits in `scales_l`, high 2 in `scales_h`), values
/// `d · (ls - 32) · grid[q]`.
///
/// # Safety
/// As [`q8_0_n`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn iq4_xs_n<const N: usize>(row: &[u8], xt: &Tokens<N>, out: &mut [f32; N]) {
    let grid = iq4_grid();
    let mut acc = [_mm256_setzero_ps(); N];
    for (i, x) in row.chunks_exact(136).enumerate() {
        let d = f16_at(x, 0);
        let scales_h = u16::from_le_bytes([x[2], x[3]]);
        for ib in 0..8 {
            let lo = (x[4 + ib / 2] >> (4 * (ib % 2))) & 0x0f;
            let hi = ((scales_h >> (2 * ib)) & 3) as u8;
            let dl = d * ((lo | (hi << 4)) as i32 - 32) as f32;
            // SAFETY: bytes 8 + 16 ib .. 24 + 16 ib lie within the 136-byte block.
            let w = _mm256_shuffle_epi8(
                grid,
                nibbles(unsafe { load16(x.as_ptr().add(8 + 16 * ib)) }),
            );
            // SAFETY: sub-block `8 i + ib` and the rows exist (caller).
            unsafe { signed_block(w, dl, xt, 8 * i + ib, &mut acc) };
        }
    }
    for j in 0..N {
        out[j] = hsum(acc[j]);
    }
}
