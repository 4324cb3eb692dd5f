//! Rust errors as Python exceptions, with the message the command line prints.

use pyo3::PyErr;
use pyo3::exceptions::PyRuntimeError;

/// An error with its whole cause chain, as the command line prints it.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let s_msg = s.to_string();
        if !msg.contains(&s_msg) {
            msg.push_str(": ");
            msg.push_str(&s_msg);
        }
        src = s.source();
    }
    msg
}

/// `e` as a `RuntimeError`, with its causes.
pub fn runtime_err(e: &(dyn std::error::Error + 'static)) -> PyErr {
    PyRuntimeError::new_err(chain(e))
}
