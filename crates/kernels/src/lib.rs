//! CPU compute kernels for Strata.
//!
//! Everything here works on plain slices: kernels know nothing about models, devices or
//! scheduling policies. Each fast kernel has a plain `*_ref` twin that tests compare it to.
//!
//! Key pieces:
//! - [`pool`]: the persistent thread pool every parallel kernel runs on ([`parallel_for`]).
//! - [`gemm`]: `y = x · Wᵀ` for row-major weights in f32 or BF16, the layout checkpoints use.
//!
//! A key design decision made in this crate is that weights are always `[out, in]` row-major
//! (the Hugging Face `nn.Linear` layout), so a checkpoint's mapped bytes can be used as they
//! are, without a transpose at load.

mod buf;
mod error;
pub mod gemm;
pub mod isa;
mod micro;
pub mod packed;
pub mod pool;

pub use buf::AlignedBuf;
pub use error::KernelError;
pub use isa::Isa;
pub use packed::{PackSource, PackedFormat, PackedMatrix};
pub use pool::{num_threads, parallel_for};
