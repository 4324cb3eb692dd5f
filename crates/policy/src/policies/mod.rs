//! The policies of the seed systems and their baselines.
//!
//! - [`GpuLru`]: every expert on the GPU, loaded on demand into a per-layer LRU cache.
//! - [`Fiddler`]: popular experts pinned on the GPU from a profile, the rest on the CPU
//!   or copied when that is cheaper.
//! - [`KTransformers`]: routed experts on the CPU, with expert deferral.
//! - [`HybriMoE`]: score cache, earliest-finish CPU/GPU assignment, next-layer prefetch.
//! - [`Smoe`]: Algorithm 1 on-demand loading in prefill; token-wise predicted prefetch
//!   into an LFU cache in decode; per-layer enabling (SMoE-Flex).
//! - [`TriMoE`] (issue #6): GPU / CPU / NDP makespan scheduling with relayout and
//!   rebalancing; its baselines [`Klotski`], [`KtEnhanced`] and [`Monde`].
//!
//! A key design decision: each policy's bookkeeping is per MoE layer and indexed by the
//! `layer` of the view, so one policy value serves a whole model and stays deterministic.

mod fiddler;
mod gpu_lru;
mod hot;
mod hybrimoe;
mod klotski;
mod kt_enhanced;
mod ktransformers;
mod monde;
mod smoe;
mod trimoe;

pub use fiddler::Fiddler;
pub use gpu_lru::GpuLru;
pub use hybrimoe::{HybriCosts, HybriMoE};
pub use klotski::Klotski;
pub use kt_enhanced::KtEnhanced;
pub use ktransformers::KTransformers;
pub use monde::Monde;
pub use smoe::{Eviction as SmoeEviction, Smoe};
pub use trimoe::{Job, JobCost, Schedule, TriMoE, TriMoEConfig, greedy, refine};
