//! Structured outputs: a grammar that allows, token by token, only what keeps the output
//! valid (a JSON object, or JSON that matches a schema).
//!
//! A [`GrammarCompiler`] is built once per tokenizer (the token trie and the engine's lexer
//! slices); it compiles a [`ResponseFormat`] into a [`Grammar`], which is cheap to clone
//! (one per sampled choice). [`Grammar::start`] turns it into a running [`Constraint`]:
//! [`SequenceState::accept`](crate::step::SequenceState::accept) masks the logits with it
//! before sampling and advances it with the sampled token.
//!
//! The engine is [llguidance](https://github.com/guidance-ai/llguidance), the Rust library
//! behind llama.cpp's and vLLM's structured outputs: an Earley parser over a lazily built
//! lexer that computes a mask over a 128k vocabulary in about 50 µs, and a JSON-schema
//! compiler that refuses the keywords it cannot enforce by name (`Unimplemented keys:
//! ["not"]`), which is what a client needs in its 400. We build its token trie from our own
//! tokenizer's vocabulary (bytes per token) instead of using `toktrie_hf_tokenizers`, which
//! pins `tokenizers` 0.21 and would bring a second copy of it next to our 0.23.
//!
//! A key design decision made here is where the mask is computed: each constrained sequence
//! has a helper thread that computes the next mask as soon as the sampled token is committed,
//! so the work runs while the next forward pass does, and the sampling thread only waits
//! for whatever of it is left (the time [`GrammarStats`] reports as `wait`).
//!
//! JSON is generated compactly (`,` and `:` without free whitespace): a model cannot then
//! spend its token budget on whitespace, and every output has one canonical spelling. A
//! schema's own `x-guidance` object (llguidance's options) overrides this.

use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};
use llguidance::{CancellationHandle, Matcher, ParserFactory};
use serde_json::{Value, json};

use crate::text::Tokenizer;

/// What the output must be.
#[derive(Debug, Clone, PartialEq)]
pub enum ResponseFormat {
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// JSON valid for this schema (OpenAI's `json_schema`).
    JsonSchema(Value),
    /// A sentence of this grammar in llguidance's Lark dialect (tool calls, written by
    /// [`crate::text::tools::tool_grammar`]).
    Lark(String),
}

/// Why a grammar could not be built or run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GrammarError {
    /// The tokenizer's tokens cannot be mapped to bytes.
    #[error(
        "structured outputs need a byte-level or byte-fallback tokenizer, but {origin} decodes with {decoder}"
    )]
    Tokenizer {
        /// Where the tokenizer came from.
        origin: String,
        /// Its decoder, as found.
        decoder: String,
    },
    /// The tokenizer has no end-of-sequence id, so a finished output cannot end.
    #[error("structured outputs need an end-of-sequence token, and {origin} has none")]
    NoEos {
        /// Where the tokenizer came from.
        origin: String,
    },
    /// The schema is invalid or uses a feature the engine cannot enforce.
    #[error("{0}")]
    Schema(String),
    /// The grammar engine failed while generating.
    #[error("grammar engine: {0}")]
    Engine(String),
}

/// Compiles response formats against one tokenizer.
pub struct GrammarCompiler {
    factory: ParserFactory,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler")
            .field("vocab", &self.factory.tok_env().tok_trie().vocab_size())
            .finish_non_exhaustive()
    }
}

impl GrammarCompiler {
    /// Builds the token trie of `tokenizer` for logits of `vocab_size` entries (the model's
    /// vocabulary, which may be padded past the tokenizer's).
    pub fn new(tokenizer: &Tokenizer, vocab_size: usize) -> Result<Self, GrammarError> {
        let mut words = token_bytes(tokenizer)?;
        let eos = tokenizer.eos_ids();
        let Some(&first_eos) = eos.first() else {
            return Err(GrammarError::NoEos {
                origin: tokenizer.origin().to_owned(),
            });
        };
        // Ids the tokenizer does not know (padding of the model's vocabulary) are special
        // tokens no grammar allows.
        while words.len() < vocab_size {
            let mut w = format!(".<[{}]>", words.len()).into_bytes();
            w[0] = TokTrie::SPECIAL_TOKEN_MARKER;
            words.push(w);
        }
        let info = TokRxInfo::new(words.len() as u32, first_eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eos);
        // Approximate: literals in a grammar are tokenized greedily on the trie, which only
        // matters for forced tokens, which we do not use.
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Engine(e.to_string()))?;
        // Errors come back as values; nothing is printed to stderr.
        factory.quiet();
        Ok(GrammarCompiler { factory })
    }

    /// Compiles `format`; the error names the unsupported feature or the invalid part.
    pub fn compile(&self, format: &ResponseFormat) -> Result<Grammar, GrammarError> {
        let mut schema = match format {
            ResponseFormat::JsonObject => json!({"type": "object"}),
            ResponseFormat::JsonSchema(Value::Bool(true)) => json!({}),
            ResponseFormat::JsonSchema(s) => s.clone(),
            ResponseFormat::Lark(g) => return self.build(TopLevelGrammar::from_lark(g.clone())),
        };
        let Some(obj) = schema.as_object_mut() else {
            return Err(GrammarError::Schema(
                "the schema must be a JSON object (or true)".into(),
            ));
        };
        obj.entry("x-guidance").or_insert_with(
            || json!({"whitespace_flexible": false, "item_separator": ",", "key_separator": ":"}),
        );
        self.build(TopLevelGrammar::from_json_schema(schema))
    }

    fn build(&self, grammar: TopLevelGrammar) -> Result<Grammar, GrammarError> {
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| GrammarError::Schema(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::Schema(e));
        }
        Ok(Grammar {
            matcher: matcher.into_cancellable(),
            triggers: Vec::new(),
        })
    }
}

/// The bytes of every token of `tokenizer`, with special tokens marked as llguidance
/// expects (a leading 0xFF), from its byte-level alphabet or its `<0xNN>` byte tokens.
fn token_bytes(tokenizer: &Tokenizer) -> Result<Vec<Vec<u8>>, GrammarError> {
    let hf = tokenizer.hf();
    let decoder = hf
        .get_decoder()
        .and_then(|d| serde_json::to_value(d).ok())
        .unwrap_or(Value::Null);
    let mut kinds = Vec::new();
    decoder_kinds(&decoder, &mut kinds);
    let byte_level = kinds.iter().any(|(k, _)| k == "ByteLevel");
    let byte_fallback = kinds.iter().any(|(k, _)| k == "ByteFallback");
    if !byte_level && !byte_fallback {
        return Err(GrammarError::Tokenizer {
            origin: tokenizer.origin().to_owned(),
            decoder: decoder
                .get("type")
                .map_or("no decoder".into(), Value::to_string),
        });
    }
    // SentencePiece writes spaces as U+2581; the Replace decoder says which character.
    let space = kinds
        .iter()
        .find_map(|(k, c)| (k == "Replace").then_some(*c).flatten())
        .unwrap_or('\u{2581}');
    let alphabet = byte_level_alphabet();
    let added = hf.get_added_tokens_decoder();
    let n = hf.get_vocab_size(true);
    let mut words = vec![Vec::new(); n];
    for (id, word) in words.iter_mut().enumerate() {
        if let Some(t) = added.get(&(id as u32)) {
            *word = t.content.clone().into_bytes();
            if t.special {
                word.insert(0, TokTrie::SPECIAL_TOKEN_MARKER);
            }
            continue;
        }
        let Some(name) = hf.id_to_token(id as u32) else {
            continue;
        };
        // A token that maps to no bytes stays empty: no grammar ever allows it.
        *word = if byte_level {
            name.chars()
                .map(|c| alphabet.iter().position(|&a| a == c).map(|b| b as u8))
                .collect::<Option<Vec<u8>>>()
                .unwrap_or_default()
        } else {
            match byte_token(&name) {
                Some(b) => vec![b],
                None => name.replace(space, " ").into_bytes(),
            }
        };
    }
    Ok(words)
}

/// Every decoder in a (possibly nested) decoder sequence: its type, and for a `Replace`
/// that writes a space, the character it replaces.
fn decoder_kinds(d: &Value, out: &mut Vec<(String, Option<char>)>) {
    let Some(kind) = d.get("type").and_then(Value::as_str) else {
        return;
    };
    if let Some(list) = d.get("decoders").and_then(Value::as_array) {
        for d in list {
            decoder_kinds(d, out);
        }
    }
    let replaced = (kind == "Replace" && d["content"] == " ")
        .then(|| d["pattern"]["String"].as_str())
        .flatten()
        .and_then(|s| {
            let mut chars = s.chars();
            chars.next().filter(|_| chars.next().is_none())
        });
    out.push((kind.to_owned(), replaced));
}

/// GPT-2's byte-level alphabet: the character that stands for each byte.
fn byte_level_alphabet() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut next = 0x100u32;
    for b in 0..=255u8 {
        let c = b as char;
        out[b as usize] = if matches!(c, '!'..='~' | '\u{A1}'..='\u{AC}' | '\u{AE}'..='\u{FF}') {
            c
        } else {
            next += 1;
            char::from_u32(next - 1).unwrap_or('\0')
        };
    }
    out
}

/// The byte of a byte-fallback token `<0xNN>`.
fn byte_token(name: &str) -> Option<u8> {
    let hex = name.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// A compiled grammar, not yet running; clone it for each sequence it constrains.
///
/// A grammar made [lazy](Grammar::lazy) leaves the output free until one of its trigger
/// texts appears in it, and constrains what follows from the trigger on (llama.cpp's lazy
/// grammars): `tool_choice: "auto"` lets the model answer in text or call a tool, and a
/// call, once begun, is valid.
#[derive(Clone)]
pub struct Grammar {
    matcher: Matcher,
    /// Empty: the grammar constrains from the first token.
    triggers: Vec<String>,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("triggers", &self.triggers)
            .finish_non_exhaustive()
    }
}

impl Grammar {
    /// This grammar, started only where one of `triggers` appears in the output: every
    /// sentence of the grammar must begin with the trigger that starts it.
    pub fn lazy(mut self, triggers: Vec<String>) -> Grammar {
        self.triggers = triggers;
        self
    }

    /// The texts that start a lazy grammar (empty for one that constrains from the start).
    pub fn triggers(&self) -> &[String] {
        &self.triggers
    }

    /// Whether `tokens` are a complete sentence of the grammar.
    #[cfg(test)]
    pub(crate) fn accepts(mut self, tokens: &[u32]) -> bool {
        self.matcher.consume_tokens(tokens).is_ok() && self.matcher.is_accepting().unwrap_or(false)
    }

    /// Starts a lazy grammar at its trigger: `tokens` spell the output from the trigger on,
    /// which the grammar consumes before its first mask. An error means the output does
    /// not continue as the grammar's sentences do (the model wrote something else after the
    /// trigger in the same token).
    pub fn start_after(mut self, tokens: &[u32]) -> Result<Constraint, GrammarError> {
        self.matcher
            .consume_tokens(tokens)
            .map_err(|e| GrammarError::Engine(e.to_string()))?;
        self.start()
    }

    /// Starts the helper thread, which begins with the first token's mask at once (while
    /// the prompt is prefilled).
    pub fn start(self) -> Result<Constraint, GrammarError> {
        // Each clone of a grammar has its own cancellation state.
        let cancel = self.matcher.cancellation_handle();
        let matcher = Arc::new(Mutex::new(self.matcher));
        let (go, go_rx) = channel::<()>();
        let (mask_tx, masks) = channel();
        let worker = Arc::clone(&matcher);
        std::thread::Builder::new()
            .name("strata-grammar".into())
            .spawn(move || mask_worker(&worker, &go_rx, &mask_tx))
            .map_err(|e| GrammarError::Engine(format!("starting the mask thread: {e}")))?;
        let c = Constraint {
            matcher,
            go,
            masks,
            cancel,
            scratch: Vec::new(),
            stats: GrammarStats::default(),
        };
        c.request_mask()?;
        Ok(c)
    }
}

/// One computed mask, or why there is none, and how long it took.
type MaskResult = (Result<SimpleVob, String>, Duration);

/// Computes a mask each time it is asked to, until the constraint is dropped.
fn mask_worker(matcher: &Mutex<Matcher>, go: &Receiver<()>, out: &Sender<MaskResult>) {
    while go.recv().is_ok() {
        let started = Instant::now();
        let mask = match matcher.lock() {
            Ok(mut m) => m.compute_mask().map_err(|e| e.to_string()),
            Err(_) => Err("the grammar's state was lost by a failed thread".into()),
        };
        if out.send((mask, started.elapsed())).is_err() {
            break;
        }
    }
}

/// Time spent on a sequence's grammar, for the benchmark and `strata generate`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GrammarStats {
    /// Tokens sampled under the grammar.
    pub tokens: usize,
    /// Computing masks, on the helper thread.
    pub compute: Duration,
    /// Waiting for a mask on the sampling thread (what the forward pass did not hide).
    pub wait: Duration,
    /// Masking the logits, on the sampling thread.
    pub apply: Duration,
    /// Advancing the grammar by the sampled token, on the sampling thread.
    pub commit: Duration,
}

impl GrammarStats {
    /// Adds another sequence's figures.
    pub fn add(&mut self, o: &GrammarStats) {
        self.tokens += o.tokens;
        self.compute += o.compute;
        self.wait += o.wait;
        self.apply += o.apply;
        self.commit += o.commit;
    }

    /// Time the sampling thread spent on the grammar per token (waiting, masking,
    /// advancing), in microseconds.
    pub fn sampling_us_per_token(&self) -> f64 {
        (self.wait + self.apply + self.commit).as_secs_f64() * 1e6 / self.tokens.max(1) as f64
    }

    /// Mask computation per token, in microseconds.
    pub fn compute_us_per_token(&self) -> f64 {
        self.compute.as_secs_f64() * 1e6 / self.tokens.max(1) as f64
    }
}

/// A running grammar of one sequence.
pub struct Constraint {
    matcher: Arc<Mutex<Matcher>>,
    go: Sender<()>,
    masks: Receiver<MaskResult>,
    cancel: Option<CancellationHandle>,
    /// The masked logits.
    scratch: Vec<f32>,
    stats: GrammarStats,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Constraint {
    fn request_mask(&self) -> Result<(), GrammarError> {
        self.go
            .send(())
            .map_err(|_| GrammarError::Engine("the mask thread is gone".into()))
    }

    /// Waits for the mask of the next token and returns `logits` with every token the
    /// grammar forbids at minus infinity.
    pub fn apply(&mut self, logits: &[f32]) -> Result<&[f32], GrammarError> {
        let waited = Instant::now();
        let (mask, compute) = self
            .masks
            .recv()
            .map_err(|_| GrammarError::Engine("the mask thread is gone".into()))?;
        let started = Instant::now();
        self.stats.tokens += 1;
        self.stats.wait += started - waited;
        self.stats.compute += compute;
        let mask = mask.map_err(GrammarError::Engine)?;
        self.scratch.clear();
        self.scratch.resize(logits.len(), f32::NEG_INFINITY);
        mask.iter_set_entries(|i| {
            if let (Some(s), Some(&l)) = (self.scratch.get_mut(i), logits.get(i)) {
                *s = l;
            }
        });
        self.stats.apply += started.elapsed();
        Ok(&self.scratch)
    }

    /// Advances the grammar by the sampled `token` and starts computing the next mask;
    /// returns whether the grammar is complete (nothing may follow).
    pub fn commit(&mut self, token: u32) -> Result<bool, GrammarError> {
        let started = Instant::now();
        let stopped = {
            let mut m = self
                .matcher
                .lock()
                .map_err(|_| GrammarError::Engine("the grammar's state was lost".into()))?;
            m.consume_token(token)
                .map_err(|e| GrammarError::Engine(e.to_string()))?;
            m.is_stopped()
        };
        if !stopped {
            self.request_mask()?;
        }
        self.stats.commit += started.elapsed();
        Ok(stopped)
    }

    /// Time spent so far.
    pub fn stats(&self) -> GrammarStats {
        self.stats
    }
}

impl Drop for Constraint {
    fn drop(&mut self) {
        // A cancelled sequence should not wait for (or pay for) a mask in flight; the
        // thread ends when the channel closes.
        if let Some(c) = &self.cancel {
            c.cancel();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn token_bytes_spell_the_encoded_text() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/strata-tiny-moe");
        let tokenizer = Tokenizer::from_dir(dir).unwrap();
        let words = token_bytes(&tokenizer).unwrap();
        let text = "  {\"naïve\": [1, 2.5e-3, \"日本\"],\n\t\"ok\": true}";
        let ids = tokenizer.encode(text, false).unwrap();
        let spelled: Vec<u8> = ids
            .iter()
            .flat_map(|&i| words[i as usize].clone())
            .collect();
        assert_eq!(String::from_utf8_lossy(&spelled), text);
        let end = tokenizer.eos_ids()[0] as usize;
        assert_eq!(words[end][0], TokTrie::SPECIAL_TOKEN_MARKER);
    }

    #[test]
    fn byte_fallback_tokens() {
        assert_eq!(byte_token("<0x0A>"), Some(b'\n'));
        assert_eq!(byte_token("<0xFF>"), Some(0xff));
        assert_eq!(byte_token("<0x1>"), None);
        assert_eq!(byte_token("<0xZZ>"), None);
        assert_eq!(byte_token("hello"), None);
        let alphabet = byte_level_alphabet();
        assert_eq!(
            (alphabet[b' ' as usize], alphabet[b'a' as usize]),
            ('Ġ', 'a')
        );
    }
}
