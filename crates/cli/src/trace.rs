//! `strata trace`: records the routing of every token at every MoE layer of a real model,
//! prefill and greedy decode, into a routing trace (`strata_sim::trace` documents the
//! format) for the simulator and the predictors, with each token's top `2k` router
//! candidates (HybriMoE's score cache reads them).
//!
//! A key design decision: the recorder is a `ForwardObserver` that lives here, in the
//! binary, so the model crate knows nothing of traces and the simulator nothing of models.

use std::io::BufWriter;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use strata_model::Routing;
use strata_model::attention::SeqSpan;
use strata_model::{ForwardObserver, LogitsWanted, Model, SeqInput};
use strata_runtime::engine::load_tokenizer;
use strata_sim::trace::{FORMAT, Header, Record, VERSION, Writer};

use crate::model_arg::ModelArgs;
use crate::plot;
use crate::progress::Progress;

/// Arguments of `strata trace`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("output").required(true).multiple(true).args(["out", "plot"])))]
pub struct TraceArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompts: a text file with one prompt per line, or JSON lines with a `prompt` field
    /// (or a bare JSON string) per line.
    #[arg(long, value_name = "FILE")]
    prompts: PathBuf,
    /// Output trace file (JSON lines).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Draw each MoE layer's expert load (a heat map of experts sorted by load, and the
    /// share of tokens the busiest experts take) into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Greedy decode steps recorded after each prompt.
    #[arg(long, value_name = "N", default_value_t = 32)]
    decode: usize,
    /// Leave out the router input hidden states (smaller traces, no predictor training).
    #[arg(long)]
    no_hidden: bool,
}

/// Collects records while the model runs.
#[derive(Debug, Default)]
pub struct Recorder {
    records: Vec<Record>,
    request: usize,
    step: usize,
    phase: &'static str,
    context: usize,
    layer: usize,
    hidden: bool,
    top_k: usize,
    hidden_dim: usize,
    moe_layers: usize,
    candidates: usize,
}

impl Recorder {
    /// A recorder; `hidden` keeps the router input hidden states.
    pub fn new(hidden: bool) -> Self {
        Self {
            hidden,
            ..Self::default()
        }
    }

    /// Starts a step of `request`.
    pub fn begin(&mut self, request: usize, phase: &'static str, context: usize) {
        if self.layer > 0 {
            self.moe_layers = self.moe_layers.max(self.layer);
            self.step += 1;
        }
        self.request = request;
        self.phase = phase;
        self.context = context;
        self.layer = 0;
    }

    /// Routed activations per MoE layer and expert (`n_experts` from the model's config).
    pub fn expert_counts(&self, n_experts: usize) -> Vec<Vec<u64>> {
        let layers = self.records.iter().map(|r| r.layer + 1).max().unwrap_or(0);
        let mut counts = vec![vec![0u64; n_experts]; layers];
        for r in &self.records {
            for &e in &r.ids {
                if let Some(c) = counts[r.layer].get_mut(e as usize) {
                    *c += 1;
                }
            }
        }
        counts
    }

    /// Writes the trace; `n_experts` comes from the model's config.
    pub fn write(
        mut self,
        out: impl std::io::Write,
        model: &str,
        n_experts: usize,
    ) -> std::io::Result<()> {
        self.moe_layers = self.moe_layers.max(self.layer);
        let mut w = Writer::new(
            out,
            Header {
                format: FORMAT.into(),
                version: VERSION,
                model: model.into(),
                moe_layers: self.moe_layers,
                n_experts,
                top_k: self.top_k,
                hidden_dim: if self.hidden { self.hidden_dim } else { 0 },
                candidates: self.candidates,
            },
        )?;
        for r in &self.records {
            w.record(r)?;
        }
        w.finish().map(|_| ())
    }
}

impl ForwardObserver for Recorder {
    fn on_routing(&mut self, _layer: usize, _spans: &[SeqSpan], routing: &Routing, hidden: &[f32]) {
        let tokens = routing.tokens();
        self.top_k = routing.top_k;
        let c = routing.candidates.as_ref();
        self.candidates = c.map_or(0, |c| c.per_token);
        if let Some(d) = hidden.len().checked_div(tokens) {
            self.hidden_dim = d;
        }
        self.records.push(Record {
            request: self.request,
            step: self.step,
            phase: self.phase.into(),
            context: self.context,
            layer: self.layer,
            tokens,
            ids: routing.ids.clone(),
            weights: routing.weights.clone(),
            hidden: self.hidden.then(|| hidden.to_vec()),
            candidate_ids: c.map(|c| c.ids.clone()),
            candidate_scores: c.map(|c| c.scores.clone()),
        });
        self.layer += 1;
    }
}

/// Reads prompts: text lines, or JSON lines holding a string or `{"prompt": ...}`
/// (`strata trace` and `strata stratify`).
pub(crate) fn read_prompts(path: &std::path::Path) -> anyhow::Result<Vec<String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if line.starts_with('{') || line.starts_with('"') {
            let v: serde_json::Value = serde_json::from_str(line)
                .with_context(|| format!("{}: line {}: not JSON", path.display(), i + 1))?;
            let p = v
                .as_str()
                .or_else(|| v.get("prompt").and_then(|p| p.as_str()));
            match p {
                Some(p) => out.push(p.to_string()),
                None => bail!(
                    "{}: line {}: expected a string or {{\"prompt\": ...}}",
                    path.display(),
                    i + 1
                ),
            }
        } else {
            out.push(line.to_string());
        }
    }
    if out.is_empty() {
        bail!("{}: no prompts", path.display());
    }
    Ok(out)
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Records `prompts` through `model` into `rec`, `decode` greedy steps each.
pub fn record(
    model: &Model,
    prompts: &[Vec<u32>],
    decode: usize,
    rec: &mut Recorder,
) -> anyhow::Result<()> {
    let mut progress = Progress::new("tracing", prompts.len() as u64, "prompts");
    for (req, tokens) in prompts.iter().enumerate() {
        progress.set(req as u64, "");
        if tokens.is_empty() {
            bail!("prompt {} has no tokens", req + 1);
        }
        let mut cache = model.new_cache();
        rec.begin(req, "prefill", 0);
        let mut seqs = [SeqInput {
            tokens,
            cache: &mut cache,
            logits: LogitsWanted::Last,
        }];
        let mut next = argmax(&model.forward_observed(&mut seqs, rec)?.remove(0));
        for i in 0..decode {
            rec.begin(req, "decode", tokens.len() + i);
            let one = [next];
            let mut seqs = [SeqInput {
                tokens: &one,
                cache: &mut cache,
                logits: LogitsWanted::Last,
            }];
            next = argmax(&model.forward_observed(&mut seqs, rec)?.remove(0));
        }
        progress.set(req as u64 + 1, "");
    }
    Ok(())
}

pub fn run(args: TraceArgs) -> anyhow::Result<()> {
    let dir = args.model.dir()?;
    let prompts = read_prompts(&args.prompts)?;
    let tok = load_tokenizer(&dir).with_context(|| format!("tokenizer of {}", dir.display()))?;
    let ids = prompts
        .iter()
        .map(|p| tok.encode(p, true))
        .collect::<Result<Vec<_>, _>>()?;
    let (mut model, _) = args.model.load_model(&dir)?;
    model.keep_candidates(true);
    let n_experts = strata_exec::model_shape(&model.config)?.n_experts;
    let mut rec = Recorder::new(!args.no_hidden);
    record(&model, &ids, args.decode, &mut rec)?;
    if let Some(path) = &args.plot {
        let name = dir.file_name().unwrap_or(dir.as_os_str()).to_string_lossy();
        plot::write(
            path,
            plot::expert_load(&rec.expert_counts(n_experts), &name),
        )?;
    }
    if let Some(out) = &args.out {
        let f =
            std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
        rec.write(BufWriter::new(f), &dir.to_string_lossy(), n_experts)
            .with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_moe_trace_round_trips() {
        let dir = PathBuf::from(crate::model_arg::DEFAULT_MODEL);
        if !dir.join("config.json").exists() {
            return;
        }
        let mut model = Model::load(
            &dir,
            strata_model::LoadOptions::new(strata_model::Precision::Fast),
        )
        .unwrap();
        model.keep_candidates(true);
        let mut rec = Recorder::new(true);
        record(&model, &[vec![5, 17, 300, 42], vec![9, 8]], 3, &mut rec).unwrap();
        let mut buf = Vec::new();
        rec.write(&mut buf, "tiny", 32).unwrap();
        let (h, w) = strata_sim::trace::read(&buf[..], "mem").unwrap();
        assert_eq!((h.moe_layers, h.top_k, h.hidden_dim), (6, 4, 256));
        assert_eq!((h.version, h.candidates), (VERSION, 8));
        let first = &w.steps[0].layers[0];
        let c = first.candidates.as_ref().unwrap();
        // The chosen experts are the best-scored candidates here (no bias, no groups).
        for (t, ids) in first.ids.chunks_exact(4).enumerate() {
            let mut top: Vec<u32> = c.ids[t * 8..t * 8 + 4].to_vec();
            let mut chosen = ids.to_vec();
            top.sort();
            chosen.sort();
            assert_eq!(top, chosen);
        }
        // Two prompts: a prefill and three decode steps each.
        assert_eq!(w.steps.len(), 8);
        assert_eq!(w.steps[0].tokens, 4);
        assert_eq!(w.steps[4].context, 0);
        assert_eq!(w.steps[7].context, 4);
        let samples = w.predictor_samples();
        assert_eq!(samples[0].len(), 4);
        // The trace drives the simulator.
        let cost = strata_policy::CostModel::new(
            strata_policy::Hardware::load("smoe-4090").unwrap(),
            strata_exec::resolve_model_shape(&dir.to_string_lossy()).unwrap(),
            16.0,
            16.0,
        )
        .unwrap();
        let r = strata_sim::simulate(
            &mut strata_policy::policies::KTransformers::new(1),
            &cost,
            &w,
        )
        .unwrap();
        assert_eq!(r.decode.tokens, 6);
    }
}
