//! Token rows to int8 for the integer kernels: one symmetric scale per row or per group of
//! [`XSUM_UNIT`] values, round to nearest even, and the sums of the values per unit (the
//! zero-point correction).

use crate::isa::Isa;
use crate::packed::XSUM_UNIT;

#[inline(always)]
fn quantize_i8_body(src: &[f32], dst: &mut [u8], xsum: &mut [i32], unit: usize) -> f32 {
    // |v| ordered as its bit pattern without the sign; NaN counts as zero. Sixteen lanes of
    // running maxima, so that the loop vectorises.
    let abs_bits = |v: &f32| {
        let b = v.to_bits() & 0x7fff_ffff;
        if b > 0x7f80_0000 { 0 } else { b }
    };
    let mut lanes = [0u32; 16];
    let chunks = src.chunks_exact(16);
    let tail = chunks.remainder().iter().map(abs_bits).fold(0, u32::max);
    for c in chunks {
        for (m, v) in lanes.iter_mut().zip(c) {
            *m = (*m).max(abs_bits(v));
        }
    }
    let amax_bits = lanes.iter().copied().fold(tail, u32::max);
    let amax = f32::from_bits(amax_bits);
    let scale = if amax > 0.0 { amax / 127.0 } else { 1.0 };
    let inv = 1.0 / scale;
    for ((d, s), sum) in dst
        .chunks_mut(unit)
        .zip(src.chunks(unit))
        .zip(xsum.iter_mut())
    {
        let mut acc = 0i32;
        for (d, v) in d.iter_mut().zip(s) {
            let y = v * inv;
            // NaN becomes 0 (as a saturating `as i32` would), then clamp in f32 so that the
            // conversion needs no saturation fix-ups and vectorises.
            let y = if y.is_nan() { 0.0 } else { y };
            let y = y.clamp(-127.0, 127.0).round_ties_even();
            // SAFETY: `y` is an integer in [-127, 127], representable in i32.
            let q = unsafe { y.to_int_unchecked::<i32>() };
            *d = q as i8 as u8;
            acc += q;
        }
        *sum = acc;
    }
    scale
}

/// # Safety
/// AVX-512 F/BW must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_i8_avx512(src: &[f32], dst: &mut [u8], xsum: &mut [i32], unit: usize) -> f32 {
    quantize_i8_body(src, dst, xsum, unit)
}

/// Quantizes one token row to int8 with one symmetric scale (`amax / 127`, round to nearest
/// even): writes the values to `dst`, the sums of each `unit` values to `xsum`, and returns
/// the scale.
pub(crate) fn quantize_i8(src: &[f32], dst: &mut [u8], xsum: &mut [i32], unit: usize) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if Isa::selected() >= Isa::Avx512 {
        // SAFETY: AVX-512 F/BW were detected.
        return unsafe { quantize_i8_avx512(src, dst, xsum, unit) };
    }
    quantize_i8_body(src, dst, xsum, unit)
}

#[inline(always)]
fn quantize_i8_groups_body(
    src: &[f32],
    dst: &mut [u8],
    scales: &mut [f32],
    xsum: &mut [i32],
    unit: usize,
) {
    let group = XSUM_UNIT;
    let groups = src.chunks(group).zip(dst.chunks_mut(group));
    for (((x, d), s), sc) in groups.zip(xsum.chunks_mut(group / unit)).zip(scales) {
        *sc = quantize_i8_body(x, &mut d[..x.len()], s, unit);
    }
}

/// # Safety
/// AVX-512 F/BW must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_i8_groups_avx512(
    src: &[f32],
    dst: &mut [u8],
    scales: &mut [f32],
    xsum: &mut [i32],
    unit: usize,
) {
    quantize_i8_groups_body(src, dst, scales, xsum, unit);
}

/// [`quantize_i8`] of each [`XSUM_UNIT`] values of a token row: one scale per
/// group into `scales`, the sums of each `unit` values into `xsum`. One call per row, so that
/// the groups' loop is compiled with the CPU's features around it (a call per group of 32
/// was 4.7% of a 512-token prefill on an Ice Lake).
pub(crate) fn quantize_i8_groups(
    src: &[f32],
    dst: &mut [u8],
    scales: &mut [f32],
    xsum: &mut [i32],
    unit: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if Isa::selected() >= Isa::Avx512 {
        // SAFETY: AVX-512 F/BW were detected.
        return unsafe { quantize_i8_groups_avx512(src, dst, scales, xsum, unit) };
    }
    quantize_i8_groups_body(src, dst, scales, xsum, unit);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packed::tests::rand_vec;

    /// Plain reference for [`quantize_i8`].
    fn quantize_i8_ref(src: &[f32], dst: &mut [u8], xsum: &mut [i32], unit: usize) -> f32 {
        let amax = src
            .iter()
            .filter(|v| !v.is_nan())
            .fold(0.0f32, |a, v| a.max(v.abs()));
        let scale = if amax > 0.0 { amax / 127.0 } else { 1.0 };
        for (p, v) in src.iter().enumerate() {
            let q = ((v / scale).round_ties_even() as i32).clamp(-127, 127);
            dst[p] = q as i8 as u8;
            xsum[p / unit] += q;
        }
        scale
    }

    #[test]
    fn int8_quantization_matches_reference() {
        let mut seed = 9;
        for (len, unit) in [0usize, 1, 31, 32, 33, 100, 257]
            .into_iter()
            .flat_map(|len| [(len, 16), (len, 32)])
        {
            let mut src = rand_vec(len, &mut seed);
            if len > 3 {
                src[2] = f32::NAN;
            }
            if len == 100 {
                src[7] = f32::INFINITY;
            }
            let units = len.div_ceil(unit);
            let (mut d1, mut d2) = (vec![0u8; len], vec![0u8; len]);
            let (mut s1, mut s2) = (vec![0i32; units], vec![0i32; units]);
            let a = quantize_i8(&src, &mut d1, &mut s1, unit);
            let b = quantize_i8_ref(&src, &mut d2, &mut s2, unit);
            assert_eq!(
                (a, &d1, &s1),
                (b, &d2, &s2),
                "length {len}, sums per {unit}"
            );
        }
        let zeros = [0.0f32; 5];
        assert_eq!(quantize_i8(&zeros, &mut [0; 5], &mut [0], 32), 1.0);
        // A row in groups of 32, a ragged last group: each group as quantized alone.
        for unit in [16, 32] {
            let mut src = rand_vec(100, &mut seed);
            src[10] = f32::INFINITY;
            src[40] = f32::NAN;
            src[70] *= 1e4;
            let (mut d1, mut d2) = (vec![0u8; 100], vec![0u8; 100]);
            let (mut s1, mut s2) = (vec![0i32; 100usize.div_ceil(unit)], vec![0; 0]);
            let (mut sc1, mut sc2) = (vec![0.0f32; 4], vec![0.0f32; 0]);
            quantize_i8_groups(&src, &mut d1, &mut sc1, &mut s1, unit);
            for (x, d) in src.chunks(32).zip(d2.chunks_mut(32)) {
                let mut sums = vec![0i32; x.len().div_ceil(unit)];
                sc2.push(quantize_i8_ref(x, d, &mut sums, unit));
                s2.extend(sums);
            }
            assert_eq!((sc1, d1, s1), (sc2, d2, s2), "sums per {unit}");
        }
    }
}
