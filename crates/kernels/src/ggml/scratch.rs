//! Per-thread scratch shared by the block kernels (`matrix`) and the tile path (`tiles`),
//! reused across tasks so that a task allocates nothing.

use std::cell::Cell;

/// Decoded rows (`q`, `d`, `m`), dequantized rows (`f`), one row's results (`col`), the
/// output tile (`tile`), BF16 rows (`h`) and INT8 rows as stored (`b`).
#[derive(Default)]
pub(super) struct Scratch {
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    pub m: Vec<f32>,
    pub f: Vec<f32>,
    pub col: Vec<f32>,
    pub tile: Vec<f32>,
    pub h: Vec<u16>,
    pub b: Vec<u8>,
}

/// Runs `f` on this thread's scratch.
pub(super) fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    thread_local! {
        static SCRATCH: Cell<Scratch> = Cell::new(Scratch::default());
    }
    let mut s = SCRATCH.take();
    let r = f(&mut s);
    SCRATCH.set(s);
    r
}

/// This thread's reusable output buffers (see [`with_buffer`]).
#[derive(Clone, Copy)]
pub(super) enum Buffer {
    /// A tile's results (`tiles::block`).
    TileOut,
    /// A gate task's results (`moe::run_wave`).
    Gate,
    /// A wave's SwiGLU rows.
    Mid,
}

/// Runs `f` on this thread's `which` buffer of `len` floats, its contents left from an earlier
/// call: callers write every element they read, or clear it. Allocated per call, the wave's
/// buffers (tens of MB at 2,048 rows) were zeroed by `calloc` or by page faults and returned
/// each time: with the tiles' outputs, `memset`, the allocator and the kernel's page handling
/// were ~9% of a 512-token prefill's samples (2026-11-30). The buffers stay allocated at their
/// largest size (the wave's SwiGLU rows: ~6 MB for Qwen3-30B-A3B's shapes).
pub(super) fn with_buffer<R>(which: Buffer, len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    thread_local! {
        static BUFFERS: [Cell<Vec<f32>>; 3] = Default::default();
    }
    let mut v = BUFFERS.with(|b| b[which as usize].take());
    if v.len() < len {
        v.resize(len, 0.0);
    }
    if cfg!(debug_assertions) {
        // An element a caller reads without writing shows up as NaN in the tests.
        v[..len].fill(f32::NAN);
    }
    let r = f(&mut v[..len]);
    BUFFERS.with(|b| b[which as usize].set(v));
    r
}
