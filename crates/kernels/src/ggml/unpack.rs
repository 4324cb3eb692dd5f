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

use super::dequant::scale_min_k4;
use super::types::{GgmlType, QK_K};
use crate::Isa;

/// Values per scale in the unpacked form.
pub(crate) const UNIT: usize = 16;

/// The non-linear 4-bit grid of IQ4_NL and IQ4_XS (`kvalues_iq4nl`).
pub(crate) const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// One decoded block: `q` holds its `B` values, `d` and `m` one entry per [`UNIT`] (`U`).
/// Fixed sizes let the compiler drop bounds checks and vectorise the decoders.
pub(crate) struct Out<'a, const B: usize, const U: usize> {
    pub q: &'a mut [i8; B],
    pub d: &'a mut [f32; U],
    pub m: &'a mut [f32; U],
}

/// Whether `ty` has an integer form (`Some`), and whether its blocks have mins (`m`
/// nonzero).
pub(crate) fn decoder(ty: GgmlType) -> Option<bool> {
    use GgmlType::*;
    match ty {
        Q4_1 | Q5_1 | Q2_K | Q4_K | Q5_K => Some(true),
        Q4_0 | Q5_0 | Q8_0 | Q3_K | Q6_K | IQ4_NL | IQ4_XS => Some(false),
        _ => None,
    }
}

#[inline(always)]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Writes one scale and min for `units` consecutive units starting at `u`.
#[inline(always)]
fn set<const B: usize, const U: usize>(o: &mut Out<B, U>, u: usize, units: usize, d: f32, m: f32) {
    o.d[u..u + units].fill(d);
    o.m[u..u + units].fill(m);
}

#[inline(always)]
fn q4_0(x: &[u8; 18], o: Out<32, 2>) {
    let mut o = o;
    let qs = &x[2..18];
    for j in 0..16 {
        o.q[j] = (qs[j] & 0x0f) as i8 - 8;
        o.q[j + 16] = (qs[j] >> 4) as i8 - 8;
    }
    set(&mut o, 0, 2, f16_at(x, 0), 0.0);
}

#[inline(always)]
fn q4_1(x: &[u8; 20], o: Out<32, 2>) {
    let mut o = o;
    let qs = &x[4..20];
    for j in 0..16 {
        o.q[j] = (qs[j] & 0x0f) as i8;
        o.q[j + 16] = (qs[j] >> 4) as i8;
    }
    set(&mut o, 0, 2, f16_at(x, 0), f16_at(x, 2));
}

#[inline(always)]
fn q5_0(x: &[u8; 22], o: Out<32, 2>) {
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
fn q5_1(x: &[u8; 24], o: Out<32, 2>) {
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
fn q8_0(x: &[u8; 34], o: Out<32, 2>) {
    let mut o = o;
    for (q, &b) in o.q.iter_mut().zip(&x[2..34]) {
        *q = b as i8;
    }
    set(&mut o, 0, 2, f16_at(x, 0), 0.0);
}

#[inline(always)]
fn q2_k(x: &[u8; 84], o: Out<256, 16>) {
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
fn q3_k(x: &[u8; 110], o: Out<256, 16>) {
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

/// Scales and mins of the 8 sub-blocks of 32 of a Q4_K / Q5_K block.
#[inline(always)]
fn k4_scales(x: &[u8], o: &mut Out<256, 16>) {
    let (d, min) = (f16_at(x, 0), f16_at(x, 2));
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &x[4..16]);
        set(o, 2 * j, 2, d * sc as f32, -(min * m as f32));
    }
}

#[inline(always)]
fn q4_k(x: &[u8; 144], o: Out<256, 16>) {
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
fn q5_k(x: &[u8; 176], o: Out<256, 16>) {
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
fn q6_k(x: &[u8; 210], o: Out<256, 16>) {
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
fn iq4_nl(x: &[u8; 18], o: Out<32, 2>) {
    let mut o = o;
    let qs = &x[2..18];
    for j in 0..16 {
        o.q[j] = KVALUES_IQ4NL[(qs[j] & 0x0f) as usize];
        o.q[j + 16] = KVALUES_IQ4NL[(qs[j] >> 4) as usize];
    }
    set(&mut o, 0, 2, f16_at(x, 0), 0.0);
}

#[inline(always)]
fn iq4_xs(x: &[u8; 136], o: Out<256, 16>) {
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
/// weight) and `d`, `m` (one per [`UNIT`]). Panics on a type without a decoder: callers
/// check [`decoder`] when building a matrix. Each arm calls its decoder directly, so it is
/// inlined (and vectorised) into the caller's instruction set.
#[inline(always)]
pub(crate) fn unpack_row(ty: GgmlType, src: &[u8], q: &mut [i8], d: &mut [f32], m: &mut [f32]) {
    debug_assert!(ty.block_size() == 32 || ty.block_size() == QK_K);
    macro_rules! each_block {
        ($dec:ident, $bb:literal, $b:literal, $u:literal) => {{
            let (x, _) = src.as_chunks::<$bb>();
            let (q, _) = q.as_chunks_mut::<$b>();
            let (d, _) = d.as_chunks_mut::<$u>();
            let (m, _) = m.as_chunks_mut::<$u>();
            for (((x, q), d), m) in x.iter().zip(q).zip(d).zip(m) {
                $dec(x, Out { q, d, m });
            }
        }};
    }
    use GgmlType::*;
    match ty {
        Q4_0 => each_block!(q4_0, 18, 32, 2),
        Q4_1 => each_block!(q4_1, 20, 32, 2),
        Q5_0 => each_block!(q5_0, 22, 32, 2),
        Q5_1 => each_block!(q5_1, 24, 32, 2),
        Q8_0 => each_block!(q8_0, 34, 32, 2),
        Q2_K => each_block!(q2_k, 84, 256, 16),
        Q3_K => each_block!(q3_k, 110, 256, 16),
        Q4_K => each_block!(q4_k, 144, 256, 16),
        Q5_K => each_block!(q5_k, 176, 256, 16),
        Q6_K => each_block!(q6_k, 210, 256, 16),
        IQ4_NL => each_block!(iq4_nl, 18, 32, 2),
        IQ4_XS => each_block!(iq4_xs, 136, 256, 16),
        other => unreachable!("{other} has no integer decoder"),
    }
}

/// Decodes rows of blocks, vectorised for AVX2 where the CPU has it.
pub(crate) fn unpack_rows(
    isa: Isa,
    ty: GgmlType,
    src: &[u8],
    q: &mut [i8],
    d: &mut [f32],
    m: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        // SAFETY: `Isa::Avx2` or better is only selected when the CPU has AVX2.
        unsafe { unpack_rows_avx2(ty, src, q, d, m) };
        return;
    }
    let _ = isa;
    unpack_row(ty, src, q, d, m);
}

/// [`unpack_row`] compiled with AVX2 enabled (the decoders are inlined and vectorised).
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn unpack_rows_avx2(ty: GgmlType, src: &[u8], q: &mut [i8], d: &mut [f32], m: &mut [f32]) {
    unpack_row(ty, src, q, d, m);
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
            decoder(ty).expect("integer type");
            let n = 2 * QK_K;
            let src = random_blocks(ty, n / ty.block_size(), &mut seed);
            let mut want = vec![0.0f32; n];
            dequantize_row(ty, &src, &mut want).expect("valid blocks");
            let (mut q, mut d, mut m) = (vec![0i8; n], vec![0.0; n / UNIT], vec![0.0; n / UNIT]);
            unpack_row(ty, &src, &mut q, &mut d, &mut m);
            for i in 0..n {
                let got = d[i / UNIT] * q[i] as f32 + m[i / UNIT];
                assert_eq!(got, want[i], "{ty} value {i}");
            }
        }
    }
}
