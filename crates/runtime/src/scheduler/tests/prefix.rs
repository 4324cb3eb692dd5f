//! The shared prefix cache under the scheduler: same greedy tokens with and without it (GQA
//! and MLA caches), fewer tokens prefilled, LRU eviction under a tiny budget, hits from a
//! sequence still running, a prompt served up to its last token, the next turn of a chat
//! finding the previous answer, one prefill of a prompt that a burst of requests shares,
//! cancellation mid-prefill (and the caches of sequences gone freed).

use strata_model::Model;
use strata_model::memory::kv_bytes_per_token;

use super::*;
use crate::prefix_cache::BLOCK;
use crate::text::Tokenizer;

/// A DeepSeek-V3 fixture (MLA attention, 211 tokens, 128 positions) with the tiny model's
/// tokenizer: the cache rows are latents and rotary keys.
fn mla_engine() -> Arc<Engine> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let model = Model::load_dir(&root.join("tests/fixtures/deepseek_v3"), Precision::Fast).unwrap();
    assert!(
        matches!(
            model.config.attention,
            strata_model::config::AttentionConfig::Mla(_)
        ),
        "the fixture must have MLA attention"
    );
    let tok = Tokenizer::from_dir(root.join("models/strata-tiny-moe")).unwrap();
    Arc::new(Engine::new(Box::new(model), tok).unwrap())
}

/// `n` token ids below `vocab`, different for each `seed`.
fn tokens(n: usize, seed: u32, vocab: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(40_503)) % (vocab - 3) + 3)
        .collect()
}

fn config(prefix_cache_bytes: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_batch: 4,
        max_queue: 16,
        step_tokens: 32,
        ctx_size: 128,
        prefix_cache_bytes,
    }
}

fn fixed(prompt: Vec<u32>, max_tokens: usize) -> GenRequest {
    GenRequest {
        ignore_eos: true,
        ..greedy(prompt, max_tokens)
    }
}

/// Runs one request alone; returns its tokens and cached-token count.
fn run_one(s: &Scheduler, req: &GenRequest) -> (Vec<u32>, usize) {
    match run_all(s, std::slice::from_ref(req)).pop().unwrap() {
        (tokens, Event::Done { cached_tokens, .. }) => (tokens, cached_tokens),
        (_, other) => panic!("unexpected {other:?}"),
    }
}

/// Requests sharing a `prefix`-token system prompt: the first one fills the cache, the
/// others start from it, prefill only the rest and generate the same greedy tokens.
fn check_reuse(engine: &Arc<Engine>) {
    let vocab = engine.model.config().vocab_size as u32;
    let system = tokens(64, 1, vocab);
    let reqs: Vec<GenRequest> = (0..3)
        .map(|i| {
            let mut p = system.clone();
            p.extend(tokens(5 + 7 * i, 10 + i as u32, vocab));
            fixed(p, 12)
        })
        .chain([fixed(system.clone(), 12)])
        .collect();
    let off = Scheduler::start(engine.clone(), config(0));
    let on = Scheduler::start(engine.clone(), config(64 << 20));
    for (i, req) in reqs.iter().enumerate() {
        let (want, none) = run_one(&off, req);
        assert_eq!(none, 0, "request {i} without a cache");
        let before = on.prefilled_tokens();
        let (got, cached) = run_one(&on, req);
        assert_eq!(got, want, "request {i}: greedy tokens with the cache");
        // 64 shared tokens: 4 full blocks after the first request; the system prompt
        // alone is served up to its last token, which is prefilled for its logits.
        let expect = [0, 64, 64, 63][i];
        assert_eq!(cached, expect, "request {i}: cached tokens");
        assert_eq!(
            on.prefilled_tokens() - before,
            (req.prompt.len() - cached) as u64,
            "request {i}: prefilled tokens"
        );
    }
    assert_eq!(on.cached_tokens(), 64 + 64 + 63);
    let (bytes, blocks) = on.prefix_cache_usage();
    assert!(blocks >= 4 && bytes > 0, "{blocks} blocks, {bytes} bytes");
}

#[test]
fn greedy_tokens_are_the_same_with_the_prefix_cache_gqa() {
    check_reuse(&engine());
}

#[test]
fn greedy_tokens_are_the_same_with_the_prefix_cache_mla() {
    check_reuse(&mla_engine());
}

#[test]
fn a_tiny_budget_evicts_the_least_recently_used_block() {
    let engine = engine();
    let vocab = engine.model.config().vocab_size as u32;
    let block_bytes = kv_bytes_per_token(engine.model.config()) as usize * BLOCK;
    // Room for two blocks; prompts of 16 tokens with one token generated (not fed to the
    // model) leave one block each, served again up to its last token.
    let s = Scheduler::start(engine.clone(), config(2 * block_bytes));
    let p: Vec<GenRequest> = (0..3)
        .map(|i| fixed(tokens(16, 100 + i, vocab), 1))
        .collect();
    let cached = |r: &GenRequest| run_one(&s, r).1;
    assert_eq!((cached(&p[0]), cached(&p[1])), (0, 0));
    assert_eq!(cached(&p[0]), 15, "p0 is cached");
    // p2 takes the place of p1, the least recently used.
    assert_eq!(cached(&p[2]), 0);
    assert_eq!(s.prefix_cache_usage(), (2 * block_bytes, 2));
    assert_eq!(cached(&p[0]), 15, "p0 stays");
    assert_eq!(cached(&p[1]), 0, "p1 was evicted");
    // A budget smaller than one block caches nothing.
    let none = Scheduler::start(engine.clone(), config(block_bytes - 1));
    assert_eq!((run_one(&none, &p[0]).1, run_one(&none, &p[0]).1), (0, 0));
    assert_eq!(none.prefix_cache_usage(), (0, 0));
}

#[test]
fn a_running_sequence_shares_its_prompt_and_cancellation_keeps_the_pool_sound() {
    let engine = engine();
    let vocab = engine.model.config().vocab_size as u32;
    let system = tokens(100, 7, vocab);
    let long_ctx = SchedulerConfig {
        ctx_size: 1024,
        ..config(64 << 20)
    };
    let s = Scheduler::start(engine.clone(), long_ctx);
    let off = Scheduler::start(engine.clone(), config(0));
    // The first sequence decodes until cancelled.
    let (tx, rx) = mpsc::channel();
    let first = s
        .submit(
            fixed(system.clone(), 100_000),
            Box::new(move |e| tx.send(e).is_ok()),
        )
        .unwrap();
    let _ = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    let mut second = system.clone();
    second.extend(tokens(9, 8, vocab));
    let second = fixed(second, 6);
    let (got, cached) = run_one(&s, &second);
    assert_eq!(s.active(), 1, "the first sequence still runs");
    assert!(
        s.kv_cache_bytes() > 0,
        "the running sequence's cache is counted"
    );
    // Six full blocks and the 4-token tail of the running sequence's prompt.
    assert_eq!(cached, 100, "rows of the running sequence");
    assert_eq!(got, run_one(&off, &second).0);
    s.cancel(first);
    drop(rx);
    wait_idle(&s);
    assert_eq!(
        s.kv_cache_bytes(),
        0,
        "a cancelled sequence's cache is freed"
    );
    // A client gone after two steps of its prefill (32 tokens each) leaves its first
    // four blocks behind, and they are sound.
    let long = fixed(tokens(120, 9, vocab), 4);
    s.submit(long.clone(), Box::new(GoneAfter(AtomicUsize::new(0))))
        .unwrap();
    wait_idle(&s);
    assert_eq!(
        s.kv_cache_bytes(),
        0,
        "an abandoned sequence's cache is freed"
    );
    let (got, cached) = run_one(&s, &long);
    assert_eq!(cached, 64);
    assert_eq!(got, run_one(&off, &long).0);
}

#[test]
fn requests_that_arrive_together_prefill_their_shared_prompt_once() {
    let engine = engine();
    let vocab = engine.model.config().vocab_size as u32;
    let system = tokens(64, 3, vocab);
    let reqs: Vec<GenRequest> = (0..3)
        .map(|i| {
            let mut p = system.clone();
            p.extend(tokens(5 + 7 * i, 30 + i as u32, vocab));
            fixed(p, 6)
        })
        .collect();
    let s = Scheduler::start(engine.clone(), config(64 << 20));
    // Hold the scheduler inside a step while the three requests are submitted, so that
    // they join the batch together, none of the prompt cached yet.
    let (entered_tx, entered) = mpsc::channel();
    let (resume, resume_rx) = mpsc::channel();
    s.submit(
        fixed(tokens(8, 4, vocab), 100),
        Box::new(Paused(entered_tx, resume_rx)),
    )
    .unwrap();
    entered.recv_timeout(Duration::from_secs(30)).unwrap();
    let before = s.prefilled_tokens();
    let (txs, rxs): (Vec<_>, Vec<_>) = reqs.iter().map(|_| mpsc::channel()).unzip();
    for (req, tx) in reqs.iter().zip(txs) {
        s.submit(req.clone(), Box::new(move |e| tx.send(e).is_ok()))
            .unwrap();
    }
    resume.send(()).unwrap();
    let off = Scheduler::start(engine.clone(), config(0));
    for (i, (req, rx)) in reqs.iter().zip(rxs).enumerate() {
        let mut got = Vec::new();
        let cached = loop {
            match rx.recv_timeout(Duration::from_secs(60)).unwrap() {
                Event::Token { id, .. } => got.push(id),
                Event::Done { cached_tokens, .. } => break cached_tokens,
                other => panic!("request {i}: {other:?}"),
            }
        };
        assert_eq!(got, run_one(&off, req).0, "request {i}: greedy tokens");
        // The first leads; the others wait for its blocks and take them from the pool.
        assert_eq!(cached, [0, 64, 64][i], "request {i}: cached tokens");
    }
    let suffixes: usize = reqs.iter().map(|r| r.prompt.len() - 64).sum();
    assert_eq!(
        s.prefilled_tokens() - before,
        (64 + suffixes) as u64,
        "the shared 64 tokens are prefilled once"
    );
}

/// A sink that, at its first token, tells the test it holds the scheduler, waits to be
/// resumed, and then reports its receiver gone (which ends its sequence).
struct Paused(mpsc::Sender<()>, mpsc::Receiver<()>);

impl EventSink for Paused {
    fn send(&mut self, _: Event) -> bool {
        let _ = self.0.send(());
        let _ = self.1.recv();
        false
    }
}

#[test]
fn the_next_turn_of_a_chat_finds_the_previous_answer() {
    let engine = engine();
    let vocab = engine.model.config().vocab_size as u32;
    let s = Scheduler::start(engine.clone(), config(64 << 20));
    let off = Scheduler::start(engine.clone(), config(0));
    let first = fixed(tokens(21, 50, vocab), 9);
    let (answer, _) = run_one(&s, &first);
    let mut next = first.prompt.clone();
    next.extend(&answer);
    next.extend(tokens(6, 51, vocab));
    let next = fixed(next, 5);
    let (got, cached) = run_one(&s, &next);
    // Everything the first sequence fed to the model: its prompt and its answer but the
    // last token (sampled, never fed), across a block boundary and into a partial block.
    assert_eq!(cached, 21 + 9 - 1, "cached tokens of the second turn");
    assert_eq!(
        got,
        run_one(&off, &next).0,
        "greedy tokens of the second turn"
    );
}

/// A sink whose receiver is gone from its third check on: the scheduler checks once before
/// admitting a sequence and once before each step, so its sequence runs two steps.
struct GoneAfter(AtomicUsize);

impl EventSink for GoneAfter {
    fn send(&mut self, _: Event) -> bool {
        true
    }
    fn is_closed(&self) -> bool {
        self.0.fetch_add(1, Ordering::Relaxed) >= 2
    }
}
