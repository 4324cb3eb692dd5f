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
