//! A decoder-only model: embedding, layers of attention and feed-forward blocks, final norm
//! and LM head, with a forward pass over a batch of sequences of different lengths.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use strata_formats::gguf::GgufFile;
use strata_formats::safetensors::Checkpoint;
use strata_formats::strata_file::StrataFile;

use crate::attention::{Attention, SeqSpan};
use crate::cache::KvCache;
use crate::config::{FfnConfig, ModelConfig};
use crate::graph::{self, Head, LayerGraph};
use crate::linear::{Linear, LoadOptions, Loader, Precision, Recording};
use crate::memory::MemoryPlan;
use crate::moe::{ExpertExecutor, Ffn, MoeBlock, Router};
use crate::names::{self, LayerNames};
use crate::rope::Rope;
use crate::routing::Routing;
use crate::source::Source;
use crate::{Error, Result};

mod pass;

/// The file name of a converted model inside its directory.
pub const STRATA_FILE: &str = "model.strata";

/// One decoder layer.
#[derive(Debug)]
pub struct Layer {
    attn_norm: Vec<f32>,
    /// Self-attention.
    pub attn: Attention,
    ffn_norm: Vec<f32>,
    /// Feed-forward block.
    pub ffn: Ffn,
}

/// Which logits a sequence wants back from a forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsWanted {
    /// Logits at every new position (`strata logits`, evaluation).
    All,
    /// Only at the last new position (generation).
    Last,
    /// None (a prefill chunk that is not the last).
    None,
}

/// One sequence's part of a batched forward pass.
#[derive(Debug)]
pub struct SeqInput<'a> {
    /// New tokens to run.
    pub tokens: &'a [u32],
    /// The sequence's cache; the new tokens are appended.
    pub cache: &'a mut KvCache,
    /// Which logits to return.
    pub logits: LogitsWanted,
}

/// Sees what the forward pass decides, layer by layer.
pub trait ForwardObserver {
    /// Called for every MoE layer `layer` with the batch layout, the routing of every row
    /// (`[T, k]` ids and weights) and the router's input `hidden: [T, hidden_size]`.
    fn on_routing(&mut self, layer: usize, spans: &[SeqSpan], routing: &Routing, hidden: &[f32]);
}

/// An observer that ignores everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoObserver;

impl ForwardObserver for NoObserver {
    fn on_routing(&mut self, _: usize, _: &[SeqSpan], _: &Routing, _: &[f32]) {}
}

/// Sees the routing of every [`Model::forward`] of the model it is installed on
/// ([`Model::set_routing_tap`]), from whichever thread runs it: a live view of expert
/// activity (the server's page) without the runtime threading an observer through.
/// It runs inside the forward pass, once per MoE layer, so it must be cheap.
pub trait RoutingTap: Send + Sync + fmt::Debug {
    /// Decoder layer `layer` (an MoE layer) routed the batch's rows as `routing` says.
    fn on_routing(&self, layer: usize, routing: &Routing);
}

/// Hands a [`RoutingTap`] what a [`ForwardObserver`] sees.
struct Tapped<'a>(&'a dyn RoutingTap);

impl ForwardObserver for Tapped<'_> {
    fn on_routing(&mut self, layer: usize, _: &[SeqSpan], routing: &Routing, _: &[f32]) {
        self.0.on_routing(layer, routing);
    }
}

/// Parameter and memory summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamCounts {
    /// All parameters.
    pub total: usize,
    /// Parameters used per token (routed experts counted top-k times).
    pub active: usize,
    /// Bytes of weights as loaded.
    pub weight_bytes: usize,
}

/// A loaded model.
#[derive(Debug)]
pub struct Model {
    /// Normalised configuration.
    pub config: ModelConfig,
    graph: LayerGraph,
    embed: Linear,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    lm_head: Option<Linear>,
    /// The LM head is the embedding matrix (possibly a packed copy of it).
    tied: bool,
    rope: Rope,
    attn_scale: f32,
    precision: Precision,
    memory: MemoryPlan,
    /// Set on a shared model, hence the lock (read once per forward pass).
    tap: RwLock<Option<Arc<dyn RoutingTap>>>,
}

impl Model {
    /// Loads a Hugging Face model directory (`config.json` + safetensors) or a `.gguf` file.
    /// `opts` is a [`Precision`] or full [`LoadOptions`] (expert weight format).
    pub fn load(path: &Path, opts: impl Into<LoadOptions>) -> Result<Model> {
        let (config, src) = open(path)?;
        Model::from_source(config, &src, opts.into())
    }

    /// Loads a Hugging Face model directory (`config.json` + safetensors).
    pub fn load_dir(dir: &Path, opts: impl Into<LoadOptions>) -> Result<Model> {
        Model::load(dir, opts)
    }

    /// Builds a model from a parsed config and its tensors.
    /// A converted model ([`Source::Strata`]) runs with the options it was converted with;
    /// `opts` is ignored for it.
    pub fn from_source(config: ModelConfig, src: &Source, opts: LoadOptions) -> Result<Model> {
        Model::from_source_with_progress(config, src, opts, &mut |_, _| {})
    }

    /// [`Model::from_source`], telling `progress` how far it has come: `(layers built,
    /// layers)`, before the first layer and after each. The model crate prints nothing;
    /// front ends draw it.
    pub fn from_source_with_progress(
        config: ModelConfig,
        src: &Source,
        opts: LoadOptions,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Model> {
        let opts = match src {
            Source::Strata(f) => LoadOptions::stored(f)?,
            _ => opts,
        };
        let memory = MemoryPlan::of(&config, src, opts);
        memory.check(
            0,
            "run a quantized GGUF (its blocks are used in place, not copied), leave out \
             --weights on a GGUF, or pick a smaller --weights",
        )?;
        let ld = Loader::new(src, opts).with_fp8_block(config.fp8_block);
        let mut model = Model::build(config, &ld, opts.precision, progress)?;
        model.memory = memory;
        Ok(model)
    }

    /// The model's memory plan: private and mapped weights, KV cache per position.
    pub fn memory(&self) -> MemoryPlan {
        self.memory
    }

    /// Builds a model from `src` as [`Model::from_source`] does, recording what the loader
    /// built for [`crate::linear::write_converted`] (`strata convert`).
    pub fn convert(
        config: ModelConfig,
        src: &Source,
        opts: LoadOptions,
    ) -> Result<(Model, Recording)> {
        Model::convert_with_progress(config, src, opts, &mut |_, _| {})
    }

    /// [`Model::convert`], telling `progress` how far it has come as
    /// [`Model::from_source_with_progress`] does.
    pub fn convert_with_progress(
        config: ModelConfig,
        src: &Source,
        opts: LoadOptions,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<(Model, Recording)> {
        let ld = Loader::new(src, opts)
            .with_fp8_block(config.fp8_block)
            .recording();
        let model = Model::build(config, &ld, opts.precision, progress)?;
        Ok((model, ld.into_recording()))
    }

    fn build(
        config: ModelConfig,
        ld: &Loader,
        precision: Precision,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Model> {
        let graph = LayerGraph::new(&config, ld.source());
        let n_layers = graph.layers().len();
        progress(0, n_layers);
        let h = config.hidden_size;
        let v = config.vocab_size;
        let embed = ld.linear(names::EMBED, v, h, false)?;
        let mut layers = Vec::with_capacity(n_layers);
        for (i, node) in graph.layers().iter().enumerate() {
            let n = LayerNames::new(i);
            let attn = Attention::load(ld, &n.attention(), &node.attention, h)?;
            let ffn = match &node.ffn {
                FfnConfig::Dense(inter) => Ffn::load_dense(ld, &n.dense_mlp(), h, *inter)?,
                FfnConfig::Moe(moe) => {
                    let names = n.moe(ld.source(), moe.shared.as_ref());
                    Ffn::Moe(MoeBlock::load(ld, &names, moe, h)?)
                }
            };
            layers.push(Layer {
                attn_norm: ld.f32(&n.attn_norm(), &[h])?,
                attn,
                ffn_norm: ld.f32(&n.ffn_norm(), &[h])?,
                ffn,
            });
            progress(i + 1, n_layers);
        }
        let norm = ld.f32(names::FINAL_NORM, &[h])?;
        let tied = graph.head() == Head::Tied;
        let lm_head = if tied {
            match ld.dense_format(&format!("{}.weight", names::EMBED)) {
                // ggml blocks serve both row lookups and the head's kernels in place.
                _ if embed.ggml().is_some() => None,
                // The packed kernels need their own layout: pack a copy of the embedding.
                Some(fmt) => Some(ld.packed_copy(names::EMBED, &embed, fmt)?),
                None => None,
            }
        } else {
            Some(ld.projection(names::LM_HEAD, v, h, false)?)
        };
        let rope = Rope::new(&config.rope);
        let attn_scale = config.attention_scale();
        Ok(Model {
            config,
            graph,
            embed,
            layers,
            norm,
            lm_head,
            tied,
            rope,
            attn_scale,
            precision,
            memory: MemoryPlan::default(),
            tap: RwLock::default(),
        })
    }

    /// Decoder layers.
    pub fn layers(&self) -> &[Layer] {
        &self.layers
    }

    /// The MoE blocks, in MoE layer order.
    pub fn moe_blocks(&self) -> Vec<&MoeBlock> {
        let blocks = self.layers.iter().filter_map(|l| match &l.ffn {
            Ffn::Moe(b) => Some(b),
            Ffn::Dense(_) => None,
        });
        blocks.collect()
    }

    fn moe_blocks_mut(&mut self) -> impl Iterator<Item = &mut MoeBlock> {
        self.layers.iter_mut().filter_map(|l| match &mut l.ffn {
            Ffn::Moe(b) => Some(b),
            Ffn::Dense(_) => None,
        })
    }

    /// Hands every MoE block's routed experts to `executor`, the `i`-th MoE block as MoE
    /// layer `i` (`None`: back to the fused CPU path).
    pub fn set_executor(&mut self, executor: Option<Arc<dyn ExpertExecutor>>) {
        for (i, block) in self.moe_blocks_mut().enumerate() {
            block.set_executor(i, executor.clone());
        }
    }

    /// Each MoE block's router, in MoE layer order (as [`Model::set_executor`] numbers them).
    pub fn moe_routers(&self) -> Vec<Router> {
        let blocks = self.moe_blocks().into_iter();
        blocks.map(|b| b.router().clone()).collect()
    }

    /// Keeps each token's best `2 * top_k` router candidates in every MoE block's routing
    /// (`false`: none, the default); policies such as HybriMoE score them.
    pub fn keep_candidates(&mut self, keep: bool) {
        for block in self.moe_blocks_mut() {
            block.set_candidates(if keep { 2 * block.cfg.router.top_k } else { 0 });
        }
    }

    /// The weights' numeric mode.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// An empty KV cache for one sequence.
    pub fn new_cache(&self) -> KvCache {
        let layers = self.graph.layers().iter();
        KvCache::new(layers.map(|l| l.attention.cache_widths()).collect())
    }

    /// Parameter counts and weight memory.
    pub fn param_counts(&self) -> ParamCounts {
        let h = self.config.hidden_size;
        let embed = self.embed.n_out * self.embed.k_in;
        let head = match (&self.lm_head, self.tied) {
            (Some(l), false) => l.n_out * l.k_in,
            _ => 0,
        };
        let mut total = embed + head + h;
        let mut active = total;
        let mut bytes =
            self.embed.weight_bytes() + self.lm_head.as_ref().map_or(0, Linear::weight_bytes);
        for (li, l) in self.layers.iter().enumerate() {
            let attn = l.attn.params() + 2 * h;
            total += attn;
            active += attn;
            bytes += l.attn.weight_bytes();
            match &l.ffn {
                Ffn::Dense(m) => {
                    let p = match &self.config.layers[li] {
                        FfnConfig::Dense(inter) => 3 * h * inter,
                        FfnConfig::Moe(_) => 0,
                    };
                    total += p;
                    active += p;
                    bytes += m.weight_bytes();
                }
                Ffn::Moe(m) => {
                    let (t, a) = m.params();
                    total += t;
                    active += a;
                    bytes += m.weight_bytes();
                }
            }
        }
        ParamCounts {
            total,
            active,
            weight_bytes: bytes,
        }
    }

    /// Runs the new tokens of every sequence through the model in one batch, appending to
    /// each sequence's cache. Returns, per sequence, the logits it asked for, row-major
    /// `[rows, vocab]`.
    /// Reports the routing to the [`RoutingTap`] installed, if any.
    pub fn forward(&self, seqs: &mut [SeqInput]) -> Result<Vec<Vec<f32>>> {
        // Cloned out so that the lock is not held through the pass.
        let tap = self.tap.read().ok().and_then(|t| t.clone());
        match tap {
            Some(tap) => self.forward_observed(seqs, &mut Tapped(&*tap)),
            None => self.forward_observed(seqs, &mut NoObserver),
        }
    }

    /// Installs `tap` (or removes the one installed with `None`): every later
    /// [`Model::forward`] reports its routing to it, on the thread that runs the pass.
    pub fn set_routing_tap(&self, tap: Option<Arc<dyn RoutingTap>>) {
        match self.tap.write() {
            Ok(mut t) => *t = tap,
            Err(poisoned) => *poisoned.into_inner() = tap,
        }
    }

    /// [`Model::forward`], reporting every MoE layer's routing to `observer` (routing
    /// traces for placement policies, predictors and the simulator).
    pub fn forward_observed(
        &self,
        seqs: &mut [SeqInput],
        observer: &mut dyn ForwardObserver,
    ) -> Result<Vec<Vec<f32>>> {
        let mut pass = pass::CpuPass::new(self, seqs, observer)?;
        graph::forward_pass(&self.graph, &mut pass)
    }
}

/// The MoE blocks of a checkpoint alone (router, routed and shared experts), in MoE layer
/// order, loaded as [`Model`] loads them (a GGUF's blocks used in place): for a backend
/// that runs everything else elsewhere and the routed experts here (the accelerator's
/// hybrid layout, `--device hybrid`).
pub fn load_moe_blocks(
    config: &ModelConfig,
    src: &Source,
    opts: LoadOptions,
) -> Result<Vec<MoeBlock>> {
    let opts = match src {
        Source::Strata(f) => LoadOptions::stored(f)?,
        _ => opts,
    };
    let ld = Loader::new(src, opts).with_fp8_block(config.fp8_block);
    let graph = LayerGraph::new(config, src);
    let mut blocks = Vec::new();
    for (i, node) in graph.layers().iter().enumerate() {
        if let FfnConfig::Moe(moe) = &node.ffn {
            let names = LayerNames::new(i).moe(src, moe.shared.as_ref());
            blocks.push(MoeBlock::load(&ld, &names, moe, config.hidden_size)?);
        }
    }
    Ok(blocks)
}

/// The one file a model at `path` maps: a converted directory's `model.strata`, else `path`.
pub fn mapped_file(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join(STRATA_FILE)
    } else {
        path.to_owned()
    }
}

/// Opens a model's config and tensors: a `.gguf` file, a converted `.strata` file (or a
/// directory holding `model.strata`), or a Hugging Face directory.
pub fn open(path: &Path) -> Result<(ModelConfig, Source)> {
    let strata = mapped_file(path);
    let named = strata.extension().is_some_and(|e| e == "strata");
    if strata.is_file() && (named || StrataFile::sniff(&strata)) {
        let f = StrataFile::open(&strata)?;
        let config = serde_json::from_value(f.config().clone()).map_err(|e| Error::Config {
            path: strata.clone(),
            message: format!("invalid stored model config: {e}"),
        })?;
        return Ok((config, Source::Strata(f)));
    }
    if path.is_file()
        && path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        let g = GgufFile::open(path)?;
        let config = crate::gguf::config_from_gguf(&g)?;
        return Ok((config, Source::Gguf(g)));
    }
    let config = ModelConfig::load(&path.join("config.json"))?;
    let ck = Checkpoint::open_dir(path)?;
    Ok((config, Source::Safetensors(ck)))
}
