//! The cost model: hardware and model presets, and the time of every operation the
//! policies and the simulator reason about.
//!
//! Key types: [`Hardware`] (GPU, CPU, PCIe and optional NDP numbers), [`ModelShape`] (the
//! shapes that matter for cost), [`CostModel`] (both, plus the expert weight precision).
//! Times are a roofline per operation: `overhead + max(flops / peak, bytes / bandwidth)`.
//!
//! A key design decision: every number lives in `presets/*.json`, each hardware number
//! beside its source, and nothing else in the crate holds a hardware constant. The
//! presets are compiled in with `include_str!` so the binary is self-contained, and any
//! other file of the same shape (or a Hugging Face `config.json`) can be loaded at run time.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::{Device, Error, Result};

const HARDWARE_PRESETS: &str = include_str!("../presets/hardware.json");
const MODEL_PRESETS: &str = include_str!("../presets/models.json");

/// A GPU's numbers.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct GpuSpec {
    /// Marketing name.
    pub name: String,
    /// Dense tensor-core FLOP/s at the weights' compute precision.
    pub flops: f64,
    /// Device memory bandwidth, bytes/s.
    pub mem_bw: f64,
    /// Device memory, bytes.
    pub mem_bytes: f64,
    /// Memory kept for KV cache, activations and context, bytes.
    pub reserve_bytes: f64,
    /// Fixed GPU time per transformer layer (kernel launches), seconds.
    pub layer_overhead_s: f64,
}

/// A CPU's numbers (all sockets together).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct CpuSpec {
    /// Name.
    pub name: String,
    /// FLOP/s of the matrix path (AMX) for experts with many tokens.
    pub matmul_flops: f64,
    /// FLOP/s of the vector path (AVX-512) for experts with few tokens.
    pub vector_flops: f64,
    /// Tokens per expert from which the matrix path is used.
    pub amx_min_tokens: u32,
    /// Achieved memory bandwidth, bytes/s.
    pub mem_bw: f64,
    /// Fixed time per expert task, seconds.
    pub task_overhead_s: f64,
    /// Measured expert times, used instead of the roofline for the expert shape it was
    /// measured on.
    #[serde(default)]
    pub expert_table: Option<ExpertTable>,
}

/// Measured CPU time of one routed expert against the tokens it processes (from
/// `strata bench moe`), for one expert shape and precision.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct ExpertTable {
    /// Hidden size of the measured expert.
    pub hidden: usize,
    /// Its intermediate size.
    pub moe_intermediate: usize,
    /// Bits per weight measured.
    pub bits: f64,
    /// `[tokens, seconds]` points, tokens increasing.
    pub points: Vec<[f64; 2]>,
}

impl ExpertTable {
    /// Piecewise-linear time for `tokens`; beyond the last point, proportional to tokens.
    pub fn time(&self, tokens: f64) -> Option<f64> {
        let p = &self.points;
        let first = p.first()?;
        if tokens <= first[0] {
            return Some(first[1]);
        }
        for w in p.windows(2) {
            let ([t0, s0], [t1, s1]) = (w[0], w[1]);
            if tokens <= t1 && t1 > t0 {
                return Some(s0 + (s1 - s0) * (tokens - t0) / (t1 - t0));
            }
        }
        let last = p.last()?;
        Some(last[1] * tokens / last[0].max(1.0))
    }
}

/// The host-to-device link.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct PcieSpec {
    /// Achieved host-to-device bandwidth, bytes/s.
    pub bw: f64,
    /// Fixed time per copy, seconds.
    pub latency_s: f64,
}

/// Near-data-processing DIMMs (issue #6; unused by the latency policies).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct NdpSpec {
    /// Number of NDP units.
    pub units: u32,
    /// FLOP/s per unit.
    pub flops: f64,
    /// Internal bandwidth per unit, bytes/s.
    pub mem_bw: f64,
    /// Inter-DIMM link bandwidth, bytes/s.
    pub link_bw: f64,
    /// DIMMs in the machine, with or without an NDP unit (0: as many as `units`). The
    /// host's memory bandwidth is shared evenly among them, which prices reads of an
    /// expert whose weights sit on one DIMM (`crate::layout`).
    #[serde(default)]
    pub dimms: u32,
}

/// The drive a model larger than memory is read from (issue #29's SSD tier).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct SsdSpec {
    /// Achieved read bandwidth with many direct reads of whole experts in flight, bytes/s.
    pub read_bw: f64,
    /// Fixed time per read, seconds (paid once per batch of reads in flight together).
    pub latency_s: f64,
}

/// One machine.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Hardware {
    /// What the machine is and where it is described.
    pub description: String,
    /// The accelerator.
    pub gpu: GpuSpec,
    /// The host CPU.
    pub cpu: CpuSpec,
    /// The host-to-device link.
    pub pcie: PcieSpec,
    /// Near-data processors, if any.
    #[serde(default)]
    pub ndp: Option<NdpSpec>,
    /// The drive the model file is read from, where measured.
    #[serde(default)]
    pub ssd: Option<SsdSpec>,
    /// CPU-GPU synchronisation and activation copy per MoE layer, seconds.
    pub sync_s: f64,
    /// Where each number comes from, keyed `gpu.flops`, `cpu.mem_bw`, ...
    pub sources: BTreeMap<String, String>,
}

/// The shape of a MoE model, as far as cost goes.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct ModelShape {
    /// Hidden size.
    pub hidden: usize,
    /// Intermediate size of one routed expert.
    pub moe_intermediate: usize,
    /// Routed experts per MoE layer.
    pub n_experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Shared experts per MoE layer (each `moe_intermediate` wide).
    pub n_shared: usize,
    /// Transformer layers.
    pub n_layers: usize,
    /// Leading layers with a dense MLP instead of a MoE block.
    pub dense_layers: usize,
    /// Intermediate size of the dense MLP layers.
    pub dense_intermediate: usize,
    /// Attention parameters per layer.
    pub attn_params: u64,
    /// Attention heads.
    pub n_heads: usize,
    /// Query/key head dimension.
    pub head_dim: usize,
    /// Key and value elements cached per token per layer, K and V together (grouped-query
    /// attention: `2 * kv_heads * head_dim`; MLA: the compressed latent plus the rope key).
    /// 0 means `2 * n_heads * head_dim` (plain multi-head attention).
    #[serde(default)]
    pub kv_dim: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Where the shape comes from.
    #[serde(default)]
    pub source: String,
}

fn parse_presets<T: for<'de> Deserialize<'de>>(
    text: &str,
    what: &str,
) -> Result<BTreeMap<String, T>> {
    let raw: BTreeMap<String, serde_json::Value> = serde_json::from_str(text)
        .map_err(|e| Error::Preset(format!("{what} presets are not valid JSON: {e}")))?;
    raw.into_iter()
        .filter(|(k, _)| !k.starts_with('_'))
        .map(|(k, v)| {
            let parsed = serde_json::from_value(v)
                .map_err(|e| Error::Preset(format!("{what} preset {k:?}: {e}")))?;
            Ok((k, parsed))
        })
        .collect()
}

impl Hardware {
    /// The built-in hardware presets by name.
    pub fn presets() -> Result<BTreeMap<String, Hardware>> {
        parse_presets(HARDWARE_PRESETS, "hardware")
    }

    /// A preset by name, or a JSON file of one preset's shape.
    pub fn load(name_or_path: &str) -> Result<Hardware> {
        let presets = Self::presets()?;
        if let Some(h) = presets.get(name_or_path) {
            return Ok(h.clone());
        }
        let path = Path::new(name_or_path);
        if path.is_file() {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Error::Preset(format!("reading {}: {e}", path.display())))?;
            return serde_json::from_str(&text)
                .map_err(|e| Error::Preset(format!("hardware file {}: {e}", path.display())));
        }
        Err(Error::Preset(format!(
            "unknown hardware {name_or_path:?}, expected a file or one of {:?}",
            presets.keys().collect::<Vec<_>>()
        )))
    }

    /// Names of numeric fields that have no entry in `sources`.
    pub fn unsourced(&self) -> Vec<&'static str> {
        let mut keys = vec![
            "gpu.flops",
            "gpu.mem_bw",
            "gpu.mem_bytes",
            "gpu.reserve_bytes",
            "gpu.layer_overhead_s",
            "cpu.matmul_flops",
            "cpu.vector_flops",
            "cpu.amx_min_tokens",
            "cpu.mem_bw",
            "cpu.task_overhead_s",
            "pcie.bw",
            "pcie.latency_s",
            "sync_s",
        ];
        if self.cpu.expert_table.is_some() {
            keys.push("cpu.expert_table");
        }
        if self.ndp.is_some() {
            keys.extend(["ndp.units", "ndp.flops", "ndp.mem_bw", "ndp.link_bw"]);
            if self.ndp.as_ref().is_some_and(|n| n.dimms > 0) {
                keys.push("ndp.dimms");
            }
        }
        if self.ssd.is_some() {
            keys.extend(["ssd.read_bw", "ssd.latency_s"]);
        }
        keys.into_iter()
            .filter(|k| !self.sources.contains_key(*k))
            .collect()
    }
}

impl ModelShape {
    /// The built-in model presets by name.
    pub fn presets() -> Result<BTreeMap<String, ModelShape>> {
        parse_presets(MODEL_PRESETS, "model")
    }

    /// A preset by name. A real model's shape comes from its own config, read by
    /// `strata-model` (`strata_exec::resolve_model_shape`), never parsed here a second time.
    pub fn load(name: &str) -> Result<ModelShape> {
        let presets = Self::presets()?;
        presets.get(name).cloned().ok_or_else(|| {
            Error::Preset(format!(
                "unknown model preset {name:?}, expected one of {:?}",
                presets.keys().collect::<Vec<_>>()
            ))
        })
    }

    /// Key and value elements cached per token per layer (`kv_dim`, or plain multi-head
    /// attention's `2 * n_heads * head_dim` when the preset leaves it 0).
    pub fn kv_elems(&self) -> usize {
        if self.kv_dim > 0 {
            self.kv_dim
        } else {
            2 * self.n_heads * self.head_dim
        }
    }

    /// MoE layers.
    pub fn moe_layers(&self) -> usize {
        self.n_layers.saturating_sub(self.dense_layers)
    }

    /// Parameters of one routed expert (gate, up, down).
    pub fn expert_params(&self) -> u64 {
        3 * self.hidden as u64 * self.moe_intermediate as u64
    }

    /// Parameters that stay on the GPU: attention, shared experts, routers, dense MLPs,
    /// embedding and head.
    pub fn gpu_params(&self) -> u64 {
        let l = self.n_layers as u64;
        let moe = self.moe_layers() as u64;
        let h = self.hidden as u64;
        l * self.attn_params
            + moe * (self.n_shared as u64 * self.expert_params() + h * self.n_experts as u64)
            + self.dense_layers as u64 * 3 * h * self.dense_intermediate as u64
            + 2 * h * self.vocab as u64
    }
}

/// Hardware, model and weight precision together: what every operation costs.
#[derive(Debug, Clone, PartialEq)]
pub struct CostModel {
    /// The machine.
    pub hw: Hardware,
    /// The model.
    pub model: ModelShape,
    /// Bits per routed-expert weight (16 for BF16, ~4.25 for IQ4_XS/Q4_K).
    pub expert_bits: f64,
    /// Bits per weight of everything on the GPU.
    pub gpu_bits: f64,
}

impl CostModel {
    /// A cost model; `expert_bits` and `gpu_bits` are the weights' precisions.
    pub fn new(hw: Hardware, model: ModelShape, expert_bits: f64, gpu_bits: f64) -> Result<Self> {
        if !(expert_bits > 0.0 && gpu_bits > 0.0) {
            return Err(Error::Preset(format!(
                "weight bits must be positive, got experts {expert_bits} and gpu {gpu_bits}"
            )));
        }
        if model.top_k == 0 || model.top_k > model.n_experts {
            return Err(Error::Preset(format!(
                "top_k must be in 1..={}, got {}",
                model.n_experts, model.top_k
            )));
        }
        Ok(Self {
            hw,
            model,
            expert_bits,
            gpu_bits,
        })
    }

    /// Bytes of one routed expert's weights.
    pub fn expert_bytes(&self) -> u64 {
        (self.model.expert_params() as f64 * self.expert_bits / 8.0).ceil() as u64
    }

    /// Bytes of the GPU-resident non-expert weights.
    pub fn gpu_weight_bytes(&self) -> u64 {
        (self.model.gpu_params() as f64 * self.gpu_bits / 8.0).ceil() as u64
    }

    /// GPU bytes left for routed experts after weights and the reserve (0 if none).
    pub fn gpu_expert_budget(&self) -> u64 {
        let left =
            self.hw.gpu.mem_bytes - self.hw.gpu.reserve_bytes - self.gpu_weight_bytes() as f64;
        left.max(0.0) as u64
    }

    /// Routed experts per MoE layer that fit in the budget, split evenly over layers.
    pub fn cache_slots_per_layer(&self) -> usize {
        let per_layer = self.model.moe_layers() as u64 * self.expert_bytes();
        if per_layer == 0 {
            return 0;
        }
        ((self.gpu_expert_budget() / per_layer) as usize).min(self.model.n_experts)
    }

    /// Time for one routed expert to process `tokens` tokens on `device`.
    pub fn expert_time(&self, device: Device, tokens: u32) -> f64 {
        if tokens == 0 {
            return 0.0;
        }
        let flops = 2.0 * self.model.expert_params() as f64 * tokens as f64;
        let bytes = self.expert_bytes() as f64;
        match device {
            Device::Gpu => (flops / self.hw.gpu.flops).max(bytes / self.hw.gpu.mem_bw),
            Device::Cpu => {
                let c = &self.hw.cpu;
                if let Some(t) = c.expert_table.as_ref().filter(|t| {
                    t.hidden == self.model.hidden
                        && t.moe_intermediate == self.model.moe_intermediate
                        && (t.bits - self.expert_bits).abs() < 1e-6
                }) && let Some(s) = t.time(tokens as f64)
                {
                    return s;
                }
                let peak = if tokens >= c.amx_min_tokens {
                    c.matmul_flops
                } else {
                    c.vector_flops
                };
                c.task_overhead_s + (flops / peak).max(bytes / c.mem_bw)
            }
            Device::Ndp(_) => match &self.hw.ndp {
                Some(n) => (flops / n.flops).max(bytes / n.mem_bw),
                None => f64::INFINITY,
            },
        }
    }

    /// Time to copy `bytes` host to device.
    pub fn transfer_time(&self, bytes: u64) -> f64 {
        self.hw.pcie.latency_s + bytes as f64 / self.hw.pcie.bw
    }

    /// Time to copy one routed expert to the GPU.
    pub fn expert_transfer_time(&self) -> f64 {
        self.transfer_time(self.expert_bytes())
    }

    /// Whether the machine has a GPU (`gpu.mem_bytes > 0`). Without one, attention, dense
    /// layers, shared experts and the head run on the CPU at its roofline.
    pub fn has_gpu(&self) -> bool {
        self.hw.gpu.mem_bytes > 0.0
    }

    /// Device of the non-expert work (attention, shared experts, dense layers, head).
    pub fn dense_device(&self) -> Device {
        if self.has_gpu() {
            Device::Gpu
        } else {
            Device::Cpu
        }
    }

    fn dense_peaks(&self) -> (f64, f64) {
        if self.has_gpu() {
            (self.hw.gpu.flops, self.hw.gpu.mem_bw)
        } else {
            (self.hw.cpu.matmul_flops, self.hw.cpu.mem_bw)
        }
    }

    fn gpu_matmul(&self, params: u64, tokens: usize) -> f64 {
        let flops = 2.0 * params as f64 * tokens as f64;
        let bytes = params as f64 * self.gpu_bits / 8.0;
        let (peak, bw) = self.dense_peaks();
        (flops / peak).max(bytes / bw)
    }

    /// Time of one layer's attention (with router, on the GPU, or the CPU without one) for `tokens` new tokens attending
    /// to `context` positions on average, including the per-layer launch overhead.
    pub fn attention_time(&self, tokens: usize, context: usize) -> f64 {
        let m = &self.model;
        let router = if self.model.n_experts > 0 {
            m.hidden as u64 * m.n_experts as u64
        } else {
            0
        };
        let proj = self.gpu_matmul(m.attn_params + router, tokens);
        let score_flops = 4.0 * tokens as f64 * context as f64 * (m.n_heads * m.head_dim) as f64;
        let overhead = if self.has_gpu() {
            self.hw.gpu.layer_overhead_s
        } else {
            0.0
        };
        overhead + proj + score_flops / self.dense_peaks().0
    }

    /// GPU time of a layer's shared experts.
    pub fn shared_time(&self, tokens: usize) -> f64 {
        if self.model.n_shared == 0 {
            return 0.0;
        }
        self.gpu_matmul(
            self.model.n_shared as u64 * self.model.expert_params(),
            tokens,
        )
    }

    /// GPU time of a dense MLP layer.
    pub fn dense_mlp_time(&self, tokens: usize) -> f64 {
        self.gpu_matmul(
            3 * self.model.hidden as u64 * self.model.dense_intermediate as u64,
            tokens,
        )
    }

    /// GPU time of the LM head for `tokens` rows.
    pub fn head_time(&self, tokens: usize) -> f64 {
        self.gpu_matmul(self.model.hidden as u64 * self.model.vocab as u64, tokens)
    }

    /// GPU time of a linear expert predictor (`hidden -> n_experts`) for `tokens` rows.
    pub fn predictor_time(&self, tokens: usize) -> f64 {
        self.gpu_matmul(
            self.model.hidden as u64 * self.model.n_experts as u64,
            tokens,
        )
    }
}
