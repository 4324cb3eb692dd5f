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
use strata_model::config::{FfnConfig, ModelConfig};
use strata_model::names::{self, ExpertLayout, ExpertPart, LayerNames};
use strata_model::source::{Source, Tensor};
use strata_model::tensors::{MlpTensors, StackedExperts};

use crate::{Error, Result};

/// Storage type that holds a stored dtype exactly (a converted model's packed BF16 is
/// BF16; its int8/int4 matrices are dequantized, which f32 holds exactly).
pub(crate) fn wtype_of(dtype: &str) -> WeightType {
    match dtype {
        "BF16" | "packed bf16" => WeightType::Bf16,
        "F16" => WeightType::F16,
        _ => WeightType::F32,
    }
}

/// The values of `t` and the storage type that holds them exactly: a converted model's
/// packed matrices are dequantized (the values its CPU kernels use), others read as
/// stored.
pub(crate) fn stored_values(t: &Tensor) -> Result<(Vec<f32>, WeightType)> {
    let wtype = wtype_of(&t.dtype_name());
    match t.stored_packed() {
        Some(p) => Ok((p?.dequantize(), wtype)),
        None => Ok((t.to_f32()?, wtype)),
    }
}

/// Rows of one gate or up strip in the fused gate/up matrix of a packed expert
/// (`strata_kernels::Expert::pack`: row `32 b + c` is gate row `16 b + c`, row
/// `32 b + 16 + c` is up row `16 b + c`).
const STRIP: usize = 16;

/// One expert's weights as f32 values, and the storage type that holds them exactly.
#[derive(Debug, Clone)]
pub(crate) struct ExpertValues {
    /// Gate projection `[inter, hidden]`.
    pub(crate) gate: Vec<f32>,
    /// Up projection `[inter, hidden]`.
    pub(crate) up: Vec<f32>,
    /// Down projection `[hidden, inter]`.
    pub(crate) down: Vec<f32>,
    /// Storage type on the device.
    pub(crate) wtype: WeightType,
}

/// Expert `e` of the set `prefix` (`model.layers.3.mlp.experts`, or a dense MLP / shared
/// expert as a set of one: `model.layers.0.mlp`) of a converted model (`strata convert`):
/// packed `{prefix}.{e}.gate_up` (gate and up strips interleaved) and `{prefix}.{e}.down`,
/// or plain `{prefix}.{e}.gate`, `.up`, `.down`. Other sources have no such tensors.
pub(crate) fn converted_expert(
    src: &Source,
    prefix: &str,
    e: usize,
    hidden: usize,
    inter: usize,
) -> Result<ExpertValues> {
    let get = |part, shape: [usize; 2]| -> Result<(Vec<f32>, WeightType)> {
        let t = src.tensor(&names::converted_expert(prefix, e, part))?;
        t.expect_shape(&shape)?;
        stored_values(&t)
    };
    let (down, _) = get(ExpertPart::Down, [hidden, inter])?;
    if !src.has(&names::converted_expert(prefix, e, ExpertPart::GateUp)) {
        let (gate, wtype) = get(ExpertPart::Gate, [inter, hidden])?;
        let (up, _) = get(ExpertPart::Up, [inter, hidden])?;
        return Ok(ExpertValues {
            gate,
            up,
            down,
            wtype,
        });
    }
    let i_pad = inter.div_ceil(STRIP) * STRIP;
    let (gu, wtype) = get(ExpertPart::GateUp, [2 * i_pad, hidden])?;
    let mut gate = Vec::with_capacity(inter * hidden);
    let mut up = Vec::with_capacity(inter * hidden);
    for i in 0..inter {
        let row = 2 * (i / STRIP) * STRIP + i % STRIP;
        gate.extend_from_slice(&gu[row * hidden..][..hidden]);
        up.extend_from_slice(&gu[(row + STRIP) * hidden..][..hidden]);
    }
    Ok(ExpertValues {
        gate,
        up,
        down,
        wtype,
    })
}

/// The routed experts of every MoE layer, readable one expert at a time.
#[derive(Debug)]
pub struct HostExperts {
    src: Source,
    fp8_block: Option<[usize; 2]>,
    layers: Vec<ExpertLayout>,
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
            layers.push(LayerNames::new(i).moe(&src, moe.shared.as_ref()).experts);
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
        let first = host.layers[0].first_tensor(&host.src);
        host.wtype = wtype_of(&host.src.tensor(&first)?.dtype_name());
        Ok(host)
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
            ExpertLayout::Stacked { gate_up, down } => {
                let s = StackedExperts::new(gate_up, down, self.n_experts, h, i);
                let gu = self.src.tensor_fp8(&s.gate_up.name, self.fp8_block)?;
                gu.expect_shape(&s.gate_up.shape)?;
                let down = self.src.tensor_fp8(&s.down.name, self.fp8_block)?;
                down.expect_shape(&s.down.shape)?;
                all.extend(gu.rows_f32(e * 2 * i, 2 * i)?);
                all.extend(down.rows_f32(e * h, h)?);
            }
            ExpertLayout::PerExpert { prefix, names } => {
                let x = MlpTensors::expert(prefix, *names, e, h, i);
                for m in [&x.gate, &x.up, &x.down] {
                    let t = self.src.tensor_fp8(&m.weight(), self.fp8_block)?;
                    t.expect_shape(&m.shape())?;
                    all.extend(t.to_f32()?);
                }
            }
            ExpertLayout::Converted { prefix } => {
                let x = converted_expert(&self.src, prefix, e, h, i)?;
                all.extend(x.gate);
                all.extend(x.up);
                all.extend(x.down);
            }
        }
        all.resize(slots.slot_elems() as usize, 0.0);
        Ok(slots.wtype.encode(&all))
    }
}
