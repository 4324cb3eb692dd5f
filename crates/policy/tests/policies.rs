//! Each policy's decisions on hand-made layers, and the presets' integrity.

use strata_policy::policies::{Fiddler, GpuLru, HybriMoE, KTransformers, Smoe, SmoeEviction};
use strata_policy::predictor::LinearPredictor;
use strata_policy::{
    Candidates, CostModel, Decision, Device, GpuView, Hardware, LayerView, ModelShape, Phase,
    Policy, TransferKind,
};

fn small_model(n_experts: usize, top_k: usize) -> ModelShape {
    let mut m = ModelShape::load("deepseek-v3").unwrap();
    m.n_experts = n_experts;
    m.top_k = top_k;
    m
}

fn cost(n_experts: usize, top_k: usize) -> CostModel {
    CostModel::new(
        Hardware::load("smoe-4090").unwrap(),
        small_model(n_experts, top_k),
        4.25,
        4.25,
    )
    .unwrap()
}

struct View {
    ids: Vec<u32>,
    weights: Vec<f32>,
    resident: Vec<bool>,
    hidden: Option<Vec<f32>>,
}

impl View {
    fn new(n: usize, ids: &[u32], resident: &[u32]) -> Self {
        let mut r = vec![false; n];
        for &e in resident {
            r[e as usize] = true;
        }
        Self {
            ids: ids.to_vec(),
            weights: vec![1.0; ids.len()],
            resident: r,
            hidden: None,
        }
    }

    fn view(
        &self,
        layer: usize,
        layers: usize,
        phase: Phase,
        step: usize,
        k: usize,
    ) -> LayerView<'_> {
        LayerView {
            layer,
            n_moe_layers: layers,
            phase,
            step,
            top_k: k,
            ids: &self.ids,
            weights: &self.weights,
            hidden: self.hidden.as_deref(),
            candidates: None,
            gpu: GpuView {
                resident: &self.resident,
                free_bytes: 0,
                busy_s: 0.0,
            },
            cpu_busy_s: 0.0,
            pcie_busy_s: 0.0,
            context: None,
        }
    }
}

fn on(d: &Decision, dev: Device) -> Vec<u32> {
    let mut v: Vec<u32> = d
        .tasks
        .iter()
        .filter(|t| t.device == dev)
        .map(|t| t.expert)
        .collect();
    v.sort();
    v
}

fn copies(d: &Decision, kind: TransferKind) -> Vec<u32> {
    d.transfers
        .iter()
        .filter(|t| t.kind == kind)
        .map(|t| t.expert)
        .collect()
}

fn evicted(d: &Decision) -> Vec<u32> {
    d.evictions.iter().map(|e| e.expert).collect()
}

#[test]
fn presets_parse_and_every_number_has_a_source() {
    let hw = Hardware::presets().unwrap();
    assert!(hw.len() >= 5);
    for (name, h) in &hw {
        assert!(
            h.unsourced().is_empty(),
            "{name}: unsourced {:?}",
            h.unsourced()
        );
    }
    let models = ModelShape::presets().unwrap();
    assert!(models.contains_key("qwen3-30b-a3b") && models.contains_key("mixtral-8x7b"));
    let c = CostModel::new(
        hw["ktrans-a100"].clone(),
        models["deepseek-v3"].clone(),
        16.0,
        16.0,
    )
    .unwrap();
    assert_eq!(c.expert_bytes(), 3 * 7168 * 2048 * 2);
    // Seed 003 table 1: 17B parameters on the GPU.
    let gpu = c.model.gpu_params() as f64 / 1e9;
    assert!((16.0..18.5).contains(&gpu), "{gpu}B");
    // Seed 004: ~8 experts per layer fit on a 24 GB RTX 4090 at 4 bits.
    let s = CostModel::new(
        hw["smoe-4090"].clone(),
        models["deepseek-v3"].clone(),
        4.25,
        4.25,
    )
    .unwrap();
    assert_eq!(s.cache_slots_per_layer(), 8);
}

#[test]
fn measured_expert_table_replaces_the_roofline_for_its_shape() {
    let local = Hardware::load("local").unwrap();
    let qwen = ModelShape::load("qwen3-30b-a3b").unwrap();
    let c = CostModel::new(local.clone(), qwen.clone(), 16.0, 16.0).unwrap();
    assert!((c.expert_time(Device::Cpu, 4) - 5.7e-4).abs() < 1e-12);
    let mid = c.expert_time(Device::Cpu, 18);
    assert!((mid - (5.7e-4 + 1.87e-3) / 2.0).abs() < 1e-9, "{mid}");
    assert!((c.expert_time(Device::Cpu, 512) - 2.0 * 1.66e-2).abs() < 1e-9);
    // Another precision or shape falls back to the roofline.
    let int4 = CostModel::new(local.clone(), qwen, 4.0, 16.0).unwrap();
    let roof = int4.expert_bytes() as f64 / local.cpu.mem_bw + local.cpu.task_overhead_s;
    assert!((int4.expert_time(Device::Cpu, 1) - roof).abs() < 1e-12);
}

#[test]
fn unknown_presets_are_named_with_the_known_ones() {
    let e = ModelShape::load("no-such-model").unwrap_err().to_string();
    assert!(
        e.contains("no-such-model") && e.contains("strata-tiny-moe"),
        "{e}"
    );
}

#[test]
fn gpu_lru_hits_misses_and_evicts_least_recent() {
    let c = cost(8, 1);
    let mut p = GpuLru::new(2);
    // Step 0: expert 0 misses into a free slot.
    let d = p.decide(&View::new(8, &[0], &[]).view(0, 1, Phase::Decode, 0, 1), &c);
    assert_eq!(copies(&d, TransferKind::OnDemand), vec![0]);
    assert_eq!(on(&d, Device::Gpu), vec![0]);
    // Step 1: expert 1 misses into the second slot.
    let d = p.decide(
        &View::new(8, &[1], &[0]).view(0, 1, Phase::Decode, 1, 1),
        &c,
    );
    assert!(evicted(&d).is_empty());
    // Step 2: expert 0 hits: no copy.
    let d = p.decide(
        &View::new(8, &[0], &[0, 1]).view(0, 1, Phase::Decode, 2, 1),
        &c,
    );
    assert!(d.transfers.is_empty());
    // Step 3: expert 2 misses; 1 is least recently used, so it goes.
    let d = p.decide(
        &View::new(8, &[2], &[0, 1]).view(0, 1, Phase::Decode, 3, 1),
        &c,
    );
    assert_eq!(evicted(&d), vec![1]);
    assert_eq!(copies(&d, TransferKind::OnDemand), vec![2]);
    // More experts than slots: the overflow streams through the ping-pong buffers.
    let d = p.decide(
        &View::new(8, &[3, 4, 5], &[0, 2]).view(0, 1, Phase::Prefill, 4, 1),
        &c,
    );
    assert_eq!(d.evictions.len(), 2);
    assert_eq!(copies(&d, TransferKind::Staged).len(), 1);
    assert_eq!(on(&d, Device::Gpu), vec![3, 4, 5]);
}

#[test]
fn ktransformers_defers_the_lowest_weighted_experts_in_decode_only() {
    let c = cost(16, 4);
    let mut p = KTransformers::new(2);
    let mut v = View::new(16, &[5, 6, 7, 8, 1, 2, 3, 4], &[]);
    v.weights = vec![0.4, 0.1, 0.3, 0.2, 0.1, 0.2, 0.3, 0.4];
    let d = p.decide(&v.view(0, 3, Phase::Decode, 0, 4), &c);
    let split = |deferred: bool| {
        let mut x: Vec<(u32, Vec<u32>)> = d
            .tasks
            .iter()
            .filter(|t| t.deferred == deferred)
            .map(|t| (t.expert, t.rows.clone()))
            .collect();
        x.sort();
        x
    };
    assert_eq!(
        split(false),
        vec![(3, vec![1]), (4, vec![1]), (5, vec![0]), (7, vec![0])]
    );
    assert_eq!(
        split(true),
        vec![(1, vec![1]), (2, vec![1]), (6, vec![0]), (8, vec![0])]
    );
    assert!(d.tasks.iter().all(|t| t.device == Device::Cpu));
    // Not on the last layer, not in prefill.
    let d = p.decide(&v.view(2, 3, Phase::Decode, 0, 4), &c);
    assert!(d.tasks.iter().all(|t| !t.deferred));
    let d = p.decide(&v.view(0, 3, Phase::Prefill, 0, 4), &c);
    assert!(d.tasks.iter().all(|t| !t.deferred));
    // At least one immediate expert per token.
    let d = KTransformers::new(9).decide(&v.view(0, 3, Phase::Decode, 0, 4), &c);
    assert_eq!(d.tasks.iter().filter(|t| !t.deferred).count(), 2);
}

#[test]
fn smoe_algorithm1_boundary() {
    let c = cost(4, 1);
    let t_pcie = c.expert_transfer_time();
    let cross = (1..100_000u32)
        .find(|&n| c.expert_time(Device::Cpu, n) > c.expert_time(Device::Gpu, n) + t_pcie)
        .unwrap();
    assert!(cross > 1);
    // Expert 0 gets `cross` tokens, expert 1 `cross - 1`, expert 2 one; 3 is cached.
    let mut ids = vec![0u32; cross as usize];
    ids.extend(std::iter::repeat_n(1u32, cross as usize - 1));
    ids.push(2);
    let mut p = Smoe::new(1, 2, SmoeEviction::FixedN, vec![None]);
    let d = p.decide(
        &View::new(4, &ids, &[3]).view(0, 1, Phase::Prefill, 0, 1),
        &c,
    );
    assert_eq!(on(&d, Device::Gpu), vec![0]);
    assert_eq!(on(&d, Device::Cpu), vec![1, 2]);
    assert_eq!(copies(&d, TransferKind::Staged), vec![0]);
    // End of prefill: the single slot goes to the most frequent expert (0), evicting 3.
    assert_eq!(copies(&d, TransferKind::Prefetch), vec![0]);
    assert_eq!(evicted(&d), vec![3]);
    // A cached expert this layer runs on the GPU is never evicted for the refill.
    let mut p = Smoe::new(1, 2, SmoeEviction::FixedN, vec![None]);
    let d = p.decide(
        &View::new(4, &ids, &[1]).view(0, 1, Phase::Prefill, 0, 1),
        &c,
    );
    assert_eq!(on(&d, Device::Gpu), vec![0, 1]);
    assert!(evicted(&d).is_empty() && copies(&d, TransferKind::Prefetch).is_empty());
}

fn one_hot_predictor(n: usize) -> LinearPredictor {
    let hs: Vec<Vec<f32>> = (0..n)
        .map(|e| (0..n).map(|i| if i == e { 1.0 } else { 0.0 }).collect())
        .collect();
    let ys: Vec<Vec<u32>> = (0..n as u32).map(|e| vec![e]).collect();
    let s: Vec<(&[f32], &[u32])> = hs
        .iter()
        .zip(&ys)
        .map(|(h, y)| (h.as_slice(), y.as_slice()))
        .collect();
    LinearPredictor::train(&s, n, n, 1e-3).unwrap()
}

#[test]
fn smoe_decode_prefetch_fixed_n_and_adaptive() {
    let n = 8;
    let c = cost(n, 1);
    let mut hidden = vec![0.0f32; n];
    hidden[3] = 1.0;
    hidden[5] = 0.9;
    hidden[1] = 0.8;
    for (eviction, want_in, want_out) in [
        (SmoeEviction::FixedN, vec![5u32, 1], vec![0u32, 2]),
        (SmoeEviction::Adaptive, vec![5], vec![0]),
    ] {
        let mut p = Smoe::new(3, 2, eviction, vec![Some(one_hot_predictor(n))]);
        // Make expert 2 more frequent than 0 so LFU evicts 0 first.
        for step in 0..2 {
            let v = View::new(n, &[2], &[0, 2, 3]);
            p.decide(&v.view(0, 1, Phase::Decode, step, 1), &c);
        }
        let mut v = View::new(n, &[3], &[0, 2, 3]);
        v.hidden = Some(hidden.clone());
        let d = p.decide(&v.view(0, 1, Phase::Decode, 2, 1), &c);
        assert_eq!(on(&d, Device::Gpu), vec![3]);
        assert_eq!(d.predicted, Some(vec![3]));
        assert_eq!(copies(&d, TransferKind::Prefetch), want_in, "{eviction:?}");
        assert_eq!(evicted(&d), want_out, "{eviction:?}");
    }
    // A miss runs on the CPU.
    let mut p = Smoe::new(3, 2, SmoeEviction::FixedN, vec![None]);
    let d = p.decide(
        &View::new(n, &[4, 3], &[3]).view(0, 1, Phase::Decode, 0, 2),
        &c,
    );
    assert_eq!(
        (on(&d, Device::Gpu), on(&d, Device::Cpu)),
        (vec![3], vec![4])
    );
}

#[test]
fn smoe_flex_keeps_the_better_half() {
    let preds = vec![Some(one_hot_predictor(4)); 4];
    let mut p = Smoe::flex(1, 1, SmoeEviction::FixedN, preds, &[0.9, 0.1, 0.5, 0.7]);
    assert_eq!(p.name(), "smoe-flex");
    let c = cost(4, 1);
    let mut predicted = Vec::new();
    for l in 0..4 {
        let mut v = View::new(4, &[0], &[]);
        v.hidden = Some(vec![1.0, 0.0, 0.0, 0.0]);
        predicted.push(
            p.decide(&v.view(l, 4, Phase::Decode, 0, 1), &c)
                .predicted
                .is_some(),
        );
    }
    assert_eq!(predicted, vec![true, false, false, true]);
}

#[test]
fn hybrimoe_scores_assignment_and_prefetch() {
    let c = cost(8, 2);
    let mut p = HybriMoE::new(2, 1);
    let mut v = View::new(8, &[0, 1], &[0]);
    v.weights = vec![0.6, 0.4];
    let d = p.decide(&v.view(0, 2, Phase::Decode, 0, 2), &c);
    assert!((p.score(0, 0) - 0.3).abs() < 1e-6 && (p.score(0, 1) - 0.2).abs() < 1e-6);
    // Cached 0 on the GPU; uncached 1 costs a copy, so the CPU finishes it first.
    assert_eq!(
        (on(&d, Device::Gpu), on(&d, Device::Cpu)),
        (vec![0], vec![1])
    );
    // Next step, not routed: scores halve.
    let d2 = p.decide(
        &View::new(8, &[2, 3], &[0]).view(0, 2, Phase::Decode, 1, 2),
        &c,
    );
    assert!((p.score(0, 0) - 0.15).abs() < 1e-6);
    assert_eq!(on(&d2, Device::Gpu).len() + on(&d2, Device::Cpu).len(), 2);
    // Layer 1 gets scores, then layer 0 prefetches layer 1's best uncached expert (6).
    let mut v1 = View::new(8, &[6, 7], &[]);
    v1.weights = vec![0.9, 0.1];
    let d1 = p.decide(&v1.view(1, 2, Phase::Decode, 1, 2), &c);
    // A 14 GB/s copy loses to the CPU for both single-token experts.
    assert_eq!(
        (on(&d1, Device::Gpu), on(&d1, Device::Cpu)),
        (vec![], vec![6, 7])
    );
    let d3 = p.decide(
        &View::new(8, &[0, 1], &[0]).view(0, 2, Phase::Decode, 2, 2),
        &c,
    );
    let pre: Vec<(usize, u32)> = d3
        .transfers
        .iter()
        .filter(|t| t.kind == TransferKind::Prefetch)
        .map(|t| (t.layer, t.expert))
        .collect();
    assert_eq!(pre, vec![(1, 6)]);
}

#[test]
fn hybrimoe_scores_the_routers_top_2k_when_the_view_has_them() {
    let c = cost(8, 2);
    let mut p = HybriMoE::new(2, 1);
    let v = View::new(8, &[0, 1], &[]);
    let mut view = v.view(0, 2, Phase::Decode, 0, 2);
    view.candidates = Some(Candidates {
        per_token: 4,
        ids: &[0, 1, 5, 2],
        scores: &[0.5, 0.2, 0.15, 0.1],
    });
    let d = p.decide(&view, &c);
    for (e, s) in [(0, 0.25), (1, 0.1), (5, 0.075), (2, 0.05), (3, 0.0)] {
        assert!(
            (p.score(0, e) - s).abs() < 1e-6,
            "expert {e}: {}",
            p.score(0, e)
        );
    }
    // Candidates are scored, not run: only the routed experts have tasks.
    let mut run: Vec<u32> = d.tasks.iter().map(|t| t.expert).collect();
    run.sort();
    assert_eq!(run, vec![0, 1]);
}

#[test]
fn fiddler_pins_the_profile_and_picks_the_cheaper_device() {
    let c = cost(8, 1);
    let slots = (c.gpu_expert_budget() / c.expert_bytes()) as usize;
    let mut profile = vec![vec![0u64; 8]; 200];
    for (l, layer) in profile.iter_mut().enumerate() {
        layer[l % 8] = 10 + l as u64;
        layer[(l + 1) % 8] = 1;
    }
    let mut p = Fiddler::new(profile);
    let pinned = p.initial_residency(&c);
    assert_eq!(pinned.len(), slots.min(400));
    assert_eq!(pinned[0], (199, 199 % 8));
    // One token: the CPU beats a copy. Many tokens: the copy wins.
    let d = p.decide(
        &View::new(8, &[1, 2], &[2]).view(0, 1, Phase::Decode, 0, 2),
        &c,
    );
    assert_eq!(
        (on(&d, Device::Gpu), on(&d, Device::Cpu)),
        (vec![2], vec![1])
    );
    let ids = vec![1u32; 4096];
    let d = p.decide(
        &View::new(8, &ids, &[]).view(0, 1, Phase::Prefill, 0, 1),
        &c,
    );
    assert_eq!(copies(&d, TransferKind::Staged), vec![1]);
}
