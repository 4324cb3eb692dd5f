//! `strata serve`: the OpenAI-compatible HTTP server.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use clap::Args;
use strata_exec::{HybridExecutor, SsdTier, write_metric};
use strata_runtime::engine::Engine;
use strata_runtime::scheduler::{SchedulerConfig, SchedulerLimits, Spelling};
use strata_server::AppState;
use strata_server::metrics::MetricsSource;

use crate::model_arg::{DeviceArgs, LoadedEngine, ModelArgs};

/// Arguments of `strata serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sched: SchedArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Port to listen on (0 picks a free one, printed in the log).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Model id clients must name (default: the model's file or directory name).
    #[arg(long, value_name = "NAME")]
    served_model_name: Option<String>,
    // Last: its help headings would otherwise take in the options after it.
    #[command(flatten)]
    device: DeviceArgs,
}

/// Scheduler limits shared by `serve` and `batch`.
#[derive(Debug, Args)]
pub struct SchedArgs {
    /// Most sequences decoded together.
    #[arg(long, default_value_t = 16)]
    max_batch: usize,
    /// Most requests waiting for a place in the batch; more are answered 429.
    #[arg(long, default_value_t = 256)]
    max_queue: usize,
    /// Context length per sequence (default and maximum: the model's).
    #[arg(long, value_name = "N")]
    ctx_size: Option<usize>,
    /// Tokens per forward step: decodes plus prompt chunks; bounds how long a long prompt
    /// delays the running decodes.
    #[arg(long, default_value_t = 512)]
    step_tokens: usize,
    /// Memory for the shared prefix cache, in MiB (0 disables it): KV rows of prompt
    /// prefixes seen before (a long system prompt), reused instead of prefilled again.
    /// Counted in the memory admission next to the batch's contexts.
    #[arg(long, value_name = "MIB", default_value_t = 1024)]
    prefix_cache_mb: usize,
}

impl SchedArgs {
    /// The checked scheduler limits for `engine` ([`SchedulerLimits::admit`]): a full
    /// batch's contexts and the prefix cache must fit in the memory available now.
    pub fn config(&self, engine: &Engine) -> anyhow::Result<SchedulerConfig> {
        let limits = SchedulerLimits {
            max_batch: self.max_batch,
            max_queue: self.max_queue,
            step_tokens: self.step_tokens,
            ctx_size: self.ctx_size,
            prefix_cache_mb: self.prefix_cache_mb,
        };
        Ok(limits.admit(engine, Spelling::Flags)?)
    }
}

/// The model id: the file name without `.gguf`, or the directory name.
pub fn model_id(path: &Path) -> String {
    let name = if path.is_file() {
        path.file_stem()
    } else {
        path.file_name()
    };
    name.map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned())
}

/// Loads the engine for `serve` and `batch` on `--device` ([`DeviceArgs::load_engine`]),
/// logging what it did.
pub fn load_engine(
    model: &ModelArgs,
    device: &DeviceArgs,
    path: &Path,
) -> anyhow::Result<LoadedEngine> {
    let loaded = device.load_engine(model, path)?;
    tracing::info!(
        seconds = loaded.took.as_secs_f64(),
        device = loaded.engine.model.device(),
        "model loaded"
    );
    if let Some(exec) = &loaded.hybrid {
        tracing::info!(policy = %exec.policy_name(), "routed experts on the hybrid executor");
    }
    if let Some(tier) = &loaded.ssd {
        let s = tier.stats();
        tracing::info!(
            slots = s.slots,
            mib = (s.slots * s.slot_bytes) as f64 / (1u64 << 20) as f64,
            "routed experts read from the file into the expert cache"
        );
    }
    Ok(loaded)
}

/// The SSD tier's counters on `/metrics`.
#[derive(Debug)]
struct SsdMetrics(Arc<SsdTier>);

impl MetricsSource for SsdMetrics {
    fn render(&self, out: &mut String) {
        self.0.stats().write_prometheus(out);
    }
}

/// What `/metrics` adds for the engine's executor: the hybrid executor's or the SSD tier's
/// counters.
fn executor_metrics(loaded: &LoadedEngine) -> Option<Arc<dyn MetricsSource>> {
    if let Some(exec) = &loaded.hybrid {
        return Some(Arc::new(ExecMetrics(exec.clone())));
    }
    let tier = loaded.ssd.as_ref()?;
    Some(Arc::new(SsdMetrics(tier.clone())))
}

/// The hybrid executor's counters on `/metrics`, per device where they are.
#[derive(Debug)]
struct ExecMetrics(Arc<HybridExecutor>);

impl MetricsSource for ExecMetrics {
    fn render(&self, out: &mut String) {
        self.render_with(out, &self.0.resident_experts());
    }

    fn resident_experts(&self) -> Option<Vec<Vec<u32>>> {
        Some(self.0.resident_experts())
    }

    fn snapshot(&self) -> (String, Option<Vec<Vec<u32>>>) {
        let resident = self.0.resident_experts();
        let mut text = String::new();
        self.render_with(&mut text, &resident);
        (text, Some(resident))
    }
}

impl ExecMetrics {
    /// The counters, with `resident` as the device cache's experts; the DRAM expert cache's
    /// too, under three tiers.
    fn render_with(&self, out: &mut String, resident: &[Vec<u32>]) {
        if let Some(tier) = self.0.host_tier() {
            SsdMetrics(tier).render(out);
        }
        let s = self.0.stats();
        let mut metric = |name: &str, kind: &str, help: &str, values: &[(&str, f64)]| {
            write_metric(out, name, kind, help, values)
        };
        let (gpu, cpu) = ("{device=\"gpu\"}", "{device=\"cpu\"}");
        metric(
            "strata_hybrid_experts_total",
            "counter",
            "Routed expert tasks run, by device.",
            &[(gpu, s.gpu_experts as f64), (cpu, s.cpu_experts as f64)],
        );
        metric(
            "strata_hybrid_expert_pairs_total",
            "counter",
            "(token, expert) pairs computed, by device.",
            &[(gpu, s.gpu_pairs as f64), (cpu, s.cpu_pairs as f64)],
        );
        metric(
            "strata_hybrid_busy_seconds_total",
            "counter",
            "Time each device spent on routed experts (the gpu's includes copies).",
            &[
                (gpu, s.gpu_time.as_secs_f64()),
                (cpu, s.cpu_time.as_secs_f64()),
            ],
        );
        metric(
            "strata_hybrid_cache_lookups_total",
            "counter",
            "GPU expert tasks whose weights were resident (hit) or had to be copied (miss).",
            &[
                ("{result=\"hit\"}", s.hits as f64),
                ("{result=\"miss\"}", s.misses as f64),
            ],
        );
        metric(
            "strata_hybrid_upload_bytes_total",
            "counter",
            "Bytes of expert weights copied to the device.",
            &[("", s.upload_bytes as f64)],
        );
        metric(
            "strata_hybrid_evictions_total",
            "counter",
            "Experts the policy evicted from the device cache.",
            &[("", s.evictions as f64)],
        );
        metric(
            "strata_hybrid_fallbacks_total",
            "counter",
            "GPU tasks run on the CPU because their weights were not on the device.",
            &[("", s.fallbacks as f64)],
        );
        metric(
            "strata_hybrid_deferred_experts_total",
            "counter",
            "Routed expert tasks whose output was added at the next MoE layer (expert deferral).",
            &[("", s.deferred_experts as f64)],
        );
        let resident: usize = resident.iter().map(Vec::len).sum();
        metric(
            "strata_hybrid_resident_experts",
            "gauge",
            "Experts held in the device's expert cache, all MoE layers.",
            &[("", resident as f64)],
        );
    }
}

/// Logs to stderr at info level (once per process), coloured only on a terminal: log
/// files and pipes get plain text.
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_max_level(tracing::Level::INFO)
        .try_init();
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    // Before any thread allocates: the prefix cache's budget must hold in resident memory.
    strata_kernels::limit_malloc_arenas(strata_server::MALLOC_ARENAS);
    init_logging();
    let path = args.model.dir()?;
    let loaded = load_engine(&args.model, &args.device, &path)?;
    let extra_metrics = executor_metrics(&loaded);
    let engine = Arc::new(loaded.engine);
    let config = args.sched.config(&engine)?;
    let id = args.served_model_name.unwrap_or_else(|| model_id(&path));
    let mut state = AppState::new(engine, config, id);
    state.extra_metrics = extra_metrics;
    let state = Arc::new(state);
    let addr = SocketAddr::new(args.host, args.port);
    strata_server::run(addr, state, strata_server::shutdown_signal())?;
    Ok(())
}
