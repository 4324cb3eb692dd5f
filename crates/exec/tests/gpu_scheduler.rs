//! The continuous-batching scheduler on the GPU backend (`strata serve --device gpu`): a
//! cancelled sequence leaves the batch and its device cache is freed, the others finish with
//! the tokens each gets alone, later requests start from the prefix cache's rows (copied into
//! their device caches), and no cache bytes are held once the batch is empty. Needs an
//! accelerator (Mesa's lavapipe will do; see `common::default_gpu`).

mod common;

use std::path::Path;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use common::default_gpu;
use strata_exec::GpuModel;
use strata_runtime::engine::{Engine, load_tokenizer};
use strata_runtime::sampling::SamplingParams;
use strata_runtime::scheduler::{Event, GenRequest, Scheduler, SchedulerConfig};

fn greedy(prompt: Vec<u32>, max_tokens: usize) -> GenRequest {
    GenRequest {
        prompt,
        max_tokens,
        sampling: SamplingParams::greedy(),
        stop: Vec::new(),
        top_logprobs: None,
        ignore_eos: true,
        grammar: None,
        keep_special: Vec::new(),
    }
}

/// A request's token ids and its last event.
fn collect(rx: &mpsc::Receiver<Event>) -> (Vec<u32>, Event) {
    let mut tokens = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(300)).unwrap() {
            Event::Token { id, .. } => tokens.push(id),
            last => return (tokens, last),
        }
    }
}

fn submit(s: &Scheduler, req: GenRequest) -> (u64, mpsc::Receiver<Event>) {
    let (tx, rx) = mpsc::channel();
    let id = s
        .submit(req, Box::new(move |e| tx.send(e).is_ok()))
        .unwrap();
    (id, rx)
}

fn wait_idle(s: &Scheduler) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while (s.active() > 0 || s.queued() > 0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!((s.active(), s.queued()), (0, 0), "(active, queued)");
}

#[test]
fn cancellation_prefix_reuse_and_batching_on_the_gpu() {
    let Some(dev) = default_gpu() else { return };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/strata-tiny-moe");
    let gpu = GpuModel::load(dev, &dir).unwrap();
    let engine = Arc::new(Engine::new(Box::new(gpu), load_tokenizer(&dir).unwrap()).unwrap());
    let config = SchedulerConfig {
        max_batch: 3,
        max_queue: 16,
        step_tokens: 16,
        ctx_size: 96,
        prefix_cache_bytes: 8 << 20,
    };
    let system = "You are a helpful assistant. Answer the question below in a few words. ";
    let prompts: Vec<Vec<u32>> = ["What is the sea?", "Name a colour.", "Count to three."]
        .iter()
        .map(|q| engine.text_prompt(&format!("{system}{q}")).unwrap())
        .collect();

    // Together, beside a long request that is cancelled after its first token.
    let s = Scheduler::start(Arc::clone(&engine), config);
    let (victim, victim_rx) = submit(&s, greedy(prompts[0].clone(), 60));
    let rxs: Vec<_> = prompts
        .iter()
        .map(|p| submit(&s, greedy(p.clone(), 4)).1)
        .collect();
    assert!(matches!(
        victim_rx.recv_timeout(Duration::from_secs(300)).unwrap(),
        Event::Token { .. }
    ));
    s.cancel(victim);
    let together: Vec<_> = rxs.iter().map(collect).collect();
    // Its sink is dropped with it: a few tokens may still come, never the end.
    let mut after = 0;
    while let Ok(e) = victim_rx.recv_timeout(Duration::from_secs(300)) {
        assert!(matches!(e, Event::Token { .. }), "cancelled, yet: {e:?}");
        after += 1;
    }
    assert!(after < 10, "{after} tokens after the cancel");
    wait_idle(&s);
    assert_eq!(
        s.kv_cache_bytes(),
        0,
        "no device cache held after the batch"
    );
    let cached_together = s.cached_tokens();
    s.shutdown();

    // Each alone on a fresh scheduler: the later ones start from the cached system prompt.
    let s = Scheduler::start(Arc::clone(&engine), config);
    for (p, (tokens, last)) in prompts.iter().zip(&together) {
        assert!(matches!(last, Event::Done { .. }), "{last:?}");
        let (alone, _) = collect(&submit(&s, greedy(p.clone(), 4)).1);
        assert_eq!(&alone, tokens, "the same tokens together and alone");
    }
    assert!(
        s.cached_tokens() >= 16 && cached_together >= 16,
        "prompts after the first start from the cached prefix: {} alone, {cached_together} together",
        s.cached_tokens()
    );
}
