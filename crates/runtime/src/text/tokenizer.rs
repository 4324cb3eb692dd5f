//! The model's tokenizer: a Hugging Face `tokenizer.json` plus the special tokens around it.
//!
//! [`Tokenizer`] loads either a model directory (`tokenizer.json`, `tokenizer_config.json`,
//! `generation_config.json`, `chat_template.jinja`) or a `tokenizer.json` document in memory
//! with its special tokens given as a [`TokenizerMeta`] (the GGUF loader builds both from
//! the file's metadata).
//!
//! A key design decision made here is where the beginning-of-sequence token comes from.
//! `transformers` adds it for some tokenizer classes (Llama, DeepSeek) outside
//! `tokenizer.json`, while others (Llama 3) add it in the document's post-processor. We
//! encode an empty string once at load: if the post-processor already adds the BOS token
//! we never add it again, so `encode(text, true)` gives `transformers`' ids in both cases.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{ChatTemplate, TextError};

/// Special tokens and the chat template that sit beside a `tokenizer.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenizerMeta {
    /// The beginning-of-sequence token, if the model has one.
    pub bos_id: Option<u32>,
    /// Every id that ends generation (the first is the primary one), may be empty.
    pub eos_ids: Vec<u32>,
    /// Whether `encode(text, true)` should start with `bos_id` (when the document's
    /// post-processor does not add it already).
    pub add_bos: bool,
    /// The Jinja chat template source, if the model has one.
    pub chat_template: Option<String>,
}

/// A loaded tokenizer with its special tokens. Cheap to share: `Send + Sync`.
#[derive(Debug)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    origin: String,
    meta: TokenizerMeta,
    /// True when `add_bos` is set and the document's post-processor does not add it.
    prepend_bos: bool,
}

impl Tokenizer {
    /// Loads the tokenizer of a Hugging Face model directory.
    ///
    /// `tokenizer.json` is required. `tokenizer_config.json` supplies `bos_token`,
    /// `eos_token`, `add_bos_token` and `chat_template`; `generation_config.json` supplies
    /// `eos_token_id` (a number or a list), which comes first in [`Tokenizer::eos_ids`];
    /// `chat_template.jinja`, when present, overrides the config's template as it does in
    /// `transformers`.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self, TextError> {
        let dir = dir.as_ref();
        let json_path = dir.join("tokenizer.json");
        if !json_path.is_file() {
            return Err(TextError::MissingFile {
                path: json_path,
                what: "the model's Hugging Face tokenizer",
            });
        }
        let bytes = read(&json_path)?;
        let origin = json_path.display().to_string();
        let inner = load_document(&bytes, &origin)?;

        let mut meta = TokenizerMeta::default();
        let config_path = dir.join("tokenizer_config.json");
        if let Some(config) = read_json_if_present(&config_path)? {
            let config_origin = config_path.display().to_string();
            let bos = special_token_text(&config, "bos_token", &config_origin)?;
            if let Some(bos) = bos {
                meta.bos_id = Some(lookup(&inner, &bos, "bos_token", &config_origin)?);
            }
            if let Some(eos) = special_token_text(&config, "eos_token", &config_origin)? {
                meta.eos_ids
                    .push(lookup(&inner, &eos, "eos_token", &config_origin)?);
            }
            meta.add_bos = match config.get("add_bos_token") {
                None | Some(Value::Null) => default_add_bos(&config),
                Some(Value::Bool(b)) => *b,
                Some(other) => {
                    return Err(bad_field(
                        &config_origin,
                        "add_bos_token",
                        "a boolean",
                        other,
                    ));
                }
            };
            meta.chat_template = chat_template_of(&config, &config_origin)?;
        }

        let generation_path = dir.join("generation_config.json");
        if let Some(generation) = read_json_if_present(&generation_path)? {
            let generation_origin = generation_path.display().to_string();
            let ids = eos_ids_of(&generation, &generation_origin)?;
            // generation_config.json is what `generate` stops on; keep its order first.
            let from_config = std::mem::take(&mut meta.eos_ids);
            meta.eos_ids = ids;
            for id in from_config {
                if !meta.eos_ids.contains(&id) {
                    meta.eos_ids.push(id);
                }
            }
        }

        let template_path = dir.join("chat_template.jinja");
        if template_path.is_file() {
            let bytes = read(&template_path)?;
            let source = String::from_utf8(bytes).map_err(|e| TextError::BadField {
                origin: template_path.display().to_string(),
                field: "chat template",
                expected: "UTF-8 text",
                got: format!("invalid UTF-8 at byte {}", e.utf8_error().valid_up_to()),
            })?;
            meta.chat_template = Some(source);
        }

        Self::with_meta(inner, origin, meta)
    }

    /// Builds a tokenizer from a `tokenizer.json` document in memory and its special
    /// tokens. `origin` names where the document came from, for error messages (for
    /// example the GGUF file it was built from).
    pub fn from_json_bytes(
        bytes: &[u8],
        meta: TokenizerMeta,
        origin: impl Into<String>,
    ) -> Result<Self, TextError> {
        let origin = origin.into();
        let inner = load_document(bytes, &origin)?;
        Self::with_meta(inner, origin, meta)
    }

    fn with_meta(
        inner: tokenizers::Tokenizer,
        origin: String,
        meta: TokenizerMeta,
    ) -> Result<Self, TextError> {
        let vocab_size = inner.get_vocab_size(true);
        let check = |field: &'static str, id: u32| {
            if (id as usize) < vocab_size {
                Ok(())
            } else {
                Err(TextError::IdOutOfRange {
                    origin: origin.clone(),
                    field,
                    id: id.into(),
                    vocab_size,
                })
            }
        };
        if let Some(bos) = meta.bos_id {
            check("bos_token", bos)?;
        }
        for &eos in &meta.eos_ids {
            check("eos_token", eos)?;
        }
        let prepend_bos = match meta.bos_id {
            Some(bos) if meta.add_bos => {
                let probe = inner.encode_fast("", true).map_err(|e| TextError::Encode {
                    origin: origin.clone(),
                    message: e.to_string(),
                })?;
                !probe.get_ids().contains(&bos)
            }
            _ => false,
        };
        Ok(Self {
            inner,
            origin,
            meta,
            prepend_bos,
        })
    }

    /// Encodes text into ids. With `add_special`, the document's post-processor runs and
    /// the BOS token is prepended when the configuration asks for it: the ids
    /// `transformers`' `tokenizer(text)` gives. Encode a rendered chat prompt with
    /// `add_special = false`: the template already wrote its special tokens.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, TextError> {
        let encoding =
            self.inner
                .encode_fast(text, add_special)
                .map_err(|e| TextError::Encode {
                    origin: self.origin.clone(),
                    message: e.to_string(),
                })?;
        let ids = encoding.get_ids();
        match self.meta.bos_id {
            Some(bos) if add_special && self.prepend_bos => {
                let mut out = Vec::with_capacity(ids.len() + 1);
                out.push(bos);
                out.extend_from_slice(ids);
                Ok(out)
            }
            _ => Ok(ids.to_vec()),
        }
    }

    /// Decodes ids into text; with `skip_special`, special tokens (`<|im_end|>`...) are
    /// left out. Bytes that do not form whole UTF-8 characters become U+FFFD; use
    /// [`super::StreamDecoder`] for text that grows token by token.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TextError> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| TextError::Decode {
                origin: self.origin.clone(),
                message: e.to_string(),
            })
    }

    /// The ids that end generation (may be empty).
    pub fn eos_ids(&self) -> &[u32] {
        &self.meta.eos_ids
    }

    /// The beginning-of-sequence id, if the model has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.meta.bos_id
    }

    /// Number of ids the tokenizer knows, added tokens included. The model's embedding
    /// table may be larger (padded); its extra rows have no text.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of a token's text (`"<|im_start|>"`), if it is in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The id of `text` if it is one special token of the vocabulary (`[TOOL_CALLS]` in
    /// Mistral's), which decoding leaves out of the text.
    pub fn special_token_id(&self, text: &str) -> Option<u32> {
        self.inner
            .get_added_tokens_decoder()
            .into_iter()
            .find(|(_, t)| t.special && t.content == text)
            .map(|(id, _)| id)
    }

    /// The text of an id as stored in the vocabulary (byte-level BPE shows `Ġ` for a
    /// space), if the id is in the vocabulary.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The Hugging Face tokenizer inside (the grammar engine reads its vocabulary).
    pub(crate) fn hf(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// The special tokens and template this tokenizer was loaded with.
    pub fn meta(&self) -> &TokenizerMeta {
        &self.meta
    }

    /// Where the tokenizer was loaded from (a file path or the origin given).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The model's chat template, with `bos_token` and `eos_token` set from this
    /// tokenizer's special tokens.
    pub fn chat_template(&self) -> Result<ChatTemplate, TextError> {
        let source =
            self.meta
                .chat_template
                .as_deref()
                .ok_or_else(|| TextError::NoChatTemplate {
                    origin: self.origin.clone(),
                })?;
        self.chat_template_from(source, &self.origin)
    }

    /// Compiles another chat template `source` (a client's override) with this tokenizer's
    /// `bos_token` and `eos_token`; `origin` names it in errors.
    pub fn chat_template_from(
        &self,
        source: &str,
        origin: &str,
    ) -> Result<ChatTemplate, TextError> {
        let bos = self.meta.bos_id.and_then(|id| self.inner.id_to_token(id));
        let eos = self
            .meta
            .eos_ids
            .first()
            .and_then(|&id| self.inner.id_to_token(id));
        ChatTemplate::new(source, bos.as_deref(), eos.as_deref(), origin)
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TextError> {
    std::fs::read(path).map_err(|source| TextError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn load_document(bytes: &[u8], origin: &str) -> Result<tokenizers::Tokenizer, TextError> {
    tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| TextError::Load {
        origin: origin.to_string(),
        message: e.to_string(),
    })
}

fn read_json_if_present(path: &Path) -> Result<Option<Value>, TextError> {
    if !path.is_file() {
        return Ok(None);
    }
    let bytes = read(path)?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|source| TextError::Json {
            path: PathBuf::from(path),
            source,
        })
}

fn abbreviate(value: &Value) -> String {
    let mut s = value.to_string();
    if s.len() > 80 {
        let mut cut = 77;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

fn bad_field(origin: &str, field: &'static str, expected: &'static str, got: &Value) -> TextError {
    TextError::BadField {
        origin: origin.to_string(),
        field,
        expected,
        got: abbreviate(got),
    }
}

/// A special token as `tokenizer_config.json` writes it: a string, an `AddedToken`
/// object with `content`, or null.
fn special_token_text(
    config: &Value,
    field: &'static str,
    origin: &str,
) -> Result<Option<String>, TextError> {
    match config.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Object(o)) => match o.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(bad_field(
                origin,
                field,
                "a string or an object with a string `content`",
                &Value::Object(o.clone()),
            )),
        },
        Some(other) => Err(bad_field(
            origin,
            field,
            "a string or an object with a string `content`",
            other,
        )),
    }
}

fn lookup(
    inner: &tokenizers::Tokenizer,
    token: &str,
    field: &'static str,
    origin: &str,
) -> Result<u32, TextError> {
    inner
        .token_to_id(token)
        .ok_or_else(|| TextError::UnknownToken {
            origin: origin.to_string(),
            field,
            token: token.to_string(),
        })
}

/// `transformers`' Llama tokenizers add BOS unless told otherwise; the others do not.
fn default_add_bos(config: &Value) -> bool {
    config
        .get("tokenizer_class")
        .and_then(Value::as_str)
        .is_some_and(|class| class.starts_with("LlamaTokenizer"))
}

/// `chat_template` is a string, or a list of `{name, template}` of which `default` is the
/// one `apply_chat_template` uses.
fn chat_template_of(config: &Value, origin: &str) -> Result<Option<String>, TextError> {
    const EXPECTED: &str = "a string or a list of {name, template} with a `default`";
    match config.get("chat_template") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(list @ Value::Array(items)) => {
            for item in items {
                if item.get("name").and_then(Value::as_str) == Some("default") {
                    return match item.get("template") {
                        Some(Value::String(s)) => Ok(Some(s.clone())),
                        _ => Err(bad_field(origin, "chat_template", EXPECTED, list)),
                    };
                }
            }
            Err(bad_field(origin, "chat_template", EXPECTED, list))
        }
        Some(other) => Err(bad_field(origin, "chat_template", EXPECTED, other)),
    }
}

/// `eos_token_id` of `generation_config.json`: a number, a list of numbers, or absent.
fn eos_ids_of(config: &Value, origin: &str) -> Result<Vec<u32>, TextError> {
    const EXPECTED: &str = "a token id or a list of token ids";
    let as_id = |v: &Value| {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| bad_field(origin, "eos_token_id", EXPECTED, v))
    };
    match config.get("eos_token_id") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => {
            let mut ids = Vec::with_capacity(items.len());
            for item in items {
                let id = as_id(item)?;
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
            Ok(ids)
        }
        Some(single) => Ok(vec![as_id(single)?]),
    }
}
