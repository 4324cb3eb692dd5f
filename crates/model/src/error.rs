use std::path::PathBuf;

/// Errors from building or running a model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A checkpoint file could not be read or is malformed.
    #[error(transparent)]
    Format(#[from] strata_formats::Error),
    /// `config.json` is missing, not JSON, or inconsistent.
    #[error("{path}: {message}")]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong, naming the field.
        message: String,
    },
    /// The config asks for something this engine does not implement.
    #[error("{path}: unsupported `{field}`: {message}")]
    Unsupported {
        /// The config file.
        path: PathBuf,
        /// The field whose value is not supported.
        field: String,
        /// Why, and what is supported.
        message: String,
    },
    /// A compute kernel rejected its inputs.
    #[error(transparent)]
    Kernel(#[from] strata_kernels::KernelError),
    /// An installed expert executor (`moe::ExpertExecutor`) failed.
    #[error("expert executor: {0}")]
    Executor(Box<dyn std::error::Error + Send + Sync>),
    /// A request to the model is invalid (token ids out of range, too long, ...).
    #[error("{0}")]
    Input(String),
    /// The run would not fit in the memory available (see [`crate::memory`]).
    #[error("{0}")]
    Memory(String),
}

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
