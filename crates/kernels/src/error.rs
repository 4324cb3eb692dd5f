//! The error type of the kernels crate.
//!
//! Kernels check their preconditions (slice lengths, format parameters) and return these errors
//! instead of panicking, so a malformed model description surfaces as a message, not an abort.

use thiserror::Error;

/// What went wrong in a kernel call or while packing weights.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum KernelError {
    /// A slice does not have the length its shape implies.
    #[error("{op}: {what} has {got} elements, expected {expected}")]
    Shape {
        /// The operation that was called.
        op: &'static str,
        /// Which argument was wrong.
        what: &'static str,
        /// The length implied by the shape.
        expected: usize,
        /// The length passed.
        got: usize,
    },
    /// A quantization group size that the packed layout does not support.
    #[error("{op}: quantization group {got} is not supported, expected one of 32, 64, 128")]
    Group {
        /// The operation that was called.
        op: &'static str,
        /// The group size asked for.
        got: usize,
    },
    /// Matrices that must agree in a dimension or format do not.
    #[error("{op}: {what}")]
    Mismatch {
        /// The operation that was called.
        op: &'static str,
        /// What disagrees, with both values.
        what: String,
    },
}

/// Returns a [`KernelError::Shape`] unless `got == expected`.
pub(crate) fn check_len(
    op: &'static str,
    what: &'static str,
    expected: usize,
    got: usize,
) -> Result<(), KernelError> {
    if got == expected {
        Ok(())
    } else {
        Err(KernelError::Shape {
            op,
            what,
            expected,
            got,
        })
    }
}
