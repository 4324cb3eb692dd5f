//! Seed 001 (CoX-MoE), simulated: generation throughput at batch 1024 against
//! MoE-Lightning and FlexGen for Mixtral-8x7B, DeepSeek-V2-Lite and Qwen3-30B-A3B (BF16)
//! on the paper's three systems (Xeon 8452Y with an RTX 6000 Ada, an A100 80 GB or an
//! H100), the ablation of its table 3 (Qwen3 on the RTX 6000 Ada), and the throughput
//! gain of stratified over random pinning (its figure 8(c)).
//!
//! The paper's figure 7 names two prompt and two output lengths without giving them in
//! the text we have; this reproduction uses prompts of 256 and 512 tokens (its section 3
//! profiles 512) and 32 and 128 generated tokens, and reports each setup's speedups with
//! the paper's range (1.7-2.4x over MoE-Lightning, 3.4-7.1x over FlexGen) as the
//! `paper` value of the minimum and maximum rows. The ablation's workload is not stated
//! either: 512 + 128 tokens here, at the table's batch sizes (256, 256, 512, 512).
//!
//! Expert popularity is the synthetic family of [`crate::workload::SyntheticParams`]
//! (Zipf, skew 0.2 at the first layer to 1.2 at the last); CoX-MoE pins by that
//! popularity (what expert-aware stratification estimates; `strata stratify` measures
//! how close the estimate gets on a real model), the baselines pin a fixed share of every
//! layer, as FlexGen's per-tensor percentages do. CoX-MoE's pins are spread evenly over
//! the layers, each layer's most popular first
//! ([`strata_policy::stratify::pin_order_balanced`]): pinning the globally most popular
//! experts maximises the hit ratio but leaves the flat early layers with many unpinned
//! experts, and with layers running one after another the slowest layer sets the pace
//! (on DeepSeek-V2-Lite / RTX 6000 Ada the global order was 5% slower than random
//! pinning, the balanced one 6% faster).
//!
//! Where the simulation departs from the paper, and why (`strata simulate --reproduce
//! cox`; nothing below was tuned away):
//! - Speedup over MoE-Lightning 0.98-3.16x (paper 1.7-2.4x). Highest for Mixtral on the
//!   RTX 6000 Ada, as in the paper, but near 1 for Mixtral on the H100 and Qwen3 on the
//!   A100: at batch 1024 with 512-token prompts their KV cache (86 GB and 64 GB) leaves
//!   attention on the CPU in both systems, and decode is then bound by the host's DRAM
//!   bandwidth reading it; on 80 GB cards MoE-Lightning also keeps most experts resident,
//!   so there is little paging for coalescing to remove.
//! - The CPU's matrix throughput is the 21.3 TFLOPS per socket KTransformers measured
//!   (seed 003), not the ~144 TFLOPS seed 001 quotes; the `@amx144` rows rerun part of
//!   the grid with the quoted figure (Qwen3 on the RTX 6000 Ada: 1.58x -> 1.63x).
//! - Speedup over FlexGen equals the one over MoE-Lightning wherever both page the same
//!   expert weights every layer and step: the PCIe link is then the bottleneck and
//!   MoE-Lightning's overlap of CPU attention with GPU work has nothing left to hide. The
//!   paper's 3.4-7.1x implies FlexGen overheads its text does not describe; the model has
//!   no term for them.
//! - Ablation step (a) gives 3.6x (paper 1.51x): the baseline here streams every
//!   non-pinned expert to the GPU each decode step (micro-batched, GPU-only experts, as
//!   the prior systems do), which coalesced CPU co-execution replaces with ~40 us CPU
//!   tasks; the paper does not say what its baseline keeps resident. Steps (b) 1.32x and
//!   (c) 1.03x are close to the paper's 1.26x and 1.05x.
//! - Stratified over random pinning 1.00-1.05x in throughput at batch 1024, up to ~1.13x
//!   at batch 64 (paper 1.47-1.50x at small VRAM budgets): at batch 1024 every expert of
//!   every layer is active in each step and decode experts are memory-bound, so the
//!   number of unpinned experts per layer matters, not which ones: an unpinned expert
//!   runs on the CPU at the host's memory bandwidth (~80 us for a DeepSeek-V2-Lite
//!   expert), overlapped with the GPU's pinned ones. The hit-ratio gain itself is large
//!   (`strata stratify`).
//!
//! A key design decision: no figure is fitted. The simulated throughputs are far above
//! the paper's absolute numbers (table 3 reports 16.8-34.1 tokens/s for Qwen3, which
//! the roofline of the stated hardware exceeds by orders of magnitude: the paper's
//! implementation, IPEX with Python-level scheduling, is not modelled), so only the
//! ratios are compared.

use strata_policy::throughput::CoxOptions;
use strata_policy::{CostModel, Hardware, ModelShape};

use super::{Reproduction, Row};
use crate::Result;
use crate::throughput::{Setup, System, ThroughputReport, run, zipf_popularity};

/// The paper's systems (table 2).
pub const HARDWARE: [&str; 3] = ["cox-6000ada", "cox-a100", "cox-h100"];
/// The paper's models.
pub const MODELS: [&str; 3] = ["mixtral-8x7b", "deepseek-v2-lite", "qwen3-30b-a3b"];
/// Fixed VRAM for the CUDA context and library workspace (assumed: ~1 GB is what a CUDA
/// 12 context with cuBLAS workspaces takes).
const CONTEXT_BYTES: f64 = 1e9;

fn setup(c: &CostModel, batch: usize, prompt: usize, generate: usize, pin: Pin) -> Setup {
    let m = &c.model;
    let popularity = zipf_popularity(m.moe_layers(), m.n_experts, 0.2, 1.2, 1);
    let order = match pin {
        Pin::Popular => {
            let counts: Vec<Vec<u64>> = popularity
                .iter()
                .map(|p| p.iter().map(|x| (x * 1e12) as u64).collect())
                .collect();
            strata_policy::stratify::pin_order_balanced(&counts)
        }
        Pin::Random => {
            strata_policy::stratify::random_pins(m.moe_layers(), m.n_experts, usize::MAX, 5)
        }
    };
    Setup {
        batch,
        prompt,
        generate,
        popularity,
        order,
        context_bytes: CONTEXT_BYTES,
        decode_samples: 4,
    }
}

#[derive(Debug, Clone, Copy)]
enum Pin {
    Popular,
    Random,
}

fn cox() -> System {
    System::Cox {
        opts: CoxOptions::full(CONTEXT_BYTES),
        overlap: true,
    }
}

struct Rows<'a> {
    rows: &'a mut Vec<Row>,
}

impl Rows<'_> {
    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        policy: &str,
        model: &str,
        hw: &str,
        s: &Setup,
        metric: &str,
        value: f64,
        paper: Option<f64>,
    ) {
        self.rows.push(Row {
            policy: policy.into(),
            model: model.into(),
            hardware: hw.into(),
            batch: s.batch,
            prompt_tokens: s.prompt,
            metric: format!("{metric}_out{}", s.generate),
            value,
            paper,
        });
    }

    fn report(&mut self, r: &ThroughputReport, model: &str, hw: &str, s: &Setup) {
        self.push(
            &r.system,
            model,
            hw,
            s,
            "tokens_per_s",
            r.tokens_per_s,
            None,
        );
        self.push(&r.system, model, hw, s, "gpu_utilisation", r.util_gpu, None);
        self.push(&r.system, model, hw, s, "cpu_utilisation", r.util_cpu, None);
        self.push(
            &r.system,
            model,
            hw,
            s,
            "pcie_utilisation",
            r.util_pcie,
            None,
        );
    }
}

/// Runs the CoX-MoE reproduction.
pub fn cox_moe() -> Result<Reproduction> {
    let mut rows = Vec::new();
    let mut out = Rows { rows: &mut rows };
    let (mut lo_ml, mut hi_ml, mut lo_fg, mut hi_fg) = (f64::MAX, 0.0f64, f64::MAX, 0.0f64);
    for model in MODELS {
        for hw in HARDWARE {
            let c = CostModel::new(Hardware::load(hw)?, ModelShape::load(model)?, 16.0, 16.0)?;
            for prompt in [256, 512] {
                for generate in [32, 128] {
                    let s = setup(&c, 1024, prompt, generate, Pin::Popular);
                    let x = run(&c, &cox(), &s)?;
                    let ml = run(&c, &System::MoeLightning, &s)?;
                    let fg = run(&c, &System::FlexGen, &s)?;
                    for r in [&x, &ml, &fg] {
                        out.report(r, model, hw, &s);
                    }
                    let (a, b) = (
                        x.tokens_per_s / ml.tokens_per_s,
                        x.tokens_per_s / fg.tokens_per_s,
                    );
                    out.push(
                        "cox-moe",
                        model,
                        hw,
                        &s,
                        "speedup_over_moe_lightning",
                        a,
                        None,
                    );
                    out.push("cox-moe", model, hw, &s, "speedup_over_flexgen", b, None);
                    (lo_ml, hi_ml) = (lo_ml.min(a), hi_ml.max(a));
                    (lo_fg, hi_fg) = (lo_fg.min(b), hi_fg.max(b));
                }
            }
        }
    }
    let all = |metric: &str, value: f64, paper: f64| Row {
        policy: "cox-moe".into(),
        model: "all".into(),
        hardware: "all".into(),
        batch: 1024,
        prompt_tokens: 0,
        metric: metric.into(),
        value,
        paper: Some(paper),
    };
    rows.push(all("speedup_over_moe_lightning_min", lo_ml, 1.7));
    rows.push(all("speedup_over_moe_lightning_max", hi_ml, 2.4));
    rows.push(all("speedup_over_flexgen_min", lo_fg, 3.4));
    rows.push(all("speedup_over_flexgen_max", hi_fg, 7.1));
    ablation(&mut rows)?;
    stratified_gain(&mut rows)?;
    amx_sensitivity(&mut rows)?;
    Ok(Reproduction {
        reproduce: "cox".into(),
        rows,
    })
}

/// Table 3: Qwen3 on system I. (a) coalesced experts with CPU co-execution, (b)
/// per-operation placement with the micro-batch search (which frees the VRAM for batch
/// 512), (c) the prefill micro-batch pipeline of figure 5(a). The baseline micro-batches
/// the experts on the GPU, streams every non-pinned one, and keeps all non-MoE work on
/// the GPU.
fn ablation(rows: &mut Vec<Row>) -> Result<()> {
    let (model, hw) = ("qwen3-30b-a3b", "cox-6000ada");
    let c = CostModel::new(Hardware::load(hw)?, ModelShape::load(model)?, 16.0, 16.0)?;
    let full = CoxOptions::full(CONTEXT_BYTES);
    let base = CoxOptions {
        coalesce: false,
        co_execute: false,
        offload_ops: false,
        ..full.clone()
    };
    let a = CoxOptions {
        coalesce: true,
        co_execute: true,
        ..base.clone()
    };
    let variants = [
        ("baseline", base, false, 256, 16.8, None),
        ("+a", a.clone(), false, 256, 25.5, Some(1.51)),
        ("+a+b", full.clone(), false, 512, 32.3, Some(1.26)),
        ("+a+b+c", full, true, 512, 34.1, Some(1.05)),
    ];
    let mut out = Rows { rows };
    let mut prev: Option<f64> = None;
    for (name, opts, overlap, batch, paper_tps, paper_x) in variants {
        let s = setup(&c, batch, 512, 128, Pin::Popular);
        let r = run(&c, &System::Cox { opts, overlap }, &s)?;
        let policy = format!("cox-moe{name}");
        out.push(
            &policy,
            model,
            hw,
            &s,
            "ablation_tokens_per_s",
            r.tokens_per_s,
            Some(paper_tps),
        );
        if let Some(p) = prev {
            out.push(
                &policy,
                model,
                hw,
                &s,
                "ablation_improvement",
                r.tokens_per_s / p,
                paper_x,
            );
        }
        prev = Some(r.tokens_per_s);
    }
    Ok(())
}

/// Figure 8(c): stratified (popularity-ordered) against random pinning, Qwen3 and
/// DeepSeek on system I at batch 64 and 1024 (paper: 1.47-1.50x).
fn stratified_gain(rows: &mut Vec<Row>) -> Result<()> {
    let mut out = Rows { rows };
    for model in ["deepseek-v2-lite", "qwen3-30b-a3b"] {
        let hw = "cox-6000ada";
        let c = CostModel::new(Hardware::load(hw)?, ModelShape::load(model)?, 16.0, 16.0)?;
        for batch in [64, 1024] {
            let eas = setup(&c, batch, 512, 128, Pin::Popular);
            let rnd = setup(&c, batch, 512, 128, Pin::Random);
            let x = run(&c, &cox(), &eas)?.tokens_per_s;
            let y = run(&c, &cox(), &rnd)?.tokens_per_s;
            let metric = "stratified_over_random_pinning";
            out.push("cox-moe", model, hw, &eas, metric, x / y, Some(1.5));
        }
    }
    Ok(())
}

/// What-if: the CPU's matrix throughput at the ~144 TFLOPS per socket that seed 001
/// (section 2.2) quotes for AMX instead of the 21.3 TFLOPS KTransformers measured (the
/// presets' value). Not a fit: it shows how much of the gap to the paper's speedups the
/// CPU constant alone explains. Hardware is reported as `<preset>@amx144`.
fn amx_sensitivity(rows: &mut Vec<Row>) -> Result<()> {
    let mut out = Rows { rows };
    for model in MODELS {
        for hw in ["cox-6000ada", "cox-h100"] {
            let mut h = Hardware::load(hw)?;
            h.cpu.matmul_flops = 144e12;
            let c = CostModel::new(h, ModelShape::load(model)?, 16.0, 16.0)?;
            let s = setup(&c, 1024, 512, 128, Pin::Popular);
            let x = run(&c, &cox(), &s)?.tokens_per_s;
            let ml = run(&c, &System::MoeLightning, &s)?.tokens_per_s;
            let name = format!("{hw}@amx144");
            out.push(
                "cox-moe",
                model,
                &name,
                &s,
                "speedup_over_moe_lightning",
                x / ml,
                None,
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reproduction_shows_the_papers_directions() {
        let r = cox_moe().unwrap();
        assert_eq!(r.reproduce, "cox");
        let get = |policy: &str, metric: &str| -> Vec<f64> {
            r.rows
                .iter()
                .filter(|x| {
                    x.policy == policy
                        && x.metric.starts_with(metric)
                        && HARDWARE.contains(&x.hardware.as_str())
                })
                .map(|x| x.value)
                .collect()
        };
        // 3 models x 3 machines x 2 prompts x 2 outputs.
        let ml = get("cox-moe", "speedup_over_moe_lightning_out");
        let fg = get("cox-moe", "speedup_over_flexgen_out");
        assert_eq!((ml.len(), fg.len()), (36, 36));
        let mut sorted = ml.clone();
        sorted.sort_by(f64::total_cmp);
        // CoX-MoE is ahead in the typical setup and never far behind.
        assert!(sorted[18] > 1.2, "median {}", sorted[18]);
        assert!(sorted[0] > 0.9, "min {}", sorted[0]);
        // FlexGen's serial micro-batches never beat MoE-Lightning's pipeline.
        for (a, b) in ml.iter().zip(&fg) {
            assert!(b >= &(a - 1e-9));
        }
        for u in get("moe-lightning", "gpu_utilisation")
            .into_iter()
            .chain(get("cox-moe", "cpu_utilisation"))
        {
            assert!((0.0..=1.0 + 1e-9).contains(&u));
        }
        // Table 3: every technique adds throughput.
        let abl: Vec<f64> = r
            .rows
            .iter()
            .filter(|x| x.metric.starts_with("ablation_improvement"))
            .map(|x| x.value)
            .collect();
        assert_eq!(abl.len(), 3);
        assert!(abl.iter().all(|&x| x >= 1.0), "{abl:?}");
        // Every row has the latency reproductions' shape.
        let v = serde_json::to_value(&r).unwrap();
        let row = &v["rows"][0];
        for k in [
            "policy",
            "model",
            "hardware",
            "batch",
            "prompt_tokens",
            "metric",
            "value",
            "paper",
        ] {
            assert!(row.get(k).is_some(), "{k}");
        }
    }
}
