//! `LLM(expert_cache=...)`: the SSD tier from Python, as the command line's `--expert-cache`
//! runs it (the same rule, [`ExpertCache::choose`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use strata_exec::{ExpertCache, SsdOptions, SsdStats, SsdTier};
use strata_model::LoadOptions;
use strata_model::memory::MemoryPlan;
use strata_policy::replacement::Replacement;
use strata_runtime::engine::Engine;
use strata_server::metrics::MetricsSource;

use crate::errors::{chain, runtime_err};

/// What was asked of the expert cache.
pub struct Settings {
    cache: ExpertCache,
    rule: Replacement,
    /// The pin trace's expert activation counts.
    pin_profile: Option<Vec<Vec<u64>>>,
}

/// `expert_cache` (`None` or `'auto'`, `'off'`, a size such as `'6GiB'`, or bytes),
/// `expert_cache_rule` (`'lfu'`, the default, `'lru'`, `'ema'` or `'ema:ALPHA'`) and
/// `expert_cache_pin` (a routing trace whose most used experts are pinned).
pub fn options(
    cache: Option<&Bound<'_, PyAny>>,
    rule: Option<&str>,
    pin: Option<PathBuf>,
) -> PyResult<Settings> {
    let cache = match cache {
        None => ExpertCache::Auto,
        Some(c) => match c.extract::<u64>() {
            Ok(0) => {
                return Err(PyValueError::new_err(
                    "expert_cache 0: give a size, or 'off'",
                ));
            }
            Ok(bytes) => ExpertCache::Size(bytes),
            Err(_) => {
                let s: String = c.extract().map_err(|_| {
                    PyValueError::new_err(
                        "expert_cache: expected 'auto', 'off', a size such as '6GiB' or bytes",
                    )
                })?;
                ExpertCache::parse(&s)
                    .map_err(|e| PyValueError::new_err(format!("expert_cache {e}")))?
            }
        },
    };
    let rule = match rule {
        None => Replacement::Lfu,
        Some(r) => Replacement::parse(r).ok_or_else(|| {
            PyValueError::new_err(format!(
                "expert_cache_rule {r}: expected {}",
                Replacement::NAMES
            ))
        })?,
    };
    let pin_profile = match pin {
        None => None,
        Some(_) if cache == ExpertCache::Off => {
            return Err(PyValueError::new_err(
                "expert_cache_pin pins experts in the expert cache, which expert_cache='off' \
                 turns off",
            ));
        }
        Some(trace) => Some(
            strata_exec::pin_profile_from_trace(&trace)
                .map_err(|e| PyValueError::new_err(chain(&e)))?,
        ),
    };
    Ok(Settings {
        cache,
        rule,
        pin_profile,
    })
}

/// Puts the routed experts of `engine`'s CPU model (loaded from `model`) behind the SSD tier
/// when `cache` asks for it, or is `Auto` and they do not fit in memory; says why on stderr,
/// as the command line does.
pub fn attach(
    py: Python<'_>,
    engine: &mut Engine,
    model: &Path,
    settings: &Settings,
) -> PyResult<Option<Arc<SsdTier>>> {
    let Some(cpu) = engine.model.cpu_model_mut() else {
        return Ok(None);
    };
    let file = strata_model::model::mapped_file(model);
    let attach = || -> strata_exec::Result<Option<Arc<SsdTier>>> {
        let plan = || Ok::<_, strata_exec::Error>(cpu.memory());
        let Some(choice) = settings.cache.choose(&file, settings.rule, plan)? else {
            return Ok(None);
        };
        if let Some(note) = choice.note {
            eprintln!("[expert cache: {note}]");
        }
        let opts = SsdOptions {
            pin_profile: settings.pin_profile.clone(),
            ..choice.options
        };
        let tier = strata_exec::attach_ssd_tier(cpu, &file, &opts)?;
        say_notes(&tier);
        Ok(Some(tier))
    };
    py.detach(attach).map_err(|e| match e {
        strata_exec::Error::Config(_) => {
            PyValueError::new_err(format!("expert_cache on {}: {}", file.display(), chain(&e)))
        }
        e => runtime_err(&e),
    })
}

/// The DRAM expert cache below the accelerator's (`device='hybrid'`, three tiers) for
/// `model` loaded as `load`: its settings when `cache` asks for one, or is `Auto` and the
/// routed experts do not fit in memory; says why on stderr, as the command line does.
pub fn for_hybrid(
    py: Python<'_>,
    model: &Path,
    settings: &Settings,
    load: LoadOptions,
) -> PyResult<Option<SsdOptions>> {
    let file = strata_model::model::mapped_file(model);
    let plan = || -> strata_model::Result<MemoryPlan> {
        let (config, src) = strata_model::model::open(model)?;
        Ok(MemoryPlan::of(&config, &src, load))
    };
    let (cache, rule) = (settings.cache, settings.rule);
    let choice = py.detach(|| cache.choose(&file, rule, plan)).map_err(|e| {
        PyValueError::new_err(format!("expert_cache on {}: {}", file.display(), chain(&e)))
    })?;
    Ok(choice.map(|c| {
        if let Some(note) = c.note {
            eprintln!("[expert cache: {note}]");
        }
        SsdOptions {
            pin_profile: settings.pin_profile.clone(),
            ..c.options
        }
    }))
}

/// The tier's counters on `/metrics` (`python -m strata serve`), as `strata serve` shows them.
pub fn metrics(tier: Arc<SsdTier>) -> Arc<dyn MetricsSource> {
    Arc::new(SsdMetrics(tier))
}

#[derive(Debug)]
struct SsdMetrics(Arc<SsdTier>);

impl MetricsSource for SsdMetrics {
    fn render(&self, out: &mut String) {
        self.0.stats().write_prometheus(out);
    }
}

/// What the tier says once, at start, as the command line says it
/// ([`SsdTier::start_notes`]).
pub fn say_notes(tier: &SsdTier) {
    for note in tier.start_notes() {
        eprintln!("[expert cache: {note}]");
    }
}

/// The tier's statistics as `LLM.expert_cache_stats()` returns them: every field of
/// [`SsdStats`] under its name (destructured whole, so a new field does not compile until it
/// is added here), with `hit_rate` and `guess_recall`.
pub fn stats<'py>(py: Python<'py>, tier: &SsdTier) -> PyResult<Bound<'py, PyDict>> {
    let s = py.detach(|| tier.stats());
    let (hit_rate, guess_recall) = (s.hit_rate(), s.guess_recall());
    let SsdStats {
        lookups,
        hits,
        in_flight,
        misses,
        prefetched,
        guess_lookups,
        guessed,
        bytes_read,
        device_reads,
        device_hits,
        device_bytes_read,
        read_seconds,
        wait_seconds,
        direct_io,
        io_uring,
        pinned,
        slots,
        slots_used,
        slot_bytes,
        top30_share,
    } = s;
    let d = PyDict::new(py);
    let counts = [
        ("lookups", lookups),
        ("hits", hits),
        ("in_flight", in_flight),
        ("misses", misses),
        ("prefetched", prefetched),
        ("guess_lookups", guess_lookups),
        ("guessed", guessed),
        ("bytes_read", bytes_read),
        ("device_reads", device_reads),
        ("device_hits", device_hits),
        ("device_bytes_read", device_bytes_read),
        ("slots", slots as u64),
        ("slots_used", slots_used as u64),
        ("slot_bytes", slot_bytes as u64),
    ];
    for (k, v) in counts {
        d.set_item(k, v)?;
    }
    d.set_item("read_seconds", read_seconds)?;
    d.set_item("wait_seconds", wait_seconds)?;
    d.set_item("direct_io", direct_io)?;
    d.set_item("io_uring", io_uring)?;
    d.set_item("pinned_experts", pinned.experts as u64)?;
    d.set_item("pinned_bytes", pinned.bytes)?;
    d.set_item("pinned_seconds", pinned.seconds)?;
    d.set_item("top30_share", top30_share)?;
    d.set_item("hit_rate", hit_rate)?;
    d.set_item("guess_recall", guess_recall)?;
    Ok(d)
}
