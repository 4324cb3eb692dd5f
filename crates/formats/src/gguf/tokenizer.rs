//! A Hugging Face `tokenizer.json` document built from a GGUF file's tokenizer metadata.
//!
//! Supported vocabularies (`tokenizer.ggml.model`):
//! - `gpt2`: byte-level BPE with the merges in `tokenizer.ggml.merges` and the pre-tokenizer
//!   regexes llama.cpp uses for `tokenizer.ggml.pre` (see [`pre_tokenizer_regexes`]).
//! - `llama`: SentencePiece BPE with `tokenizer.ggml.scores`; merges are derived from the
//!   scores (the pair whose joined piece scores highest merges first, as llama.cpp does) and
//!   unknown characters fall back to the `<0xNN>` byte tokens.
//!
//! Tokens of type CONTROL and UNKNOWN become special added tokens (matched in text, skipped when
//! decoding with `skip_special_tokens`), USER_DEFINED ones plain added tokens, mirroring which
//! tokens llama.cpp matches with and without `parse_special`.
//!
//! A key design decision is to emit a `tokenizer.json` document rather than tokenize here: the
//! runtime already loads Hugging Face tokenizers, so a GGUF model and a Hugging Face directory
//! go through the same, well-tested tokenizer code, and this module only translates metadata.

use std::collections::HashMap;

use serde_json::{Value as Json, json};

use super::GgufFile;
use crate::{Error, Result};

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
mod token_type {
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
}

const GPT2_REGEX: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const DEEPSEEK3_REGEX: &str = r"[!\x22#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O_REGEX: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pre-tokenizer regexes llama.cpp applies, in order, for a `tokenizer.ggml.pre` value
/// (each splits the pieces the previous one produced, keeping matches as their own pieces), and
/// whether llama.cpp ignores merges for words already in the vocabulary. `None` for a
/// pre-tokenizer not supported here.
pub fn pre_tokenizer_regexes(pre: &str) -> Option<(Vec<&'static str>, bool)> {
    Some(match pre {
        "default" | "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "" => (vec![GPT2_REGEX], false),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" => (vec![LLAMA3_REGEX], true),
        "dbrx" | "smaug-bpe" => (vec![LLAMA3_REGEX], false),
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => {
            (vec![r"\p{N}", GPT2_REGEX], false)
        }
        "qwen2" | "deepseek-r1-qwen" | "stablelm2" | "hunyuan" => (vec![QWEN2_REGEX], false),
        "qwen35" => (vec![QWEN35_REGEX], false),
        "chatglm-bpe" => (vec![LLAMA3_REGEX], false),
        "glm4" | "glm5" => (vec![LLAMA3_REGEX], true),
        "deepseek-v3" => (
            vec![r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+", DEEPSEEK3_REGEX],
            false,
        ),
        "gpt-4o" | "llama4" => (vec![GPT4O_REGEX], false),
        _ => return None,
    })
}

/// Token texts llama.cpp treats as end of generation (llama-vocab.cpp), including Qwen's
/// fill-in-the-middle pad and separators, which it also stops at.
const EOG_TEXTS: [&str; 21] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<｜end▁of▁sentence｜>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<fim_pad>",
    "<fim-pad>",
];

/// Special token ids and flags from the metadata, with llama.cpp's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialTokens {
    /// Beginning-of-sequence token.
    pub bos: Option<u32>,
    /// End-of-sequence token.
    pub eos: Option<u32>,
    /// End-of-turn token, when the file names one.
    pub eot: Option<u32>,
    /// Unknown token.
    pub unk: Option<u32>,
    /// Padding token.
    pub pad: Option<u32>,
    /// Tokens that end generation, sorted: EOS, EOT, EOM and the tokens llama.cpp recognises
    /// as end-of-generation by their text (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`...).
    pub eog: Vec<u32>,
    /// Whether encoding prepends BOS (`tokenizer.ggml.add_bos_token`, else llama.cpp's default
    /// for the vocabulary type).
    pub add_bos: bool,
    /// Whether encoding appends EOS (`tokenizer.ggml.add_eos_token`, default false).
    pub add_eos: bool,
}

/// The special tokens of `gguf`'s vocabulary.
pub fn special_tokens(gguf: &GgufFile) -> SpecialTokens {
    let model = gguf.get_str("tokenizer.ggml.model").unwrap_or("");
    let pre = gguf.get_str("tokenizer.ggml.pre").unwrap_or("");
    let default_bos = match model {
        "llama" => true,
        "gpt2" => matches!(
            pre,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" | "tekken"
        ),
        _ => false,
    };
    let id = |k: &str| gguf.get_u32(&format!("tokenizer.ggml.{k}_token_id"));
    let tokens = gguf
        .get_str_array("tokenizer.ggml.tokens")
        .unwrap_or_default();
    let mut eog: Vec<u32> = tokens
        .iter()
        .enumerate()
        .filter(|(_, t)| EOG_TEXTS.contains(t))
        .map(|(i, _)| i as u32)
        .chain([id("eos"), id("eot"), id("eom")].into_iter().flatten())
        .collect();
    eog.sort_unstable();
    eog.dedup();
    SpecialTokens {
        bos: id("bos"),
        eos: id("eos"),
        eot: id("eot"),
        eog,
        unk: id("unknown"),
        pad: id("padding"),
        add_bos: gguf
            .get_bool("tokenizer.ggml.add_bos_token")
            .unwrap_or(default_bos),
        add_eos: gguf
            .get_bool("tokenizer.ggml.add_eos_token")
            .unwrap_or(false),
    }
}

/// The chat template (`tokenizer.chat_template`), a Jinja template.
pub fn chat_template(gguf: &GgufFile) -> Option<&str> {
    gguf.get_str("tokenizer.chat_template")
}

/// Builds a Hugging Face `tokenizer.json` document for `gguf`'s vocabulary, loadable with
/// `tokenizers::Tokenizer::from_bytes(serde_json::to_vec(&doc)?)`.
pub fn tokenizer_json(gguf: &GgufFile) -> Result<Json> {
    let bad = |m: String| Error::malformed(gguf.path(), m);
    let model = gguf
        .get_str("tokenizer.ggml.model")
        .ok_or_else(|| bad("metadata `tokenizer.ggml.model`: missing or not a string".into()))?;
    let tokens = gguf.get_str_array("tokenizer.ggml.tokens").ok_or_else(|| {
        bad("metadata `tokenizer.ggml.tokens`: missing or not an array of strings".into())
    })?;
    let n = tokens.len();
    let types = match gguf.metadata("tokenizer.ggml.token_type") {
        None => vec![1; n],
        Some(_) => gguf
            .get_i32_array("tokenizer.ggml.token_type")
            .filter(|t| t.len() == n)
            .ok_or_else(|| {
                bad(format!(
                    "metadata `tokenizer.ggml.token_type`: expected {n} integers, one per token"
                ))
            })?,
    };
    let special = special_tokens(gguf);
    for (what, id) in [
        ("bos", special.bos),
        ("eos", special.eos),
        ("unknown", special.unk),
    ] {
        if let Some(id) = id.filter(|&id| id as usize >= n) {
            return Err(bad(format!(
                "metadata `tokenizer.ggml.{what}_token_id`: {id} is out of range for a vocabulary of {n} tokens"
            )));
        }
    }

    // First occurrence wins when a vocabulary repeats a string (some conversions pad that way).
    let mut vocab: HashMap<&str, u32> = HashMap::with_capacity(n);
    for (id, t) in tokens.iter().enumerate() {
        vocab.entry(t).or_insert(id as u32);
    }
    let vocab_json: serde_json::Map<String, Json> = vocab
        .iter()
        .map(|(&t, &id)| (t.to_owned(), json!(id)))
        .collect();

    let added_tokens = added_tokens(&tokens, &types);

    let token_text = |id: Option<u32>| id.map(|id| tokens[id as usize]);
    let post_processor = template_processing(&special, &token_text);

    let doc = match model {
        "gpt2" => {
            let pre = gguf.get_str("tokenizer.ggml.pre").unwrap_or("default");
            let (regexes, ignore_merges) = pre_tokenizer_regexes(pre).ok_or_else(|| {
                bad(format!(
                    "metadata `tokenizer.ggml.pre`: pre-tokenizer `{pre}` is not supported"
                ))
            })?;
            let merges = bpe_merges(gguf)?;
            let byte_level = json!({
                "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false,
                "use_regex": false
            });
            let mut pretok: Vec<Json> = regexes
                .iter()
                .map(|r| {
                    json!({
                        "type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated",
                        "invert": false
                    })
                })
                .collect();
            pretok.push(byte_level.clone());
            json!({
                "version": "1.0",
                "truncation": null,
                "padding": null,
                "added_tokens": added_tokens,
                "normalizer": null,
                "pre_tokenizer": {"type": "Sequence", "pretokenizers": pretok},
                "post_processor": post_processor.unwrap_or(byte_level.clone()),
                "decoder": byte_level,
                "model": {
                    "type": "BPE", "dropout": null, "unk_token": null,
                    "continuing_subword_prefix": null, "end_of_word_suffix": null,
                    "fuse_unk": false, "byte_fallback": false, "ignore_merges": ignore_merges,
                    "vocab": vocab_json, "merges": merges,
                },
            })
        }
        "llama" => {
            let scores = gguf
                .get_f32_array("tokenizer.ggml.scores")
                .filter(|s| s.len() == n)
                .ok_or_else(|| {
                    bad(format!(
                        "metadata `tokenizer.ggml.scores`: expected {n} floats, one per token"
                    ))
                })?;
            let merges = spm_merges(&tokens, &scores, &vocab);
            let add_space_prefix = gguf
                .get_bool("tokenizer.ggml.add_space_prefix")
                .unwrap_or(true);
            let mut normalizers = Vec::new();
            if add_space_prefix {
                normalizers.push(json!({"type": "Prepend", "prepend": "\u{2581}"}));
            }
            normalizers.push(
                json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}),
            );
            let mut decoders = vec![
                json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
                json!({"type": "ByteFallback"}),
                json!({"type": "Fuse"}),
            ];
            if add_space_prefix {
                decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
            }
            json!({
                "version": "1.0",
                "truncation": null,
                "padding": null,
                "added_tokens": added_tokens,
                "normalizer": {"type": "Sequence", "normalizers": normalizers},
                "pre_tokenizer": null,
                "post_processor": post_processor,
                "decoder": {"type": "Sequence", "decoders": decoders},
                "model": {
                    "type": "BPE", "dropout": null, "unk_token": token_text(special.unk),
                    "continuing_subword_prefix": null, "end_of_word_suffix": null,
                    "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                    "vocab": vocab_json, "merges": merges,
                },
            })
        }
        other => {
            return Err(bad(format!(
                "metadata `tokenizer.ggml.model`: tokenizer `{other}` is not supported, expected `gpt2` or `llama`"
            )));
        }
    };
    Ok(doc)
}

/// The control, user-defined and unknown tokens, as `added_tokens` entries.
fn added_tokens(tokens: &[&str], types: &[i32]) -> Vec<Json> {
    types
        .iter()
        .enumerate()
        .filter(|&(_, &ty)| {
            matches!(
                ty,
                token_type::CONTROL | token_type::USER_DEFINED | token_type::UNKNOWN
            )
        })
        .map(|(id, &ty)| {
            json!({
                "id": id,
                "content": tokens[id],
                "single_word": false,
                "lstrip": false,
                "rstrip": false,
                "normalized": false,
                "special": ty != token_type::USER_DEFINED,
            })
        })
        .collect()
}

/// The BPE merges, each split in two at its space as llama.cpp splits them.
fn bpe_merges(gguf: &GgufFile) -> Result<Vec<Json>> {
    let bad = |m: String| Error::malformed(gguf.path(), m);
    let merges = gguf.get_str_array("tokenizer.ggml.merges").ok_or_else(|| {
        bad("metadata `tokenizer.ggml.merges`: missing or not an array of strings".into())
    })?;
    merges
        .iter()
        .enumerate()
        .map(|(i, m)| {
            // As llama.cpp: split at the first space after the first byte.
            // (A space byte is never inside a multi-byte character, so both halves
            // are valid strings.)
            match m.bytes().skip(1).position(|b| b == b' ') {
                Some(p) => Ok(json!([&m[..p + 1], &m[p + 2..]])),
                None => Err(bad(format!(
                    "metadata `tokenizer.ggml.merges`: merge {i} `{m}` has no space"
                ))),
            }
        })
        .collect::<Result<Vec<_>>>()
}

/// A `TemplateProcessing` post-processor adding BOS/EOS as the metadata asks, or `None` when
/// neither is added.
fn template_processing<'a>(
    special: &SpecialTokens,
    token_text: &dyn Fn(Option<u32>) -> Option<&'a str>,
) -> Option<Json> {
    let bos = token_text(special.bos).filter(|_| special.add_bos);
    let eos = token_text(special.eos).filter(|_| special.add_eos);
    if bos.is_none() && eos.is_none() {
        return None;
    }
    let piece = |t: &str| json!({"SpecialToken": {"id": t, "type_id": 0}});
    let seq = |s: &str| json!({"Sequence": {"id": s, "type_id": 0}});
    let mut single = Vec::new();
    let mut pair = Vec::new();
    let mut specials = serde_json::Map::new();
    for (text, id) in [(bos, special.bos), (eos, special.eos)] {
        if let (Some(t), Some(id)) = (text, id) {
            specials.insert(t.into(), json!({"id": t, "ids": [id], "tokens": [t]}));
        }
    }
    if let Some(b) = bos {
        single.push(piece(b));
    }
    single.push(seq("A"));
    if let Some(e) = eos {
        single.push(piece(e));
    }
    pair.extend(single.iter().cloned());
    if let Some(b) = bos {
        pair.push(piece(b));
    }
    pair.push(seq("B"));
    if let Some(e) = eos {
        pair.push(piece(e));
    }
    Some(json!({
        "type": "TemplateProcessing", "single": single, "pair": pair,
        "special_tokens": specials,
    }))
}

/// SentencePiece merges from scores: for every piece that splits into two pieces of the
/// vocabulary, that pair merges, ranked by the joined piece's score (highest first), ties by
/// the ids of the left and right parts, as Hugging Face's SentencePiece converter does.
fn spm_merges(tokens: &[&str], scores: &[f32], vocab: &HashMap<&str, u32>) -> Vec<Json> {
    let mut merges: Vec<(f32, u32, u32, &str, &str)> = Vec::new();
    for (id, &piece) in tokens.iter().enumerate() {
        if vocab.get(piece) != Some(&(id as u32)) {
            continue;
        }
        for (i, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(i);
            if let (Some(&li), Some(&ri)) = (vocab.get(l), vocab.get(r)) {
                merges.push((scores[id], li, ri, l, r));
            }
        }
    }
    merges.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    merges
        .into_iter()
        .map(|(_, _, _, l, r)| json!([l, r]))
        .collect()
}
