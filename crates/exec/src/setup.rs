//! Building what the executor runs: the policy by name, its cost model for this model and
//! budget, and the installation behind a model's routed experts; [`load_hybrid`] does all
//! of it, for every front end (`--device hybrid`, `strata.LLM(device='hybrid')`).
//!
//! A key design decision: the cost model the policies see describes the expert cache, not
//! the whole accelerator. The device holds the model's other weights (the hybrid layout)
//! and the executor's expert slots, so the GPU memory of the hardware description is set to
//! exactly the cache's bytes plus what the cost model counts as resident dense weights, and
//! `CostModel::gpu_expert_budget` equals the cache the executor really has.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use strata_model::LoadOptions;
use strata_model::config::ModelConfig;
use strata_model::experts::ExpertSet;
use strata_model::model::{Model, mapped_file};
use strata_policy::policies::{Fiddler, GpuLru, HybriMoE, KTransformers, Smoe, SmoeEviction};
use strata_policy::predictor::LinearPredictor;
use strata_policy::{CostModel, Hardware, ModelShape, Policy};

use crate::{
    CpuFigures, DeviceFigures, Error, ExecOptions, GpuModel, HostExperts, HybridExecutor, Result,
    SsdOptions, SsdTier,
};

/// The policies the executor can run (`--policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyKind {
    /// Every routed expert on the GPU, per-layer LRU cache.
    GpuLru,
    /// Profile-pinned experts on the GPU, the rest where cheaper.
    Fiddler,
    /// Routed experts on the CPU, optional expert deferral.
    KTransformers,
    /// Score cache and earliest-finish CPU/GPU split.
    HybriMoE,
    /// On-demand prefill loading, LFU cache in decode.
    Smoe,
}

impl PolicyKind {
    /// Every kind, in `--policy` order.
    pub const ALL: [PolicyKind; 5] = [
        PolicyKind::GpuLru,
        PolicyKind::Fiddler,
        PolicyKind::KTransformers,
        PolicyKind::HybriMoE,
        PolicyKind::Smoe,
    ];

    /// The `--policy` name.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::GpuLru => "gpu-lru",
            PolicyKind::Fiddler => "fiddler",
            PolicyKind::KTransformers => "ktransformers",
            PolicyKind::HybriMoE => "hybrimoe",
            PolicyKind::Smoe => "smoe",
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PolicyKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<PolicyKind> {
        PolicyKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                Error::Config(format!(
                    "unknown policy `{s}`, expected one of gpu-lru, fiddler, ktransformers, hybrimoe, smoe"
                ))
            })
    }
}

/// Settings of the policies that take any.
#[derive(Debug, Clone, Default)]
pub struct PolicyOptions {
    /// KTransformers: experts deferred per token in decode (0: none).
    pub deferred: usize,
    /// Fiddler: activation counts `[moe_layer][expert]` to pin by; `None`: every expert
    /// counts once, so pinning fills the cache in layer order.
    pub profile: Option<Vec<Vec<u64>>>,
    /// SMoE: the token-wise predictor of each MoE layer (`None`: no decode prefetch).
    pub predictors: Option<Vec<Option<LinearPredictor>>>,
}

impl PolicyOptions {
    /// Fails unless these settings fit policy `kind` on a model of `shape`: deferral only
    /// with KTransformers, a profile of `[moe_layers][n_experts]` counts, one predictor per
    /// MoE layer over the model's hidden width.
    pub fn check(&self, kind: PolicyKind, shape: &ModelShape) -> Result<()> {
        self.check_policy(kind)?;
        let (layers, experts) = (shape.moe_layers(), shape.n_experts);
        if let Some(p) = &self.profile
            && (p.len() != layers || p.iter().any(|l| l.len() != experts))
        {
            return Err(Error::Config(format!(
                "a profile of {} moe layers x {} experts, the model has {layers} x {experts}",
                p.len(),
                p.first().map_or(0, Vec::len)
            )));
        }
        if let Some(preds) = &self.predictors {
            if preds.len() != layers {
                return Err(Error::Config(format!(
                    "predictors for {} moe layers, the model has {layers}",
                    preds.len()
                )));
            }
            if let Some(d) = preds
                .iter()
                .flatten()
                .map(LinearPredictor::dim)
                .find(|&d| d != shape.hidden)
            {
                return Err(Error::Config(format!(
                    "predictors over hidden states of width {d}, the model's are {}",
                    shape.hidden
                )));
            }
        }
        Ok(())
    }

    /// The part of [`Self::check`] that needs no model: deferral only with KTransformers.
    /// Front ends call it before loading the model, so that the mistake costs no load.
    pub fn check_policy(&self, kind: PolicyKind) -> Result<()> {
        if self.deferred > 0 && kind != PolicyKind::KTransformers {
            return Err(Error::Config(format!(
                "expert deferral (defer {}) applies only with policy ktransformers, not {kind}",
                self.deferred
            )));
        }
        Ok(())
    }

    /// Learns from the routing trace at `path` (`strata trace`): its expert activation
    /// counts become the profile and, when it holds hidden states, it trains the
    /// predictors; then checks the result against policy `kind` on a model of `shape`
    /// (an error that names the trace).
    fn read_profile(&mut self, path: &Path, kind: PolicyKind, shape: &ModelShape) -> Result<()> {
        let (_, w) = strata_sim::trace::read_file(path)?;
        self.profile = Some(w.profile());
        if w.hidden_dim > 0 {
            let (preds, _accuracy) = strata_sim::reproduce::train_predictors(&w, w.top_k)?;
            self.predictors = Some(preds);
        }
        self.check(kind, shape)
            .map_err(|e| Error::Config(format!("profile {}: {e}", path.display())))
    }
}

/// The policy `kind` for a cache priced by `cost`. Per-layer caches (GPU-LRU, HybriMoE,
/// SMoE) get `cost.cache_slots_per_layer()` slots; SMoE prefetches with the given
/// predictors (none: no token-wise prefetch), HybriMoE one expert of the next layer.
pub fn build_policy(
    kind: PolicyKind,
    cost: &CostModel,
    opts: &PolicyOptions,
) -> Box<dyn Policy + Send> {
    let slots = cost.cache_slots_per_layer();
    let layers = cost.model.moe_layers();
    match kind {
        PolicyKind::GpuLru => Box::new(GpuLru::new(slots)),
        PolicyKind::Fiddler => Box::new(Fiddler::new(
            opts.profile
                .clone()
                .unwrap_or_else(|| vec![vec![1; cost.model.n_experts]; layers]),
        )),
        PolicyKind::KTransformers => Box::new(KTransformers::new(opts.deferred)),
        PolicyKind::HybriMoE => Box::new(HybriMoE::new(slots, 1)),
        PolicyKind::Smoe => Box::new(Smoe::new(
            slots,
            cost.model.top_k,
            SmoeEviction::Adaptive,
            opts.predictors
                .clone()
                .unwrap_or_else(|| vec![None; layers]),
        )),
    }
}

/// The cost model's view of `config` ([`ModelConfig::moe_shape`]; attention is not priced
/// because it stays on the CPU).
pub fn model_shape(config: &ModelConfig) -> Result<ModelShape> {
    let s = config
        .moe_shape()
        .ok_or_else(|| Error::Config("the model has no mixture-of-experts layer".into()))?;
    Ok(ModelShape {
        hidden: s.hidden,
        moe_intermediate: s.moe_intermediate,
        n_experts: s.n_experts,
        top_k: s.top_k,
        n_shared: s.n_shared,
        n_layers: s.n_layers,
        dense_layers: s.dense_layers,
        dense_intermediate: s.dense_intermediate,
        attn_params: s.attn_params as u64,
        n_heads: s.n_heads,
        head_dim: s.head_dim,
        kv_dim: s.kv_elems,
        vocab: s.vocab,
        source: "the model's config (strata-model)".into(),
    })
}

/// A preset name (`deepseek-v3`, ...) or a real model (a `config.json`, a model directory,
/// a `.gguf` or converted file), whose config `strata-model` reads and normalises.
pub fn resolve_model_shape(name_or_path: &str) -> Result<ModelShape> {
    if let Ok(preset) = ModelShape::load(name_or_path) {
        return Ok(preset);
    }
    let path = Path::new(name_or_path);
    if !path.exists() {
        // The preset error names the known presets.
        return Ok(ModelShape::load(name_or_path)?);
    }
    let config = if path.file_name().is_some_and(|n| n == "config.json") {
        ModelConfig::load(path)?
    } else {
        strata_model::model::open(path)?.0
    };
    let mut shape = model_shape(&config)?;
    shape.source = path.display().to_string();
    Ok(shape)
}

/// A cost model over `hw` whose GPU expert budget is `cache_bytes`, with experts of
/// `expert_bits` bits per weight as the device stores them.
pub fn cost_model(
    mut hw: Hardware,
    shape: ModelShape,
    expert_bits: f64,
    cache_bytes: u64,
) -> Result<CostModel> {
    let probe = CostModel::new(hw.clone(), shape.clone(), expert_bits, 16.0)?;
    hw.gpu.mem_bytes = (cache_bytes + probe.gpu_weight_bytes()) as f64;
    hw.gpu.reserve_bytes = 0.0;
    let cost = CostModel::new(hw, shape, expert_bits, 16.0)?;
    debug_assert_eq!(cost.gpu_expert_budget(), cache_bytes);
    Ok(cost)
}

/// How [`load_hybrid`] runs a model's routed experts: what `--device hybrid` and
/// `strata.LLM(device='hybrid')` take, as values (their front ends parse the names; the
/// profile is read here, by [`load_hybrid`], for both).
#[derive(Debug, Clone)]
pub struct HybridOptions {
    /// The placement policy.
    pub policy: PolicyKind,
    /// Accelerator memory for the expert cache and its staging slots, in bytes.
    pub vram_budget: u64,
    /// The machine whose CPU and GPU speeds price the policy's choices; its GPU memory is
    /// replaced by the cache that `vram_budget` gives.
    pub hardware: Hardware,
    /// Whether [`load_hybrid`] replaces `hardware`'s GPU and link rates with what the
    /// accelerator measures for one of the model's experts ([`DeviceFigures`]), and its CPU
    /// expert times with what the CPU's kernels measure ([`CpuFigures`]): set when
    /// no machine was named. Applied on a real GPU only: a CPU adapter's (lavapipe's)
    /// figures say nothing of a GPU and would make placement depend on the host's load.
    pub measure: bool,
    /// The policy's settings (deferral, profile, predictors), checked against the model.
    pub policy_options: PolicyOptions,
    /// A routing trace (`strata trace`; `--profile`, `profile=`) to learn from: its expert
    /// activation counts replace `policy_options.profile` (Fiddler's pinned experts) and,
    /// when it holds hidden states, it trains `policy_options.predictors` (SMoE's).
    pub profile: Option<PathBuf>,
    /// Three tiers: the routed experts read from the model file into a DRAM expert cache
    /// of these settings ([`SsdTier`]), below the device's; `None`: they stay mapped.
    pub expert_cache: Option<SsdOptions>,
}

impl HybridOptions {
    /// The accelerator memory given to the experts when none is asked for.
    pub const DEFAULT_VRAM_BUDGET: u64 = 64 << 20;
    /// The hardware preset that prices the policies when none is asked for.
    pub const DEFAULT_HARDWARE: &str = "local";

    /// `policy` with the defaults: [`Self::DEFAULT_VRAM_BUDGET`], the
    /// [`Self::DEFAULT_HARDWARE`] preset with the device's measured rates, no deferral, no
    /// profile, no predictors, no trace.
    pub fn new(policy: PolicyKind) -> Result<HybridOptions> {
        Ok(HybridOptions {
            policy,
            vram_budget: Self::DEFAULT_VRAM_BUDGET,
            hardware: Hardware::load(Self::DEFAULT_HARDWARE)?,
            measure: true,
            policy_options: PolicyOptions::default(),
            profile: None,
            expert_cache: None,
        })
    }
}

/// Loads the checkpoint `dir` in the accelerator's hybrid layout on the first accelerator
/// ([`GpuModel::load_hybrid`]: attention, dense and shared weights, routers and LM head on
/// the device, the routed experts on the host as `load` says) with a hybrid executor behind
/// the routed experts that runs `opts`'s policy, priced for the model's shape and the
/// experts' storage, on the same device, its kernels compiled; returns both, the executor
/// for its statistics.
/// The executor copies experts from `dir` ([`HostExperts`]), through the DRAM expert cache
/// when `opts.expert_cache` asks for one (three tiers: [`HybridExecutor::host_tier`]).
pub fn load_hybrid(
    dir: &Path,
    load: LoadOptions,
    opts: &HybridOptions,
) -> Result<(GpuModel, Arc<HybridExecutor>)> {
    let dev = strata_accel::open(&strata_accel::DeviceOptions::default())?;
    let mut gpu = GpuModel::load_hybrid(dev.clone(), dir, load)?;
    gpu.prepare_kernels();
    let shape = model_shape(&gpu.config)?;
    let mut policy_options = opts.policy_options.clone();
    policy_options.check(opts.policy, &shape)?;
    if let Some(path) = &opts.profile {
        policy_options.read_profile(path, opts.policy, &shape)?;
    }
    let tier = match &opts.expert_cache {
        Some(ssd) => Some(Arc::new(SsdTier::new(
            &gpu.host_moe_blocks(),
            &mapped_file(dir),
            ssd,
        )?)),
        None => None,
    };
    let mut host = HostExperts::open(dir)?;
    host.read_through(tier.clone());
    let bits = host.bits_per_weight();
    let cache = HybridExecutor::cache_bytes(&host, opts.vram_budget);
    let mut hardware = opts.hardware.clone();
    if opts.measure && dev.info().device_type != "Cpu" {
        let figures = DeviceFigures::measure(&*dev, &host)?;
        figures.apply(&mut hardware, host.hidden(), host.inter(), bits);
        let layers: Vec<&ExpertSet> = gpu.host_moe_blocks().iter().map(|b| &b.experts).collect();
        if !layers.is_empty() {
            let cpu = CpuFigures::measure(&layers, host.hidden())?;
            cpu.apply(&mut hardware, host.hidden(), host.inter(), bits);
        }
    }
    let cost = cost_model(hardware, shape, bits, cache)?;
    let policy = build_policy(opts.policy, &cost, &policy_options);
    let exec = Arc::new(HybridExecutor::new(
        dev,
        host,
        policy,
        cost,
        &ExecOptions {
            vram_budget: opts.vram_budget,
            host_tier: tier,
            ..ExecOptions::default()
        },
    )?);
    gpu.keep_candidates(exec.reads_candidates());
    gpu.set_hybrid_executor(Some(exec.clone()));
    Ok((gpu, exec))
}

/// Hands every MoE block of `model` to `exec` (`None`: back to the CPU path), with the
/// router's top `2k` candidates in each routing when its policy scores them (HybriMoE).
pub fn install(model: &mut Model, exec: Option<&Arc<HybridExecutor>>) {
    model.keep_candidates(exec.is_some_and(|e| e.reads_candidates()));
    model.set_executor(exec.map(|e| e.clone() as Arc<dyn strata_model::ExpertExecutor>));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_models_config_gives_its_presets_shape() {
        let dir =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models/strata-tiny-moe");
        let read = resolve_model_shape(&dir.to_string_lossy()).unwrap();
        let preset = resolve_model_shape("strata-tiny-moe").unwrap();
        let key = |m: &ModelShape| {
            (
                m.hidden,
                m.moe_intermediate,
                m.n_experts,
                m.top_k,
                m.n_layers,
                m.dense_layers,
                m.attn_params,
                m.kv_elems(),
                m.vocab,
            )
        };
        assert_eq!(key(&read), key(&preset));
        let e = resolve_model_shape("no-such-model")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no-such-model") && e.contains("deepseek-v3"),
            "{e}"
        );
    }

    /// The hybrid layout scores the router's candidates on the host only for a policy that
    /// says it reads them: every other one must decide the same without them.
    #[test]
    fn only_a_policy_that_reads_candidates_decides_by_them() {
        use strata_policy::{Candidates, GpuView, LayerView, Phase};
        let shape = resolve_model_shape("strata-tiny-moe").unwrap();
        let (n, layers, k) = (shape.n_experts, shape.moe_layers(), shape.top_k);
        let hw = Hardware::load(HybridOptions::DEFAULT_HARDWARE).unwrap();
        let cost = cost_model(hw, shape, 4.5, 4 << 20).unwrap();
        // Four decode steps over every layer; the candidates rank other experts than the
        // routing's, so a policy that read them would see a different layer.
        let mut resident = vec![false; n];
        resident[..n / 4].iter_mut().for_each(|r| *r = true);
        let ids: Vec<u32> = (0..k as u32).map(|j| (j * 5 + 1) % n as u32).collect();
        let weights = vec![1.0 / k as f32; k];
        let cand_ids: Vec<u32> = (0..2 * k as u32).map(|j| (j * 3 + 2) % n as u32).collect();
        let cand_scores: Vec<f32> = (0..2 * k).map(|j| 1.0 - j as f32 * 0.05).collect();
        for kind in PolicyKind::ALL {
            let decide = |with: bool| {
                let mut policy = build_policy(kind, &cost, &PolicyOptions::default());
                let mut decisions = Vec::new();
                for step in 0..4 {
                    for layer in 0..layers {
                        let view = LayerView {
                            layer,
                            n_moe_layers: layers,
                            phase: Phase::Decode,
                            step,
                            top_k: k,
                            ids: &ids,
                            weights: &weights,
                            hidden: None,
                            candidates: with.then_some(Candidates {
                                per_token: 2 * k,
                                ids: &cand_ids,
                                scores: &cand_scores,
                            }),
                            gpu: GpuView {
                                resident: &resident,
                                free_bytes: 1 << 30,
                                busy_s: 0.0,
                            },
                            cpu_busy_s: 0.0,
                            pcie_busy_s: 0.0,
                            context: Some(64),
                        };
                        decisions.push(policy.decide(&view, &cost));
                    }
                }
                (policy.reads_candidates(), decisions)
            };
            let (reads, with) = decide(true);
            assert_eq!(reads, kind == PolicyKind::HybriMoE, "{kind}");
            // The reader decides otherwise here: the check above can see candidates used.
            let without = decide(false).1;
            match reads {
                true => assert_ne!(with, without, "{kind} ignored the candidates"),
                false => assert_eq!(with, without, "{kind} decided by the candidates"),
            }
        }
    }

    #[test]
    fn policy_options_are_checked_against_the_policy_and_the_model() {
        let shape = resolve_model_shape("strata-tiny-moe").unwrap();
        let (layers, experts) = (shape.moe_layers(), shape.n_experts);
        let check = |kind, opts: PolicyOptions| opts.check(kind, &shape).map_err(|e| e.to_string());
        let defer = PolicyOptions {
            deferred: 1,
            ..PolicyOptions::default()
        };
        assert!(check(PolicyKind::KTransformers, defer.clone()).is_ok());
        let e = check(PolicyKind::Smoe, defer).unwrap_err();
        assert!(
            e.contains("applies only with policy ktransformers, not smoe"),
            "{e}"
        );
        // The part a front end checks before loading a model says the same.
        let early = PolicyOptions {
            deferred: 1,
            ..PolicyOptions::default()
        }
        .check_policy(PolicyKind::Smoe)
        .unwrap_err();
        assert_eq!(early.to_string(), e);
        let profile = |l: usize, x: usize| PolicyOptions {
            profile: Some(vec![vec![1; x]; l]),
            ..PolicyOptions::default()
        };
        assert!(check(PolicyKind::Fiddler, profile(layers, experts)).is_ok());
        let e = check(PolicyKind::Fiddler, profile(layers + 1, experts)).unwrap_err();
        assert_eq!(
            e,
            format!(
                "a profile of {} moe layers x {experts} experts, the model has {layers} x {experts}",
                layers + 1
            )
        );
        let e = check(
            PolicyKind::Smoe,
            PolicyOptions {
                predictors: Some(vec![None; layers - 1]),
                ..PolicyOptions::default()
            },
        )
        .unwrap_err();
        assert!(e.contains("predictors for"), "{e}");
    }

    #[test]
    fn a_trace_gives_the_profile_and_predictors_or_an_error_naming_it() {
        use strata_sim::workload::{SyntheticParams, synthetic};
        let shape = resolve_model_shape("strata-tiny-moe").unwrap();
        let (layers, experts) = (shape.moe_layers(), shape.n_experts);
        let write = |name: &str, layers: usize| {
            let path = std::env::temp_dir()
                .join(format!("strata-exec-{name}-{}.trace", std::process::id()));
            let w = synthetic(&SyntheticParams {
                hidden_dim: shape.hidden,
                ..SyntheticParams::calibrated(layers, experts, shape.top_k)
            });
            let f = std::fs::File::create(&path).unwrap();
            strata_sim::trace::write(f, "strata-tiny-moe", &w).unwrap();
            path
        };
        let fits = write("fits", layers);
        let mut opts = PolicyOptions::default();
        opts.read_profile(&fits, PolicyKind::Smoe, &shape).unwrap();
        assert_eq!(opts.profile.as_ref().map(Vec::len), Some(layers));
        let preds = opts.predictors.unwrap();
        assert_eq!(preds.len(), layers);
        assert!(preds.iter().any(Option::is_some));

        let other = write("other", layers + 1);
        let e = PolicyOptions::default()
            .read_profile(&other, PolicyKind::Fiddler, &shape)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!("profile {}: a profile of", other.display())),
            "{e}"
        );
        let missing = std::env::temp_dir().join("strata-exec-no-such.trace");
        let e = PolicyOptions::default()
            .read_profile(&missing, PolicyKind::Fiddler, &shape)
            .unwrap_err();
        assert!(matches!(e, Error::Trace(_)), "{e}");
        assert!(e.to_string().contains("strata-exec-no-such.trace"), "{e}");
        for p in [fits, other] {
            std::fs::remove_file(p).unwrap();
        }
    }
}
