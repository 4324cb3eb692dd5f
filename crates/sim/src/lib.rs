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

#![deny(missing_docs)]

mod engine;
pub mod report;
pub mod reproduce;
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
