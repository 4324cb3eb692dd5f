//! Generation: a loaded model with its tokenizer and chat template, and a loop that runs a
//! batch of requests together (chunked prefill, then one batched forward per decode step),
//! sampling, streaming text and stopping on EOS, stop strings, length or context.
//!
//! A key design decision made here is that every decode step runs all active sequences in
//! one forward pass, even for a single request: the same code path then serves the command
//! line, the server's continuous batching and offline batch jobs.

use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use strata_formats::gguf::GgufFile;
use strata_formats::strata_file::StrataFile;
use strata_model::source::Source;
use strata_model::{LoadOptions, LogitsWanted, Model};

use strata_model::backend::{Backend, BackendError, BatchSeq, SeqCache};

use crate::grammar::{Grammar, GrammarCompiler, GrammarError, GrammarStats, ResponseFormat};
use crate::sampling::{Sampler, SamplingError, SamplingParams};
pub use crate::step::FinishReason;
use crate::step::{SequenceOptions, SequenceState, StepError};
use crate::text::{ChatMessage, ChatTemplate, TextError, Tokenizer, TokenizerMeta};

/// Errors from generation.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The model failed to load.
    #[error(transparent)]
    Model(#[from] strata_model::Error),
    /// A forward pass failed on the backend.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// Tokenizer or chat template problem.
    #[error(transparent)]
    Text(#[from] TextError),
    /// A model file is malformed.
    #[error(transparent)]
    Format(#[from] strata_formats::Error),
    /// Invalid sampling settings.
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    /// A structured-output grammar could not be built or run.
    #[error(transparent)]
    Grammar(#[from] GrammarError),
    /// The request cannot be served as given.
    #[error("{0}")]
    Request(String),
}

impl From<StepError> for EngineError {
    fn from(e: StepError) -> Self {
        match e {
            StepError::Sampling(e) => EngineError::Sampling(e),
            StepError::Text(e) => EngineError::Text(e),
            StepError::Grammar(e) => EngineError::Grammar(e),
        }
    }
}

/// Result alias for this module.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// The tokenizer of a model directory or `.gguf` file.
pub fn load_tokenizer(path: &Path) -> Result<Tokenizer> {
    let (_, src) = strata_model::model::open(path)?;
    source_tokenizer(path, &src)
}

fn source_tokenizer(path: &Path, src: &Source) -> Result<Tokenizer> {
    match src {
        Source::Gguf(g) => gguf_tokenizer(g),
        Source::Safetensors(_) => Ok(Tokenizer::from_dir(path)?),
        Source::Strata(f) => strata_tokenizer(f),
    }
}

/// The tokenizer a converted model carries: its `tokenizer.json` blob and the special
/// tokens and chat template in its metadata (written by `strata convert`).
fn strata_tokenizer(f: &StrataFile) -> Result<Tokenizer> {
    let bytes = f
        .blob("tokenizer.json")
        .ok_or_else(|| TextError::MissingFile {
            path: f.path().to_owned(),
            what: "a tokenizer.json inside the converted model (its source had none)",
        })?;
    let m = &f.metadata()["tokenizer"];
    let id = |v: &serde_json::Value| v.as_u64().and_then(|v| u32::try_from(v).ok());
    let meta = TokenizerMeta {
        bos_id: id(&m["bos_id"]),
        eos_ids: m["eos_ids"]
            .as_array()
            .map(|a| a.iter().filter_map(id).collect())
            .unwrap_or_default(),
        add_bos: m["add_bos"].as_bool().unwrap_or(false),
        chat_template: m["chat_template"].as_str().map(str::to_owned),
    };
    Ok(Tokenizer::from_json_bytes(
        bytes,
        meta,
        f.path().display().to_string(),
    )?)
}

/// The tokenizer and chat template stored in a GGUF file's metadata.
fn gguf_tokenizer(g: &GgufFile) -> Result<Tokenizer> {
    use strata_formats::gguf::tokenizer::{chat_template, special_tokens, tokenizer_json};
    let doc = tokenizer_json(g)?;
    let special = special_tokens(g);
    let meta = TokenizerMeta {
        bos_id: special.bos,
        eos_ids: special.eos.into_iter().chain(special.eot).collect(),
        add_bos: special.add_bos,
        chat_template: chat_template(g).map(str::to_owned),
    };
    let bytes = serde_json::to_vec(&doc).map_err(|e| EngineError::Request(e.to_string()))?;
    Ok(Tokenizer::from_json_bytes(
        &bytes,
        meta,
        g.path().display().to_string(),
    )?)
}

/// One generation request.
#[derive(Debug, Clone)]
pub struct Request {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Sampling settings.
    pub sampling: SamplingParams,
    /// Strings that end generation (not included in the output).
    pub stop: Vec<String>,
    /// A grammar the output must follow (structured outputs).
    pub grammar: Option<Grammar>,
}

/// What one request produced.
#[derive(Debug, Clone)]
pub struct Output {
    /// Generated ids: every counted token, the one that completed a stop string included,
    /// a final end-of-sequence id excluded (see [`crate::step`]).
    pub tokens: Vec<u32>,
    /// Generated text (up to a stop string).
    pub text: String,
    /// Why it ended.
    pub finish: FinishReason,
    /// Time spent on its grammar, when it had one.
    pub grammar: Option<GrammarStats>,
}

/// Timing of a generation run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stats {
    /// Prompt tokens processed.
    pub prompt_tokens: usize,
    /// Wall time of prefill (until the first tokens were sampled).
    pub prefill: Duration,
    /// Tokens generated (after the first).
    pub decode_tokens: usize,
    /// Wall time of decoding.
    pub decode: Duration,
}

impl Stats {
    /// Prompt tokens per second.
    pub fn prefill_tps(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill.as_secs_f64().max(1e-9)
    }
    /// Generated tokens per second (decode phase).
    pub fn decode_tps(&self) -> f64 {
        self.decode_tokens as f64 / self.decode.as_secs_f64().max(1e-9)
    }
}

/// A model ready to generate: weights on a backend, tokenizer, chat template.
#[derive(Debug)]
pub struct Engine {
    /// The model, on the backend that runs it.
    pub model: Box<dyn Backend>,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
    /// Tokens per prefill forward pass.
    pub prefill_chunk: usize,
    /// Built on first use: the token trie costs time and memory that requests without a
    /// response format never need.
    grammars: OnceLock<Result<GrammarCompiler, GrammarError>>,
}

impl Engine {
    /// Loads a Hugging Face model directory or a `.gguf` file, with its tokenizer.
    pub fn load(path: &Path, opts: impl Into<LoadOptions>) -> Result<Engine> {
        Engine::load_with_progress(path, opts, &mut |_, _| {})
    }

    /// [`Engine::load`], telling `progress` how far the model's load has come (see
    /// [`Model::from_source_with_progress`]).
    pub fn load_with_progress(
        path: &Path,
        opts: impl Into<LoadOptions>,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Engine> {
        let (config, src) = strata_model::model::open(path)?;
        let tokenizer = source_tokenizer(path, &src)?;
        let model = Model::from_source_with_progress(config, &src, opts.into(), progress)?;
        Engine::new(Box::new(model), tokenizer)
    }

    /// Assembles an engine on `model`'s backend; compiles the tokenizer's chat template if
    /// it has one.
    pub fn new(model: Box<dyn Backend>, tokenizer: Tokenizer) -> Result<Engine> {
        let template = match &tokenizer.meta().chat_template {
            Some(src) => {
                let tok = |id: Option<u32>| id.and_then(|i| tokenizer.id_to_token(i));
                let bos = tok(tokenizer.bos_id());
                let eos = tok(tokenizer.eos_ids().first().copied());
                Some(ChatTemplate::new(
                    src,
                    bos.as_deref(),
                    eos.as_deref(),
                    "chat template",
                )?)
            }
            None => None,
        };
        Ok(Engine {
            model,
            tokenizer,
            template,
            prefill_chunk: 512,
            grammars: OnceLock::new(),
        })
    }

    /// Fails unless `positions` cached positions (all sequences) fit where the backend
    /// keeps its caches; `lower` says which options lower the need.
    pub fn check_cache_memory(&self, positions: u64, lower: &str) -> Result<()> {
        let memory = self.model.cache_memory();
        Ok(strata_model::backend::check_cache_memory(
            &memory, positions, 0, lower,
        )?)
    }

    /// Compiles a response format against this model's tokenizer and vocabulary.
    pub fn compile_format(&self, format: &ResponseFormat) -> Result<Grammar, GrammarError> {
        let compiler = self
            .grammars
            .get_or_init(|| GrammarCompiler::new(&self.tokenizer, self.model.config().vocab_size));
        match compiler {
            Ok(c) => c.compile(format),
            Err(e) => Err(e.clone()),
        }
    }

    /// Renders one user message with the chat template and tokenizes it.
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        let template = self.template.as_ref().ok_or_else(|| {
            EngineError::Request("the model has no chat template; use a plain prompt".into())
        })?;
        let text = template.render(messages, true)?;
        // Templates write the BOS token themselves where the model wants it.
        Ok(self.tokenizer.encode(&text, false)?)
    }

    /// Tokenizes a plain prompt (with BOS if the model adds one).
    pub fn text_prompt(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.tokenizer.encode(text, true)?)
    }

    /// Generates for every request together. `on_text(i, piece)` receives request `i`'s
    /// text as it is decoded.
    pub fn generate_batch(
        &self,
        requests: &[Request],
        mut on_text: impl FnMut(usize, &str),
    ) -> Result<(Vec<Output>, Stats)> {
        let max_ctx = self.model.config().max_position_embeddings;
        for (i, r) in requests.iter().enumerate() {
            if r.prompt.is_empty() {
                return Err(EngineError::Request(format!(
                    "request {i}: the prompt is empty"
                )));
            }
            if r.prompt.len() >= max_ctx {
                return Err(EngineError::Request(format!(
                    "request {i}: prompt of {} tokens does not fit the context of {max_ctx}",
                    r.prompt.len()
                )));
            }
        }
        let mut states = requests
            .iter()
            .map(|r| {
                let opts = SequenceOptions {
                    max_tokens: r.max_tokens,
                    ctx_size: max_ctx,
                    stop: &r.stop,
                    ignore_eos: false,
                    top_logprobs: None,
                    keep_special: &[],
                };
                let sampler = Sampler::new(r.sampling.clone())?;
                let mut state = SequenceState::new(&self.tokenizer, sampler, &r.prompt, opts)?;
                if let Some(g) = &r.grammar {
                    state.constrain(g.clone())?;
                }
                Ok(state)
            })
            .collect::<Result<Vec<_>>>()?;
        let mut caches = requests
            .iter()
            .map(|r| {
                self.model
                    .new_cache((r.prompt.len() + r.max_tokens).min(max_ctx))
            })
            .collect::<Result<Vec<Box<dyn SeqCache>>, _>>()?;
        let mut stats = Stats {
            prompt_tokens: requests.iter().map(|r| r.prompt.len()).sum(),
            ..Stats::default()
        };

        // Prefill in rounds of one chunk per unfinished prompt.
        let started = Instant::now();
        let mut last_logits: Vec<Vec<f32>> = vec![Vec::new(); requests.len()];
        let chunk = self.prefill_chunk.max(1);
        let rounds = requests
            .iter()
            .map(|r| r.prompt.len().div_ceil(chunk))
            .max()
            .unwrap_or(0);
        for round in 0..rounds {
            let mut idx = Vec::new();
            let mut seqs = Vec::new();
            for (i, (r, cache)) in requests.iter().zip(caches.iter_mut()).enumerate() {
                let start = round * chunk;
                if start >= r.prompt.len() {
                    continue;
                }
                let end = (start + chunk).min(r.prompt.len());
                idx.push(i);
                seqs.push(BatchSeq {
                    tokens: &r.prompt[start..end],
                    cache: &mut **cache,
                    logits: if end == r.prompt.len() {
                        LogitsWanted::Last
                    } else {
                        LogitsWanted::None
                    },
                });
            }
            for (i, logits) in idx.into_iter().zip(self.model.forward(&mut seqs)?) {
                if !logits.is_empty() {
                    last_logits[i] = logits;
                }
            }
        }
        stats.prefill = started.elapsed();

        let started = Instant::now();
        let mut texts: Vec<String> = vec![String::new(); requests.len()];
        let mut first_step = true;
        loop {
            // Sample one token for every active sequence from its last logits.
            for (i, state) in states.iter_mut().enumerate() {
                if state.finish().is_some() {
                    continue;
                }
                let outcome = state.accept(&last_logits[i])?;
                if !first_step {
                    stats.decode_tokens += 1;
                }
                for text in [outcome.text, outcome.tail] {
                    if !text.is_empty() {
                        on_text(i, &text);
                        texts[i].push_str(&text);
                    }
                }
            }
            first_step = false;
            let active: Vec<usize> = (0..requests.len())
                .filter(|&i| states[i].finish().is_none())
                .collect();
            if active.is_empty() {
                break;
            }
            let seqs = states.iter().zip(caches.iter_mut());
            let mut seqs: Vec<BatchSeq<'_>> = seqs
                .filter(|(state, _)| state.finish().is_none())
                .map(|(state, cache)| BatchSeq {
                    tokens: state.next_input(),
                    cache: &mut **cache,
                    logits: LogitsWanted::Last,
                })
                .collect();
            for (&i, logits) in active.iter().zip(self.model.forward(&mut seqs)?) {
                last_logits[i] = logits;
            }
        }
        stats.decode = started.elapsed();
        let outputs = states
            .into_iter()
            .zip(texts)
            .map(|(state, text)| Output {
                finish: state.finish().cloned().expect("every request finished"),
                grammar: state.grammar_stats(),
                tokens: state.into_generated(),
                text,
            })
            .collect();
        Ok((outputs, stats))
    }
}
