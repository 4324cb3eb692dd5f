//! The accelerator's hybrid layout (`GpuModel::load_hybrid`, `--device hybrid`): attention,
//! dense layers, shared experts, routers and the LM head on the device, the routed experts
//! on the host. Against the CPU path on every MoE fixture (GQA and MLA, shared experts,
//! grouped routing), prefill then token by token through the device cache, within 1e-3 x
//! max|ref| as the whole model on the device is; a GGUF's routed experts on the CPU's GGUF
//! kernels against the exact reader of the file; with the hybrid executor installed (its
//! deferral, its device cache) or the SSD tier (bit for bit the mapped file's logits); and
//! the host round trips: one per MoE layer and step, plus the logits.
//!
//! These tests need an accelerator (Mesa's lavapipe in CI): without one they are skipped,
//! unless `STRATA_GPU_TESTS=1` makes that a failure.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use common::default_gpu;
use strata_accel::{Device, Traffic, WeightType};
use strata_exec::{
    ExecOptions, GpuModel, HostExperts, HybridExecutor, PolicyKind, PolicyOptions, SsdOptions,
    SsdTier, build_policy, cost_model, install, model_shape, ssd_min_budget,
};
use strata_formats::npy;
use strata_model::backend::Backend;
use strata_model::config::FfnConfig;
use strata_model::{LoadOptions, LogitsWanted, Model, Precision, Routing, RoutingTap, SeqInput};
use strata_policy::policies::KTransformers;
use strata_policy::{
    CostModel, Decision, Device as Place, Hardware, LayerView, Policy, Transfer, TransferKind,
};

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

/// The CPU's logits: `prompt` at once (every row), then `next` one token at a time.
fn run_cpu(model: &Model, prompt: &[u32], next: &[u32]) -> Vec<f32> {
    let mut cache = model.new_cache();
    let mut out = Vec::new();
    let mut seqs = [SeqInput {
        tokens: prompt,
        cache: &mut cache,
        logits: LogitsWanted::All,
    }];
    out.extend(model.forward(&mut seqs).unwrap().remove(0));
    for tok in next {
        let mut seqs = [SeqInput {
            tokens: std::slice::from_ref(tok),
            cache: &mut cache,
            logits: LogitsWanted::Last,
        }];
        out.extend(model.forward(&mut seqs).unwrap().remove(0));
    }
    out
}

/// What the device computes for the same steps (f32 cache: the kernels' own error), and
/// the device traffic of the decode steps.
fn run_gpu(model: &GpuModel, prompt: &[u32], next: &[u32]) -> (Vec<f32>, Traffic) {
    let len = prompt.len() + next.len();
    let mut cache = model.new_cache_as(len, WeightType::F32).unwrap();
    let mut out = model.forward(prompt, &mut cache).unwrap();
    let before = model.device().traffic();
    for tok in next {
        out.extend(
            model
                .forward_last(std::slice::from_ref(tok), &mut cache)
                .unwrap(),
        );
    }
    (out, model.device().traffic().since(before))
}

fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let max_ref = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let diff = got
        .iter()
        .zip(want)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    diff / max_ref
}

fn moe_layers(model: &GpuModel) -> u64 {
    let moe = model.config.layers.iter();
    moe.filter(|l| matches!(l, FfnConfig::Moe(_))).count() as u64
}

const PROMPT: [u32; 6] = [3, 1, 4, 1, 5, 9];
const NEXT: [u32; 4] = [2, 6, 5, 3];

/// Every MoE fixture in the hybrid layout equals the CPU, and a decoded token reads back
/// once per MoE layer plus its logits.
#[test]
fn hybrid_layout_matches_cpu_on_every_fixture() {
    let Some(dev) = default_gpu() else { return };
    for name in [
        "qwen3_moe",
        "qwen2_moe",
        "mixtral",
        "glm4_moe",
        "deepseek_v3",
    ] {
        let dir = repo(&format!("tests/fixtures/{name}"));
        let cpu = Model::load(&dir, Precision::F32).unwrap();
        let want = run_cpu(&cpu, &PROMPT, &NEXT);
        let opts = LoadOptions::from(Precision::F32);
        let gpu = GpuModel::load_hybrid(dev.clone(), &dir, opts).unwrap();
        assert!(gpu.experts_on_host(), "{name}");
        let (got, traffic) = run_gpu(&gpu, &PROMPT, &NEXT);
        let round_trips = traffic.downloads;
        let e = rel_err(&got, &want);
        println!("{name}: hybrid layout, max rel err {e:.2e}");
        assert!(e <= 1e-3, "{name}: error {e:.2e} > 1e-3");
        let (steps, layers) = (NEXT.len() as u64, moe_layers(&gpu));
        assert_eq!(
            round_trips,
            steps * (layers + 1),
            "{name}: host round trips in decode"
        );
        // A MoE layer submits its routing's readback and, after it, the shared experts'
        // work; uploads go with the next submission.
        assert!(
            traffic.submissions <= steps * (2 * layers + 1),
            "{name}: submissions in decode: {traffic:?}"
        );
    }
}

/// A GGUF's routed experts run on the CPU's GGUF kernels (activations quantized per block,
/// as llama.cpp's), everything else on the device's: the exact reader of the file within
/// the CPU kernels' own error, and the same greedy token at every position.
#[test]
fn hybrid_layout_runs_a_quantized_gguf() {
    let Some(dev) = default_gpu() else { return };
    let dir = repo("tests/fixtures-gguf");
    let path = dir.join("qwen3_moe_k.q4_k.gguf");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("qwen3_moe_k.json")).unwrap())
            .unwrap();
    let seq: Vec<u32> = manifest["sequences"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    let want = npy::read_f32(&dir.join("qwen3_moe_k.q4_k.dequant_0.npy")).unwrap();
    let before = dev.memory().live;
    let gpu = GpuModel::load_hybrid(dev.clone(), &path, LoadOptions::new(Precision::Fast)).unwrap();
    let on_device = dev.memory().live - before;
    let _whole = GpuModel::load(dev.clone(), &path).unwrap();
    let all = dev.memory().live - before - on_device;
    println!("q4_k: hybrid layout {on_device} bytes on the device, whole model {all}");
    assert!(on_device < all, "the routed experts stayed off the device");
    let (prompt, next) = seq.split_at(seq.len() - 3);
    let (got, _) = run_gpu(&gpu, prompt, next);
    let e = rel_err(&got, &want.data);
    let cpu = Model::load(&path, LoadOptions::new(Precision::Fast)).unwrap();
    let cpu_e = rel_err(&run_cpu(&cpu, prompt, next), &want.data);
    println!("q4_k against the exact reader: hybrid layout {e:.2e}, CPU {cpu_e:.2e}");
    // Only the routed experts quantize activations now; on the CPU every matrix does.
    assert!(
        e <= cpu_e + 1e-3,
        "q4_k hybrid: error {e:.2e}, CPU {cpu_e:.2e}"
    );
    let vocab = gpu.config.vocab_size;
    let argmax = |row: &[f32]| {
        let best = row.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1));
        best.map(|(i, _)| i).unwrap()
    };
    let rows = got.chunks_exact(vocab).zip(want.data.chunks_exact(vocab));
    for (i, (g, w)) in rows.enumerate() {
        assert_eq!(argmax(g), argmax(w), "q4_k hybrid: greedy token at row {i}");
    }
}

/// The hybrid executor installed on the host experts: KTransformers' deferral (decode only,
/// one expert per token joins the next layer), a small device cache for gpu-lru, HybriMoE
/// scoring the router's candidates (only it has them computed), each equal to the CPU model with the same executor, in
/// its logits and its placements; the device's experts add no round trip: one per MoE
/// layer and step, plus the logits, under every policy.
#[test]
fn hybrid_layout_runs_the_executors_policies() {
    let Some(dev) = default_gpu() else { return };
    let dir = repo("tests/fixtures/qwen3_moe");
    let policies = [
        (PolicyKind::KTransformers, 1),
        (PolicyKind::GpuLru, 0),
        (PolicyKind::HybriMoE, 0),
    ];
    for (policy, defer) in policies {
        let mut gpu = GpuModel::load_hybrid(dev.clone(), &dir, Precision::F32.into()).unwrap();
        let mut cpu = Model::load(&dir, Precision::F32).unwrap();
        let reference = executor(&dev, &dir, &gpu, policy, defer);
        install(&mut cpu, Some(&reference));
        let exec = executor(&dev, &dir, &gpu, policy, defer);
        gpu.keep_candidates(exec.reads_candidates());
        gpu.set_hybrid_executor(Some(exec.clone()));
        let (seen, cpu_seen) = (Arc::new(Seen::default()), Arc::new(Seen::default()));
        Backend::set_routing_tap(&gpu, Some(seen.clone()));
        cpu.set_routing_tap(Some(cpu_seen.clone()));
        let want = run_cpu(&cpu, &PROMPT, &NEXT);
        let (got, traffic) = run_gpu(&gpu, &PROMPT, &NEXT);
        let round_trips = traffic.downloads;
        // A policy that scores the router's best 2k candidates (HybriMoE) sees them, as on
        // the CPU; the others' layers do not compute them.
        let candidates = seen.0.lock().unwrap().clone();
        assert!(!candidates.is_empty(), "{policy}");
        let scored = candidates.iter().all(|c| !c.is_empty());
        assert_eq!(
            scored,
            policy == PolicyKind::HybriMoE,
            "{policy}: {candidates:?}"
        );
        assert_eq!(
            candidates,
            *cpu_seen.0.lock().unwrap(),
            "{policy}: candidates"
        );
        let stats = exec.stats();
        let e = rel_err(&got, &want);
        println!("{policy}: error {e:.2e}, {stats}");
        assert!(e <= 1e-3, "{policy}: error {e:.2e} > 1e-3");
        assert_eq!(stats.steps, 1 + NEXT.len(), "{policy}");
        // The same routing and candidates (HybriMoE scores them): the same placements.
        let placed = |s: &strata_exec::ExecStats| (s.gpu_pairs, s.cpu_pairs, s.uploads, s.hits);
        assert_eq!(placed(&stats), placed(&reference.stats()), "{policy}");
        let layers = moe_layers(&gpu);
        let steps = NEXT.len() as u64;
        if policy == PolicyKind::KTransformers {
            assert!(stats.deferred_experts > 0, "{policy}: {stats}");
            assert_eq!(stats.gpu_pairs, 0, "{policy}: {stats}");
            assert_eq!(round_trips, steps * (layers + 1), "{policy}");
            // The fixture has no shared experts: the readback is the layer's one submission.
            assert!(
                traffic.submissions <= steps * (layers + 1),
                "{policy}: submissions in decode: {traffic:?}"
            );
        } else {
            assert!(stats.gpu_pairs > 0, "{policy}: {stats}");
            // The device's experts read their input where it is and stay there.
            assert_eq!(round_trips, steps * (layers + 1), "{policy}");
            // Uploads of missed experts go with the device's round: about one submission
            // each per layer, where each upload alone submitted twice.
            assert!(
                traffic.submissions <= steps * (3 * layers + 1),
                "{policy}: submissions in decode: {traffic:?}"
            );
        }
    }
}

/// Deferred experts computed on the device (no shipped policy does it: KTransformers
/// defers the CPU's): their outputs stay on the device and join the next MoE layer there.
/// The layout equals the CPU model with the same policy, which reads them back, and still
/// waits once per MoE layer.
#[test]
fn hybrid_layout_defers_the_devices_experts() {
    let Some(dev) = default_gpu() else { return };
    let dir = repo("tests/fixtures/qwen3_moe");
    let mut gpu = GpuModel::load_hybrid(dev.clone(), &dir, Precision::F32.into()).unwrap();
    let mut cpu = Model::load(&dir, Precision::F32).unwrap();
    let build = |_: &CostModel| -> Box<dyn Policy + Send> {
        Box::new(EvenExpertsOnDevice(KTransformers::new(1)))
    };
    let reference = executor_with(&dev, &dir, &gpu, build, None);
    install(&mut cpu, Some(&reference));
    let exec = executor_with(&dev, &dir, &gpu, build, None);
    gpu.set_hybrid_executor(Some(exec.clone()));
    let want = run_cpu(&cpu, &PROMPT, &NEXT);
    let (got, traffic) = run_gpu(&gpu, &PROMPT, &NEXT);
    let round_trips = traffic.downloads;
    let stats = exec.stats();
    let e = rel_err(&got, &want);
    println!("deferred on the device: error {e:.2e}, {stats}");
    assert!(e <= 1e-3, "error {e:.2e} > 1e-3");
    assert!(stats.gpu_pairs > 0 && stats.cpu_pairs > 0, "{stats}");
    assert!(stats.deferred_experts > 0, "{stats}");
    let placed = |s: &strata_exec::ExecStats| (s.gpu_pairs, s.cpu_pairs, s.deferred_experts);
    assert_eq!(placed(&stats), placed(&reference.stats()));
    let on_device_deferred = exec
        .take_log()
        .iter()
        .any(|r| r.gpu_tasks.iter().any(|t| t.1));
    assert!(on_device_deferred, "no expert deferred on the device");
    assert_eq!(round_trips, NEXT.len() as u64 * (moe_layers(&gpu) + 1));
}

/// Three tiers: the executor's device cache above the SSD tier's DRAM cache above the file
/// (`--device hybrid --policy gpu-lru|hybrimoe|ktransformers --defer 1 --expert-cache`).
/// The CPU's tasks (deferred ones too) compute from DRAM slots, the device's uploads read
/// through the tier (from a slot when there, else from the file): the logits equal the
/// same executor's over the mapped file bit for bit, with the same placements, and an
/// upload's bytes are the mapped file's.
#[test]
fn three_tiers_equal_the_mapped_file() {
    let Some(dev) = default_gpu() else { return };
    let path = repo("tests/fixtures-gguf/qwen3_moe_q32.q8_0.gguf");
    let load = LoadOptions::new(Precision::Fast);
    let prompt: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 200).collect();
    let next: Vec<u32> = (0..8).map(|i| (i * 53 + 11) % 200).collect();
    let min = ssd_min_budget(&Model::load(&path, load).unwrap(), &path).unwrap();
    let ssd = SsdOptions {
        budget: 2 * min,
        ..SsdOptions::default()
    };
    for (policy, defer) in [
        (PolicyKind::GpuLru, 0),
        (PolicyKind::HybriMoE, 0),
        (PolicyKind::KTransformers, 1),
    ] {
        let opts = PolicyOptions {
            deferred: defer,
            ..PolicyOptions::default()
        };
        let build = |cost: &CostModel| build_policy(policy, cost, &opts);
        let run = |tiered: bool| {
            let mut gpu = GpuModel::load_hybrid(dev.clone(), &path, load).unwrap();
            let tier = tiered
                .then(|| Arc::new(SsdTier::new(&gpu.host_moe_blocks(), &path, &ssd).unwrap()));
            let exec = executor_with(&dev, &path, &gpu, build, tier.clone());
            gpu.keep_candidates(exec.reads_candidates());
            gpu.set_hybrid_executor(Some(exec.clone()));
            let (logits, traffic) = run_gpu(&gpu, &prompt, &next);
            let round_trips = traffic.downloads;
            (logits, round_trips, exec.stats(), tier)
        };
        let (want, _, plain, _) = run(false);
        let (got, round_trips, stats, tier) = run(true);
        let tier = tier.unwrap().stats();
        println!("{policy}, three tiers: {stats}; {tier}");
        let same = got
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{policy}: three tiers changed the logits");
        let placed = |s: &strata_exec::ExecStats| {
            let p = (s.gpu_pairs, s.cpu_pairs, s.uploads, s.hits);
            (p, s.deferred_experts)
        };
        assert_eq!(placed(&stats), placed(&plain), "{policy}");
        // Every CPU task looked up in DRAM, every upload read through it.
        assert_eq!(tier.lookups, stats.cpu_experts as u64, "{policy}: {tier}");
        assert_eq!(tier.device_reads, stats.uploads as u64, "{policy}: {tier}");
        match policy {
            PolicyKind::KTransformers => assert!(tier.misses > 0, "{policy}: {tier}"),
            _ => assert!(tier.device_bytes_read > 0, "{policy}: {tier}"),
        }
        let steps = next.len() as u64;
        let layers = {
            let gpu = GpuModel::load_hybrid(dev.clone(), &path, load).unwrap();
            moe_layers(&gpu)
        };
        assert_eq!(round_trips, steps * (layers + 1), "{policy}");
    }
    // An upload's bytes through the tier, from a slot or from the file, are the mapping's.
    let gpu = GpuModel::load_hybrid(dev.clone(), &path, load).unwrap();
    let tier = Arc::new(SsdTier::new(&gpu.host_moe_blocks(), &path, &ssd).unwrap());
    let mapped = HostExperts::open(&path).unwrap();
    let mut through = HostExperts::open(&path).unwrap();
    through.read_through(Some(tier.clone()));
    let hidden = gpu.config.hidden_size;
    let x: Vec<f32> = (0..hidden).map(|i| (i as f32 * 0.37).sin()).collect();
    for l in 0..mapped.n_layers() {
        // Expert 0 of each layer into a slot first, so both paths are taken.
        let one = strata_kernels::moe::ExpertBatch {
            expert: 0,
            tokens: vec![0],
            weights: vec![1.0],
        };
        let mut out = vec![0.0f32; hidden];
        tier.run_batches(l, &x, &[one], &mut out, None).unwrap();
        for e in 0..mapped.n_experts() as u32 {
            let want = mapped.expert_bytes(l, e).unwrap();
            assert_eq!(
                through.expert_bytes(l, e).unwrap(),
                want,
                "layer {l} expert {e}"
            );
        }
    }
    let s = tier.stats();
    assert!(s.device_hits > 0 && s.device_bytes_read > 0, "{s}");
}

/// KTransformers' decision with the even experts' tasks moved to the device, streamed
/// through the staging slots when not resident.
#[derive(Debug)]
struct EvenExpertsOnDevice(KTransformers);

impl Policy for EvenExpertsOnDevice {
    fn name(&self) -> String {
        "even-experts-on-device".into()
    }

    fn decide(&mut self, view: &LayerView, cost: &CostModel) -> Decision {
        let mut d = self.0.decide(view, cost);
        let mut staged = Vec::new();
        for task in d.tasks.iter_mut().filter(|t| t.expert % 2 == 0) {
            task.device = Place::Gpu;
            if !view.gpu.resident[task.expert as usize] && !staged.contains(&task.expert) {
                staged.push(task.expert);
            }
        }
        d.transfers = staged
            .into_iter()
            .map(|expert| Transfer {
                layer: view.layer,
                expert,
                kind: TransferKind::Staged,
                priority: 0,
            })
            .collect();
        d
    }
}

/// The router candidates of every MoE layer a model routes, in order.
#[derive(Debug, Default)]
struct Seen(Mutex<Vec<Vec<u32>>>);

impl RoutingTap for Seen {
    fn on_routing(&self, _: usize, routing: &Routing) {
        let c = routing.candidates.as_ref().map(|c| c.ids.clone());
        self.0.lock().unwrap().push(c.unwrap_or_default());
    }
}

/// A hybrid executor for `gpu`'s host experts on `dev`, with room for eight experts.
fn executor(
    dev: &Arc<dyn Device>,
    dir: &Path,
    gpu: &GpuModel,
    policy: PolicyKind,
    defer: usize,
) -> Arc<HybridExecutor> {
    let opts = PolicyOptions {
        deferred: defer,
        ..PolicyOptions::default()
    };
    executor_with(
        dev,
        dir,
        gpu,
        |cost| build_policy(policy, cost, &opts),
        None,
    )
}

/// A hybrid executor for `gpu`'s host experts on `dev` running the policy `policy` builds
/// for its cost model, with room for eight experts.
fn executor_with(
    dev: &Arc<dyn Device>,
    dir: &Path,
    gpu: &GpuModel,
    policy: impl FnOnce(&CostModel) -> Box<dyn Policy + Send>,
    tier: Option<Arc<SsdTier>>,
) -> Arc<HybridExecutor> {
    let mut host = HostExperts::open(dir).unwrap();
    host.read_through(tier.clone());
    let budget = 8 * host.slot_bytes();
    let cost = cost_model(
        Hardware::load("ktrans-4080").unwrap(),
        model_shape(&gpu.config).unwrap(),
        host.bits_per_weight(),
        HybridExecutor::cache_bytes(&host, budget),
    )
    .unwrap();
    let policy = policy(&cost);
    let opts = ExecOptions {
        vram_budget: budget,
        record: true,
        host_tier: tier,
        ..ExecOptions::default()
    };
    Arc::new(HybridExecutor::new(dev.clone(), host, policy, cost, &opts).unwrap())
}

/// The SSD tier behind the hybrid layout's host experts (`--device hybrid --policy
/// ktransformers --expert-cache`): the device runs attention, DRAM slots cache the experts,
/// the file holds them. With the smallest cache (evictions every step, prefetches) the
/// logits equal the hybrid layout's from the mapped file bit for bit.
#[test]
fn hybrid_layout_runs_the_ssd_tier() {
    let Some(dev) = default_gpu() else { return };
    let path = repo("tests/fixtures-gguf/qwen3_moe_q32.q8_0.gguf");
    let load = LoadOptions::new(Precision::Fast);
    let prompt: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 200).collect();
    let next: Vec<u32> = (0..8).map(|i| (i * 53 + 11) % 200).collect();
    let mapped = GpuModel::load_hybrid(dev.clone(), &path, load).unwrap();
    let (want, _) = run_gpu(&mapped, &prompt, &next);
    let mut gpu = GpuModel::load_hybrid(dev.clone(), &path, load).unwrap();
    let min = ssd_min_budget(&Model::load(&path, load).unwrap(), &path).unwrap();
    let opts = SsdOptions {
        budget: min,
        ..SsdOptions::default()
    };
    let tier = Arc::new(SsdTier::new(&gpu.host_moe_blocks(), &path, &opts).unwrap());
    gpu.set_executor(Some(tier.clone()));
    let (got, traffic) = run_gpu(&gpu, &prompt, &next);
    let round_trips = traffic.downloads;
    let stats = tier.stats();
    println!("ssd tier under the hybrid layout: {stats}");
    assert!(stats.misses > 0, "{stats}");
    let same = got
        .iter()
        .zip(&want)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(same, "the SSD tier changed the hybrid layout's logits");
    assert_eq!(round_trips, next.len() as u64 * (moe_layers(&gpu) + 1));
}
