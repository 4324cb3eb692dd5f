//! The decoder as data, and the one order of its steps.
//!
//! [`LayerGraph`] says per layer which attention variant ([`GqaConfig`] or [`MlaConfig`],
//! with their optional parts: biases, q/k norms, window, compressed queries) and which
//! feed-forward block (a dense MLP, or a [`MoeConfig`] with its router, shared experts and
//! gate) the model runs, and whether the LM head is the embedding. It is built once per
//! model from the [`ModelConfig`] and the checkpoint. [`forward_pass`] runs a [`Decoder`] (one
//! backend's block-level steps) in the decoder's order: embed; per layer pre-norm
//! attention plus residual, pre-norm feed-forward into the residual; the caches take the
//! new positions; final norm and LM head over the rows whose logits are wanted.
//!
//! A key design decision made here is that backends implement steps, never the pass: the
//! CPU [`crate::Model`] and the accelerator model of `strata-exec` are both driven by
//! [`forward_pass`], and every variant of the graph is its own step, so a new variant (an
//! attention kind, a feed-forward block) fails to compile in each backend until it
//! implements it.

use crate::config::{AttentionConfig, FfnConfig, GqaConfig, MlaConfig, ModelConfig, MoeConfig};
use crate::names;
use crate::source::Source;

/// The blocks of one decoder layer.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerNode {
    /// Self-attention, after the pre-attention RMSNorm.
    pub attention: AttentionConfig,
    /// Feed-forward block, after the pre-FFN RMSNorm.
    pub ffn: FfnConfig,
}

/// Where the LM head's weights come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Head {
    /// The embedding matrix (`tie_word_embeddings` and no `lm_head` tensor stored).
    Tied,
    /// Its own `lm_head` tensor.
    Own,
}

/// A decoder-only model's structure: its layers' blocks and its head.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerGraph {
    layers: Vec<LayerNode>,
    head: Head,
}

impl LayerGraph {
    /// The graph of `config`'s model as stored in `src` (which tells whether a tied head
    /// was stored anyway).
    pub fn new(config: &ModelConfig, src: &Source) -> LayerGraph {
        let layers = config
            .layers
            .iter()
            .map(|ffn| LayerNode {
                attention: config.attention.clone(),
                ffn: ffn.clone(),
            })
            .collect();
        let stored = src.has(&format!("{}.weight", names::LM_HEAD));
        let head = if config.tie_word_embeddings && !stored {
            Head::Tied
        } else {
            Head::Own
        };
        LayerGraph { layers, head }
    }

    /// The decoder layers, first to last.
    pub fn layers(&self) -> &[LayerNode] {
        &self.layers
    }

    /// Where the LM head's weights come from.
    pub fn head(&self) -> Head {
        self.head
    }
}

/// Which RMSNorm weight a [`Decoder::rms_norm`] step applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Norm {
    /// Layer `i`'s norm before attention (`input_layernorm`).
    Attention(usize),
    /// Layer `i`'s norm before the feed-forward block (`post_attention_layernorm`).
    Ffn(usize),
    /// The final norm before the LM head.
    Final,
}

/// One backend's block-level steps of a forward pass over a batch of new tokens, which
/// [`forward_pass`] runs in the decoder's order. The implementor holds the pass's inputs (tokens,
/// caches, positions) and its model's weights, found by layer index.
pub trait Decoder {
    /// Activations `[rows, width]`: the residual stream and every block's output.
    type Act;
    /// What a step fails with.
    type Error;

    /// The embedding rows of the new tokens, `[T, hidden]`: the residual stream.
    fn embed(&mut self) -> Result<Self::Act, Self::Error>;
    /// `x` normalised with the weight `norm` names, as a new activation.
    fn rms_norm(&mut self, x: &Self::Act, norm: Norm) -> Result<Self::Act, Self::Error>;
    /// Grouped-query attention of `layer` over `h`, appending the new keys and values to
    /// the caches; returns the output projection `[T, hidden]`.
    fn gqa(
        &mut self,
        layer: usize,
        cfg: &GqaConfig,
        h: &Self::Act,
    ) -> Result<Self::Act, Self::Error>;
    /// Multi-head latent attention of `layer` over `h`, appending the new latents and
    /// rotary keys to the caches; returns the output projection `[T, hidden]`.
    fn mla(
        &mut self,
        layer: usize,
        cfg: &MlaConfig,
        h: &Self::Act,
    ) -> Result<Self::Act, Self::Error>;
    /// `x += y`: a block's output into the residual stream.
    fn add(&mut self, x: &mut Self::Act, y: Self::Act) -> Result<(), Self::Error>;
    /// `x += y`, then `x` normalised with the weight `norm` names: [`Decoder::add`] and
    /// [`Decoder::rms_norm`], which a backend may fuse (one device dispatch for both).
    fn add_rms_norm(
        &mut self,
        x: &mut Self::Act,
        y: Self::Act,
        norm: Norm,
    ) -> Result<Self::Act, Self::Error> {
        self.add(x, y)?;
        self.rms_norm(x, norm)
    }
    /// Adds `layer`'s dense MLP of `h` into the residual stream `x`.
    fn dense_mlp(
        &mut self,
        layer: usize,
        h: &Self::Act,
        x: &mut Self::Act,
    ) -> Result<(), Self::Error>;
    /// Adds `layer`'s mixture of experts of `h` (routed and shared experts) into the
    /// residual stream `x`.
    fn moe(
        &mut self,
        layer: usize,
        cfg: &MoeConfig,
        h: &Self::Act,
        x: &mut Self::Act,
    ) -> Result<(), Self::Error>;
    /// [`Decoder::moe`], then `x` normalised with the weight `norm` names (the next layer's
    /// attention norm), which a backend may fuse with the MoE's last add into `x`.
    fn moe_rms_norm(
        &mut self,
        layer: usize,
        cfg: &MoeConfig,
        h: &Self::Act,
        x: &mut Self::Act,
        norm: Norm,
    ) -> Result<Self::Act, Self::Error> {
        self.moe(layer, cfg, h, x)?;
        self.rms_norm(x, norm)
    }
    /// Every layer has run: the caches take the new positions.
    fn commit(&mut self) -> Result<(), Self::Error>;
    /// The rows of the final residual stream whose logits are wanted, one activation per
    /// output the pass returns (a sequence's rows, or only its last).
    fn wanted_rows(&mut self, x: Self::Act) -> Result<Vec<Self::Act>, Self::Error>;
    /// The LM head over normalised rows: logits `[rows, vocab]`.
    fn lm_head(&mut self, x: &Self::Act) -> Result<Self::Act, Self::Error>;
}

/// Runs `decoder` through `graph` in the decoder's order; returns the logits of each output
/// [`Decoder::wanted_rows`] names.
pub fn forward_pass<D: Decoder>(
    graph: &LayerGraph,
    decoder: &mut D,
) -> Result<Vec<D::Act>, D::Error> {
    let d = decoder;
    let mut x = d.embed()?;
    // The next layer's attention input, where the step before it made it.
    let mut next_h = None;
    for (i, layer) in graph.layers.iter().enumerate() {
        let h = match next_h.take() {
            Some(h) => h,
            None => d.rms_norm(&x, Norm::Attention(i))?,
        };
        let a = match &layer.attention {
            AttentionConfig::Gqa(cfg) => d.gqa(i, cfg, &h)?,
            AttentionConfig::Mla(cfg) => d.mla(i, cfg, &h)?,
        };
        let h = d.add_rms_norm(&mut x, a, Norm::Ffn(i))?;
        let next = (i + 1 < graph.layers.len()).then_some(Norm::Attention(i + 1));
        match (&layer.ffn, next) {
            (FfnConfig::Dense(_), _) => d.dense_mlp(i, &h, &mut x)?,
            (FfnConfig::Moe(cfg), Some(norm)) => {
                next_h = Some(d.moe_rms_norm(i, cfg, &h, &mut x, norm)?);
            }
            (FfnConfig::Moe(cfg), None) => d.moe(i, cfg, &h, &mut x)?,
        }
    }
    d.commit()?;
    let mut logits = Vec::new();
    for rows in d.wanted_rows(x)? {
        let xs = d.rms_norm(&rows, Norm::Final)?;
        logits.push(d.lm_head(&xs)?);
    }
    Ok(logits)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records the steps it is asked for; activations are row counts.
    #[derive(Default)]
    struct Trace(Vec<String>);

    impl Decoder for Trace {
        type Act = usize;
        type Error = ();
        fn embed(&mut self) -> Result<usize, ()> {
            self.0.push("embed".into());
            Ok(3)
        }
        fn rms_norm(&mut self, x: &usize, norm: Norm) -> Result<usize, ()> {
            self.0.push(format!("{norm:?}"));
            Ok(*x)
        }
        fn gqa(&mut self, layer: usize, _: &GqaConfig, h: &usize) -> Result<usize, ()> {
            self.0.push(format!("gqa {layer}"));
            Ok(*h)
        }
        fn mla(&mut self, layer: usize, _: &MlaConfig, h: &usize) -> Result<usize, ()> {
            self.0.push(format!("mla {layer}"));
            Ok(*h)
        }
        fn add(&mut self, _: &mut usize, _: usize) -> Result<(), ()> {
            self.0.push("add".into());
            Ok(())
        }
        fn dense_mlp(&mut self, layer: usize, _: &usize, _: &mut usize) -> Result<(), ()> {
            self.0.push(format!("dense {layer}"));
            Ok(())
        }
        fn moe(&mut self, layer: usize, _: &MoeConfig, _: &usize, _: &mut usize) -> Result<(), ()> {
            self.0.push(format!("moe {layer}"));
            Ok(())
        }
        fn commit(&mut self) -> Result<(), ()> {
            self.0.push("commit".into());
            Ok(())
        }
        fn wanted_rows(&mut self, x: usize) -> Result<Vec<usize>, ()> {
            Ok(vec![x, 1])
        }
        fn lm_head(&mut self, x: &usize) -> Result<usize, ()> {
            self.0.push(format!("head {x}"));
            Ok(*x)
        }
    }

    #[test]
    fn steps_run_in_the_decoders_order() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../models/strata-tiny-moe/config.json");
        let mut config = ModelConfig::load(&dir).unwrap();
        let moe = config.layers.iter().find_map(|l| match l {
            FfnConfig::Moe(m) => Some(m.clone()),
            FfnConfig::Dense(_) => None,
        });
        let moe = moe.expect("the tiny model has MoE layers");
        // A MoE layer followed by another (whose attention norm may come fused with the
        // MoE's last add) and a last one.
        config.layers = vec![
            FfnConfig::Dense(8),
            FfnConfig::Moe(moe.clone()),
            FfnConfig::Moe(moe),
        ];
        let graph = LayerGraph {
            layers: config
                .layers
                .iter()
                .map(|ffn| LayerNode {
                    attention: config.attention.clone(),
                    ffn: ffn.clone(),
                })
                .collect(),
            head: Head::Own,
        };
        let attn = match config.attention {
            AttentionConfig::Gqa(_) => "gqa",
            AttentionConfig::Mla(_) => "mla",
        };
        let mut trace = Trace::default();
        assert_eq!(forward_pass(&graph, &mut trace), Ok(vec![3, 1]));
        let want = [
            "embed".to_string(),
            "Attention(0)".into(),
            format!("{attn} 0"),
            "add".into(),
            "Ffn(0)".into(),
            "dense 0".into(),
            "Attention(1)".into(),
            format!("{attn} 1"),
            "add".into(),
            "Ffn(1)".into(),
            "moe 1".into(),
            "Attention(2)".into(),
            format!("{attn} 2"),
            "add".into(),
            "Ffn(2)".into(),
            "moe 2".into(),
            "commit".into(),
            "Final".into(),
            "head 3".into(),
            "Final".into(),
            "head 1".into(),
        ];
        assert_eq!(trace.0, want);
    }
}
