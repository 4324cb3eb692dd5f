//! AMX micro-kernel: 32x32 output blocks from two A tiles (token rows) and two B tiles
//! (strips), `tdpbf16ps` for BF16 and `tdpbsud` (signed activations x unsigned weights) for
//! INT8 and INT4, through stable `asm!`.
//!
//! Tile registers: `tmm0..3` accumulators (16 x 16 f32/i32), `tmm4..5` activations (16 rows x
//! one `k` step), `tmm6..7` weights (one `k` step x 16 columns, the packed lines as they are).
//! The whole `k` loop of a block runs inside one `asm!` so the accumulators never leave the
//! tiles; they are stored once per block (BF16, per-row INT8) or per scale group.
//! INT4 panels are first unpacked to the INT8 line layout in a per-thread scratch buffer,
//! once per panel, and then reused by every 32-row block of the task.
//!
//! The tile configuration is loaded at the start of each call and released at its end; the
//! compiler never touches tile registers, so state survives between the `asm!` blocks within.

use std::arch::asm;
use std::cell::RefCell;
use std::ops::Range;

use super::{correction, flush_span};
use crate::buf::AlignedBuf;
use crate::packed::{Activations, Kind, LINE, PackedMatrix, STRIP};

/// The 64-byte `ldtilecfg` operand (palette 1).
#[repr(C, align(64))]
struct TileCfg {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

impl TileCfg {
    /// Configuration for a `k` step of `kstep_bytes` bytes per activation row (64 or 32).
    fn new(kstep_bytes: usize) -> Self {
        let mut c = TileCfg {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        for t in 0..4 {
            c.colsb[t] = 64;
            c.rows[t] = 16;
        }
        for t in 4..6 {
            c.colsb[t] = kstep_bytes as u16;
            c.rows[t] = 16;
        }
        for t in 6..8 {
            c.colsb[t] = 64;
            c.rows[t] = (kstep_bytes / 4) as u8;
        }
        c
    }
}

/// One 32x32 block of f32 or i32 results, row stride 128 bytes.
#[repr(C, align(64))]
struct CBlock([u32; 32 * 32]);

macro_rules! tile_loop {
    ($name:ident, $op0:literal, $op1:literal, $op2:literal, $op3:literal) => {
        /// Zeroes the accumulators, runs `steps` `k` steps over A rows `a`, `a + 16 lda` and
        /// B panels `b0`, `b1`, and stores the 32x32 result to `c`.
        ///
        /// # Safety
        /// AMX must be enabled for the process and a [`TileCfg`] matching `astep` loaded;
        /// `steps >= 1`; `a` must be readable for 32 rows of `lda` bytes covering `steps *
        /// astep` bytes each, `b0`/`b1` for `steps * bstep` bytes, `c` writable for 4 KiB.
        #[allow(clippy::too_many_arguments)]
        unsafe fn $name(
            a: *const u8,
            lda: usize,
            b0: *const u8,
            b1: *const u8,
            steps: usize,
            astep: usize,
            bstep: usize,
            c: *mut CBlock,
        ) {
            debug_assert!(steps >= 1);
            // SAFETY: the caller guarantees the configuration, the permission and the extent
            // of every buffer; the asm touches only tile registers, the listed general
            // registers and flags, and the memory the caller described.
            unsafe {
                asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    "2:",
                    "tileloadd tmm4, [{a0} + {lda}*1]",
                    "tileloadd tmm5, [{a1} + {lda}*1]",
                    "tileloadd tmm6, [{b0} + {s}*1]",
                    "tileloadd tmm7, [{b1} + {s}*1]",
                    $op0,
                    $op1,
                    $op2,
                    $op3,
                    "add {a0}, {astep}",
                    "add {a1}, {astep}",
                    "add {b0}, {bstep}",
                    "add {b1}, {bstep}",
                    "dec {n}",
                    "jnz 2b",
                    "add {s}, 64",
                    "tilestored [{c} + {s}*1], tmm0",
                    "add {c}, 64",
                    "tilestored [{c} + {s}*1], tmm1",
                    "add {c}, 1984",
                    "tilestored [{c} + {s}*1], tmm2",
                    "add {c}, 64",
                    "tilestored [{c} + {s}*1], tmm3",
                    a0 = inout(reg) a => _,
                    a1 = inout(reg) a.add(16 * lda) => _,
                    lda = in(reg) lda,
                    b0 = inout(reg) b0 => _,
                    b1 = inout(reg) b1 => _,
                    s = inout(reg) 64usize => _,
                    n = inout(reg) steps => _,
                    astep = in(reg) astep,
                    bstep = in(reg) bstep,
                    c = inout(reg) c => _,
                    options(nostack),
                );
            }
        }
    };
}

tile_loop!(
    tiles_bf16,
    "tdpbf16ps tmm0, tmm4, tmm6",
    "tdpbf16ps tmm1, tmm4, tmm7",
    "tdpbf16ps tmm2, tmm5, tmm6",
    "tdpbf16ps tmm3, tmm5, tmm7"
);
tile_loop!(
    tiles_s8u8,
    "tdpbsud tmm0, tmm4, tmm6",
    "tdpbsud tmm1, tmm4, tmm7",
    "tdpbsud tmm2, tmm5, tmm6",
    "tdpbsud tmm3, tmm5, tmm7"
);

thread_local! {
    /// INT4 panels unpacked to INT8 lines, reused across calls on this thread.
    static SCRATCH: RefCell<AlignedBuf> = RefCell::new(AlignedBuf::zeroed(0));
}

/// Safe entry point; see [`super::run_block`] for the contract (plus `rows.start.is_multiple_of(32)`).
pub(super) fn block(
    w: &PackedMatrix,
    a: &Activations,
    rows: Range<usize>,
    strips: Range<usize>,
    ks: Range<usize>,
    out: &mut [f32],
    ldo: usize,
) {
    assert!(crate::isa::detected() == crate::isa::Isa::Amx && rows.start.is_multiple_of(32));
    let kstep_bytes = match w.kind {
        Kind::Bf16 => 64,
        _ => w.group.min(64),
    };
    let cfg = TileCfg::new(kstep_bytes);
    // SAFETY: AMX was detected, which includes the granted permission; `cfg` is a valid
    // 64-byte palette-1 configuration.
    unsafe { asm!("ldtilecfg [{}]", in(reg) &cfg as *const TileCfg, options(nostack, readonly)) };
    let mut c = CBlock([0; 32 * 32]);
    let elem = if w.kind == Kind::Bf16 { 2 } else { 1 };
    SCRATCH.with_borrow_mut(|scratch| {
        let mut sp = strips.start;
        while sp < strips.end {
            // B panels for strips `sp` and `sp + 1` at `k = ks.start`, with the distance
            // between the two panels.
            let (b, bstride) = if w.kind == Kind::Int4 {
                unpack_int4(w, sp, &ks, scratch);
                (scratch.as_ptr(), ks.len() / 4 * LINE)
            } else {
                let k_per_line = if w.kind == Kind::Bf16 { 2 } else { 4 };
                // SAFETY: strip `sp` and the line of `ks.start` lie within the packed data.
                let p = unsafe {
                    w.data
                        .as_ptr()
                        .add(sp * w.strip_bytes + ks.start / k_per_line * LINE)
                };
                (p, w.strip_bytes)
            };
            let mut r0 = rows.start;
            while r0 < rows.end {
                // SAFETY: rows `r0 .. r0 + 32` lie within the activations' padded rows
                // (`r0` is a multiple of 32 below `m_pad`, itself a multiple of 32).
                let ap = unsafe { a.data.as_ptr().add(r0 * a.lda + ks.start * elem) };
                let nrows = (rows.end - r0).min(32);
                if w.kind == Kind::Bf16 {
                    // SAFETY: configuration loaded above for 64-byte steps; A covers 32 rows of
                    // `ks.len()` bf16, each B panel `ks.len() / 2` lines; `c` is 4 KiB.
                    unsafe {
                        tiles_bf16(
                            ap,
                            a.lda,
                            b,
                            b.add(bstride),
                            ks.len() / 32,
                            64,
                            1024,
                            &mut c,
                        )
                    };
                    for i in 0..nrows {
                        let o = &mut out
                            [(r0 + i - rows.start) * ldo + (sp - strips.start) * STRIP..]
                            [..2 * STRIP];
                        for (o, v) in o.iter_mut().zip(&c.0[i * 32..i * 32 + 32]) {
                            *o += f32::from_bits(*v);
                        }
                    }
                } else {
                    let fs = flush_span(w, &ks);
                    let mut f0 = ks.start;
                    while f0 < ks.end {
                        let rel = f0 - ks.start;
                        // SAFETY: configuration loaded for `kstep_bytes`; the span `f0 .. f0 +
                        // fs` lies within `ks`, so A and both B panels cover it; `c` is 4 KiB.
                        unsafe {
                            tiles_s8u8(
                                ap.add(rel),
                                a.lda,
                                b.add(rel / 4 * LINE),
                                b.add(bstride + rel / 4 * LINE),
                                fs / kstep_bytes,
                                kstep_bytes,
                                kstep_bytes / 4 * LINE,
                                &mut c,
                            )
                        };
                        let g = f0 / w.group;
                        for i in 0..nrows {
                            let r = r0 + i;
                            let corr = correction(w, a, r, f0, fs);
                            let xs = a.scale[r];
                            for h in 0..2 {
                                let sc = &w.scales[((sp + h) * w.groups + g) * STRIP..][..STRIP];
                                let o = &mut out
                                    [(r - rows.start) * ldo + (sp + h - strips.start) * STRIP..]
                                    [..STRIP];
                                let ci = &c.0[i * 32 + h * STRIP..][..STRIP];
                                for j in 0..STRIP {
                                    o[j] += (ci[j] as i32 - corr) as f32 * sc[j] * xs;
                                }
                            }
                        }
                        f0 += fs;
                    }
                }
                r0 += 32;
            }
            sp += 2;
        }
    });
    // SAFETY: releases the tile state configured above; no tile instruction follows.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// Unpacks the INT4 lines of strips `sp`, `sp + 1` over `ks` into INT8 lines in `scratch`:
/// strip `sp + h` at `h * ks.len() / 4` lines.
fn unpack_int4(w: &PackedMatrix, sp: usize, ks: &Range<usize>, scratch: &mut AlignedBuf) {
    let lines = ks.len() / 4;
    if scratch.len() < 2 * lines * LINE {
        *scratch = AlignedBuf::zeroed(2 * lines * LINE);
    }
    let dst = scratch.as_mut_slice();
    let data = w.data.as_slice();
    for h in 0..2 {
        let src = &data[(sp + h) * w.strip_bytes + ks.start / 8 * LINE..][..lines / 2 * LINE];
        let d = &mut dst[h * lines * LINE..][..lines * LINE];
        for (l, s) in src.chunks_exact(LINE).enumerate() {
            let (lo, hi) = d[2 * l * LINE..(2 * l + 2) * LINE].split_at_mut(LINE);
            for ((lo, hi), s) in lo.iter_mut().zip(hi.iter_mut()).zip(s) {
                *lo = s & 0xf;
                *hi = s >> 4;
            }
        }
    }
}
