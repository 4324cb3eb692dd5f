//! Block decoders for the integer path: one ggml block in, int8 values with a scale and a
//! min per 16 values out, so that `w[i] = d[i / 16] * q[i] + m[i / 16]` exactly as ggml's
//! dequantizers compute it.
//!
//! A key design decision made here is one canonical unpacked form for every type that has
//! integer values: 4-, 5-, 6- and 8-bit blocks of 32 and every k-quant become the same int8
//! rows with per-16 scales, so a single int8 dot-product kernel (per instruction set) serves
//! them all, and a new type needs only its decoder. The decoders are plain loops over bytes
//! written so that LLVM vectorises them when they are inlined into the AVX2 kernels.
//! Types without such a form (F16, BF16, F32, the grid-based i-quants) take the generic path
//! (`super::matrix`), which dequantizes to f32.

// Block layouts read best as index loops over the positions ggml's headers name.
#![allow(clippy::needless_range_loop)]

use half::f16;

use super::types::{GgmlType, QK_K};

/// Values per scale in the unpacked form.
pub(crate) const UNIT: usize = 16;

/// The non-linear 4-bit grid of IQ4_NL and IQ4_XS (`kvalues_iq4nl`).
pub(crate) const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// One decoded block: `q` holds `block_size` values, `d` and `m` one entry per [`UNIT`].
pub(crate) struct Out<'a> {
    pub q: &'a mut [i8],
    pub d: &'a mut [f32],
    pub m: &'a mut [f32],
}

/// A block decoder: the block's bytes into [`Out`].
pub(crate) type Decoder = fn(&[u8], Out<'_>);

/// The decoder of `ty`, and whether its blocks have mins (`m` nonzero); `None` when the
/// type has no integer form.
pub(crate) fn decoder(ty: GgmlType) -> Option<(Decoder, bool)> {
    use GgmlType::*;
    Some(match ty {
        Q4_0 => (q4_0, false),
        Q4_1 => (q4_1, true),
        Q5_0 => (q5_0, false),
        Q5_1 => (q5_1, true),
        Q8_0 => (q8_0, false),
        Q2_K => (q2_k, true),
        Q3_K => (q3_k, false),
        Q4_K => (q4_k, true),
        Q5_K => (q5_k, true),
        Q6_K => (q6_k, false),
        IQ4_NL => (iq4_nl, false),
        IQ4_XS => (iq4_xs, false),
        _ => return None,
    })
}

#[inline(always)]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Writes one scale and min for `units` consecutive units starting at `u`.
#[inline(always)]
fn set(o: &mut Out, u: usize, units: usize, d: f32, m: f32) {
    o.d[u..u + units].fill(d);
    o.m[u..u + units].fill(m);
}

#[inline(always)]
fn q4_0(x: &[u8], o: Out) {
    let mut o = o;
    let qs = &x[2..18];
    for j in 0..16 {
        o.q[j] = (qs[j] & 0x0f) as i8 - 8;
        o.q[j + 16] = (qs[j] >> 4) as i8 - 8;
    }
    set(&mut o, 0, 2, f16_at(x, 0), 0.0);
}

#[inline(always)]
fn q4_1(x: &[u8], o: Out) {
    let mut o = o;
    let qs = &x[4..20];
    for j in 0..16 {
        o.q[j] = (qs[j] & 0x0f) as i8;
        o.q[j + 16] = (qs[j] >> 4) as i8;
    }
    set(&mut o, 0, 2, f16_at(x, 0), f16_at(x, 2));
}

#[inline(always)]
fn q5_0(x: &[u8], o: Out) {
    let mut o = o;
    let qh = u32::from_le_bytes([x[2], x[3], x[4], x[5]]);
    let qs = &x[6..22];
    for j in 0..16 {
        let h0 = (((qh >> j) << 4) & 0x10) as u8;
        let h1 = ((qh >> (j + 12)) & 0x10) as u8;
        o.q[j] = ((qs[j] & 0x0f) | h0) as i8 - 16;
        o.q[j + 16] = ((qs[j] >> 4) | h1) as i8 - 16;
    }
    set(&mut o, 0, 2, f16_at(x, 0), 0.0);
}

#[inline(always)]
fn q5_1(x: &[u8], o: Out) {
    let mut o = o;
    let qh = u32::from_le_bytes([x[4], x[5], x[6], x[7]]);
    let qs = &x[8..24];
    for j in 0..16 {
        let h0 = (((qh >> j) << 4) & 0x10) as u8;
        let h1 = ((qh >> (j + 12)) & 0x10) as u8;
        o.q[j] = ((qs[j] & 0x0f) | h0) as i8;
        o.q[j + 16] = ((qs[j] >> 4) | h1) as i8;
    }
    set(&mut o, 0, 2, f16_at(x, 0), f16_at(x, 2));
}

#[inline(always)]
fn q8_0(x: &[u8], o: Out) {
    let mut o = o;
    for (q, &b) in o.q.iter_mut().zip(&x[2..34]) {
        *q = b as i8;
    }
    set(&mut o, 0, 2, f16_at(x, 0), 0.0);
}

#[inline(always)]
fn q2_k(x: &[u8], o: Out) {
    let mut o = o;
    let scales = &x[0..16];
    let (d, min) = (f16_at(x, 80), f16_at(x, 82));
    for half in 0..2 {
        let q = &x[16 + 32 * half..48 + 32 * half];
        for (s, shift) in [0u32, 2, 4, 6].into_iter().enumerate() {
            let base = 128 * half + 32 * s;
            for l in 0..32 {
                o.q[base + l] = ((q[l] >> shift) & 3) as i8;
            }
            for part in 0..2 {
                let u = 8 * half + 2 * s + part;
                let sc = scales[u];
                set(
                    &mut o,
                    u,
                    1,
                    d * (sc & 0x0f) as f32,
                    -(min * (sc >> 4) as f32),
                );
            }
        }
    }
}

#[inline(always)]
fn q3_k(x: &[u8], o: Out) {
    let mut o = o;
    let hmask = &x[0..32];
    let s = &x[96..108];
    let d = f16_at(x, 108);
    for half in 0..2 {
        let q = &x[32 + 32 * half..64 + 32 * half];
        for (s4, shift) in [0u32, 2, 4, 6].into_iter().enumerate() {
            let bit = 1u8 << (4 * half + s4);
            let base = 128 * half + 32 * s4;
            for l in 0..32 {
                let low = ((q[l] >> shift) & 3) as i8;
                let sub = if hmask[l] & bit != 0 { 0 } else { 4 };
                o.q[base + l] = low - sub;
            }
        }
    }
    for u in 0..16 {
        let lo = (s[u % 8] >> (4 * (u / 8))) & 0x0f;
        let hi = (s[8 + u % 4] >> (2 * (u / 4))) & 3;
        set(&mut o, u, 1, d * ((lo | (hi << 4)) as i32 - 32) as f32, 0.0);
    }
}

/// 6-bit scale and min `j` (0..8) of a Q4_K/Q5_K block (`get_scale_min_k4`).
#[inline(always)]
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Scales and mins of the 8 sub-blocks of 32 of a Q4_K / Q5_K block.
#[inline(always)]
fn k4_scales(x: &[u8], o: &mut Out) {
    let (d, min) = (f16_at(x, 0), f16_at(x, 2));
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &x[4..16]);
        set(o, 2 * j, 2, d * sc as f32, -(min * m as f32));
    }
}

#[inline(always)]
fn q4_k(x: &[u8], o: Out) {
    let mut o = o;
    for c in 0..4 {
        let q = &x[16 + 32 * c..48 + 32 * c];
        for l in 0..32 {
            o.q[64 * c + l] = (q[l] & 0x0f) as i8;
            o.q[64 * c + 32 + l] = (q[l] >> 4) as i8;
        }
    }
    k4_scales(x, &mut o);
}

#[inline(always)]
fn q5_k(x: &[u8], o: Out) {
    let mut o = o;
    let qh = &x[16..48];
    for c in 0..4 {
        let ql = &x[48 + 32 * c..80 + 32 * c];
        for l in 0..32 {
            let h1 = ((qh[l] >> (2 * c)) & 1) << 4;
            let h2 = ((qh[l] >> (2 * c + 1)) & 1) << 4;
            o.q[64 * c + l] = ((ql[l] & 0x0f) | h1) as i8;
            o.q[64 * c + 32 + l] = ((ql[l] >> 4) | h2) as i8;
        }
    }
    k4_scales(x, &mut o);
}

#[inline(always)]
fn q6_k(x: &[u8], o: Out) {
    let mut o = o;
    let d = f16_at(x, 208);
    for half in 0..2 {
        let ql = &x[64 * half..64 * half + 64];
        let qh = &x[128 + 32 * half..160 + 32 * half];
        let q = &mut o.q[128 * half..128 * half + 128];
        for l in 0..32 {
            q[l] = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i8 - 32;
            q[l + 32] = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            q[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            q[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
        }
    }
    // Unit u (values 16 u..16 u + 16) uses scale u: in ggml's loop value `l + 32 g` of a
    // half takes scale `l / 16 + 2 g`, which is its unit within the half.
    for u in 0..16 {
        set(&mut o, u, 1, d * (x[192 + u] as i8) as f32, 0.0);
    }
}

#[inline(always)]
fn iq4_nl(x: &[u8], o: Out) {
    let mut o = o;
    let qs = &x[2..18];
    for j in 0..16 {
        o.q[j] = KVALUES_IQ4NL[(qs[j] & 0x0f) as usize];
        o.q[j + 16] = KVALUES_IQ4NL[(qs[j] >> 4) as usize];
    }
    set(&mut o, 0, 2, f16_at(x, 0), 0.0);
}

#[inline(always)]
fn iq4_xs(x: &[u8], o: Out) {
    let mut o = o;
    let d = f16_at(x, 0);
    let scales_h = u16::from_le_bytes([x[2], x[3]]);
    for ib in 0..8 {
        let lo = (x[4 + ib / 2] >> (4 * (ib % 2))) & 0x0f;
        let hi = ((scales_h >> (2 * ib)) & 3) as u8;
        let qs = &x[8 + 16 * ib..24 + 16 * ib];
        for j in 0..16 {
            o.q[32 * ib + j] = KVALUES_IQ4NL[(qs[j] & 0x0f) as usize];
            o.q[32 * ib + 16 + j] = KVALUES_IQ4NL[(qs[j] >> 4) as usize];
        }
        set(
            &mut o,
            2 * ib,
            2,
            d * ((lo | (hi << 4)) as i32 - 32) as f32,
            0.0,
        );
    }
}

/// Decodes a row of whole blocks of `ty` (`src` exactly their bytes) into `q` (one value per
/// weight) and `d`, `m` (one per [`UNIT`]). Panics on a type without a decoder or wrong
/// lengths: callers check both when building a matrix.
#[inline(always)]
pub(crate) fn unpack_row(
    dec: Decoder,
    ty: GgmlType,
    src: &[u8],
    q: &mut [i8],
    d: &mut [f32],
    m: &mut [f32],
) {
    let (bs, bb) = (ty.block_size(), ty.block_bytes());
    let units = bs / UNIT;
    debug_assert!(bs == 32 || bs == QK_K);
    for (((x, q), d), m) in src
        .chunks_exact(bb)
        .zip(q.chunks_exact_mut(bs))
        .zip(d.chunks_exact_mut(units))
        .zip(m.chunks_exact_mut(units))
    {
        dec(x, Out { q, d, m });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml::dequantize_row;
    use crate::ggml::test_util::random_blocks;

    #[test]
    fn unpacked_values_equal_the_reference_dequantizer() {
        use GgmlType::*;
        let mut seed = 11;
        for ty in [
            Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS,
        ] {
            let (dec, _) = decoder(ty).expect("integer type");
            let n = 2 * QK_K;
            let src = random_blocks(ty, n / ty.block_size(), &mut seed);
            let mut want = vec![0.0f32; n];
            dequantize_row(ty, &src, &mut want).expect("valid blocks");
            let (mut q, mut d, mut m) = (vec![0i8; n], vec![0.0; n / UNIT], vec![0.0; n / UNIT]);
            unpack_row(dec, ty, &src, &mut q, &mut d, &mut m);
            for i in 0..n {
                let got = d[i / UNIT] * q[i] as f32 + m[i / UNIT];
                assert_eq!(got, want[i], "{ty} value {i}");
            }
        }
    }
}
