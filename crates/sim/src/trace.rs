//! Routing traces: the routing of every token at every MoE layer, as recorded from the
//! real engine, in a line-oriented JSON format.
//!
//! Format (`strata-routing-trace`, version 2), one JSON object per line:
//! - line 1, the header: `{"format":"strata-routing-trace","version":2,"model":NAME,
//!   "moe_layers":L,"n_experts":E,"top_k":K,"hidden_dim":D,"candidates":P}` (`D = 0`: no
//!   hidden states; `P = 0`: no candidates);
//! - then one record per (step, MoE layer), steps in order and layers `0..L` within a step:
//!   `{"request":R,"step":S,"phase":"prefill"|"decode","context":C,"layer":I,
//!   "tokens":T,"ids":[T*K],"weights":[T*K],"hidden":[T*D]?,
//!   "candidate_ids":[T*P]?,"candidate_scores":[T*P]?}`, where the candidates are each
//!   token's `P` best-scored experts (the router's softmax or sigmoid scores before bias,
//!   group limits and renormalisation), best first: HybriMoE scores the top `2k`.
//!
//! Version 1 is version 2 without `candidates` and the candidate fields; it is still read.
//!
//! A key design decision: JSON lines rather than a binary layout, so a trace can be
//! inspected with `head` and `jq` and written from any tool; hidden states, the only bulky
//! part, are optional and written only where a predictor needs them.

use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};
use strata_policy::Phase;

use crate::workload::{Candidates, LayerRouting, Step, Workload};
use crate::{Error, Result};

/// The format name in the header.
pub const FORMAT: &str = "strata-routing-trace";

/// The version written; versions 1 and 2 are read.
pub const VERSION: u32 = 2;

/// The first line of a trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// Always [`FORMAT`].
    pub format: String,
    /// Format version: [`VERSION`] when written, 1 or 2 when read.
    pub version: u32,
    /// Model the trace was recorded from.
    pub model: String,
    /// MoE layers per step.
    pub moe_layers: usize,
    /// Routed experts per layer.
    pub n_experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Width of the recorded hidden states (0: none).
    pub hidden_dim: usize,
    /// Candidates recorded per token (0: none; absent in version 1).
    #[serde(default)]
    pub candidates: usize,
}

/// One (step, layer) line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Request index.
    pub request: usize,
    /// Step index within the trace.
    pub step: usize,
    /// `prefill` or `decode`.
    pub phase: String,
    /// Tokens already cached.
    pub context: usize,
    /// MoE layer.
    pub layer: usize,
    /// Tokens in the step.
    pub tokens: usize,
    /// Expert ids `[tokens * top_k]`.
    pub ids: Vec<u32>,
    /// Weights `[tokens * top_k]`.
    pub weights: Vec<f32>,
    /// Router input `[tokens * hidden_dim]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden: Option<Vec<f32>>,
    /// Each token's best-scored experts `[tokens * candidates]` (version 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate_ids: Option<Vec<u32>>,
    /// Their router scores `[tokens * candidates]` (version 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate_scores: Option<Vec<f32>>,
}

/// Writes a trace line by line.
#[derive(Debug)]
pub struct Writer<W: Write> {
    out: W,
    header: Header,
}

impl<W: Write> Writer<W> {
    /// Starts a trace with `header`.
    pub fn new(mut out: W, header: Header) -> std::io::Result<Self> {
        serde_json::to_writer(&mut out, &header)?;
        out.write_all(b"\n")?;
        Ok(Self { out, header })
    }

    /// The header written.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Appends one record.
    pub fn record(&mut self, r: &Record) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.out, r)?;
        self.out.write_all(b"\n")
    }

    /// Flushes and returns the sink.
    pub fn finish(mut self) -> std::io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Reads a whole trace into a [`Workload`]; `path` names the source in errors.
pub fn read(input: impl BufRead, path: &str) -> Result<(Header, Workload)> {
    let bad = |line: usize, msg: String| Error::Trace {
        path: path.to_string(),
        msg: format!("line {line}: {msg}"),
    };
    let mut lines = input.lines().enumerate();
    let (_, first) = lines.next().ok_or_else(|| bad(1, "empty file".into()))?;
    let first = first.map_err(|e| bad(1, e.to_string()))?;
    let header: Header =
        serde_json::from_str(&first).map_err(|e| bad(1, format!("header: {e}")))?;
    if header.format != FORMAT || !(1..=VERSION).contains(&header.version) {
        return Err(bad(
            1,
            format!(
                "expected format {FORMAT:?} version 1 or {VERSION}, got {:?} version {}",
                header.format, header.version
            ),
        ));
    }
    let (k, d) = (header.top_k, header.hidden_dim);
    let mut steps: Vec<Step> = Vec::new();
    let mut key = None;
    for (i, line) in lines {
        let n = i + 1;
        let line = line.map_err(|e| bad(n, e.to_string()))?;
        if line.trim().is_empty() {
            continue;
        }
        let mut r: Record = serde_json::from_str(&line).map_err(|e| bad(n, e.to_string()))?;
        let (phase, candidates) = check_record(&header, &mut r).map_err(|msg| bad(n, msg))?;
        if key != Some((r.request, r.step)) {
            if let Some(s) = steps.last()
                && s.layers.len() != header.moe_layers
            {
                return Err(bad(
                    n,
                    format!(
                        "previous step has {} layers, expected {}",
                        s.layers.len(),
                        header.moe_layers
                    ),
                ));
            }
            key = Some((r.request, r.step));
            steps.push(Step {
                request: r.request,
                phase,
                tokens: r.tokens,
                context: r.context,
                layers: Vec::new(),
            });
        }
        let s = steps.last_mut().ok_or_else(|| bad(n, "no step".into()))?;
        if r.layer != s.layers.len() || r.tokens != s.tokens {
            return Err(bad(
                n,
                format!(
                    "layer {} with {} tokens, expected layer {} with {}",
                    r.layer,
                    r.tokens,
                    s.layers.len(),
                    s.tokens
                ),
            ));
        }
        s.layers.push(LayerRouting {
            ids: r.ids,
            weights: r.weights,
            hidden: r.hidden,
            candidates,
        });
    }
    if let Some(s) = steps.last()
        && s.layers.len() != header.moe_layers
    {
        return Err(Error::Trace {
            path: path.to_string(),
            msg: format!(
                "last step has {} layers, expected {}",
                s.layers.len(),
                header.moe_layers
            ),
        });
    }
    let w = Workload {
        n_experts: header.n_experts,
        top_k: k,
        hidden_dim: d,
        steps,
    };
    Ok((header, w))
}

/// Checks one record against the header: its phase, the lengths of its ids, weights,
/// hidden states and candidates, and the expert ids' range. Takes its candidates out.
fn check_record(
    header: &Header,
    r: &mut Record,
) -> std::result::Result<(Phase, Option<Candidates>), String> {
    let (k, d) = (header.top_k, header.hidden_dim);
    let phase = match r.phase.as_str() {
        "prefill" => Phase::Prefill,
        "decode" => Phase::Decode,
        other => {
            return Err(format!("phase {other:?}, expected prefill or decode"));
        }
    };
    if r.ids.len() != r.tokens * k || r.weights.len() != r.tokens * k {
        return Err(format!(
            "{} ids and {} weights, expected {}",
            r.ids.len(),
            r.weights.len(),
            r.tokens * k
        ));
    }
    if let Some(&e) = r.ids.iter().find(|&&e| e as usize >= header.n_experts) {
        return Err(format!(
            "expert id {e} out of range 0..{}",
            header.n_experts
        ));
    }
    if let Some(h) = &r.hidden
        && h.len() != r.tokens * d
    {
        return Err(format!(
            "{} hidden values, expected {}",
            h.len(),
            r.tokens * d
        ));
    }
    let p = header.candidates;
    let candidates = match (r.candidate_ids.take(), r.candidate_scores.take()) {
        (None, None) => None,
        (Some(ids), Some(scores))
            if p > 0 && ids.len() == r.tokens * p && scores.len() == r.tokens * p =>
        {
            if let Some(&e) = ids.iter().find(|&&e| e as usize >= header.n_experts) {
                return Err(format!(
                    "candidate id {e} out of range 0..{}",
                    header.n_experts
                ));
            }
            Some(Candidates {
                per_token: p,
                ids,
                scores,
            })
        }
        (ids, scores) => {
            return Err(format!(
                "{} candidate ids and {} scores, expected {} of each",
                ids.map_or(0, |v| v.len()),
                scores.map_or(0, |v| v.len()),
                r.tokens * p
            ));
        }
    };
    Ok((phase, candidates))
}

/// Reads a trace file.
pub fn read_file(path: &std::path::Path) -> Result<(Header, Workload)> {
    let f = std::fs::File::open(path).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })?;
    read(std::io::BufReader::new(f), &path.display().to_string())
}

/// Writes `w` as a trace (for synthetic workloads and tests).
pub fn write(out: impl Write, model: &str, w: &Workload) -> std::io::Result<()> {
    let mut wr = Writer::new(
        out,
        Header {
            format: FORMAT.into(),
            version: VERSION,
            model: model.into(),
            moe_layers: w.moe_layers(),
            n_experts: w.n_experts,
            top_k: w.top_k,
            hidden_dim: w.hidden_dim,
            candidates: w
                .steps
                .iter()
                .flat_map(|s| &s.layers)
                .find_map(|l| l.candidates.as_ref().map(|c| c.per_token))
                .unwrap_or(0),
        },
    )?;
    for (si, s) in w.steps.iter().enumerate() {
        for (l, r) in s.layers.iter().enumerate() {
            wr.record(&Record {
                request: s.request,
                step: si,
                phase: match s.phase {
                    Phase::Prefill => "prefill".into(),
                    Phase::Decode => "decode".into(),
                },
                context: s.context,
                layer: l,
                tokens: s.tokens,
                ids: r.ids.clone(),
                weights: r.weights.clone(),
                hidden: r.hidden.clone(),
                candidate_ids: r.candidates.as_ref().map(|c| c.ids.clone()),
                candidate_scores: r.candidates.as_ref().map(|c| c.scores.clone()),
            })?;
        }
    }
    wr.finish().map(|_| ())
}
