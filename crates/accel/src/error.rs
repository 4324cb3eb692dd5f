//! The accelerator layer's error type.

/// Errors from enumerating devices, managing their memory and running kernels.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The backend was not compiled into this build.
    #[error("not compiled with the {backend} backend (rebuild strata with `--features {feature}`)")]
    NotCompiledWith {
        /// Backend name (`wgpu`).
        backend: &'static str,
        /// Cargo feature that enables it.
        feature: &'static str,
    },
    /// The backend is compiled in but finds no usable adapter.
    #[error("no {apis} adapter found; {hint}")]
    NoAdapter {
        /// Graphics APIs searched (`Vulkan`).
        apis: String,
        /// What to install or check.
        hint: &'static str,
    },
    /// A device index past the enumerated devices.
    #[error("device {index} does not exist ({count} found)")]
    NoSuchDevice {
        /// Requested index.
        index: usize,
        /// Devices found.
        count: usize,
    },
    /// An allocation would exceed the memory budget (`--vram-budget`).
    #[error(
        "allocating {requested} bytes for {label} exceeds the device memory budget: {used} of {budget} bytes in use"
    )]
    OutOfBudget {
        /// What the buffer is for.
        label: String,
        /// Bytes requested.
        requested: u64,
        /// Bytes already held (live and pooled).
        used: u64,
        /// The budget.
        budget: u64,
    },
    /// A request exceeds a device limit.
    #[error("{what}: {got} exceeds the device limit of {limit}")]
    Limit {
        /// What was requested.
        what: String,
        /// Requested value.
        got: u64,
        /// The device's limit.
        limit: u64,
    },
    /// An operation's arguments do not fit together.
    #[error("{op}: {message}")]
    Shape {
        /// The operation.
        op: &'static str,
        /// Expected vs got.
        message: String,
    },
    /// The device does not implement an operation (see `Device::supports_op`).
    #[error("the device does not support {0}")]
    Unsupported(String),
    /// The driver or the backend reported an error (validation, out of memory, lost device).
    #[error("device error: {0}")]
    Device(String),
}

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
