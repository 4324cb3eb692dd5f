//! The hybrid executor against the CPU path: every policy, the shipped trained model and
//! the test fixtures, prefill then token-by-token decode, within 2e-5 x max|ref|; the
//! decisions executed as made (tasks per device, copies only as asked, the budget never
//! exceeded); expert deferral against a reference written here from the paper's equation;
//! the phase each step is told from its batch layout; the continuous-batching scheduler
//! with an executor installed gives the CPU path's greedy tokens.
//!
//! These tests need an accelerator (Mesa's lavapipe in CI): without one they are skipped,
//! unless `STRATA_GPU_TESTS=1` makes that a failure.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::default_gpu as gpu;
use strata_accel::Device;
use strata_exec::{
    CpuFigures, DeviceFigures, ExecOptions, HostExperts, HybridExecutor, LayerRecord, PolicyKind,
    PolicyOptions, build_policy, cost_model, install, model_shape,
};
use strata_model::moe::{ExpertCall, ExpertExecutor};
use strata_model::{LogitsWanted, Model, Precision, Routing, SeqInput};
use strata_policy::{Device as Place, Hardware, Phase};

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

/// Prefill `prompt` (all logits), then decode `next` one token at a time (last logits).
fn run(model: &Model, prompt: &[u32], next: &[u32]) -> Vec<Vec<f32>> {
    let mut cache = model.new_cache();
    let mut out = Vec::new();
    let mut seqs = [SeqInput {
        tokens: prompt,
        cache: &mut cache,
        logits: LogitsWanted::All,
    }];
    out.push(model.forward(&mut seqs).unwrap().remove(0));
    for tok in next {
        let mut seqs = [SeqInput {
            tokens: std::slice::from_ref(tok),
            cache: &mut cache,
            logits: LogitsWanted::Last,
        }];
        out.push(model.forward(&mut seqs).unwrap().remove(0));
    }
    out
}

fn rel_err(got: &[Vec<f32>], want: &[Vec<f32>]) -> f32 {
    assert_eq!(got.len(), want.len());
    let mut worst = 0.0f32;
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.len(), w.len());
        let max_ref = w.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let err = g
            .iter()
            .zip(w)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        worst = worst.max(err / max_ref);
    }
    worst
}

struct Setup {
    dir: PathBuf,
    policy: PolicyKind,
    /// Expert slots the budget holds (cache and staging).
    slots: u64,
    opts: PolicyOptions,
    phase: Option<Phase>,
    hardware: &'static str,
}

impl Setup {
    fn new(dir: PathBuf, policy: PolicyKind, slots: u64) -> Setup {
        Setup {
            dir,
            policy,
            slots,
            opts: PolicyOptions::default(),
            phase: None,
            // A machine with a fast GPU, so cost-driven policies use it.
            hardware: "ktrans-4080",
        }
    }

    /// The model with a hybrid executor installed.
    fn load(&self, dev: &Arc<dyn Device>, precision: Precision) -> (Model, Arc<HybridExecutor>) {
        let mut model = Model::load(&self.dir, precision).unwrap();
        let host = HostExperts::open(&self.dir).unwrap();
        let budget = self.slots * host.slot_bytes();
        let cost = cost_model(
            Hardware::load(self.hardware).unwrap(),
            model_shape(&model.config).unwrap(),
            host.bits_per_weight(),
            HybridExecutor::cache_bytes(&host, budget),
        )
        .unwrap();
        let policy = build_policy(self.policy, &cost, &self.opts);
        let exec = Arc::new(
            HybridExecutor::new(
                dev.clone(),
                host,
                policy,
                cost,
                &ExecOptions {
                    vram_budget: budget,
                    phase: self.phase,
                    record: true,
                    ..ExecOptions::default()
                },
            )
            .unwrap(),
        );
        install(&mut model, Some(&exec));
        (model, exec)
    }
}

/// What was executed is what was decided: tasks per device, copies a subset of the
/// decision's, the cache within its slots.
fn check_log(name: &str, log: &[LayerRecord], cache_slots: u64) {
    assert!(!log.is_empty(), "{name}: nothing recorded");
    for r in log {
        let mut want_gpu: Vec<(u32, bool)> = r
            .decision
            .tasks
            .iter()
            .filter(|t| t.device == Place::Gpu)
            .map(|t| (t.expert, t.deferred))
            .collect();
        let mut want_cpu: Vec<(u32, bool)> = r
            .decision
            .tasks
            .iter()
            .filter(|t| t.device != Place::Gpu)
            .map(|t| (t.expert, t.deferred))
            .collect();
        let (mut got_gpu, mut got_cpu) = (r.gpu_tasks.clone(), r.cpu_tasks.clone());
        for v in [&mut want_gpu, &mut want_cpu, &mut got_gpu, &mut got_cpu] {
            v.sort();
        }
        let at = format!("{name}: step {} layer {}", r.step, r.moe_layer);
        assert_eq!(got_gpu, want_gpu, "{at}: gpu tasks");
        assert_eq!(got_cpu, want_cpu, "{at}: cpu tasks");
        for u in &r.uploads {
            assert!(
                r.decision
                    .transfers
                    .iter()
                    .any(|t| (t.layer, t.expert) == *u),
                "{at}: copied {u:?} unasked"
            );
        }
        assert!(r.resident as u64 <= cache_slots, "{at}: over the cache");
    }
}

fn check(setup: &Setup, prompt: &[u32], next: &[u32]) -> strata_exec::ExecStats {
    let Some(dev) = gpu() else {
        return Default::default();
    };
    let name = format!(
        "{} {} {} slots",
        setup.dir.file_name().unwrap().to_string_lossy(),
        setup.policy,
        setup.slots
    );
    let cpu = Model::load(&setup.dir, Precision::F32).unwrap();
    let want = run(&cpu, prompt, next);
    let (model, exec) = setup.load(&dev, Precision::F32);
    let before = dev.traffic();
    let got = run(&model, prompt, next);
    let traffic = dev.traffic().since(before);
    let err = rel_err(&got, &want);
    assert!(err < 2e-5, "{name}: logits differ by {err} x max|ref|");
    let stats = exec.stats();
    let log = exec.take_log();
    let host = HostExperts::open(&setup.dir).unwrap();
    // The executor waits for the device at most once per MoE layer and step.
    let budget = (host.n_layers() * (1 + next.len())) as u64;
    assert!(
        traffic.downloads <= budget,
        "{name}: {traffic:?}, budget {budget}"
    );
    let slot = host.slot_bytes();
    check_log(&name, &log, setup.slots.saturating_sub(2));
    assert!(
        stats.slot_bytes_allocated <= setup.slots * slot,
        "{name}: {stats:?}"
    );
    assert_eq!(stats.steps, 1 + next.len(), "{name}");
    assert_eq!(stats.fallbacks, 0, "{name}: {stats}");
    assert_eq!(
        stats.upload_bytes,
        stats.uploads as u64 * slot,
        "{name}: {stats}"
    );
    stats
}

const TINY_PROMPT: &[u32] = &[1, 412, 87, 3021, 15, 640, 2200, 9, 77, 5000, 31, 8];
const TINY_NEXT: &[u32] = &[101, 7, 2048, 555];

#[test]
fn every_policy_on_the_trained_model_matches_the_cpu_path() {
    let dir = repo("models/strata-tiny-moe");
    // 6 MoE layers x 32 experts: everything fits in 194 slots; 20 keeps 3 per layer.
    for policy in PolicyKind::ALL {
        for slots in [194, 20] {
            let s = check(
                &Setup::new(dir.clone(), policy, slots),
                TINY_PROMPT,
                TINY_NEXT,
            );
            if gpu().is_none() {
                return;
            }
            match policy {
                PolicyKind::KTransformers => {
                    assert_eq!(s.gpu_experts, 0, "{policy}: {s}");
                    assert_eq!(s.uploads, 0, "{policy}: {s}");
                }
                _ => assert!(s.gpu_experts > 0, "{policy} {slots}: {s}"),
            }
            if policy == PolicyKind::GpuLru && slots == 20 {
                assert!(s.evictions > 0 && s.staged > 0, "{s}");
                assert!(s.hits > 0 && s.misses > 0, "{s}");
            }
        }
    }
}

#[test]
fn every_policy_on_a_fixture_matches_the_cpu_path() {
    let dir = repo("tests/fixtures/qwen3_moe");
    for policy in PolicyKind::ALL {
        for slots in [50, 6, 1] {
            check(
                &Setup::new(dir.clone(), policy, slots),
                &[3, 17, 42, 8, 99, 5, 61],
                &[12, 4, 80],
            );
        }
    }
}

#[test]
fn every_expert_layout_and_router_loads_and_matches() {
    for fixture in ["qwen3_moe_stacked", "mixtral", "deepseek_v3", "qwen2_moe"] {
        for policy in [PolicyKind::GpuLru, PolicyKind::HybriMoE] {
            check(
                &Setup::new(repo(&format!("tests/fixtures/{fixture}")), policy, 5),
                &[3, 17, 42, 8, 9],
                &[12, 4],
            );
        }
    }
}

/// KTransformers' deferral written from seed 003's `O_k = I_k + S_k + R_{k-1}^def +
/// R_k^imm`: each token's `d` lowest-weighted experts (ties to the later choice) join the
/// next MoE layer's output; none at the last MoE layer.
#[derive(Debug)]
struct DeferralReference {
    deferred: usize,
    n_layers: usize,
    pending: std::sync::Mutex<Option<Vec<f32>>>,
}

impl ExpertExecutor for DeferralReference {
    fn run(&self, call: ExpertCall<'_>, out: &mut [f32]) -> strata_model::Result<()> {
        let r = call.routing;
        let k = r.top_k;
        let d = if call.moe_layer + 1 < self.n_layers {
            self.deferred.min(k - 1)
        } else {
            0
        };
        let (mut now, mut later) = (r.clone(), r.clone());
        for (wn, wl) in now
            .weights
            .chunks_exact_mut(k)
            .zip(later.weights.chunks_exact_mut(k))
        {
            let mut order: Vec<usize> = (0..k).collect();
            order.sort_by(|&a, &b| wn[b].total_cmp(&wn[a]).then(a.cmp(&b)));
            for (rank, &j) in order.iter().enumerate() {
                if rank >= k - d {
                    wn[j] = 0.0;
                } else {
                    wl[j] = 0.0;
                }
            }
        }
        let y = call.experts.run(call.x, &now)?;
        let mut pending = self.pending.lock().unwrap();
        if call.moe_layer == 0 {
            *pending = None;
        }
        let prev = pending.take();
        for (i, o) in out.iter_mut().enumerate() {
            *o = y[i] + prev.as_ref().map_or(0.0, |p| p[i]);
        }
        if d > 0 {
            *pending = Some(call.experts.run(call.x, &later)?);
        }
        Ok(())
    }
}

#[test]
fn expert_deferral_matches_the_papers_equation() {
    let Some(dev) = gpu() else { return };
    let dir = repo("models/strata-tiny-moe");
    // Decode as the policy sees it for every step, so the prompt's tokens defer too.
    let mut setup = Setup::new(dir.clone(), PolicyKind::KTransformers, 0);
    setup.opts.deferred = 1;
    setup.phase = Some(Phase::Decode);
    let (model, exec) = setup.load(&dev, Precision::F32);
    let got = run(&model, TINY_PROMPT, TINY_NEXT);
    let stats = exec.stats();
    check_log("deferral", &exec.take_log(), 0);
    assert!(stats.deferred_experts > 0, "{stats}");

    let mut reference = Model::load(&dir, Precision::F32).unwrap();
    let r = Arc::new(DeferralReference {
        deferred: 1,
        n_layers: 6,
        pending: Default::default(),
    });
    reference.set_executor(Some(r.clone() as Arc<dyn ExpertExecutor>));
    let want = run(&reference, TINY_PROMPT, TINY_NEXT);
    let err = rel_err(&got, &want);
    assert!(err < 1e-4, "deferral differs from the reference by {err}");

    // And deferral changes the numbers: the test would notice it not happening.
    let plain = run(
        &Model::load(&dir, Precision::F32).unwrap(),
        TINY_PROMPT,
        TINY_NEXT,
    );
    assert!(rel_err(&got, &plain) > 1e-3);
}

#[test]
fn a_budget_too_small_to_stage_runs_everything_on_the_cpu_and_says_so() {
    let Some(_) = gpu() else { return };
    let dir = repo("tests/fixtures/qwen3_moe");
    let setup = Setup::new(dir, PolicyKind::GpuLru, 0);
    let dev = gpu().unwrap();
    let (model, exec) = setup.load(&dev, Precision::F32);
    let cpu = Model::load(&setup.dir, Precision::F32).unwrap();
    let err = rel_err(&run(&model, &[3, 4, 5], &[6]), &run(&cpu, &[3, 4, 5], &[6]));
    assert!(err < 1e-4);
    let s = exec.stats();
    assert_eq!(
        (s.gpu_experts, s.uploads, s.slot_bytes_allocated),
        (0, 0, 0)
    );
    assert!(s.fallbacks > 0 && s.refused_transfers > 0, "{s}");
}

#[test]
fn the_fast_path_with_packed_cpu_experts_stays_close() {
    let Some(dev) = gpu() else { return };
    let dir = repo("models/strata-tiny-moe");
    let setup = Setup::new(dir.clone(), PolicyKind::HybriMoE, 20);
    let (model, exec) = setup.load(&dev, Precision::Fast);
    let cpu = Model::load(&dir, Precision::Fast).unwrap();
    let err = rel_err(
        &run(&model, TINY_PROMPT, TINY_NEXT),
        &run(&cpu, TINY_PROMPT, TINY_NEXT),
    );
    assert!(err < 2e-2, "fast path differs by {err}");
    assert!(exec.stats().gpu_experts > 0);
}

#[test]
fn routing_is_unchanged_by_the_hook() {
    // The executor sees the block's own routing: a sanity check of the test helpers.
    let r = Routing {
        top_k: 2,
        ids: vec![0, 1],
        weights: vec![0.5, 0.5],
        candidates: None,
    };
    assert_eq!(r.tokens(), 1);
}

/// Assigns nothing: a decision the executor must refuse rather than guess at.
struct Forgetful;

impl strata_policy::Policy for Forgetful {
    fn name(&self) -> String {
        "forgetful".into()
    }

    fn decide(
        &mut self,
        _: &strata_policy::LayerView,
        _: &strata_policy::CostModel,
    ) -> strata_policy::Decision {
        strata_policy::Decision::default()
    }
}

#[test]
fn a_decision_that_drops_routed_experts_is_an_error() {
    let Some(dev) = gpu() else { return };
    let dir = repo("tests/fixtures/qwen3_moe");
    let mut model = Model::load(&dir, Precision::F32).unwrap();
    let host = HostExperts::open(&dir).unwrap();
    let cost = cost_model(
        Hardware::load("local").unwrap(),
        model_shape(&model.config).unwrap(),
        32.0,
        0,
    )
    .unwrap();
    let exec = Arc::new(
        HybridExecutor::new(
            dev,
            host,
            Box::new(Forgetful),
            cost,
            &ExecOptions::default(),
        )
        .unwrap(),
    );
    install(&mut model, Some(&exec));
    let mut cache = model.new_cache();
    let mut seqs = [SeqInput {
        tokens: &[3, 4],
        cache: &mut cache,
        logits: LogitsWanted::Last,
    }];
    let e = model.forward(&mut seqs).unwrap_err().to_string();
    assert!(e.contains("forgetful") && e.contains("not assigned"), "{e}");
}

/// One forward pass: each sequence's new tokens and the index of its cache.
type Step<'a> = &'a [(&'a [u32], usize)];

/// Runs `seqs` as one forward pass with last-token logits.
fn step(model: &Model, caches: &mut [strata_model::KvCache], seqs: Step) {
    let mut caches: Vec<Option<&mut strata_model::KvCache>> = caches.iter_mut().map(Some).collect();
    let mut inputs: Vec<SeqInput> = seqs
        .iter()
        .map(|&(tokens, c)| SeqInput {
            tokens,
            cache: caches[c].take().unwrap(),
            logits: LogitsWanted::Last,
        })
        .collect();
    model.forward(&mut inputs).unwrap();
}

#[test]
fn a_batch_of_decoding_sequences_is_told_decode_and_its_context() {
    let Some(dev) = gpu() else { return };
    let setup = Setup::new(repo("tests/fixtures/qwen3_moe"), PolicyKind::Smoe, 6);
    let (model, exec) = setup.load(&dev, Precision::F32);
    let mut caches: Vec<_> = (0..3).map(|_| model.new_cache()).collect();
    let cases: [(Step, Phase, usize); 5] = [
        // Two prompts together, then both decode together.
        (&[(&[3, 17, 42], 0), (&[8, 99], 1)], Phase::Prefill, 2),
        (&[(&[5], 0), (&[61], 1)], Phase::Decode, 2),
        // A decode beside a one-token prompt, then beside a prompt chunk.
        (&[(&[12], 0), (&[4], 2)], Phase::Prefill, 2),
        (&[(&[80], 1), (&[7, 9, 11], 2)], Phase::Prefill, 2),
        // All three decode.
        (&[(&[2], 0), (&[6], 1), (&[10], 2)], Phase::Decode, 3),
    ];
    // The longest sequence's cache length after each step.
    let contexts = [3, 4, 5, 4, 6];
    for (i, &(seqs, phase, n)) in cases.iter().enumerate() {
        step(&model, &mut caches, seqs);
        let log = exec.take_log();
        assert!(!log.is_empty(), "step {i}");
        for r in &log {
            assert_eq!(
                (r.step, r.phase, r.seqs, r.context),
                (i, phase, n, Some(contexts[i])),
                "step {i}"
            );
        }
    }
    // Without a batch layout (a block run on its own) one token still reads as decode.
    let block = model
        .layers()
        .iter()
        .find_map(|l| match &l.ffn {
            strata_model::moe::Ffn::Moe(b) => Some(b),
            _ => None,
        })
        .unwrap();
    let h = model.config.hidden_size;
    let x: Vec<f32> = (0..h).map(|i| (i as f32 * 0.1).sin()).collect();
    block.forward(&x, 1).unwrap();
    let r = exec.take_log().pop().unwrap();
    assert_eq!((r.phase, r.seqs, r.context), (Phase::Decode, 0, None));
}

#[test]
fn the_scheduler_with_an_executor_gives_the_cpu_paths_greedy_tokens() {
    use std::sync::mpsc;
    use std::time::Duration;
    use strata_runtime::engine::{Engine, load_tokenizer};
    use strata_runtime::sampling::SamplingParams;
    use strata_runtime::scheduler::{Event, GenRequest, Scheduler, SchedulerConfig};

    let Some(dev) = gpu() else { return };
    let dir = repo("models/strata-tiny-moe");
    let config = SchedulerConfig {
        max_batch: 4,
        max_queue: 16,
        // Small steps: chunked prompts beside running decodes, and batches of decodes.
        step_tokens: 20,
        ctx_size: 256,
        prefix_cache_bytes: 0,
    };
    let run_all = |engine: Arc<Engine>, reqs: &[GenRequest]| -> Vec<Vec<u32>> {
        let s = Scheduler::start(engine, config);
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
                        Event::Done { .. } => return tokens,
                        Event::Failed(e) => panic!("{e}"),
                    }
                }
            })
            .collect()
    };
    let cpu = Arc::new(Engine::load(&dir, Precision::F32).unwrap());
    let reqs: Vec<GenRequest> = [
        "Hello, how are you?",
        "Tell me a story about a dragon.",
        "the quick brown fox jumps over the lazy dog. the quick brown fox",
        "What is",
        "1 2 3 4 5",
    ]
    .iter()
    .enumerate()
    .map(|(i, t)| GenRequest {
        prompt: cpu.text_prompt(t).unwrap(),
        max_tokens: 6 + 2 * i,
        sampling: SamplingParams::greedy(),
        stop: Vec::new(),
        top_logprobs: None,
        ignore_eos: true,
        grammar: None,
        keep_special: Vec::new(),
    })
    .collect();
    let want = run_all(cpu, &reqs);
    for policy in [PolicyKind::GpuLru, PolicyKind::Smoe, PolicyKind::HybriMoE] {
        let (model, exec) = Setup::new(dir.clone(), policy, 20).load(&dev, Precision::F32);
        let engine = Arc::new(Engine::new(Box::new(model), load_tokenizer(&dir).unwrap()).unwrap());
        let got = run_all(engine, &reqs);
        assert_eq!(got, want, "{policy}");
        let stats = exec.stats();
        assert!(stats.gpu_experts > 0, "{policy}: {stats}");
        assert_eq!(stats.fallbacks, 0, "{policy}: {stats}");
        let log = exec.take_log();
        check_log(&policy.to_string(), &log, 18);
        assert!(
            log.iter().any(|r| r.phase == Phase::Decode && r.seqs > 1),
            "{policy}: no batched decode step"
        );
    }
}

#[test]
fn prefetched_experts_are_copied_in_the_background_and_used_correctly() {
    let Some(dev) = gpu() else { return };
    let dir = repo("models/strata-tiny-moe");
    let cpu = Model::load(&dir, Precision::F32).unwrap();
    let want = run(&cpu, TINY_PROMPT, TINY_NEXT);
    // HybriMoE prefetches one expert of the next layer; with a fast GPU it runs them there.
    let setup = Setup::new(dir, PolicyKind::HybriMoE, 40);
    let (model, exec) = setup.load(&dev, Precision::F32);
    let got = run(&model, TINY_PROMPT, TINY_NEXT);
    let err = rel_err(&got, &want);
    assert!(err < 2e-5, "logits differ by {err} x max|ref|");
    let stats = exec.stats();
    assert!(stats.prefetched > 0, "{stats}");
    assert_eq!(stats.fallbacks, 0, "{stats}");
    let log = exec.take_log();
    check_log("prefetch", &log, 38);
    // Some expert copied for layer l + 1 while layer l ran was computed on the GPU there.
    let used = log.windows(2).any(|w| {
        w[0].step == w[1].step
            && w[0]
                .uploads
                .iter()
                .any(|&(l, e)| l == w[1].moe_layer && w[1].gpu_tasks.iter().any(|t| t.0 == e))
    });
    assert!(used, "no prefetched expert was used: {stats}");
}

/// The device's measured figures for one expert price GPU experts as measured: the cost
/// model built from them gives the measured times at one and many pairs, and the upload.
#[test]
fn measured_device_figures_price_experts_as_measured() {
    let Some(dev) = gpu() else { return };
    let dir = repo("models/strata-tiny-moe");
    let host = HostExperts::open(&dir).unwrap();
    let f = DeviceFigures::measure(&*dev, &host).unwrap();
    assert_eq!(
        f.expert_bytes,
        host.expert_bytes(0, 0).unwrap().len() as u64
    );
    assert!(
        f.upload_s > 0.0 && f.one_pair_s > 0.0 && f.many_pairs_s > 0.0,
        "{f:?}"
    );
    let bits = host.bits_per_weight();
    let mut hw = Hardware::load("local").unwrap();
    f.apply(&mut hw, host.hidden(), host.inter(), bits);
    assert!(
        hw.sources["gpu.flops"].starts_with("measured"),
        "{:?}",
        hw.sources
    );
    let config = strata_model::model::open(&dir).unwrap().0;
    let cost = cost_model(hw, model_shape(&config).unwrap(), bits, 0).unwrap();
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b;
    let many = DeviceFigures::MANY;
    let (t1, tm) = (f.one_pair_s, f.many_pairs_s);
    assert!(
        close(cost.expert_time(Place::Gpu, 1), t1.max(tm / many as f64)),
        "{f:?}"
    );
    assert!(
        close(cost.expert_time(Place::Gpu, many as u32), tm.max(t1)),
        "{f:?}"
    );
    let moved = cost.expert_transfer_time() - cost.hw.pcie.latency_s;
    let want = f.upload_s * cost.expert_bytes() as f64 / f.expert_bytes as f64;
    assert!(close(moved, want), "{moved} vs {want}: {f:?}");
}

/// The CPU's measured expert times price CPU experts as measured, on a safetensors model's
/// packed experts and on a GGUF's blocks: the cost model's CPU expert time at each measured
/// token count is the measured one, and proportional past the last.
#[test]
fn measured_cpu_figures_price_cpu_experts_as_measured() {
    for path in [
        repo("models/strata-tiny-moe"),
        repo("tests/fixtures-gguf/qwen3_moe_k.q4_k.gguf"),
    ] {
        if !path.exists() {
            eprintln!("NOT CHECKED: {} not found", path.display());
            continue;
        }
        let model = Model::load(&path, Precision::F32).unwrap();
        let layers: Vec<_> = model.moe_blocks().iter().map(|b| &b.experts).collect();
        let host = HostExperts::open(&path).unwrap();
        let f = CpuFigures::measure(&layers, host.hidden()).unwrap();
        let tokens: Vec<f64> = f.points.iter().map(|p| p[0]).collect();
        assert_eq!(tokens, CpuFigures::TOKENS.map(|t| t as f64), "{f:?}");
        assert!(
            f.points.iter().all(|p| p[1].is_finite() && p[1] > 0.0),
            "{f:?}"
        );
        let bits = host.bits_per_weight();
        let mut hw = Hardware::load("local").unwrap();
        f.apply(&mut hw, host.hidden(), host.inter(), bits);
        assert!(
            hw.sources["cpu.expert_table"].starts_with("measured"),
            "{:?}",
            hw.sources
        );
        let config = strata_model::model::open(&path).unwrap().0;
        let cost = cost_model(hw, model_shape(&config).unwrap(), bits, 0).unwrap();
        for [t, s] in &f.points {
            let got = cost.expert_time(Place::Cpu, *t as u32);
            assert!((got - s).abs() <= 1e-9 * s, "{t} tokens: {got} vs {s}");
        }
        let [last_t, last_s] = f.points[f.points.len() - 1];
        let got = cost.expert_time(Place::Cpu, 2 * last_t as u32);
        assert!(
            (got - 2.0 * last_s).abs() <= 1e-9 * last_s,
            "{got} vs {last_s}"
        );
    }
}
