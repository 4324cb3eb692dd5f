//! Prometheus metrics: counters and latency histograms, rendered as text at `/metrics`.
//!
//! A key design decision made here is to write the few metrics by hand with atomics instead
//! of pulling in a metrics crate: the exposition format is a handful of lines, and the
//! server's hot path only increments integers.

use std::fmt::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the latency histograms' buckets, in seconds.
const BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A latency histogram with fixed buckets.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Count per bucket (not cumulative), the last one for +Inf.
    counts: [AtomicU64; BUCKETS.len() + 1],
    sum_micros: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = BUCKETS
            .iter()
            .position(|&b| s <= b)
            .unwrap_or(BUCKETS.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut acc = 0u64;
        for (i, c) in self.counts.iter().enumerate() {
            acc += c.load(Ordering::Relaxed);
            let le = BUCKETS.get(i).map_or("+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {acc}");
        }
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {acc}");
    }
}

/// Metrics the server does not keep itself (the hybrid executor's per-device counters),
/// appended to `/metrics` at every scrape.
pub trait MetricsSource: Send + Sync + fmt::Debug {
    /// Appends Prometheus text exposition lines, `# HELP` and `# TYPE` included, to `out`.
    fn render(&self, out: &mut String);

    /// The experts held on an accelerator per MoE layer, for the live view (`None`: the
    /// experts live on the CPU only).
    fn resident_experts(&self) -> Option<Vec<Vec<u32>>> {
        None
    }

    /// The exposition text and the resident experts of one moment, for the live view, which
    /// shows the count and the experts side by side: a source whose text counts the resident
    /// experts overrides it so both come from one look at the cache (read apart, an expert
    /// copied in between made them disagree).
    fn snapshot(&self) -> (String, Option<Vec<Vec<u32>>>) {
        let mut text = String::new();
        self.render(&mut text);
        (text, self.resident_experts())
    }
}

/// The server's metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Chat completion requests received.
    pub chat_requests: AtomicU64,
    /// Completion requests received.
    pub completion_requests: AtomicU64,
    /// Requests answered with an error status.
    pub errors: AtomicU64,
    /// Prompt tokens of accepted requests.
    pub prompt_tokens: AtomicU64,
    /// Tokens generated.
    pub generated_tokens: AtomicU64,
    /// Time from a request's arrival to its first token.
    pub ttft: Histogram,
    /// Time between consecutive tokens of one sequence.
    pub itl: Histogram,
}

impl Metrics {
    /// Prometheus text exposition, with the scheduler's current queue depth and active
    /// sequences.
    pub fn render(&self, queued: usize, active: usize) -> String {
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        };
        let _ = writeln!(
            out,
            "# HELP strata_requests_total Generation requests received.\n\
             # TYPE strata_requests_total counter\n\
             strata_requests_total{{endpoint=\"chat_completions\"}} {}\n\
             strata_requests_total{{endpoint=\"completions\"}} {}",
            self.chat_requests.load(Ordering::Relaxed),
            self.completion_requests.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "strata_request_errors_total",
            "Requests answered with an error status.",
            self.errors.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "strata_prompt_tokens_total",
            "Prompt tokens of accepted requests.",
            self.prompt_tokens.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "strata_generation_tokens_total",
            "Tokens generated.",
            self.generated_tokens.load(Ordering::Relaxed),
        );
        self.ttft.render(
            &mut out,
            "strata_time_to_first_token_seconds",
            "Time from a request's arrival to its first generated token.",
        );
        self.itl.render(
            &mut out,
            "strata_inter_token_latency_seconds",
            "Time between consecutive generated tokens of one sequence.",
        );
        let _ = writeln!(
            out,
            "# HELP strata_queue_depth Requests waiting for a place in the batch.\n\
             # TYPE strata_queue_depth gauge\nstrata_queue_depth {queued}\n\
             # HELP strata_active_sequences Sequences in the running batch.\n\
             # TYPE strata_active_sequences gauge\nstrata_active_sequences {active}"
        );
        out
    }
}

/// The scheduler's KV memory on `/metrics`: prompt tokens served from the prefix cache and
/// prefilled, what the prefix cache holds now and its budget, and what the running
/// sequences' own caches hold (0 when the batch is empty: a leak shows there).
pub fn render_prefix_cache(out: &mut String, s: &strata_runtime::scheduler::Scheduler) {
    let (bytes, blocks) = s.prefix_cache_usage();
    let _ = writeln!(
        out,
        "# HELP strata_prefix_cache_hit_tokens_total Prompt tokens served from the prefix cache.\n\
         # TYPE strata_prefix_cache_hit_tokens_total counter\n\
         strata_prefix_cache_hit_tokens_total {}\n\
         # HELP strata_prompt_prefilled_tokens_total Prompt tokens run through the model.\n\
         # TYPE strata_prompt_prefilled_tokens_total counter\n\
         strata_prompt_prefilled_tokens_total {}\n\
         # HELP strata_prefix_cache_bytes Bytes of the prefix cache slots holding KV rows (a block each).\n\
         # TYPE strata_prefix_cache_bytes gauge\nstrata_prefix_cache_bytes {bytes}\n\
         # HELP strata_prefix_cache_blocks Blocks the prefix cache holds.\n\
         # TYPE strata_prefix_cache_blocks gauge\nstrata_prefix_cache_blocks {blocks}\n\
         # HELP strata_prefix_cache_budget_bytes Most bytes the prefix cache may hold.\n\
         # TYPE strata_prefix_cache_budget_bytes gauge\nstrata_prefix_cache_budget_bytes {}\n\
         # HELP strata_kv_cache_bytes Bytes of KV cache held by the running sequences.\n\
         # TYPE strata_kv_cache_bytes gauge\nstrata_kv_cache_bytes {}",
        s.cached_tokens(),
        s.prefilled_tokens(),
        s.config().prefix_cache_bytes,
        s.kv_cache_bytes(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_millis(30));
        h.observe(Duration::from_secs(100));
        let mut out = String::new();
        h.render(&mut out, "x", "help");
        assert!(out.contains("x_bucket{le=\"0.001\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"0.025\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"0.05\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.contains("x_count 3\n"), "{out}");
        assert!(out.contains("x_sum 100.0305\n"), "{out}");
    }
}
