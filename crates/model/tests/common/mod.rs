//! Helpers shared by the model's reference tests.

use std::path::{Path, PathBuf};

use strata_model::{LogitsWanted, Model, SeqInput};

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `tokens` through `model` in chunks of `chunk` and returns all logits.
pub fn logits_chunked(model: &Model, tokens: &[u32], chunk: usize) -> Vec<f32> {
    let mut cache = model.new_cache();
    let mut out = Vec::new();
    for part in tokens.chunks(chunk.max(1)) {
        let mut seqs = [SeqInput {
            tokens: part,
            cache: &mut cache,
            logits: LogitsWanted::All,
        }];
        out.extend(model.forward(&mut seqs).unwrap().remove(0));
    }
    out
}

/// How far logits are from a reference.
pub struct Stats {
    /// `max |got - want| / max |want|`.
    pub max_rel_err: f32,
    /// Share of rows with the same argmax.
    pub top1_agree: f32,
}

pub fn compare(got: &[f32], want: &[f32], vocab: usize) -> Stats {
    assert_eq!(got.len(), want.len());
    let max_ref = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let max_err = got
        .iter()
        .zip(want)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    let argmax = |r: &[f32]| {
        r.iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i)
            .unwrap()
    };
    let rows = want.len() / vocab;
    let agree = got
        .chunks_exact(vocab)
        .zip(want.chunks_exact(vocab))
        .filter(|(g, w)| argmax(g) == argmax(w))
        .count();
    Stats {
        max_rel_err: max_err / max_ref,
        top1_agree: agree as f32 / rows as f32,
    }
}
