//! INT8 tiles: a tile of ggml rows written as packed `Int8 { group: Some(32) }` (values
//! `q + 128`, lines of 16 rows x 4 `k`, a scale per row and 32 `k`).
//!
//! Types whose values are already `d · q` per 32 with one `d` and `q` in int8 (Q4_0, Q5_0,
//! Q8_0, IQ4_NL, IQ4_XS: [`exact`]) are stored as they are, with `d` as the group scale: the
//! tile holds the weights exactly. The others (mins, scales per 16, F16...) are decoded to f32
//! and requantized per 32 symmetrically (`amax / 127`, round to nearest even), an error of at
//! most `amax / 254` per weight, well under the 2- to 6-bit formats' own steps.
//!
//! The activations get a scale per 32 too (`Activations::int8_grouped`): with one per token,
//! four outlier channels at 64x the rest gave 6.6e-2 relative RMS error on Q4_K against 2.0e-3
//! for BF16 tiles; with one per 32, 1.05e-2 (the row-dot kernels' scale per 256: 3.0e-2).
//! The kernels flush per weight group of 32 anyway, so the extra scales cost a load per flush.

use super::super::unpack::UNIT;
use super::{GgmlType, Isa, LINE, PackedLayout, Rows, STRIP, Scratch, with_scratch};
use super::{dequantize_row, has_fast_kernel, unpack_rows};

/// `k` per scale of an INT8 tile: the block size of the 32-value formats, and the sub-block of
/// Q4_K / Q5_K / IQ4_XS.
pub(crate) const GROUP: usize = 32;

/// Whether `ty`'s decoded values are `d · q` with one `d` per [`GROUP`] and no min, so that
/// the tile stores them exactly.
pub(crate) fn exact(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, Q4_0 | Q5_0 | Q8_0 | IQ4_NL | IQ4_XS)
}

/// The scale (`amax / 127`) and its inverse for a group's absolute maximum, as two
/// independent divisions: the fill's inner loop waits on them.
#[inline(always)]
fn scales(amax: f32) -> (f32, f32) {
    if amax > 0.0 {
        (amax / 127.0, 127.0 / amax)
    } else {
        (1.0, 1.0)
    }
}

/// Requantizes one group of 32 values: returns the scale and writes the stored bytes
/// (`q + 128`). Shared with the tests' twin, which must round exactly alike.
#[inline(always)]
pub(crate) fn requantize(v: &[f32; GROUP], out: &mut [u8; GROUP]) -> f32 {
    // |v| ordered as its bits without the sign (NaN as zero): an integer maximum, which
    // vectorises, where a chain of `f32::max` would not.
    let amax = v.iter().fold(0u32, |a, x| {
        let b = x.to_bits() & 0x7fff_ffff;
        a.max(if b > 0x7f80_0000 { 0 } else { b })
    });
    let amax = f32::from_bits(amax);
    let (scale, inv) = scales(amax);
    for (o, &x) in out.iter_mut().zip(v) {
        // Clamped in f32 (|x| / scale may round just past 127), NaN to 0, so that the
        // conversion needs no saturation and the loop vectorises.
        let y = x * inv;
        let y = if y.is_nan() { 0.0 } else { y };
        let y = y.clamp(-127.0, 127.0).round_ties_even();
        // SAFETY: `y` is an integer in [-127, 127], representable in i32.
        let q = unsafe { y.to_int_unchecked::<i32>() };
        *o = (q + 128) as u8;
    }
    scale
}

/// Writes `w` as a packed INT8 tile: values into `bytes`, scales (`[strip][group][16]`) into
/// `scales`. Padding rows and columns are zero (stored 128) with scale zero.
pub(super) fn fill(w: Rows<'_>, bytes: &mut [u8], scales: &mut [f32], layout: &PackedLayout) {
    with_scratch(|s| {
        #[cfg(target_arch = "x86_64")]
        {
            if Isa::selected() >= Isa::Avx512 {
                // SAFETY: `Isa::Avx512` or better is only selected when the CPU has AVX-512
                // F/BW.
                return unsafe { fill_avx512(s, w, bytes, scales, layout) };
            }
            if Isa::selected() >= Isa::Avx2 {
                // SAFETY: `Isa::Avx2` or better is only selected when the CPU has AVX2 and FMA.
                return unsafe { fill_avx2(s, w, bytes, scales, layout) };
            }
        }
        fill_body::<false>(s, w, bytes, scales, layout);
    });
}

/// [`fill_body`] with the AVX-512 group and transpose routines (`x86`).
///
/// # Safety
/// The CPU must support AVX-512 F, BW and VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn fill_avx512(
    s: &mut Scratch,
    w: Rows<'_>,
    bytes: &mut [u8],
    scales: &mut [f32],
    layout: &PackedLayout,
) {
    fill_body::<true>(s, w, bytes, scales, layout);
}

/// [`fill_body`] compiled with AVX2 enabled.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fill_avx2(
    s: &mut Scratch,
    w: Rows<'_>,
    bytes: &mut [u8],
    scales: &mut [f32],
    layout: &PackedLayout,
) {
    fill_body::<false>(s, w, bytes, scales, layout);
}

/// The fill; `AVX512` only where the CPU has AVX-512 F, BW and VL (from [`fill_avx512`]).
#[inline(always)]
fn fill_body<const AVX512: bool>(
    s: &mut Scratch,
    w: Rows<'_>,
    bytes: &mut [u8],
    scales: &mut [f32],
    layout: &PackedLayout,
) {
    let (k, k_pad, nr) = (w.k, layout.k_pad, w.n);
    let groups = k_pad / GROUP;
    let decoded = has_fast_kernel(w.ty);
    if decoded {
        s.q.resize(nr * k, 0);
        s.d.resize(nr * k / UNIT, 0.0);
        s.m.resize(nr * k / UNIT, 0.0);
        unpack_rows(Isa::selected(), w.ty, w.bytes, &mut s.q, &mut s.d, &mut s.m);
    } else {
        s.f.resize(nr * k, 0.0);
        dequantize_row(w.ty, w.bytes, &mut s.f).expect("validated at construction");
    }
    let exact = exact(w.ty);
    // 1. Every row as stored bytes, `k_pad` apart (padding 128, the stored zero), and its
    // scales (padding zero).
    s.b.clear();
    s.b.resize(layout.n_pad * k_pad, 128);
    scales.fill(0.0);
    for r in 0..nr {
        let row = &mut s.b[r * k_pad..(r + 1) * k_pad];
        let (strip, c) = (r / STRIP, r % STRIP);
        let sc = &mut scales[strip * groups * STRIP..][..groups * STRIP];
        #[cfg(target_arch = "x86_64")]
        if AVX512 && decoded {
            // `k` is a whole number of blocks of 32 or 256 here.
            let (q, d, m) = (
                &s.q[r * k..(r + 1) * k],
                &s.d[r * k / UNIT..(r + 1) * k / UNIT],
                &s.m[r * k / UNIT..(r + 1) * k / UNIT],
            );
            let mut row_scales = [0.0f32; x86::BATCH];
            for (b, ((q, (d, m)), out)) in q
                .chunks(x86::BATCH * GROUP)
                .zip(d.chunks(2 * x86::BATCH).zip(m.chunks(2 * x86::BATCH)))
                .zip(row[..k].chunks_mut(x86::BATCH * GROUP))
                .enumerate()
            {
                let n = q.len() / GROUP;
                // SAFETY: `AVX512` is only set by `fill_avx512`, whose caller checked the
                // features; the slices hold `n` groups (and 2 `n` units) each.
                unsafe {
                    if exact {
                        x86::row_exact(q, out);
                        for (g, sc) in row_scales[..n].iter_mut().enumerate() {
                            *sc = d[2 * g];
                        }
                    } else {
                        x86::batch_requantize(q, d, m, out, &mut row_scales[..n]);
                    }
                }
                for (g, v) in row_scales[..n].iter().enumerate() {
                    sc[(b * x86::BATCH + g) * STRIP + c] = *v;
                }
            }
            continue;
        }
        // `k` is a whole number of blocks of 32 or 256 (or of 1 for the float types): a
        // group lies within `k` or within the padding, except a float type's last.
        for (g, qb) in row[..k.next_multiple_of(GROUP)]
            .chunks_exact_mut(GROUP)
            .enumerate()
        {
            let qb: &mut [u8; GROUP] = qb.try_into().expect("whole groups");
            let (p0, at) = (g * GROUP, r * k + g * GROUP);
            sc[g * STRIP + c] = if decoded && exact {
                let q = &s.q[at..at + GROUP];
                for (b, &q) in qb.iter_mut().zip(q) {
                    *b = (q as u8) ^ 0x80;
                }
                s.d[at / UNIT]
            } else {
                let mut v = [0.0f32; GROUP];
                if decoded {
                    let u = at / UNIT;
                    for h in 0..2 {
                        let (d, m) = (s.d[u + h], s.m[u + h]);
                        let q = &s.q[at + h * UNIT..][..UNIT];
                        for (v, &q) in v[h * UNIT..][..UNIT].iter_mut().zip(q) {
                            *v = d * f32::from(q) + m;
                        }
                    }
                } else {
                    let len = GROUP.min(k - p0);
                    v[..len].copy_from_slice(&s.f[at..at + len]);
                }
                requantize(&v, qb)
            };
        }
    }
    // 2. Each strip is the transpose of its 16 rows' quads: line `l` holds `k = 4l .. 4l + 4`
    // of every row. Transposed 16 quads at a time, so each row is read 64 bytes at a time.
    let lines = k_pad / 4;
    for (strip, dst) in bytes.chunks_exact_mut(layout.strip_bytes).enumerate() {
        let b = &s.b[strip * STRIP * k_pad..(strip + 1) * STRIP * k_pad];
        #[cfg(target_arch = "x86_64")]
        if AVX512 {
            for l0 in (0..lines).step_by(STRIP) {
                // SAFETY: as above; `k_pad` is a multiple of 64, so 16 whole lines remain.
                unsafe {
                    x86::transpose16(&b[4 * l0..], k_pad, &mut dst[l0 * LINE..][..STRIP * LINE])
                };
            }
            continue;
        }
        for l0 in (0..lines).step_by(STRIP) {
            let n = STRIP.min(lines - l0);
            for c in 0..STRIP {
                let row = &b[c * k_pad + 4 * l0..c * k_pad + 4 * (l0 + n)];
                for (i, quad) in row.chunks_exact(4).enumerate() {
                    let at = (l0 + i) * LINE + c * 4;
                    dst[at..at + 4].copy_from_slice(quad);
                }
            }
        }
    }
}

/// AVX-512 forms of the fill's inner loops, bit for bit the scalar ones (finite weights).
#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::*;

    use super::GROUP;

    /// Groups per batch of [`batch_requantize`]: one zmm of scales.
    pub(super) const BATCH: usize = 16;

    /// `out = q + 128`, whole groups of 32.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL must be available.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    #[inline]
    pub(super) unsafe fn row_exact(q: &[i8], out: &mut [u8]) {
        assert!(q.len() == out.len() && q.len().is_multiple_of(GROUP));
        for (q, o) in q.chunks_exact(GROUP).zip(out.chunks_exact_mut(GROUP)) {
            // SAFETY: 32 bytes are read from `q` and written to `out` (whole chunks).
            unsafe {
                let v = _mm256_loadu_si256(q.as_ptr().cast());
                let v = _mm256_xor_si256(v, _mm256_set1_epi8(i8::MIN));
                _mm256_storeu_si256(o.as_mut_ptr().cast(), v);
            }
        }
    }

    /// [`super::requantize`] of `d[u] · q + m[u]` (a scale and min per 16 values) for up to
    /// [`BATCH`] groups: writes the stored bytes to `out` and the scales to `scales`. The
    /// groups' scales and inverses are divided in one vector, so no group waits on its own
    /// divisions.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL must be available.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    #[inline]
    pub(super) unsafe fn batch_requantize(
        q: &[i8],
        d: &[f32],
        m: &[f32],
        out: &mut [u8],
        scales: &mut [f32],
    ) {
        let n = scales.len();
        assert!(
            n <= BATCH
                && q.len() == n * GROUP
                && out.len() == n * GROUP
                && d.len() >= 2 * n
                && m.len() >= 2 * n
        );
        let mut v = [[_mm512_setzero_ps(); 2]; BATCH];
        let mut amax = [0.0f32; BATCH];
        for g in 0..n {
            for h in 0..2 {
                // SAFETY: 16 bytes at `32 g + 16 h` lie within `q` (checked above).
                let qi = unsafe { _mm_loadu_si128(q.as_ptr().add(GROUP * g + 16 * h).cast()) };
                let qf = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(qi));
                // A multiply then an add, as the scalar `d * q + m` rounds (not a fused FMA).
                let (dv, mv) = (_mm512_set1_ps(d[2 * g + h]), _mm512_set1_ps(m[2 * g + h]));
                v[g][h] = _mm512_add_ps(_mm512_mul_ps(dv, qf), mv);
            }
            amax[g] = _mm512_reduce_max_ps(_mm512_max_ps(
                _mm512_abs_ps(v[g][0]),
                _mm512_abs_ps(v[g][1]),
            ));
        }
        // `super::scales` for all groups at once: amax / 127 and 127 / amax, 1 where amax is 0.
        // SAFETY: `amax` holds 16 floats.
        let a = unsafe { _mm512_loadu_ps(amax.as_ptr()) };
        let pos = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(a, _mm512_setzero_ps());
        let one = _mm512_set1_ps(1.0);
        let scale = _mm512_mask_div_ps(one, pos, a, _mm512_set1_ps(127.0));
        let inv = _mm512_mask_div_ps(one, pos, _mm512_set1_ps(127.0), a);
        let mut invs = [0.0f32; BATCH];
        let mut all = [0.0f32; BATCH];
        // SAFETY: both arrays hold 16 floats.
        unsafe {
            _mm512_storeu_ps(invs.as_mut_ptr(), inv);
            _mm512_storeu_ps(all.as_mut_ptr(), scale);
        }
        scales.copy_from_slice(&all[..n]);
        for (g, (v, inv)) in v.iter().zip(invs).take(n).enumerate() {
            let inv = _mm512_set1_ps(inv);
            for (h, v) in v.iter().enumerate() {
                // Round to nearest even (the default MXCSR mode), clamp, add the offset.
                let qv = _mm512_cvtps_epi32(_mm512_mul_ps(*v, inv));
                let qv = _mm512_min_epi32(
                    _mm512_max_epi32(qv, _mm512_set1_epi32(-127)),
                    _mm512_set1_epi32(127),
                );
                let b = _mm512_cvtepi32_epi8(_mm512_add_epi32(qv, _mm512_set1_epi32(128)));
                // SAFETY: 16 bytes at `32 g + 16 h` of `out` (checked above).
                unsafe { _mm_storeu_si128(out.as_mut_ptr().add(GROUP * g + 16 * h).cast(), b) };
            }
        }
    }

    /// Transposes 16 rows (`stride` bytes apart, 64 bytes each from the start of `src`) of 16
    /// quads (4 bytes: an INT8 quad or a BF16 pair) into 16 lines of `dst`: line `n` holds
    /// quad `n` of every row.
    ///
    /// # Safety
    /// AVX-512 F must be available.
    // `c` names both the source registers and the destination lines.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    #[inline]
    pub(crate) unsafe fn transpose16(src: &[u8], stride: usize, dst: &mut [u8]) {
        assert!(src.len() >= 15 * stride + 64 && dst.len() >= 16 * 64);
        // SAFETY: row `i` is read at `i * stride .. + 64` and line `n` written at `64 n .. +
        // 64`, within the slices (checked above).
        unsafe {
            let r: [__m512i; 16] =
                std::array::from_fn(|i| _mm512_loadu_si512(src.as_ptr().add(i * stride).cast()));
            // Pairs of rows interleaved by dword, then groups of four rows by qword: `v[g][c]`
            // holds, in 128-bit lane `j`, quad `4 j + c` of rows `4 g .. 4 g + 4`.
            let mut v = [[_mm512_setzero_si512(); 4]; 4];
            for (g, v) in v.iter_mut().enumerate() {
                let [a, b, c, d] = [r[4 * g], r[4 * g + 1], r[4 * g + 2], r[4 * g + 3]];
                let (lo01, hi01) = (_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
                let (lo23, hi23) = (_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
                v[0] = _mm512_unpacklo_epi64(lo01, lo23);
                v[1] = _mm512_unpackhi_epi64(lo01, lo23);
                v[2] = _mm512_unpacklo_epi64(hi01, hi23);
                v[3] = _mm512_unpackhi_epi64(hi01, hi23);
            }
            // A 4x4 transpose of 128-bit lanes per `c`: line `4 j + c` is lane `j` of
            // `v[0][c] .. v[3][c]`.
            for c in 0..4 {
                let x0 = _mm512_shuffle_i32x4::<0x44>(v[0][c], v[1][c]);
                let x1 = _mm512_shuffle_i32x4::<0xee>(v[0][c], v[1][c]);
                let x2 = _mm512_shuffle_i32x4::<0x44>(v[2][c], v[3][c]);
                let x3 = _mm512_shuffle_i32x4::<0xee>(v[2][c], v[3][c]);
                let out = [
                    _mm512_shuffle_i32x4::<0x88>(x0, x2),
                    _mm512_shuffle_i32x4::<0xdd>(x0, x2),
                    _mm512_shuffle_i32x4::<0x88>(x1, x3),
                    _mm512_shuffle_i32x4::<0xdd>(x1, x3),
                ];
                for (j, o) in out.into_iter().enumerate() {
                    _mm512_storeu_si512(dst.as_mut_ptr().add((4 * j + c) * 64).cast(), o);
                }
            }
        }
    }
}
