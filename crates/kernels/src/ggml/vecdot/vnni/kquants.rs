//! Q4_K, Q5_K and Q6_K: 256-value blocks with integer sub-scales, against activations
//! quantized per 256. Each 64 values become one register in the activations' order;
//! `vpmaddubsw` forms pair sums (at most 63 · 127 · 2, no saturation) and `vpdpwssd`
//! multiplies them by their sub-block's scale into i32, converted to f32 once per block.

// Per-token accumulators read best indexed by the token, as the activation rows are.
#![allow(clippy::needless_range_loop)]

use super::{RowKernel, Tokens, f16_at};
use crate::ggml::GgmlType;
use crate::vnni_unit::{Vnni, halves16, runs16};

/// The eight 6-bit scales and eight mins of a Q4_K / Q5_K block from its 12 packed bytes
/// (ggml's `get_scale_min_k4`), each as eight bytes of a u64.
///
/// Bytes 0-3 hold scales 0-3 in their low 6 bits, bytes 4-7 mins 0-3; bytes 8-11 hold scales
/// 4-7 (low nibble) and mins 4-7 (high nibble), whose top 2 bits are the top bits of bytes
/// 0-3 and 4-7.
#[inline(always)]
fn k4_scales(b: &[u8]) -> (u64, u64) {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let w = |i: usize| u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
    let (w0, w1, w2) = (w(0), w(1), w(2));
    let scales_hi = (w2 & LOW4) | (((w0 >> 6) & LOW2) << 4);
    let mins_hi = ((w2 >> 4) & LOW4) | (((w1 >> 6) & LOW2) << 4);
    (
        u64::from(w0 & LOW6) | u64::from(scales_hi) << 32,
        u64::from(w1 & LOW6) | u64::from(mins_hi) << 32,
    )
}

/// Q4_K: `{f16 d, dmin; u8 scales[12]; u8 qs[128]}`, value `d · sc · q - dmin · m` per
/// sub-block of 32; each 32 bytes of `qs` hold two sub-blocks (low nibbles, then high).
pub(in crate::ggml::vecdot) struct Q4K;

/// Q5_K: Q4_K's layout with `qh[32]` (bytes 16..48) holding the fifth bit, `qs` at 48;
/// chunk `c` of 64 values takes bits `2c` and `2c + 1` of `qh`.
pub(in crate::ggml::vecdot) struct Q5K;

impl RowKernel for Q4K {
    const TYPE: GgmlType = GgmlType::Q4_K;
    #[inline(always)]
    unsafe fn row<U: Vnni, const N: usize>(u: U, row: &[u8], xt: &Tokens<N>, out: &mut [f32; N]) {
        // SAFETY: the caller's guarantees.
        unsafe { k4::<U, N, false>(u, row, xt, out) }
    }
}

impl RowKernel for Q5K {
    const TYPE: GgmlType = GgmlType::Q5_K;
    #[inline(always)]
    unsafe fn row<U: Vnni, const N: usize>(u: U, row: &[u8], xt: &Tokens<N>, out: &mut [f32; N]) {
        // SAFETY: the caller's guarantees.
        unsafe { k4::<U, N, true>(u, row, xt, out) }
    }
}

/// Q4_K, or Q5_K with `FIVE`: the two share scales, mins and the order of values.
///
/// # Safety
/// As [`RowKernel::row`].
#[inline(always)]
unsafe fn k4<U: Vnni, const N: usize, const FIVE: bool>(
    u: U,
    row: &[u8],
    xt: &Tokens<N>,
    out: &mut [f32; N],
) {
    let (block, qs) = if FIVE { (176, 48) } else { (144, 16) };
    let (m4, one) = (u.splat8(0x0f), u.splat8(1));
    // The low half of a chunk's register takes the low nibbles of its 32 bytes, the high
    // half the high nibbles: values 64c .. 64c + 64 in order.
    let nibble_shift = u.bytes(halves16(0, 4));
    // Sub-blocks 2c and 2c + 1 in the two halves: the scale to pick (i16 lane of the
    // scales), and for Q5_K the bit of `qh` that holds their fifth bits.
    const SUB: [[u8; 64]; 4] = [runs16(0, 16), runs16(2, 16), runs16(4, 16), runs16(6, 16)];
    // No closures over unit operations here: one compiled apart would call each instruction.
    let sub = [
        u.bytes(SUB[0]),
        u.bytes(SUB[1]),
        u.bytes(SUB[2]),
        u.bytes(SUB[3]),
    ];
    // Each min (i16 lanes 8-15) twice, matching the activations' sums per 16; lanes 16-31
    // meet zero sums.
    let pick_mins = u.bytes(runs16(8, 2));
    let mut acc = [u.splatf(0.0); N];
    for (i, x) in row.chunks_exact(block).enumerate() {
        let (d, dmin) = (f16_at(u, x, 0), f16_at(u, x, 2));
        let (sc, mins) = k4_scales(&x[4..16]);
        // i16 lanes 0-7: scales, 8-15: mins.
        let sm = u.zext8to16(u.u64x2(sc, mins));
        let mins16 = u.permw(pick_mins, sm);
        let qh = if FIVE {
            // SAFETY: Q5_K's bytes 16..48 lie within its 176-byte block.
            unsafe { u.load_dup32(x.as_ptr().add(16)) }
        } else {
            u.zero()
        };
        // Even and odd chunks in two sums: one token's chain of dependent `vpdpwssd` was the
        // critical path of a decode row.
        let mut sumi = [[u.zero(); N]; 2];
        for c in 0..4 {
            // SAFETY: bytes qs + 32 c .. qs + 32 c + 32 lie within the block.
            let q = unsafe { u.load_dup32(x.as_ptr().add(qs + 32 * c)) };
            let mut v = u.and(u.srlv16(q, nibble_shift), m4);
            if FIVE {
                v = u.or(v, u.slli16::<4>(u.and(u.srlv16(qh, sub[c]), one)));
            }
            let s = u.permw(sub[c], sm);
            for j in 0..N {
                // SAFETY: block `i` of the row lies within the rows of `xt` (caller).
                let xv = unsafe { xt.load_x(u, j, 256 * i + 64 * c) };
                sumi[c % 2][j] = u.dpwssd(sumi[c % 2][j], u.maddubs(v, xv), s);
            }
        }
        for j in 0..N {
            let dx = xt.s[j][8 * i];
            let sumi = u.add32(sumi[0][j], sumi[1][j]);
            // SAFETY: as above.
            let ms = u.dpwssd(u.zero(), unsafe { xt.load_isums(u, j, i) }, mins16);
            acc[j] = u.fmadd(u.cvt(sumi), u.splatf(d * dx), acc[j]);
            acc[j] = u.fmadd(u.cvt(ms), u.splatf(-(dmin * dx)), acc[j]);
        }
    }
    for j in 0..N {
        out[j] = u.hsum(acc[j]);
    }
}

/// Q6_K: `{u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}`, value `d · sc · (q - 32)` with
/// a scale per 16; each half of 128 values takes 64 bytes of `ql` and 32 of `qh`: values
/// `l`, `l + 32`, `l + 64`, `l + 96` from the low nibble of `ql[l]`, of `ql[l + 32]`, the
/// high nibbles of the same, and bits 0-1, 2-3, 4-5, 6-7 of `qh[l]`.
pub(in crate::ggml::vecdot) struct Q6K;

impl RowKernel for Q6K {
    const TYPE: GgmlType = GgmlType::Q6_K;

    #[inline(always)]
    unsafe fn row<U: Vnni, const N: usize>(u: U, row: &[u8], xt: &Tokens<N>, out: &mut [f32; N]) {
        let (m4, m2) = (u.splat8(0x0f), u.splat8(0x03));
        let fours = u.bytes(halves16(4, 4));
        // `qh` bits of values 0-63 of a half (low register half: bits 0-1, high: 2-3) and of
        // values 64-127 (4-5, 6-7).
        let qh_shift = [u.bytes(halves16(0, 2)), u.bytes(halves16(4, 6))];
        // The scale of each pair sum: sub-block `8 half + 4 part + l / 8`.
        const PICK: [[[u8; 64]; 2]; 2] =
            [[runs16(0, 8), runs16(4, 8)], [runs16(8, 8), runs16(12, 8)]];
        let pick = [
            [u.bytes(PICK[0][0]), u.bytes(PICK[0][1])],
            [u.bytes(PICK[1][0]), u.bytes(PICK[1][1])],
        ];
        let mut acc = [u.splatf(0.0); N];
        for (i, x) in row.chunks_exact(210).enumerate() {
            let d = f16_at(u, x, 208);
            let word = |at: usize| u64::from_le_bytes(x[at..at + 8].try_into().expect("8 bytes"));
            let sc = u.sext8to16(u.u64x2(word(192), word(200)));
            // The halves in two sums, as for Q4_K.
            let mut sumi = [[u.zero(); N]; 2];
            for h in 0..2 {
                // SAFETY: ql (0..128) and qh (128..192) lie within the 210-byte block.
                let (ql, qh) = unsafe {
                    (
                        u.load(x.as_ptr().add(64 * h)),
                        u.load_dup32(x.as_ptr().add(128 + 32 * h)),
                    )
                };
                let top0 = u.slli16::<4>(u.and(u.srlv16(qh, qh_shift[0]), m2));
                let top1 = u.slli16::<4>(u.and(u.srlv16(qh, qh_shift[1]), m2));
                let parts = [
                    u.or(u.and(ql, m4), top0),
                    u.or(u.and(u.srlv16(ql, fours), m4), top1),
                ];
                for (p, v) in parts.into_iter().enumerate() {
                    let s = u.permw(pick[h][p], sc);
                    for j in 0..N {
                        // SAFETY: block `i` lies within the rows of `xt` (caller).
                        let xv = unsafe { xt.load_x(u, j, 256 * i + 128 * h + 64 * p) };
                        sumi[h][j] = u.dpwssd(sumi[h][j], u.maddubs(v, xv), s);
                    }
                }
            }
            for j in 0..N {
                let dx = xt.s[j][8 * i];
                // The -32 offset: Σ_u sc_u · 32 · Σ x over unit u (scales in lanes 0-15).
                // SAFETY: as above.
                let off = u.dpwssd(u.zero(), unsafe { xt.load_isums(u, j, i) }, sc);
                let s = u.sub32(u.add32(sumi[0][j], sumi[1][j]), u.slli32::<5>(off));
                acc[j] = u.fmadd(u.cvt(s), u.splatf(d * dx), acc[j]);
            }
        }
        for j in 0..N {
            out[j] = u.hsum(acc[j]);
        }
    }
}
