//! Blocks of 32 values with one f32 scale each, against activations quantized per 32:
//! signed integers (Q8_0, Q4_0, Q5_0, IQ4_NL, and IQ4_XS's sub-blocks) or unsigned ones
//! with a min (Q4_1, Q5_1). Two groups of 32 are decoded into one register of bytes;
//! `vpdpbusd` multiplies them straight into i32 (signed weights as `|w|` times `x` carrying
//! `w`'s sign: |x| <= 127, so the negation cannot overflow), and each token converts once
//! per 64 values. A min meets the activations' sums per 16 in f32.

// Per-token accumulators read best indexed by the token, as the activation rows are.
#![allow(clippy::needless_range_loop)]

use super::unit::Vnni;
use super::{RowKernel, Xs, f16_at};
use crate::ggml::GgmlType;
use crate::ggml::unpack::KVALUES_IQ4NL;

/// A block type whose groups of 32 values are bytes times an f32 scale: signed, or
/// unsigned plus a min (`d · q + m`).
trait Groups32 {
    /// The block type.
    const TYPE: GgmlType;
    /// Whether the values are unsigned with a min per group.
    const WITH_MIN: bool = false;

    /// Groups `g0` (low half) and `g1` (high half) of `row` as bytes in value order, their
    /// scales in f32 lanes 0-7 and 8-15, and their mins (zero for signed types).
    ///
    /// # Safety
    /// Both groups lie within `row`; `U` runs on this CPU.
    unsafe fn decode<U: Vnni>(u: U, row: &[u8], g0: usize, g1: usize) -> (U::I, U::F, [f32; 2]);
}

/// Every [`Groups32`] type is a row kernel.
macro_rules! row_kernel {
    ($($t:ty),*) => {$(
        impl RowKernel for $t {
            const TYPE: GgmlType = <$t as Groups32>::TYPE;
            #[inline(always)]
            unsafe fn row<U: Vnni, const N: usize>(
                u: U,
                row: &[u8],
                xt: &Xs<N>,
                out: &mut [f32; N],
            ) {
                // SAFETY: the caller's guarantees.
                unsafe { groups32::<U, $t, N>(u, row, xt, out) }
            }
        }
    )*};
}
row_kernel!(Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, IQ4NL, IQ4XS);

/// One row of a [`Groups32`] type against `N` tokens, 64 values at a time; an odd last
/// group runs with zeros in the high half (activations and their scale).
///
/// # Safety
/// As [`RowKernel::row`].
#[inline(always)]
unsafe fn groups32<U: Vnni, K: Groups32, const N: usize>(
    u: U,
    row: &[u8],
    xt: &Xs<N>,
    out: &mut [f32; N],
) {
    let groups = row.len() / K::TYPE.block_bytes() * K::TYPE.block_size() / 32;
    let mut acc = [u.splatf(0.0); N];
    // The mins' terms, `m · s Σ q` per group.
    let mut min_terms = [0.0f32; N];
    for g in (0..groups).step_by(2) {
        let pair = g + 1 < groups;
        // SAFETY: groups `g` and `g + 1` (or `g` twice) lie within the row.
        let (w, ws, mins) = unsafe { K::decode(u, row, g, if pair { g + 1 } else { g }) };
        let (wa, neg) = if K::WITH_MIN {
            (w, u.negative8(u.zero()))
        } else {
            (u.abs8(w), u.negative8(w))
        };
        for j in 0..N {
            if K::WITH_MIN {
                let sums = &xt.sums[j][2 * g..];
                min_terms[j] += mins[0] * (sums[0] + sums[1]);
                if pair {
                    min_terms[j] += mins[1] * (sums[2] + sums[3]);
                }
            }
            // SAFETY: the row has `groups` groups of 32 activations and scales (caller).
            let (xv, xs) = unsafe {
                if pair {
                    (xt.x(u, j, 32 * g), u.load_f2x8(xt.s[j].as_ptr().add(g)))
                } else {
                    (xt.x_low32(u, j, 32 * g), u.f2x8(xt.s[j][g], 0.0))
                }
            };
            let p = u.dpbusd(u.zero(), wa, u.neg8_where(xv, neg));
            acc[j] = u.fmadd(u.cvt(p), u.mulf(ws, xs), acc[j]);
        }
    }
    for j in 0..N {
        out[j] = u.hsum(acc[j]) + min_terms[j];
    }
}

/// Shifts of 16-bit lanes that take the low nibbles into 128-bit lanes 0 and 2 and the
/// high ones into 1 and 3, when each block's 16 bytes are loaded twice (`load_4x16`).
const NIBBLE_SHIFT: [u8; 64] = {
    let mut b = [0u8; 64];
    let mut l = 0;
    while l < 32 {
        b[2 * l] = if (l / 8) % 2 == 1 { 4 } else { 0 };
        l += 1;
    }
    b
};

/// The 32 values of two blocks of 16 nibble bytes at `a` and `b`: low nibbles then high
/// nibbles of each, unsigned.
///
/// # Safety
/// 16 bytes at `a` and at `b` are readable.
#[inline(always)]
unsafe fn nibbles<U: Vnni>(u: U, a: *const u8, b: *const u8) -> U::I {
    // SAFETY: the caller's guarantee.
    let q = unsafe { u.load_4x16(a, a, b, b) };
    u.and(u.srlv16(q, u.bytes(NIBBLE_SHIFT)), u.splat8(0x0f))
}

/// Q8_0: `{f16 d; i8 q[32]}`.
pub(in crate::ggml::vecdot) struct Q8_0;

impl Groups32 for Q8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    #[inline(always)]
    unsafe fn decode<U: Vnni>(u: U, row: &[u8], g0: usize, g1: usize) -> (U::I, U::F, [f32; 2]) {
        let (b0, b1) = (&row[34 * g0..34 * g0 + 34], &row[34 * g1..34 * g1 + 34]);
        // SAFETY: each block's values are its bytes 2..34.
        let w = unsafe { u.load_2x32(b0.as_ptr().add(2), b1.as_ptr().add(2)) };
        (w, u.f2x8(f16_at(u, b0, 0), f16_at(u, b1, 0)), [0.0; 2])
    }
}

/// Q4_0: `{f16 d; u8 qs[16]}`, value `d · (q - 8)`, low nibbles first.
pub(in crate::ggml::vecdot) struct Q4_0;

impl Groups32 for Q4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    #[inline(always)]
    unsafe fn decode<U: Vnni>(u: U, row: &[u8], g0: usize, g1: usize) -> (U::I, U::F, [f32; 2]) {
        let (b0, b1) = (&row[18 * g0..18 * g0 + 18], &row[18 * g1..18 * g1 + 18]);
        // SAFETY: each block's nibbles are its bytes 2..18.
        let q = unsafe { nibbles(u, b0.as_ptr().add(2), b1.as_ptr().add(2)) };
        (
            u.sub8(q, u.splat8(8)),
            u.f2x8(f16_at(u, b0, 0), f16_at(u, b1, 0)),
            [0.0; 2],
        )
    }
}

/// Q5_0: `{f16 d; u32 qh; u8 qs[16]}`, value `d · (q - 16)`, bit `j` of `qh` the fifth
/// bit of value `j`.
pub(in crate::ggml::vecdot) struct Q5_0;

impl Groups32 for Q5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    #[inline(always)]
    unsafe fn decode<U: Vnni>(u: U, row: &[u8], g0: usize, g1: usize) -> (U::I, U::F, [f32; 2]) {
        let (b0, b1) = (&row[22 * g0..22 * g0 + 22], &row[22 * g1..22 * g1 + 22]);
        let qh = |b: &[u8]| u64::from(u32::from_le_bytes([b[2], b[3], b[4], b[5]]));
        let fifth = u.and(u.bytes_where(qh(b0) | qh(b1) << 32), u.splat8(0x10));
        // SAFETY: each block's nibbles are its bytes 6..22.
        let q = unsafe { nibbles(u, b0.as_ptr().add(6), b1.as_ptr().add(6)) };
        let w = u.sub8(u.or(q, fifth), u.splat8(16));
        (w, u.f2x8(f16_at(u, b0, 0), f16_at(u, b1, 0)), [0.0; 2])
    }
}

/// Q4_1: `{f16 d, m; u8 qs[16]}`, value `d · q + m`, low nibbles first.
pub(in crate::ggml::vecdot) struct Q4_1;

impl Groups32 for Q4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
    const WITH_MIN: bool = true;
    #[inline(always)]
    unsafe fn decode<U: Vnni>(u: U, row: &[u8], g0: usize, g1: usize) -> (U::I, U::F, [f32; 2]) {
        let (b0, b1) = (&row[20 * g0..20 * g0 + 20], &row[20 * g1..20 * g1 + 20]);
        // SAFETY: each block's nibbles are its bytes 4..20.
        let q = unsafe { nibbles(u, b0.as_ptr().add(4), b1.as_ptr().add(4)) };
        let ws = u.f2x8(f16_at(u, b0, 0), f16_at(u, b1, 0));
        (q, ws, [f16_at(u, b0, 2), f16_at(u, b1, 2)])
    }
}

/// Q5_1: `{f16 d, m; u32 qh; u8 qs[16]}`, value `d · q + m`, bit `j` of `qh` the fifth
/// bit of value `j`.
pub(in crate::ggml::vecdot) struct Q5_1;

impl Groups32 for Q5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
    const WITH_MIN: bool = true;
    #[inline(always)]
    unsafe fn decode<U: Vnni>(u: U, row: &[u8], g0: usize, g1: usize) -> (U::I, U::F, [f32; 2]) {
        let (b0, b1) = (&row[24 * g0..24 * g0 + 24], &row[24 * g1..24 * g1 + 24]);
        let qh = |b: &[u8]| u64::from(u32::from_le_bytes([b[4], b[5], b[6], b[7]]));
        let fifth = u.and(u.bytes_where(qh(b0) | qh(b1) << 32), u.splat8(0x10));
        // SAFETY: each block's nibbles are its bytes 8..24.
        let q = unsafe { nibbles(u, b0.as_ptr().add(8), b1.as_ptr().add(8)) };
        let ws = u.f2x8(f16_at(u, b0, 0), f16_at(u, b1, 0));
        (u.or(q, fifth), ws, [f16_at(u, b0, 2), f16_at(u, b1, 2)])
    }
}

/// The IQ4 grid in every 128-bit lane, for `vpshufb`.
const IQ4_TABLE: [u8; 64] = {
    let mut b = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        b[i] = KVALUES_IQ4NL[i % 16] as u8;
        i += 1;
    }
    b
};

/// IQ4_NL: `{f16 d; u8 qs[16]}`, value `d · grid[q]`, low nibbles first.
pub(in crate::ggml::vecdot) struct IQ4NL;

impl Groups32 for IQ4NL {
    const TYPE: GgmlType = GgmlType::IQ4_NL;
    #[inline(always)]
    unsafe fn decode<U: Vnni>(u: U, row: &[u8], g0: usize, g1: usize) -> (U::I, U::F, [f32; 2]) {
        let (b0, b1) = (&row[18 * g0..18 * g0 + 18], &row[18 * g1..18 * g1 + 18]);
        // SAFETY: each block's nibbles are its bytes 2..18.
        let q = unsafe { nibbles(u, b0.as_ptr().add(2), b1.as_ptr().add(2)) };
        (
            u.shufb(u.bytes(IQ4_TABLE), q),
            u.f2x8(f16_at(u, b0, 0), f16_at(u, b1, 0)),
            [0.0; 2],
        )
    }
}

/// IQ4_XS: `{f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]}` per 256 values; sub-block
/// `s` of 32 has the 6-bit scale `ls` (low 4 bits in nibble `s % 2` of `scales_l[s / 2]`,
/// high 2 bits at bit `2 s` of `scales_h`), value `d · (ls - 32) · grid[q]`, its nibbles
/// in `qs[16 s .. 16 s + 16]`, low nibbles first.
pub(in crate::ggml::vecdot) struct IQ4XS;

impl IQ4XS {
    /// Group `g`'s block, nibble bytes and scale.
    #[inline(always)]
    fn group<U: Vnni>(u: U, row: &[u8], g: usize) -> (&[u8], f32) {
        let (b, s) = (&row[136 * (g / 8)..136 * (g / 8) + 136], g % 8);
        let low = (b[4 + s / 2] >> (4 * (s % 2))) & 0x0f;
        let high = (u16::from_le_bytes([b[2], b[3]]) >> (2 * s)) & 3;
        let ls = i32::from(low) | i32::from(high) << 4;
        (
            &b[8 + 16 * s..24 + 16 * s],
            f16_at(u, b, 0) * (ls - 32) as f32,
        )
    }
}

impl Groups32 for IQ4XS {
    const TYPE: GgmlType = GgmlType::IQ4_XS;
    #[inline(always)]
    unsafe fn decode<U: Vnni>(u: U, row: &[u8], g0: usize, g1: usize) -> (U::I, U::F, [f32; 2]) {
        let ((q0, d0), (q1, d1)) = (Self::group(u, row, g0), Self::group(u, row, g1));
        // SAFETY: each group's 16 nibble bytes are the slices `group` returned.
        let q = unsafe { nibbles(u, q0.as_ptr(), q1.as_ptr()) };
        (u.shufb(u.bytes(IQ4_TABLE), q), u.f2x8(d0, d1), [0.0; 2])
    }
}
