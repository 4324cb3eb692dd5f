//! Text in and out of the model: tokenizer, chat template, streaming detokenizer.
//!
//! - [`Tokenizer`] wraps a Hugging Face `tokenizer.json` (through the `tokenizers` crate)
//!   together with the special tokens and chat template of `tokenizer_config.json` and the
//!   end-of-sequence ids of `generation_config.json`.
//! - [`ChatTemplate`] renders a conversation into a prompt the way `transformers`'
//!   `apply_chat_template` does, with minijinja standing in for Python's jinja2.
//! - [`tools`] reads and writes tool calls in each template family's own syntax.
//! - [`StreamDecoder`] turns generated ids, one at a time, into text that is safe to show:
//!   whole UTF-8 characters only, and nothing that could still turn into a stop string.
//!
//! A key design decision made here is that the text layer mirrors the Python reference
//! behaviour rather than inventing its own (the same ids as `tokenizers`, the same prompt
//! as `transformers`), because a prompt that differs by one token from what the model was
//! trained with silently degrades every answer; the tests compare against strings and ids
//! produced by the Python packages.

mod stream;
mod template;
mod tokenizer;
pub mod tools;

use std::path::PathBuf;

pub use stream::{StopReason, StreamDecoder, StreamPiece};
pub use template::{ChatMessage, ChatTemplate};
pub use tokenizer::{Tokenizer, TokenizerMeta};

/// Errors of the text layer. Each names the file (or other origin) it is about.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A required file does not exist.
    #[error("missing {path}: {what}")]
    MissingFile {
        /// The file that was looked for.
        path: PathBuf,
        /// What the file is needed for.
        what: &'static str,
    },
    /// A JSON file could not be parsed.
    #[error("malformed json in {path}: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The parser's error.
        source: serde_json::Error,
    },
    /// A field of a configuration file has the wrong type or value.
    #[error("{origin}: field `{field}` should be {expected}, got {got}")]
    BadField {
        /// The file or other origin of the value.
        origin: String,
        /// The field.
        field: &'static str,
        /// What was expected.
        expected: &'static str,
        /// What was found, abbreviated.
        got: String,
    },
    /// A special token named in a configuration is not in the vocabulary.
    #[error("{origin}: {field} {token:?} is not in the tokenizer's vocabulary")]
    UnknownToken {
        /// The file or other origin of the name.
        origin: String,
        /// Which special token (`bos_token`, `eos_token`, ...).
        field: &'static str,
        /// The token's text.
        token: String,
    },
    /// An id is outside the vocabulary.
    #[error("{origin}: {field} id {id} is outside the vocabulary of {vocab_size} tokens")]
    IdOutOfRange {
        /// The file or other origin of the id.
        origin: String,
        /// Which special token.
        field: &'static str,
        /// The id.
        id: u64,
        /// The size of the vocabulary.
        vocab_size: usize,
    },
    /// The `tokenizers` crate rejected a tokenizer document.
    #[error("cannot load tokenizer from {origin}: {message}")]
    Load {
        /// The file or other origin of the document.
        origin: String,
        /// The `tokenizers` crate's message.
        message: String,
    },
    /// Encoding text failed.
    #[error("cannot encode text with the tokenizer from {origin}: {message}")]
    Encode {
        /// The tokenizer's origin.
        origin: String,
        /// The `tokenizers` crate's message.
        message: String,
    },
    /// Decoding ids failed.
    #[error("cannot decode ids with the tokenizer from {origin}: {message}")]
    Decode {
        /// The tokenizer's origin.
        origin: String,
        /// The `tokenizers` crate's message.
        message: String,
    },
    /// The model has no chat template.
    #[error(
        "{origin} has no chat template (no `chat_template` in tokenizer_config.json and no chat_template.jinja)"
    )]
    NoChatTemplate {
        /// The model directory or other origin.
        origin: String,
    },
    /// The chat template does not parse, or failed while rendering (including the
    /// template's own `raise_exception`).
    #[error("chat template from {origin}: {message}")]
    Template {
        /// The file or other origin of the template.
        origin: String,
        /// minijinja's message, with its detail.
        message: String,
    },
    /// A stop string is empty (it would match everywhere).
    #[error("stop string {index} is empty")]
    EmptyStop {
        /// Position of the stop string in the list given.
        index: usize,
    },
}
