//! Simulator invariants, the synthetic generator's calibration and the trace format.

use strata_policy::policies::{
    Fiddler, GpuLru, HybriCosts, HybriMoE, KTransformers, Smoe, SmoeEviction,
};
use strata_policy::{CostModel, Decision, Device, Hardware, LayerView, ModelShape, Policy, Task};
use strata_sim::workload::{SyntheticParams, synthetic};
use strata_sim::{Lane, Report, reproduce, simulate, trace};

fn setup(prompt: usize, decode: usize) -> (CostModel, strata_sim::workload::Workload) {
    let c = CostModel::new(
        Hardware::load("smoe-4090").unwrap(),
        ModelShape::load("qwen3-30b-a3b").unwrap(),
        16.0,
        16.0,
    )
    .unwrap();
    let m = &c.model;
    let w = synthetic(&SyntheticParams {
        prompt_tokens: prompt,
        decode_tokens: decode,
        requests: 2,
        ..SyntheticParams::calibrated(m.moe_layers(), m.n_experts, m.top_k)
    });
    (c, w)
}

fn check_invariants(r: &Report) {
    for lane in [Lane::Gpu, Lane::Cpu, Lane::Pcie] {
        let mut ops: Vec<_> = r.ops.iter().filter(|o| o.lane == lane).collect();
        ops.sort_by(|a, b| a.start.total_cmp(&b.start));
        for pair in ops.windows(2) {
            assert!(
                pair[1].start >= pair[0].end - 1e-12,
                "{}: {lane:?} runs {:?} and {:?} at once",
                r.policy,
                pair[0],
                pair[1]
            );
        }
    }
    for op in r
        .ops
        .iter()
        .filter(|o| o.lane == Lane::Gpu && o.name.starts_with("expert"))
    {
        assert!(
            op.start >= op.weights_ready - 1e-12,
            "{}: {op:?} before its weights",
            r.policy
        );
    }
    assert!(
        r.peak_expert_bytes <= r.expert_budget_bytes,
        "{}: memory over budget",
        r.policy
    );
}

#[test]
fn every_policy_keeps_the_invariants() {
    let (c, w) = setup(96, 12);
    let slots = c.cache_slots_per_layer();
    assert!(slots > 0);
    let (preds, acc) = reproduce::train_predictors(&w, c.model.top_k).unwrap();
    let mut policies: Vec<Box<dyn Policy>> = vec![
        Box::new(GpuLru::new(slots)),
        Box::new(Fiddler::new(w.profile())),
        Box::new(KTransformers::new(0)),
        Box::new(KTransformers::new(3)),
        Box::new(HybriMoE::new(slots, 2)),
        Box::new(HybriMoE::with_costs(HybriCosts::Released, slots, 1)),
        Box::new(Smoe::new(slots, 2, SmoeEviction::FixedN, preds.clone())),
        Box::new(Smoe::new(slots, 2, SmoeEviction::Adaptive, preds.clone())),
        Box::new(Smoe::flex(slots, 3, SmoeEviction::FixedN, preds, &acc)),
    ];
    for p in policies.iter_mut() {
        let r = simulate(p.as_mut(), &c, &w).unwrap();
        check_invariants(&r);
        assert_eq!(r.step_latency_s.len(), w.steps.len());
        assert!(r.decode.tokens_per_s > 0.0 && r.prefill.tokens_per_s > 0.0);
        let gpu_share = r.decode.on_gpu as f64 / r.decode.activations as f64;
        match p.name().as_str() {
            "gpu-lru" => assert_eq!(gpu_share, 1.0),
            n if n.starts_with("ktransformers") => {
                assert_eq!(gpu_share, 0.0);
                assert_eq!(r.pcie_bytes, 0);
            }
            n if n.starts_with("smoe") => {
                assert!(r.predictor_accuracy.is_some());
                assert!(r.pcie_bytes > 0);
            }
            _ => {}
        }
        let trace = r.chrome_trace();
        assert!(trace["traceEvents"].as_array().unwrap().len() > r.ops.len());
    }
}

#[test]
fn deferral_overlaps_cpu_with_the_next_attention() {
    let (c, w) = setup(8, 8);
    let base = simulate(&mut KTransformers::new(0), &c, &w).unwrap();
    let def = simulate(&mut KTransformers::new(4), &c, &w).unwrap();
    check_invariants(&def);
    assert!(def.decode.tokens_per_s > base.decode.tokens_per_s);
    assert!(def.decode.util_cpu > base.decode.util_cpu);
    // Prefill is never deferred: identical.
    assert!((def.prefill.seconds - base.prefill.seconds).abs() < 1e-9);
}

/// Runs an expert on the GPU without its weights.
struct Cheater;

impl Policy for Cheater {
    fn name(&self) -> String {
        "cheater".into()
    }
    fn decide(&mut self, view: &LayerView, cost: &CostModel) -> Decision {
        Decision {
            tasks: strata_policy::tasks_by_expert(view, cost.model.n_experts, |_, _| Device::Gpu),
            ..Decision::default()
        }
    }
}

/// Forgets a token.
struct Dropper;

impl Policy for Dropper {
    fn name(&self) -> String {
        "dropper".into()
    }
    fn decide(&mut self, view: &LayerView, _: &CostModel) -> Decision {
        Decision {
            tasks: vec![Task {
                expert: view.ids[0],
                device: Device::Cpu,
                rows: vec![0],
                deferred: false,
            }],
            ..Decision::default()
        }
    }
}

#[test]
fn policy_bugs_are_errors() {
    let (c, w) = setup(4, 1);
    let e = simulate(&mut Cheater, &c, &w).unwrap_err().to_string();
    assert!(e.contains("neither resident nor copied"), "{e}");
    let e = simulate(&mut Dropper, &c, &w).unwrap_err().to_string();
    assert!(e.contains("pairs"), "{e}");
    let other = CostModel::new(
        Hardware::load("smoe-4090").unwrap(),
        ModelShape::load("deepseek-v3").unwrap(),
        4.0,
        4.0,
    )
    .unwrap();
    assert!(simulate(&mut KTransformers::new(0), &other, &w).is_err());
}

#[test]
fn synthetic_matches_the_seed_statistics() {
    let p = SyntheticParams {
        prompt_tokens: 2000,
        decode_tokens: 0,
        hidden_dim: 0,
        ..SyntheticParams::calibrated(58, 256, 8)
    };
    let w = synthetic(&p);
    let profile = w.profile();
    let share_of_coldest = |l: usize, frac: f64| {
        let mut c = profile[l].clone();
        c.sort();
        let n = (c.len() as f64 * frac) as usize;
        c[..n].iter().sum::<u64>() as f64 / c.iter().sum::<u64>() as f64
    };
    // Deepest layer: the coldest 70% of experts take about a tenth of the activations
    // (seed 000: > 70% of experts, ~8% of tokens).
    let deep = share_of_coldest(57, 0.7);
    assert!((0.04..0.16).contains(&deep), "{deep}");
    // Shallowest layer: much closer to uniform (seed 004 figure 5).
    let shallow = share_of_coldest(0, 0.7);
    assert!(shallow > 0.45, "{shallow}");
    // Token-to-token persistence in decode.
    let d = synthetic(&SyntheticParams {
        prompt_tokens: 1,
        decode_tokens: 200,
        hidden_dim: 0,
        ..SyntheticParams::calibrated(4, 256, 8)
    });
    let mut kept = 0;
    for pair in d.steps[1..].windows(2) {
        let (a, b) = (&pair[0].layers[3].ids, &pair[1].layers[3].ids);
        kept += b.iter().filter(|e| a.contains(e)).count();
    }
    let frac = kept as f64 / (199.0 * 8.0);
    assert!((0.45..0.7).contains(&frac), "{frac}");
}

#[test]
fn trace_round_trips_and_rejects_bad_files() {
    let (_, w) = setup(5, 3);
    let mut buf = Vec::new();
    trace::write(&mut buf, "synthetic", &w).unwrap();
    let (h, back) = trace::read(&buf[..], "mem").unwrap();
    assert_eq!(h.n_experts, 128);
    assert_eq!(back, w);
    let text = String::from_utf8(buf).unwrap();
    let truncated: String = text.lines().take(10).map(|l| format!("{l}\n")).collect();
    let e = trace::read(truncated.as_bytes(), "t.jsonl")
        .unwrap_err()
        .to_string();
    assert!(e.contains("t.jsonl") && e.contains("layers"), "{e}");
    let e = trace::read(&b"{\"format\":\"x\"}\n"[..], "x")
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 1"), "{e}");
    let bad_id = text.replacen("\"ids\":[", "\"ids\":[999,", 1);
    assert!(trace::read(bad_id.as_bytes(), "b").is_err());
}

#[test]
fn trace_version_2_carries_candidates_and_version_1_still_reads() {
    let (_, plain) = setup(5, 3);
    let mut w = plain.clone();
    let p = 2 * w.top_k;
    for s in &mut w.steps {
        for l in &mut s.layers {
            l.candidates = Some(strata_sim::workload::Candidates {
                per_token: p,
                ids: (0..s.tokens * p).map(|i| (i % p) as u32).collect(),
                scores: (0..s.tokens * p)
                    .map(|i| 1.0 / (1 + i % p) as f32)
                    .collect(),
            });
        }
    }
    let mut buf = Vec::new();
    trace::write(&mut buf, "synthetic", &w).unwrap();
    let (h, back) = trace::read(&buf[..], "mem").unwrap();
    assert_eq!((h.version, h.candidates), (trace::VERSION, p));
    assert_eq!(back, w);
    // A version 1 file (no candidates anywhere) reads as before.
    let mut v1 = Vec::new();
    trace::write(&mut v1, "synthetic", &plain).unwrap();
    let v1 = String::from_utf8(v1)
        .unwrap()
        .replacen("\"version\":2", "\"version\":1", 1)
        .replacen(",\"candidates\":0", "", 1);
    assert!(!v1.contains("candidates") && v1.contains("\"version\":1"));
    let (h1, back1) = trace::read(v1.as_bytes(), "v1").unwrap();
    assert_eq!((h1.version, h1.candidates), (1, 0));
    assert_eq!(back1, plain);
    // Candidates of the wrong length are an error naming the line.
    let text = String::from_utf8(buf).unwrap();
    let bad = text.replacen("\"candidate_ids\":[", "\"candidate_ids\":[1,", 1);
    let e = trace::read(bad.as_bytes(), "c").unwrap_err().to_string();
    assert!(e.contains("line 2") && e.contains("candidate"), "{e}");
}

#[test]
fn without_a_gpu_everything_runs_on_the_cpu() {
    let c = CostModel::new(
        Hardware::load("local").unwrap(),
        ModelShape::load("qwen3-30b-a3b").unwrap(),
        16.0,
        16.0,
    )
    .unwrap();
    let m = &c.model;
    let w = synthetic(&SyntheticParams {
        prompt_tokens: 8,
        decode_tokens: 2,
        hidden_dim: 0,
        ..SyntheticParams::calibrated(m.moe_layers(), m.n_experts, m.top_k)
    });
    let r = simulate(&mut KTransformers::new(0), &c, &w).unwrap();
    check_invariants(&r);
    assert!(r.ops.iter().all(|o| o.lane == Lane::Cpu));
    assert!(r.decode.util_cpu > 0.99);
}

/// Every routed expert on NDP unit `expert % units`.
struct AllNdp(u16);

impl Policy for AllNdp {
    fn name(&self) -> String {
        "all-ndp".into()
    }
    fn decide(&mut self, view: &LayerView, cost: &CostModel) -> Decision {
        let units = self.0;
        Decision {
            tasks: strata_policy::tasks_by_expert(view, cost.model.n_experts, |e, _| {
                Device::Ndp((e % u32::from(units)) as u16)
            }),
            ..Decision::default()
        }
    }
}

#[test]
fn ndp_units_are_lanes_of_their_own() {
    let c = CostModel::new(
        Hardware::load("trimoe-h100").unwrap(),
        ModelShape::load("qwen3-30b-a3b").unwrap(),
        16.0,
        16.0,
    )
    .unwrap();
    let m = &c.model;
    let w = synthetic(&SyntheticParams {
        prompt_tokens: 16,
        decode_tokens: 2,
        hidden_dim: 0,
        ..SyntheticParams::calibrated(m.moe_layers(), m.n_experts, m.top_k)
    });
    let r = simulate(&mut AllNdp(16), &c, &w).unwrap();
    check_invariants(&r);
    for u in 0..16u16 {
        let mut ops: Vec<_> = r.ops.iter().filter(|o| o.lane == Lane::Ndp(u)).collect();
        assert!(!ops.is_empty());
        ops.sort_by(|a, b| a.start.total_cmp(&b.start));
        assert!(ops.windows(2).all(|p| p[1].start >= p[0].end - 1e-12));
    }
    // A unit the machine does not have is an error.
    let e = simulate(&mut AllNdp(17), &c, &w).unwrap_err().to_string();
    assert!(e.contains("NDP unit 16"), "{e}");
}
