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
//! architecture, serves all of them. Its structure is data, the [`LayerGraph`], and its
//! order of steps one function, [`forward_pass`], which drives every backend's
//! [`Decoder`] steps: [`Model`]'s on the CPU and the accelerator model's in `strata-exec`. Which tensor holds which weight is answered in one
//! place, [`names`], for every reader of a checkpoint, and which shape each must have in
//! another, [`tensors`].
//!
//! ```
//! use std::path::Path;
//! use strata_model::{LogitsWanted, Model, Precision, SeqInput};
//!
//! // The tiny Qwen3-MoE-shaped test model kept in the repository.
//! let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/strata-tiny-moe");
//! let model = Model::load(&dir, Precision::Fast)?;
//! let mut cache = model.new_cache();
//! let mut seqs = [SeqInput { tokens: &[1, 2, 3], cache: &mut cache, logits: LogitsWanted::Last }];
//! let logits = model.forward(&mut seqs)?; // one row of `vocab_size` logits
//! assert_eq!(logits[0].len(), model.config.vocab_size);
//! # Ok::<(), strata_model::Error>(())
//! ```
#![deny(missing_docs)]

pub mod attention;
pub mod backend;
mod cache;
pub mod config;
mod error;
pub mod experts;
mod gguf;
mod graph;
pub mod linear;
pub mod memory;
pub mod model;
pub mod moe;
pub mod names;
pub mod ops;
pub mod rope;
pub mod routing;
mod shape;
pub mod source;
pub mod tensors;

pub use attention::SeqSpan;
pub use cache::{BLOCK as KV_BLOCK, KvCache, LayerCache, check_rows};
pub use config::{Arch, ModelConfig};
pub use error::{Error, Result};
pub use graph::{Decoder, Head, LayerGraph, LayerNode, Norm, forward_pass};
pub use linear::{LoadOptions, Precision};
pub use memory::MemoryPlan;
pub use model::{
    ForwardObserver, LogitsWanted, Model, NoObserver, ParamCounts, RoutingTap, SeqInput,
};
pub use moe::{ExpertCall, ExpertExecutor, Router};
pub use routing::Routing;
pub use shape::MoeShape;
