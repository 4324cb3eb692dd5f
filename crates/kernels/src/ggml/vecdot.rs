//! Row-dot kernels that decode ggml blocks in registers: one weight row, read straight from
//! its bytes (usually a mapped file), against up to four tokens' int8 activations at a time.
//!
//! These are the hot path of decode and of small expert batches. The general integer path
//! (`super::unpack` + `super::dot`) writes each decoded row to scratch and reads it back,
//! which costs about twice the dot product itself; here a block's values go from the loaded
//! bytes into `maddubs` directly. Weights in 256-value blocks meet activations quantized per
//! 256 (`super::dot::Q8Rows` with `block` 256): a block's integer sub-scales multiply the
//! integer products (`madd`), its mins and offsets multiply the activations' integer sums per
//! 16, and the sum is converted to f32 once per block, as ggml's `vec_dot_*_q8_K` do.
//! Weights in blocks of 32 carry an f32 scale per block, so they convert per 32.
//!
//! Each kernel's plain twin is the general integer path, which computes the same integer
//! sums; tests compare them on random blocks.

use std::ops::Range;

use crate::Isa;

use super::GgmlType;
use super::dot::Q8Rows;

/// `tile[j · n_rows + r] = row_r · x[tokens.start + j]`: `n_rows` rows of whole blocks
/// (`src`, consecutive) against a range of activation rows.
pub(crate) type BlockDot =
    fn(src: &[u8], n_rows: usize, a: &Q8Rows, tokens: Range<usize>, tile: &mut [f32]);

/// Values per activation scale for weights of `ty` on every path: 256 for the k-quants with
/// in-register kernels (their integer sub-scales need one activation scale per block), 32
/// for the rest (finer rounding; their scales are applied per 16 or 32 in f32 anyway).
pub(crate) fn activation_block(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => 256,
        _ => 32,
    }
}

/// The in-register kernel for `ty` on `isa`, if there is one.
pub(crate) fn kernel(isa: Isa, ty: GgmlType) -> Option<BlockDot> {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        return match ty {
            GgmlType::Q4_K => Some(avx2::q4_k),
            GgmlType::Q5_K => Some(avx2::q5_k),
            GgmlType::Q6_K => Some(avx2::q6_k),
            GgmlType::Q8_0 => Some(avx2::q8_0),
            GgmlType::Q4_0 => Some(avx2::q4_0),
            _ => None,
        };
    }
    let _ = (isa, ty);
    None
}

#[cfg(target_arch = "x86_64")]
// Per-token accumulators read best indexed by the token, as the activation rows are.
#[allow(clippy::needless_range_loop)]
mod avx2 {
    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::Q8Rows;

    /// Safe entry points: check that the rows, the activations and the token range agree
    /// (the kernels' loads rely on it), then run the kernel four tokens at a time. Tokens are
    /// the outer loop: four tokens' activations stay in L1 while the block's rows pass by
    /// (and the rows, a few KiB, stay in L1 for the next four tokens).
    macro_rules! entry {
        ($name:ident, $kernel:ident, $block_bytes:literal, $values:literal) => {
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
                        && a.block() == $values
                        && tokens.end <= a.rows()
                        && tile.len() == tokens.len() * n_rows,
                    "{n_rows} rows of {rb} bytes against {} activations of {} per {}, \
                     tokens {tokens:?}, tile {}",
                    a.rows(),
                    a.k,
                    a.block(),
                    tile.len()
                );
                let t0 = tokens.start;
                for t in tokens.clone().step_by(4) {
                    let n = (tokens.end - t).min(4);
                    for (r, row) in src.chunks_exact(rb).enumerate() {
                        let mut o = [0.0f32; 4];
                        // SAFETY: `kernel` hands these out only for `Isa::Avx2` or better,
                        // which is selected only on CPUs with AVX2, FMA and F16C; the lengths
                        // were checked above.
                        unsafe {
                            match n {
                                4 => $kernel::<4>(row, a, t, &mut o),
                                3 => $kernel::<3>(row, a, t, &mut o),
                                2 => $kernel::<2>(row, a, t, &mut o),
                                _ => $kernel::<1>(row, a, t, &mut o),
                            }
                        }
                        for (j, v) in o[..n].iter().enumerate() {
                            tile[(t - t0 + j) * n_rows + r] = *v;
                        }
                    }
                }
            }
        };
    }

    entry!(q4_k, q4_k_n, 144, 256);
    entry!(q5_k, q5_k_n, 176, 256);
    entry!(q6_k, q6_k_n, 210, 256);
    entry!(q8_0, q8_0_n, 34, 32);
    entry!(q4_0, q4_0_n, 18, 32);

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

    /// One kernel call's activation rows, resolved once: values, scales per 32 and integer
    /// sums per 16 of tokens `t .. t + N`.
    struct Tokens<'a, const N: usize> {
        q: [&'a [i8]; N],
        s: [&'a [f32]; N],
        isums: [&'a [i16]; N],
    }

    impl<'a, const N: usize> Tokens<'a, N> {
        fn new(a: &'a Q8Rows, t: usize) -> Self {
            Self {
                q: std::array::from_fn(|j| a.q(t + j)),
                s: std::array::from_fn(|j| a.s(t + j)),
                isums: std::array::from_fn(|j| a.isums(t + j)),
            }
        }

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

    /// Q4_K: `{f16 d, dmin; u8 scales[12]; u8 qs[128]}`, value `d · sc · q - dmin · m` per
    /// sub-block of 32; each 32 bytes of `qs` hold two sub-blocks (low nibbles, then high).
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `row` is whole blocks matching `a.k`; `t + N <= a.rows()`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q4_k_n<const N: usize>(row: &[u8], a: &Q8Rows, t: usize, out: &mut [f32]) {
        let xt = Tokens::<N>::new(a, t);
        let m4 = _mm256_set1_epi8(0x0f);
        let mut acc = [_mm256_setzero_ps(); N];
        for (i, x) in row.chunks_exact(144).enumerate() {
            let (d, dmin) = (f16_at(x, 0), f16_at(x, 2));
            let (sc, mins) = k4_scales(&x[4..16]);
            let mut sumi = [_mm256_setzero_si256(); N];
            for c in 0..4 {
                // SAFETY: bytes 16 + 32 c .. 48 + 32 c lie within the 144-byte block.
                let q = unsafe { load(x.as_ptr().add(16 + 32 * c)) };
                let lo = _mm256_and_si256(q, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
                let (s_lo, s_hi) = (lane16(sc, 2 * c), lane16(sc, 2 * c + 1));
                for j in 0..N {
                    let p = 256 * i + 64 * c;
                    // SAFETY: block `i` of the row lies within `a.k` values; `t + j` is a row.
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
                acc[j] =
                    _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(sumi[j]), acc[j]);
                acc[j] =
                    _mm256_fnmadd_ps(_mm256_set1_ps(dmin * dx), _mm256_cvtepi32_ps(msum), acc[j]);
            }
        }
        for j in 0..N {
            out[j] = hsum(acc[j]);
        }
    }

    /// Q5_K: Q4_K's layout with `qh[32]` (bytes 16..48) holding the fifth bit, `qs` at 48;
    /// chunk `c` of 64 values takes bits `2c` and `2c + 1` of `qh`.
    ///
    /// # Safety
    /// As [`q4_k_n`].
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q5_k_n<const N: usize>(row: &[u8], a: &Q8Rows, t: usize, out: &mut [f32]) {
        let xt = Tokens::<N>::new(a, t);
        let m4 = _mm256_set1_epi8(0x0f);
        let bit4 = _mm256_set1_epi8(0x10);
        let mut acc = [_mm256_setzero_ps(); N];
        for (i, x) in row.chunks_exact(176).enumerate() {
            let (d, dmin) = (f16_at(x, 0), f16_at(x, 2));
            let (sc, mins) = k4_scales(&x[4..16]);
            // SAFETY: bytes 16..48 lie within the 176-byte block.
            let mut qh = unsafe { load(x.as_ptr().add(16)) };
            let mut sumi = [_mm256_setzero_si256(); N];
            for c in 0..4 {
                // SAFETY: bytes 48 + 32 c .. 80 + 32 c lie within the block.
                let q = unsafe { load(x.as_ptr().add(48 + 32 * c)) };
                // Bit 2c of each qh byte to bit 4, then bit 2c + 1; shift qh for the next c.
                let h_lo = _mm256_and_si256(_mm256_slli_epi16::<4>(qh), bit4);
                let h_hi = _mm256_and_si256(_mm256_slli_epi16::<3>(qh), bit4);
                qh = _mm256_srli_epi16::<2>(qh);
                let lo = _mm256_or_si256(_mm256_and_si256(q, m4), h_lo);
                let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(q), m4), h_hi);
                let (s_lo, s_hi) = (lane16(sc, 2 * c), lane16(sc, 2 * c + 1));
                for j in 0..N {
                    let p = 256 * i + 64 * c;
                    // SAFETY: block `i` of the row lies within `a.k` values; `t + j` is a row.
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
                acc[j] =
                    _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(sumi[j]), acc[j]);
                acc[j] =
                    _mm256_fnmadd_ps(_mm256_set1_ps(dmin * dx), _mm256_cvtepi32_ps(msum), acc[j]);
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
    unsafe fn q6_k_n<const N: usize>(row: &[u8], a: &Q8Rows, t: usize, out: &mut [f32]) {
        let xt = Tokens::<N>::new(a, t);
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
                        // SAFETY: block `i` lies within `a.k` values; `t + j` is a row.
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
    unsafe fn q8_0_n<const N: usize>(row: &[u8], a: &Q8Rows, t: usize, out: &mut [f32]) {
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
    unsafe fn q4_0_n<const N: usize>(row: &[u8], a: &Q8Rows, t: usize, out: &mut [f32]) {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml::GgmlMatrix;
    use crate::ggml::test_util::random_blocks;

    /// Each in-register kernel against the general integer path (the same integer sums),
    /// on random blocks, 1 to 7 tokens.
    #[test]
    fn in_register_kernels_match_the_unpacked_path() {
        let mut seed = 5;
        for ty in [
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::Q8_0,
            GgmlType::Q4_0,
        ] {
            for isa in Isa::available() {
                let Some(dot) = kernel(isa, ty) else { continue };
                let (n, k) = (3, 512);
                let bytes = random_blocks(ty, n * k / ty.block_size(), &mut seed);
                let w = GgmlMatrix::from_vec(ty, n, k, bytes).expect("valid matrix");
                for m in 1..=7 {
                    let x: Vec<f32> = (0..m * k)
                        .map(|i| ((i * 7919 + m) % 2001) as f32 / 1000.0 - 1.0)
                        .collect();
                    let mut want = vec![0.0f32; m * n];
                    w.matmul_with(Isa::Portable, &x, m, &mut want)
                        .expect("shapes");
                    let a =
                        Q8Rows::quantize(k, activation_block(ty), m, |r| &x[r * k..(r + 1) * k]);
                    let mut got = vec![f32::NAN; m * n];
                    dot(w.bytes(), n, &a, 0..m, &mut got);
                    for (i, (g, wv)) in got.iter().zip(&want).enumerate() {
                        let tol = 1e-4 * (1.0 + wv.abs());
                        assert!(
                            (g - wv).abs() <= tol,
                            "{ty} {isa:?} m {m} at {i}: {g} vs {wv}"
                        );
                    }
                }
            }
        }
    }
}
