//! Blocks of 32 values with one f32 scale each, against activations quantized per 32:
//! signed integers (Q8_0, Q4_0, Q5_0, IQ4_NL, and IQ4_XS's sub-blocks) or unsigned ones
//! with a min (Q4_1, Q5_1). Two groups of 32 are decoded into one register of bytes;
//! `vpdpbusd` multiplies them straight into i32 (signed weights as `|w|` times `x` carrying
//! `w`'s sign: |x| <= 127, so the negation cannot overflow), and each token converts once
//! per 64 values. A min meets the activations' sums per 16 in f32.

// Per-token accumulators read best indexed by the token, as the activation rows are.
#![allow(clippy::needless_range_loop)]

use super::{RowKernel, Tokens, f16_at};
use crate::ggml::GgmlType;
use crate::ggml::unpack::KVALUES_IQ4NL;
use crate::vnni_unit::Vnni;

/// The registers of one pair of groups: values as bytes in order, scales in f32 lanes 0-7
/// and 8-15, and mins (zero for signed types).
type Pair<U> = (<U as Vnni>::I, <U as Vnni>::F, [f32; 2]);

/// Receives the pairs of groups of a row (a trait, not a closure: closures do not inline
/// reliably, and one compiled apart from the kernel would call each instruction).
trait PairSink<U: Vnni> {
    /// Pair `pair` starting at group `g`; `whole` is false for a last group alone, whose
    /// high half repeats it.
    fn pair(&mut self, pair: Pair<U>, g: usize, whole: bool);
}

/// A block type whose groups of 32 values are bytes times an f32 scale: signed, or
/// unsigned plus a min (`d · q + m`).
trait Groups32 {
    /// The block type.
    const TYPE: GgmlType;
    /// Whether the values are unsigned with a min per group.
    const WITH_MIN: bool = false;

    /// Hands every pair of groups of `row` to `sink`, in order.
    ///
    /// # Safety
    /// `U` runs on this CPU.
    unsafe fn pairs<U: Vnni>(u: U, row: &[u8], sink: &mut impl PairSink<U>);
}

/// [`Groups32::pairs`] for blocks of 32 values, `$bb` bytes each, two at a time, decoded by
/// the type's `decode(u, low, high)`.
macro_rules! block_pairs {
    ($bb:literal) => {
        #[inline(always)]
        unsafe fn pairs<U: Vnni>(u: U, row: &[u8], sink: &mut impl PairSink<U>) {
            let (blocks, rest) = row.as_chunks::<$bb>();
            debug_assert!(rest.is_empty());
            let mut two = blocks.chunks_exact(2);
            for (p, b) in two.by_ref().enumerate() {
                // SAFETY: the caller's guarantee.
                sink.pair(unsafe { Self::decode(u, &b[0], &b[1]) }, 2 * p, true);
            }
            if let [last] = two.remainder() {
                // SAFETY: the caller's guarantee.
                let pair = unsafe { Self::decode(u, last, last) };
                sink.pair(pair, blocks.len() - 1, false);
            }
        }
    };
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
                xt: &Tokens<N>,
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
    xt: &Tokens<N>,
    out: &mut [f32; N],
) {
    let mut dot = Dot::<U, N, K> {
        u,
        xt,
        acc: [u.splatf(0.0); N],
        min_terms: [0.0; N],
        kind: std::marker::PhantomData,
    };
    // SAFETY: the caller's guarantees.
    unsafe { K::pairs(u, row, &mut dot) };
    for j in 0..N {
        out[j] = u.hsum(dot.acc[j]) + dot.min_terms[j];
    }
}

/// The sums of one row against `N` tokens.
struct Dot<'a, U: Vnni, const N: usize, K> {
    u: U,
    xt: &'a Tokens<'a, N>,
    acc: [U::F; N],
    /// The mins' terms, `m · s Σ q` per group.
    min_terms: [f32; N],
    kind: std::marker::PhantomData<K>,
}

impl<U: Vnni, const N: usize, K: Groups32> PairSink<U> for Dot<'_, U, N, K> {
    #[inline(always)]
    fn pair(&mut self, (w, ws, mins): Pair<U>, g: usize, whole: bool) {
        let (u, xt) = (self.u, self.xt);
        let (wa, neg) = if K::WITH_MIN {
            (w, u.negative8(u.zero()))
        } else {
            (u.abs8(w), u.negative8(w))
        };
        for j in 0..N {
            if K::WITH_MIN {
                let sums = &xt.sums[j][2 * g..];
                self.min_terms[j] += mins[0] * (sums[0] + sums[1]);
                if whole {
                    self.min_terms[j] += mins[1] * (sums[2] + sums[3]);
                }
            }
            // SAFETY: `pairs` hands out only groups of the row, whose activations and scales
            // the rows of `xt` hold (the kernel's caller).
            let (xv, xs) = unsafe {
                if whole {
                    (
                        xt.load_x(u, j, 32 * g),
                        u.load_f2x8(xt.s[j].as_ptr().add(g)),
                    )
                } else {
                    (xt.load_x_low32(u, j, 32 * g), u.f2x8(xt.s[j][g], 0.0))
                }
            };
            let p = u.dpbusd(u.zero(), wa, u.neg8_where(xv, neg));
            self.acc[j] = u.fmadd(u.cvt(p), u.mulf(ws, xs), self.acc[j]);
        }
    }
}

/// Shifts of 16-bit lanes that take the low nibbles into 128-bit lanes 0 and 2 and the
/// high ones into 1 and 3, when each block's 16 bytes are loaded twice (`load_dup16x2`).
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
    let q = unsafe { u.load_dup16x2(a, b) };
    u.and(u.srlv16(q, u.bytes(NIBBLE_SHIFT)), u.splat8(0x0f))
}

/// Q8_0: `{f16 d; i8 q[32]}`.
pub(in crate::ggml::vecdot) struct Q8_0;

impl Groups32 for Q8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    block_pairs!(34);
}

impl Q8_0 {
    /// Blocks `b0` and `b1` as one pair.
    ///
    /// # Safety
    /// `U` runs on this CPU.
    #[inline(always)]
    unsafe fn decode<U: Vnni>(u: U, b0: &[u8; 34], b1: &[u8; 34]) -> Pair<U> {
        // SAFETY: each block's values are its bytes 2..34.
        let w = unsafe { u.load_2x32(b0.as_ptr().add(2), b1.as_ptr().add(2)) };
        (w, u.f2x8(f16_at(u, b0, 0), f16_at(u, b1, 0)), [0.0; 2])
    }
}

/// Q4_0: `{f16 d; u8 qs[16]}`, value `d · (q - 8)`, low nibbles first.
pub(in crate::ggml::vecdot) struct Q4_0;

impl Groups32 for Q4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    block_pairs!(18);
}

impl Q4_0 {
    /// Blocks `b0` and `b1` as one pair.
    ///
    /// # Safety
    /// `U` runs on this CPU.
    #[inline(always)]
    unsafe fn decode<U: Vnni>(u: U, b0: &[u8; 18], b1: &[u8; 18]) -> Pair<U> {
        // SAFETY: each block's nibbles are its bytes 2..18.
        let q = unsafe { nibbles(u, b0.as_ptr().add(2), b1.as_ptr().add(2)) };
        let ws = u.f2x8(f16_at(u, b0, 0), f16_at(u, b1, 0));
        (u.sub8(q, u.splat8(8)), ws, [0.0; 2])
    }
}

/// Q5_0: `{f16 d; u32 qh; u8 qs[16]}`, value `d · (q - 16)`, bit `j` of `qh` the fifth
/// bit of value `j`.
pub(in crate::ggml::vecdot) struct Q5_0;

impl Groups32 for Q5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    block_pairs!(22);
}

impl Q5_0 {
    /// Blocks `b0` and `b1` as one pair.
    ///
    /// # Safety
    /// `U` runs on this CPU.
    #[inline(always)]
    unsafe fn decode<U: Vnni>(u: U, b0: &[u8; 22], b1: &[u8; 22]) -> Pair<U> {
        let qh = |b: &[u8; 22]| u64::from(u32::from_le_bytes([b[2], b[3], b[4], b[5]]));
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
    block_pairs!(20);
}

impl Q4_1 {
    /// Blocks `b0` and `b1` as one pair.
    ///
    /// # Safety
    /// `U` runs on this CPU.
    #[inline(always)]
    unsafe fn decode<U: Vnni>(u: U, b0: &[u8; 20], b1: &[u8; 20]) -> Pair<U> {
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
    block_pairs!(24);
}

impl Q5_1 {
    /// Blocks `b0` and `b1` as one pair.
    ///
    /// # Safety
    /// `U` runs on this CPU.
    #[inline(always)]
    unsafe fn decode<U: Vnni>(u: U, b0: &[u8; 24], b1: &[u8; 24]) -> Pair<U> {
        let qh = |b: &[u8; 24]| u64::from(u32::from_le_bytes([b[4], b[5], b[6], b[7]]));
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
    block_pairs!(18);
}

impl IQ4NL {
    /// Blocks `b0` and `b1` as one pair.
    ///
    /// # Safety
    /// `U` runs on this CPU.
    #[inline(always)]
    unsafe fn decode<U: Vnni>(u: U, b0: &[u8; 18], b1: &[u8; 18]) -> Pair<U> {
        // SAFETY: each block's nibbles are its bytes 2..18.
        let q = unsafe { nibbles(u, b0.as_ptr().add(2), b1.as_ptr().add(2)) };
        let ws = u.f2x8(f16_at(u, b0, 0), f16_at(u, b1, 0));
        (u.shufb(u.bytes(IQ4_TABLE), q), ws, [0.0; 2])
    }
}

/// IQ4_XS: `{f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]}` per 256 values; sub-block
/// `s` of 32 has the 6-bit scale `ls` (low 4 bits in nibble `s % 2` of `scales_l[s / 2]`,
/// high 2 bits at bit `2 s` of `scales_h`), value `d · (ls - 32) · grid[q]`, its nibbles
/// in `qs[16 s .. 16 s + 16]`, low nibbles first.
pub(in crate::ggml::vecdot) struct IQ4XS;

impl Groups32 for IQ4XS {
    const TYPE: GgmlType = GgmlType::IQ4_XS;
    #[inline(always)]
    unsafe fn pairs<U: Vnni>(u: U, row: &[u8], sink: &mut impl PairSink<U>) {
        let table = u.bytes(IQ4_TABLE);
        for (i, b) in row.as_chunks::<136>().0.iter().enumerate() {
            let d = f16_at(u, b, 0);
            let high = u16::from_le_bytes([b[2], b[3]]);
            let scale: [f32; 8] = std::array::from_fn(|s| {
                let low = (b[4 + s / 2] >> (4 * (s % 2))) & 0x0f;
                let ls = i32::from(low) | i32::from((high >> (2 * s)) & 3) << 4;
                d * (ls - 32) as f32
            });
            for p in 0..4 {
                // SAFETY: the pair's 32 nibble bytes are bytes 8 + 32 p .. 40 + 32 p.
                let q =
                    unsafe { nibbles(u, b.as_ptr().add(8 + 32 * p), b.as_ptr().add(24 + 32 * p)) };
                let ws = u.f2x8(scale[2 * p], scale[2 * p + 1]);
                sink.pair((u.shufb(table, q), ws, [0.0; 2]), 8 * i + 2 * p, true);
            }
        }
    }
}
