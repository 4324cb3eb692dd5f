//! Micro-kernels over packed panels: one module per instruction set, one entry point.
//!
//! [`run_block`] computes `out[rows, strips] += x[rows, :] · W[strips, :]ᵀ` for a block of token
//! rows and output strips, walking `k` in blocks sized so the weight panel (the block's strips
//! over one `k` block) stays in L2 while every row of the block streams over it. Integer
//! formats accumulate exactly in i32 and flush to f32 once per scale group (or once per `k`
//! block for per-row scales), subtracting the stored weight offset times the activation sum.
//!
//! The per-row helpers around the matmuls live here too: activation conversion to BF16
//! ([`to_bf16`]) or int8 ([`quantize_i8`]), the gated activation ([`silu_mul`]) and the
//! weighted combine ([`axpy`]). They are
//! plain loops compiled twice, once with AVX-512 enabled so that they vectorise, each with a
//! reference twin in the tests.
//!
//! A key design decision: all paths take the same arguments and read the same packed bytes,
//! so a path is chosen per call (AMX for many rows, AVX-512 for few; AVX2 on CPUs without
//! AVX-512) without repacking.
//!
//! The AMX tile program runs on the hardware, or, in test builds, on a software model of the
//! tiles (`Kernel::AmxSoft`, `amx_soft`), and the AVX-512 INT8/INT4 register tiles on the
//! CPU's VNNI unit or the software one (`Kernel::VnniSoft`), so that both are tested on every
//! x86-64 machine.

use std::ops::Range;

use crate::isa::Isa;
use crate::packed::{Activations, Kind, PackedMatrix, STRIP};

#[cfg(any(target_arch = "x86_64", test))]
mod amx;
#[cfg(target_arch = "x86_64")]
mod amx_hw;
#[cfg(test)]
mod amx_soft;
#[cfg(test)]
mod amx_tests;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod portable;
mod quantize;

pub(crate) use quantize::{quantize_i8, quantize_i8_groups};

/// Strips (of 16 columns) per parallel task: 64 output columns.
pub(crate) const N_BLOCK_STRIPS: usize = 4;
/// Token rows per parallel task; a multiple of the AMX block height (32).
pub(crate) const M_CHUNK: usize = 256;
/// Weight panel size for AMX: kept in L2 (a quarter of Sapphire Rapids' 2 MiB), so tile
/// accumulators are stored only once per long `k` run.
const PANEL_BYTES_AMX: usize = 512 * 1024;
/// Weight panel size for AVX-512, AVX2 and portable code: kept in L1 (48 KiB and up), since every
/// 4-row register tile rereads the whole panel. Chosen from the cache sizes: an A/B against
/// 256 KiB on `bench moe --tokens 512` was within the shared host's noise (0.12-0.24 TFLOPS
/// for both, 2026-11-21).
const PANEL_BYTES_VEC: usize = 32 * 1024;

/// What runs a block: an instruction-set path of this CPU or, in tests, the AMX tile program on
/// the software tile unit, which any CPU can run (slowly: it is a scalar model).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// An instruction-set path the CPU has (AMX: the tile program on the hardware).
    Isa(Isa),
    /// The AMX tile program on the software tile unit (`amx_soft`).
    #[cfg(test)]
    AmxSoft,
    /// The AVX-512 INT8 and INT4 register tiles on the software VNNI unit (BF16 weights
    /// run the portable kernel: the unit has no BF16 dot product).
    #[cfg(test)]
    VnniSoft,
    /// The AVX-512 path with BF16 weights on f32 FMA, as CPUs without AVX-512 BF16 and Intel's
    /// cores run it.
    #[cfg(test)]
    Avx512Fma,
    /// The AVX-512 path with BF16 weights on `vdpbf16ps`, as AMD's cores run it (needs AVX-512
    /// BF16).
    #[cfg(test)]
    Avx512Dpbf16,
}

impl Kernel {
    /// Whether blocks run as AMX tile programs, which read the activations in whole 32-row
    /// blocks (see [`Activations::m_pad`]).
    pub(crate) fn uses_tiles(self) -> bool {
        match self {
            Kernel::Isa(isa) => isa == Isa::Amx,
            #[cfg(test)]
            Kernel::AmxSoft => true,
            #[cfg(test)]
            Kernel::VnniSoft | Kernel::Avx512Fma | Kernel::Avx512Dpbf16 => false,
        }
    }

    /// Whether this machine can run it.
    pub(crate) fn is_available(self) -> bool {
        match self {
            Kernel::Isa(isa) => isa.is_available(),
            #[cfg(test)]
            Kernel::AmxSoft | Kernel::VnniSoft => true,
            #[cfg(test)]
            Kernel::Avx512Fma => Isa::Avx512.is_available(),
            #[cfg(test)]
            Kernel::Avx512Dpbf16 => Isa::Avx512.is_available() && crate::isa::has_avx512_bf16(),
        }
    }
}

/// Fewest activation rows for which INT8/INT4 blocks run the VNNI register tiles on
/// AVX-VNNI; fewer take the AVX2 kernels, whose decode tile (one token, four strips) reads
/// the weights faster. `strata bench moe --formats int8,int4 --tokens 1,4,128,512,2048`,
/// `STRATA_KERNEL=avxvnni` against `avx2` on a Xeon's AVX-VNNI (2026-11-29,
/// docs/benchmarks.md): at 1 and 4 tokens per expert 0.79-0.96x the AVX2 kernels, at 8
/// 1.25-1.57x, at 32 and 128 1.42-1.98x. Between 4 and 8 not measured.
const AVX_VNNI_MIN_ROWS: usize = 8;

/// Weight offset of the unsigned storage (see the `packed` module docs).
pub(crate) fn offset(kind: Kind) -> i32 {
    match kind {
        Kind::Bf16 => 0,
        Kind::Int8 => 128,
        Kind::Int4 => 8,
    }
}

/// Accumulates `x[rows] · W[strips]ᵀ` into `out` (`[rows.len(), ldo]`, strip `s` at column
/// `(s - strips.start) * 16`) on `kernel` (an instruction-set path must be available).
///
/// `strips` must start at an even strip and hold an even count; `rows` must lie within the
/// activations' padded rows (`Activations::m_pad`, a multiple of 32 for tile programs: convert
/// the activations for the same kernel).
pub(crate) fn run_block(
    kernel: Kernel,
    w: &PackedMatrix,
    a: &Activations,
    rows: Range<usize>,
    strips: Range<usize>,
    out: &mut [f32],
    ldo: usize,
) {
    if rows.is_empty() || strips.is_empty() {
        return;
    }
    assert!(
        strips.start.is_multiple_of(2)
            && strips.len().is_multiple_of(2)
            && strips.end <= w.strips(),
        "strip block {strips:?} of {} strips",
        w.strips()
    );
    assert!(rows.end <= a.m_pad && a.k_pad == w.k_pad);
    // Each flush (at most a weight group) must lie within one activation scale.
    assert!(
        w.kind == Kind::Bf16 || w.group <= a.scale_group,
        "activation scales per {} k, weight scales per {}",
        a.scale_group,
        w.group
    );
    assert!(
        ldo >= strips.len() * STRIP && out.len() >= (rows.len() - 1) * ldo + strips.len() * STRIP
    );
    debug_assert!(kernel.is_available());
    let unit = match w.kind {
        Kind::Bf16 => 32,
        _ if w.group < w.k_pad => w.group,
        _ => 64,
    };
    let bytes_per_k = w.strip_bytes * strips.len() / w.k_pad;
    let panel = if kernel.uses_tiles() {
        PANEL_BYTES_AMX
    } else {
        PANEL_BYTES_VEC
    };
    let kb = (panel / bytes_per_k.max(1) / unit).max(1) * unit;
    let mut k0 = 0;
    while k0 < w.k_pad {
        let ks = k0..(k0 + kb).min(w.k_pad);
        let (rows, strips) = (rows.clone(), strips.clone());
        let whole = rows.start.is_multiple_of(32);
        match kernel {
            #[cfg(target_arch = "x86_64")]
            Kernel::Isa(Isa::Amx) if whole => {
                let mut tiles = amx_hw::HwTiles::new();
                amx::block(&mut tiles, w, a, rows, strips, ks.clone(), out, ldo);
            }
            #[cfg(test)]
            Kernel::AmxSoft if whole => {
                let mut tiles = amx_soft::SoftTiles::new();
                amx::block(&mut tiles, w, a, rows, strips, ks.clone(), out, ldo);
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Isa(Isa::Amx | Isa::Avx512) => {
                avx512::block(w, a, rows, strips, ks.clone(), out, ldo)
            }
            #[cfg(all(test, target_arch = "x86_64"))]
            Kernel::Avx512Fma | Kernel::Avx512Dpbf16 => {
                let dpbf16 = kernel == Kernel::Avx512Dpbf16;
                avx512::block_bf16_on(dpbf16, w, a, rows, strips, ks.clone(), out, ldo)
            }
            #[cfg(all(test, target_arch = "x86_64"))]
            Kernel::VnniSoft if w.kind != Kind::Bf16 => {
                avx512::block_soft(w, a, rows, strips, ks.clone(), out, ldo)
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Isa(Isa::AvxVnni)
                if w.kind != Kind::Bf16 && rows.len() >= AVX_VNNI_MIN_ROWS =>
            {
                avx512::block_avx_vnni(w, a, rows, strips, ks.clone(), out, ldo)
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Isa(Isa::Avx2 | Isa::AvxVnni) => {
                avx2::block(w, a, rows, strips, ks.clone(), out, ldo)
            }
            _ => portable::block(w, a, rows, strips, ks.clone(), out, ldo),
        }
        k0 = ks.end;
    }
}

/// `k` per integer flush within `ks`: the scale group, or the whole block for per-row scales.
pub(crate) fn flush_span(w: &PackedMatrix, ks: &Range<usize>) -> usize {
    w.group.min(ks.len())
}

/// `offset · Σ x` over `k` in `f0 .. f0 + span` for row `r`.
#[inline(always)]
pub(crate) fn correction(
    w: &PackedMatrix,
    a: &Activations,
    r: usize,
    f0: usize,
    span: usize,
) -> i32 {
    let units = a.k_pad / a.xsum_unit;
    let u0 = r * units + f0 / a.xsum_unit;
    let s: i32 = a.xsum[u0..u0 + span / a.xsum_unit].iter().sum();
    w.offset * s
}

/// `f32` to BF16 bits, rounding to nearest even; NaN stays NaN (quiet bit set). Bit-identical
/// to `half::bf16::from_f32`, written without branches so that loops over it vectorise.
#[inline(always)]
pub(crate) fn bf16_bits(v: f32) -> u16 {
    let b = v.to_bits();
    let rounded = ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    if b & 0x7fff_ffff > 0x7f80_0000 {
        ((b >> 16) | 0x40) as u16
    } else {
        rounded
    }
}

#[inline(always)]
fn to_bf16_body(src: &[f32], dst: &mut [u16]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = bf16_bits(*s);
    }
}

/// # Safety
/// AVX-512 F/BW must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn to_bf16_avx512(src: &[f32], dst: &mut [u16]) {
    to_bf16_body(src, dst);
}

/// Writes `src` as BF16 (round to nearest even) into the first `src.len()` values of `dst`.
pub(crate) fn to_bf16(src: &[f32], dst: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    if Isa::selected() >= Isa::Avx512 {
        // SAFETY: AVX-512 F/BW were detected.
        return unsafe { to_bf16_avx512(src, dst) };
    }
    to_bf16_body(src, dst);
}

/// Plain reference for [`to_bf16`].
#[cfg(test)]
fn to_bf16_ref(src: &[f32], dst: &mut [u16]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = half::bf16::from_f32(*s).to_bits();
    }
}

/// `e^x` for `x` in about `[-87, 88]` (clamped outside), relative error below 2e-7: a
/// polynomial on the reduced argument, branch-free so that loops over it vectorise.
#[inline(always)]
fn exp_approx(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    let n = (x * std::f32::consts::LOG2_E).round_ties_even();
    // ln 2 split in a part exact in f32 and a correction (Cody-Waite).
    let r = (x - n * 0.693_145_75) - n * 1.428_606_8e-6;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (0.166_666_67 + r * (0.041_666_52 + r * (0.008_333_53 + r * 0.001_394_45)))));
    // SAFETY: `n` is an integer in [-126, 127] (from the clamp), representable in i32.
    let n = unsafe { n.to_int_unchecked::<i32>() };
    p * f32::from_bits(((n + 127) as u32) << 23)
}

#[inline(always)]
fn silu_mul_body(g: &[f32], u: &[f32], out: &mut [f32]) {
    for ((o, g), u) in out.iter_mut().zip(g).zip(u) {
        *o = g / (1.0 + exp_approx(-g)) * u;
    }
}

/// # Safety
/// AVX-512 F/BW must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn silu_mul_avx512(g: &[f32], u: &[f32], out: &mut [f32]) {
    silu_mul_body(g, u, out);
}

/// `out[c] = SiLU(g[c]) · u[c]`, the gated activation of an expert's intermediate row.
pub(crate) fn silu_mul(g: &[f32], u: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if Isa::selected() >= Isa::Avx512 {
        // SAFETY: AVX-512 F/BW were detected.
        return unsafe { silu_mul_avx512(g, u, out) };
    }
    silu_mul_body(g, u, out);
}

#[inline(always)]
fn axpy_body(out: &mut [f32], a: f32, x: &[f32]) {
    for (o, x) in out.iter_mut().zip(x) {
        *o += a * x;
    }
}

/// # Safety
/// AVX-512 F must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn axpy_avx512(out: &mut [f32], a: f32, x: &[f32]) {
    axpy_body(out, a, x);
}

/// `out += a · x` (the weighted combine of expert outputs), element by element.
pub(crate) fn axpy(out: &mut [f32], a: f32, x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if Isa::selected() >= Isa::Avx512 {
        // SAFETY: AVX-512 F was detected.
        return unsafe { axpy_avx512(out, a, x) };
    }
    axpy_body(out, a, x);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packed::tests::rand_vec;

    #[test]
    fn several_k_blocks_and_row_tiles_match_reference() {
        // k spans several panels (so tiles prefetch the next block) and the rows several
        // 4-row tiles plus a ragged one.
        let mut seed = 17;
        let (m, n, k) = (9, 64, 1100);
        let x = rand_vec(m * k, &mut seed);
        let w = rand_vec(n * k, &mut seed);
        for fmt in crate::packed::tests::FORMATS {
            let p = PackedMatrix::pack(&w, n, k, fmt).expect("valid format");
            let mut want = vec![0.0; m * n];
            p.matmul_ref(&x, m, &mut want).expect("shapes agree");
            for kernel in crate::packed::tests::kernels() {
                let mut got = vec![f32::NAN; m * n];
                p.matmul_on(kernel, &x, m, &mut got);
                let what = format!("{} {kernel:?}", fmt.name());
                crate::packed::tests::assert_close(&want, &got, &what);
            }
        }
    }

    #[test]
    fn axpy_matches_reference() {
        let mut seed = 2;
        for len in [0usize, 1, 15, 16, 17, 100] {
            let x = rand_vec(len, &mut seed);
            let mut got = rand_vec(len, &mut seed);
            let want: Vec<f32> = got.iter().zip(&x).map(|(o, x)| o + 0.3 * x).collect();
            axpy(&mut got, 0.3, &x);
            assert_eq!(got, want, "length {len}");
        }
    }

    fn specials() -> Vec<f32> {
        let mut v = vec![
            0.0,
            -0.0,
            1.0,
            f32::MAX,
            -f32::MAX,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MIN_POSITIVE / 3.0,
            1.0 + f32::EPSILON * 64.0,
            f32::from_bits(0x3f80_8000),
            f32::from_bits(0x3f81_8000),
        ];
        let mut seed = 4;
        v.extend(rand_vec(301, &mut seed).iter().map(|x| x * 1e3));
        v
    }

    #[test]
    fn bf16_conversion_matches_half() {
        let src = specials();
        let (mut got, mut want) = (vec![0u16; src.len()], vec![0u16; src.len()]);
        to_bf16(&src, &mut got);
        to_bf16_ref(&src, &mut want);
        assert_eq!(got, want);
    }

    #[test]
    fn silu_mul_matches_reference() {
        let mut seed = 12;
        let g: Vec<f32> = rand_vec(500, &mut seed).iter().map(|x| x * 60.0).collect();
        let u = rand_vec(500, &mut seed);
        let mut got = vec![0.0; 500];
        silu_mul(&g, &u, &mut got);
        for ((g, u), o) in g.iter().zip(&u).zip(&got) {
            let want = g / (1.0 + (-g).exp()) * u;
            assert!(
                (want - o).abs() <= 1e-6 * want.abs() + 1e-30,
                "silu({g}) * {u}: want {want}, got {o}"
            );
        }
        // Far outside the clamp range the result is still finite and right.
        silu_mul(&[-200.0, 200.0], &[1.0, 1.0], &mut got[..2]);
        assert!(got[0].abs() < 1e-30 && got[1] == 200.0, "{:?}", &got[..2]);
    }
}
