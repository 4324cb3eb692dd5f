//! The batched engine and the continuous-batching scheduler count generated tokens alike:
//! the token that completes a stop string counts (as OpenAI's `usage.completion_tokens`
//! does), an end-of-sequence id does not.

use std::path::Path;
use std::sync::{Arc, mpsc};
use std::time::Duration;

use strata_model::Precision;
use strata_runtime::engine::{Engine, FinishReason};
use strata_runtime::sampling::SamplingParams;
use strata_runtime::scheduler::{Event, GenRequest, Scheduler, SchedulerConfig, generate_batch};

fn engine() -> Arc<Engine> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/strata-tiny-moe");
    Arc::new(Engine::load(&dir, Precision::Fast).unwrap())
}

fn request(prompt: &[u32], stop: &[String]) -> GenRequest {
    GenRequest {
        stop: stop.to_vec(),
        ..GenRequest::new(prompt.to_vec(), 32, SamplingParams::greedy())
    }
}

/// A stop string completed by the `k`-th generated token (1-based): the text that token
/// adds, when it appears nowhere before.
fn stop_completed_by(engine: &Engine, tokens: &[u32]) -> (usize, String) {
    let text = |n: usize| engine.tokenizer.decode(&tokens[..n], true).unwrap();
    (tokens.len() / 2..tokens.len())
        .find_map(|k| {
            let (before, upto) = (text(k - 1), text(k));
            let added = upto.strip_prefix(before.as_str())?.trim_start();
            (added.len() >= 2 && !before.contains(added)).then(|| (k, added.to_string()))
        })
        .expect("a token that adds fresh text")
}

/// Runs one request through the scheduler; returns its token ids and its last event.
fn scheduled(engine: Arc<Engine>, r: &GenRequest) -> (Vec<u32>, Event) {
    let s = Scheduler::start(engine.clone(), SchedulerConfig::for_engine(&engine));
    let (tx, rx) = mpsc::channel();
    s.submit(r.clone(), Box::new(move |e| tx.send(e).is_ok()))
        .unwrap();
    let mut ids = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(60)).unwrap() {
            Event::Token { id, .. } => ids.push(id),
            last => return (ids, last),
        }
    }
}

#[test]
fn engine_and_scheduler_count_the_token_that_completes_a_stop_string() {
    let engine = engine();
    let prompt = engine.text_prompt("Once upon a time").unwrap();
    let (free, _) = generate_batch(&engine, &[request(&prompt, &[])], |_, _| {}).unwrap();
    assert!(free[0].tokens.len() >= 4, "{:?}", free[0]);
    let (k, stop) = stop_completed_by(&engine, &free[0].tokens);

    let stopped = request(&prompt, std::slice::from_ref(&stop));
    let (out, _) = generate_batch(&engine, std::slice::from_ref(&stopped), |_, _| {}).unwrap();
    assert_eq!(out[0].finish, FinishReason::Stop);
    assert_eq!(out[0].tokens, free[0].tokens[..k], "stop {stop:?}");
    assert!(!out[0].text.contains(&stop), "{:?}", out[0].text);

    let (ids, last) = scheduled(engine, &stopped);
    assert_eq!(ids, out[0].tokens);
    match last {
        Event::Done {
            finish,
            completion_tokens,
            ..
        } => {
            assert_eq!(finish, FinishReason::Stop);
            assert_eq!(completion_tokens, k);
        }
        other => panic!("unexpected {other:?}"),
    }
}
