//! The VNNI row-dot kernels, written once against the instruction trait [`Vnni`] and run on
//! the CPU's AVX-512 unit ([`Avx512Vnni`]) or, in tests, on its AVX-VNNI unit
//! ([`crate::vnni_unit::AvxVnni`], 256-bit halves) and on the software unit
//! ([`crate::vnni_unit::Soft`]), which every machine can run.
//!
//! Against the AVX2 kernels: 64 values per instruction instead of 32, and the products reach
//! i32 in one `vpdpbusd`, where AVX2 needs `vpmaddubsw`, `vpmaddwd` and an add; k-quants'
//! sums then meet their integer sub-scales two registers at a time in one `vpdpwssd`.
//!
//! A key design decision: the kernels lay their values out to match the activations as
//! they lie (one 64-byte load per token per 64 values), decoding the weights into that
//! order once per row, since a row's decode is shared by up to four tokens and a token's
//! load is not. Where the weights' own order saves operations on every block (Q4_K and
//! Q5_K's nibbles) the activations are quantized in it instead ([`RowKernel::LAYOUT`]):
//! that reorder is paid once per token for all rows.

use std::ops::Range;

use super::{GgmlType, Q8Layout, Q8Rows, Tokens, rows};
#[cfg(target_arch = "x86_64")]
use crate::vnni_unit::Avx512Vnni;
use crate::vnni_unit::Vnni;

mod kquants;
mod low_bits;
mod small;

pub(super) use kquants::{Q4K, Q5K, Q6K};
pub(super) use low_bits::{Q2K, Q3K};
pub(super) use small::{IQ4NL, IQ4XS, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};

/// One weight row of whole blocks against `N` tokens, on unit `U`.
pub(super) trait RowKernel {
    /// The block type it computes.
    const TYPE: GgmlType;

    /// The order it reads its activations' values in.
    const LAYOUT: Q8Layout = Q8Layout::Natural;

    /// `out[j] = row · x_j` for the `N` tokens of `xt`.
    ///
    /// # Safety
    /// `U` runs on this CPU with the kernel compiled for it (inlined into a function that
    /// enables its features); `row` is whole blocks matching the rows of `xt`.
    unsafe fn row<U: Vnni, const N: usize>(u: U, row: &[u8], xt: &Tokens<N>, out: &mut [f32; N]);
}

/// The VNNI kernels' loads of the activations.
impl<const N: usize> Tokens<'_, N> {
    /// Token `j`'s 64 values from position `p`.
    ///
    /// # Safety
    /// `p + 64 <= k`.
    #[inline(always)]
    unsafe fn load_x<U: Vnni>(&self, u: U, j: usize, p: usize) -> U::I {
        // SAFETY: the caller keeps `p + 64` within the row of `k` values.
        unsafe { u.load(self.q[j].as_ptr().add(p).cast()) }
    }

    /// Token `j`'s 32 values from position `p` in the low half, zeros above.
    ///
    /// # Safety
    /// `p + 32 <= k`.
    #[inline(always)]
    unsafe fn load_x_low32<U: Vnni>(&self, u: U, j: usize, p: usize) -> U::I {
        // SAFETY: the caller keeps `p + 32` within the row of `k` values.
        unsafe { u.load_low32(self.q[j].as_ptr().add(p).cast()) }
    }

    /// Token `j`'s sums per 16 (`s · Σ q`) over the 256-value block `i`.
    ///
    /// # Safety
    /// `256 (i + 1) <= k`.
    #[inline(always)]
    unsafe fn load_sums<U: Vnni>(&self, u: U, j: usize, i: usize) -> U::F {
        // SAFETY: a row has `k / 16` sums and block `i` has 16 of them.
        unsafe { u.loadf(self.sums[j].as_ptr().add(16 * i)) }
    }

    /// Token `j`'s integer sums per 16 over the 256-value blocks `i` and `i + 1`: 32 i16
    /// lanes.
    ///
    /// # Safety
    /// `256 (i + 2) <= k`.
    #[inline(always)]
    unsafe fn load_isums2<U: Vnni>(&self, u: U, j: usize, i: usize) -> U::I {
        // SAFETY: a row has `k / 16` sums and blocks `i`, `i + 1` have 32 of them (64 bytes).
        unsafe { u.load(self.isums[j].as_ptr().add(16 * i).cast()) }
    }

    /// Token `j`'s integer sums per 16 over the 256-value block `i`: 16 i16 lanes, zeros
    /// above.
    ///
    /// # Safety
    /// `256 (i + 1) <= k`.
    #[inline(always)]
    unsafe fn load_isums<U: Vnni>(&self, u: U, j: usize, i: usize) -> U::I {
        // SAFETY: a row has `k / 16` sums and block `i` has 16 of them (32 bytes).
        unsafe { u.load_low32(self.isums[j].as_ptr().add(16 * i).cast()) }
    }
}

/// The f16 at byte `i` of `b`, as f32.
#[inline(always)]
fn f16_at<U: Vnni>(u: U, b: &[u8], i: usize) -> f32 {
    u.f16(u16::from_le_bytes([b[i], b[i + 1]]))
}

/// Checks that the rows, the activations and the token range agree (the kernels' loads
/// rely on it); returns the bytes per row.
fn check<K: RowKernel>(
    src: &[u8],
    n_rows: usize,
    a: &Q8Rows,
    tokens: &Range<usize>,
    tile: &[f32],
) -> usize {
    let rb = src.len() / n_rows.max(1);
    assert!(
        rb * n_rows == src.len()
            && rb.is_multiple_of(K::TYPE.block_bytes())
            && rb / K::TYPE.block_bytes() * K::TYPE.block_size() == a.k
            && a.block() == super::activation_block(K::TYPE)
            && a.layout() == K::LAYOUT
            && tokens.end <= a.rows()
            && tile.len() == tokens.len() * n_rows,
        "{n_rows} rows of {rb} bytes against {} activations of {} per {} ({:?}), tokens \
         {tokens:?}, tile {}",
        a.rows(),
        a.k,
        a.block(),
        a.layout(),
        tile.len()
    );
    rb
}

/// Every row of `src` against the tokens, four at a time: tokens are the outer loop, so
/// four tokens' activations stay in L1 while the rows pass by. Token `j`'s result for row
/// `r` goes to `tile[(t - tokens.start) · rows + r]`.
///
/// # Safety
/// As [`RowKernel::row`]; `rb` and the lengths passed [`check`].
#[inline(always)]
unsafe fn all_rows<U: Vnni, K: RowKernel>(
    u: U,
    src: &[u8],
    rb: usize,
    a: &Q8Rows,
    tokens: Range<usize>,
    tile: &mut [f32],
) {
    #[inline(always)]
    unsafe fn rows_of<U: Vnni, K: RowKernel, const N: usize>(
        u: U,
        src: &[u8],
        rb: usize,
        xt: &Tokens<N>,
        tile: &mut [f32],
    ) {
        let n_rows = src.len() / rb;
        for (r, ahead) in rows(n_rows, rb) {
            // The next row of this run into L1 while this one computes: the hardware
            // prefetchers alone left decode waiting on DRAM.
            if let Some(a) = ahead {
                // By offset, not `chunks(64)`: its last-chunk length cost a compare and a move
                // per line.
                for off in (0..rb).step_by(64) {
                    u.prefetch(src.as_ptr().wrapping_add(a * rb + off));
                }
            }
            let mut o = [0.0f32; N];
            // SAFETY: the caller's guarantees (`rows` yields rows below `n_rows`).
            unsafe { K::row(u, &src[r * rb..(r + 1) * rb], xt, &mut o) };
            for (j, v) in o.iter().enumerate() {
                tile[j * n_rows + r] = *v;
            }
        }
    }
    let n_rows = src.len() / rb;
    for t in tokens.clone().step_by(4) {
        let tile = &mut tile[(t - tokens.start) * n_rows..];
        // SAFETY: the caller's guarantees.
        unsafe {
            match (tokens.end - t).min(4) {
                4 => rows_of::<U, K, 4>(u, src, rb, &Tokens::new(a, t), tile),
                3 => rows_of::<U, K, 3>(u, src, rb, &Tokens::new(a, t), tile),
                2 => rows_of::<U, K, 2>(u, src, rb, &Tokens::new(a, t), tile),
                _ => rows_of::<U, K, 1>(u, src, rb, &Tokens::new(a, t), tile),
            }
        }
    }
}

/// The kernel `K` on the CPU's AVX-512 VNNI (a `super::BlockDot`).
#[cfg(target_arch = "x86_64")]
pub(super) fn on_cpu<K: RowKernel>(
    src: &[u8],
    n_rows: usize,
    a: &Q8Rows,
    tokens: Range<usize>,
    tile: &mut [f32],
) {
    let u = Avx512Vnni::detect().expect("VNNI kernels run only where AVX-512 VNNI was found");
    let rb = check::<K>(src, n_rows, a, &tokens, tile);

    /// # Safety
    /// The CPU has AVX-512 F, BW and VNNI; the lengths passed [`check`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn run<K: RowKernel>(
        u: Avx512Vnni,
        src: &[u8],
        rb: usize,
        a: &Q8Rows,
        tokens: Range<usize>,
        tile: &mut [f32],
    ) {
        // SAFETY: the caller's guarantees; the kernel inlines here, with these features.
        unsafe { all_rows::<_, K>(u, src, rb, a, tokens, tile) }
    }
    // SAFETY: the unit exists, so the CPU has what `run` enables; `check` passed.
    unsafe { run::<K>(u, src, rb, a, tokens, tile) }
}

/// The kernel `K` on the CPU's AVX-VNNI, each value in two 256-bit halves (a
/// `super::BlockDot`; tests only: slower than the AVX2 kernels, see `super::kernel`).
#[cfg(all(test, target_arch = "x86_64"))]
pub(super) fn on_avx_vnni<K: RowKernel>(
    src: &[u8],
    n_rows: usize,
    a: &Q8Rows,
    tokens: Range<usize>,
    tile: &mut [f32],
) {
    use crate::vnni_unit::AvxVnni;
    let u = AvxVnni::detect().expect("AVX-VNNI kernels run only where AVX-VNNI was found");
    let rb = check::<K>(src, n_rows, a, &tokens, tile);

    /// # Safety
    /// The CPU has AVX2, FMA, F16C and AVX-VNNI; the lengths passed [`check`].
    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    unsafe fn run<K: RowKernel>(
        u: AvxVnni,
        src: &[u8],
        rb: usize,
        a: &Q8Rows,
        tokens: Range<usize>,
        tile: &mut [f32],
    ) {
        // SAFETY: the caller's guarantees; the kernel inlines here, with these features.
        unsafe { all_rows::<_, K>(u, src, rb, a, tokens, tile) }
    }
    // SAFETY: the unit exists, so the CPU has what `run` enables; `check` passed.
    unsafe { run::<K>(u, src, rb, a, tokens, tile) }
}

/// The kernel `K` on the software unit (a `super::BlockDot`, for tests on any machine).
#[cfg(test)]
pub(super) fn on_soft<K: RowKernel>(
    src: &[u8],
    n_rows: usize,
    a: &Q8Rows,
    tokens: Range<usize>,
    tile: &mut [f32],
) {
    let rb = check::<K>(src, n_rows, a, &tokens, tile);
    // SAFETY: the software unit runs anywhere; `check` passed.
    unsafe { all_rows::<_, K>(crate::vnni_unit::Soft, src, rb, a, tokens, tile) }
}

#[cfg(test)]
mod tests;
