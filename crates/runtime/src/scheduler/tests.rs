use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use strata_model::Precision;

use super::*;

fn engine() -> Arc<Engine> {
    static ENGINE: OnceLock<Arc<Engine>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/strata-tiny-moe");
            Arc::new(Engine::load(&dir, Precision::Fast).unwrap())
        })
        .clone()
}

fn greedy(prompt: Vec<u32>, max_tokens: usize) -> GenRequest {
    GenRequest::new(prompt, max_tokens, SamplingParams::greedy())
}

/// Submits every request, then collects each one's tokens and final event.
fn run_all(s: &Scheduler, reqs: &[GenRequest]) -> Vec<(Vec<u32>, Event)> {
    let rxs: Vec<_> = reqs
        .iter()
        .map(|r| {
            let (tx, rx) = mpsc::channel();
            s.submit(r.clone(), Box::new(move |e| tx.send(e).is_ok()))
                .unwrap();
            rx
        })
        .collect();
    rxs.into_iter()
        .map(|rx| {
            let mut tokens = Vec::new();
            loop {
                match rx.recv_timeout(Duration::from_secs(60)).unwrap() {
                    Event::Token { id, .. } => tokens.push(id),
                    last => return (tokens, last),
                }
            }
        })
        .collect()
}

fn wait_idle(s: &Scheduler) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while (s.active() > 0 || s.queued() > 0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!((s.active(), s.queued()), (0, 0), "(active, queued)");
}

fn prompts(engine: &Engine) -> Vec<Vec<u32>> {
    let long = "the quick brown fox jumps over the lazy dog. ".repeat(12);
    [
        "Hello, how are you?",
        "Tell me a story about a dragon.",
        long.as_str(),
        "What is",
        "1 2 3 4 5",
        "Write a poem about the sea and the wind and the stars at night.",
    ]
    .iter()
    .map(|t| engine.text_prompt(t).unwrap())
    .collect()
}

#[test]
fn greedy_tokens_are_the_same_alone_and_in_a_full_batch() {
    let engine = engine();
    let reqs: Vec<_> = prompts(&engine)
        .into_iter()
        .enumerate()
        .map(|(i, p)| greedy(p, 8 + 3 * i))
        .collect();
    let alone_cfg = SchedulerConfig {
        max_batch: 1,
        max_queue: 16,
        step_tokens: 4096,
        ctx_size: 1024,
        prefix_cache_bytes: 0,
    };
    let alone = Scheduler::start(engine.clone(), alone_cfg);
    let expected: Vec<_> = reqs
        .iter()
        .map(|r| run_all(&alone, std::slice::from_ref(r)).remove(0))
        .collect();
    // A small step budget forces chunked prefill interleaved with running decodes.
    let batched = Scheduler::start(
        engine.clone(),
        SchedulerConfig {
            max_batch: reqs.len(),
            step_tokens: 24,
            ..alone_cfg
        },
    );
    let got = run_all(&batched, &reqs);
    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert!(!e.0.is_empty(), "request {i} generated nothing");
        assert_eq!(g, e, "request {i}");
    }
    // The counters are updated after the last event is sent.
    wait_idle(&batched);
}

#[test]
fn a_batch_run_to_the_end_equals_each_request_alone() {
    let engine = engine();
    let reqs: Vec<_> = prompts(&engine)
        .into_iter()
        .enumerate()
        .map(|(i, p)| greedy(p, 4 + 5 * i))
        .collect();
    let config = SchedulerConfig {
        max_batch: reqs.len(),
        max_queue: reqs.len(),
        step_tokens: 24,
        ctx_size: 1024,
        prefix_cache_bytes: 0,
    };
    let alone = Scheduler::start(
        engine.clone(),
        SchedulerConfig {
            max_batch: 1,
            ..config
        },
    );
    let mut got = vec![(Vec::new(), None); reqs.len()];
    run_batch(&engine, config, reqs.clone(), |i, event| match event {
        Event::Token { id, .. } => got[i].0.push(id),
        last => got[i].1 = Some(last),
    })
    .unwrap();
    for (i, (r, (tokens, last))) in reqs.iter().zip(got).enumerate() {
        let (want, want_last) = run_all(&alone, std::slice::from_ref(r)).remove(0);
        assert_eq!(tokens, want, "request {i}");
        assert_eq!(last, Some(want_last), "request {i}");
    }
    // A refusal names its request, before anything runs.
    let mut bad = reqs;
    bad[2].max_tokens = 0;
    let mut events = 0;
    let refused = run_batch(&engine, config, bad, |_, _| events += 1);
    assert_eq!(refused, Err((2, SchedulerError::ZeroMaxTokens)));
    assert_eq!(events, 0);
}

#[test]
fn limits_and_refusals() {
    let engine = engine();
    let s = Scheduler::start(
        engine.clone(),
        SchedulerConfig {
            max_batch: 1,
            max_queue: 1,
            step_tokens: 64,
            ctx_size: 32,
            prefix_cache_bytes: 0,
        },
    );
    let sink = || Box::new(|_| true) as Box<dyn EventSink>;
    let p = engine.text_prompt("Hello there").unwrap();
    assert_eq!(
        s.submit(greedy(Vec::new(), 4), sink()),
        Err(SchedulerError::EmptyPrompt)
    );
    assert_eq!(
        s.submit(greedy(vec![1; 32], 4), sink()),
        Err(SchedulerError::PromptTooLong {
            tokens: 32,
            ctx_size: 32
        })
    );
    assert_eq!(
        s.submit(greedy(p.clone(), 0), sink()),
        Err(SchedulerError::ZeroMaxTokens)
    );
    let mut bad = greedy(p.clone(), 4);
    bad.sampling.temperature = -1.0;
    assert!(matches!(
        s.submit(bad, sink()),
        Err(SchedulerError::Sampling(_))
    ));
    // The context limit ends a long generation.
    let (tokens, last) = run_all(&s, &[greedy(p.clone(), 1000)]).remove(0);
    match last {
        Event::Done {
            finish,
            completion_tokens,
            prompt_tokens,
            ..
        } => {
            assert_eq!(completion_tokens, tokens.len());
            assert_eq!(prompt_tokens, p.len());
            if finish == FinishReason::ContextFull {
                assert_eq!(p.len() + tokens.len(), 32);
            } else {
                assert_eq!(finish, FinishReason::Stop);
            }
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn queue_full_and_cancellation_free_the_batch() {
    let engine = engine();
    let s = Scheduler::start(
        engine.clone(),
        SchedulerConfig {
            max_batch: 1,
            max_queue: 2,
            step_tokens: 64,
            ctx_size: 1024,
            prefix_cache_bytes: 0,
        },
    );
    let p = engine.text_prompt("Once upon a time").unwrap();
    let mut req = greedy(p, 100_000);
    // Never stop on EOS: the first sequence runs until cancelled.
    req.sampling.temperature = 1.0;
    req.sampling.seed = Some(1);
    let (tx, rx) = mpsc::channel();
    let first = s
        .submit(req.clone(), Box::new(move |e| tx.send(e).is_ok()))
        .unwrap();
    let _ = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(s.active(), 1);
    // The batch is full: two more wait, a fourth is refused.
    let waiting: Vec<_> = (0..2)
        .map(|_| s.submit(req.clone(), Box::new(|_| true)).unwrap())
        .collect();
    assert_eq!(
        s.submit(req.clone(), Box::new(|_| true)),
        Err(SchedulerError::QueueFull { max: 2 })
    );
    assert_eq!(s.queued(), 2);
    s.cancel(waiting[1]);
    // Dropping the receiver cancels the running sequence.
    drop(rx);
    s.cancel(waiting[0]);
    wait_idle(&s);
    s.cancel(first);
}

mod prefix;
