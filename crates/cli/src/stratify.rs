//! `strata stratify`: CoX-MoE's expert-aware stratification (seed 001, section 4.3) on a
//! real model, and its hit ratio on the whole prompt set against random pinning.
//!
//! 1. Pre-processing: every prompt runs through the model once; its embedding is the mean
//!    over its tokens of the first MoE layer's router input (the engine exposes no other
//!    hidden state; this is the token embedding after one attention block and the norm).
//!    The same pass records every prompt's routing, used only to score the pinning.
//! 2. Stratification: k-means over the embeddings, prototypes picked per cluster in
//!    proportion to its size (`strata_policy::stratify`).
//! 3. Probing: a prefill-only pass over the prototypes counts each expert's activations;
//!    the most activated experts, within the budget, are pinned.
//!
//! The report gives, per budget, the hit ratio (share of all routed activations of the
//! whole prompt set that land on a pinned expert) of the stratified pinning, of random
//! pinning (mean over seeds), of a uniform random sample of prompts of the same size as
//! the prototypes, and of the oracle (pinning from the whole set's own counts).
//!
//! A key design decision: the probe is a separate forward pass over the prototypes only,
//! exactly what a deployment would run, and not a lookup into the evaluation pass, so the
//! command also checks that both agree.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use strata_model::Routing;
use strata_model::attention::SeqSpan;
use strata_model::{ForwardObserver, LogitsWanted, Model, SeqInput};
use strata_policy::stratify::{
    SplitMix, hit_ratio, kmeans, pin_order, pin_per_layer, prototypes, random_per_layer,
    random_pins,
};
use strata_runtime::engine::load_tokenizer;

use crate::model_arg::ModelArgs;
use crate::progress::Progress;
use crate::trace::read_prompts;

/// Arguments of `strata stratify`.
#[derive(Debug, Args)]
pub struct StratifyArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompts: a text file with one prompt per line, or JSON lines with a `prompt` field
    /// (or a bare JSON string) per line.
    #[arg(long, value_name = "FILE")]
    prompts: PathBuf,
    /// Experts pinned in VRAM, over all MoE layers (or per layer with `--per-layer`); a
    /// comma-separated list evaluates several budgets.
    #[arg(long, value_name = "N[,N...]", value_delimiter = ',', required = true)]
    budget_experts: Vec<usize>,
    /// The budget is per MoE layer instead of over all layers.
    #[arg(long)]
    per_layer: bool,
    /// Strata (k-means clusters).
    #[arg(long, value_name = "K", default_value_t = 8)]
    clusters: usize,
    /// Prototypes probed (default: 10% of the prompts, at least one per stratum).
    #[arg(long, value_name = "N")]
    prototypes: Option<usize>,
    /// Seed of k-means and of the random baselines.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Random pinnings (and random prompt samples) averaged.
    #[arg(long, value_name = "N", default_value_t = 20)]
    random_trials: usize,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    json: bool,
}

/// Per-sequence expert counts and the first MoE layer's mean router input.
#[derive(Debug, Default)]
struct Probe {
    /// `[seq][layer][expert]`.
    counts: Vec<Vec<Vec<u64>>>,
    /// `[seq][hidden]`.
    embed: Vec<Vec<f32>>,
    /// MoE layers seen in the current pass, in call order.
    layer: usize,
    base: usize,
    n_experts: usize,
}

impl ForwardObserver for Probe {
    fn on_routing(&mut self, _layer: usize, spans: &[SeqSpan], routing: &Routing, hidden: &[f32]) {
        let k = routing.top_k.max(1);
        let d = hidden.len().checked_div(routing.tokens()).unwrap_or(0);
        let l = self.layer;
        for (i, span) in spans.iter().enumerate() {
            let seq = &mut self.counts[self.base + i];
            if seq.len() <= l {
                seq.resize(l + 1, vec![0; self.n_experts]);
            }
            for &e in &routing.ids[span.row * k..(span.row + span.len) * k] {
                if let Some(c) = seq[l].get_mut(e as usize) {
                    *c += 1;
                }
            }
            if l == 0 && d > 0 && span.len > 0 {
                let mut m = vec![0.0f32; d];
                for r in span.row..span.row + span.len {
                    for (a, x) in m.iter_mut().zip(&hidden[r * d..(r + 1) * d]) {
                        *a += x;
                    }
                }
                m.iter_mut().for_each(|a| *a /= span.len as f32);
                self.embed[self.base + i] = m;
            }
        }
        self.layer += 1;
    }
}

/// Prefill of `prompts` in groups (no logits), recording routing and embeddings; `what`
/// names the pass in its progress.
fn prefill(
    model: &Model,
    prompts: &[&[u32]],
    n_experts: usize,
    what: &str,
) -> anyhow::Result<Probe> {
    let mut p = Probe {
        counts: vec![Vec::new(); prompts.len()],
        embed: vec![Vec::new(); prompts.len()],
        n_experts,
        ..Probe::default()
    };
    const GROUP: usize = 16;
    let mut progress = Progress::new(what, prompts.len() as u64, "prompts");
    for (g, chunk) in prompts.chunks(GROUP).enumerate() {
        progress.set((g * GROUP) as u64, "");
        let mut caches: Vec<_> = chunk.iter().map(|_| model.new_cache()).collect();
        let mut seqs: Vec<SeqInput> = chunk
            .iter()
            .zip(caches.iter_mut())
            .map(|(t, c)| SeqInput {
                tokens: t,
                cache: c,
                logits: LogitsWanted::None,
            })
            .collect();
        p.base = g * GROUP;
        p.layer = 0;
        model.forward_observed(&mut seqs, &mut p)?;
    }
    progress.set(prompts.len() as u64, "");
    Ok(p)
}

/// Sum of per-sequence counts over `which`.
fn total(
    counts: &[Vec<Vec<u64>>],
    which: impl Iterator<Item = usize>,
    layers: usize,
    n: usize,
) -> Vec<Vec<u64>> {
    let mut t = vec![vec![0u64; n]; layers];
    for s in which {
        for (tl, cl) in t.iter_mut().zip(&counts[s]) {
            for (a, b) in tl.iter_mut().zip(cl) {
                *a += b;
            }
        }
    }
    t
}

/// One budget's hit ratios.
#[derive(Debug)]
struct BudgetRow {
    budget: usize,
    per_layer: bool,
    stratified: f64,
    random: f64,
    random_sample: f64,
    oracle: f64,
}

/// What stratification found.
struct Stratified {
    /// The pass over every prompt.
    full: Probe,
    /// Activation counts of the whole set, `[layer][expert]`.
    truth: Vec<Vec<u64>>,
    /// The strata.
    clusters: strata_policy::stratify::Clusters,
    /// Prompt indices probed.
    prototypes: Vec<usize>,
    /// Activation counts of the probe, `[layer][expert]`.
    probed: Vec<Vec<u64>>,
}

/// Embeds `prompts`, clusters them into `k` strata, picks `n_proto` prototypes and probes
/// them with a prefill of their own.
fn stratify(
    model: &Model,
    prompts: &[&[u32]],
    layers: usize,
    n_exp: usize,
    k: usize,
    n_proto: usize,
    seed: u64,
) -> anyhow::Result<Stratified> {
    // 1. Embed every prompt (the same pass records the routing used for scoring).
    let full = prefill(model, prompts, n_exp, "embedding prompts")?;
    let truth = total(&full.counts, 0..prompts.len(), layers, n_exp);
    // 2. Strata and prototypes.
    let clusters = kmeans(&full.embed, k, 100, seed);
    let protos = prototypes(&full.embed, &clusters, n_proto);
    // 3. Probe the prototypes with a prefill of their own.
    let probe_in: Vec<&[u32]> = protos.iter().map(|&i| prompts[i]).collect();
    let probe = prefill(model, &probe_in, n_exp, "probing prototypes")?;
    let probed = total(&probe.counts, 0..protos.len(), layers, n_exp);
    if probed != total(&full.counts, protos.iter().copied(), layers, n_exp) {
        bail!("the prototype probe routed differently from the full pass");
    }
    Ok(Stratified {
        full,
        truth,
        clusters,
        prototypes: protos,
        probed,
    })
}

pub fn run(args: StratifyArgs) -> anyhow::Result<()> {
    let dir = args.model.dir()?;
    let prompts = read_prompts(&args.prompts)?;
    let tok = load_tokenizer(&dir).with_context(|| format!("tokenizer of {}", dir.display()))?;
    let ids = prompts
        .iter()
        .map(|p| tok.encode(p, true))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(i) = ids.iter().position(Vec::is_empty) {
        bail!("prompt {} has no tokens", i + 1);
    }
    let (model, _) = args.model.load_model(&dir)?;
    let shape = strata_exec::model_shape(&model.config)?;
    let (layers, n_exp) = (shape.moe_layers(), shape.n_experts);
    let all: Vec<&[u32]> = ids.iter().map(Vec::as_slice).collect();
    let n_proto = args
        .prototypes
        .unwrap_or((all.len() / 10).max(args.clusters))
        .clamp(1, all.len());
    let st = stratify(
        &model,
        &all,
        layers,
        n_exp,
        args.clusters,
        n_proto,
        args.seed,
    )?;
    let (full, truth, clusters, protos, probed) =
        (st.full, st.truth, st.clusters, st.prototypes, st.probed);
    let trials = args.random_trials.max(1);
    let mut rows = Vec::new();
    for &b in &args.budget_experts {
        let pick = |c: &[Vec<u64>]| {
            if args.per_layer {
                pin_per_layer(c, b)
            } else {
                let mut o = pin_order(c);
                o.truncate(b);
                o
            }
        };
        let mut rnd = 0.0;
        let mut sample = 0.0;
        let mut rng = SplitMix::new(args.seed ^ 0x5eed);
        for t in 0..trials {
            let seed = args.seed.wrapping_add(t as u64 * 7919);
            let pins = if args.per_layer {
                random_per_layer(layers, n_exp, b, seed)
            } else {
                random_pins(layers, n_exp, b, seed)
            };
            rnd += hit_ratio(&truth, &pins);
            let idx: Vec<usize> = random_pins(1, all.len(), protos.len(), rng.next_u64())
                .into_iter()
                .map(|(_, i)| i as usize)
                .collect();
            sample += hit_ratio(
                &truth,
                &pick(&total(&full.counts, idx.into_iter(), layers, n_exp)),
            );
        }
        rows.push(BudgetRow {
            budget: b,
            per_layer: args.per_layer,
            stratified: hit_ratio(&truth, &pick(&probed)),
            random: rnd / trials as f64,
            random_sample: sample / trials as f64,
            oracle: hit_ratio(&truth, &pick(&truth)),
        });
    }
    if args.json {
        let doc = serde_json::json!({
            "model": dir.to_string_lossy(),
            "prompts": all.len(),
            "tokens": ids.iter().map(Vec::len).sum::<usize>(),
            "moe_layers": layers,
            "n_experts": n_exp,
            "clusters": clusters.centroids.len(),
            "cluster_sizes": (0..clusters.centroids.len())
                .map(|c| clusters.assign.iter().filter(|&&a| a == c).count())
                .collect::<Vec<_>>(),
            "prototypes": protos.len(),
            "rows": rows.iter().map(|r| serde_json::json!({
                "budget": r.budget,
                "per_layer": r.per_layer,
                "stratified": r.stratified,
                "random": r.random,
                "random_sample": r.random_sample,
                "oracle": r.oracle,
            })).collect::<Vec<_>>(),
        });
        outln!("{}", serde_json::to_string_pretty(&doc)?)?;
    } else {
        outln!(
            "{} prompts ({} tokens), {} MoE layers x {} experts; {} strata, {} prototypes probed",
            all.len(),
            ids.iter().map(Vec::len).sum::<usize>(),
            layers,
            n_exp,
            clusters.centroids.len(),
            protos.len()
        )?;
        outln!(
            "{:>8} {:>10} {:>11} {:>8} {:>14} {:>8} {:>14}",
            "budget",
            "scope",
            "stratified",
            "random",
            "random sample",
            "oracle",
            "vs random"
        )?;
        for r in &rows {
            outln!(
                "{:>8} {:>10} {:>11.3} {:>8.3} {:>14.3} {:>8.3} {:>+13.1}%",
                r.budget,
                if r.per_layer {
                    "per layer"
                } else {
                    "all layers"
                },
                r.stratified,
                r.random,
                r.random_sample,
                r.oracle,
                100.0 * (r.stratified / r.random - 1.0)
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_moe_stratification_probes_its_prototypes() {
        let dir = PathBuf::from(crate::model_arg::DEFAULT_MODEL);
        if !dir.join("config.json").exists() {
            return;
        }
        let model = Model::load(
            &dir,
            strata_model::LoadOptions::new(strata_model::Precision::Fast),
        )
        .unwrap();
        // 20 prompts of two kinds of token, 3 to 9 tokens long.
        let prompts: Vec<Vec<u32>> = (0..20u32)
            .map(|i| {
                let base = if i % 2 == 0 { 100 } else { 3000 };
                (0..3 + i % 7)
                    .map(|j| base + (i * 13 + j * 7) % 50)
                    .collect()
            })
            .collect();
        let refs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
        let st = stratify(&model, &refs, 6, 32, 4, 6, 1).unwrap();
        let tokens: usize = prompts.iter().map(Vec::len).sum();
        // Every token routed to top-4 distinct experts at every layer.
        assert_eq!(st.truth.len(), 6);
        for l in &st.truth {
            assert_eq!(l.iter().sum::<u64>(), 4 * tokens as u64);
        }
        assert!(st.full.embed.iter().all(|e| e.len() == 256));
        assert_eq!(st.prototypes.len(), 6);
        let probed: usize = st.prototypes.iter().map(|&i| prompts[i].len()).sum();
        assert_eq!(st.probed[0].iter().sum::<u64>(), 4 * probed as u64);
        // The probe's pinning beats pinning nothing and is at most the oracle's.
        let pins = {
            let mut o = pin_order(&st.probed);
            o.truncate(24);
            o
        };
        let mut oracle = pin_order(&st.truth);
        oracle.truncate(24);
        let h = hit_ratio(&st.truth, &pins);
        assert!(h > 24.0 / 192.0 && h <= hit_ratio(&st.truth, &oracle) + 1e-12);
    }
}
