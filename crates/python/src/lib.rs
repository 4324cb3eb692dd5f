//! Strata from Python (the native module `strata._strata`; the `strata` package in
//! `python/strata` wraps it): `strata.LLM` over the engine the command line runs,
//! `strata.ops` over the CPU expert kernels, and `python -m strata serve`.
//!
//! Errors are Python exceptions carrying the Rust message: `TypeError` for a wrong kind of
//! argument (dtype, device, neither DLPack nor a buffer), `ValueError` for a wrong value (shape, layout, format),
//! `RuntimeError` for a failure while loading or running a model.
//!
//! ```python
//! import numpy as np
//! import strata
//!
//! llm = strata.LLM("../shared/models/strata-tiny-moe")
//! (out,) = llm.generate("Once upon a time", strata.SamplingParams(temperature=0, max_tokens=16))
//! print(out.outputs[0].text, out.outputs[0].finish_reason)
//!
//! # The CPU expert kernels on NumPy arrays: 4 experts, hidden 128, intermediate 64, top-2.
//! rng = np.random.default_rng(0)
//! w13 = rng.standard_normal((4, 128, 128), dtype=np.float32)  # [E, 2 I, H]: gate then up
//! w2 = rng.standard_normal((4, 128, 64), dtype=np.float32)    # [E, H, I]
//! x = rng.standard_normal((3, 128), dtype=np.float32)          # [T, H]
//! ids = np.array([[0, 1], [2, 3], [1, 2]], dtype=np.int32)    # [T, k]
//! w = np.full((3, 2), 0.5, dtype=np.float32)
//! y = strata.ops.fused_moe(x, strata.ops.MoeWeights(w2, w13=w13, format="int8"), w, ids)
//! ```

#![deny(missing_docs)]

mod buffer;
mod dlpack;
mod errors;
mod expert_cache;
mod ggml;
mod hybrid;
mod llm;
mod ops;

use pyo3::prelude::*;

/// The native module.
#[pymodule]
fn _strata(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ops::MoeWeights>()?;
    m.add_function(wrap_pyfunction!(ops::fused_moe_into, m)?)?;
    m.add_function(wrap_pyfunction!(ops::num_threads, m)?)?;
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
