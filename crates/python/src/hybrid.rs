//! `strata.LLM(device='hybrid')`: the hybrid executor's settings from the keywords (the
//! command line's `--policy`, `--vram-budget`, `--hardware`, `--defer` and `--profile`) and
//! its statistics as a dict (`LLM.stats()`).

use std::path::PathBuf;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use strata_exec::{ExecStats, HybridExecutor, HybridOptions, PolicyKind};

use crate::errors::{chain, runtime_err};

/// The hybrid executor's settings from `strata.LLM`'s keywords: the policy by its name
/// (`gpu-lru` when none), `vram_budget` as bytes or a size string (`'64MiB'`), `hardware`
/// a preset or file, `defer` the experts deferred per token, `profile` a routing trace
/// (read by `load_hybrid`). Deferral with another policy than ktransformers is refused
/// here, before the model loads ([`strata_exec::PolicyOptions::check_policy`]).
pub fn options(
    policy: Option<&str>,
    vram_budget: Option<&Bound<'_, PyAny>>,
    hardware: Option<&str>,
    defer: Option<usize>,
    profile: Option<PathBuf>,
) -> PyResult<HybridOptions> {
    let value_err =
        |what: &str, e: &dyn std::error::Error| PyValueError::new_err(format!("{what}: {e}"));
    let kind = match policy {
        Some(p) => p
            .parse::<PolicyKind>()
            .map_err(|e| value_err("policy", &e))?,
        None => PolicyKind::GpuLru,
    };
    let mut opts = HybridOptions::new(kind).map_err(|e| runtime_err(&e))?;
    if let Some(b) = vram_budget {
        opts.vram_budget = budget_bytes(b)?;
    }
    if let Some(h) = hardware {
        opts.hardware = strata_policy::Hardware::load(h).map_err(|e| value_err("hardware", &e))?;
        opts.measure = false;
    }
    opts.policy_options.deferred = defer.unwrap_or(0);
    opts.policy_options
        .check_policy(kind)
        .map_err(|e| PyValueError::new_err(chain(&e)))?;
    opts.profile = profile;
    Ok(opts)
}

/// `vram_budget` (`device='hybrid'` or `'gpu'`): a number of bytes or a size string
/// (`'64MiB'`).
pub fn budget_bytes(b: &Bound<'_, PyAny>) -> PyResult<u64> {
    if let Ok(n) = b.extract::<u64>() {
        Ok(n)
    } else if let Ok(s) = b.extract::<String>() {
        strata_accel::parse_bytes(&s)
            .map_err(|e| PyValueError::new_err(format!("vram_budget: {e}")))
    } else {
        Err(PyTypeError::new_err(
            "vram_budget: expected a number of bytes or a size such as '64MiB'",
        ))
    }
}

/// A failure of `strata_exec::load_hybrid` as a Python error: a `ValueError` where the
/// settings are wrong (policy, deferral, profile), a `RuntimeError` otherwise.
pub fn load_err(e: strata_exec::Error) -> PyErr {
    match e {
        strata_exec::Error::Config(_)
        | strata_exec::Error::Policy(_)
        | strata_exec::Error::Trace(_) => PyValueError::new_err(chain(&e)),
        e => runtime_err(&e),
    }
}

/// `exec`'s statistics since it was attached, as `LLM.stats()` returns them: the policy's
/// name, every counter of [`ExecStats`] under its field's name (destructured whole, so a
/// new field does not compile until it is added here), `hit_rate`, and the times in
/// seconds (`gpu_time_s`, `cpu_time_s`).
pub fn stats<'py>(py: Python<'py>, exec: &HybridExecutor) -> PyResult<Bound<'py, PyDict>> {
    let s = py.detach(|| exec.stats());
    let hit_rate = s.hit_rate();
    let ExecStats {
        steps,
        layers,
        gpu_experts,
        cpu_experts,
        gpu_pairs,
        cpu_pairs,
        deferred_experts,
        hits,
        misses,
        uploads,
        upload_bytes,
        initial_uploads,
        staged,
        prefetched,
        evictions,
        refused_transfers,
        fallbacks,
        peak_resident,
        slot_bytes_allocated,
        gpu_time,
        cpu_time,
    } = s;
    let d = PyDict::new(py);
    d.set_item("policy", exec.policy_name())?;
    let counts = [
        ("steps", steps),
        ("layers", layers),
        ("gpu_experts", gpu_experts),
        ("cpu_experts", cpu_experts),
        ("gpu_pairs", gpu_pairs),
        ("cpu_pairs", cpu_pairs),
        ("deferred_experts", deferred_experts),
        ("hits", hits),
        ("misses", misses),
        ("uploads", uploads),
        ("initial_uploads", initial_uploads),
        ("staged", staged),
        ("prefetched", prefetched),
        ("evictions", evictions),
        ("refused_transfers", refused_transfers),
        ("fallbacks", fallbacks),
        ("peak_resident", peak_resident),
    ];
    for (k, v) in counts {
        d.set_item(k, v)?;
    }
    d.set_item("upload_bytes", upload_bytes)?;
    d.set_item("slot_bytes_allocated", slot_bytes_allocated)?;
    d.set_item("hit_rate", hit_rate)?;
    d.set_item("gpu_time_s", gpu_time.as_secs_f64())?;
    d.set_item("cpu_time_s", cpu_time.as_secs_f64())?;
    Ok(d)
}
