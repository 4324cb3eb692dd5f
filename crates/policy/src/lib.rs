//! Placement, caching, prefetching and deferral policies for MoE inference on CPU + GPU.
//!
//! A [`Policy`] sees one MoE layer of one step at a time through a [`LayerView`]: the
//! routing of every token (expert ids and weights), the router input hidden states, the
//! experts resident on the GPU and the devices' queued work. It answers with a
//! [`Decision`]: which device computes each expert (and for which tokens, immediately or
//! deferred to the next layer), which weight copies to start and with what priority, and
//! which resident experts to evict. The [`CostModel`] prices every operation from cited
//! hardware and model presets.
//!
//! A key design decision: policies never touch memory or time. They are deterministic
//! functions of what they are shown (plus their own bookkeeping, such as LRU order or LFU
//! counts), so the runtime's executor and the simulator (`strata-sim`) get the same
//! decisions from the same inputs, and a policy can be tested on hand-made views.
//!
//! ```
//! use strata_policy::policies::GpuLru;
//! use strata_policy::{CostModel, Device, GpuView, Hardware, LayerView, ModelShape, Phase, Policy};
//! use strata_policy::{Transfer, TransferKind};
//!
//! // Qwen3-30B-A3B with BF16 experts on the SMoE paper's RTX 4090 machine (built-in presets).
//! let cost = CostModel::new(
//!     Hardware::load("smoe-4090")?,
//!     ModelShape::load("qwen3-30b-a3b")?,
//!     16.0,
//!     16.0,
//! )?;
//! // One decode token routed to experts 3 and 7 of the first MoE layer; 3 is on the GPU.
//! let mut resident = vec![false; cost.model.n_experts];
//! resident[3] = true;
//! let view = LayerView {
//!     layer: 0,
//!     n_moe_layers: cost.model.moe_layers(),
//!     phase: Phase::Decode,
//!     step: 0,
//!     top_k: 2,
//!     ids: &[3, 7],
//!     weights: &[0.6, 0.4],
//!     hidden: None,
//!     candidates: None,
//!     gpu: GpuView { resident: &resident, free_bytes: 1 << 30, busy_s: 0.0 },
//!     cpu_busy_s: 0.0,
//!     pcie_busy_s: 0.0,
//!     context: None,
//! };
//! // GPU-only with 8 cached experts per layer: both run on the GPU, 7 is copied on demand.
//! let decision = GpuLru::new(8).decide(&view, &cost);
//! decision.check(&view)?;
//! assert!(decision.tasks.iter().all(|t| t.device == Device::Gpu));
//! let copy = Transfer { layer: 0, expert: 7, kind: TransferKind::OnDemand, priority: 0 };
//! assert_eq!(decision.transfers, [copy]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]

mod cost;
mod decision;
pub mod layout;
pub mod policies;
pub mod predictor;
pub mod replacement;
pub mod rng;
pub mod slots;
pub mod stratify;
pub mod throughput;

pub use cost::{
    CostModel, CpuSpec, ExpertTable, GpuSpec, Hardware, ModelShape, NdpSpec, PcieSpec, SsdSpec,
};
pub use decision::{DecisionError, TransferPlan};
pub use layout::{Layout, Migration};

/// Errors of the policy crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A preset or configuration file is missing or malformed.
    #[error("{0}")]
    Preset(String),
    /// A policy was configured with values it cannot work with.
    #[error("policy {policy}: {msg}")]
    Config {
        /// The policy.
        policy: &'static str,
        /// What was wrong.
        msg: String,
    },
}

/// Result with the crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// A compute device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Device {
    /// The accelerator.
    Gpu,
    /// The host CPU.
    Cpu,
    /// A near-data-processing unit (issue #6).
    Ndp(u16),
}

/// The phase of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The prompt, all tokens at once.
    Prefill,
    /// One new token per sequence.
    Decode,
}

/// What the GPU holds for the layer being decided.
#[derive(Debug, Clone, Copy)]
pub struct GpuView<'a> {
    /// `resident[e]`: expert `e` of this layer is on the GPU or on its way (a copy in flight).
    pub resident: &'a [bool],
    /// Bytes of the expert budget not in use.
    pub free_bytes: u64,
    /// Seconds of GPU work queued ahead of this layer.
    pub busy_s: f64,
}

/// One MoE layer of one step, as a policy sees it.
#[derive(Debug, Clone, Copy)]
pub struct LayerView<'a> {
    /// MoE layer index, `0..n_moe_layers`.
    pub layer: usize,
    /// Number of MoE layers.
    pub n_moe_layers: usize,
    /// Prefill or decode.
    pub phase: Phase,
    /// Step number within the run.
    pub step: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Chosen experts, `[tokens * top_k]`, each token's in descending weight order.
    pub ids: &'a [u32],
    /// Their combine weights, `[tokens * top_k]`.
    pub weights: &'a [f32],
    /// Router input hidden states `[tokens * hidden_dim]`, when recorded.
    pub hidden: Option<&'a [f32]>,
    /// The router's best-scored experts per token (HybriMoE scores its top `2k`), when
    /// recorded; `None` in traces of format version 1.
    pub candidates: Option<Candidates<'a>>,
    /// The GPU's state.
    pub gpu: GpuView<'a>,
    /// Seconds of CPU work queued ahead of this layer.
    pub cpu_busy_s: f64,
    /// Seconds of copies queued on PCIe.
    pub pcie_busy_s: f64,
    /// Tokens in the KV cache that this step's attention reads, when the caller knows it
    /// (the simulator passes the context it prices attention with); `None` otherwise.
    pub context: Option<usize>,
}

/// Each token's `per_token` best-scored experts, best first, with their router scores
/// (softmax or sigmoid probabilities before bias, group limits and renormalisation).
#[derive(Debug, Clone, Copy)]
pub struct Candidates<'a> {
    /// Candidates per token.
    pub per_token: usize,
    /// Expert ids, `[tokens * per_token]`.
    pub ids: &'a [u32],
    /// Router scores, `[tokens * per_token]`.
    pub scores: &'a [f32],
}

impl LayerView<'_> {
    /// Tokens in the step.
    pub fn tokens(&self) -> usize {
        self.ids.len() / self.top_k.max(1)
    }

    /// Rows routed to each expert, `[n_experts]` of token indices.
    pub fn rows_per_expert(&self, n_experts: usize) -> Vec<Vec<u32>> {
        let mut rows = vec![Vec::new(); n_experts];
        for (i, &e) in self.ids.iter().enumerate() {
            if let Some(r) = rows.get_mut(e as usize) {
                r.push((i / self.top_k.max(1)) as u32);
            }
        }
        rows
    }

    /// Whether expert `e` is on the GPU (or arriving).
    pub fn is_resident(&self, e: u32) -> bool {
        self.gpu.resident.get(e as usize).copied().unwrap_or(false)
    }
}

/// Work for one expert on one device.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// Expert id within the layer.
    pub expert: u32,
    /// Where it runs.
    pub device: Device,
    /// Token rows it processes.
    pub rows: Vec<u32>,
    /// Its output is added one layer later (KTransformers' expert deferral).
    pub deferred: bool,
}

/// How a copied expert is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferKind {
    /// Needed by this layer now; stays resident afterwards.
    OnDemand,
    /// Needed by this layer now, streamed through one of two ping-pong buffers and dropped.
    Staged,
    /// For a later step or layer; resident when it lands.
    Prefetch,
}

/// A weight copy to the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfer {
    /// MoE layer of the expert.
    pub layer: usize,
    /// Expert id.
    pub expert: u32,
    /// How it is used.
    pub kind: TransferKind,
    /// Lower runs first on the link.
    pub priority: u32,
}

/// A resident expert to drop before the decision's copies start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Eviction {
    /// MoE layer.
    pub layer: usize,
    /// Expert id.
    pub expert: u32,
}

/// A policy's answer for one layer of one step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decision {
    /// Every routed (expert, token) pair of the layer, exactly once.
    pub tasks: Vec<Task>,
    /// Copies to start, in priority order.
    pub transfers: Vec<Transfer>,
    /// Residents to drop first.
    pub evictions: Vec<Eviction>,
    /// Experts predicted for this layer at the next step, when the policy predicts.
    pub predicted: Option<Vec<u32>>,
    /// Layout changes over the DIMM-Link, in order (machines with NDP DIMMs).
    pub migrations: Vec<Migration>,
    /// Predicted tokens per expert of this layer at the next step, `[n_experts]`, when the
    /// policy predicts loads (TriMoE's EMA); the simulator scores it against the loads
    /// that step realises.
    pub predicted_load: Option<Vec<f64>>,
}

/// A placement policy.
pub trait Policy {
    /// Short name (`ktransformers`, `smoe`, ...).
    fn name(&self) -> String;

    /// Experts to place on the GPU before the first step, `(moe_layer, expert)`.
    fn initial_residency(&mut self, _cost: &CostModel) -> Vec<(usize, u32)> {
        Vec::new()
    }

    /// The weight layout of every routed expert before the first step, when the policy
    /// manages layouts (NDP machines): `Some` of the experts not striped, `(moe_layer,
    /// expert, layout)`. `None` (the default): layouts are not modelled.
    fn initial_layout(&mut self, _cost: &CostModel) -> Option<Vec<(usize, u32, Layout)>> {
        None
    }

    /// Decides one MoE layer of one step.
    fn decide(&mut self, view: &LayerView, cost: &CostModel) -> Decision;

    /// Whether [`Policy::decide`] reads [`LayerView::candidates`] (the router's best `2k`
    /// per token). They cost the accelerator's hybrid layout a pass of the router on the
    /// host every MoE layer, so an engine computes them only for a policy that reads them.
    fn reads_candidates(&self) -> bool {
        false
    }
}

/// Groups a layer's routing into one task per expert on the device `place` picks.
pub fn tasks_by_expert(
    view: &LayerView,
    n_experts: usize,
    mut place: impl FnMut(u32, usize) -> Device,
) -> Vec<Task> {
    view.rows_per_expert(n_experts)
        .into_iter()
        .enumerate()
        .filter(|(_, r)| !r.is_empty())
        .map(|(e, rows)| Task {
            expert: e as u32,
            device: place(e as u32, rows.len()),
            rows,
            deferred: false,
        })
        .collect()
}
