//! The hardware tile unit: each [`TileUnit`] operation is one AMX instruction through stable
//! `asm!`, the tile numbers const generics spliced into the instruction text.
//!
//! Tile registers are invisible to the compiler (Rust's `tmm_reg` class is clobber-only and
//! never allocated), so their contents survive from one `asm!` statement of a tile program to
//! the next; no statement is `pure`, so they run in program order. Everything inlines into the
//! kernel's loop, so the abstraction costs the span checks of loads and stores (a multiply and
//! a compare beside a 16-cycle tile instruction) and nothing else.
//!
//! A key design decision: the operations are safe functions. A unit exists only where AMX was
//! detected (the per-process permission included), it validates every configuration as the
//! software unit does (so `ldtilecfg` cannot raise #GP), and it checks every load and store
//! against the configured shape and its operand slice, so no tile instruction touches memory
//! outside a slice it was given. Dot products are not checked here: a bad shape raises #UD,
//! which kills the process without touching memory, and the tests run the same program through
//! `amx_soft`, which refuses it.

use std::arch::asm;
use std::marker::PhantomData;

use super::amx::{Shape, TileCfg, TileUnit};
use crate::isa::Isa;

/// The AMX unit of the current thread (tile state is per thread, so the unit is not `Send`).
pub(super) struct HwTiles {
    shape: Shape,
    _thread: PhantomData<*const ()>,
}

impl HwTiles {
    /// The unit, with no configuration loaded; panics unless AMX was detected.
    pub(super) fn new() -> Self {
        assert!(
            crate::isa::detected() == Isa::Amx,
            "AMX tiles requested on a CPU or OS without AMX"
        );
        Self {
            shape: Shape::NONE,
            _thread: PhantomData,
        }
    }
}

impl TileUnit for HwTiles {
    #[inline(always)]
    fn configure(&mut self, cfg: &TileCfg) {
        self.shape = Shape::of(cfg);
        // SAFETY: AMX and its permission were detected (`new`); `cfg` is a 64-byte aligned
        // palette-1 configuration that `Shape::of` just validated; the instruction only reads it.
        unsafe {
            asm!("ldtilecfg [{}]", in(reg) cfg as *const TileCfg, options(nostack, readonly));
        }
    }

    #[inline(always)]
    fn zero<const T: u8>(&mut self) {
        // SAFETY: AMX was detected; the instruction touches only tile register T.
        unsafe { asm!("tilezero tmm{t}", t = const T, options(nostack, nomem)) };
    }

    #[inline(always)]
    fn load<const T: u8>(&mut self, src: &[u8], stride: usize) {
        self.shape
            .check_span("tileloadd", T.into(), stride, src.len());
        // SAFETY: the configuration `self.shape` is loaded; the load reads its rows x colsb
        // bytes at `stride` from `src`, a span `check_span` found within the slice.
        unsafe {
            asm!("tileloadd tmm{t}, [{p} + {s}*1]", t = const T, p = in(reg) src.as_ptr(),
                s = in(reg) stride, options(nostack, readonly));
        }
    }

    #[inline(always)]
    fn dpbf16ps<const C: u8, const A: u8, const B: u8>(&mut self) {
        // SAFETY: AMX was detected; the instruction touches only tile registers (a shape error
        // raises #UD, it cannot reach memory).
        unsafe {
            asm!("tdpbf16ps tmm{c}, tmm{a}, tmm{b}", c = const C, a = const A, b = const B,
                options(nostack, nomem));
        }
    }

    #[inline(always)]
    fn dpbsud<const C: u8, const A: u8, const B: u8>(&mut self) {
        // SAFETY: as for `dpbf16ps`.
        unsafe {
            asm!("tdpbsud tmm{c}, tmm{a}, tmm{b}", c = const C, a = const A, b = const B,
                options(nostack, nomem));
        }
    }

    #[inline(always)]
    fn store<const T: u8>(&mut self, dst: &mut [u8], stride: usize) {
        self.shape
            .check_span("tilestored", T.into(), stride, dst.len());
        // SAFETY: the configuration `self.shape` is loaded; the store writes its rows x colsb
        // bytes at `stride` into `dst`, a span `check_span` found within the slice.
        unsafe {
            asm!("tilestored [{p} + {s}*1], tmm{t}", t = const T, p = in(reg) dst.as_mut_ptr(),
                s = in(reg) stride, options(nostack));
        }
    }

    #[inline(always)]
    fn release(&mut self) {
        self.shape = Shape::NONE;
        // SAFETY: AMX was detected; returns the tile state to its init state.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

impl Drop for HwTiles {
    /// Releases the tiles of a program that panicked midway.
    fn drop(&mut self) {
        if self.shape != Shape::NONE {
            self.release();
        }
    }
}
