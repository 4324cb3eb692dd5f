//! The host copy of the routed experts that transfers read from: the checkpoint itself,
//! mapped, read one expert at a time in the slot's storage type. A converted model
//! (`strata convert`) is read from its packed experts: BF16 ones stay BF16, int8/int4
//! ones are dequantized to f32 (the values the CPU kernels use).
//!
//! A key design decision: weights are read from the mapped checkpoint (the same bytes the
//! CPU path was built from) at the moment of each transfer instead of keeping a second
//! encoded copy of every expert in host memory: an upload reads and converts one expert,
//! which is what a pinned staging copy would cost on a real PCIe link anyway.

use std::path::Path;

use strata_accel::{ExpertSlots, WeightType};
use strata_model::config::{Arch, FfnConfig, ModelConfig};
use strata_model::source::Source;

use crate::{Error, Result};

/// How one MoE layer stores its experts.
#[derive(Debug, Clone)]
enum Layout {
    /// `{mlp}.experts.gate_up_proj: [E, 2I, H]`, `{mlp}.experts.down_proj: [E, H, I]`.
    Stacked(String),
    /// `{mlp}.experts.{e}.{gate,up,down}.weight` with these three names.
    PerExpert(String, [&'static str; 3]),
    /// A converted model's `{mlp}.experts.{e}.gate_up` and `.down` (packed) or `.gate`,
    /// `.up`, `.down` (plain), read by [`strata_accel::model::converted_expert`].
    Converted(String),
}

/// The routed experts of every MoE layer, readable one expert at a time.
#[derive(Debug)]
pub struct HostExperts {
    src: Source,
    fp8_block: Option<[usize; 2]>,
    layers: Vec<Layout>,
    hidden: usize,
    inter: usize,
    n_experts: usize,
    wtype: WeightType,
}

impl HostExperts {
    /// Opens the checkpoint at `path` (a model directory, `.gguf` or converted model).
    pub fn open(path: &Path) -> Result<HostExperts> {
        let (config, src) = strata_model::model::open(path)?;
        HostExperts::from_source(&config, src)
    }

    /// The experts of `config`'s MoE layers in `src`.
    pub fn from_source(config: &ModelConfig, src: Source) -> Result<HostExperts> {
        let mut layers = Vec::new();
        let mut shape = None;
        for (i, ffn) in config.layers.iter().enumerate() {
            let FfnConfig::Moe(moe) = ffn else { continue };
            let p = format!("model.layers.{i}");
            let mlp = if config.arch == Arch::Mixtral
                && src.has(&format!("{p}.block_sparse_moe.gate.weight"))
            {
                format!("{p}.block_sparse_moe")
            } else {
                format!("{p}.mlp")
            };
            layers.push(if let Source::Strata(_) = src {
                Layout::Converted(mlp)
            } else if src.has(&format!("{mlp}.experts.gate_up_proj")) {
                Layout::Stacked(mlp)
            } else if src.has(&format!("{mlp}.experts.0.w1.weight")) {
                Layout::PerExpert(mlp, ["w1", "w3", "w2"])
            } else {
                Layout::PerExpert(mlp, ["gate_proj", "up_proj", "down_proj"])
            });
            shape.get_or_insert((moe.router.n_experts, moe.intermediate));
        }
        let Some((n_experts, inter)) = shape else {
            return Err(Error::Config(
                "the model has no mixture-of-experts layer".into(),
            ));
        };
        let mut host = HostExperts {
            src,
            fp8_block: config.fp8_block,
            layers,
            hidden: config.hidden_size,
            inter,
            n_experts,
            wtype: WeightType::F32,
        };
        host.wtype = match host.first_tensor_dtype()?.as_str() {
            "BF16" | "packed bf16" => WeightType::Bf16,
            "F16" => WeightType::F16,
            _ => WeightType::F32,
        };
        Ok(host)
    }

    fn first_tensor_dtype(&self) -> Result<String> {
        let name = match &self.layers[0] {
            Layout::Stacked(mlp) => format!("{mlp}.experts.gate_up_proj"),
            Layout::PerExpert(mlp, names) => format!("{mlp}.experts.0.{}.weight", names[0]),
            Layout::Converted(mlp) => {
                let packed = format!("{mlp}.experts.0.gate_up");
                if self.src.has(&packed) {
                    packed
                } else {
                    format!("{mlp}.experts.0.gate")
                }
            }
        };
        Ok(self.src.tensor(&name)?.dtype_name())
    }

    /// MoE layers.
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// Experts per layer.
    pub fn n_experts(&self) -> usize {
        self.n_experts
    }

    /// Residual width.
    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// Expert intermediate size.
    pub fn inter(&self) -> usize {
        self.inter
    }

    /// Storage type on the device: the checkpoint's own when it is BF16 or F16 (exact),
    /// else f32.
    pub fn wtype(&self) -> WeightType {
        self.wtype
    }

    /// `expert` of MoE layer `layer` encoded for a slot of `slots`.
    pub fn slot_bytes(&self, layer: usize, expert: u32, slots: &ExpertSlots) -> Result<Vec<u8>> {
        let (h, i, e) = (self.hidden, self.inter, expert as usize);
        let layout = self
            .layers
            .get(layer)
            .ok_or_else(|| Error::Config(format!("moe layer {layer} of {}", self.layers.len())))?;
        if e >= self.n_experts {
            return Err(Error::Config(format!(
                "expert {e} of layer {layer}, expected below {}",
                self.n_experts
            )));
        }
        let mut all = Vec::with_capacity(slots.slot_elems() as usize);
        match layout {
            Layout::Stacked(mlp) => {
                let gu = self
                    .src
                    .tensor_fp8(&format!("{mlp}.experts.gate_up_proj"), self.fp8_block)?;
                gu.expect_shape(&[self.n_experts, 2 * i, h])?;
                let down = self
                    .src
                    .tensor_fp8(&format!("{mlp}.experts.down_proj"), self.fp8_block)?;
                down.expect_shape(&[self.n_experts, h, i])?;
                all.extend(gu.rows_f32(e * 2 * i, 2 * i)?);
                all.extend(down.rows_f32(e * h, h)?);
            }
            Layout::PerExpert(mlp, names) => {
                for (name, shape) in names.iter().zip([[i, h], [i, h], [h, i]]) {
                    let t = self
                        .src
                        .tensor_fp8(&format!("{mlp}.experts.{e}.{name}.weight"), self.fp8_block)?;
                    t.expect_shape(&shape)?;
                    all.extend(t.to_f32()?);
                }
            }
            Layout::Converted(mlp) => {
                let x = strata_accel::model::converted_expert(
                    &self.src,
                    &format!("{mlp}.experts"),
                    e,
                    h,
                    i,
                )?;
                all.extend(x.gate);
                all.extend(x.up);
                all.extend(x.down);
            }
        }
        all.resize(slots.slot_elems() as usize, 0.0);
        Ok(slots.wtype.encode(&all))
    }
}
