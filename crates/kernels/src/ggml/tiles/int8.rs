//! INT8 tiles: a tile of ggml rows written as packed `Int8 { group: Some(32) }` (values
//! `q + 128`, lines of 16 rows x 4 `k`, a scale per row and 32 `k`).
//!
//! Types whose values are already `d · q` per 32 with one `d` and `q` in int8 (Q4_0, Q5_0,
//! Q8_0, IQ4_NL, IQ4_XS: [`exact`]) are stored as they are, with `d` as the group scale: the
//! tile holds the weights exactly. The others (mins, scales per 16, F16...) are decoded to f32
//! and requantized per 32 symmetrically (`amax / 127`, round to nearest even), an error of at
//! most `amax / 254` per weight, well under the 2- to 6-bit formats' own steps.

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

/// Requantizes one group of 32 values: returns the scale and writes the stored bytes
/// (`q + 128`). Shared with the tests' twin, which must round exactly alike.
#[inline(always)]
pub(crate) fn requantize(v: &[f32; GROUP], out: &mut [u8; GROUP]) -> f32 {
    let amax = v.iter().fold(0.0f32, |a, x| a.max(x.abs()));
    let scale = if amax > 0.0 { amax / 127.0 } else { 1.0 };
    for (o, &x) in out.iter_mut().zip(v) {
        // Clamped in f32 (|x| / scale may round just past 127), NaN to 0, so that the
        // conversion needs no saturation and the loop vectorises.
        let y = x / scale;
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
        fill_body(s, w, bytes, scales, layout);
    });
}

/// [`fill_body`] compiled with AVX-512 enabled, so its loops vectorise.
///
/// # Safety
/// The CPU must support AVX-512 F and BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
unsafe fn fill_avx512(
    s: &mut Scratch,
    w: Rows<'_>,
    bytes: &mut [u8],
    scales: &mut [f32],
    layout: &PackedLayout,
) {
    fill_body(s, w, bytes, scales, layout);
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
    fill_body(s, w, bytes, scales, layout);
}

#[inline(always)]
fn fill_body(
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
    for r in 0..layout.n_pad {
        let (strip, c) = (r / STRIP, r % STRIP);
        let dst = &mut bytes[strip * layout.strip_bytes..][..layout.strip_bytes];
        let sc = &mut scales[strip * groups * STRIP..][..groups * STRIP];
        for g in 0..groups {
            let p0 = g * GROUP;
            let mut qb = [128u8; GROUP];
            let mut scale = 0.0;
            // `k` is a whole number of blocks of 32 or 256 (or of 1 for the float types):
            // a group lies within `k` or within the padding, except a float type's last.
            if r < nr && p0 < k {
                let at = r * k + p0;
                let len = GROUP.min(k - p0);
                let mut v = [0.0f32; GROUP];
                if decoded && exact {
                    let q = &s.q[at..at + GROUP];
                    for (b, &q) in qb.iter_mut().zip(q) {
                        *b = (q as u8) ^ 0x80;
                    }
                    scale = s.d[at / UNIT];
                } else {
                    if decoded {
                        let (q, u) = (&s.q[at..at + GROUP], at / UNIT);
                        let (d, m) = (&s.d[u..u + 2], &s.m[u..u + 2]);
                        for (i, (v, &q)) in v.iter_mut().zip(q).enumerate() {
                            *v = d[i / UNIT] * f32::from(q) + m[i / UNIT];
                        }
                    } else {
                        v[..len].copy_from_slice(&s.f[at..at + len]);
                    }
                    scale = requantize(&v, &mut qb);
                }
            }
            sc[g * STRIP + c] = scale;
            // Line `p / 4` of the strip holds `k = p .. p + 4` of its 16 rows, 4 bytes each.
            for (l, quad) in qb.chunks_exact(4).enumerate() {
                let at = (p0 / 4 + l) * LINE + c * 4;
                dst[at..at + 4].copy_from_slice(quad);
            }
        }
    }
}
