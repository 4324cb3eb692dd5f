//! ggml's k-quants (256-value blocks with integer sub-scales). Q4_K, Q5_K and Q6_K meet
//! activations quantized per 256: integer sums per block, one conversion to f32 per block
//! and token. Q2_K and Q3_K (2 and 3 bits, scales per 16) meet activations quantized per 32,
//! which keeps their already coarse weights from losing more to the activations' rounding:
//! integer sums per 32 values, converted there.

#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::{Tokens, f16_at, hsum, k4_scales, lane16, load, pair_scales};

/// Q4_K: `{f16 d, dmin; u8 scales[12]; u8 qs[128]}`, value `d · sc · q - dmin · m` per
/// sub-block of 32; each 32 bytes of `qs` hold two sub-blocks (low nibbles, then high).
///
/// # Safety
/// AVX2, FMA and F16C; `row` is whole blocks matching the rows of `xt`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_k_n<const N: usize>(row: &[u8], xt: &Tokens<N>, out: &mut [f32; N]) {
    // SAFETY: the caller's guarantees.
    unsafe { k4_n::<N, false>(row, xt, out) }
}

/// Q5_K: Q4_K's layout with `qh[32]` (bytes 16..48) holding the fifth bit, `qs` at 48;
/// chunk `c` of 64 values takes bits `2c` and `2c + 1` of `qh`.
///
/// # Safety
/// As [`q4_k_n`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_k_n<const N: usize>(row: &[u8], xt: &Tokens<N>, out: &mut [f32; N]) {
    // SAFETY: the caller's guarantees.
    unsafe { k4_n::<N, true>(row, xt, out) }
}

/// Q4_K, or Q5_K with `FIVE`: the two share scales, mins and the order of values.
///
/// # Safety
/// As [`q4_k_n`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k4_n<const N: usize, const FIVE: bool>(row: &[u8], xt: &Tokens<N>, out: &mut [f32; N]) {
    let (block, qs) = if FIVE { (176, 48) } else { (144, 16) };
    let m4 = _mm256_set1_epi8(0x0f);
    let bit4 = _mm256_set1_epi8(0x10);
    let mut acc = [_mm256_setzero_ps(); N];
    for (i, x) in row.chunks_exact(block).enumerate() {
        let (d, dmin) = (f16_at(x, 0), f16_at(x, 2));
        let (sc, mins) = k4_scales(&x[4..16]);
        let mut qh = if FIVE {
            // SAFETY: Q5_K's bytes 16..48 lie within its 176-byte block.
            unsafe { load(x.as_ptr().add(16)) }
        } else {
            _mm256_setzero_si256()
        };
        let mut sumi = [_mm256_setzero_si256(); N];
        for c in 0..4 {
            // SAFETY: bytes qs + 32 c .. qs + 32 c + 32 lie within the block.
            let q = unsafe { load(x.as_ptr().add(qs + 32 * c)) };
            let mut lo = _mm256_and_si256(q, m4);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
            if FIVE {
                // Bit 2c of each qh byte to bit 4, then bit 2c + 1; shift qh for the next c.
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16::<4>(qh), bit4));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16::<3>(qh), bit4));
                qh = _mm256_srli_epi16::<2>(qh);
            }
            let (s_lo, s_hi) = (lane16(sc, 2 * c), lane16(sc, 2 * c + 1));
            for j in 0..N {
                let p = 256 * i + 64 * c;
                // SAFETY: block `i` of the row lies within the rows of `xt` (caller).
                let (x0, x1) = unsafe { (xt.x(j, p), xt.x(j, p + 32)) };
                let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0), s_lo);
                let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1), s_hi);
                sumi[j] = _mm256_add_epi32(sumi[j], _mm256_add_epi32(p0, p1));
            }
        }
        for j in 0..N {
            let dx = xt.s[j][8 * i];
            // SAFETY: as above.
            let msum = _mm256_madd_epi16(unsafe { xt.isums(j, i) }, mins);
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(sumi[j]), acc[j]);
            acc[j] = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * dx), _mm256_cvtepi32_ps(msum), acc[j]);
        }
    }
    for j in 0..N {
        out[j] = hsum(acc[j]);
    }
}

/// Bits 0-1 of each byte of `v` moved to bits 4-5.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn top_bits(m2: __m256i, v: __m256i) -> __m256i {
    _mm256_slli_epi16::<4>(_mm256_and_si256(v, m2))
}

/// Q6_K: `{u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}`, value `d · sc · (q - 32)` with
/// a scale per 16; each half of 128 values takes 64 bytes of `ql` and 32 of `qh`.
///
/// # Safety
/// As [`q4_k_n`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q6_k_n<const N: usize>(row: &[u8], xt: &Tokens<N>, out: &mut [f32; N]) {
    let m4 = _mm256_set1_epi8(0x0f);
    let m2 = _mm256_set1_epi8(0x03);
    let mut acc = [_mm256_setzero_ps(); N];
    for (i, x) in row.chunks_exact(210).enumerate() {
        let d = f16_at(x, 208);
        // SAFETY: bytes 192..208 lie within the 210-byte block.
        let sc = unsafe { _mm_loadu_si128(x.as_ptr().add(192).cast()) };
        let sc_all = _mm256_cvtepi8_epi16(sc);
        let mut sumi = [_mm256_setzero_si256(); N];
        for half in 0..2 {
            // SAFETY: ql (0..128) and qh (128..192) lie within the 210-byte block.
            let (ql0, ql1, qh) = unsafe {
                (
                    load(x.as_ptr().add(64 * half)),
                    load(x.as_ptr().add(64 * half + 32)),
                    load(x.as_ptr().add(128 + 32 * half)),
                )
            };
            let q = [
                _mm256_or_si256(_mm256_and_si256(ql0, m4), top_bits(m2, qh)),
                _mm256_or_si256(
                    _mm256_and_si256(ql1, m4),
                    top_bits(m2, _mm256_srli_epi16::<2>(qh)),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                    top_bits(m2, _mm256_srli_epi16::<4>(qh)),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                    top_bits(m2, _mm256_srli_epi16::<6>(qh)),
                ),
            ];
            for (g, qg) in q.iter().enumerate() {
                let u = 8 * half + 2 * g;
                let s = pair_scales(sc, u);
                for j in 0..N {
                    let p = 256 * i + 128 * half + 32 * g;
                    // SAFETY: block `i` lies within the rows of `xt` (caller).
                    let xv = unsafe { xt.x(j, p) };
                    let pr = _mm256_madd_epi16(_mm256_maddubs_epi16(*qg, xv), s);
                    sumi[j] = _mm256_add_epi32(sumi[j], pr);
                }
            }
        }
        for j in 0..N {
            let dx = xt.s[j][8 * i];
            // The -32 offset: Σ_u sc_u · 32 · Σ x over unit u.
            // SAFETY: as above.
            let off = _mm256_madd_epi16(unsafe { xt.isums(j, i) }, sc_all);
            let s = _mm256_sub_epi32(sumi[j], _mm256_slli_epi32::<5>(off));
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(s), acc[j]);
        }
    }
    for j in 0..N {
        out[j] = hsum(acc[j]);
    }
}

/// `N` tokens' products with 32 unsigned weights `w` whose halves of 16 have the integer
/// scales in `scales` (see [`pair_scales`]), times the block scale `d`; `g` is the group of
/// 32 within the row.
///
/// # Safety
/// Group `g` lies within the rows of `xt`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scaled_group<const N: usize>(
    w: __m256i,
    scales: __m256i,
    d: f32,
    xt: &Tokens<N>,
    g: usize,
    acc: &mut [__m256; N],
) {
    for j in 0..N {
        // SAFETY: the caller guarantees group `g` lies within the rows.
        let xv = unsafe { xt.x(j, 32 * g) };
        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(w, xv), scales);
        let scale = _mm256_set1_ps(d * xt.s[j][g]);
        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc[j]);
    }
}

/// `acc[j] -= Σ_u m[u] · (s Σ q)_u` over the 16 units of 256-value block `i`: a block's mins
/// or offsets (`m`, as f32, one per 16 values) against the activations' sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn sub_unit_terms<const N: usize>(m: [__m256; 2], xt: &Tokens<N>, i: usize, acc: &mut [__m256; N]) {
    for j in 0..N {
        let sums = &xt.sums[j][16 * i..16 * i + 16];
        // SAFETY: `sums` holds 16 values: two loads of 8.
        let (s0, s1) = unsafe {
            (
                _mm256_loadu_ps(sums.as_ptr()),
                _mm256_loadu_ps(sums.as_ptr().add(8)),
            )
        };
        acc[j] = _mm256_fnmadd_ps(m[0], s0, acc[j]);
        acc[j] = _mm256_fnmadd_ps(m[1], s1, acc[j]);
    }
}

/// 16 small integers (one byte each in `v`) as f32 times `f`, in two vectors of 8.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bytes_to_f32(v: __m128i, signed: bool, f: f32) -> [__m256; 2] {
    let (lo, hi) = if signed {
        (
            _mm256_cvtepi8_epi32(v),
            _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(v)),
        )
    } else {
        (
            _mm256_cvtepu8_epi32(v),
            _mm256_cvtepu8_epi32(_mm_srli_si128::<8>(v)),
        )
    };
    let f = _mm256_set1_ps(f);
    [
        _mm256_mul_ps(_mm256_cvtepi32_ps(lo), f),
        _mm256_mul_ps(_mm256_cvtepi32_ps(hi), f),
    ]
}

/// Q2_K: `{u8 scales[16]; u8 qs[64]; f16 d, dmin}`, value `d · (sc & 15) · q - dmin ·
/// (sc >> 4)` per 16; each 32 bytes of `qs` hold 128 values as four 2-bit planes.
///
/// # Safety
/// As [`q4_k_n`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q2_k_n<const N: usize>(row: &[u8], xt: &Tokens<N>, out: &mut [f32; N]) {
    let m3 = _mm256_set1_epi8(3);
    let mut acc = [_mm256_setzero_ps(); N];
    for (i, x) in row.chunks_exact(84).enumerate() {
        let (d, dmin) = (f16_at(x, 80), f16_at(x, 82));
        // SAFETY: bytes 0..16 lie within the 84-byte block.
        let sc = unsafe { _mm_loadu_si128(x.as_ptr().cast()) };
        let sc_lo = _mm_and_si128(sc, _mm_set1_epi8(0x0f));
        let mins = bytes_to_f32(
            _mm_and_si128(_mm_srli_epi16::<4>(sc), _mm_set1_epi8(0x0f)),
            false,
            dmin,
        );
        for half in 0..2 {
            // SAFETY: bytes 16 + 32 half .. 48 + 32 half lie within the block.
            let q = unsafe { load(x.as_ptr().add(16 + 32 * half)) };
            for plane in 0..4 {
                let w =
                    _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * plane as i32)), m3);
                let g = 4 * half + plane;
                // SAFETY: group `8 i + g` lies within the rows (caller).
                unsafe { scaled_group(w, pair_scales(sc_lo, 2 * g), d, xt, 8 * i + g, &mut acc) };
            }
        }
        sub_unit_terms(mins, xt, i, &mut acc);
    }
    for j in 0..N {
        out[j] = hsum(acc[j]);
    }
}

/// Q3_K: `{u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}`, value `d · (sc - 32) · (q - 4)`
/// per 16, `q` the 2 bits of `qs` plus 4 where the value's bit of `hmask` is set; the
/// 6-bit scales are packed as 16 low nibbles and 16 pairs of high bits.
///
/// # Safety
/// As [`q4_k_n`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q3_k_n<const N: usize>(row: &[u8], xt: &Tokens<N>, out: &mut [f32; N]) {
    let (m3, one) = (_mm256_set1_epi8(3), _mm256_set1_epi8(1));
    let mut acc = [_mm256_setzero_ps(); N];
    for (i, x) in row.chunks_exact(110).enumerate() {
        let d = f16_at(x, 108);
        let s = &x[96..108];
        let sc: [i8; 16] = std::array::from_fn(|u| {
            let lo = (s[u % 8] >> (4 * (u / 8))) & 0x0f;
            let hi = (s[8 + u % 4] >> (2 * (u / 4))) & 3;
            ((lo | (hi << 4)) as i32 - 32) as i8
        });
        // SAFETY: 16 bytes.
        let sc = unsafe { _mm_loadu_si128(sc.as_ptr().cast()) };
        // The -4 offset of every value, as a term per 16: 4 d sc_u against Σ x.
        let offsets = bytes_to_f32(sc, true, 4.0 * d);
        // SAFETY: bytes 0..32 (hmask) lie within the 110-byte block.
        let hmask = unsafe { load(x.as_ptr()) };
        for half in 0..2 {
            // SAFETY: bytes 32 + 32 half .. 64 + 32 half lie within the block.
            let q = unsafe { load(x.as_ptr().add(32 + 32 * half)) };
            for plane in 0..4 {
                let low =
                    _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * plane as i32)), m3);
                let bit = _mm256_and_si256(
                    _mm256_srl_epi16(hmask, _mm_cvtsi32_si128((4 * half + plane) as i32)),
                    one,
                );
                let w = _mm256_or_si256(low, _mm256_slli_epi16::<2>(bit));
                let g = 4 * half + plane;
                // SAFETY: group `8 i + g` lies within the rows (caller).
                unsafe { scaled_group(w, pair_scales(sc, 2 * g), d, xt, 8 * i + g, &mut acc) };
            }
        }
        sub_unit_terms(offsets, xt, i, &mut acc);
    }
    for j in 0..N {
        out[j] = hsum(acc[j]);
    }
}
