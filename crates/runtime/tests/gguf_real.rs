//! Real GGUF models (SmolLM2-135M Q4_1, Qwen2.5-Coder-0.5B Q4_K_M) on the CPU path against
//! llama.cpp's logits; the assets, references and criteria are `common/llama_reference.rs`'s.

#[path = "common/llama_reference.rs"]
mod llama_reference;

use llama_reference::{asset, check_logits, ids};
use strata_model::backend::BatchSeq;
use strata_model::{LogitsWanted, Precision};
use strata_runtime::engine::Engine;
use strata_runtime::sampling::SamplingParams;
use strata_runtime::scheduler::{GenRequest, generate_batch};

fn check_against_llama_cpp(model_file: &str, reference: &str) {
    let Some(path) = asset(model_file) else {
        return;
    };
    let precision = match std::env::var("STRATA_TEST_DTYPE").as_deref() {
        Ok("f32") => Precision::F32,
        _ => Precision::Fast,
    };
    let engine = Engine::load(&path, precision).unwrap();
    let model = &engine.model;
    let vocab = model.config().vocab_size;
    check_logits(model_file, reference, "cpu", vocab, |prompt, add_bos| {
        let tokens = ids(&prompt["tokens"]);
        // Our tokenizer gives llama.cpp's ids for the prompt text.
        let text = prompt["text"].as_str().unwrap();
        assert_eq!(
            engine.tokenizer.encode(text, add_bos).unwrap(),
            tokens,
            "tokens of {text:?}"
        );
        let mut cache = model.new_cache(tokens.len()).unwrap();
        let mut seqs = [BatchSeq {
            tokens: &tokens,
            cache: &mut *cache,
            logits: LogitsWanted::All,
        }];
        model.forward(&mut seqs).unwrap().remove(0)
    });
}

#[test]
fn smollm2_matches_llama_cpp() {
    check_against_llama_cpp(
        "smollm2-135m-instruct-q4_1.gguf",
        "smollm2-135m-instruct-q4_1.json",
    );
}

#[test]
fn qwen2_5_coder_matches_llama_cpp() {
    check_against_llama_cpp(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.json",
    );
}

#[test]
fn smollm2_knows_the_capital_of_france() {
    let Some(path) = asset("smollm2-135m-instruct-q4_1.gguf") else {
        return;
    };
    let engine = Engine::load(&path, Precision::Fast).unwrap();
    let prompt = engine.text_prompt("The capital of France is").unwrap();
    let request = GenRequest::new(prompt, 4, SamplingParams::greedy());
    let (out, _) = generate_batch(&engine, &[request], |_, _| {}).unwrap();
    assert!(out[0].text.contains("Paris"), "{:?}", out[0].text);
}
