//! `tool_choice: "auto"`'s lazy call grammar, in every tool-call format, on the shipped
//! model's tokenizer: the output before the call's opening marker is the model's own
//! choice, and from the marker on the call is valid for the tool's schema even where the
//! model would write something else.

use std::path::Path;

use serde_json::{Value, json};
use strata_runtime::grammar::{GrammarCompiler, ResponseFormat};
use strata_runtime::sampling::{Sampler, SamplingParams};
use strata_runtime::step::{FinishReason, SequenceOptions, SequenceState};
use strata_runtime::text::Tokenizer;
use strata_runtime::text::tools::{ToolEvent, ToolFormat, ToolParser, ToolSpec, tool_grammar};

const FORMATS: [ToolFormat; 6] = [
    ToolFormat::Hermes,
    ToolFormat::Generic,
    ToolFormat::Glm45,
    ToolFormat::DeepSeekV3,
    ToolFormat::Mistral,
    ToolFormat::Llama3,
];

fn weather() -> ToolSpec {
    ToolSpec {
        name: "get_weather".into(),
        parameters: json!({
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "days": {"type": "integer", "minimum": 1, "maximum": 7}
            },
            "required": ["city", "days"],
            "additionalProperties": false
        }),
    }
}

/// Logits that make `wanted` the greedy choice, over seeded noise.
fn logits(vocab: usize, wanted: u32, seed: &mut u64) -> Vec<f32> {
    (0..vocab)
        .map(|i| {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let noise = (*seed >> 40) as f32 / (1u64 << 24) as f32;
            if i == wanted as usize { 10.0 } else { noise }
        })
        .collect()
}

/// The shipped model's tokenizer and its grammar compiler, and what the "model" writes
/// after the marker if nothing stops it: ` hello`, no call at all.
struct Fixture {
    tokenizer: Tokenizer,
    compiler: GrammarCompiler,
    then: u32,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/strata-tiny-moe");
        let tokenizer = Tokenizer::from_dir(&dir).unwrap();
        let compiler = GrammarCompiler::new(&tokenizer, tokenizer.vocab_size()).unwrap();
        let then = tokenizer.encode(" hello", false).unwrap()[0];
        Fixture {
            tokenizer,
            compiler,
            then,
        }
    }

    /// Runs a sequence whose "model" wants the ids of `wanted` and then `then` forever
    /// (the greedy choice of the logits), under the lazy call grammar of `format` when
    /// `lazy`; returns the generated text and why it ended.
    fn run(&self, format: ToolFormat, lazy: bool, wanted: &str) -> (String, Option<FinishReason>) {
        let tokenizer = &self.tokenizer;
        let wanted = tokenizer.encode(wanted, false).unwrap();
        let opts = SequenceOptions {
            max_tokens: 200,
            ctx_size: 4096,
            stop: &[],
            ignore_eos: false,
            top_logprobs: None,
            keep_special: &[],
        };
        let sampler = Sampler::new(SamplingParams::greedy()).unwrap();
        let prompt = tokenizer.encode("Weather in Paris?", false).unwrap();
        let mut state = SequenceState::new(tokenizer, sampler, &prompt, opts).unwrap();
        if lazy {
            let lark = tool_grammar(format, &[weather()], false, &|s| {
                tokenizer.special_token_id(s)
            });
            let grammar = self.compiler.compile(&ResponseFormat::Lark(lark)).unwrap();
            state
                .constrain(grammar.lazy(vec![format.call_trigger().to_string()]))
                .unwrap();
        }
        let vocab = tokenizer.vocab_size();
        let mut seed = 7;
        for step in 0.. {
            let want = wanted.get(step).copied().unwrap_or(self.then);
            let out = state.accept(&logits(vocab, want, &mut seed)).unwrap();
            if step < wanted.len() {
                // Before (and at) the marker the model's choice stands.
                assert_eq!(
                    out.token.map(|t| t.id),
                    Some(want),
                    "{format:?} step {step}"
                );
            }
            if out.finish.is_some() {
                break;
            }
        }
        let text = tokenizer.decode(state.generated(), false).unwrap();
        (text, state.finish().cloned())
    }
}

/// The calls and the content `text` parses into.
fn parse(format: ToolFormat, text: &str) -> (String, Vec<(String, String)>) {
    let mut parser = ToolParser::new(format, &[weather()]);
    let mut events = parser.push(text);
    events.extend(parser.finish());
    let (mut content, mut calls) = (String::new(), Vec::new());
    for e in events {
        match e {
            ToolEvent::Text(t) => content.push_str(&t),
            ToolEvent::CallStart(name) => calls.push((name, String::new())),
            ToolEvent::Arguments(a) => calls.last_mut().unwrap().1.push_str(&a),
        }
    }
    (content, calls)
}

#[test]
fn a_call_begun_under_auto_is_valid_and_text_before_it_is_free() {
    let fx = Fixture::new();
    for format in FORMATS {
        let before = format!("Let me look. {}", format.call_trigger());

        let (free, _) = fx.run(format, false, &before);
        assert!(parse(format, &free).1.is_empty(), "{format:?}: {free}");

        let (text, finish) = fx.run(format, true, &before);
        assert_eq!(finish, Some(FinishReason::Stop), "{format:?}: {text}");
        assert!(text.starts_with(&before), "{format:?}: {text}");
        let (content, calls) = parse(format, &text);
        assert_eq!(content.trim(), "Let me look.", "{format:?}: {text}");
        assert_eq!(calls.len(), 1, "{format:?}: {text}");
        assert_eq!(calls[0].0, "get_weather", "{format:?}: {text}");
        let args: Value = serde_json::from_str(&calls[0].1).unwrap();
        let city = args["city"].as_str().unwrap();
        let days = args["days"].as_i64().unwrap();
        assert!(
            city.chars().count() <= 12 && (1..=7).contains(&days),
            "{args}"
        );
    }
}

#[test]
fn text_without_the_marker_is_never_constrained() {
    let fx = Fixture::new();
    let wanted = "It is sunny <tool";
    let (with, finish) = fx.run(ToolFormat::Hermes, true, wanted);
    let (without, _) = fx.run(ToolFormat::Hermes, false, wanted);
    assert_eq!(with, without);
    assert_eq!(finish, Some(FinishReason::Length));
}
