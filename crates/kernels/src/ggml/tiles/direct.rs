//! The commonest expert types of MoE releases (Q4_K, Q6_K, and Q3_K of the 3-bit files)
//! decoded into tiles straight from their blocks on AVX-512: a strip's 16 rows of one chunk
//! of `k` are unpacked in registers and transposed into the tile's lines, with no decoded copy
//! of the tile in between (the generic fills go through `unpack`'s rows). Each is tested bit
//! for bit against the generic fill.

use std::arch::x86_64::*;

use super::int8::x86::transpose16_regs;
use super::{Rows, STRIP};

mod bf16;
pub(super) use bf16::{iq4_xs_strip_bf16, q4_k_strip_bf16, q6_k_strip_bf16, q8_0_strip_bf16};

/// A strip fill of a type with a scale per 16 and no mins (`q6_k_strip`, `q3_k_strip`):
/// `(src, rows, blocks, block, dst)`.
pub(super) type StripFn = unsafe fn(&[u8], usize, usize, usize, &mut [u8]);
/// Its scales (`q6_k_strip_scales`, `q3_k_strip_scales`): `(src, rows, blocks, block, scales)`.
pub(super) type StripScalesFn = unsafe fn(&[u8], usize, usize, usize, &mut [f32]);
/// A strip fill of a type with a scale per 32 and no mins that writes its scales too
/// (`iq4_xs_strip`, `q8_0_strip`, `q4_0_like_strip`): `(src, rows, blocks, dst, scales)`.
pub(super) type ScaledStripFn = unsafe fn(&[u8], usize, usize, &mut [u8], &mut [f32]);

/// One strip of `w`'s k-quant rows beside its tile bytes: the strip's first row, its rows
/// (at most 16; the rest of the strip is padding) and the tile bytes it fills.
pub(super) struct Strip<'a> {
    pub r0: usize,
    pub src: &'a [u8],
    pub rows: usize,
    pub dst: &'a mut [u8],
}

/// `w`'s blocks per row and bytes per block, and its strips over `bytes`, `strip_bytes` each.
pub(super) fn strips<'a>(
    w: Rows<'a>,
    bytes: &'a mut [u8],
    strip_bytes: usize,
) -> (usize, usize, impl Iterator<Item = Strip<'a>>) {
    let (blocks, block) = (w.k / w.ty.block_size(), w.ty.block_bytes());
    let it = bytes
        .chunks_exact_mut(strip_bytes)
        .enumerate()
        .map(move |(strip, dst)| {
            let r0 = strip * STRIP;
            Strip {
                r0,
                src: w.bytes.get(r0 * blocks * block..).unwrap_or(&[]),
                rows: w.n.saturating_sub(r0).min(STRIP),
                dst,
            }
        });
    (blocks, block, it)
}

/// Dwords gathered from a strip's rows, a row per lane (`vpgatherdd`): the rows' block
/// headers as 16 lanes. Lanes past `rows` read nothing and are zero.
pub(super) struct RowGather {
    /// The lanes of the strip's rows.
    pub mask: __mmask16,
    /// Each lane's row offset.
    at: __m512i,
    row_bytes: usize,
}

impl RowGather {
    /// For `rows` rows (at most 16) of `row_bytes` bytes at the start of `src`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) fn new(src: &[u8], rows: usize, row_bytes: usize) -> Self {
        assert!(rows <= 16 && src.len() >= rows * row_bytes);
        let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        Self {
            mask: if rows == 16 { !0 } else { (1 << rows) - 1 },
            at: _mm512_mullo_epi32(lanes, _mm512_set1_epi32(row_bytes as i32)),
            row_bytes,
        }
    }

    /// The 4 bytes at `off` of each row of `src` (the `src` given to [`RowGather::new`]).
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) fn dword(&self, src: &[u8], off: usize) -> __m512i {
        let rows = self.mask.count_ones() as usize;
        assert!(off + 4 <= self.row_bytes && src.len() >= rows * self.row_bytes);
        // SAFETY: the lanes below `rows` read 4 bytes at `off` of their row, within `src`
        // (checked above); masked lanes read nothing.
        unsafe {
            let base = src.as_ptr().add(off);
            _mm512_mask_i32gather_epi32::<1>(
                _mm512_setzero_si512(),
                self.mask,
                self.at,
                base.cast(),
            )
        }
    }
}

/// The next strip's rows (the 16 after a strip's, contiguous), fetched into L2 while a strip
/// is transposed, a share of their lines per step: an expert's blocks come from DRAM, and
/// sixteen rows read side by side were too many streams for the hardware prefetcher.
struct NextStrip {
    next: *const u8,
    lines: usize,
    per_step: usize,
}

impl NextStrip {
    /// For a strip of `bytes` bytes from the start of `src`, transposed in `steps` steps.
    fn new(src: &[u8], bytes: usize, steps: usize) -> Self {
        let lines = bytes / 64;
        Self {
            next: src.as_ptr().wrapping_add(bytes),
            lines,
            per_step: lines.div_ceil(steps.max(1)),
        }
    }

    /// Fetches step `step`'s share.
    #[inline(always)]
    fn fetch(&self, step: usize) {
        let first = step * self.per_step;
        for line in first..(first + self.per_step).min(self.lines) {
            // A prefetch does not fault: past the matrix's end it fetches nothing useful.
            // SAFETY: SSE is part of x86-64.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(self.next.wrapping_add(64 * line).cast()) };
        }
    }
}

/// Writes the INT8 tile lines of one strip of Q4_K rows: `rows` rows (at most 16; the rest
/// of the strip is the stored zero) of `blocks` blocks of `block` bytes in `src`, into `dst`
/// (64 lines per block). Each 64-`k` chunk of a row is 32 bytes of nibbles (low: the first
/// sub-block, high: the second): dword `d` of the bytes holds quad `d` of the chunk in its low
/// nibbles and quad `8 + d` in its high ones. So the bytes are transposed while packed (16
/// rows of 8 dwords into 8 registers of 16 rows) and each register gives two lines by a mask
/// and a shift: a third of the shuffles of transposing the unpacked values. A 64x2048 tile
/// (with its scales) in 4.7-5.0 us against 5.3-5.6 on an Emerald Rapids core (2026-12-01,
/// `tile_fill_and_kernel_timing`, three alternating rounds).
///
/// # Safety
/// AVX-512 F/BW/VL must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
pub(super) unsafe fn q4_k_strip(
    src: &[u8],
    rows: usize,
    blocks: usize,
    block: usize,
    dst: &mut [u8],
) {
    let row_bytes = blocks * block;
    assert!(rows <= 16 && src.len() >= rows * row_bytes && dst.len() >= blocks * 64 * 64);
    let nib = _mm512_set1_epi8(0x0f);
    let next = NextStrip::new(src, rows * row_bytes, 4 * blocks);
    for b in 0..blocks {
        for p in 0..4 {
            next.fetch(4 * b + p);
            // SAFETY: the caller checked the features; `src` holds `rows` rows (checked above).
            let dwords = unsafe { dwords_by_row(src, rows, row_bytes, b * block + 16 + 32 * p) };
            let lines = &mut dst[(64 * b + 16 * p) * 64..][..16 * 64];
            for (d, v) in dwords.into_iter().enumerate() {
                let lo = _mm512_and_si512(v, nib);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib);
                // SAFETY: lines `d` and `8 + d` lie within `lines` (16 lines).
                unsafe {
                    _mm512_storeu_si512(lines.as_mut_ptr().add(64 * d).cast(), lo);
                    _mm512_storeu_si512(lines.as_mut_ptr().add(64 * (8 + d)).cast(), hi);
                }
            }
        }
    }
}

/// Writes the INT8 tile lines of one strip of Q5_K rows (as [`q4_k_strip`] does Q4_K's): its
/// `qs` nibbles (at byte 48) with their fifth bit from the block's 32 `qh` bytes (at 16; bit
/// `j` of `qh[l]` for value `l` of group `j`), both transposed packed. Its scales and biases
/// are [`q4_k_strip_scales`]'s: the block header is laid out as Q4_K's.
///
/// # Safety
/// AVX-512 F/BW/VL must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
pub(super) unsafe fn q5_k_strip(
    src: &[u8],
    rows: usize,
    blocks: usize,
    block: usize,
    dst: &mut [u8],
) {
    let row_bytes = blocks * block;
    assert!(rows <= 16 && src.len() >= rows * row_bytes && block >= 176);
    assert!(dst.len() >= blocks * 64 * 64);
    let (nib, one) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(1));
    let next = NextStrip::new(src, rows * row_bytes, 4 * blocks);
    for b in 0..blocks {
        // SAFETY: the caller checked the features; `src` holds `rows` rows (checked above).
        let qh = unsafe { dwords_by_row(src, rows, row_bytes, b * block + 16) };
        for p in 0..4 {
            next.fetch(4 * b + p);
            // SAFETY: as above.
            let qs = unsafe { dwords_by_row(src, rows, row_bytes, b * block + 48 + 32 * p) };
            let lines = &mut dst[(64 * b + 16 * p) * 64..][..16 * 64];
            for (d, (v, h)) in qs.into_iter().zip(qh).enumerate() {
                let high = |bit: u32| {
                    let h = _mm512_srl_epi16(h, _mm_cvtsi32_si128(bit as i32));
                    _mm512_slli_epi16::<4>(_mm512_and_si512(h, one))
                };
                let lo = _mm512_or_si512(_mm512_and_si512(v, nib), high(2 * p as u32));
                let hi = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib),
                    high(2 * p as u32 + 1),
                );
                // SAFETY: lines `d` and `8 + d` lie within `lines` (16 lines).
                unsafe {
                    _mm512_storeu_si512(lines.as_mut_ptr().add(64 * d).cast(), lo);
                    _mm512_storeu_si512(lines.as_mut_ptr().add(64 * (8 + d)).cast(), hi);
                }
            }
        }
    }
}

/// The 32 bytes at `at` of each of the strip's `rows` rows (`row_bytes` apart in `src`; at
/// most 16, the rest read as zero) as 8 registers of one dword per row: register `d` holds
/// dword `d` of every row, in row order. For a Q4_K chunk of 64 `k` (its 32 bytes of
/// nibbles), register `d` holds quad `d` of the chunk in its low nibbles and quad `8 + d` in
/// its high ones.
///
/// # Safety
/// AVX-512 F/BW/VL must be available; `src` must hold `rows` rows.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
unsafe fn dwords_by_row(src: &[u8], rows: usize, row_bytes: usize, at: usize) -> [__m512i; 8] {
    // `vpermt2q` indices: 128-bit lanes 0 and 2 (or 1 and 3) of the two sources, alternated.
    let (even, odd) = (
        _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0),
        _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2),
    );
    let chunk = |c: usize| {
        if c >= rows {
            return _mm256_setzero_si256();
        }
        let bytes = &src[c * row_bytes + at..][..32];
        // SAFETY: `bytes` holds 32 bytes.
        unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
    };
    // `z[c]`: row `c`'s 8 dwords, then row `c + 8`'s.
    let z: [__m512i; 8] = std::array::from_fn(|c| {
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(chunk(c)), chunk(c + 8))
    });
    // An 8x8 dword transpose in each 256-bit half: `u[e]` holds, per 128-bit lane `l`, dword
    // `4 (l % 2) + e` of rows 0-3 (of the half), `u[4 + e]` of rows 4-7.
    let t: [__m512i; 8] = std::array::from_fn(|i| {
        let (a, b) = (z[i / 2 * 2], z[i / 2 * 2 + 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_epi32(a, b)
        } else {
            _mm512_unpackhi_epi32(a, b)
        }
    });
    let u: [__m512i; 8] = std::array::from_fn(|i| {
        let (h, e) = (i / 4, i % 4);
        let (a, b) = (t[4 * h + e / 2], t[4 * h + e / 2 + 2]);
        if e % 2 == 0 {
            _mm512_unpacklo_epi64(a, b)
        } else {
            _mm512_unpackhi_epi64(a, b)
        }
    });
    std::array::from_fn(|d| {
        let idx = if d < 4 { even } else { odd };
        _mm512_permutex2var_epi64(u[d % 4], idx, u[4 + d % 4])
    })
}

/// Writes the INT8 tile lines of one strip of Q6_K rows (as [`q4_k_strip`] takes them; 64
/// lines per block): each value's stored byte `q - 32 + 128` (rows past `rows` the stored
/// zero, 128), its scale per 16 left to [`q6_k_strip_scales`]. Each 64-`k` chunk of a row is
/// 64 bytes of `ql` nibbles (low for the chunk at the start of a half, high for the next) with
/// two bits per value from the half's 32 `qh` bytes (bits `2c` for quarter `c`).
///
/// # Safety
/// AVX-512 F/BW/VL must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
pub(super) unsafe fn q6_k_strip(
    src: &[u8],
    rows: usize,
    blocks: usize,
    block: usize,
    dst: &mut [u8],
) {
    let row_bytes = blocks * block;
    assert!(rows <= 16 && src.len() >= rows * row_bytes && block >= 210);
    assert!(dst.len() >= blocks * 64 * 64);
    let (nib, two, zero) = (
        _mm512_set1_epi8(0x0f),
        _mm512_set1_epi8(0x03),
        _mm512_set1_epi8(96),
    );
    let next = NextStrip::new(src, rows * row_bytes, 4 * blocks);
    for b in 0..blocks {
        for p in 0..4 {
            next.fetch(4 * b + p);
            // Chunk `p` is quarters `2 (p % 2)` and `2 (p % 2) + 1` of half `p / 2`: the
            // lower 32 bytes take `qh` bits `4 (p % 2)`, the upper `4 (p % 2) + 2`.
            let (h, pair) = (p / 2, p % 2);
            let qh_shift = _mm512_inserti64x4::<1>(
                _mm512_set1_epi16(4 * pair as i16),
                _mm256_set1_epi16(4 * pair as i16 + 2),
            );
            let r: [__m512i; 16] = std::array::from_fn(|c| {
                if c >= rows {
                    return _mm512_set1_epi8(-128);
                }
                let x = c * row_bytes + b * block;
                // SAFETY: 64 bytes of `ql` at `64 h` and 32 of `qh` at `128 + 32 h` lie within
                // row `c`'s block `b` (checked above).
                let (ql, qh) = unsafe {
                    (
                        _mm512_loadu_si512(src.as_ptr().add(x + 64 * h).cast()),
                        _mm256_loadu_si256(src.as_ptr().add(x + 128 + 32 * h).cast()),
                    )
                };
                let low = if pair == 0 {
                    ql
                } else {
                    _mm512_srli_epi16::<4>(ql)
                };
                let qh = _mm512_srlv_epi16(_mm512_broadcast_i64x4(qh), qh_shift);
                let high = _mm512_slli_epi16::<4>(_mm512_and_si512(qh, two));
                let q = _mm512_or_si512(_mm512_and_si512(low, nib), high);
                _mm512_add_epi8(q, zero)
            });
            // SAFETY: the caller checked the features; the 16 lines from `64 b + 16 p`
            // lie within `dst` (checked above).
            unsafe { transpose16_regs(r, &mut dst[(64 * b + 16 * p) * 64..]) };
        }
    }
}

/// Writes the INT8 tile lines of one strip of Q3_K rows (as [`q4_k_strip`] takes them; 64
/// lines per block): each value's stored byte `q + 128` (rows past `rows` the stored zero,
/// 128), its scale per 16 left to [`q3_k_strip_scales`]. Value `l` of quarter `c` of half `h`
/// is bits `2c` of `qs[32 h + l]` (`qs` at byte 32), minus 4 where bit `4 h + c` of
/// `hmask[l]` (bytes 0-31) is clear; each 64-`k` chunk is two quarters of one half.
///
/// # Safety
/// AVX-512 F/BW/VL must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
pub(super) unsafe fn q3_k_strip(
    src: &[u8],
    rows: usize,
    blocks: usize,
    block: usize,
    dst: &mut [u8],
) {
    let row_bytes = blocks * block;
    assert!(rows <= 16 && src.len() >= rows * row_bytes && block >= 110);
    assert!(dst.len() >= blocks * 64 * 64);
    let (two, one, zero) = (
        _mm512_set1_epi8(0x03),
        _mm512_set1_epi8(0x01),
        _mm512_set1_epi8(124),
    );
    let next = NextStrip::new(src, rows * row_bytes, 4 * blocks);
    for b in 0..blocks {
        for p in 0..4 {
            next.fetch(4 * b + p);
            // Chunk `p` is quarters `2 (p % 2)` (lower 32 bytes) and `2 (p % 2) + 1` (upper)
            // of half `p / 2`.
            let (h, c) = (p / 2, 2 * (p % 2));
            let pair = |lo: usize| {
                _mm512_inserti64x4::<1>(
                    _mm512_set1_epi16(lo as i16),
                    _mm256_set1_epi16(lo as i16 + 1),
                )
            };
            let (q_shift, h_shift) = (_mm512_slli_epi16::<1>(pair(c)), pair(4 * h + c));
            let r: [__m512i; 16] = std::array::from_fn(|row| {
                if row >= rows {
                    return _mm512_set1_epi8(-128);
                }
                let x = row * row_bytes + b * block;
                // SAFETY: 32 bytes of `hmask` at 0 and of `qs` at `32 + 32 h` lie within row
                // `row`'s block `b` (checked above).
                let (hm, qs) = unsafe {
                    (
                        _mm256_loadu_si256(src.as_ptr().add(x).cast()),
                        _mm256_loadu_si256(src.as_ptr().add(x + 32 + 32 * h).cast()),
                    )
                };
                let low = _mm512_srlv_epi16(_mm512_broadcast_i64x4(qs), q_shift);
                let high = _mm512_srlv_epi16(_mm512_broadcast_i64x4(hm), h_shift);
                let high = _mm512_slli_epi16::<2>(_mm512_and_si512(high, one));
                let q = _mm512_or_si512(_mm512_and_si512(low, two), high);
                _mm512_add_epi8(q, zero)
            });
            // SAFETY: the caller checked the features; the 16 lines from `64 b + 16 p`
            // lie within `dst` (checked above).
            unsafe { transpose16_regs(r, &mut dst[(64 * b + 16 * p) * 64..]) };
        }
    }
}

/// The scales per 16 (`d · (sc - 32)`, as `unpack` computes them) of one strip of Q3_K rows
/// (as [`q3_k_strip`] takes them) into `scales`, the strip's `[group][16]`, 16 rows at a time
/// in the lanes; lanes past `rows` get zero. Scale `u`'s low four bits are nibble `u / 8` of
/// byte `u % 8` of the 12 scale bytes (at 96), its top two bits are bits `2 (u / 4)` of byte
/// `8 + u % 4`.
///
/// # Safety
/// AVX-512 F/BW/VL and F16C must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub(super) unsafe fn q3_k_strip_scales(
    src: &[u8],
    rows: usize,
    blocks: usize,
    block: usize,
    scales: &mut [f32],
) {
    let row_bytes = blocks * block;
    assert!(rows <= 16 && src.len() >= rows * row_bytes && block >= 110);
    assert!(scales.len() >= blocks * 16 * 16);
    let gather = RowGather::new(src, rows, row_bytes);
    let mask = gather.mask;
    let (nibble, two_bits, bias) = (
        _mm512_set1_epi32(0x0f),
        _mm512_set1_epi32(0x03),
        _mm512_set1_epi32(32),
    );
    for b in 0..blocks {
        let [w0, w1, w2, dw] = [96, 100, 104, 106].map(|off| gather.dword(src, b * block + off));
        // `d` is the f16 at 108: the upper half of the word at 106.
        let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(dw)));
        for u in 0..16 {
            let low_word = if u % 8 < 4 { w0 } else { w1 };
            let low_shift = _mm512_set1_epi32((8 * (u % 4) + 4 * (u / 8)) as i32);
            let high_shift = _mm512_set1_epi32((8 * (u % 4) + 2 * (u / 4)) as i32);
            let low = _mm512_and_si512(_mm512_srlv_epi32(low_word, low_shift), nibble);
            let high = _mm512_and_si512(_mm512_srlv_epi32(w2, high_shift), two_bits);
            let sc = _mm512_sub_epi32(_mm512_or_si512(low, _mm512_slli_epi32::<4>(high)), bias);
            let s = _mm512_maskz_mul_ps(mask, d, _mm512_cvtepi32_ps(sc));
            // SAFETY: group `16 b + u` of the strip's scales lies within `scales` (checked
            // above).
            unsafe { _mm512_storeu_ps(scales.as_mut_ptr().add(16 * (16 * b + u)), s) };
        }
    }
}

/// The scales per 16 (`d · sc`, as `unpack` computes them) of one strip of Q6_K rows (as
/// [`q6_k_strip`] takes them) into `scales`, the strip's `[group][16]`, 16 rows at a time in
/// the lanes; lanes past `rows` get zero.
///
/// # Safety
/// AVX-512 F/BW/VL and F16C must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub(super) unsafe fn q6_k_strip_scales(
    src: &[u8],
    rows: usize,
    blocks: usize,
    block: usize,
    scales: &mut [f32],
) {
    let row_bytes = blocks * block;
    assert!(rows <= 16 && src.len() >= rows * row_bytes && block >= 210);
    assert!(scales.len() >= blocks * 16 * 16);
    let gather = RowGather::new(src, rows, row_bytes);
    let mask = gather.mask;
    for b in 0..blocks {
        let [s0, s1, s2, s3, dw] =
            [192, 196, 200, 204, 206].map(|off| gather.dword(src, b * block + off));
        // `d` is the f16 at 208: the upper half of the word at 206.
        let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(dw)));
        for (j, v) in [s0, s1, s2, s3].into_iter().enumerate() {
            for i in 0..4 {
                // Byte `i` of each lane, sign-extended.
                let sc = _mm512_srai_epi32::<24>(_mm512_sllv_epi32(
                    v,
                    _mm512_set1_epi32(24 - 8 * i as i32),
                ));
                let s = _mm512_maskz_mul_ps(mask, d, _mm512_cvtepi32_ps(sc));
                // SAFETY: group `16 b + 4 j + i` of the strip's scales lies within `scales`
                // (checked above).
                unsafe { _mm512_storeu_ps(scales.as_mut_ptr().add(16 * (16 * b + 4 * j + i)), s) };
            }
        }
    }
}

/// The group scales (`d · sc`) and biases (`-(dmin · m)`) of one strip of Q4_K rows (as
/// [`q4_k_strip`] takes them), 16 rows at a time in the lanes: `scales` is the strip's
/// `[group][16]`, `bias` the whole `[group][n_pad]`, the strip's rows from column `r0`.
/// Bit for bit `unpack`'s `k4_scales`; lanes past `rows` get zero.
///
/// # Safety
/// AVX-512 F/BW/VL must be available.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub(super) unsafe fn q4_k_strip_scales(
    src: &[u8],
    rows: usize,
    blocks: usize,
    block: usize,
    scales: &mut [f32],
    bias: &mut [f32],
    r0: usize,
    n_pad: usize,
) {
    let row_bytes = blocks * block;
    assert!(rows <= 16 && src.len() >= rows * row_bytes && block >= 16);
    assert!(scales.len() >= blocks * 8 * 16 && bias.len() >= (blocks * 8 - 1) * n_pad + r0 + 16);
    let gather = RowGather::new(src, rows, row_bytes);
    let mask = gather.mask;
    let (k1, k2, k3) = (
        _mm512_set1_epi32(0x3f3f3f3f),
        _mm512_set1_epi32(0x0f0f0f0f),
        _mm512_set1_epi32(0x03030303),
    );
    let (byte, sign) = (_mm512_set1_epi32(0xff), _mm512_set1_epi32(i32::MIN));
    for b in 0..blocks {
        let [dm, u0, u1, u2] = [0, 4, 8, 12].map(|off| gather.dword(src, b * block + off));
        let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
        let dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(dm)));
        // The 6-bit scales and mins of sub-blocks 0-3 are the low bits of bytes 0-3 and
        // 4-7; those of 4-7 are the nibbles of bytes 8-11 with the top two bits of bytes
        // 0-3 (scales) and 4-7 (mins) above them.
        let hi2 =
            |u: __m512i| _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u), k3));
        let sc = [
            _mm512_and_si512(u0, k1),
            _mm512_or_si512(_mm512_and_si512(u2, k2), hi2(u0)),
        ];
        let mn = [
            _mm512_and_si512(u1, k1),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32::<4>(u2), k2), hi2(u1)),
        ];
        for j in 0..8 {
            let shift = _mm512_set1_epi32(8 * (j as i32 % 4));
            let field = |v: __m512i| {
                _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(v, shift), byte))
            };
            let s = _mm512_maskz_mul_ps(mask, d, field(sc[j / 4]));
            // Negated by its sign bit, as `-(dmin · m)` negates (zero becomes -0).
            let m = _mm512_castps_si512(_mm512_mul_ps(dmin, field(mn[j / 4])));
            let m = _mm512_maskz_mov_ps(mask, _mm512_castsi512_ps(_mm512_xor_si512(m, sign)));
            let g = 8 * b + j;
            // SAFETY: group `g` of the strip's scales and 16 biases from `g n_pad + r0`
            // lie within the slices (checked above).
            unsafe {
                _mm512_storeu_ps(scales.as_mut_ptr().add(16 * g), s);
                _mm512_storeu_ps(bias.as_mut_ptr().add(g * n_pad + r0), m);
            }
        }
    }
}

/// The 8 group scales `d · (ls - 32)` of block `b` of the strip's IQ4_XS rows (`rows` rows,
/// `row_bytes` apart in `src`), one register each with a row per lane (zero past `rows`),
/// as `unpack` computes them.
///
/// # Safety
/// AVX-512 F/BW/VL and F16C must be available; `src` must hold `rows` rows of at least
/// `b + 1` blocks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
unsafe fn iq4_xs_scales(src: &[u8], rows: usize, row_bytes: usize, b: usize) -> [__m512; 8] {
    assert!(rows <= 16 && src.len() >= rows * row_bytes && row_bytes >= 136 * (b + 1));
    let gather = RowGather::new(src, rows, row_bytes);
    let mask = gather.mask;
    let [head, scales_l] = [0, 4].map(|off| gather.dword(src, 136 * b + off));
    let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head));
    let scales_h = _mm512_srli_epi32::<16>(head);
    let field = |v: __m512i, shift: usize, bits: i32| {
        let v = _mm512_srl_epi32(v, _mm_cvtsi32_si128(shift as i32));
        _mm512_and_si512(v, _mm512_set1_epi32((1 << bits) - 1))
    };
    std::array::from_fn(|ib| {
        let ls = _mm512_or_si512(
            field(scales_l, 4 * ib, 4),
            _mm512_slli_epi32::<4>(field(scales_h, 2 * ib, 2)),
        );
        let ls = _mm512_sub_epi32(ls, _mm512_set1_epi32(32));
        _mm512_maskz_mul_ps(mask, d, _mm512_cvtepi32_ps(ls))
    })
}

/// Writes the INT8 tile lines of one strip of IQ4_XS rows (`rows` rows, at most 16, of
/// `blocks` blocks of 136 bytes in `src`; 8 lines per group of 32 in `dst`): each value's
/// grid value plus 128 (rows past `rows` the stored zero, 128), looked up with `vpshufb`
/// from the transposed nibbles; the group scales into `scales`, the strip's `[group][16]`.
///
/// # Safety
/// AVX-512 F/BW/VL and F16C must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
pub(super) unsafe fn iq4_xs_strip(
    src: &[u8],
    rows: usize,
    blocks: usize,
    dst: &mut [u8],
    scales: &mut [f32],
) {
    let row_bytes = blocks * 136;
    assert!(rows <= 16 && src.len() >= rows * row_bytes && dst.len() >= blocks * 8 * 8 * 64);
    assert!(scales.len() >= blocks * 8 * 16);
    let stored = crate::ggml::unpack::KVALUES_IQ4NL.map(|v| (v as u8) ^ 0x80);
    // SAFETY: `stored` holds 16 bytes.
    let grid = _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(stored.as_ptr().cast()) });
    let padding: __mmask16 = if rows == 16 { 0 } else { !0 << rows };
    let (nib, zero) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(-128));
    let next = NextStrip::new(src, rows * row_bytes, 4 * blocks);
    for b in 0..blocks {
        // SAFETY: the caller checked the features and `src` (above).
        let sc = unsafe { iq4_xs_scales(src, rows, row_bytes, b) };
        for (ib, sc) in sc.into_iter().enumerate() {
            // SAFETY: group `8 b + ib`'s 16 scales lie within `scales` (checked above).
            unsafe { _mm512_storeu_ps(scales.as_mut_ptr().add(16 * (8 * b + ib)), sc) };
        }
        for p in 0..4 {
            next.fetch(4 * b + p);
            // SAFETY: the caller checked the features; `src` holds `rows` rows (checked above).
            let dwords = unsafe { dwords_by_row(src, rows, row_bytes, 136 * b + 8 + 32 * p) };
            for (i, v) in dwords.into_iter().enumerate() {
                // Dword `i % 4` of group `2 p + i / 4`: its values `4 (i % 4) ..` in the low
                // nibbles, `16 + 4 (i % 4) ..` in the high ones.
                let g = 8 * b + 2 * p + i / 4;
                let lines = &mut dst[8 * g * 64..][..8 * 64];
                for (line, q) in [(i % 4, v), (4 + i % 4, _mm512_srli_epi16::<4>(v))] {
                    let bytes = _mm512_shuffle_epi8(grid, _mm512_and_si512(q, nib));
                    let bytes = _mm512_mask_blend_epi32(padding, bytes, zero);
                    // SAFETY: `line` < 8 lies within `lines`.
                    unsafe { _mm512_storeu_si512(lines.as_mut_ptr().add(64 * line).cast(), bytes) };
                }
            }
        }
    }
}

/// Writes the INT8 tile lines of one strip of Q8_0 rows (`rows` rows, at most 16, of
/// `blocks` blocks of 34 bytes in `src`; 8 lines per block in `dst`): each value's byte plus
/// 128 (rows past `rows` the stored zero, 128), the rows' `d` as the block's 16 scales in
/// `scales` (the strip's `[block][16]`, zero past `rows`). A block's 32 values transposed
/// while packed are its 8 lines. Through the generic fill (every row decoded into scratch,
/// then transposed, with no prefetch of the next strip) a cold Q8_0 expert took its INT8
/// tiles 1.6-1.7x the time of its BF16 ones at 1-4 tokens per expert on a Zen 5 EPYC
/// (2026-12-02, `strata bench moe --crossover`).
///
/// # Safety
/// AVX-512 F/BW/VL and F16C must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
pub(super) unsafe fn q8_0_strip(
    src: &[u8],
    rows: usize,
    blocks: usize,
    dst: &mut [u8],
    scales: &mut [f32],
) {
    let row_bytes = blocks * 34;
    assert!(rows <= 16 && src.len() >= rows * row_bytes && dst.len() >= blocks * 8 * 64);
    assert!(scales.len() >= blocks * 16);
    let gather = RowGather::new(src, rows, row_bytes);
    let flip = _mm512_set1_epi8(-128);
    let next = NextStrip::new(src, rows * row_bytes, blocks);
    for b in 0..blocks {
        next.fetch(b);
        let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(gather.dword(src, 34 * b)));
        // SAFETY: block `b`'s 16 scales lie within `scales` (checked above).
        unsafe { _mm512_storeu_ps(scales.as_mut_ptr().add(16 * b), d) };
        // SAFETY: the caller checked the features; `src` holds `rows` rows (checked above).
        let dwords = unsafe { dwords_by_row(src, rows, row_bytes, 34 * b + 2) };
        for (line, v) in dwords.into_iter().enumerate() {
            // SAFETY: line `8 b + line` lies within `dst` (checked above).
            unsafe {
                let at = dst.as_mut_ptr().add(64 * (8 * b + line));
                _mm512_storeu_si512(at.cast(), _mm512_xor_si512(v, flip));
            }
        }
    }
}

/// Writes the INT8 tile lines of one strip of Q4_0 rows (`{f16 d; u8 qs[16]}`, value `q - 8`)
/// or, with `FIVE`, Q5_0 rows (`{f16 d; u32 qh; u8 qs[16]}`, the fifth bit of value `j` bit
/// `j` of `qh`, value `q - 16`): `rows` rows, at most 16, of `blocks` blocks in `src`, 8 lines
/// per block in `dst`, each value's byte plus 128 (rows past `rows` the stored zero, 128);
/// the rows' `d` as the block's 16 scales in `scales` (the strip's `[block][16]`, zero past
/// `rows`). Dword `i` of the 16 bytes of nibbles, gathered across the rows, holds line `i` in
/// its low nibbles and line `4 + i` in its high ones; a line's four fifth bits are spread to
/// bit 4 of their bytes by one multiply (bit `k` times `2^(4 + 7k)` lands on `8k + 4`, and
/// no other product of the four reaches those bits).
///
/// # Safety
/// AVX-512 F/BW/VL and F16C must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
pub(super) unsafe fn q4_0_like_strip<const FIVE: bool>(
    src: &[u8],
    rows: usize,
    blocks: usize,
    dst: &mut [u8],
    scales: &mut [f32],
) {
    let (block, qs) = if FIVE { (22, 6) } else { (18, 2) };
    let row_bytes = blocks * block;
    assert!(rows <= 16 && src.len() >= rows * row_bytes && dst.len() >= blocks * 8 * 64);
    assert!(scales.len() >= blocks * 16);
    let gather = RowGather::new(src, rows, row_bytes);
    let padding: __mmask16 = if rows == 16 { 0 } else { !0 << rows };
    let nib = _mm512_set1_epi8(0x0f);
    // The stored byte `q - offset + 128`.
    let to_stored = _mm512_set1_epi8(if FIVE { 112 } else { 120 });
    let zero = _mm512_set1_epi8(-128);
    let (spread, bit4) = (
        _mm512_set1_epi32((1 << 4) | (1 << 11) | (1 << 18) | (1 << 25)),
        _mm512_set1_epi32(0x1010_1010),
    );
    let next = NextStrip::new(src, rows * row_bytes, blocks);
    for b in 0..blocks {
        next.fetch(b);
        let at = block * b;
        let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(gather.dword(src, at)));
        // SAFETY: block `b`'s 16 scales lie within `scales` (checked above).
        unsafe { _mm512_storeu_ps(scales.as_mut_ptr().add(16 * b), d) };
        let qh = if FIVE {
            gather.dword(src, at + 2)
        } else {
            _mm512_setzero_si512()
        };
        for i in 0..4 {
            let q = gather.dword(src, at + qs + 4 * i);
            for (line, nibbles) in [(i, q), (4 + i, _mm512_srli_epi32::<4>(q))] {
                let mut v = _mm512_and_si512(nibbles, nib);
                if FIVE {
                    // Values `4 line ..` (line < 4) or `16 + 4 (line - 4) ..`: bits `4 line ..`
                    // of `qh` either way.
                    let h = _mm512_srl_epi32(qh, _mm_cvtsi32_si128(4 * line as i32));
                    let h = _mm512_mullo_epi32(_mm512_and_si512(h, _mm512_set1_epi32(0xf)), spread);
                    // v | (h & bit4)
                    v = _mm512_ternarylogic_epi32::<0xf8>(v, h, bit4);
                }
                let v = _mm512_mask_blend_epi32(padding, _mm512_add_epi8(v, to_stored), zero);
                // SAFETY: line `8 b + line` lies within `dst` (checked above).
                unsafe { _mm512_storeu_si512(dst.as_mut_ptr().add(64 * (8 * b + line)).cast(), v) };
            }
        }
    }
}
