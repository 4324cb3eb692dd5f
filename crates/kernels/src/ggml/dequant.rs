//! Reference dequantization of ggml blocks to f32 (and bf16), one function per block type.
//!
//! Each `block_*` function decodes one block laid out as in ggml-common.h and writes its values
//! in ggml's order, with the same arithmetic (`d * q`, `d * q + m`, `d * sc * q - dmin * m`,
//! evaluated left to right in f32) as ggml's `dequantize_row_*`, so results match bit for bit.
//! A key design decision is that these are plain scalar loops: they define what the packed and
//! vectorised kernels elsewhere must reproduce, and are used once at load time, never per token.

use half::{bf16, f16};

use super::iq;
use super::types::{GgmlType, QK_K};
use super::unpack::KVALUES_IQ4NL;

/// Why a row could not be dequantized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// The type has no dequantizer here.
    #[error("dequantizing tensor type {0} is not supported")]
    Unsupported(GgmlType),
    /// The output length is not a whole number of blocks.
    #[error("{n} values is not a multiple of the {ty} block size {block}")]
    PartialBlock {
        /// Tensor type.
        ty: GgmlType,
        /// Requested number of values.
        n: usize,
        /// Values per block.
        block: usize,
    },
    /// Input and output lengths disagree.
    #[error("{n} values of {ty} need {want} bytes but got {got}")]
    Length {
        /// Tensor type.
        ty: GgmlType,
        /// Requested number of values.
        n: usize,
        /// Bytes those values occupy.
        want: usize,
        /// Bytes given.
        got: usize,
    },
}

fn check(ty: GgmlType, src: &[u8], n: usize) -> Result<(), QuantError> {
    if !ty.can_dequantize() {
        return Err(QuantError::Unsupported(ty));
    }
    let block = ty.block_size();
    if !n.is_multiple_of(block) {
        return Err(QuantError::PartialBlock { ty, n, block });
    }
    let want = n / block * ty.block_bytes();
    if src.len() != want {
        return Err(QuantError::Length {
            ty,
            n,
            want,
            got: src.len(),
        });
    }
    Ok(())
}

/// Dequantizes `dst.len()` values of type `ty` from `src` (exactly their bytes) into `dst`.
///
/// Any whole number of blocks works: a row, a tensor, or a slice of either.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    check(ty, src, dst.len())?;
    let (bs, bb) = (ty.block_size(), ty.block_bytes());
    let f: fn(&[u8], &mut [f32]) = match ty {
        GgmlType::F32 => block_f32,
        GgmlType::F16 => block_f16,
        GgmlType::BF16 => block_bf16,
        GgmlType::Q4_0 => block_q4_0,
        GgmlType::Q4_1 => block_q4_1,
        GgmlType::Q5_0 => block_q5_0,
        GgmlType::Q5_1 => block_q5_1,
        GgmlType::Q8_0 => block_q8_0,
        GgmlType::Q2_K => block_q2_k,
        GgmlType::Q3_K => block_q3_k,
        GgmlType::Q4_K => block_q4_k,
        GgmlType::Q5_K => block_q5_k,
        GgmlType::Q6_K => block_q6_k,
        GgmlType::Q8_K => block_q8_k,
        GgmlType::IQ4_NL => block_iq4_nl,
        GgmlType::IQ4_XS => block_iq4_xs,
        GgmlType::IQ2_XXS => iq::block_iq2_xxs,
        GgmlType::IQ2_XS => iq::block_iq2_xs,
        GgmlType::IQ2_S => iq::block_iq2_s,
        GgmlType::IQ3_XXS => iq::block_iq3_xxs,
        GgmlType::IQ3_S => iq::block_iq3_s,
        GgmlType::IQ1_S => iq::block_iq1_s,
        GgmlType::IQ1_M => iq::block_iq1_m,
        GgmlType::TQ1_0 => iq::block_tq1_0,
        GgmlType::TQ2_0 => iq::block_tq2_0,
        GgmlType::MXFP4 => iq::block_mxfp4,
        other => return Err(QuantError::Unsupported(other)),
    };
    for (x, y) in src.chunks_exact(bb).zip(dst.chunks_exact_mut(bs)) {
        f(x, y);
    }
    Ok(())
}

/// Like [`dequantize_row`] but writes bf16 (round to nearest even), through a small f32
/// buffer, so no f32 copy of the whole row is made.
pub fn dequantize_row_bf16(ty: GgmlType, src: &[u8], dst: &mut [bf16]) -> Result<(), QuantError> {
    check(ty, src, dst.len())?;
    let (bs, bb) = (ty.block_size(), ty.block_bytes());
    let per_step = (QK_K / bs).max(1);
    let mut buf = [0f32; QK_K];
    for (x, y) in src.chunks(per_step * bb).zip(dst.chunks_mut(per_step * bs)) {
        let tmp = &mut buf[..y.len()];
        dequantize_row(ty, x, tmp)?;
        for (o, &v) in y.iter_mut().zip(tmp.iter()) {
            *o = bf16::from_f32(v);
        }
    }
    Ok(())
}

#[inline]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

fn block_f32(x: &[u8], y: &mut [f32]) {
    y[0] = f32::from_le_bytes([x[0], x[1], x[2], x[3]]);
}

fn block_f16(x: &[u8], y: &mut [f32]) {
    y[0] = f16_at(x, 0);
}

fn block_bf16(x: &[u8], y: &mut [f32]) {
    y[0] = bf16::from_le_bytes([x[0], x[1]]).to_f32();
}

/// `{ f16 d; u8 qs[16] }`: low nibbles are values 0..16, high nibbles 16..32, offset by 8.
fn block_q4_0(x: &[u8], y: &mut [f32]) {
    let d = f16_at(x, 0);
    let qs = &x[2..18];
    for j in 0..16 {
        y[j] = ((qs[j] & 0x0f) as i32 - 8) as f32 * d;
        y[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

/// `{ f16 d; f16 m; u8 qs[16] }`: `q * d + m`.
fn block_q4_1(x: &[u8], y: &mut [f32]) {
    let d = f16_at(x, 0);
    let m = f16_at(x, 2);
    let qs = &x[4..20];
    for j in 0..16 {
        y[j] = (qs[j] & 0x0f) as f32 * d + m;
        y[j + 16] = (qs[j] >> 4) as f32 * d + m;
    }
}

/// The 5th bits of a Q5 block: bit `j` of `qh` for value `j`, bit `j + 16` for value `j + 16`.
#[inline]
fn q5_high(qh: u32, j: usize) -> (u8, u8) {
    (
        (((qh >> j) << 4) & 0x10) as u8,
        ((qh >> (j + 12)) & 0x10) as u8,
    )
}

/// `{ f16 d; u8 qh[4]; u8 qs[16] }`: 5-bit values offset by 16.
fn block_q5_0(x: &[u8], y: &mut [f32]) {
    let d = f16_at(x, 0);
    let qh = u32::from_le_bytes([x[2], x[3], x[4], x[5]]);
    let qs = &x[6..22];
    for j in 0..16 {
        let (h0, h1) = q5_high(qh, j);
        y[j] = (((qs[j] & 0x0f) | h0) as i32 - 16) as f32 * d;
        y[j + 16] = (((qs[j] >> 4) | h1) as i32 - 16) as f32 * d;
    }
}

/// `{ f16 d; f16 m; u8 qh[4]; u8 qs[16] }`: 5-bit `q * d + m`.
fn block_q5_1(x: &[u8], y: &mut [f32]) {
    let d = f16_at(x, 0);
    let m = f16_at(x, 2);
    let qh = u32::from_le_bytes([x[4], x[5], x[6], x[7]]);
    let qs = &x[8..24];
    for j in 0..16 {
        let (h0, h1) = q5_high(qh, j);
        y[j] = ((qs[j] & 0x0f) | h0) as f32 * d + m;
        y[j + 16] = ((qs[j] >> 4) | h1) as f32 * d + m;
    }
}

/// `{ f16 d; i8 qs[32] }`.
fn block_q8_0(x: &[u8], y: &mut [f32]) {
    let d = f16_at(x, 0);
    for (o, &q) in y.iter_mut().zip(&x[2..34]) {
        *o = (q as i8) as f32 * d;
    }
}

/// `{ u8 scales[16]; u8 qs[64]; f16 d; f16 dmin }`: 16 sub-blocks of 16 with 4-bit scale (low
/// nibble) and min (high nibble); 2-bit values, four per byte, in 2 halves of 128.
fn block_q2_k(x: &[u8], y: &mut [f32]) {
    let scales = &x[0..16];
    let d = f16_at(x, 80);
    let min = f16_at(x, 82);
    let mut is = 0;
    let mut out = 0;
    for half in 0..2 {
        let q = &x[16 + 32 * half..16 + 32 * half + 32];
        for shift in [0, 2, 4, 6] {
            for part in 0..2 {
                let sc = scales[is];
                is += 1;
                let dl = d * (sc & 0x0f) as f32;
                let ml = min * (sc >> 4) as f32;
                for &b in &q[16 * part..16 * part + 16] {
                    y[out] = dl * ((b >> shift) & 3) as f32 - ml;
                    out += 1;
                }
            }
        }
    }
}

/// `{ u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d }`: 16 sub-blocks of 16 with 6-bit signed
/// scales; 2 low bits in `qs`, the third (inverted: clear means minus 4) in `hmask`.
fn block_q3_k(x: &[u8], y: &mut [f32]) {
    let hmask = &x[0..32];
    let s = &x[96..108];
    let d = f16_at(x, 108);
    // 6-bit scale i: low 4 bits from byte i % 8 (nibble i / 8), high 2 bits from byte
    // 8 + i % 4 (pair i / 4).
    let scale = |i: usize| -> i32 {
        let lo = (s[i % 8] >> (4 * (i / 8))) & 0x0f;
        let hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        (lo | (hi << 4)) as i32 - 32
    };
    let mut is = 0;
    let mut out = 0;
    let mut m = 1u8;
    for half in 0..2 {
        let q = &x[32 + 32 * half..32 + 32 * half + 32];
        for shift in [0, 2, 4, 6] {
            for part in 0..2 {
                let dl = d * scale(is) as f32;
                is += 1;
                for l in 16 * part..16 * part + 16 {
                    let low = ((q[l] >> shift) & 3) as i32;
                    let sub = if hmask[l] & m != 0 { 0 } else { 4 };
                    y[out] = dl * (low - sub) as f32;
                    out += 1;
                }
            }
            m = m.wrapping_shl(1);
        }
    }
}

/// 6-bit scale and min `j` (0..8) of a Q4_K/Q5_K block (`get_scale_min_k4`).
#[inline]
pub(super) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// `{ f16 d; f16 dmin; u8 scales[12]; u8 qs[128] }`: 8 sub-blocks of 32 with 6-bit scale and
/// min; each 32 bytes of `qs` hold two sub-blocks (low nibbles, then high).
fn block_q4_k(x: &[u8], y: &mut [f32]) {
    let d = f16_at(x, 0);
    let min = f16_at(x, 2);
    let scales = &x[4..16];
    for c in 0..4 {
        let q = &x[16 + 32 * c..16 + 32 * c + 32];
        let (sc1, m1) = scale_min_k4(2 * c, scales);
        let (sc2, m2) = scale_min_k4(2 * c + 1, scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        let y = &mut y[64 * c..64 * c + 64];
        for l in 0..32 {
            y[l] = d1 * (q[l] & 0x0f) as f32 - m1;
            y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

/// `{ f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128] }`: Q4_K plus a 5th bit per value
/// in `qh` (bit `2c` for the low-nibble sub-block of chunk `c`, bit `2c + 1` for the high).
fn block_q5_k(x: &[u8], y: &mut [f32]) {
    let d = f16_at(x, 0);
    let min = f16_at(x, 2);
    let scales = &x[4..16];
    let qh = &x[16..48];
    for c in 0..4 {
        let ql = &x[48 + 32 * c..48 + 32 * c + 32];
        let (sc1, m1) = scale_min_k4(2 * c, scales);
        let (sc2, m2) = scale_min_k4(2 * c + 1, scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        let (u1, u2) = (1u8 << (2 * c), 2u8 << (2 * c));
        let y = &mut y[64 * c..64 * c + 64];
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y[l] = d1 * ((ql[l] & 0x0f) + h1) as f32 - m1;
            y[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
        }
    }
}

/// `{ u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }`: 16 sub-blocks of 16 with 8-bit signed
/// scales; 6-bit values offset by 32, in 2 halves of 128.
fn block_q6_k(x: &[u8], y: &mut [f32]) {
    let d = f16_at(x, 208);
    for half in 0..2 {
        let ql = &x[64 * half..64 * half + 64];
        let qh = &x[128 + 32 * half..128 + 32 * half + 32];
        let sc = &x[192 + 8 * half..192 + 8 * half + 8];
        let y = &mut y[128 * half..128 * half + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            let s = |k: usize| (sc[is + k] as i8) as f32;
            y[l] = d * s(0) * q1 as f32;
            y[l + 32] = d * s(2) * q2 as f32;
            y[l + 64] = d * s(4) * q3 as f32;
            y[l + 96] = d * s(6) * q4 as f32;
        }
    }
}

/// `{ f32 d; i8 qs[256]; i16 bsums[16] }`.
fn block_q8_k(x: &[u8], y: &mut [f32]) {
    let d = f32::from_le_bytes([x[0], x[1], x[2], x[3]]);
    for (o, &q) in y.iter_mut().zip(&x[4..4 + QK_K]) {
        *o = d * (q as i8) as f32;
    }
}

/// `{ f16 d; u8 qs[16] }`: nibbles index the non-linear grid.
fn block_iq4_nl(x: &[u8], y: &mut [f32]) {
    let d = f16_at(x, 0);
    for (j, &q) in x[2..18].iter().enumerate() {
        y[j] = d * KVALUES_IQ4NL[(q & 0x0f) as usize] as f32;
        y[j + 16] = d * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
    }
}

/// `{ f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128] }`: 8 sub-blocks of 32 with 6-bit
/// scales offset by 32 (low nibble in `scales_l`, high pair in `scales_h`).
fn block_iq4_xs(x: &[u8], y: &mut [f32]) {
    let d = f16_at(x, 0);
    let scales_h = u16::from_le_bytes([x[2], x[3]]);
    let scales_l = &x[4..8];
    for ib in 0..8 {
        let lo = (scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f;
        let hi = ((scales_h >> (2 * ib)) & 3) as u8;
        let dl = d * ((lo | (hi << 4)) as i32 - 32) as f32;
        let qs = &x[8 + 16 * ib..8 + 16 * ib + 16];
        let y = &mut y[32 * ib..32 * ib + 32];
        for j in 0..16 {
            y[j] = dl * KVALUES_IQ4NL[(qs[j] & 0x0f) as usize] as f32;
            y[j + 16] = dl * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
        }
    }
}
