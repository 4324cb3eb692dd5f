//! The hybrid executor: runs a placement policy's decisions for every MoE layer of every
//! step on the CPU kernels and an accelerator at once (`../shared/DESIGN.md`, layer 4).
//!
//! A model with a [`HybridExecutor`] installed ([`install`]) hands each MoE block's routing
//! to it through `strata_model`'s [`strata_model::ExpertExecutor`] hook. For each layer the
//! executor builds the policy's [`strata_policy::LayerView`] from the real routing, the
//! residency of its GPU expert cache ([`SlotCache`] over `strata_accel`'s `ExpertSlots`, a
//! fixed number of slots from `--vram-budget`) and the free bytes; asks the
//! [`strata_policy::Policy`]; applies the evictions; uploads what the transfers name
//! ([`HostExperts`] reads them from the mapped checkpoint); runs the GPU's experts on the
//! device through its persistent worker thread while the CPU's run on the kernels' pool;
//! and combines both in f32. Copies for later layers (prefetches) run on the worker in the
//! background, ordered before any kernel that reads them. Deferred experts (KTransformers)
//! are computed at their layer and their output is added at the next MoE layer. The phase a
//! policy is told comes from the step's batch layout (every sequence adding one token:
//! decode), so a continuous-batching scheduler's steps are told apart. Attention, dense
//! layers, shared experts, the router and the LM head stay on the CPU for now.
//!
//! A key design decision: this is a crate of its own rather than a module of
//! `strata-runtime`, because it is the one place where the model, the policies and the
//! accelerator meet (STYLE: `runtime <- policy-driven executors <- cli`); the runtime, the
//! server and their tests keep building without wgpu, and the executor plugs into any
//! `Model` through a trait the model crate owns, so the engine's generation loop is
//! unchanged.

#![deny(missing_docs)]

mod cache;
mod calibrate;
mod exec_stats;
mod executor;
mod gpu_model;
mod setup;
mod ssd;
mod weights;
mod worker;

pub use cache::SlotCache;
pub use calibrate::{CpuFigures, DeviceFigures};
pub use exec_stats::ExecStats;
pub use executor::{DeferredExperts, DeviceShare, ExecOptions, HybridExecutor, LayerRecord};
pub use gpu_model::{GpuCache, GpuModel, GpuSeq};
pub use setup::{
    HybridOptions, PolicyKind, PolicyOptions, build_policy, cost_model, install, load_hybrid,
    model_shape, resolve_model_shape,
};
pub use ssd::{
    CacheChoice, ExpertCache, PinnedRead, SsdOptions, SsdStats, SsdTier, attach_ssd_tier,
    pin_profile_from_trace, ssd_min_budget, write_metric,
};
pub use weights::{HostExperts, device_f16_bytes};
pub use worker::DeviceCombine;

/// Errors of the executor.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The accelerator failed or refused (budget, shapes).
    #[error(transparent)]
    Accel(#[from] strata_accel::Error),
    /// The checkpoint could not be read.
    #[error(transparent)]
    Model(#[from] strata_model::Error),
    /// A policy could not be built (presets, settings).
    #[error(transparent)]
    Policy(#[from] strata_policy::Error),
    /// A routing trace (`HybridOptions::profile`) could not be read or learnt from.
    #[error(transparent)]
    Trace(#[from] strata_sim::Error),
    /// A forward pass was asked for what the model or its cache cannot do.
    #[error("{op}: {message}")]
    Shape {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The model or the settings do not fit the executor.
    #[error("{0}")]
    Config(String),
    /// A policy's decision is not executable (an expert routed twice or not at all).
    #[error("policy {policy}, moe layer {layer}: {msg}")]
    Decision {
        /// The policy.
        policy: String,
        /// MoE layer.
        layer: usize,
        /// What is wrong.
        msg: String,
    },
}

/// Result with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
