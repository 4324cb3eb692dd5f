//! The options shared by the subcommands, in groups each subcommand takes only where they
//! apply: [`ModelArgs`] (`--model`, `--dtype`, `--weights`: every command that reads a
//! model), [`DeviceArgs`] (`--device`, `--vram-budget`: the commands that run one) and its
//! [`HybridArgs`] (`--policy`, `--defer`, `--hardware`, `--profile`: `--device hybrid`) and
//! [`SamplingArgs`] (`--temperature`, `--top-p`, ..., `--seed`: the commands that generate).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use strata_exec::{ExpertCache, HybridExecutor, HybridOptions, PolicyKind, SsdOptions, SsdTier};
use strata_formats::strata_file::StrataFile;
use strata_kernels::PackedFormat;
use strata_model::model::{STRATA_FILE, mapped_file};
use strata_model::{LoadOptions, MemoryPlan, Model, Precision};
use strata_policy::replacement::Replacement;
use strata_runtime::engine::{Engine, load_tokenizer};
use strata_runtime::sampling::SamplingParams;

use crate::progress::Progress;

/// The model that ships with the repository: `strata-tiny-moe`, a 24M-parameter Qwen3-MoE
/// trained on ShareGPT text (see its README). Found relative to the source tree.
pub const DEFAULT_MODEL: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/strata-tiny-moe");

/// Options naming the model and its numeric mode.
#[derive(Debug, Args)]
pub struct ModelArgs {
    /// Model: a Hugging Face model directory (config.json, *.safetensors, tokenizer.json),
    /// a .gguf file, a converted .strata file or directory (`strata convert`; it runs with
    /// the `--dtype` and `--weights` it was converted with, and other values given here
    /// are an error), or a hub id (`org/name`, cached under HF_HOME).
    /// Defaults to the strata-tiny-moe model shipped in the repository.
    #[arg(long, short = 'm', value_name = "PATH")]
    pub model: Option<PathBuf>,
    /// Numeric mode: `fast` (the default: a GGUF's tensors computed in their own block
    /// types, other checkpoints' weights in BF16; f32 activations) or `f32` (everything in
    /// f32, the reference path). A converted model: its own.
    #[arg(long, value_enum)]
    pub dtype: Option<DType>,
    /// Packed format of the routed experts on the fast path: `bf16` (the default), `int8`
    /// (one scale per row), or `int4` (one scale per 32 values). A GGUF runs as stored
    /// unless this is given, which dequantizes and repacks its weights (more memory). A
    /// converted model: its own.
    #[arg(long, value_enum)]
    pub weights: Option<Weights>,
}

/// Where a model runs: `generate`, `chat`, `logits`, `serve` and `batch`.
#[derive(Debug, Args)]
#[command(next_help_heading = "Device")]
pub struct DeviceArgs {
    /// Where the model runs: `cpu`, `gpu` (the whole model on the first accelerator,
    /// weights in the checkpoint's own precision, a converted model's int8/int4 experts
    /// dequantized to f32; `--dtype` and `--weights` do not apply),
    /// or `hybrid` (routed experts placed by `--policy` on the CPU and the accelerator).
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    pub device: Device,
    /// Accelerator memory the model may use (`8G`, `512M`, bytes); default: no limit.
    /// With `--device hybrid`: the expert cache and staging slots (default 64MiB).
    #[arg(long, value_name = "BYTES")]
    pub vram_budget: Option<String>,
    /// DRAM for the routed experts of a GGUF read from disk (the SSD tier): a size (`6G`)
    /// keeps them in a cache of that many bytes, each read from the file when the router
    /// picks it and the next layer's fetched ahead; `auto` (the default) does so only when
    /// they do not fit in the memory available (a cgroup's limit included) beside the other
    /// weights, the KV cache and 1 GiB; `off` leaves them to the mapped file's page cache.
    /// With `--device cpu`, or `--device hybrid`: below the accelerator's expert cache
    /// (three tiers: device, DRAM, file).
    #[arg(long, value_name = "SIZE|auto|off")]
    pub expert_cache: Option<String>,
    /// Which cached expert gives up its slot: `lfu` (the default), `lru`, `ema` (TriMoE's,
    /// alpha 0.3) or `ema:ALPHA`.
    #[arg(long, value_name = "RULE")]
    pub expert_cache_rule: Option<String>,
    /// The expert cache reads only what the router picked, never ahead. By default it also
    /// reads the experts the next MoE layer's router picks for this layer's hidden states,
    /// which hides reads behind the compute and costs the bytes of each wrong guess.
    #[arg(long)]
    pub no_expert_prefetch: bool,
    /// A routing trace (`strata trace` on prompts like the ones to come) whose most used
    /// experts are read into the expert cache at start and never evicted, up to half its
    /// slots: hot experts pinned from usage statistics.
    #[arg(long, value_name = "TRACE")]
    pub expert_cache_pin: Option<PathBuf>,
    #[command(flatten)]
    pub hybrid: HybridArgs,
}

/// How `--device hybrid` places the routed experts.
#[derive(Debug, Args)]
#[command(next_help_heading = "Hybrid execution (--device hybrid)")]
pub struct HybridArgs {
    /// The placement policy that decides where each expert runs and which weights move
    /// [default: gpu-lru].
    #[arg(long, value_parser = policy_parser())]
    pub policy: Option<PolicyKind>,
    /// With `--policy ktransformers`: experts deferred to the next layer per token in
    /// decode (expert deferral) [default: 0, off].
    #[arg(long, value_name = "N")]
    pub defer: Option<usize>,
    /// The hardware preset or JSON file whose CPU and GPU speeds price the policies'
    /// choices (`strata simulate` presets); its GPU memory is replaced by `--vram-budget`
    /// [default: local, with the GPU and link rates the accelerator measures for one of the
    /// model's experts at start (a real GPU only; lavapipe keeps the preset's)].
    #[arg(long, value_name = "NAME|FILE")]
    pub hardware: Option<String>,
    /// A routing trace (`strata trace`) to learn from: its expert activation counts choose
    /// Fiddler's pinned experts (default: the cache filled in layer order) and, when it
    /// holds hidden states, it trains SMoE's token-wise predictors (default: none).
    #[arg(long, value_name = "TRACE")]
    pub profile: Option<PathBuf>,
}

/// `--policy`: the names [`PolicyKind`]'s `FromStr` reads (the one place policies are named),
/// each with its help line.
fn policy_parser() -> impl clap::builder::TypedValueParser<Value = PolicyKind> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    let values = PolicyKind::ALL.map(|k| {
        PossibleValue::new(k.name()).help(match k {
            PolicyKind::GpuLru => {
                "Every routed expert on the GPU, loaded on demand into a per-layer LRU cache"
            }
            PolicyKind::Fiddler => {
                "Experts pinned on the GPU (by `--profile`, else in layer order), the rest where \
                 cheaper"
            }
            PolicyKind::KTransformers => {
                "Routed experts on the CPU; `--defer N` for expert deferral"
            }
            PolicyKind::HybriMoE => "Score cache and earliest-finish CPU/GPU split",
            PolicyKind::Smoe => {
                "On-demand loading of heavy experts in prefill, LFU cache in decode"
            }
        })
    });
    PossibleValuesParser::new(values).try_map(|s| s.parse::<PolicyKind>())
}

/// What the expert cache says once, at start ([`SsdTier::start_notes`]).
fn say_notes(tier: &SsdTier) {
    for note in tier.start_notes() {
        eprintln!("[expert cache: {note}]");
    }
}

/// Values of `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Device {
    /// The CPU kernels.
    Cpu,
    /// The first accelerator (`strata devices` lists them).
    Gpu,
    /// Attention and dense weights on the accelerator, routed experts where the policy puts them.
    Hybrid,
}

/// Values of `--weights`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Weights {
    /// BF16 experts.
    Bf16,
    /// INT8 experts, per-row scales, activations quantized per token.
    Int8,
    /// INT4 experts, per-32 group scales.
    Int4,
}

/// Values of `--dtype`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum DType {
    /// BF16 weights where the checkpoint allows, f32 activations.
    Fast,
    /// Everything in f32.
    F32,
}

/// Options of the sampler.
#[derive(Debug, Args)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.8)]
    temperature: f32,
    /// Nucleus sampling: keep the most likely tokens up to this probability mass.
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Keep only the K most likely tokens; 0 = all.
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Drop tokens less likely than this fraction of the most likely one.
    #[arg(long, default_value_t = 0.05)]
    min_p: f32,
    /// Penalise tokens already present (1 = off).
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    /// Random seed, for reproducible sampling.
    #[arg(long)]
    seed: Option<u64>,
}

impl SamplingArgs {
    /// The sampler's settings (not yet validated: [`SamplingParams::validate`]).
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            seed: self.seed,
            ..SamplingParams::default()
        }
    }
}

impl ModelArgs {
    /// The model: a directory or `.gguf` file, checked to exist, or a hub id (`org/name`)
    /// found in the Hugging Face cache or downloaded into it. A converted model is checked
    /// against an explicit `--dtype` or `--weights` (an error when they differ).
    pub fn dir(&self) -> anyhow::Result<PathBuf> {
        let dir = self
            .model
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_MODEL));
        if !dir.exists() {
            let s = dir.to_string_lossy();
            if !crate::hub::looks_like_hub_id(&s) || names_local_path(&dir) {
                bail!("{}", missing_path(&dir));
            }
            return crate::hub::fetch(&s).with_context(|| {
                format!(
                    "{s}: no such local file or directory, and it could not be fetched as a \
                     Hugging Face hub id"
                )
            });
        }
        let converted = dir.join(STRATA_FILE).is_file();
        if dir.is_dir() && !converted && !dir.join("config.json").exists() {
            bail!(
                "{}: not a Hugging Face model directory (no config.json) nor a converted one (no model.strata)",
                dir.display()
            );
        }
        let ext = |x: &str| dir.extension().is_some_and(|e| e.eq_ignore_ascii_case(x));
        if dir.is_file() && !ext("gguf") && !ext("strata") {
            bail!(
                "{}: expected a model directory, a .gguf or a .strata file",
                dir.display()
            );
        }
        let dir = dir
            .canonicalize()
            .with_context(|| format!("{}: cannot resolve path", dir.display()))?;
        self.check_converted(&dir)?;
        Ok(dir)
    }

    /// Fails when `path` is a converted model and `--dtype` or `--weights` ask for other
    /// weights than it holds: a converted model runs as converted, and silently ignoring
    /// an explicit option would run something the user did not ask for.
    fn check_converted(&self, path: &Path) -> anyhow::Result<()> {
        if self.dtype.is_none() && self.weights.is_none() {
            return Ok(());
        }
        let file = mapped_file(path);
        if !file.is_file() || !StrataFile::sniff(&file) {
            return Ok(());
        }
        let f = StrataFile::open(&file)?;
        let stored = LoadOptions::stored(&f)?;
        let (dtype, weights) = (self.dtype.map(DType::precision), self.weights);
        let dtype_differs = dtype.is_some_and(|d| d != stored.precision);
        let weights_differ = weights.is_some_and(|w| {
            let fast = dtype.unwrap_or(stored.precision) == Precision::Fast;
            // `--weights` applies to the fast path only, as for any other model.
            fast && (stored.precision != Precision::Fast || w.format() != stored.experts)
        });
        if !dtype_differs && !weights_differ {
            return Ok(());
        }
        let holds = match stored.precision {
            Precision::F32 => "--dtype f32".to_owned(),
            Precision::Fast => format!("--dtype fast --weights {}", cli_name(stored.experts)),
        };
        let mut asked = Vec::new();
        if let Some(d) = self.dtype {
            asked.push(format!("--dtype {}", d.name()));
        }
        if let Some(w) = self.weights {
            asked.push(format!("--weights {}", w.name()));
        }
        let asked = asked.join(" ");
        let source = f.metadata()["source"]
            .as_str()
            .unwrap_or("<original model>");
        bail!(
            "{}: converted with {holds}, but {asked} was given; a converted model runs only as \
             converted: leave the option out, or convert again from the original with \
             `strata convert --model {source} {asked} --out <path>`",
            file.display()
        )
    }

    /// Loads the model in `dir` on the CPU, drawing the load's progress on stderr;
    /// returns it with the time the load took.
    pub fn load_model(&self, dir: &Path) -> anyhow::Result<(Model, Duration)> {
        let started = Instant::now();
        let (config, src) = strata_model::model::open(dir)?;
        let mut progress = load_progress(dir);
        let model =
            Model::from_source_with_progress(config, &src, self.load_options(), &mut progress)
                .with_context(|| format!("loading {}", dir.display()))?;
        Ok((model, started.elapsed()))
    }

    /// [`ModelArgs::load_model`] with the tokenizer and chat template: a generation engine.
    pub fn load_engine(&self, dir: &Path) -> anyhow::Result<(Engine, Duration)> {
        let started = Instant::now();
        let mut progress = load_progress(dir);
        let engine = Engine::load_with_progress(dir, self.load_options(), &mut progress)
            .with_context(|| format!("loading {}", dir.display()))?;
        Ok((engine, started.elapsed()))
    }

    /// How to load the weights (`fast` and `bf16` where not given; a converted model
    /// ignores them, see [`ModelArgs::dir`]).
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            precision: self.dtype.unwrap_or(DType::Fast).precision(),
            experts: self.weights.unwrap_or(Weights::Bf16).format(),
            keep_blocks: self.weights.is_none(),
        }
    }
}

/// A model in the accelerator's hybrid layout and what runs its routed experts
/// ([`DeviceArgs::hybrid_model`]).
#[derive(Debug)]
pub struct HybridModel {
    /// The model, every weight on the device but the routed experts.
    pub gpu: strata_exec::GpuModel,
    /// The hybrid executor behind the routed experts, unless the SSD tier is.
    pub exec: Option<Arc<HybridExecutor>>,
    /// The SSD tier: behind the routed experts (`--policy ktransformers --expert-cache`),
    /// or below the executor's device cache (three tiers).
    pub ssd: Option<Arc<SsdTier>>,
}

/// An engine loaded for a `--device` ([`DeviceArgs::load_engine`]).
#[derive(Debug)]
pub struct LoadedEngine {
    /// The engine, on the device's backend.
    pub engine: Engine,
    /// With `--device hybrid`: the executor, for its statistics.
    pub hybrid: Option<Arc<HybridExecutor>>,
    /// With `--device gpu` or `hybrid`: the accelerator, for its traffic counters.
    pub accel: Option<Arc<dyn strata_accel::Device>>,
    /// With the SSD tier (`--expert-cache`): the tier, for its statistics.
    pub ssd: Option<Arc<SsdTier>>,
    /// How long the model took to load.
    pub took: Duration,
}

impl DeviceArgs {
    /// The device, once the options given apply to it: the hybrid options only with
    /// `--device hybrid` (and `--defer` only with `--policy ktransformers`, as
    /// [`strata_exec::PolicyOptions::check_policy`] says), a VRAM budget
    /// only with an accelerator. A flag that would be ignored is an error, not a surprise.
    pub fn checked(&self) -> anyhow::Result<Device> {
        let h = &self.hybrid;
        if self.device != Device::Hybrid {
            let given = [
                ("--policy", h.policy.is_some()),
                ("--defer", h.defer.is_some()),
                ("--hardware", h.hardware.is_some()),
                ("--profile", h.profile.is_some()),
            ];
            if let Some((flag, _)) = given.iter().find(|(_, g)| *g) {
                bail!("{flag} applies only with --device hybrid");
            }
        }
        if self.device == Device::Hybrid {
            // Before any model is loaded: the settings that need none.
            let opts = self.hybrid_options()?;
            opts.policy_options.check_policy(opts.policy)?;
        }
        if self.device == Device::Cpu && self.vram_budget.is_some() {
            bail!("--vram-budget applies only with --device gpu or hybrid");
        }
        let cache_given = self.expert_cache.as_deref().is_some_and(|c| c != "off");
        let cache_asked = cache_given
            || self.expert_cache_rule.is_some()
            || self.no_expert_prefetch
            || self.expert_cache_pin.is_some();
        if self.device == Device::Gpu && cache_asked {
            bail!(
                "--expert-cache applies with --device cpu or hybrid (--device gpu holds every \
                 expert on the device)"
            );
        }
        if self.expert_cache_budget()? == ExpertCache::Off && self.expert_cache_pin.is_some() {
            bail!(
                "--expert-cache-pin pins experts in the expert cache, which --expert-cache off turns off"
            );
        }
        self.expert_cache_rule()?;
        Ok(self.device)
    }

    /// Loads the engine for `--device`: on the CPU, with a hybrid executor behind the CPU
    /// model's MoE blocks (returned for its statistics), or the whole model on the
    /// accelerator. The scheduler, the prefix cache and the generation step do not know
    /// which: the engine's backend runs the forward passes.
    pub fn load_engine(&self, model: &ModelArgs, dir: &Path) -> anyhow::Result<LoadedEngine> {
        let device = self.checked()?;
        if device != Device::Cpu {
            let started = Instant::now();
            let tokenizer = load_tokenizer(dir)?;
            let h = match device {
                Device::Hybrid => self.hybrid_model(dir, model.load_options())?,
                _ => HybridModel {
                    gpu: self.gpu_model(dir)?,
                    exec: None,
                    ssd: None,
                },
            };
            let accel = Some(h.gpu.device().clone());
            return Ok(LoadedEngine {
                engine: Engine::new(Box::new(h.gpu), tokenizer)?,
                hybrid: h.exec,
                accel,
                ssd: h.ssd,
                took: started.elapsed(),
            });
        }
        let (mut engine, took) = model.load_engine(dir)?;
        let cpu = engine.model.cpu_model_mut();
        let cpu = cpu.context("the SSD tier needs the model on the CPU")?;
        let ssd = self.ssd_tier(dir, cpu)?;
        Ok(LoadedEngine {
            engine,
            accel: None,
            hybrid: None,
            ssd,
            took,
        })
    }

    /// `--expert-cache`, `auto` when not given.
    fn expert_cache_budget(&self) -> anyhow::Result<ExpertCache> {
        Ok(match self.expert_cache.as_deref() {
            None => ExpertCache::Auto,
            Some(c) => ExpertCache::parse(c).map_err(|e| anyhow::anyhow!("--expert-cache {e}"))?,
        })
    }

    fn expert_cache_rule(&self) -> anyhow::Result<Replacement> {
        let Some(rule) = &self.expert_cache_rule else {
            return Ok(SsdOptions::default().replacement);
        };
        Replacement::parse(rule).with_context(|| {
            format!(
                "--expert-cache-rule {rule}: expected {}",
                Replacement::NAMES
            )
        })
    }

    /// Puts the routed experts of `model` (loaded from `dir`) behind the SSD tier when
    /// `--expert-cache` gives a size, or when it is `auto` and they do not fit in memory.
    pub fn ssd_tier(&self, dir: &Path, model: &mut Model) -> anyhow::Result<Option<Arc<SsdTier>>> {
        let file = mapped_file(dir);
        let Some(opts) = self.ssd_options(&file, || Ok(model.memory()))? else {
            return Ok(None);
        };
        let tier = strata_exec::attach_ssd_tier(model, &file, &opts)
            .with_context(|| format!("--expert-cache on {}", file.display()))?;
        say_notes(&tier);
        Ok(Some(tier))
    }

    /// The SSD tier's settings for the model file `file` whose memory `plan` gives: `None`
    /// (no tier) for `--expert-cache off`, or `auto` where the routed experts fit.
    fn ssd_options(
        &self,
        file: &Path,
        plan: impl FnOnce() -> anyhow::Result<MemoryPlan>,
    ) -> anyhow::Result<Option<SsdOptions>> {
        let cache = self.expert_cache_budget()?;
        let Some(choice) = cache.choose(file, self.expert_cache_rule()?, plan)? else {
            if self.expert_cache_pin.is_some() {
                eprintln!(
                    "[expert cache: not started, the routed experts fit in memory; \
                     --expert-cache-pin applies with --expert-cache SIZE]"
                );
            }
            return Ok(None);
        };
        if let Some(note) = choice.note {
            eprintln!("[expert cache: {note}]");
        }
        let mut opts = choice.options;
        opts.prefetch = !self.no_expert_prefetch;
        if let Some(trace) = &self.expert_cache_pin {
            opts.pin_profile = Some(strata_exec::pin_profile_from_trace(trace)?);
        }
        Ok(Some(opts))
    }

    /// Loads the model onto the accelerator (`--device gpu`).
    pub fn gpu_model(&self, dir: &Path) -> anyhow::Result<strata_exec::GpuModel> {
        let budget = self
            .vram_budget
            .as_deref()
            .map(strata_accel::parse_bytes)
            .transpose()?;
        Ok(strata_exec::GpuModel::load_on_first_device(dir, budget)?)
    }

    /// Loads the model in `dir` in the accelerator's hybrid layout, its routed experts on
    /// the host as `load` says (`--device hybrid`), behind a hybrid executor
    /// ([`strata_exec::load_hybrid`]). When `--expert-cache` asks for it, or `auto` finds
    /// that the routed experts do not fit in memory, they are read from the file into the
    /// DRAM expert cache: below the executor's device cache (three tiers), or, under
    /// `--policy ktransformers` without `--defer` (every routed expert on the CPU, no
    /// device cache to keep), as the executor itself. Returns what runs them, for its
    /// statistics.
    pub fn hybrid_model(&self, dir: &Path, load: LoadOptions) -> anyhow::Result<HybridModel> {
        let mut opts = self.hybrid_options()?;
        let file = mapped_file(dir);
        let ssd = self.ssd_options(&file, || {
            let (config, src) = strata_model::model::open(dir)?;
            Ok(MemoryPlan::of(&config, &src, load))
        })?;
        let all_on_cpu =
            opts.policy == PolicyKind::KTransformers && opts.policy_options.deferred == 0;
        let (Some(ssd), true) = (&ssd, all_on_cpu) else {
            opts.expert_cache = ssd;
            let (gpu, exec) = strata_exec::load_hybrid(dir, load, &opts)
                .with_context(|| format!("--device hybrid on {}", file.display()))?;
            let ssd = exec.host_tier();
            if let Some(tier) = &ssd {
                say_notes(tier);
            }
            return Ok(HybridModel {
                gpu,
                exec: Some(exec),
                ssd,
            });
        };
        let dev = strata_accel::open(&strata_accel::DeviceOptions::default())?;
        let mut gpu = strata_exec::GpuModel::load_hybrid(dev, dir, load)?;
        gpu.prepare_kernels();
        let tier = SsdTier::new(&gpu.host_moe_blocks(), &file, ssd)
            .with_context(|| format!("--expert-cache on {}", file.display()))?;
        let tier = Arc::new(tier);
        say_notes(&tier);
        gpu.set_executor(Some(tier.clone()));
        Ok(HybridModel {
            gpu,
            exec: None,
            ssd: Some(tier),
        })
    }

    /// The hybrid executor's settings from `--policy` (`gpu-lru` when none), `--vram-budget`,
    /// `--hardware`, `--defer` and `--profile` (read by [`strata_exec::load_hybrid`]).
    fn hybrid_options(&self) -> anyhow::Result<HybridOptions> {
        let h = &self.hybrid;
        let mut opts = HybridOptions::new(h.policy.unwrap_or(PolicyKind::GpuLru))?;
        if let Some(b) = &self.vram_budget {
            opts.vram_budget = strata_accel::parse_bytes(b)?;
        }
        if let Some(hw) = &h.hardware {
            opts.hardware = strata_policy::Hardware::load(hw)?;
            opts.measure = false;
        }
        opts.policy_options.deferred = h.defer.unwrap_or(0);
        opts.profile = h.profile.clone();
        Ok(opts)
    }
}

impl DType {
    fn precision(self) -> Precision {
        match self {
            DType::Fast => Precision::Fast,
            DType::F32 => Precision::F32,
        }
    }

    fn name(self) -> &'static str {
        match self {
            DType::Fast => "fast",
            DType::F32 => "f32",
        }
    }
}

impl Weights {
    fn format(self) -> PackedFormat {
        match self {
            Weights::Bf16 => PackedFormat::Bf16,
            Weights::Int8 => PackedFormat::Int8 { group: None },
            Weights::Int4 => PackedFormat::Int4 { group: 32 },
        }
    }

    fn name(self) -> &'static str {
        match self {
            Weights::Bf16 => "bf16",
            Weights::Int8 => "int8",
            Weights::Int4 => "int4",
        }
    }
}

/// Whether `path`, which does not exist, still names a local path rather than a hub id:
/// its first component exists here (`models/strata-tiny` beside `models/`), or it ends like
/// a model file.
fn names_local_path(path: &Path) -> bool {
    let first = path.components().next().map(|c| Path::new(c.as_os_str()));
    let ext = path.extension().and_then(|e| e.to_str());
    first.is_some_and(Path::exists) || matches!(ext, Some("gguf" | "strata" | "safetensors"))
}

/// Says that `path` does not exist: where it was looked for, and what its nearest
/// existing directory holds under a similar name.
fn missing_path(path: &Path) -> String {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    let mut msg = format!(
        "{}: no such model directory or file (looked for {})",
        path.display(),
        abs.display()
    );
    let Some((dir, missing)) = abs
        .ancestors()
        .zip(abs.ancestors().skip(1))
        .find(|(_, parent)| parent.is_dir())
        .and_then(|(child, parent)| Some((parent, child.file_name()?.to_str()?)))
    else {
        return msg;
    };
    let mut similar: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with(missing) || missing.starts_with(name.as_str()))
        .collect();
    similar.sort();
    similar.truncate(3);
    if similar.is_empty() {
        msg += &format!("; {} exists", dir.display());
    } else {
        msg += &format!("; {} holds {}", dir.display(), similar.join(", "));
    }
    msg
}

/// Progress of loading the model in `dir`, layer by layer, started when the loader first
/// says how many layers there are.
fn load_progress(dir: &Path) -> impl FnMut(usize, usize) {
    let name = dir.file_name().unwrap_or(dir.as_os_str()).to_string_lossy();
    let what = format!("loading {name}");
    let mut progress = None;
    move |done, layers| {
        progress
            .get_or_insert_with(|| Progress::new(what.clone(), layers as u64, "layers"))
            .set(done as u64, "")
    }
}

/// The `--weights` value that gives `fmt`, or its format name when none does.
fn cli_name(fmt: PackedFormat) -> String {
    [Weights::Bf16, Weights::Int8, Weights::Int4]
        .into_iter()
        .find(|w| w.format() == fmt)
        .map_or_else(|| fmt.name(), |w| w.name().to_owned())
}
