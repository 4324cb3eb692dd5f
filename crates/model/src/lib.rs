//! Model architectures for Strata: what to compute.
//!
//! Each supported architecture (Qwen3-MoE, Qwen2-MoE, Mixtral, DeepSeek-V2/V3 with MLA,
//! GLM-4.5, dense Llama and Qwen2) is a [`config::ModelConfig`] over shared building blocks:
//! RMSNorm, rotary variants ([`rope`]), grouped-query and latent attention ([`attention`]),
//! dense MLPs and mixture-of-experts blocks with their routers ([`moe`]). [`Model`] runs a
//! batch of sequences of different lengths through them with a per-sequence [`KvCache`].
//!
//! A key design decision made in this crate is that architectures differ only in their
//! normalised config and tensor names, never in separate forward-pass code: one forward
//! pass, checked against Hugging Face transformers on a tiny checkpoint of every
//! architecture, serves all of them.

pub mod attention;
pub mod cache;
pub mod config;
mod error;
pub mod gguf;
pub mod linear;
pub mod memory;
pub mod model;
pub mod moe;
pub mod ops;
pub mod rope;
mod shape;
pub mod source;

pub use attention::SeqSpan;
pub use cache::KvCache;
pub use config::{Arch, ModelConfig};
pub use error::{Error, Result};
pub use linear::{LoadOptions, Precision};
pub use memory::MemoryPlan;
pub use model::{
    ForwardObserver, LogitsWanted, Model, NoObserver, ParamCounts, RoutingTap, SeqInput,
};
pub use moe::{ExpertCall, ExpertExecutor, Routing};
pub use shape::MoeShape;
