//! The CPU's steps of the layer graph: one [`Model::forward_observed`] pass over a batch of
//! sequences of different lengths, driven by [`crate::graph::forward_pass`].

use super::{ForwardObserver, LogitsWanted, Model, SeqInput};
use crate::attention::{Attention, Batch, SeqSpan};
use crate::cache::LayerCache;
use crate::config::{GqaConfig, MlaConfig, MoeConfig};
use crate::graph::{Decoder, Norm};
use crate::moe::Ffn;
use crate::ops::{add_assign, rms_norm};
use crate::{Error, Result};

/// One forward pass of `model` over `seqs`, rows flattened in the order of the sequences.
pub(super) struct CpuPass<'p, 's> {
    model: &'p Model,
    seqs: &'p mut [SeqInput<'s>],
    observer: &'p mut dyn ForwardObserver,
    batch: Batch<'p>,
}

impl<'p, 's> CpuPass<'p, 's> {
    /// Lays out the batch; fails on a token id outside the vocabulary.
    pub(super) fn new(
        model: &'p Model,
        seqs: &'p mut [SeqInput<'s>],
        observer: &'p mut dyn ForwardObserver,
    ) -> Result<Self> {
        let v = model.config.vocab_size;
        let mut spans = Vec::with_capacity(seqs.len());
        let mut row = 0;
        for s in seqs.iter() {
            if let Some(&bad) = s.tokens.iter().find(|&&t| t as usize >= v) {
                return Err(Error::Input(format!(
                    "token id {bad} is out of range for a vocabulary of {v}"
                )));
            }
            spans.push(SeqSpan {
                row,
                len: s.tokens.len(),
                start_pos: s.cache.len(),
            });
            row += s.tokens.len();
        }
        let positions = spans
            .iter()
            .flat_map(|s| s.start_pos..s.start_pos + s.len)
            .collect();
        let batch = Batch {
            t: row,
            positions,
            spans,
            rope: &model.rope,
            scale: model.attn_scale,
            eps: model.config.rms_norm_eps,
        };
        Ok(CpuPass {
            model,
            seqs,
            observer,
            batch,
        })
    }

    /// Every sequence's cache of layer `layer`.
    fn caches<'c>(seqs: &'c mut [SeqInput<'s>], layer: usize) -> Vec<&'c mut LayerCache> {
        seqs.iter_mut()
            .map(|s| &mut s.cache.layers[layer])
            .collect()
    }

    /// The graph gave layer `layer` a `block` its weights were not loaded for (the graph
    /// and the weights come from one config, so this is a bug, not bad input).
    fn mismatch(layer: usize, block: &str) -> Error {
        Error::Input(format!(
            "layer {layer}: the layer graph's {block} differs from the loaded weights'"
        ))
    }
}

impl Decoder for CpuPass<'_, '_> {
    type Act = Vec<f32>;
    type Error = Error;

    fn embed(&mut self) -> Result<Vec<f32>> {
        let h = self.model.config.hidden_size;
        let mut x = vec![0.0f32; self.batch.t * h];
        let tokens = self.seqs.iter().flat_map(|s| s.tokens.iter());
        for (tok, xr) in tokens.zip(x.chunks_exact_mut(h)) {
            self.model.embed.row_f32(*tok as usize, xr);
        }
        Ok(x)
    }

    fn rms_norm(&mut self, x: &Vec<f32>, norm: Norm) -> Result<Vec<f32>> {
        let m = self.model;
        let w = match norm {
            Norm::Attention(i) => &m.layers[i].attn_norm,
            Norm::Ffn(i) => &m.layers[i].ffn_norm,
            Norm::Final => &m.norm,
        };
        let mut hs = x.clone();
        rms_norm(&mut hs, w, m.config.rms_norm_eps);
        Ok(hs)
    }

    fn gqa(&mut self, layer: usize, cfg: &GqaConfig, h: &Vec<f32>) -> Result<Vec<f32>> {
        let Attention::Gqa(a) = &self.model.layers[layer].attn else {
            return Err(Self::mismatch(layer, "attention"));
        };
        Ok(a.forward(cfg, h, &self.batch, &mut Self::caches(self.seqs, layer)))
    }

    fn mla(&mut self, layer: usize, cfg: &MlaConfig, h: &Vec<f32>) -> Result<Vec<f32>> {
        let Attention::Mla(a) = &self.model.layers[layer].attn else {
            return Err(Self::mismatch(layer, "attention"));
        };
        Ok(a.forward(cfg, h, &self.batch, &mut Self::caches(self.seqs, layer)))
    }

    fn add(&mut self, x: &mut Vec<f32>, y: Vec<f32>) -> Result<()> {
        add_assign(x, &y);
        Ok(())
    }

    fn dense_mlp(&mut self, layer: usize, h: &Vec<f32>, x: &mut Vec<f32>) -> Result<()> {
        let Ffn::Dense(mlp) = &self.model.layers[layer].ffn else {
            return Err(Self::mismatch(layer, "feed-forward block"));
        };
        add_assign(x, &mlp.dense(h, self.batch.t)?);
        Ok(())
    }

    fn moe(&mut self, layer: usize, _: &MoeConfig, h: &Vec<f32>, x: &mut Vec<f32>) -> Result<()> {
        let Ffn::Moe(moe) = &self.model.layers[layer].ffn else {
            return Err(Self::mismatch(layer, "feed-forward block"));
        };
        let routing = moe.route(h, self.batch.t);
        self.observer
            .on_routing(layer, &self.batch.spans, &routing, h);
        add_assign(
            x,
            &moe.forward_routed(h, self.batch.t, &routing, &self.batch.spans)?,
        );
        Ok(())
    }

    fn commit(&mut self) -> Result<()> {
        for s in self.seqs.iter_mut() {
            s.cache.advance(s.tokens.len());
        }
        Ok(())
    }

    fn wanted_rows(&mut self, x: Vec<f32>) -> Result<Vec<Vec<f32>>> {
        let h = self.model.config.hidden_size;
        let rows = self.seqs.iter().zip(&self.batch.spans).map(|(s, span)| {
            let rows = match s.logits {
                LogitsWanted::All => span.row..span.row + span.len,
                LogitsWanted::Last if span.len > 0 => span.row + span.len - 1..span.row + span.len,
                _ => 0..0,
            };
            x[rows.start * h..rows.end * h].to_vec()
        });
        Ok(rows.collect())
    }

    fn lm_head(&mut self, x: &Vec<f32>) -> Result<Vec<f32>> {
        let m = self.model;
        let head = m.lm_head.as_ref().unwrap_or(&m.embed);
        Ok(head.forward(x, x.len() / m.config.hidden_size))
    }
}
