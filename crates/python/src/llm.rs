//! `strata.LLM` and `python -m strata serve`: the engine the `strata` command line runs
//! ([`strata_runtime::engine::Engine`]), loaded and driven from Python.
//!
//! The API follows vLLM's offline one (`LLM.generate(prompts, SamplingParams)`,
//! `LLM.chat(messages)`, outputs with `.outputs[0].text`, `.token_ids`, `.finish_reason`)
//! so that code written for it runs with few changes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use strata_exec::{GpuModel, HybridExecutor, SsdTier};
use strata_kernels::PackedFormat;
use strata_model::{LoadOptions, Precision};
use strata_runtime::engine::{Engine, FinishReason, load_tokenizer};
use strata_runtime::scheduler::{
    AdmissionError, Event, GenRequest, Scheduler, SchedulerConfig, SchedulerLimits, Spelling,
};
use strata_runtime::text::ChatMessage;
use strata_server::AppState;

use crate::errors::{chain, runtime_err};
use crate::hybrid::budget_bytes;

/// Sampling settings of one request, as in vLLM (`max_tokens` 16 and temperature 1 by
/// default; `temperature=0` is greedy; `top_k` 0 or -1 keeps every token).
#[pyclass(module = "strata._strata", get_all, set_all, from_py_object)]
#[derive(Clone, Debug)]
pub struct SamplingParams {
    max_tokens: usize,
    temperature: f32,
    top_p: f32,
    top_k: i64,
    min_p: f32,
    repetition_penalty: f32,
    presence_penalty: f32,
    frequency_penalty: f32,
    seed: Option<u64>,
    stop: Vec<String>,
}

#[pymethods]
impl SamplingParams {
    #[new]
    #[pyo3(signature = (*, max_tokens=16, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0,
        repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, seed=None, stop=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        max_tokens: usize,
        temperature: f32,
        top_p: f32,
        top_k: i64,
        min_p: f32,
        repetition_penalty: f32,
        presence_penalty: f32,
        frequency_penalty: f32,
        seed: Option<u64>,
        stop: Option<Vec<String>>,
    ) -> PyResult<SamplingParams> {
        if max_tokens == 0 {
            return Err(PyValueError::new_err(
                "max_tokens must be at least 1 (the first token is sampled from the prompt)",
            ));
        }
        Ok(SamplingParams {
            max_tokens,
            temperature,
            top_p,
            top_k,
            min_p,
            repetition_penalty,
            presence_penalty,
            frequency_penalty,
            seed,
            stop: stop.unwrap_or_default(),
        })
    }

    fn __repr__(&self) -> String {
        format!("{self:?}")
    }
}

impl SamplingParams {
    fn request(&self, prompt: Vec<u32>) -> GenRequest {
        GenRequest {
            prompt,
            max_tokens: self.max_tokens,
            sampling: strata_runtime::sampling::SamplingParams {
                temperature: self.temperature,
                top_k: usize::try_from(self.top_k).unwrap_or(0),
                top_p: self.top_p,
                min_p: self.min_p,
                repetition_penalty: self.repetition_penalty,
                presence_penalty: self.presence_penalty,
                frequency_penalty: self.frequency_penalty,
                seed: self.seed,
            },
            stop: self.stop.clone(),
            top_logprobs: None,
            ignore_eos: false,
            grammar: None,
            keep_special: Vec::new(),
        }
    }
}

/// One generated sequence.
#[pyclass(module = "strata._strata", get_all)]
#[derive(Clone, Debug)]
pub struct CompletionOutput {
    index: usize,
    text: String,
    token_ids: Vec<u32>,
    /// `stop` (end of sequence or a stop string) or `length` (`max_tokens` or the context).
    finish_reason: &'static str,
}

#[pymethods]
impl CompletionOutput {
    fn __repr__(&self) -> String {
        format!("{self:?}")
    }
}

/// What one prompt produced.
#[pyclass(module = "strata._strata", get_all)]
#[derive(Clone, Debug)]
pub struct RequestOutput {
    /// The prompt's text (`None` when it was given as token ids).
    prompt: Option<String>,
    prompt_token_ids: Vec<u32>,
    outputs: Vec<CompletionOutput>,
}

#[pymethods]
impl RequestOutput {
    fn __repr__(&self) -> String {
        format!("{self:?}")
    }
}

/// How to load the weights from `dtype` (`fast`, `f32`) and `weights` (`bf16`, `int8`,
/// `int4`, or `None`: BF16, and a GGUF's own blocks), as the command line's `--dtype` and
/// `--weights`.
fn load_options(dtype: &str, weights: Option<&str>) -> PyResult<LoadOptions> {
    let precision = match dtype {
        "fast" => Precision::Fast,
        "f32" | "float32" => Precision::F32,
        _ => {
            return Err(PyValueError::new_err(format!(
                "dtype: expected 'fast' or 'f32', got '{dtype}'"
            )));
        }
    };
    let experts = match weights.unwrap_or("bf16") {
        "bf16" => PackedFormat::Bf16,
        "int8" => PackedFormat::Int8 { group: None },
        "int4" => PackedFormat::Int4 { group: 32 },
        w => {
            return Err(PyValueError::new_err(format!(
                "weights: expected 'bf16', 'int8' or 'int4', got '{w}'"
            )));
        }
    };
    Ok(LoadOptions {
        precision,
        experts,
        keep_blocks: weights.is_none(),
    })
}

/// A `ValueError` unless `model` exists.
fn check_exists(model: &Path) -> PyResult<()> {
    if model.exists() {
        return Ok(());
    }
    Err(PyValueError::new_err(format!(
        "model: {} does not exist (a Hugging Face model directory, a .gguf file or a \
         converted .strata model)",
        model.display()
    )))
}

/// Loads the engine for `model` (a local path) on the CPU, with the GIL released.
fn load_engine(py: Python<'_>, model: PathBuf, opts: LoadOptions) -> PyResult<Engine> {
    check_exists(&model)?;
    py.detach(|| Engine::load(&model, opts))
        .map_err(|e| PyRuntimeError::new_err(format!("loading {}: {}", model.display(), chain(&e))))
}

/// Loads the engine for `model` with the whole model on the first accelerator
/// (`device='gpu'`), within `budget` bytes when given, with the GIL released.
fn load_gpu_engine(py: Python<'_>, model: &Path, budget: Option<u64>) -> PyResult<Engine> {
    check_exists(model)?;
    let load = || -> Result<Engine, String> {
        let gpu = GpuModel::load_on_first_device(model, budget).map_err(|e| chain(&e))?;
        let tokenizer = load_tokenizer(model).map_err(|e| chain(&e))?;
        Engine::new(Box::new(gpu), tokenizer).map_err(|e| chain(&e))
    };
    py.detach(load).map_err(|e| {
        PyRuntimeError::new_err(format!(
            "loading {} on the accelerator: {e}",
            model.display()
        ))
    })
}

/// `model` in the accelerator's hybrid layout with a hybrid executor behind its routed
/// experts (`device='hybrid'`, [`strata_exec::load_hybrid`]), and the executor.
fn load_hybrid_engine(
    py: Python<'_>,
    model: &Path,
    load: LoadOptions,
    opts: &strata_exec::HybridOptions,
) -> PyResult<(Engine, Arc<HybridExecutor>)> {
    check_exists(model)?;
    let (gpu, exec) = py
        .detach(|| strata_exec::load_hybrid(model, load, opts))
        .map_err(crate::hybrid::load_err)?;
    let tokenizer = py.detach(|| load_tokenizer(model)).map_err(|e| {
        PyRuntimeError::new_err(format!("loading {}: {}", model.display(), chain(&e)))
    })?;
    let engine = Engine::new(Box::new(gpu), tokenizer).map_err(|e| runtime_err(&e))?;
    Ok((engine, exec))
}

/// A model loaded for generation on Strata's engine.
#[pyclass(module = "strata._strata", name = "LLM", frozen)]
pub struct Llm {
    engine: Arc<Engine>,
    /// Continuous batching over the shared prefix cache, as `strata serve` runs requests:
    /// prompts that share a prefix (a system prompt, earlier turns) prefill it once.
    scheduler: Scheduler,
    /// The executor of the routed experts with `device='hybrid'`, for its statistics.
    hybrid: Option<Arc<HybridExecutor>>,
    /// The SSD tier behind the routed experts, when `expert_cache` put them there.
    expert_cache: Option<Arc<SsdTier>>,
}

#[pymethods]
impl Llm {
    /// Loads `model`. `device`: `cpu` (the CPU kernels) or `hybrid` (the CPU, with the
    /// routed experts placed by `policy` on the CPU and the first accelerator, as the
    /// command line's `--device hybrid`; `policy` is `gpu-lru` (the default), `fiddler`,
    /// `ktransformers`, `hybrimoe` or `smoe`, with `vram_budget` (bytes, or a size such as
    /// `'64MiB'`, the default), `hardware` (a preset name or JSON file, default `local`) and
    /// `defer` (ktransformers only) as `--vram-budget`, `--hardware` and `--defer`, and
    /// `profile` (a routing trace from `strata trace`) as `--profile`).
    /// `dtype`, `weights`, `max_batch`, `ctx_size` and `prefix_cache_mb` are the command
    /// line's `--dtype`, `--weights`, `--max-batch`, `--ctx-size` and `--prefix-cache-mb`,
    /// admitted against the memory available as `strata serve` admits them.
    /// `expert_cache` (`device='cpu'` or `'hybrid'`): the command line's `--expert-cache`,
    /// DRAM as the cache of a GGUF's routed experts read from disk (with `'hybrid'`, below
    /// the accelerator's expert cache: three tiers): `None`/`'auto'` (only when they do not
    /// fit in memory), `'off'`, or a size (`'6GiB'`, bytes); `expert_cache_rule` and
    /// `expert_cache_pin` (a routing trace) as `--expert-cache-rule` and `--expert-cache-pin`.
    #[new]
    #[pyo3(signature = (model, *, device="cpu", policy=None, vram_budget=None, hardware=None,
        defer=None, profile=None, dtype="fast", weights=None, max_batch=16, ctx_size=None,
        prefix_cache_mb=1024, expert_cache=None, expert_cache_rule=None, expert_cache_pin=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model: PathBuf,
        device: &str,
        policy: Option<&str>,
        vram_budget: Option<&Bound<'_, PyAny>>,
        hardware: Option<&str>,
        defer: Option<usize>,
        profile: Option<PathBuf>,
        dtype: &str,
        weights: Option<&str>,
        max_batch: usize,
        ctx_size: Option<usize>,
        prefix_cache_mb: usize,
        expert_cache: Option<&Bound<'_, PyAny>>,
        expert_cache_rule: Option<&str>,
        expert_cache_pin: Option<PathBuf>,
    ) -> PyResult<Llm> {
        let cache_asked = expert_cache_rule.is_some()
            || expert_cache_pin.is_some()
            || expert_cache.is_some_and(|c| c.extract::<String>().is_ok_and(|s| s != "off"));
        if device == "gpu" && cache_asked {
            return Err(PyValueError::new_err(
                "expert_cache applies with device='cpu' or 'hybrid' (device='gpu' holds every \
                 expert on the device)",
            ));
        }
        let cache =
            crate::expert_cache::options(expert_cache, expert_cache_rule, expert_cache_pin)?;
        let hybrid_only = [
            ("policy", policy.is_some()),
            ("hardware", hardware.is_some()),
            ("defer", defer.is_some()),
            ("profile", profile.is_some()),
        ];
        let hybrid_only = hybrid_only.iter().find(|(_, g)| *g).map(|(name, _)| *name);
        let (hybrid, gpu_budget) = match (device, hybrid_only) {
            ("cpu", None) if vram_budget.is_some() => {
                return Err(PyValueError::new_err(
                    "vram_budget applies only with device='hybrid' or 'gpu'",
                ));
            }
            ("cpu" | "gpu", Some(name)) => {
                return Err(PyValueError::new_err(format!(
                    "{name} applies only with device='hybrid'"
                )));
            }
            ("cpu", None) => (None, None),
            ("gpu", None) => (None, Some(vram_budget.map(budget_bytes).transpose()?)),
            ("hybrid", _) => (
                Some(crate::hybrid::options(
                    policy,
                    vram_budget,
                    hardware,
                    defer,
                    profile,
                )?),
                None,
            ),
            _ => {
                return Err(PyValueError::new_err(format!(
                    "device: expected 'cpu', 'hybrid' or 'gpu', got '{device}'"
                )));
            }
        };
        let mut tier = None;
        let (engine, hybrid) = match (hybrid, gpu_budget) {
            (Some(mut opts), _) => {
                let load = load_options(dtype, weights)?;
                opts.expert_cache = crate::expert_cache::for_hybrid(py, &model, &cache, load)?;
                let (engine, exec) = load_hybrid_engine(py, &model, load, &opts)?;
                tier = exec.host_tier();
                if let Some(tier) = &tier {
                    crate::expert_cache::say_notes(tier);
                }
                (engine, Some(exec))
            }
            (None, Some(budget)) => (load_gpu_engine(py, &model, budget)?, None),
            (None, None) => {
                let mut engine = load_engine(py, model.clone(), load_options(dtype, weights)?)?;
                tier = crate::expert_cache::attach(py, &mut engine, &model, &cache)?;
                (engine, None)
            }
        };
        let engine = Arc::new(engine);
        let limits = SchedulerLimits {
            max_batch,
            // Offline: every prompt of a call waits its turn.
            max_queue: usize::MAX,
            step_tokens: 512,
            ctx_size,
            prefix_cache_mb,
        };
        let config = admit(&limits, &engine)?;
        let scheduler = Scheduler::start(Arc::clone(&engine), config);
        Ok(Llm {
            engine,
            scheduler,
            hybrid,
            expert_cache: tier,
        })
    }

    /// Generates for each prompt (a string, a list of token ids, or a list of either),
    /// continuously batched (`max_batch` at a time) over the prefix cache. Returns one
    /// `RequestOutput` per prompt, in order.
    #[pyo3(signature = (prompts, sampling_params=None))]
    fn generate(
        &self,
        py: Python<'_>,
        prompts: &Bound<'_, PyAny>,
        sampling_params: Option<SamplingParams>,
    ) -> PyResult<Vec<RequestOutput>> {
        let items: Vec<Bound<'_, PyAny>> = if is_one_prompt(prompts)? {
            vec![prompts.clone()]
        } else {
            prompts.try_iter()?.collect::<PyResult<_>>()?
        };
        let mut inputs = Vec::with_capacity(items.len());
        for (i, p) in items.iter().enumerate() {
            if let Ok(text) = p.extract::<String>() {
                let ids = self
                    .engine
                    .text_prompt(&text)
                    .map_err(|e| runtime_err(&e))?;
                inputs.push((Some(text), ids));
            } else if let Ok(ids) = p.extract::<Vec<u32>>() {
                inputs.push((None, ids));
            } else {
                return Err(PyTypeError::new_err(format!(
                    "prompts[{i}]: expected a string or a list of token ids"
                )));
            }
        }
        self.run(py, inputs, sampling_params)
    }

    /// Replies to one conversation (a list of `{"role", "content"}` dicts) or to each of a
    /// list of them, formatted with the model's chat template.
    #[pyo3(signature = (messages, sampling_params=None))]
    fn chat(
        &self,
        py: Python<'_>,
        messages: &Bound<'_, PyAny>,
        sampling_params: Option<SamplingParams>,
    ) -> PyResult<Vec<RequestOutput>> {
        let list = messages.cast::<PyList>().map_err(|_| {
            PyTypeError::new_err(
                "messages: expected a list of {role, content} dicts, or a list of such lists",
            )
        })?;
        let conversations: Vec<Bound<'_, PyAny>> = match list.get_item(0) {
            Ok(first) if first.is_instance_of::<PyList>() => list.iter().collect(),
            _ => vec![list.clone().into_any()],
        };
        let mut inputs = Vec::with_capacity(conversations.len());
        for (c, conv) in conversations.iter().enumerate() {
            let msgs = chat_messages(conv, c)?;
            let ids = self
                .engine
                .chat_prompt(&msgs)
                .map_err(|e| runtime_err(&e))?;
            inputs.push((None, ids));
        }
        self.run(py, inputs, sampling_params)
    }

    /// The tokenizer's ids for `text` (with BOS where the model adds one).
    fn encode(&self, text: &str) -> PyResult<Vec<u32>> {
        self.engine.text_prompt(text).map_err(|e| runtime_err(&e))
    }

    /// The hybrid executor's statistics, summed since the model loaded (what `strata
    /// generate --device hybrid` prints): a dict with the policy, the expert tasks and
    /// (token, expert) pairs run on each device, cache hits and misses, uploads and their
    /// bytes, evictions, fallbacks, and the time of each device in seconds. `None` with
    /// `device='cpu'`, which has no executor.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.hybrid
            .as_deref()
            .map(|exec| crate::hybrid::stats(py, exec))
            .transpose()
    }

    /// The expert cache's statistics since the model loaded (what `strata generate` prints
    /// for `--expert-cache`): a dict with lookups, hits, experts found in flight, misses,
    /// experts fetched ahead and how many of the experts used were guessed
    /// (`guess_recall`), bytes read and the seconds reads took and the model waited, the
    /// slots, and the routing skew (`top30_share`: the share of lookups that went to each
    /// layer's most used 30% of experts). `None` when the experts are not behind the cache.
    fn expert_cache_stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.expert_cache
            .as_deref()
            .map(|tier| crate::expert_cache::stats(py, tier))
            .transpose()
    }
}

impl Llm {
    /// Generates for `(prompt text, prompt ids)` pairs on the scheduler, with the GIL
    /// released while they run.
    fn run(
        &self,
        py: Python<'_>,
        inputs: Vec<(Option<String>, Vec<u32>)>,
        params: Option<SamplingParams>,
    ) -> PyResult<Vec<RequestOutput>> {
        let params = match params {
            Some(p) => p,
            None => SamplingParams::new(16, 1.0, 1.0, 0, 0.0, 1.0, 0.0, 0.0, None, None)?,
        };
        let (tx, rx) = mpsc::channel::<(usize, Event)>();
        for (i, (_, ids)) in inputs.iter().enumerate() {
            let tx = tx.clone();
            let sink = Box::new(move |e| tx.send((i, e)).is_ok());
            // On a refusal, dropping `rx` cancels the requests already submitted.
            self.scheduler
                .submit(params.request(ids.clone()), sink)
                .map_err(|e| PyValueError::new_err(format!("prompt {i}: {e}")))?;
        }
        drop(tx);
        let n = inputs.len();
        let outputs = py.detach(move || collect(&rx, n))?;
        Ok(inputs
            .into_iter()
            .zip(outputs)
            .map(|((prompt, prompt_token_ids), o)| RequestOutput {
                prompt,
                prompt_token_ids,
                outputs: vec![CompletionOutput {
                    index: 0,
                    text: o.text,
                    token_ids: o.tokens,
                    finish_reason: match o.finish.expect("collect waits for every finish") {
                        FinishReason::Stop => "stop",
                        FinishReason::Length | FinishReason::ContextFull => "length",
                    },
                }],
            })
            .collect())
    }
}

/// One request's output, gathered from its events.
#[derive(Default)]
struct Gathered {
    text: String,
    tokens: Vec<u32>,
    finish: Option<FinishReason>,
}

/// Waits for `n` requests' events on `rx` (sent as `(request, event)`).
fn collect(rx: &mpsc::Receiver<(usize, Event)>, n: usize) -> PyResult<Vec<Gathered>> {
    let mut out: Vec<Gathered> = (0..n).map(|_| Gathered::default()).collect();
    let mut left = n;
    while left > 0 {
        let Ok((i, event)) = rx.recv() else {
            return Err(PyRuntimeError::new_err("the scheduler stopped"));
        };
        match event {
            Event::Token { id, text, .. } => {
                out[i].tokens.push(id);
                out[i].text.push_str(&text);
            }
            Event::Done { finish, text, .. } => {
                out[i].text.push_str(&text);
                out[i].finish = Some(finish);
                left -= 1;
            }
            Event::Failed(message) => {
                return Err(PyRuntimeError::new_err(format!("prompt {i}: {message}")));
            }
        }
    }
    Ok(out)
}

/// The scheduler configuration `limits` give on `engine`, or a Python error naming the
/// keyword argument to change.
fn admit(limits: &SchedulerLimits, engine: &Engine) -> PyResult<SchedulerConfig> {
    limits
        .admit(engine, Spelling::Keywords)
        .map_err(|e| match e {
            AdmissionError::Invalid(m) => PyValueError::new_err(m),
            e => runtime_err(&e),
        })
}

/// Whether `prompts` is one prompt (a string or a list of ints) rather than a list of them.
fn is_one_prompt(prompts: &Bound<'_, PyAny>) -> PyResult<bool> {
    if prompts.is_instance_of::<PyString>() {
        return Ok(true);
    }
    let list = prompts.cast::<PyList>().map_err(|_| {
        PyTypeError::new_err("prompts: expected a string, a list of token ids, or a list of either")
    })?;
    Ok(list
        .get_item(0)
        .is_ok_and(|first| first.extract::<u32>().is_ok()))
}

/// One conversation's messages.
fn chat_messages(conv: &Bound<'_, PyAny>, c: usize) -> PyResult<Vec<ChatMessage>> {
    let bad = |m: usize| {
        PyTypeError::new_err(format!(
            "messages[{c}][{m}]: expected a dict with string 'role' and 'content'"
        ))
    };
    let mut out = Vec::new();
    for (m, item) in conv.try_iter()?.enumerate() {
        let item = item?;
        let d = item.cast::<PyDict>().map_err(|_| bad(m))?;
        let field = |k: &str| -> PyResult<String> {
            d.get_item(k)?
                .and_then(|v| v.extract::<String>().ok())
                .ok_or_else(|| bad(m))
        };
        out.push(ChatMessage::new(&field("role")?, &field("content")?));
    }
    Ok(out)
}

/// Serves `model` over the OpenAI-compatible HTTP API until SIGTERM or Ctrl-C: the
/// `strata_server::run` that `strata serve` calls, on an engine loaded as above.
#[pyfunction]
#[pyo3(signature = (model, *, host="127.0.0.1", port=8080, dtype="fast", weights=None,
    max_batch=16, max_queue=256, ctx_size=None, step_tokens=512, prefix_cache_mb=1024,
    served_model_name=None, expert_cache=None, expert_cache_rule=None, expert_cache_pin=None))]
#[allow(clippy::too_many_arguments)]
pub fn serve(
    py: Python<'_>,
    model: PathBuf,
    host: &str,
    port: u16,
    dtype: &str,
    weights: Option<&str>,
    max_batch: usize,
    max_queue: usize,
    ctx_size: Option<usize>,
    step_tokens: usize,
    prefix_cache_mb: usize,
    served_model_name: Option<String>,
    expert_cache: Option<&Bound<'_, PyAny>>,
    expert_cache_rule: Option<&str>,
    expert_cache_pin: Option<PathBuf>,
) -> PyResult<()> {
    // Before the model loads, as `strata serve` does: the prefix cache's budget must hold in
    // resident memory.
    strata_kernels::limit_malloc_arenas(strata_server::MALLOC_ARENAS);
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::INFO)
        .try_init();
    let addr: SocketAddr = format!("{host}:{port}")
        .parse()
        .or_else(|_| format!("[{host}]:{port}").parse())
        .map_err(|_| PyValueError::new_err(format!("host: '{host}' is not an IP address")))?;
    let id = served_model_name.unwrap_or_else(|| {
        model
            .file_stem()
            .map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned())
    });
    let cache = crate::expert_cache::options(expert_cache, expert_cache_rule, expert_cache_pin)?;
    let mut engine = load_engine(py, model.clone(), load_options(dtype, weights)?)?;
    let tier = crate::expert_cache::attach(py, &mut engine, &model, &cache)?;
    let engine = Arc::new(engine);
    let limits = SchedulerLimits {
        max_batch,
        max_queue,
        step_tokens,
        ctx_size,
        prefix_cache_mb,
    };
    let config = admit(&limits, &engine)?;
    let mut state = AppState::new(engine, config, id);
    state.extra_metrics = tier.map(crate::expert_cache::metrics);
    let state = Arc::new(state);
    py.detach(|| strata_server::run(addr, state, strata_server::shutdown_signal()))
        .map_err(|e| runtime_err(&e))
}
