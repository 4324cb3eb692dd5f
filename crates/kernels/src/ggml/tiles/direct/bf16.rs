//! The BF16 tiles of the direct fills: the values of a strip's rows converted in registers
//! and paired into tile lines. Q4_K, Q8_0 and IQ4_XS convert from their transposed packed
//! bytes (each register holds a dword of every row, so the rows' scales are one register and
//! no converted value is transposed); Q6_K converts row by row and transposes.

use std::arch::x86_64::*;

use super::super::int8::x86::transpose16_regs;
use super::{NextStrip, RowGather, dwords_by_row, iq4_xs_scales};

/// Writes the BF16 tile lines of one strip of Q4_K rows (as [`q4_k_strip`](super::q4_k_strip) takes them; 16
/// lines per group of 32): `d · q + m` per value, a multiply then an add as the generic fill
/// rounds them, converted to BF16 rounding to nearest even. `scales` and `bias` are the strip's
/// `[group][16]` (from [`q4_k_strip_scales`](super::q4_k_strip_scales)). As [`q4_k_strip`](super::q4_k_strip), the packed bytes are
/// transposed, so each register holds one dword per row and the 16 rows' scales are one
/// register: a line (a pair of `k` for 16 rows) is two nibbles per lane converted side by side
/// and interleaved, with no transpose of the converted values.
///
/// # Safety
/// AVX-512 F/BW/VL/BF16 must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2")]
pub(in crate::ggml::tiles) unsafe fn q4_k_strip_bf16(
    src: &[u8],
    rows: usize,
    blocks: usize,
    block: usize,
    scales: &[f32],
    bias: &[f32],
    dst: &mut [u8],
) {
    let row_bytes = blocks * block;
    let groups = blocks * 8;
    assert!(rows <= 16 && src.len() >= rows * row_bytes && dst.len() >= groups * 16 * 64);
    assert!(scales.len() >= groups * 16 && bias.len() >= groups * 16);
    let nib = _mm512_set1_epi32(0x0f);
    let pair = pair_words();
    let next = NextStrip::new(src, rows * row_bytes, 4 * blocks);
    for b in 0..blocks {
        for p in 0..4 {
            next.fetch(4 * b + p);
            // SAFETY: the caller checked the features; `src` holds `rows` rows (checked above).
            let dwords = unsafe { dwords_by_row(src, rows, row_bytes, b * block + 16 + 32 * p) };
            // The chunk's low nibbles are group `8 b + 2 p`, its high ones the next.
            for half in 0..2 {
                let g = 8 * b + 2 * p + half;
                // SAFETY: 16 values from `16 g` lie within both (checked above).
                let (d, m) = unsafe {
                    (
                        _mm512_loadu_ps(scales.as_ptr().add(16 * g)),
                        _mm512_loadu_ps(bias.as_ptr().add(16 * g)),
                    )
                };
                let lines = &mut dst[16 * g * 64..][..16 * 64];
                for (dw, &v) in dwords.iter().enumerate() {
                    // Byte `i` of the dword holds value `4 dw + i` of the group.
                    let value = |byte: usize| {
                        let q =
                            _mm512_srl_epi32(v, _mm_cvtsi32_si128((8 * byte + 4 * half) as i32));
                        let q = _mm512_cvtepi32_ps(_mm512_and_si512(q, nib));
                        _mm512_add_ps(_mm512_mul_ps(d, q), m)
                    };
                    for e in 0..2 {
                        let line = pair_line(value(2 * e), value(2 * e + 1), pair);
                        // SAFETY: line `2 dw + e` lies within `lines` (16 lines).
                        unsafe {
                            let at = lines.as_mut_ptr().add(64 * (2 * dw + e));
                            _mm512_storeu_si512(at.cast(), line)
                        };
                    }
                }
            }
        }
    }
}

/// Writes the BF16 tile lines of one strip of Q8_0 rows (`rows` rows, at most 16, of `blocks`
/// blocks of 34 bytes in `src`; 16 lines per block in `dst`): `d · q` plus the zero min, as
/// the generic fill rounds it, then to BF16 to nearest even. As [`q4_k_strip_bf16`], from
/// the transposed bytes: each register holds 4 values of every row, and the rows' `d` is one
/// register (a gather per block).
///
/// # Safety
/// AVX-512 F/BW/VL/BF16 and F16C must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,f16c")]
pub(in crate::ggml::tiles) unsafe fn q8_0_strip_bf16(
    src: &[u8],
    rows: usize,
    blocks: usize,
    dst: &mut [u8],
) {
    let row_bytes = blocks * 34;
    assert!(rows <= 16 && src.len() >= rows * row_bytes && dst.len() >= blocks * 16 * 64);
    let gather = RowGather::new(src, rows, row_bytes);
    let pair = pair_words();
    let next = NextStrip::new(src, rows * row_bytes, blocks);
    for b in 0..blocks {
        next.fetch(b);
        let dm = gather.dword(src, 34 * b);
        let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
        // SAFETY: the caller checked the features; `src` holds `rows` rows (checked above).
        let dwords = unsafe { dwords_by_row(src, rows, row_bytes, 34 * b + 2) };
        let lines = &mut dst[16 * b * 64..][..16 * 64];
        for (dw, &v) in dwords.iter().enumerate() {
            // Byte `i` of the dword is value `4 dw + i` of the block, sign-extended.
            let value = |byte: usize| {
                let q = _mm512_sll_epi32(v, _mm_cvtsi32_si128((24 - 8 * byte) as i32));
                let q = _mm512_cvtepi32_ps(_mm512_srai_epi32::<24>(q));
                _mm512_add_ps(_mm512_mul_ps(d, q), _mm512_setzero_ps())
            };
            for e in 0..2 {
                let line = pair_line(value(2 * e), value(2 * e + 1), pair);
                // SAFETY: line `2 dw + e` lies within `lines` (16 lines).
                unsafe {
                    _mm512_storeu_si512(lines.as_mut_ptr().add(64 * (2 * dw + e)).cast(), line)
                };
            }
        }
    }
}

/// Writes the BF16 tile lines of one strip of IQ4_XS rows (`rows` rows, at most 16, of
/// `blocks` blocks of 136 bytes in `src`; 16 lines per group of 32 in `dst`): `d · (ls - 32)`
/// times the grid value of each nibble, plus the zero min, as the generic fill rounds it, then
/// to BF16 to nearest even. As [`q4_k_strip_bf16`], from the transposed bytes, the grid
/// looked up per lane with `vpermps`; a group's 16 bytes hold its first 16 values in their low
/// nibbles and the next 16 in their high ones.
///
/// # Safety
/// AVX-512 F/BW/VL/BF16 and F16C must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,f16c")]
pub(in crate::ggml::tiles) unsafe fn iq4_xs_strip_bf16(
    src: &[u8],
    rows: usize,
    blocks: usize,
    dst: &mut [u8],
) {
    let row_bytes = blocks * 136;
    assert!(rows <= 16 && src.len() >= rows * row_bytes && dst.len() >= blocks * 8 * 16 * 64);
    let kv = crate::ggml::unpack::KVALUES_IQ4NL.map(f32::from);
    // SAFETY: `kv` holds 16 floats.
    let grid = unsafe { _mm512_loadu_ps(kv.as_ptr()) };
    let (nib, pair) = (_mm512_set1_epi32(0x0f), pair_words());
    let next = NextStrip::new(src, rows * row_bytes, 4 * blocks);
    for b in 0..blocks {
        // SAFETY: the caller checked the features and `src` (above).
        let scales = unsafe { iq4_xs_scales(src, rows, row_bytes, b) };
        for p in 0..4 {
            next.fetch(4 * b + p);
            // SAFETY: the caller checked the features; `src` holds `rows` rows (checked above).
            let dwords = unsafe { dwords_by_row(src, rows, row_bytes, 136 * b + 8 + 32 * p) };
            for half in 0..2 {
                // Group `ib` of the block: its 16 bytes are dwords `4 half ..` of the chunk.
                let ib = 2 * p + half;
                let scale = scales[ib];
                let g = 8 * b + ib;
                let lines = &mut dst[16 * g * 64..][..16 * 64];
                for (dw, &v) in dwords[4 * half..4 * half + 4].iter().enumerate() {
                    // Byte `i` of the dword: values `4 dw + i` (low nibble) and `16 + 4 dw + i`
                    // (high) of the group.
                    let value = |shift: usize| {
                        let q = _mm512_and_si512(
                            _mm512_srl_epi32(v, _mm_cvtsi32_si128(shift as i32)),
                            nib,
                        );
                        let q = _mm512_permutexvar_ps(q, grid);
                        _mm512_add_ps(_mm512_mul_ps(scale, q), _mm512_setzero_ps())
                    };
                    for (nibble, e) in [(0, 0), (0, 1), (4, 0), (4, 1)] {
                        let line =
                            pair_line(value(16 * e + nibble), value(16 * e + 8 + nibble), pair);
                        // SAFETY: line `2 dw + e` (`8 + ...` for the high nibbles) lies within
                        // `lines` (16 lines).
                        unsafe {
                            let at = lines.as_mut_ptr().add(64 * (2 * dw + e + 2 * nibble));
                            _mm512_storeu_si512(at.cast(), line)
                        };
                    }
                }
            }
        }
    }
}

/// `vpermw` indices pairing lane `n` of two converted halves: words `2n, 2n + 1`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn pair_words() -> __m512i {
    _mm512_set_epi16(
        31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4,
        19, 3, 18, 2, 17, 1, 16, 0,
    )
}

/// One BF16 tile line from two `k` of 16 rows (`k0`, `k1`: a row per lane): each row's dword
/// is the pair, rounded to nearest even.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
fn pair_line(k0: __m512, k1: __m512, pair: __m512i) -> __m512i {
    // SAFETY: both are 64-byte plain vector types.
    let words = unsafe { std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(k1, k0)) };
    _mm512_permutexvar_epi16(pair, words)
}

/// Writes the BF16 tile lines of one strip of Q6_K rows (`rows` rows, at most 16, of `blocks`
/// blocks of `block` bytes in `src`; 16 lines per group of 32 in `dst`): each value
/// `d · sc · (q - 32)` per 16, rounded as the generic fill rounds it (`unpack`'s scale
/// `d · sc`, times `q`, plus its zero min), then to BF16 to nearest even. `scales` is the
/// strip's `[group of 16][16]` from [`q6_k_strip_scales`](super::q6_k_strip_scales): found once per strip, where each
/// row converted its `d` and multiplied its scales per group of 32 (a 64x2048 tile in 33-36
/// us before, 26.9-28.5 after, on a core of the Xeon with AMX, 2026-12-02, three alternating
/// rounds).
///
/// # Safety
/// AVX-512 F/BW/VL/BF16 must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2")]
pub(in crate::ggml::tiles) unsafe fn q6_k_strip_bf16(
    src: &[u8],
    rows: usize,
    blocks: usize,
    block: usize,
    scales: &[f32],
    dst: &mut [u8],
) {
    let row_bytes = blocks * block;
    let groups = blocks * 8;
    assert!(rows <= 16 && src.len() >= rows * row_bytes && block >= 210);
    assert!(dst.len() >= groups * 16 * 64 && scales.len() >= 2 * groups * 16);
    let (nib, two, off) = (
        _mm256_set1_epi8(0x0f),
        _mm256_set1_epi8(0x03),
        _mm256_set1_epi8(32),
    );
    for g in 0..groups {
        // Group `g` is quarter `c` of half `h` of block `b`: `ql` bytes `64 h + 32 (c % 2)`,
        // low nibbles for `c < 2`, with bits `2 c, 2 c + 1` of the half's 32 `qh` bytes.
        let (b, h, c) = (g / 8, (g / 4) % 2, g % 4);
        let r: [__m512i; 16] = std::array::from_fn(|row| {
            if row >= rows {
                return _mm512_setzero_si512();
            }
            let x = &src[row * row_bytes + b * block..][..block];
            // SAFETY: both 32-byte loads lie within the block (`block >= 210`).
            let (ql, qh) = unsafe {
                (
                    _mm256_loadu_si256(x.as_ptr().add(64 * h + 32 * (c % 2)).cast()),
                    _mm256_loadu_si256(x.as_ptr().add(128 + 32 * h).cast()),
                )
            };
            let low = if c < 2 {
                ql
            } else {
                _mm256_srli_epi16::<4>(ql)
            };
            let high =
                _mm256_and_si256(_mm256_srlv_epi16(qh, _mm256_set1_epi16(2 * c as i16)), two);
            let q = _mm256_or_si256(_mm256_and_si256(low, nib), _mm256_slli_epi16::<4>(high));
            let q = _mm256_sub_epi8(q, off);
            let unit = |u: usize, q: __m128i| {
                let scale = _mm512_set1_ps(scales[16 * (16 * b + u) + row]);
                let q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
                _mm512_add_ps(_mm512_mul_ps(scale, q), _mm512_setzero_ps())
            };
            let u0 = 8 * h + 2 * c;
            let (lo, hi) = (
                unit(u0, _mm256_castsi256_si128(q)),
                unit(u0 + 1, _mm256_extracti128_si256::<1>(q)),
            );
            // SAFETY: both are 64-byte plain vector types.
            unsafe { std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo)) }
        });
        // SAFETY: the caller checked the features; the 16 lines from `16 g` lie within `dst`
        // (checked above).
        unsafe { transpose16_regs(r, &mut dst[16 * g * 64..]) };
    }
}
