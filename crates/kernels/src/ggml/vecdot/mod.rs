//! Row-dot kernels that decode ggml blocks in registers: one weight row, read straight from
//! its bytes (usually a mapped file), against up to four tokens' int8 activations at a time.
//!
//! These are the hot path of decode and of small expert batches. The general integer path
//! (`super::unpack` + `super::dot`) writes each decoded row to scratch and reads it back,
//! which costs about twice the dot product itself; here a block's values go from the loaded
//! bytes into `maddubs` directly. Weights in 256-value blocks meet activations quantized per
//! 256 (`super::dot::Q8Rows` with `block` 256): a block's integer sub-scales multiply the
//! integer products (`madd`), its mins and offsets multiply the activations' integer sums per
//! 16, and the sum is converted to f32 once per block, as ggml's `vec_dot_*_q8_K` do.
//! Weights in blocks of 32 carry an f32 scale per block, so they convert per 32.
//!
//! Each kernel's plain twin is the general integer path, which computes the same integer
//! sums; tests compare them on random blocks.

use std::ops::Range;

use crate::Isa;

use super::GgmlType;
use super::dot::{Q8Layout, Q8Rows};

/// `tile[j · n_rows + r] = row_r · x[tokens.start + j]`: `n_rows` rows of whole blocks
/// (`src`, consecutive) against a range of activation rows.
pub(crate) type BlockDot =
    fn(src: &[u8], n_rows: usize, a: &Q8Rows, tokens: Range<usize>, tile: &mut [f32]);

/// An in-register kernel and the order it needs its activations' values in.
#[derive(Clone, Copy)]
pub(crate) struct RowDot {
    pub(crate) dot: BlockDot,
    pub(crate) layout: Q8Layout,
}

/// The order a task's rows are read in: `streams` sequential runs, interleaved row by row,
/// each prefetching into L1 the row `ahead` rows further in its own run (or further, to be
/// at least `ahead_bytes` ahead) while one computes (the hardware prefetchers alone left
/// decode waiting on DRAM). Cores differ in how many streams their prefetchers follow well,
/// so the order is chosen by vendor ([`row_order`]).
#[cfg(any(target_arch = "x86_64", test))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RowOrder {
    streams: usize,
    ahead: usize,
    ahead_bytes: usize,
}

#[cfg(any(target_arch = "x86_64", test))]
impl RowOrder {
    /// This order for rows of `row_bytes`: `ahead` raised to cover `ahead_bytes`.
    fn for_rows_of(self, row_bytes: usize) -> RowOrder {
        RowOrder {
            ahead: self.ahead.max(self.ahead_bytes.div_ceil(row_bytes.max(1))),
            ..self
        }
    }
}

/// Intel's cores: four runs, one row ahead in each. On a 2-core Xeon (Ice Lake-SP,
/// 2026-11-30) one thread summed 10.9 GB/s from one stream and 15.0 from four; the Q4_K
/// kernel at one token, one thread, 128-row tasks from DRAM (`q4_k_row_dot_timing`,
/// alternating builds) read 6.5-8.0 GB/s in one run (4 rows prefetched ahead) and 7.6-9.2 in
/// four (1 row ahead in each; 2 ahead and 8 runs no better). One run, the distance measured
/// best there (`strata bench moe --formats q4_k,q6_k,q8_0 --tokens 1,4 --layers 4`, a 2-core
/// Xeon, 2026-11-27): VNNI kernels 2 rows against none 1.03-1.39x, 4 against 2 0.85-1.20x;
/// AVX2 kernels 4 against none 1.18-1.75x.
#[cfg(any(target_arch = "x86_64", test))]
const ROW_ORDER_INTEL: RowOrder = RowOrder {
    streams: 4,
    ahead: 1,
    ahead_bytes: 0,
};

/// AMD's cores: one run, four rows ahead. On a 2-vCPU Zen 5 EPYC (2026-12-02,
/// docs/benchmarks.md), `strata bench moe --formats q4_k,q6_k,q8_0 --tokens 1,4 --layers 4`,
/// three alternating rounds, ms per layer at one token: Q4_K 0.571-0.680 against 0.713-0.801
/// for Intel's order, Q6_K 0.707-1.075 against 0.976-1.018, Q8_0 1.218-1.314 against
/// 1.473-1.569; the AVX2 kernels alike (Q4_K 0.634-0.644 against 0.888-0.910). Two runs four
/// ahead and one run eight ahead were level with it; eight runs, or four two ahead, behind.
/// At least 8 KiB ahead: four rows of a `down` projection (768 values) are only 1.7 KiB of
/// Q4_K. On another 2-vCPU Zen 5 (2026-12-02, the same command, `STRATA_THREADS=1`, four
/// alternating rounds) one thread read 23.2-24.8 GB/s of Q4_K against 21.4-23.5 without it,
/// Q6_K 24.7-29.9 against 24.7-27.1; two threads level within this host's noise (29-37).
#[cfg(any(target_arch = "x86_64", test))]
const ROW_ORDER_AMD: RowOrder = RowOrder {
    streams: 1,
    ahead: 4,
    ahead_bytes: 8192,
};

/// The row order of this CPU's vendor, or `STRATA_ROW_ORDER=STREAMS,AHEAD[,BYTES]`
/// (benchmarks; `BYTES` the least distance ahead, 0 if not given; a value that is not two or
/// three numbers, the first at least 1, is ignored with a warning). Read once.
#[cfg(target_arch = "x86_64")]
fn row_order() -> RowOrder {
    static ORDER: std::sync::OnceLock<RowOrder> = std::sync::OnceLock::new();
    *ORDER.get_or_init(|| {
        let by_vendor = if crate::isa::is_amd() {
            ROW_ORDER_AMD
        } else {
            ROW_ORDER_INTEL
        };
        let Ok(v) = std::env::var("STRATA_ROW_ORDER") else {
            return by_vendor;
        };
        match parse_row_order(&v) {
            Some(order) => order,
            None => {
                eprintln!(
                    "warning: STRATA_ROW_ORDER={v:?} ignored (expected STREAMS,AHEAD[,BYTES], \
                     e.g. 4,1 or 1,4,8192); using {},{},{}",
                    by_vendor.streams, by_vendor.ahead, by_vendor.ahead_bytes
                );
                by_vendor
            }
        }
    })
}

/// `STREAMS,AHEAD[,BYTES]` with at least one stream.
#[cfg(any(target_arch = "x86_64", test))]
fn parse_row_order(v: &str) -> Option<RowOrder> {
    let numbers: Vec<usize> = v
        .split(',')
        .map(|n| n.trim().parse().ok())
        .collect::<Option<_>>()?;
    match numbers[..] {
        [streams, ahead] | [streams, ahead, _] if streams >= 1 => Some(RowOrder {
            streams,
            ahead,
            ahead_bytes: numbers.get(2).copied().unwrap_or(0),
        }),
        _ => None,
    }
}

/// The rows of a task of `n` rows of `row_bytes` in the order the row-dot kernels compute
/// them ([`row_order`]), each with the row to prefetch while it computes, if any.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn rows(n: usize, row_bytes: usize) -> Rows {
    Rows::new(row_order().for_rows_of(row_bytes), n)
}

/// The rows of a task in a [`RowOrder`]: `(row, ahead)`. A plain iterator, so that the
/// kernels' loop bodies lie in their own functions: a closure's body is a function of its
/// own, without the kernels' target features, and when large it was compiled apart, calling
/// every instruction (a 512-token prefill 15% slower); as a `flat_map` its state machine was
/// 2% of a decoded token's samples.
#[cfg(any(target_arch = "x86_64", test))]
struct Rows {
    order: RowOrder,
    n: usize,
    /// Rows per run.
    per: usize,
    /// The next row's place in its run, and its run.
    i: usize,
    s: usize,
}

#[cfg(any(target_arch = "x86_64", test))]
impl Rows {
    fn new(order: RowOrder, n: usize) -> Rows {
        Rows {
            order,
            n,
            per: n.div_ceil(order.streams),
            i: 0,
            s: 0,
        }
    }
}

#[cfg(any(target_arch = "x86_64", test))]
impl Iterator for Rows {
    type Item = (usize, Option<usize>);

    #[inline(always)]
    fn next(&mut self) -> Option<(usize, Option<usize>)> {
        while self.i < self.per {
            let (i, s) = (self.i, self.s);
            if s + 1 == self.order.streams {
                (self.i, self.s) = (i + 1, 0);
            } else {
                self.s = s + 1;
            }
            let (r, end) = (s * self.per + i, ((s + 1) * self.per).min(self.n));
            if r < end {
                let ahead = r + self.order.ahead;
                return Some((r, (ahead > r && ahead < end).then_some(ahead)));
            }
        }
        None
    }
}

/// Up to four tokens' activation rows, resolved once for all rows of a task: int8 values,
/// scales per 32, and per 16 `s · Σ q` and `Σ q`, of tokens `t .. t + N`. The AVX2 and
/// VNNI kernels each add their loads.
#[cfg(any(target_arch = "x86_64", test))]
pub(crate) struct Tokens<'a, const N: usize> {
    pub(crate) q: [&'a [i8]; N],
    pub(crate) s: [&'a [f32]; N],
    pub(crate) sums: [&'a [f32]; N],
    pub(crate) isums: [&'a [i16]; N],
}

#[cfg(any(target_arch = "x86_64", test))]
impl<'a, const N: usize> Tokens<'a, N> {
    fn new(a: &'a Q8Rows, t: usize) -> Self {
        Self {
            q: std::array::from_fn(|j| a.q(t + j)),
            s: std::array::from_fn(|j| a.s(t + j)),
            sums: std::array::from_fn(|j| a.sums(t + j)),
            isums: std::array::from_fn(|j| a.isums(t + j)),
        }
    }
}

/// Values per activation scale for weights of `ty` on every path: 256 for the k-quants with
/// in-register kernels (their integer sub-scales need one activation scale per block), 32
/// for the rest (finer rounding; their scales are applied per 16 or 32 in f32 anyway).
pub(crate) fn activation_block(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => 256,
        _ => 32,
    }
}

/// The VNNI kernel of `$ty` run by `vnni::$on` (`on_cpu`, `on_avx_vnni` or, in tests,
/// `on_soft`), with its activations' layout.
macro_rules! vnni_kernel {
    ($ty:expr, $on:ident) => {{
        use crate::ggml::vecdot::{RowDot, vnni};
        use vnni::RowKernel as _;
        macro_rules! row_dot {
            ($k:ty) => {
                Some(RowDot {
                    dot: vnni::$on::<$k>,
                    layout: <$k>::LAYOUT,
                })
            };
        }
        match $ty {
            GgmlType::Q2_K => row_dot!(vnni::Q2K),
            GgmlType::Q3_K => row_dot!(vnni::Q3K),
            GgmlType::Q4_K => row_dot!(vnni::Q4K),
            GgmlType::Q5_K => row_dot!(vnni::Q5K),
            GgmlType::Q6_K => row_dot!(vnni::Q6K),
            GgmlType::Q8_0 => row_dot!(vnni::Q8_0),
            GgmlType::Q4_0 => row_dot!(vnni::Q4_0),
            GgmlType::Q5_0 => row_dot!(vnni::Q5_0),
            GgmlType::Q4_1 => row_dot!(vnni::Q4_1),
            GgmlType::Q5_1 => row_dot!(vnni::Q5_1),
            GgmlType::IQ4_NL => row_dot!(vnni::IQ4NL),
            GgmlType::IQ4_XS => row_dot!(vnni::IQ4XS),
            _ => None,
        }
    }};
}

/// The in-register kernel for `ty` on `isa`, if there is one: the VNNI kernel on AVX-512
/// where `ty` has one, else the AVX2 kernel. Its activations are quantized in its layout.
///
/// AVX-VNNI CPUs keep the AVX2 kernels: the VNNI kernels on 256-bit halves
/// (`vnni::on_avx_vnni`, checked in tests) measured 0.6-1.3x them at 1, 4 and 32 tokens per
/// expert on a Xeon's AVX-VNNI (2026-11-29, docs/benchmarks.md; 2.2-3x slower for Q2_K,
/// Q3_K and Q5_K, whose word permutes and variable shifts take several AVX2 instructions).
pub(crate) fn kernel(isa: Isa, ty: GgmlType) -> Option<RowDot> {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512
        && let Some(dot) = vnni_kernel!(ty, on_cpu)
    {
        return Some(dot);
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        let dot: Option<BlockDot> = match ty {
            GgmlType::Q2_K => Some(avx2::q2_k),
            GgmlType::Q3_K => Some(avx2::q3_k),
            GgmlType::Q4_K => Some(avx2::q4_k),
            GgmlType::Q5_K => Some(avx2::q5_k),
            GgmlType::Q6_K => Some(avx2::q6_k),
            GgmlType::Q8_0 => Some(avx2::q8_0),
            GgmlType::Q4_0 => Some(avx2::q4_0),
            GgmlType::Q4_1 => Some(avx2::q4_1),
            GgmlType::Q5_0 => Some(avx2::q5_0),
            GgmlType::Q5_1 => Some(avx2::q5_1),
            GgmlType::IQ4_NL => Some(avx2::iq4_nl),
            GgmlType::IQ4_XS => Some(avx2::iq4_xs),
            _ => None,
        };
        return dot.map(|dot| RowDot {
            dot,
            layout: Q8Layout::Natural,
        });
    }
    let _ = (isa, ty);
    None
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(any(target_arch = "x86_64", test))]
mod vnni;

/// Every type with in-register kernels (AVX2 and VNNI alike), for the tests.
#[cfg(test)]
const IN_REGISTER_TYPES: [GgmlType; 12] = [
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml::GgmlMatrix;
    use crate::ggml::test_util::{dot_tolerances, random_blocks};

    /// Every row once, in interleaved runs, each prefetching a later row of its own run, in
    /// both vendors' orders and others.
    #[test]
    fn rows_are_visited_once_each() {
        let orders = [
            ROW_ORDER_INTEL,
            ROW_ORDER_AMD,
            RowOrder {
                streams: 3,
                ahead: 0,
                ahead_bytes: 0,
            },
            ROW_ORDER_AMD.for_rows_of(432),
        ];
        for order in orders {
            for n in [0, 1, 3, 4, 5, 7, 128, 130] {
                let seen: Vec<(usize, Option<usize>)> = Rows::new(order, n).collect();
                let mut rows: Vec<usize> = seen.iter().map(|&(r, _)| r).collect();
                rows.sort_unstable();
                assert_eq!(rows, (0..n).collect::<Vec<_>>(), "{order:?} n {n}");
                let per = n.div_ceil(order.streams);
                for &(r, ahead) in &seen {
                    if let Some(a) = ahead {
                        assert_eq!((a, a / per), (r + order.ahead, r / per), "{order:?} n {n}");
                    }
                }
                // Every row but the last `ahead` of each run has its prefetch.
                let prefetched = seen.iter().filter(|(_, a)| a.is_some()).count();
                let runs = (0..order.streams).filter(|s| s * per < n).count();
                let expected = if order.ahead == 0 {
                    0
                } else {
                    (0..runs)
                        .map(|s| (((s + 1) * per).min(n) - s * per).saturating_sub(order.ahead))
                        .sum()
                };
                assert_eq!(prefetched, expected, "{order:?} n {n}");
            }
        }
        let order = |o, n| Rows::new(o, n).map(|(r, _)| r).collect::<Vec<_>>();
        assert_eq!(order(ROW_ORDER_INTEL, 8), [0, 2, 4, 6, 1, 3, 5, 7]);
        assert_eq!(order(ROW_ORDER_AMD, 5), [0, 1, 2, 3, 4]);
    }

    /// Short rows are prefetched further ahead in rows, to stay `ahead_bytes` ahead.
    #[test]
    fn prefetch_distance_covers_the_bytes() {
        let ahead = |rb| ROW_ORDER_AMD.for_rows_of(rb).ahead;
        // A Q4_K `down` row (768 values), a `gate` row (2,048), a row longer than 8 KiB.
        assert_eq!((ahead(432), ahead(1152), ahead(10_000)), (19, 8, 4));
        assert_eq!(ROW_ORDER_INTEL.for_rows_of(432), ROW_ORDER_INTEL);
    }

    #[test]
    fn row_order_overrides_parse() {
        assert_eq!(
            parse_row_order("2, 6"),
            Some(RowOrder {
                streams: 2,
                ahead: 6,
                ahead_bytes: 0,
            })
        );
        assert_eq!(
            parse_row_order("1,4,8192"),
            Some(RowOrder {
                streams: 1,
                ahead: 4,
                ahead_bytes: 8192,
            })
        );
        for bad in ["", "4", "0,1", "a,1", "4,-1", "4,1,2,3", "4,1,x"] {
            assert_eq!(parse_row_order(bad), None, "{bad:?}");
        }
    }

    /// Each in-register kernel against the general integer path (the same integer sums),
    /// on random blocks, 1 to 7 tokens.
    #[test]
    fn in_register_kernels_match_the_unpacked_path() {
        if !Isa::available().contains(&Isa::Avx2) {
            eprintln!("NOT CHECKED: this CPU has no AVX2, so the in-register kernels cannot run");
        }
        let mut seed = 5;
        for ty in IN_REGISTER_TYPES {
            for isa in Isa::available() {
                let Some(RowDot { dot, layout }) = kernel(isa, ty) else {
                    if isa >= Isa::Avx2 {
                        panic!("{ty} has no in-register kernel on {isa:?}");
                    }
                    // The portable path has none: its matmul is the reference here.
                    continue;
                };
                let (n, k) = (3, 512);
                let bytes = random_blocks(ty, n * k / ty.block_size(), &mut seed);
                let w = GgmlMatrix::from_vec(ty, n, k, bytes).expect("valid matrix");
                for m in 1..=7 {
                    let x: Vec<f32> = (0..m * k)
                        .map(|i| ((i * 7919 + m) % 2001) as f32 / 1000.0 - 1.0)
                        .collect();
                    let mut want = vec![0.0f32; m * n];
                    w.matmul_with(Isa::Portable, &x, m, &mut want)
                        .expect("shapes");
                    let a = Q8Rows::quantize(k, activation_block(ty), layout, m, |r| {
                        &x[r * k..(r + 1) * k]
                    });
                    let mut got = vec![f32::NAN; m * n];
                    dot(w.bytes(), n, &a, 0..m, &mut got);
                    let tols = dot_tolerances(&w, &x, m, &want);
                    for (i, (g, wv)) in got.iter().zip(&want).enumerate() {
                        let tol = tols[i];
                        assert!(
                            (g - wv).abs() <= tol,
                            "{ty} {isa:?} m {m} at {i}: {g} vs {wv}"
                        );
                    }
                }
            }
        }
    }
}
