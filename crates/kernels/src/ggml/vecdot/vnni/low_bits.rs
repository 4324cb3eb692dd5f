//! Q2_K and Q3_K: 256-value blocks of 2- and 3-bit values with a scale per 16, against
//! activations quantized per 32 (their coarse weights keep the activations' finer
//! rounding). A register holds two groups of 32 (one 2-bit plane pair of 32 bytes):
//! `vpmaddubsw` pair sums meet their scale per 16 in `vpdpwssd`, and the two groups convert
//! with their own activation scales. A block's mins (Q2_K) or -4 offsets (Q3_K) meet the
//! activations' sums per 16 in one f32 multiply-add per block.

// Per-token accumulators read best indexed by the token, as the activation rows are.
#![allow(clippy::needless_range_loop)]

use super::{RowKernel, Tokens, f16_at};
use crate::ggml::GgmlType;
use crate::vnni_unit::{Vnni, runs16};

/// `q` (the same 32 bytes in both halves) shifted so that 2-bit plane `p` (0 or 2) lies at
/// the bottom of each byte of the low half, plane `p + 1` of the high half.
#[inline(always)]
fn plane_pair<U: Vnni>(u: U, q: U::I, p: usize) -> U::I {
    if p < 2 {
        u.srli16_halves::<0, 2>(q)
    } else {
        u.srli16_halves::<4, 6>(q)
    }
}
/// The i16 lanes of the scales per 16 that a plane pair's pair sums take: units `2g ..`
/// for the pair's first group `g` (0, 2, 4, 6).
const UNITS: [[u8; 64]; 4] = [runs16(0, 8), runs16(4, 8), runs16(8, 8), runs16(12, 8)];

/// How a Q2_K or Q3_K block's bytes become registers (methods, not closures: a closure
/// compiled apart from the kernel would call each instruction).
trait LowBits {
    /// Bytes per block.
    const BLOCK: usize;

    /// The scale per 16 as i16 lanes 0-15, the per-unit f32 term against the activations'
    /// sums, and the block scale `d`.
    fn scales<U: Vnni>(u: U, x: &[u8]) -> (U::I, U::F, f32);

    /// The 64 unsigned values of groups `4 half + p` and `4 half + p + 1` (`p` 0 or 2).
    fn planes<U: Vnni>(u: U, x: &[u8], half: usize, p: usize) -> U::I;
}

/// One row of Q2_K or Q3_K.
///
/// # Safety
/// As [`RowKernel::row`].
#[inline(always)]
unsafe fn low_bits<U: Vnni, K: LowBits, const N: usize>(
    u: U,
    row: &[u8],
    xt: &Tokens<N>,
    out: &mut [f32; N],
) {
    let mut acc = [u.splatf(0.0); N];
    for (i, x) in row.chunks_exact(K::BLOCK).enumerate() {
        let (sc, unit_terms, d) = K::scales(u, x);
        for h in 0..2 {
            for p in [0, 2] {
                let g = 4 * h + p;
                let w = K::planes(u, x, h, p);
                let s = u.permw(u.bytes(UNITS[g / 2]), sc);
                for j in 0..N {
                    // SAFETY: groups `8 i + g` and the next lie within the rows (caller).
                    let (xv, xs) = unsafe {
                        (
                            xt.load_x(u, j, 256 * i + 32 * g),
                            u.load_f2x8(xt.s[j].as_ptr().add(8 * i + g)),
                        )
                    };
                    let p = u.madd16(u.maddubs(w, xv), s);
                    acc[j] = u.fmadd(u.cvt(p), u.mulf(u.splatf(d), xs), acc[j]);
                }
            }
        }
        for j in 0..N {
            // SAFETY: block `i` lies within the rows (caller).
            acc[j] = u.fmadd(unit_terms, unsafe { xt.load_sums(u, j, i) }, acc[j]);
        }
    }
    for j in 0..N {
        out[j] = u.hsum(acc[j]);
    }
}

/// Q2_K: `{u8 scales[16]; u8 qs[64]; f16 d, dmin}`, value `d · (sc & 15) · q - dmin ·
/// (sc >> 4)` per 16; each 32 bytes of `qs` hold 128 values as four 2-bit planes.
pub(in crate::ggml::vecdot) struct Q2K;

impl RowKernel for Q2K {
    const TYPE: GgmlType = GgmlType::Q2_K;
    #[inline(always)]
    unsafe fn row<U: Vnni, const N: usize>(u: U, row: &[u8], xt: &Tokens<N>, out: &mut [f32; N]) {
        // SAFETY: the caller's guarantees.
        unsafe { low_bits::<U, Self, N>(u, row, xt, out) }
    }
}

impl LowBits for Q2K {
    const BLOCK: usize = 84;

    #[inline(always)]
    fn scales<U: Vnni>(u: U, x: &[u8]) -> (U::I, U::F, f32) {
        // SAFETY: the scales are bytes 0..16 of the 84-byte block.
        let v = unsafe { u.load16(x[..16].as_ptr()) };
        let (d, dmin) = (f16_at(u, x, 80), f16_at(u, x, 82));
        let m4 = u.splat8(0x0f);
        let mins = u.cvt(u.zext8to32(u.and(u.srli16::<4>(v), m4)));
        (u.zext8to16(u.and(v, m4)), u.mulf(mins, u.splatf(-dmin)), d)
    }

    #[inline(always)]
    fn planes<U: Vnni>(u: U, x: &[u8], h: usize, p: usize) -> U::I {
        assert!(x.len() == Self::BLOCK && h < 2);
        // SAFETY: bytes 16 + 32 h .. 48 + 32 h lie within the 84-byte block (checked).
        let q = unsafe { u.load_dup32(x.as_ptr().add(16 + 32 * h)) };
        u.and(plane_pair(u, q, p), u.splat8(3))
    }
}

/// Q3_K: `{u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}`, value `d · (sc - 32) · (q - 4)`
/// per 16, `q` the 2 bits of `qs` plus 4 where the value's bit of `hmask` is set (bit `4
/// half + plane` of byte `l`); the 6-bit scales are packed as 16 low nibbles and 16 pairs
/// of high bits.
pub(in crate::ggml::vecdot) struct Q3K;

impl RowKernel for Q3K {
    const TYPE: GgmlType = GgmlType::Q3_K;
    #[inline(always)]
    unsafe fn row<U: Vnni, const N: usize>(u: U, row: &[u8], xt: &Tokens<N>, out: &mut [f32; N]) {
        // SAFETY: the caller's guarantees.
        unsafe { low_bits::<U, Self, N>(u, row, xt, out) }
    }
}

/// `hmask` (the same 32 bytes in both halves) shifted so that the bits of plane pair `p` of
/// half `h`, bits `4h + p` and `4h + p + 1`, lie at the bottom of the two halves' bytes.
#[inline(always)]
fn high_bits<U: Vnni>(u: U, hmask: U::I, h: usize, p: usize) -> U::I {
    match 2 * h + p / 2 {
        0 => u.srli16_halves::<0, 1>(hmask),
        1 => u.srli16_halves::<2, 3>(hmask),
        2 => u.srli16_halves::<4, 5>(hmask),
        _ => u.srli16_halves::<6, 7>(hmask),
    }
}

impl LowBits for Q3K {
    const BLOCK: usize = 110;

    #[inline(always)]
    fn scales<U: Vnni>(u: U, x: &[u8]) -> (U::I, U::F, f32) {
        let s = &x[96..108];
        let sc: [u8; 16] = std::array::from_fn(|k| {
            let lo = (s[k % 8] >> (4 * (k / 8))) & 0x0f;
            let hi = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
            (lo | (hi << 4)).wrapping_sub(32)
        });
        // SAFETY: `sc` is 16 bytes.
        let v = unsafe { u.load16(sc.as_ptr()) };
        let d = f16_at(u, x, 108);
        // The -4 offset of every value, as a term per 16: -4 d sc_u against Σ x.
        let offsets = u.mulf(u.cvt(u.sext8to32(v)), u.splatf(-4.0 * d));
        (u.sext8to16(v), offsets, d)
    }

    #[inline(always)]
    fn planes<U: Vnni>(u: U, x: &[u8], h: usize, p: usize) -> U::I {
        assert!(x.len() == Self::BLOCK && h < 2);
        // SAFETY: hmask (0..32) and qs (32..96) lie within the 110-byte block (checked).
        let (q, hmask) = unsafe {
            (
                u.load_dup32(x.as_ptr().add(32 + 32 * h)),
                u.load_dup32(x.as_ptr()),
            )
        };
        let low = u.and(plane_pair(u, q, p), u.splat8(3));
        let bit = u.and(high_bits(u, hmask, h, p), u.splat8(1));
        u.or(low, u.slli16::<2>(bit))
    }
}
