//! CPU compute kernels for Strata.
//!
//! Everything here works on plain slices: kernels know nothing about models, devices or
//! scheduling policies. Each fast kernel has a plain `*_ref` twin that tests compare it to.
//!
//! Key pieces:
//! - [`pool`]: the persistent, pinned thread pool every parallel kernel runs on
//!   ([`parallel_for`]).
//! - [`gemm`]: `y = x · Wᵀ` for row-major weights in f32 or BF16, the layout checkpoints use.
//! - [`packed`]: weights packed once at load as BF16, INT8 or INT4 ([`PackedMatrix`]) in a
//!   layout that AMX tiles and AVX-512 registers read alike; [`isa`] picks the path.
//! - [`ggml`]: ggml's quantized block formats (GGUF tensors) and their kernels.
//! - [`moe`]: the fused MoE operator ([`moe::fused_moe`]) and dense MLPs on the same kernels;
//!   [`numa`] splits experts across NUMA nodes.
//!
//! A key design decision made in this crate is that weights are always `[out, in]` row-major
//! (the Hugging Face `nn.Linear` layout) at the API, so a checkpoint's mapped bytes can be
//! packed as they are, without a transpose by the caller.

mod buf;
mod error;
pub mod gemm;
pub mod ggml;
pub mod isa;
pub mod moe;
pub mod numa;
pub mod packed;
pub mod peak;
pub mod pool;
pub mod vector;

pub use buf::AlignedBuf;
pub use error::KernelError;
pub use isa::Isa;
pub use moe::{Expert, MoeExperts, MoeOptions, dense_mlp, fused_moe, fused_moe_with};
pub use packed::{PackSource, PackedFormat, PackedMatrix};
pub use pool::{num_threads, parallel_for};
