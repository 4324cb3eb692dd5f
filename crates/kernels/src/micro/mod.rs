//! Micro-kernels over packed panels: one module per instruction set, one entry point.
//!
//! [`run_block`] computes `out[rows, strips] += x[rows, :] · W[strips, :]ᵀ` for a block of token
//! rows and output strips, walking `k` in blocks sized so the weight panel (the block's strips
//! over one `k` block) stays in L2 while every row of the block streams over it. Integer
//! formats accumulate exactly in i32 and flush to f32 once per scale group (or once per `k`
//! block for per-row scales), subtracting the stored weight offset times the activation sum.
//!
//! A key design decision: all paths take the same arguments and read the same packed bytes,
//! so a path is chosen per call (AMX for many rows, AVX-512 for few) without repacking.

use std::ops::Range;

use crate::isa::Isa;
use crate::packed::{Activations, Kind, PackedMatrix, STRIP};

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod portable;

/// Strips (of 16 columns) per parallel task: 64 output columns.
pub(crate) const N_BLOCK_STRIPS: usize = 4;
/// Token rows per parallel task; a multiple of the AMX block height (32).
pub(crate) const M_CHUNK: usize = 256;
/// Weight panel size for AMX: kept in L2 (a quarter of Sapphire Rapids' 2 MiB), so tile
/// accumulators are stored only once per long `k` run.
const PANEL_BYTES_AMX: usize = 512 * 1024;
/// Weight panel size for AVX-512 and portable code: kept in L1 (48 KiB and up), since every
/// 4-row register tile rereads the whole panel. Chosen from the cache sizes: an A/B against
/// 256 KiB on `bench moe --tokens 512` was within the shared host's noise (0.12-0.24 TFLOPS
/// for both, 2026-11-21).
const PANEL_BYTES_VEC: usize = 32 * 1024;

/// Weight offset of the unsigned storage (see the `packed` module docs).
pub(crate) fn offset(kind: Kind) -> i32 {
    match kind {
        Kind::Bf16 => 0,
        Kind::Int8 => 128,
        Kind::Int4 => 8,
    }
}

/// Accumulates `x[rows] · W[strips]ᵀ` into `out` (`[rows.len(), ldo]`, strip `s` at column
/// `(s - strips.start) * 16`) on path `isa` (which must be available).
///
/// `strips` must start at an even strip and hold an even count; `rows` must lie within the
/// activations' padded rows.
pub(crate) fn run_block(
    isa: Isa,
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
    assert!(rows.end <= a.m.div_ceil(32).max(1) * 32 && a.k_pad == w.k_pad);
    assert!(
        ldo >= strips.len() * STRIP && out.len() >= (rows.len() - 1) * ldo + strips.len() * STRIP
    );
    debug_assert!(isa.is_available());
    let unit = match w.kind {
        Kind::Bf16 => 32,
        _ if w.group < w.k_pad => w.group,
        _ => 64,
    };
    let bytes_per_k = w.strip_bytes * strips.len() / w.k_pad;
    let panel = if isa == Isa::Amx {
        PANEL_BYTES_AMX
    } else {
        PANEL_BYTES_VEC
    };
    let kb = (panel / bytes_per_k.max(1) / unit).max(1) * unit;
    let mut k0 = 0;
    while k0 < w.k_pad {
        let ks = k0..(k0 + kb).min(w.k_pad);
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Amx if rows.start.is_multiple_of(32) => {
                amx::block(w, a, rows.clone(), strips.clone(), ks.clone(), out, ldo)
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Amx | Isa::Avx512 => {
                avx512::block(w, a, rows.clone(), strips.clone(), ks.clone(), out, ldo)
            }
            _ => portable::block(w, a, rows.clone(), strips.clone(), ks.clone(), out, ldo),
        }
        k0 = ks.end;
    }
}

/// `k` per integer flush within `ks`: the scale group, or the whole block for per-row scales.
pub(crate) fn flush_span(w: &PackedMatrix, ks: &Range<usize>) -> usize {
    w.group.min(ks.len())
}

/// `offset · Σ x` over `k` in `f0 .. f0 + span` for row `r`.
pub(crate) fn correction(
    w: &PackedMatrix,
    a: &Activations,
    r: usize,
    f0: usize,
    span: usize,
) -> i32 {
    let units = a.k_pad / crate::packed::XSUM_UNIT;
    let u0 = r * units + f0 / crate::packed::XSUM_UNIT;
    let s: i32 = a.xsum[u0..u0 + span / crate::packed::XSUM_UNIT]
        .iter()
        .sum();
    offset(w.kind) * s
}
