//! NDP layouts in the simulator, the TriMoE policies under its checks, and the TriMoE
//! reproduction's shape (paper numbers are compared in the reproduction's own output,
//! not asserted).

use strata_policy::policies::{Klotski, KtEnhanced, Monde, TriMoE, TriMoEConfig};
use strata_policy::predictor::EmaPredictor;
use strata_policy::{
    CostModel, Decision, Device, Hardware, LayerView, Layout, Migration, ModelShape, Phase, Policy,
};
use strata_sim::report::hot_overlap;
use strata_sim::workload::{LayerRouting, Step, SyntheticParams, Workload, synthetic};
use strata_sim::{Lane, Report, reproduce, simulate};

fn setup() -> (CostModel, Workload) {
    let c = CostModel::new(
        Hardware::load("trimoe-h100").unwrap(),
        ModelShape::load("qwen3-30b-a3b").unwrap(),
        16.0,
        16.0,
    )
    .unwrap();
    let m = &c.model;
    let w = synthetic(&SyntheticParams {
        requests: 1,
        prompt_tokens: 64,
        decode_tokens: 6,
        hidden_dim: 0,
        ..SyntheticParams::calibrated(m.moe_layers(), m.n_experts, m.top_k)
    });
    (c, w)
}

fn no_overlap(r: &Report) {
    let mut lanes: Vec<Lane> = r.ops.iter().map(|o| o.lane).collect();
    lanes.sort_by_key(|l| format!("{l:?}"));
    lanes.dedup();
    for lane in lanes {
        let mut ops: Vec<_> = r.ops.iter().filter(|o| o.lane == lane).collect();
        ops.sort_by(|a, b| a.start.total_cmp(&b.start));
        for p in ops.windows(2) {
            assert!(
                p[1].start >= p[0].end - 1e-12,
                "{}: {:?} {:?}",
                r.policy,
                p[0],
                p[1]
            );
        }
    }
}

#[test]
fn trimoe_and_its_baselines_keep_the_invariants() {
    let (c, w) = setup();
    let prof: Vec<Vec<f64>> = w
        .profile()
        .into_iter()
        .map(|r| {
            r.into_iter()
                .map(|x| x as f64 / w.steps.len() as f64)
                .collect()
        })
        .collect();
    let mut policies: Vec<Box<dyn Policy>> = vec![
        Box::new(TriMoE::new(TriMoEConfig::FULL, prof.clone())),
        Box::new(TriMoE::new(
            TriMoEConfig {
                cpu: false,
                refine: false,
                dynamic: false,
            },
            prof.clone(),
        )),
        Box::new(Klotski::new(prof.clone())),
        Box::new(KtEnhanced::new(prof.clone())),
        Box::new(Monde::new(prof)),
    ];
    for p in policies.iter_mut() {
        let r = simulate(p.as_mut(), &c, &w).unwrap();
        no_overlap(&r);
        assert!(r.peak_expert_bytes <= r.expert_budget_bytes, "{}", r.policy);
        assert!(r.decode.tokens_per_s > 0.0, "{}", r.policy);
    }
}

/// Localizes expert 0 of layer 0 on DIMM `home`, runs it on NDP unit `unit`, and asks
/// for `moves` at the first step.
struct OnDimm {
    home: Option<u16>,
    unit: u16,
    moves: Vec<Migration>,
}

impl Policy for OnDimm {
    fn name(&self) -> String {
        "on-dimm".into()
    }
    fn initial_layout(&mut self, _: &CostModel) -> Option<Vec<(usize, u32, Layout)>> {
        Some(
            self.home
                .map(|d| (0, 0, Layout::Localized(d)))
                .into_iter()
                .collect(),
        )
    }
    fn decide(&mut self, view: &LayerView, cost: &CostModel) -> Decision {
        let unit = self.unit;
        let layer = view.layer;
        Decision {
            tasks: strata_policy::tasks_by_expert(view, cost.model.n_experts, |e, _| {
                if layer == 0 && e == 0 {
                    Device::Ndp(unit)
                } else {
                    Device::Cpu
                }
            }),
            migrations: std::mem::take(&mut self.moves),
            ..Decision::default()
        }
    }
}

#[test]
fn ndp_experts_need_their_weights_on_the_dimm() {
    let (c, w) = setup();
    let ok = OnDimm {
        home: Some(3),
        unit: 3,
        moves: Vec::new(),
    };
    let r = simulate(&mut { ok }, &c, &w).unwrap();
    no_overlap(&r);
    // The CPU's striped reads are charged to every DIMM, after its NDP work.
    assert!(
        r.ops
            .iter()
            .any(|o| o.lane == Lane::Ndp(3) && o.name == "host reads")
    );
    assert!(
        r.ops
            .iter()
            .any(|o| o.lane == Lane::Ndp(9) && o.name == "host reads")
    );
    let wrong = OnDimm {
        home: Some(3),
        unit: 4,
        moves: Vec::new(),
    };
    let e = simulate(&mut { wrong }, &c, &w).unwrap_err().to_string();
    assert!(
        e.contains("NDP unit 4") && e.contains("Localized(3)"),
        "{e}"
    );
    let striped = OnDimm {
        home: None,
        unit: 0,
        moves: Vec::new(),
    };
    let e = simulate(&mut { striped }, &c, &w).unwrap_err().to_string();
    assert!(e.contains("Striped"), "{e}");
    let bad = OnDimm {
        home: Some(16),
        unit: 0,
        moves: Vec::new(),
    };
    let e = simulate(&mut { bad }, &c, &w).unwrap_err().to_string();
    assert!(e.contains("16 DIMMs"), "{e}");
}

#[test]
fn migrations_run_on_the_link_and_land_before_use() {
    let (c, w) = setup();
    // Expert 0 starts striped and runs on unit 5 only after its move there lands.
    let mv = OnDimm {
        home: None,
        unit: 5,
        moves: vec![Migration {
            layer: 0,
            expert: 0,
            to: Layout::Localized(5),
        }],
    };
    let r = simulate(&mut { mv }, &c, &w).unwrap();
    no_overlap(&r);
    let link: Vec<_> = r.ops.iter().filter(|o| o.lane == Lane::Link).collect();
    assert_eq!(link.len(), 1);
    let first_ndp = r
        .ops
        .iter()
        .filter(|o| o.lane == Lane::Ndp(5) && o.name.starts_with("expert"))
        .map(|o| o.start)
        .fold(f64::INFINITY, f64::min);
    assert!(first_ndp >= link[0].end - 1e-12);
    // Without a stated layout, migrations are an error.
    struct Loose;
    impl Policy for Loose {
        fn name(&self) -> String {
            "loose".into()
        }
        fn decide(&mut self, view: &LayerView, cost: &CostModel) -> Decision {
            Decision {
                tasks: strata_policy::tasks_by_expert(view, cost.model.n_experts, |_, _| {
                    Device::Cpu
                }),
                migrations: vec![Migration {
                    layer: 0,
                    expert: 0,
                    to: Layout::Striped,
                }],
                ..Decision::default()
            }
        }
    }
    let e = simulate(&mut Loose, &c, &w).unwrap_err().to_string();
    assert!(e.contains("initial layout"), "{e}");
}

#[test]
fn trimoe_reproduction_rows_are_sane() {
    // Three decode steps instead of eight: the same rows, a third of the time.
    let r = reproduce::trimoe::trimoe_steps(3).unwrap();
    assert_eq!(r.reproduce, "trimoe");
    let json = serde_json::to_value(&r).unwrap();
    for key in [
        "policy", "model", "hardware", "batch", "metric", "value", "paper",
    ] {
        assert!(json["rows"][0].get(key).is_some(), "{key}");
    }
    for row in &r.rows {
        assert!(row.value.is_finite() && row.value >= 0.0, "{row:?}");
        assert_eq!(row.hardware, "trimoe-h100");
    }
    let speedups: Vec<_> = r
        .rows
        .iter()
        .filter(|x| x.metric == "moe_speedup_over_best_baseline")
        .collect();
    // Three models at batch 512 and three smaller batches on Qwen3.
    assert_eq!(speedups.len(), 6);
    let get = |policy: &str, model: &str, metric: &str| {
        r.rows
            .iter()
            .find(|x| {
                x.policy == policy && x.model == model && x.metric == metric && x.batch == 512
            })
            .map(|x| x.value)
    };
    for m in ["deepseek-v2", "qwen3-235b-a22b", "glm-4.5-air"] {
        assert!(r.rows.iter().any(|x| x.model == m && x.policy == "monde"));
        // The EMA is scored on every model, well above chance (30% of experts are hot).
        let acc = get("trimoe", m, "ema_hot_expert_accuracy").unwrap();
        assert!(acc > 0.5 && acc <= 1.0, "{m}: {acc}");
        // A device cannot run at more than its peak: FLOP utilisation never exceeds the
        // busy fraction, and TriMoE's NDP units, memory-bound, come close to it.
        for p in ["klotski", "kt-enhanced", "monde", "trimoe"] {
            for d in ["gpu", "cpu", "ndp"] {
                let busy = get(p, m, &format!("moe_{d}_busy_utilisation")).unwrap();
                let flop = get(p, m, &format!("moe_{d}_flop_utilisation")).unwrap();
                assert!(flop <= busy + 1e-9, "{p} {m} {d}: {flop} > {busy}");
            }
        }
        let ndp = get("trimoe", m, "moe_ndp_flop_utilisation").unwrap();
        assert!(ndp > 0.1, "{m}: {ndp}");
        // Only the predicting policy has an accuracy row.
        assert!(get("kt-enhanced", m, "ema_hot_expert_accuracy").is_none());
    }
}

/// The tiny model's shape: its preset (`strata-exec` checks that the shipped model's config
/// gives the same shape).
fn tiny_shape() -> ModelShape {
    ModelShape::load("strata-tiny-moe").unwrap()
}

#[test]
fn ema_hot_expert_accuracy_on_a_recorded_trace() {
    // 32 ShareGPT prompts decoded 16 steps by the real engine on strata-tiny-moe
    // (`strata trace`), batched into one decode batch of 32; weights rounded to 3 digits.
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/tiny-moe-decode.trace"
    );
    let (_, w) = strata_sim::trace::read_file(std::path::Path::new(path)).unwrap();
    assert_eq!((w.n_experts, w.top_k, w.steps.len()), (32, 4, 16));
    let acc = reproduce::trimoe::ema_hot_accuracy(tiny_shape(), &w)
        .unwrap()
        .unwrap();
    // The same score computed by hand: eq. 8 updated with each step's loads, scored
    // against the next step's.
    let mut ema = EmaPredictor::new(EmaPredictor::ALPHA, 6, 32);
    let (mut hit, mut of) = (0, 0);
    for (i, s) in w.steps.iter().enumerate() {
        for (l, r) in s.layers.iter().enumerate() {
            let mut loads = vec![0u32; 32];
            for &e in &r.ids {
                loads[e as usize] += 1;
            }
            if i > 0 {
                let (h, o) = hot_overlap(ema.predicted(l), &loads);
                hit += h;
                of += o;
            }
            ema.update(l, &loads);
        }
    }
    assert_eq!(of, 15 * 6 * 10, "ten hot experts of 32 per scored layer");
    assert!(
        (acc - hit as f64 / of as f64).abs() < 1e-12,
        "{acc} vs {hit}/{of}"
    );
    // Measured 0.80 when written; a hot set drawn at random would score ~0.31.
    assert!(acc > 0.7, "{acc}");
}

#[test]
fn batch_decode_merges_requests_step_by_step() {
    let layer = |e: u32| LayerRouting {
        ids: vec![e, e + 1],
        weights: vec![0.5, 0.5],
        hidden: None,
        candidates: None,
    };
    let step = |request: usize, phase: Phase, i: u32| Step {
        request,
        phase,
        tokens: 1,
        context: 10 + i as usize,
        layers: vec![layer(10 * request as u32 + i)],
    };
    // Request 0 decodes 2 steps, request 1 three, request 2 one; each after a prefill.
    let mut steps = Vec::new();
    for (r, n) in [(0usize, 2u32), (1, 3), (2, 1)] {
        steps.push(step(r, Phase::Prefill, 0));
        steps.extend((0..n).map(|i| step(r, Phase::Decode, i)));
    }
    let w = Workload {
        n_experts: 32,
        top_k: 2,
        hidden_dim: 0,
        steps,
    };
    let b = reproduce::trimoe::batch_decode(&w, 2);
    let got: Vec<(usize, usize, Vec<u32>)> = b
        .steps
        .iter()
        .map(|s| (s.request, s.tokens, s.layers[0].ids.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            (0, 2, vec![0, 1, 10, 11]),
            (0, 2, vec![1, 2, 11, 12]),
            (0, 1, vec![12, 13]),
            (1, 1, vec![20, 21]),
        ]
    );
    assert!(b.steps.iter().all(|s| s.phase == Phase::Decode));
}

/// Records the context each view states.
struct Contexts(Vec<Option<usize>>);

impl Policy for Contexts {
    fn name(&self) -> String {
        "contexts".into()
    }
    fn decide(&mut self, view: &LayerView, cost: &CostModel) -> Decision {
        self.0.push(view.context);
        Decision {
            tasks: strata_policy::tasks_by_expert(view, cost.model.n_experts, |_, _| Device::Cpu),
            ..Decision::default()
        }
    }
}

#[test]
fn views_state_the_attention_context() {
    let (c, w) = setup();
    let mut p = Contexts(Vec::new());
    simulate(&mut p, &c, &w).unwrap();
    let n_moe = c.model.moe_layers();
    let want: Vec<Option<usize>> = w
        .steps
        .iter()
        .flat_map(|s| std::iter::repeat_n(Some(s.context + s.tokens / 2), n_moe))
        .collect();
    assert_eq!(p.0, want);
}
