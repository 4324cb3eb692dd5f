//! A discrete-event simulator of MoE inference on a GPU, a CPU, a PCIe link and (later)
//! near-data processors, driving the same [`strata_policy::Policy`] code the runtime runs.
//!
//! Key entry points: [`simulate`] (one policy on one workload), [`workload::synthetic`]
//! and [`trace`] (routing inputs), [`reproduce`] (the seeds' setups with the papers'
//! figures beside the simulated ones), [`Report`] (metrics and a Perfetto timeline).
//!
//! A key design decision: the simulator owns time and memory, the policy owns decisions;
//! the two meet only through `LayerView` and `Decision`, so what is simulated is exactly
//! what the runtime's executor would be told to do.
//!
//! ```
//! use strata_policy::policies::KTransformers;
//! use strata_policy::{CostModel, Hardware, ModelShape};
//! use strata_sim::workload::{SyntheticParams, synthetic};
//!
//! // Qwen3-30B-A3B with BF16 experts on the SMoE paper's RTX 4090 machine (built-in presets).
//! let cost = CostModel::new(
//!     Hardware::load("smoe-4090")?,
//!     ModelShape::load("qwen3-30b-a3b")?,
//!     16.0,
//!     16.0,
//! )?;
//! // One request, a 16-token prompt then 4 decode steps, routed by a seeded skewed model.
//! let m = &cost.model;
//! let workload = synthetic(&SyntheticParams {
//!     requests: 1,
//!     prompt_tokens: 16,
//!     decode_tokens: 4,
//!     ..SyntheticParams::calibrated(m.moe_layers(), m.n_experts, m.top_k)
//! });
//! // KTransformers: routed experts on the CPU, nothing deferred.
//! let report = strata_sim::simulate(&mut KTransformers::new(0), &cost, &workload)?;
//! assert_eq!((report.prefill.tokens, report.decode.tokens), (16, 4));
//! println!("decode: {:.1} tokens/s", report.decode.tokens_per_s);
//! # Ok::<(), strata_sim::Error>(())
//! ```

#![deny(missing_docs)]

mod engine;
pub mod report;
pub mod reproduce;
pub mod ssd_tier;
mod throughput;
pub mod trace;
pub mod workload;

pub use engine::simulate;
pub use report::{Lane, Op, Report};

/// Errors of the simulator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A policy made a decision the hardware cannot carry out.
    #[error("policy {policy} at step {step}, layer {layer}: {msg}")]
    Policy {
        /// Policy name.
        policy: String,
        /// Step index.
        step: usize,
        /// Transformer layer.
        layer: usize,
        /// What was wrong.
        msg: String,
    },
    /// The workload does not fit the model.
    #[error("workload does not match the model: {0}")]
    Mismatch(String),
    /// A trace file is malformed.
    #[error("trace {path}: {msg}")]
    Trace {
        /// The file.
        path: String,
        /// What was wrong.
        msg: String,
    },
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A preset or policy setting was rejected.
    #[error(transparent)]
    Config(#[from] strata_policy::Error),
}

/// Result with the crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
