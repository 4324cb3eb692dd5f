//! `strata simulate`: one placement policy on simulated hardware, or a seed's reproduction.
//!
//! Raw flags are parsed by clap, then validated into a cost model, a policy and a workload
//! (ripgrep's low/high args split). Policies are named `NAME[:N]`, `N` being the deferred
//! experts of `ktransformers` or the prefetch count of `hybrimoe*` and `smoe*`.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;
use strata_policy::policies::{
    Fiddler, GpuLru, HybriCosts, HybriMoE, KTransformers, Smoe, SmoeEviction,
};
use strata_policy::replacement::Replacement;
use strata_policy::{CostModel, Hardware, Policy};
use strata_sim::ssd_tier::{SsdTierParams, simulate_ssd_tier};
use strata_sim::workload::{SyntheticParams, Workload, synthetic};
use strata_sim::{reproduce, simulate, trace};

use crate::plot;
use strata_sim::reproduce::{TOLERANCE, agreement};

/// Arguments of `strata simulate`.
#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// Hardware preset (`ktrans-a100`, `ktrans-4080`, `smoe-4090`, `trimoe-h100`,
    /// `cox-6000ada`, `cox-a100`, `cox-h100`, `local`) or a JSON file of the same shape.
    #[arg(long, value_name = "H", default_value = "smoe-4090")]
    hardware: String,
    /// Model preset (`deepseek-v3`, `qwen3-30b-a3b`, ...), a config.json, a model directory
    /// or a `.gguf` / converted file.
    #[arg(long, value_name = "M", default_value = "deepseek-v3")]
    model: String,
    /// Policy: `gpu-lru`, `fiddler`, `ktransformers[:D]`, `hybrimoe[:N]`,
    /// `hybrimoe-released[:N]`, `smoe[:N]`, `smoe-adaptive[:N]`, `smoe-flex[:N]`.
    #[arg(long, value_name = "P", default_value = "smoe:2")]
    policy: String,
    /// Workload: `synthetic` (see --prompt-tokens, --decode-tokens, --requests, --seed) or
    /// a routing trace file from `strata trace`.
    #[arg(long, value_name = "W", default_value = "synthetic")]
    workload: String,
    /// Bits per weight (16 = BF16, 4.25 = IQ4_XS).
    #[arg(long, value_name = "B", default_value_t = 4.25)]
    bits: f64,
    /// Synthetic workload: prompt tokens per request.
    #[arg(long, value_name = "N", default_value_t = 64)]
    prompt_tokens: usize,
    /// Synthetic workload: decode steps per request.
    #[arg(long, value_name = "N", default_value_t = 64)]
    decode_tokens: usize,
    /// Synthetic workload: requests.
    #[arg(long, value_name = "N", default_value_t = 1)]
    requests: usize,
    /// Synthetic workload: seed of the token draws.
    #[arg(long, value_name = "N", default_value_t = 2)]
    seed: u64,
    /// Routing trace to train predictors and profiles on (default: the workload itself for
    /// traces, other prompts of the same synthetic model for `synthetic`).
    #[arg(long, value_name = "FILE")]
    train: Option<PathBuf>,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    json: bool,
    /// Write the timeline (Chrome trace JSON, opens in Perfetto) to this file.
    #[arg(long, value_name = "FILE")]
    timeline: Option<PathBuf>,
    /// Draw the result into this SVG file: with `--reproduce`, each of the paper's figures
    /// beside the simulated values; otherwise the timeline, a Gantt chart of the devices.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Run a seed's comparison instead: `ktransformers`, `smoe`, `cox` or `trimoe`.
    #[arg(long, value_name = "NAME")]
    reproduce: Option<String>,
    /// Simulate the SSD tier instead of a policy (`strata generate --expert-cache SIZE
    /// --no-expert-prefetch` on the CPU): the routed experts read from the drive the
    /// hardware describes (`ssd`) into a DRAM cache of this many bytes (`6G`).
    #[arg(long, value_name = "SIZE")]
    expert_cache: Option<String>,
    /// With `--expert-cache`: `lfu` (the default), `lru`, `ema` or `ema:ALPHA`.
    #[arg(long, value_name = "RULE", requires = "expert_cache")]
    expert_cache_rule: Option<String>,
    /// With `--expert-cache`: a routing trace whose most used experts are read at start and
    /// never evicted, as `strata generate --expert-cache-pin` pins them.
    #[arg(long, value_name = "TRACE", requires = "expert_cache")]
    expert_cache_pin: Option<PathBuf>,
}

fn parse_policy(
    spec: &str,
    cost: &CostModel,
    w: &Workload,
    train: &Workload,
) -> anyhow::Result<Box<dyn Policy>> {
    let (name, n) = match spec.split_once(':') {
        Some((a, b)) => (
            a,
            Some(
                b.parse::<usize>()
                    .with_context(|| format!("--policy {spec}: `{b}` is not a count"))?,
            ),
        ),
        None => (spec, None),
    };
    let slots = cost.cache_slots_per_layer();
    let preds = || reproduce::train_predictors(train, w.top_k);
    Ok(match name {
        "gpu-lru" => Box::new(GpuLru::new(slots)),
        "fiddler" => Box::new(Fiddler::new(train.profile())),
        "ktransformers" => Box::new(KTransformers::new(n.unwrap_or(0))),
        "hybrimoe" => Box::new(HybriMoE::new(slots, n.unwrap_or(1))),
        "hybrimoe-released" => Box::new(HybriMoE::with_costs(
            HybriCosts::Released,
            slots,
            n.unwrap_or(1),
        )),
        "smoe" | "smoe-adaptive" => {
            let eviction = if name == "smoe" {
                SmoeEviction::FixedN
            } else {
                SmoeEviction::Adaptive
            };
            Box::new(Smoe::new(slots, n.unwrap_or(2), eviction, preds()?.0))
        }
        "smoe-flex" => {
            let (p, acc) = preds()?;
            Box::new(Smoe::flex(
                slots,
                n.unwrap_or(3),
                SmoeEviction::FixedN,
                p,
                &acc,
            ))
        }
        other => bail!(
            "unknown policy {other:?}, expected gpu-lru, fiddler, ktransformers, hybrimoe, \
             hybrimoe-released, smoe, smoe-adaptive or smoe-flex"
        ),
    })
}

fn print_reproduction(name: &str, json: bool, plot: Option<&Path>) -> anyhow::Result<()> {
    let r = reproduce::run(name)?;
    if let Some(path) = plot {
        plot::write(path, plot::reproduction(&r))?;
    }
    if json {
        let mut doc = serde_json::to_value(&r)?;
        doc["tolerance"] = serde_json::json!(TOLERANCE);
        let rows = doc["rows"].as_array_mut().into_iter().flatten();
        for (row, r) in rows.zip(&r.rows) {
            let a = agreement(r.value, r.paper);
            row["relative_error"] = serde_json::json!(a.map(|(off, _)| off));
            row["agrees"] = serde_json::json!(a.map(|(_, ok)| ok));
        }
        outln!("{}", serde_json::to_string_pretty(&doc)?)?;
        return Ok(());
    }
    let tol = format!("±{:.0}%", TOLERANCE * 100.0);
    outln!(
        "{:<22} {:<16} {:<12} {:>5} {:>6} {:<36} {:>10} {:>10} {:>8} {:>6}",
        "policy",
        "model",
        "hardware",
        "batch",
        "prompt",
        "metric",
        "simulated",
        "paper",
        "off",
        tol
    )?;
    let (mut compared, mut agreed) = (0, 0);
    for row in &r.rows {
        let paper = row.paper.map_or("-".to_string(), |p| format!("{p:.3}"));
        let (off, verdict) = match agreement(row.value, row.paper) {
            Some((off, ok)) => {
                compared += 1;
                agreed += usize::from(ok);
                (
                    format!("{:+.0}%", off * 100.0),
                    if ok { "pass" } else { "fail" },
                )
            }
            None => ("-".to_string(), "-"),
        };
        outln!(
            "{:<22} {:<16} {:<12} {:>5} {:>6} {:<36} {:>10.3} {:>10} {:>8} {:>6}",
            row.policy,
            row.model,
            row.hardware,
            row.batch,
            row.prompt_tokens,
            row.metric,
            row.value,
            paper,
            off,
            verdict
        )?;
    }
    outln!(
        "{agreed} of {compared} values with a paper figure are within {tol} of it; \
         docs/benchmarks.md says why the others differ"
    )?;
    Ok(())
}

pub fn run(args: SimulateArgs) -> anyhow::Result<()> {
    if let Some(name) = &args.reproduce {
        return print_reproduction(name, args.json, args.plot.as_deref());
    }
    let hw = Hardware::load(&args.hardware)?;
    let model = strata_exec::resolve_model_shape(&args.model)?;
    let cost = CostModel::new(hw, model, args.bits, args.bits)?;
    let m = &cost.model;
    let (w, train) = if args.workload == "synthetic" {
        let p = SyntheticParams {
            prompt_tokens: args.prompt_tokens,
            decode_tokens: args.decode_tokens,
            requests: args.requests,
            seed: args.seed,
            ..SyntheticParams::calibrated(m.moe_layers(), m.n_experts, m.top_k)
        };
        // Predictors and profiles come from other prompts of the same synthetic model.
        let train = synthetic(&SyntheticParams {
            requests: 4,
            prompt_tokens: 16,
            seed: args.seed.wrapping_add(1000),
            ..p.clone()
        });
        (synthetic(&p), train)
    } else {
        let (_, w) = trace::read_file(std::path::Path::new(&args.workload))?;
        (w.clone(), w)
    };
    if let Some(size) = &args.expert_cache {
        return print_ssd_tier(&args, &cost, &w, size);
    }
    let train = match &args.train {
        Some(path) => trace::read_file(path)?.1,
        None => train,
    };
    let mut policy = parse_policy(&args.policy, &cost, &w, &train)?;
    let report = simulate(policy.as_mut(), &cost, &w)?;
    if let Some(path) = &args.timeline {
        std::fs::write(path, serde_json::to_vec(&report.chrome_trace())?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        plot::write(path, plot::timeline(&report))?;
    }
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
        return Ok(());
    }
    outln!("policy     {}", report.policy)?;
    outln!("hardware   {}", report.hardware)?;
    outln!(
        "model      {} ({} MoE layers, {} experts, top-{}, {:.1} MB per expert, {} GPU slots per layer)",
        args.model,
        m.moe_layers(),
        m.n_experts,
        m.top_k,
        cost.expert_bytes() as f64 / 1e6,
        cost.cache_slots_per_layer()
    )?;
    for (name, p) in [("prefill", &report.prefill), ("decode", &report.decode)] {
        if p.tokens == 0 {
            continue;
        }
        outln!(
            "{name:<8}   {:>8.2} tok/s  {:>6} tokens in {:.3} s  hit {:.1}%  GPU {:.0}%  CPU {:.0}%  PCIe {:.0}%",
            p.tokens_per_s,
            p.tokens,
            p.seconds,
            100.0 * p.hit_rate,
            100.0 * p.util_gpu,
            100.0 * p.util_cpu,
            100.0 * p.util_pcie
        )?;
    }
    outln!("pcie       {:.2} GB copied", report.pcie_bytes as f64 / 1e9)?;
    if let Some(a) = report.predictor_accuracy {
        outln!(
            "predictor  {:.1}% of next-token experts predicted",
            100.0 * a
        )?;
    }
    Ok(())
}

/// `--expert-cache`: the SSD tier on `w`, a table (or `--json`) of each phase's tokens per
/// second from the drive and from memory, hit rate and bytes read.
fn print_ssd_tier(
    args: &SimulateArgs,
    cost: &CostModel,
    w: &Workload,
    size: &str,
) -> anyhow::Result<()> {
    let cache_bytes = strata_accel::parse_bytes(size)
        .with_context(|| format!("--expert-cache {size}: a size such as 6G"))?;
    let rule = match &args.expert_cache_rule {
        None => Replacement::Lfu,
        Some(r) => Replacement::parse(r)
            .with_context(|| format!("--expert-cache-rule {r}: expected {}", Replacement::NAMES))?,
    };
    let pin_profile = match &args.expert_cache_pin {
        Some(path) => Some(
            trace::read_file(path)
                .with_context(|| format!("--expert-cache-pin {}", path.display()))?
                .1
                .profile(),
        ),
        None => None,
    };
    let params = SsdTierParams {
        cache_bytes,
        rule,
        pinned: Vec::new(),
        pin_profile,
    };
    let r = simulate_ssd_tier(cost, w, &params)
        .with_context(|| format!("--expert-cache on hardware {}", args.hardware))?;
    if args.json {
        let mut doc = serde_json::to_value(&r)?;
        for (name, p) in [("prefill", &r.prefill), ("decode", &r.decode)] {
            doc[name]["tokens_per_s"] = serde_json::json!(p.tokens_per_s());
            doc[name]["in_memory_tokens_per_s"] = serde_json::json!(p.in_memory_tokens_per_s());
            doc[name]["hit_rate"] = serde_json::json!(p.hit_rate());
        }
        outln!("{}", serde_json::to_string_pretty(&doc)?)?;
        return Ok(());
    }
    let m = &cost.model;
    outln!(
        "ssd tier   {} slots of {:.2} MiB ({:.0} MiB), {rule:?}, no reads ahead; drive {:.2} GB/s",
        r.slots,
        r.expert_bytes as f64 / (1u64 << 20) as f64,
        (r.slots as u64 * r.expert_bytes) as f64 / (1u64 << 20) as f64,
        cost.hw.ssd.as_ref().map_or(0.0, |s| s.read_bw / 1e9)
    )?;
    if r.pinned > 0 {
        outln!(
            "pinned     {} experts, read at start in {:.2} s",
            r.pinned,
            r.pin_seconds
        )?;
    }
    outln!(
        "model      {} ({} MoE layers, {} experts, top-{}); each layer's most used 30% of experts took {:.1}% of lookups",
        args.model,
        m.moe_layers(),
        m.n_experts,
        m.top_k,
        100.0 * r.top30_share
    )?;
    for (name, p) in [("prefill", &r.prefill), ("decode", &r.decode)] {
        if p.tokens == 0 {
            continue;
        }
        outln!(
            "{name:<8}   {:>8.2} tok/s ({:.2} from memory)  {:>6} tokens  hit {:.1}%  {:.1} MiB read per token",
            p.tokens_per_s(),
            p.in_memory_tokens_per_s(),
            p.tokens,
            100.0 * p.hit_rate(),
            p.bytes_read as f64 / (1u64 << 20) as f64 / p.tokens as f64
        )?;
    }
    Ok(())
}
