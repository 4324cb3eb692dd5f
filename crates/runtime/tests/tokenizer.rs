//! The text layer against Python references: token ids from `tokenizers`, prompts from
//! `transformers`' `apply_chat_template` (tests/data, written by
//! scripts/make_tokenizer_reference.py), streaming detokenization and stop strings.
//!
//! The strata-tiny-moe tokenizer (models/strata-tiny-moe) is always tested. The Qwen3
//! and DeepSeek-V3 tokenizers are too large to commit: scripts/fetch_tokenizers.sh puts them
//! under `$STRATA_ASSETS/tokenizers` (default `.cache/assets`). Their tests run when the files
//! are there, print a notice and pass when they are not and `STRATA_REAL_ASSETS` is unset,
//! and fail when they are not and `STRATA_REAL_ASSETS` is set (as in CI).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;
use strata_runtime::text::{
    ChatMessage, StopReason, StreamDecoder, TextError, Tokenizer, TokenizerMeta,
};

/// The model shipped in the repository (models/strata-tiny-moe).
fn tiny_moe_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/strata-tiny-moe")
}

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("data")
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn tiny_moe() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| Tokenizer::from_dir(tiny_moe_dir()).unwrap())
}

fn assets_dir() -> PathBuf {
    match std::env::var_os("STRATA_ASSETS") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/assets"),
    }
}

fn real_assets_required() -> bool {
    std::env::var_os("STRATA_REAL_ASSETS").is_some_and(|v| !v.is_empty() && v != "0")
}

/// One of the fetched real tokenizers (`qwen3`, `deepseek_v3`), loaded once per process.
fn real_tokenizer(name: &str) -> Option<&'static Tokenizer> {
    static QWEN3: OnceLock<Option<Tokenizer>> = OnceLock::new();
    static DEEPSEEK: OnceLock<Option<Tokenizer>> = OnceLock::new();
    let cell = match name {
        "qwen3" => &QWEN3,
        "deepseek_v3" => &DEEPSEEK,
        other => panic!("no real tokenizer named {other}"),
    };
    cell.get_or_init(|| {
        let dir = assets_dir().join("tokenizers").join(name);
        if !dir.join("tokenizer.json").is_file() {
            assert!(
                !real_assets_required(),
                "STRATA_REAL_ASSETS is set but {} is missing: run scripts/fetch_tokenizers.sh",
                dir.join("tokenizer.json").display()
            );
            eprintln!(
                "notice: skipping the {name} tokenizer tests: {} is missing (run \
                 scripts/fetch_tokenizers.sh; set STRATA_REAL_ASSETS=1 to require it)",
                dir.display()
            );
            return None;
        }
        Some(Tokenizer::from_dir(&dir).unwrap())
    })
    .as_ref()
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| u32::try_from(x.as_u64().unwrap()).unwrap())
        .collect()
}

/// Encodes and decodes every reference text and compares with Python's `tokenizers`.
fn check_against_python(name: &str) {
    let Some(tok) = real_tokenizer(name) else {
        return;
    };
    let reference = read_json(&data_dir().join("tokenizer_reference.json"));
    let texts = reference["texts"].as_array().unwrap();
    let expected = &reference["tokenizers"][name];
    let mut failures = Vec::new();
    for (i, text) in texts.iter().enumerate() {
        let text = text.as_str().unwrap();
        let want = ids_of(&expected["ids"][i]);
        let got = tok.encode(text, false).unwrap();
        if got != want {
            failures.push(format!(
                "text {i} {text:?}: encode gave {got:?}, python {want:?}"
            ));
        }
        let decoded = tok.decode(&want, false).unwrap();
        let want_text = expected["decoded"][i].as_str().unwrap();
        if decoded != want_text {
            failures.push(format!(
                "text {i}: decode gave {decoded:?}, python {want_text:?}"
            ));
        }
    }
    assert!(
        texts.len() >= 40,
        "reference has only {} texts",
        texts.len()
    );
    assert!(failures.is_empty(), "{name}:\n{}", failures.join("\n"));
}

#[test]
fn qwen3_ids_match_python_tokenizers() {
    check_against_python("qwen3");
}

#[test]
fn deepseek_v3_ids_match_python_tokenizers() {
    check_against_python("deepseek_v3");
}

#[test]
fn qwen3_special_tokens() {
    let Some(tok) = real_tokenizer("qwen3") else {
        return;
    };
    assert_eq!(tok.bos_id(), None);
    assert_eq!(tok.eos_ids(), &[151645]);
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(151644));
    assert_eq!(tok.vocab_size(), 151669);
    // No BOS for Qwen: special tokens add nothing.
    assert_eq!(
        tok.encode("hi there", true).unwrap(),
        tok.encode("hi there", false).unwrap()
    );
    let ids = tok.encode("<|im_start|>user", false).unwrap();
    assert_eq!(ids[0], 151644);
    assert_eq!(tok.decode(&ids, true).unwrap(), "user");
}

#[test]
fn deepseek_v3_prepends_bos_with_special_tokens() {
    let Some(tok) = real_tokenizer("deepseek_v3") else {
        return;
    };
    assert_eq!(tok.bos_id(), Some(0));
    assert_eq!(tok.eos_ids(), &[1]);
    let plain = tok.encode("Hello world", false).unwrap();
    let special = tok.encode("Hello world", true).unwrap();
    assert_eq!(special[0], 0);
    assert_eq!(&special[1..], &plain[..]);
}

/// Renders every reference conversation of one model and compares with `transformers`.
fn check_chat_templates(name: &str, tok: &Tokenizer) {
    let reference = read_json(&data_dir().join("chat_template_reference.json"));
    let cases = reference["models"][name].as_array().unwrap();
    assert!(!cases.is_empty());
    let template = tok.chat_template().unwrap();
    for case in cases {
        let case_name = case["name"].as_str().unwrap();
        let extra = case
            .get("extra")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let agp = case["add_generation_prompt"].as_bool().unwrap();
        let got = template
            .render_json(&case["messages"], agp, &extra)
            .unwrap();
        let want = case["expected"].as_str().unwrap();
        assert_eq!(got, want, "{name} {case_name}: rendered prompt differs");
        let ids = tok.encode(&got, false).unwrap();
        assert_eq!(
            ids,
            ids_of(&case["expected_ids"]),
            "{name} {case_name}: prompt ids differ"
        );
    }
}

#[test]
fn qwen3_chat_template_matches_transformers() {
    if let Some(tok) = real_tokenizer("qwen3") {
        check_chat_templates("qwen3", tok);
    }
}

#[test]
fn deepseek_v3_chat_template_matches_transformers() {
    if let Some(tok) = real_tokenizer("deepseek_v3") {
        check_chat_templates("deepseek_v3", tok);
    }
}

#[test]
fn tiny_moe_chat_template_matches_transformers() {
    check_chat_templates("strata_tiny_moe", tiny_moe());
}

#[test]
fn tiny_moe_metadata() {
    let tok = tiny_moe();
    assert_eq!(tok.vocab_size(), 8192);
    assert_eq!(tok.bos_id(), None);
    assert_eq!(tok.eos_ids(), &[0]);
    assert_eq!(tok.token_to_id("<|user|>"), Some(1));
    assert_eq!(tok.token_to_id("<|assistant|>"), Some(2));
}

#[test]
fn tiny_moe_prompts_match_reference() {
    let tok = tiny_moe();
    let template = tok.chat_template().unwrap();
    let reference = read_json(&tiny_moe_dir().join("reference/reference.json"));
    let prompts = reference["prompts"].as_array().unwrap();
    assert_eq!(prompts.len(), 3);
    for p in prompts {
        let prompt = p["prompt"].as_str().unwrap();
        assert_eq!(
            tok.encode(prompt, false).unwrap(),
            ids_of(&p["tokens"]),
            "{prompt:?}"
        );
        // No BOS: add_special changes nothing for this model.
        assert_eq!(tok.encode(prompt, true).unwrap(), ids_of(&p["tokens"]));
        let continuation = ids_of(&p["greedy_continuation_ids"]);
        let want = p["greedy_continuation"].as_str().unwrap();
        assert_eq!(tok.decode(&continuation, true).unwrap(), want);
        assert_eq!(
            stream_all(tok, &continuation, &[]),
            (want.to_string(), None)
        );
        // The prompts that are a bare user turn are what the chat template writes.
        let user = prompt
            .strip_prefix("<|user|>\n")
            .and_then(|rest| rest.strip_suffix("\n<|assistant|>\n"));
        if let Some(user) = user {
            let rendered = template
                .render(&[ChatMessage::new("user", user)], true)
                .unwrap();
            assert_eq!(rendered, prompt);
        }
    }
}

/// Feeds ids one at a time; returns the concatenated text and the stop reason.
fn stream_all(tok: &Tokenizer, ids: &[u32], stops: &[&str]) -> (String, Option<StopReason>) {
    let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
    let mut decoder = StreamDecoder::new(tok, &stops, true).unwrap();
    let mut out = String::new();
    for &id in ids {
        let piece = decoder.push(id).unwrap();
        out.push_str(&piece.text);
        if piece.stop.is_some() {
            return (out, piece.stop);
        }
    }
    let last = decoder.finish().unwrap();
    out.push_str(&last.text);
    (out, last.stop)
}

/// Streams each text's ids and checks the pieces add up to the whole decode, with no
/// U+FFFD from a character split across tokens. Returns how many ids decode alone to text
/// with U+FFFD (characters split across byte-level tokens), so callers can check the
/// texts exercised that case.
fn check_stream_decoding(tok: &Tokenizer, texts: &[&str]) -> usize {
    let mut split_ids = 0;
    for text in texts {
        let ids = tok.encode(text, false).unwrap();
        let whole = tok.decode(&ids, false).unwrap();
        let mut decoder = StreamDecoder::new(tok, &[], false).unwrap();
        decoder.set_stop_ids(&[]);
        let mut out = String::new();
        for &id in &ids {
            if tok.decode(&[id], false).unwrap().contains('\u{FFFD}') {
                split_ids += 1;
            }
            let piece = decoder.push(id).unwrap();
            assert!(piece.stop.is_none());
            if !whole.contains('\u{FFFD}') {
                assert!(
                    !piece.text.contains('\u{FFFD}'),
                    "{text:?}: piece {:?}",
                    piece.text
                );
            }
            out.push_str(&piece.text);
        }
        out.push_str(&decoder.finish().unwrap().text);
        assert_eq!(out, whole, "{text:?}");
    }
    split_ids
}

const STREAM_TEXTS: &[&str] = &[
    "你好，世界！今天天气怎么样？",
    "👨‍👩‍👧‍👦 family, 👩🏽‍💻 coder, 🇫🇷 flag",
    "مرحبا بالعالم! नमस्ते दुनिया",
    "def f(x):\n    return x * 2  # ok\n",
    "Ἐν ἀρχῇ ἦν ὁ λόγος 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
];

#[test]
fn tiny_moe_stream_decoding_never_splits_characters() {
    let split = check_stream_decoding(tiny_moe(), STREAM_TEXTS);
    assert!(
        split > 10,
        "only {split} ids split a character: the texts miss the case"
    );
}

#[test]
fn real_stream_decoding_matches_whole_decode() {
    let reference = read_json(&data_dir().join("tokenizer_reference.json"));
    let texts: Vec<&str> = reference["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    for name in ["qwen3", "deepseek_v3"] {
        if let Some(tok) = real_tokenizer(name) {
            let split = check_stream_decoding(tok, &texts);
            assert!(split > 0, "{name}: no id split a character");
        }
    }
}

#[test]
fn stop_string_truncates_and_may_span_tokens() {
    let tok = tiny_moe();
    let text = "The capital of France is Paris. It is a big city.";
    let ids = tok.encode(text, false).unwrap();
    // "Paris. It" spans several tokens.
    assert!(
        ids.iter()
            .all(|&id| !tok.decode(&[id], true).unwrap().contains("Paris. It"))
    );
    let (out, stop) = stream_all(tok, &ids, &["Paris. It"]);
    assert_eq!(out, "The capital of France is ");
    assert_eq!(stop, Some(StopReason::StopString("Paris. It".into())));
    // The earliest of several stop strings wins, whatever their order in the list.
    let (out, stop) = stream_all(tok, &ids, &["city", "France"]);
    assert_eq!(out, "The capital of ");
    assert_eq!(stop, Some(StopReason::StopString("France".into())));
    // A stop string that never appears leaves the text whole.
    let (out, stop) = stream_all(tok, &ids, &["Berlin"]);
    assert_eq!(out, text);
    assert_eq!(stop, None);
}

#[test]
fn partial_stop_string_is_held_back_until_it_cannot_match() {
    let tok = tiny_moe();
    let ids = tok.encode("Hello world, hello", false).unwrap();
    let stops = vec!["world!".to_string()];
    let mut decoder = StreamDecoder::new(tok, &stops, true).unwrap();
    let mut emitted = String::new();
    let mut saw_hold = false;
    for &id in &ids {
        let piece = decoder.push(id).unwrap();
        assert!(piece.stop.is_none());
        emitted.push_str(&piece.text);
        // While the text ends with a prefix of the stop string, it must not be shown.
        let produced = tok.decode(decoder.ids(), true).unwrap();
        if produced.ends_with("world") || produced.ends_with("wor") {
            assert!(
                !emitted.ends_with("wor") && !emitted.ends_with("world"),
                "{emitted:?}"
            );
            saw_hold = true;
        }
    }
    assert!(saw_hold, "the text never ended with a partial stop string");
    emitted.push_str(&decoder.finish().unwrap().text);
    assert_eq!(emitted, "Hello world, hello");
}

#[test]
fn multibyte_stop_string_across_byte_tokens() {
    let tok = tiny_moe();
    let ids = tok.encode("Say 你好世界 now", false).unwrap();
    let (out, stop) = stream_all(tok, &ids, &["世界"]);
    assert_eq!(out, "Say 你好");
    assert_eq!(stop, Some(StopReason::StopString("世界".into())));
}

#[test]
fn eos_stops_and_is_not_emitted() {
    let tok = tiny_moe();
    let mut ids = tok.encode("All done here", false).unwrap();
    ids.push(0); // <|end|>, the eos
    ids.extend(tok.encode(" more", false).unwrap());
    let (out, stop) = stream_all(tok, &ids, &[]);
    assert_eq!(out, "All done here");
    assert_eq!(stop, Some(StopReason::Eos(0)));

    let mut decoder = StreamDecoder::new(tok, &[], true).unwrap();
    let eos_at = ids.iter().position(|&id| id == 0).unwrap();
    for &id in &ids[..=eos_at] {
        decoder.push(id).unwrap();
    }
    // Ids after the stop add nothing.
    let after = decoder.push(ids[eos_at + 1]).unwrap();
    assert_eq!(after.text, "");
    assert_eq!(after.stop, Some(StopReason::Eos(0)));
    assert_eq!(decoder.stop_reason(), Some(&StopReason::Eos(0)));
}

#[test]
fn eos_flushes_a_held_partial_stop_string() {
    let tok = tiny_moe();
    let mut ids = tok.encode("see you wor", false).unwrap();
    ids.push(0);
    let (out, stop) = stream_all(tok, &ids, &["world"]);
    assert_eq!(out, "see you wor");
    assert_eq!(stop, Some(StopReason::Eos(0)));
}

/// Mistral's `[TOOL_CALLS]` is a special token: decoding skips it, so a decoder told to keep
/// the format's markers writes it, and the Mistral parser reads the call behind it.
#[test]
fn kept_special_markers_reach_the_tool_parser() {
    use strata_runtime::text::tools::{ToolCall, ToolEvent, ToolFormat, ToolParser, ToolSpec};

    let mut doc: Value = read_json(&tiny_moe_dir().join("tokenizer.json"));
    let id = doc["model"]["vocab"].as_object().unwrap().len() as u64;
    doc["added_tokens"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
            "id": id, "content": "[TOOL_CALLS]", "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true
        }));
    let meta = TokenizerMeta {
        eos_ids: vec![0],
        ..TokenizerMeta::default()
    };
    let tok = Tokenizer::from_json_bytes(doc.to_string().as_bytes(), meta, "in-memory").unwrap();
    let kept: Vec<u32> = ToolFormat::Mistral
        .markers()
        .iter()
        .filter_map(|m| tok.special_token_id(m))
        .collect();
    assert_eq!(kept, [id as u32]);
    let text =
        "Sure.[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]";
    let ids = tok.encode(text, false).unwrap();
    assert!(ids.contains(&(id as u32)), "the marker is one token");

    let decode = |keep: &[u32]| {
        let mut decoder = StreamDecoder::new(&tok, &[], true).unwrap();
        decoder.keep_special(keep);
        let mut out = String::new();
        for &i in &ids {
            out.push_str(&decoder.push(i).unwrap().text);
        }
        out + &decoder.finish().unwrap().text
    };
    assert!(!decode(&[]).contains("[TOOL_CALLS]"), "skipped by default");
    let out = decode(&kept);
    assert!(out.starts_with("Sure.[TOOL_CALLS]"), "{out}");

    let spec = ToolSpec {
        name: "get_weather".into(),
        parameters: serde_json::json!({"type": "object"}),
    };
    let mut parser = ToolParser::new(ToolFormat::Mistral, std::slice::from_ref(&spec));
    let mut events = parser.push(&out);
    events.extend(parser.finish());
    let (mut content, mut calls) = (String::new(), Vec::new());
    for e in events {
        match e {
            ToolEvent::Text(t) => content.push_str(&t),
            ToolEvent::CallStart(name) => calls.push(ToolCall {
                name,
                arguments: String::new(),
            }),
            ToolEvent::Arguments(a) => calls.last_mut().unwrap().arguments.push_str(&a),
        }
    }
    assert_eq!(content, "Sure.");
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].name, "get_weather");
    let args: Value = serde_json::from_str(&calls[0].arguments).unwrap();
    assert_eq!(args, serde_json::json!({"city": "Paris"}));
}

#[test]
fn empty_stop_string_is_an_error() {
    let stops = vec!["ok".to_string(), String::new()];
    let err = StreamDecoder::new(tiny_moe(), &stops, true).unwrap_err();
    assert!(matches!(err, TextError::EmptyStop { index: 1 }), "{err}");
}

// ---- loading and bad input ----

/// A temporary model directory, removed when dropped.
struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh directory holding a copy of the tiny-moe tokenizer.json and the given files.
fn model_dir(files: &[(&str, &str)]) -> TempDir {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "strata-tokenizer-test-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        tiny_moe_dir().join("tokenizer.json"),
        dir.join("tokenizer.json"),
    )
    .unwrap();
    for (name, content) in files {
        std::fs::write(dir.join(name), content).unwrap();
    }
    TempDir(dir)
}

#[test]
fn missing_tokenizer_json_names_the_file() {
    let dir = model_dir(&[]);
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    let err = Tokenizer::from_dir(&dir).unwrap_err();
    assert!(matches!(err, TextError::MissingFile { .. }), "{err}");
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
}

#[test]
fn malformed_files_give_errors_naming_them() {
    let dir = model_dir(&[]);
    std::fs::write(dir.join("tokenizer.json"), "{\"model\": 3}").unwrap();
    let err = Tokenizer::from_dir(&dir).unwrap_err();
    assert!(matches!(err, TextError::Load { .. }), "{err}");
    assert!(err.to_string().contains("tokenizer.json"), "{err}");

    let dir = model_dir(&[("tokenizer_config.json", "{\"eos_token\": ")]);
    let err = Tokenizer::from_dir(&dir).unwrap_err();
    assert!(matches!(err, TextError::Json { .. }), "{err}");
    assert!(err.to_string().contains("tokenizer_config.json"), "{err}");

    let dir = model_dir(&[("tokenizer_config.json", r#"{"eos_token": "<|nope|>"}"#)]);
    let err = Tokenizer::from_dir(&dir).unwrap_err();
    assert!(
        matches!(
            err,
            TextError::UnknownToken {
                field: "eos_token",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("<|nope|>"), "{err}");

    let dir = model_dir(&[("tokenizer_config.json", r#"{"add_bos_token": "yes"}"#)]);
    let err = Tokenizer::from_dir(&dir).unwrap_err();
    assert!(
        matches!(
            err,
            TextError::BadField {
                field: "add_bos_token",
                ..
            }
        ),
        "{err}"
    );

    let dir = model_dir(&[("generation_config.json", r#"{"eos_token_id": "0"}"#)]);
    let err = Tokenizer::from_dir(&dir).unwrap_err();
    assert!(
        matches!(
            err,
            TextError::BadField {
                field: "eos_token_id",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("generation_config.json"), "{err}");

    let dir = model_dir(&[("generation_config.json", r#"{"eos_token_id": [0, 99999]}"#)]);
    let err = Tokenizer::from_dir(&dir).unwrap_err();
    assert!(
        matches!(err, TextError::IdOutOfRange { id: 99999, .. }),
        "{err}"
    );
}

#[test]
fn eos_ids_merge_generation_config_first() {
    let dir = model_dir(&[
        (
            "tokenizer_config.json",
            r#"{"eos_token": {"content": "<|end|>", "__type": "AddedToken"}}"#,
        ),
        ("generation_config.json", r#"{"eos_token_id": [2, 0, 2]}"#),
    ]);
    let tok = Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(tok.eos_ids(), &[2, 0]);
}

#[test]
fn bos_is_prepended_once() {
    // add_bos_token with a post-processor that does not add it: we prepend.
    let dir = model_dir(&[(
        "tokenizer_config.json",
        r#"{"bos_token": "<|user|>", "add_bos_token": true}"#,
    )]);
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let plain = tok.encode("hi", false).unwrap();
    let special = tok.encode("hi", true).unwrap();
    assert_eq!(special[0], 1);
    assert_eq!(&special[1..], &plain[..]);
    // Llama tokenizer classes add BOS unless told otherwise.
    let dir = model_dir(&[(
        "tokenizer_config.json",
        r#"{"bos_token": "<|user|>", "tokenizer_class": "LlamaTokenizerFast"}"#,
    )]);
    assert_eq!(
        Tokenizer::from_dir(&dir)
            .unwrap()
            .encode("hi", true)
            .unwrap()[0],
        1
    );
    // A post-processor that adds BOS itself: not added twice.
    let mut doc: Value = read_json(&tiny_moe_dir().join("tokenizer.json"));
    doc["post_processor"] = serde_json::json!({
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|user|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|user|>": {"id": "<|user|>", "ids": [1], "tokens": ["<|user|>"]}}
    });
    let meta = TokenizerMeta {
        bos_id: Some(1),
        eos_ids: vec![0],
        add_bos: true,
        chat_template: None,
    };
    let tok = Tokenizer::from_json_bytes(doc.to_string().as_bytes(), meta, "in-memory").unwrap();
    let special = tok.encode("hi", true).unwrap();
    assert_eq!(special[0], 1);
    assert_ne!(special[1], 1);
    assert_eq!(&special[1..], &tok.encode("hi", false).unwrap()[..]);
}

#[test]
fn from_json_bytes_validates_ids_and_names_the_origin() {
    let bytes = std::fs::read(tiny_moe_dir().join("tokenizer.json")).unwrap();
    let meta = TokenizerMeta {
        bos_id: Some(8192),
        ..TokenizerMeta::default()
    };
    let err = Tokenizer::from_json_bytes(&bytes, meta, "model.gguf").unwrap_err();
    assert!(
        matches!(err, TextError::IdOutOfRange { id: 8192, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("model.gguf"), "{err}");
    let err = Tokenizer::from_json_bytes(b"not json", TokenizerMeta::default(), "model.gguf")
        .unwrap_err();
    assert!(err.to_string().contains("model.gguf"), "{err}");
    let tok = Tokenizer::from_json_bytes(&bytes, TokenizerMeta::default(), "model.gguf").unwrap();
    let err = tok.chat_template().unwrap_err();
    assert!(matches!(err, TextError::NoChatTemplate { .. }), "{err}");
}

#[test]
fn chat_template_sources() {
    // A list of named templates: `default` is used.
    let dir = model_dir(&[(
        "tokenizer_config.json",
        r#"{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ messages|length }}"}]}"#,
    )]);
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let msgs = [ChatMessage::new("user", "x")];
    assert_eq!(
        tok.chat_template().unwrap().render(&msgs, false).unwrap(),
        "D1"
    );
    // chat_template.jinja overrides the config.
    let dir = model_dir(&[
        ("tokenizer_config.json", r#"{"chat_template": "config"}"#),
        ("chat_template.jinja", "file {{ messages[0].content }}\n"),
    ]);
    let tok = Tokenizer::from_dir(&dir).unwrap();
    // jinja2 drops the template's single trailing newline.
    assert_eq!(
        tok.chat_template().unwrap().render(&msgs, false).unwrap(),
        "file x"
    );
    // bos_token / eos_token variables, pycompat string methods, trim/lstrip blocks.
    let template = "{{ bos_token }}\n{% for m in messages %}\n    {% if m.content.startswith('  ') %}{{ m.content.strip() | upper }}{% endif %}\n{% endfor %}{{ eos_token }}";
    let config = serde_json::json!({"bos_token": "<|user|>", "eos_token": "<|end|>", "chat_template": template});
    let dir = model_dir(&[("tokenizer_config.json", &config.to_string())]);
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let msgs = [ChatMessage::new("user", "  padded  ")];
    // What jinja2 renders with trim_blocks and lstrip_blocks.
    assert_eq!(
        tok.chat_template().unwrap().render(&msgs, false).unwrap(),
        "<|user|>\nPADDED<|end|>"
    );
}

#[test]
fn text_types_can_be_shared_across_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<Tokenizer>();
    shared::<strata_runtime::text::ChatTemplate>();
    shared::<StreamDecoder<'static>>();
    shared::<strata_runtime::sampling::Sampler>();
}
