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
//!
//! ```
//! use strata_kernels::moe::fused_moe_ref;
//! use strata_kernels::{Expert, MoeExperts, PackedFormat, fused_moe};
//!
//! // Two experts of a small MLP (hidden 32, intermediate 16), packed once as BF16 from
//! // row-major `gate`, `up` `[inter, hidden]` and `down` `[hidden, inter]`.
//! let (hidden, inter) = (32, 16);
//! let values = |seed: f32, n: usize| -> Vec<f32> {
//!     (0..n).map(|i| (i as f32 * 0.37 + seed).sin() * 0.1).collect()
//! };
//! let experts = (0..2)
//!     .map(|e| {
//!         let s = e as f32;
//!         let (gate, up) = (values(s, inter * hidden), values(s + 0.5, inter * hidden));
//!         let down = values(s + 0.25, hidden * inter);
//!         Expert::pack(&gate, &up, &down, hidden, inter, PackedFormat::Bf16)
//!     })
//!     .collect::<Result<Vec<_>, _>>()?;
//! let experts = MoeExperts::new(hidden, inter, experts)?;
//!
//! // Two tokens `[2, hidden]`, each routed to both experts (top-2) with the router's weights.
//! let x = values(3.0, 2 * hidden);
//! let (ids, weights) = ([0, 1, 1, 0], [0.75, 0.25, 0.6, 0.4]);
//! let mut out = vec![0.0; 2 * hidden];
//! fused_moe(&experts, &x, &ids, &weights, &mut out)?;
//!
//! // The plain reference gives the same sums, up to the order of additions.
//! let mut want = vec![0.0; 2 * hidden];
//! fused_moe_ref(&experts, &x, &ids, &weights, &mut want)?;
//! assert!(out.iter().zip(&want).all(|(a, b)| (a - b).abs() <= 1e-5 + 1e-4 * b.abs()));
//! # Ok::<(), strata_kernels::KernelError>(())
//! ```

#![deny(missing_docs)]

pub mod attention;
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
#[cfg(target_arch = "x86_64")]
mod transpose;
pub mod vector;
#[cfg(any(target_arch = "x86_64", test))]
mod vnni_unit;

pub use buf::{AlignedBuf, limit_malloc_arenas, zeroed_f32};
pub use error::KernelError;
pub use isa::Isa;
pub use moe::{Expert, MoeExperts, MoeOptions, dense_mlp, fused_moe, fused_moe_with};
pub use packed::{PackSource, PackedFormat, PackedMatrix};
pub use pool::{num_threads, parallel_chunks_mut, parallel_for};
