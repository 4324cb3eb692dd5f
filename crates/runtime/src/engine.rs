//! The engine: a loaded model on its backend with its tokenizer and chat template.
//!
//! A key design decision made here is that the engine has no generation loop of its own:
//! every front end generates through the scheduler's ([`crate::scheduler`]; a whole batch
//! up front through `scheduler::generate_batch`), so the command line, the server's
//! continuous batching, `chat` and offline batch jobs all chunk prompts, batch decodes,
//! sample, stop and count through the same code.

use std::path::Path;
use std::sync::OnceLock;

use strata_formats::gguf::GgufFile;
use strata_formats::strata_file::StrataFile;
use strata_model::source::Source;
use strata_model::{LoadOptions, Model};

use strata_model::backend::{Backend, BackendError};

use crate::grammar::{Grammar, GrammarCompiler, GrammarError, ResponseFormat};
use crate::sampling::SamplingError;
pub use crate::step::FinishReason;
use crate::step::StepError;
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
    /// Generation stopped partway (a forward pass failed).
    #[error("request {index}: {message}")]
    Generation {
        /// Which request.
        index: usize,
        /// What went wrong.
        message: String,
    },
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
    /// keeps its caches, beside `prefix_bytes` of prefix cache in host memory; `lower` says
    /// which options lower the need.
    pub fn check_cache_memory(&self, positions: u64, prefix_bytes: u64, lower: &str) -> Result<()> {
        let memory = self.model.cache_memory();
        Ok(strata_model::backend::check_cache_memory(
            &memory,
            positions,
            prefix_bytes,
            lower,
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
}
