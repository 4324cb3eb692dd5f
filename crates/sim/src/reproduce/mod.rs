//! The seeds' comparisons, simulated: each setup's hardware, model and workload, every
//! policy's result, and the paper's figure beside it.
//!
//! - `ktransformers` (seed 003): DeepSeek-V3 BF16 on 2x Xeon 8452Y + A100-40G, batch 1,
//!   32-token prompts, decode with and without expert deferral (3 deferred experts, the
//!   paper's choice for BF16); and the Int4 model on the RTX 4080 with 6 deferred.
//! - `smoe` (seed 004): DeepSeek-V3 and Qwen3-235B-A22B at ~4.25 bits (IQ4_XS) on an RTX
//!   4090 + 10 EPYC cores: decode for KTransformers, HybriMoE (prefetch 1), SMoE (fixed-N
//!   2 for DeepSeek, 3 for Qwen3), SMoE-Flex (3), GPU-only LRU and Fiddler; prefill at
//!   400 to 4000 tokens for KTransformers, HybriMoE and SMoE.
//! - `trimoe` (seed 000, [`trimoe`]): DeepSeek-V2, Qwen3-235B-A22B and GLM-4.5-Air BF16
//!   on an H100 + Xeon 8470 + 16 NDP DIMMs at batch 512: TriMoE against Klotski,
//!   Enhanced KTransformers and MoNDE, its ablation, sensitivity and small batches.
//!
//! A key design decision: every policy of a setup runs on the same workload and the same
//! cost model; only the policy differs, and no policy has a tuning knob the paper does not
//! name. Paper figures are the means of seed 004 table I over its six datasets, and the
//! figures quoted in seed 003's text.

pub mod cox;
pub mod trimoe;

use serde::Serialize;
use strata_policy::policies::{
    Fiddler, GpuLru, HybriCosts, HybriMoE, KTransformers, Smoe, SmoeEviction,
};
use strata_policy::predictor::LinearPredictor;
use strata_policy::{CostModel, Hardware, ModelShape, Policy};

use crate::workload::{SyntheticParams, Workload, synthetic};
use crate::{Report, Result, simulate};

/// One row of a reproduction.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Policy name.
    pub policy: String,
    /// Model preset.
    pub model: String,
    /// Hardware preset.
    pub hardware: String,
    /// Sequences per step.
    pub batch: usize,
    /// Prompt length.
    pub prompt_tokens: usize,
    /// What is measured.
    pub metric: String,
    /// Simulated value.
    pub value: f64,
    /// The paper's value, where it reports one.
    pub paper: Option<f64>,
}

/// A reproduction's result.
#[derive(Debug, Clone, Serialize)]
pub struct Reproduction {
    /// Which seed.
    pub reproduce: String,
    /// One row per policy, setup and metric.
    pub rows: Vec<Row>,
}

/// Names accepted by [`run`].
pub const NAMES: [&str; 4] = ["ktransformers", "smoe", "cox", "trimoe"];

/// How far a simulated value may be from the paper's, relative to the paper's, and still
/// count as reproduced. The simulator prices work at roofline with cited constants and no
/// correction factors, so it aims at the papers' directions and rough sizes, not their
/// exact figures; docs/benchmarks.md explains each row that falls outside.
pub const TOLERANCE: f64 = 0.25;

/// `simulated` relative to `paper` (`0.1` = 10% above), and whether it is within
/// [`TOLERANCE`]; `None` where the paper reports no value.
pub fn agreement(simulated: f64, paper: Option<f64>) -> Option<(f64, bool)> {
    let paper = paper?;
    let off = (simulated - paper) / paper.abs().max(f64::MIN_POSITIVE);
    Some((off, off.abs() <= TOLERANCE))
}

/// Runs a reproduction by name.
pub fn run(name: &str) -> Result<Reproduction> {
    match name {
        "ktransformers" => ktransformers(),
        "smoe" => smoe(),
        "cox" => cox::cox_moe(),
        "trimoe" => trimoe::trimoe(),
        other => Err(crate::Error::Mismatch(format!(
            "unknown reproduction {other:?}, expected one of {NAMES:?}"
        ))),
    }
}

fn cost(hw: &str, model: &str, bits: f64) -> Result<CostModel> {
    Ok(CostModel::new(
        Hardware::load(hw)?,
        ModelShape::load(model)?,
        bits,
        bits,
    )?)
}

fn params(
    c: &CostModel,
    prompt: usize,
    decode: usize,
    requests: usize,
    seed: u64,
) -> SyntheticParams {
    let m = &c.model;
    SyntheticParams {
        requests,
        prompt_tokens: prompt,
        decode_tokens: decode,
        seed,
        ..SyntheticParams::calibrated(m.moe_layers(), m.n_experts, m.top_k)
    }
}

struct Setup<'a> {
    hw: &'a str,
    model: &'a str,
    prompt: usize,
}

impl Setup<'_> {
    fn row(&self, policy: &str, metric: &str, value: f64, paper: Option<f64>) -> Row {
        Row {
            policy: policy.into(),
            model: self.model.into(),
            hardware: self.hw.into(),
            batch: 1,
            prompt_tokens: self.prompt,
            metric: metric.into(),
            value,
            paper,
        }
    }
}

/// Seed 003: expert deferral on DeepSeek-V3.
pub fn ktransformers() -> Result<Reproduction> {
    let mut rows = Vec::new();
    // (hardware, bits, deferred experts): BF16 on the A100 defers 3, Int4 on the 4080 6.
    for (hw, bits, deferred) in [("ktrans-a100", 16.0, 3), ("ktrans-4080", 4.5, 6)] {
        let c = cost(hw, "deepseek-v3", bits)?;
        let s = Setup {
            hw,
            model: "deepseek-v3",
            prompt: 32,
        };
        let w = synthetic(&SyntheticParams {
            hidden_dim: 0,
            ..params(&c, 32, 32, 1, 7)
        });
        let base = simulate(&mut KTransformers::new(0), &c, &w)?;
        let def = simulate(&mut KTransformers::new(deferred), &c, &w)?;
        let a100 = hw == "ktrans-a100";
        for (r, paper_tps, paper_cpu, paper_gpu) in [
            (
                &base,
                a100.then_some(5.87),
                a100.then_some(0.74),
                a100.then_some(0.28),
            ),
            (&def, None, a100.then_some(1.0), a100.then_some(0.37)),
        ] {
            rows.push(s.row(
                &r.policy,
                "decode_tokens_per_s",
                r.decode.tokens_per_s,
                paper_tps,
            ));
            rows.push(s.row(
                &r.policy,
                "decode_cpu_utilisation",
                r.decode.util_cpu,
                paper_cpu,
            ));
            rows.push(s.row(
                &r.policy,
                "decode_gpu_utilisation",
                r.decode.util_gpu,
                paper_gpu,
            ));
        }
        rows.push(s.row(
            &def.policy,
            "decode_speedup_over_ktransformers",
            def.decode.tokens_per_s / base.decode.tokens_per_s,
            Some(if a100 { 1.33 } else { 1.45 }),
        ));
    }
    Ok(Reproduction {
        reproduce: "ktransformers".into(),
        rows,
    })
}

/// Trains one predictor per MoE layer on `train`; returns them with their accuracies.
pub fn train_predictors(
    train: &Workload,
    top_k: usize,
) -> Result<(Vec<Option<LinearPredictor>>, Vec<f64>)> {
    let mut preds = Vec::new();
    let mut acc = Vec::new();
    for samples in train.predictor_samples() {
        if samples.is_empty() {
            preds.push(None);
            acc.push(0.0);
            continue;
        }
        let refs: Vec<(&[f32], &[u32])> = samples
            .iter()
            .map(|(h, y)| (h.as_slice(), y.as_slice()))
            .collect();
        let p = LinearPredictor::train(&refs, train.hidden_dim, train.n_experts, 1.0)?;
        acc.push(p.accuracy(&refs, top_k));
        preds.push(Some(p));
    }
    Ok((preds, acc))
}

/// Seed 004: SMoE against KTransformers and HybriMoE.
pub fn smoe() -> Result<Reproduction> {
    let mut rows = Vec::new();
    // Table I means over the six datasets: KTrans, HybriMoE, SMoE, SMoE-Flex.
    let decode_paper = [
        ("deepseek-v3", 2usize, [3.163, 2.945, 3.461, 3.437]),
        ("qwen3-235b-a22b", 3, [2.916, 2.958, 3.160, 3.113]),
    ];
    for (model, n_prefetch, paper) in decode_paper {
        let c = cost("smoe-4090", model, 4.25)?;
        let s = Setup {
            hw: "smoe-4090",
            model,
            prompt: 64,
        };
        let slots = c.cache_slots_per_layer();
        let k = c.model.top_k;
        let w = synthetic(&params(&c, 64, 64, 2, 11));
        // The predictor's training prompts are separate from the measured ones (seed 004
        // trains on 20 held-out samples).
        let train = synthetic(&params(&c, 16, 64, 4, 99));
        let (preds, acc) = train_predictors(&train, k)?;
        let mut policies: Vec<(Box<dyn Policy>, Option<f64>)> = vec![
            (Box::new(KTransformers::new(0)), Some(paper[0])),
            (
                Box::new(HybriMoE::with_costs(HybriCosts::Released, slots, 1)),
                Some(paper[1]),
            ),
            (Box::new(HybriMoE::new(slots, 1)), None),
            (
                Box::new(Smoe::new(
                    slots,
                    n_prefetch,
                    SmoeEviction::FixedN,
                    preds.clone(),
                )),
                Some(paper[2]),
            ),
            (
                Box::new(Smoe::flex(slots, 3, SmoeEviction::FixedN, preds, &acc)),
                Some(paper[3]),
            ),
            (Box::new(GpuLru::new(slots)), None),
            (Box::new(Fiddler::new(train.profile())), None),
        ];
        let mut base = None;
        for (p, paper_tps) in policies.iter_mut() {
            let r: Report = simulate(p.as_mut(), &c, &w)?;
            let tps = r.decode.tokens_per_s;
            let b = *base.get_or_insert(tps);
            rows.push(s.row(&r.policy, "decode_tokens_per_s", tps, *paper_tps));
            rows.push(s.row(
                &r.policy,
                "decode_speedup_over_ktransformers",
                tps / b,
                paper_tps.map(|x| x / paper[0]),
            ));
            rows.push(s.row(&r.policy, "decode_hit_rate", r.decode.hit_rate, None));
            if let Some(a) = r.predictor_accuracy {
                rows.push(s.row(&r.policy, "predictor_accuracy", a, None));
            }
        }
        // Prefill at growing prompt lengths (seed 004 figure 10, DeepSeek-V3: 2.64x at 400
        // and 8.68x at 4K over KTransformers).
        for prompt in [400usize, 1000, 2000, 4000] {
            let s = Setup {
                hw: "smoe-4090",
                model,
                prompt,
            };
            let w = synthetic(&SyntheticParams {
                hidden_dim: 0,
                ..params(&c, prompt, 0, 1, 13)
            });
            let paper_speedup = match (model, prompt) {
                ("deepseek-v3", 400) => Some(2.64),
                ("deepseek-v3", 4000) => Some(8.68),
                _ => None,
            };
            let mut base = None;
            let mut prefill_policies: Vec<(Box<dyn Policy>, Option<f64>)> = vec![
                (Box::new(KTransformers::new(0)), None),
                (
                    Box::new(HybriMoE::with_costs(HybriCosts::Released, slots, 1)),
                    None,
                ),
                (Box::new(HybriMoE::new(slots, 1)), None),
                (
                    Box::new(Smoe::new(
                        slots,
                        n_prefetch,
                        SmoeEviction::FixedN,
                        vec![None; c.model.moe_layers()],
                    )),
                    paper_speedup,
                ),
            ];
            for (p, paper_x) in prefill_policies.iter_mut() {
                let r = simulate(p.as_mut(), &c, &w)?;
                let tps = r.prefill.tokens_per_s;
                let b = *base.get_or_insert(tps);
                rows.push(s.row(&r.policy, "prefill_tokens_per_s", tps, None));
                rows.push(s.row(
                    &r.policy,
                    "prefill_speedup_over_ktransformers",
                    tps / b,
                    *paper_x,
                ));
            }
        }
    }
    Ok(Reproduction {
        reproduce: "smoe".into(),
        rows,
    })
}
