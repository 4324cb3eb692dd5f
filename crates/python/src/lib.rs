//! Strata from Python (the native module `strata._strata`; the `strata` package in
//! `python/strata` wraps it): `strata.LLM` over the engine the command line runs,
//! `strata.ops` over the CPU expert kernels, and `python -m strata serve`.
//!
//! Errors are Python exceptions carrying the Rust message: `TypeError` for a wrong kind of
//! argument (dtype, no buffer), `ValueError` for a wrong value (shape, layout, format),
//! `RuntimeError` for a failure while loading or running a model.

mod buffer;
mod llm;
mod ops;

use pyo3::prelude::*;

/// The native module.
#[pymodule]
fn _strata(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ops::MoeWeights>()?;
    m.add_function(wrap_pyfunction!(ops::fused_moe_into, m)?)?;
    m.add_class::<llm::Llm>()?;
    m.add_class::<llm::SamplingParams>()?;
    m.add_class::<llm::RequestOutput>()?;
    m.add_class::<llm::CompletionOutput>()?;
    m.add_function(wrap_pyfunction!(llm::serve, m)?)?;
    // Benchmarks refuse a dev build: its kernels are compiled at opt-level 1 (the
    // workspace's dev profile) and run several times slower than a release build's.
    m.add(
        "build_profile",
        if cfg!(debug_assertions) {
            "dev"
        } else {
            "release"
        },
    )?;
    Ok(())
}
