//! The SSD tier's counters in Prometheus' text exposition, for `/metrics` (the command
//! line's `strata serve` and Python's `serve` both show them).

use super::SsdStats;

/// Appends one metric in Prometheus text exposition: its help and type lines, then a sample
/// per `(labels, value)`.
pub fn write_metric(out: &mut String, name: &str, kind: &str, help: &str, values: &[(&str, f64)]) {
    use std::fmt::Write;
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, v) in values {
        let _ = writeln!(out, "{name}{labels} {v}");
    }
}

impl SsdStats {
    /// Appends the counters to `out`.
    pub fn write_prometheus(&self, out: &mut String) {
        let s = self;
        let mut metric = |name: &str, kind: &str, help: &str, values: &[(&str, f64)]| {
            write_metric(out, name, kind, help, values)
        };
        metric(
            "strata_expert_cache_lookups_total",
            "counter",
            "Routed experts looked up in the DRAM expert cache: ready (hit), being read \
             ahead (in_flight), or read on demand (miss).",
            &[
                ("{result=\"hit\"}", s.hits as f64),
                ("{result=\"in_flight\"}", s.in_flight as f64),
                ("{result=\"miss\"}", s.misses as f64),
            ],
        );
        metric(
            "strata_expert_cache_prefetched_total",
            "counter",
            "Experts read ahead on the next layer's router applied early.",
            &[("", s.prefetched as f64)],
        );
        metric(
            "strata_expert_cache_guess_lookups_total",
            "counter",
            "Experts used in MoE layers the layer before guessed for.",
            &[("", s.guess_lookups as f64)],
        );
        metric(
            "strata_expert_cache_guessed_total",
            "counter",
            "Of those, the experts the guess named.",
            &[("", s.guessed as f64)],
        );
        metric(
            "strata_expert_cache_read_bytes_total",
            "counter",
            "Bytes of experts read from the model file.",
            &[("", s.bytes_read as f64)],
        );
        metric(
            "strata_expert_cache_device_reads_total",
            "counter",
            "Experts the accelerator's expert cache took from this cache (three tiers): \
             copied from a slot (cache) or read from the model file for it (file).",
            &[
                ("{source=\"cache\"}", s.device_hits as f64),
                ("{source=\"file\"}", (s.device_reads - s.device_hits) as f64),
            ],
        );
        metric(
            "strata_expert_cache_device_read_bytes_total",
            "counter",
            "Bytes read from the model file for the accelerator's expert cache.",
            &[("", s.device_bytes_read as f64)],
        );
        metric(
            "strata_expert_cache_wait_seconds_total",
            "counter",
            "Time forward passes waited for expert reads.",
            &[("", s.wait_seconds)],
        );
        metric(
            "strata_expert_cache_bytes",
            "gauge",
            "Bytes of the expert cache's slots (allocated at start).",
            &[("", (s.slots * s.slot_bytes) as f64)],
        );
        metric(
            "strata_expert_cache_pinned_experts",
            "gauge",
            "Experts read into the cache at start and never evicted (a routing trace's \
             most used).",
            &[("", s.pinned.experts as f64)],
        );
    }
}
