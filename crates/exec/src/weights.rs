//! The host copy of the routed experts that transfers read from: the checkpoint itself,
//! mapped, read one expert at a time in the slot's storage type. A converted model
//! (`strata convert`) is read from its packed experts: BF16 ones stay BF16, INT8 (a scale
//! per row) and INT4 (a scale per 32) keep their integers and scales, laid out by rows in
//! the same bytes; other groupings are dequantized to f32 (the values the CPU kernels use).
//!
//! A key design decision: weights are read from the mapped checkpoint (the same bytes the
//! CPU path was built from) at the moment of each transfer instead of keeping a second
//! encoded copy of every expert in host memory: an upload reads and converts one expert,
//! which is what a pinned staging copy would cost on a real PCIe link anyway.

use std::path::Path;
use std::sync::Arc;

use strata_accel::{ExpertFormat, WeightType};
use strata_kernels::ggml::GgmlType;
use strata_model::config::{FfnConfig, ModelConfig};
use strata_model::names::{self, ExpertLayout, ExpertPart, LayerNames};
use strata_model::source::{Source, Tensor};
use strata_model::tensors::{MatrixSpec, MlpTensors, StackedExperts};

use crate::{Error, Result, SsdTier};

/// The device storage type of tensor `t` with rows of `k` values: a GGUF's blocks as they
/// are where the device's kernels decode the type (and rows are whole blocks), its other
/// quantized types dequantized to F16; BF16 and F16 as stored (a converted model's packed
/// BF16 too); a converted model's packed INT8 (a scale per row) and INT4 (a scale per 32)
/// laid out by rows in the same bytes ([`WeightType::encode_int_rows`]); everything else as
/// f32, which holds those values exactly (f32, FP8 with its scales applied, packed integers
/// with other groups dequantized).
pub(crate) fn device_type(t: &Tensor, k: usize) -> WeightType {
    let name = t.dtype_name();
    let packed = |w: WeightType| Some(w).filter(|w| w.fits_row(k));
    match name.as_str() {
        "BF16" | "packed bf16" => WeightType::Bf16,
        "F16" => WeightType::F16,
        "F32" => WeightType::F32,
        "packed int8" => packed(WeightType::Int8).unwrap_or(WeightType::F32),
        "packed int4g32" => packed(WeightType::Int4).unwrap_or(WeightType::F32),
        _ if t.is_ggml() => WeightType::from_ggml_name(&name)
            .filter(|w| w.fits_row(k))
            .unwrap_or(WeightType::F16),
        _ => WeightType::F32,
    }
}

/// Rows `rows` of `t` as the quantized `wtype` stores them, exact bytes: a GGUF's blocks as
/// the file holds them (contiguous rows), or a converted model's packed integers laid out
/// by rows.
pub(crate) fn quantized_rows(
    t: &Tensor,
    rows: impl Iterator<Item = usize>,
    wtype: WeightType,
) -> Result<Vec<u8>> {
    Ok(match t.stored_packed() {
        Some(packed) if !wtype.is_ggml() => {
            let packed = packed?;
            let (mut q, mut scales) = (Vec::new(), Vec::new());
            for j in rows {
                let (row, sc) = packed
                    .int_row(j)
                    .ok_or_else(|| Error::Config(format!("{}: no integer row {j}", t.name())))?;
                q.extend(row);
                scales.extend(sc);
            }
            wtype.encode_int_rows(&q, &scales, packed.k())?
        }
        _ => {
            let rows: Vec<usize> = rows.collect();
            let contiguous = rows.windows(2).all(|w| w[1] == w[0] + 1);
            let (first, n) = (rows.first().copied().unwrap_or(0), rows.len());
            match t.ggml_rows(first, n)? {
                Some(m) if contiguous && wtype.is_ggml() => m.bytes().to_vec(),
                _ => {
                    return Err(Error::Config(format!(
                        "{}: not stored as {}",
                        t.name(),
                        wtype.name()
                    )));
                }
            }
        }
    })
}

/// Bytes on the device of `bytes` stored as the ggml block type named `dtype`, when the
/// device widens it to F16 (its kernels do not read the type: [`device_type`]); `None`
/// for the types it holds as stored.
pub fn device_f16_bytes(dtype: &str, bytes: u64) -> Option<u64> {
    let t = GgmlType::ALL
        .into_iter()
        .find(|t| t.name() == dtype && t.block_size() > 1)?;
    if WeightType::from_ggml_name(dtype).is_some() {
        return None;
    }
    Some(bytes / t.block_bytes() as u64 * t.block_size() as u64 * 2)
}

/// The values of `t` and the float storage type that holds them (a converted model's packed
/// matrices are dequantized: the values its CPU kernels use).
pub(crate) fn stored_values(t: &Tensor) -> Result<(Vec<f32>, WeightType)> {
    let wtype = match device_type(t, 1) {
        w if w.is_quantized() => WeightType::F16,
        w => w,
    };
    match t.stored_packed() {
        Some(p) => Ok((p?.dequantize(), wtype)),
        None => Ok((t.to_f32()?, wtype)),
    }
}

/// Rows of one gate or up strip in the fused gate/up matrix of a packed expert
/// (`strata_kernels::Expert::pack`: row `32 b + c` is gate row `16 b + c`, row
/// `32 b + 16 + c` is up row `16 b + c`).
const STRIP: usize = 16;

/// The fused gate/up matrix's row of gate row `i` (up row `i` is `STRIP` further).
fn fused_gate_row(i: usize) -> usize {
    2 * (i / STRIP) * STRIP + i % STRIP
}

/// The device type of the converted expert (or MLP) set `prefix` when its matrices are
/// packed integers the device reads as stored ([`device_type`]: INT8 per row, INT4 per
/// 32), all three alike; `None` otherwise (they go as values: [`converted_expert`]).
pub(crate) fn converted_int_type(
    src: &Source,
    prefix: &str,
    hidden: usize,
    inter: usize,
) -> Result<Option<WeightType>> {
    let name = |part| names::converted_expert(prefix, 0, part);
    let gate = match src.has(&name(ExpertPart::GateUp)) {
        true => name(ExpertPart::GateUp),
        false => name(ExpertPart::Gate),
    };
    let gate = device_type(&src.tensor(&gate)?, hidden);
    let down = device_type(&src.tensor(&name(ExpertPart::Down))?, inter);
    Ok(Some(gate).filter(|&t| t == down && t.is_quantized() && !t.is_ggml()))
}

/// Gate, up and down of expert `e` of the converted set `prefix` as `wtype`'s packed
/// integer rows ([`converted_int_type`]): the file's integers and scales, the fused
/// gate/up matrix split into its two.
pub(crate) fn converted_int_parts(
    src: &Source,
    prefix: &str,
    [e, hidden, inter]: [usize; 3],
    wtype: WeightType,
) -> Result<[Vec<u8>; 3]> {
    let get = |part, shape: [usize; 2]| -> Result<Tensor> {
        let t = src.tensor(&names::converted_expert(prefix, e, part))?;
        t.expect_shape(&shape)?;
        Ok(t)
    };
    let down = quantized_rows(&get(ExpertPart::Down, [hidden, inter])?, 0..hidden, wtype)?;
    if !src.has(&names::converted_expert(prefix, e, ExpertPart::GateUp)) {
        let gate = get(ExpertPart::Gate, [inter, hidden])?;
        let up = get(ExpertPart::Up, [inter, hidden])?;
        return Ok([
            quantized_rows(&gate, 0..inter, wtype)?,
            quantized_rows(&up, 0..inter, wtype)?,
            down,
        ]);
    }
    let i_pad = inter.div_ceil(STRIP) * STRIP;
    let gu = get(ExpertPart::GateUp, [2 * i_pad, hidden])?;
    let gate = quantized_rows(&gu, (0..inter).map(fused_gate_row), wtype)?;
    let up = quantized_rows(&gu, (0..inter).map(|i| fused_gate_row(i) + STRIP), wtype)?;
    Ok([gate, up, down])
}

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
        let row = fused_gate_row(i);
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

/// How the experts of a block stored as `layout` go to the device: a GGUF's blocks as they
/// are (gate/up and down may differ), floats in the type that holds them exactly, and F16
/// where the quantized types cannot form one format (gate and up differ, or a type the
/// device does not decode).
pub(crate) fn expert_format(
    src: &Source,
    fp8_block: Option<[usize; 2]>,
    layout: &ExpertLayout,
    hidden: usize,
    inter: usize,
) -> Result<ExpertFormat> {
    let (gate, up, down) = match layout {
        ExpertLayout::Converted { prefix } => {
            if let Some(t) = converted_int_type(src, prefix, hidden, inter)? {
                return Ok(ExpertFormat::uniform(t));
            }
            let x = converted_expert(src, prefix, 0, hidden, inter)?;
            return Ok(ExpertFormat::uniform(x.wtype));
        }
        ExpertLayout::Stacked { gate_up, .. } => {
            let t = src.tensor_fp8(gate_up, fp8_block)?;
            return Ok(ExpertFormat::uniform(device_type(&t, hidden)));
        }
        ExpertLayout::PerExpert { prefix, names } => {
            let x = MlpTensors::expert(prefix, *names, 0, hidden, inter);
            let t = |m: &MatrixSpec| src.tensor_fp8(&m.weight(), fp8_block);
            (t(&x.gate)?, t(&x.up)?, t(&x.down)?)
        }
    };
    let (g, u, d) = (
        device_type(&gate, hidden),
        device_type(&up, hidden),
        device_type(&down, inter),
    );
    let format = ExpertFormat {
        gate_up: g,
        down: d,
    };
    let fits = format.check(hidden as u32, inter as u32).is_ok();
    Ok(if g == u && fits {
        format
    } else if [g, u, d].iter().any(|w| w.is_quantized()) {
        ExpertFormat::uniform(WeightType::F16)
    } else {
        ExpertFormat::uniform(WeightType::F32)
    })
}

/// Expert `e` of the `n` of a block stored as `layout`, as a slot holds it in `format`:
/// quantized parts' blocks back to back, float values encoded together; whole words.
pub(crate) fn expert_bytes(
    src: &Source,
    fp8_block: Option<[usize; 2]>,
    layout: &ExpertLayout,
    [e, n, hidden, inter]: [usize; 4],
    format: ExpertFormat,
) -> Result<Vec<u8>> {
    let (h, i) = (hidden, inter);
    let mut values = Vec::with_capacity(3 * h * i);
    match layout {
        ExpertLayout::Stacked { gate_up, down } => {
            let s = StackedExperts::new(gate_up, down, n, h, i);
            let gu = src.tensor_fp8(&s.gate_up.name, fp8_block)?;
            gu.expect_shape(&s.gate_up.shape)?;
            let down = src.tensor_fp8(&s.down.name, fp8_block)?;
            down.expect_shape(&s.down.shape)?;
            values.extend(gu.rows_f32(e * 2 * i, 2 * i)?);
            values.extend(down.rows_f32(e * h, h)?);
        }
        ExpertLayout::PerExpert { prefix, names } => {
            let x = MlpTensors::expert(prefix, *names, e, h, i);
            let mut bytes = Vec::new();
            for (m, wtype) in [
                (&x.gate, format.gate_up),
                (&x.up, format.gate_up),
                (&x.down, format.down),
            ] {
                let t = src.tensor_fp8(&m.weight(), fp8_block)?;
                t.expect_shape(&m.shape())?;
                if wtype.is_quantized() {
                    bytes.extend(quantized_rows(&t, 0..m.rows, wtype)?);
                } else {
                    values.extend(t.to_f32()?);
                }
            }
            if format.gate_up.is_quantized() {
                bytes.resize(bytes.len().next_multiple_of(4), 0);
                return Ok(bytes);
            }
        }
        ExpertLayout::Converted { prefix } if format.gate_up.is_quantized() => {
            return Ok(converted_int_parts(src, prefix, [e, h, i], format.gate_up)?.concat());
        }
        ExpertLayout::Converted { prefix } => {
            let x = converted_expert(src, prefix, e, h, i)?;
            values.extend(x.gate);
            values.extend(x.up);
            values.extend(x.down);
        }
    }
    Ok(format.gate_up.encode(&values)?)
}

/// The routed experts of every MoE layer, readable one expert at a time.
#[derive(Debug)]
pub struct HostExperts {
    src: Source,
    fp8_block: Option<[usize; 2]>,
    layers: Vec<ExpertLayout>,
    /// How each MoE layer's experts are stored on the device.
    formats: Vec<ExpertFormat>,
    hidden: usize,
    inter: usize,
    n_experts: usize,
    /// Three tiers: the DRAM expert cache that experts stored as the file's blocks are
    /// copied from (or read through from the file), instead of the mapped file.
    tier: Option<Arc<SsdTier>>,
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
        let (h, fp8) = (config.hidden_size, config.fp8_block);
        let formats = layers
            .iter()
            .map(|l| expert_format(&src, fp8, l, h, inter))
            .collect::<Result<_>>()?;
        Ok(HostExperts {
            src,
            fp8_block: fp8,
            layers,
            formats,
            hidden: h,
            inter,
            n_experts,
            tier: None,
        })
    }

    /// Reads the experts that the device stores as the file's blocks through `tier` (the
    /// DRAM expert cache of the same file, three tiers): from its slots when there, else
    /// from the file without the page cache. Other layers are still read from the mapping.
    pub fn read_through(&mut self, tier: Option<Arc<SsdTier>>) {
        self.tier = tier;
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

    /// How MoE layer `layer`'s experts are stored on the device (see [`expert_format`]).
    pub fn format(&self, layer: usize) -> Option<ExpertFormat> {
        self.formats.get(layer).copied()
    }

    /// Every format the layers use, once each.
    pub fn formats(&self) -> Vec<ExpertFormat> {
        let mut all: Vec<ExpertFormat> = Vec::new();
        for f in &self.formats {
            if !all.contains(f) {
                all.push(*f);
            }
        }
        all
    }

    /// Bytes of the largest expert on the device: a slot that holds any layer's.
    pub fn slot_bytes(&self) -> u64 {
        let (h, i) = (self.hidden as u32, self.inter as u32);
        self.formats
            .iter()
            .map(|f| f.bytes(h, i))
            .max()
            .unwrap_or(0)
    }

    /// Device bits per expert weight, averaged over the layers (the cost model's transfer
    /// size).
    pub fn bits_per_weight(&self) -> f64 {
        let (h, i) = (self.hidden as u32, self.inter as u32);
        let bytes: u64 = self.formats.iter().map(|f| f.bytes(h, i)).sum();
        let weights = 3.0 * self.hidden as f64 * self.inter as f64 * self.formats.len() as f64;
        8.0 * bytes as f64 / weights.max(1.0)
    }

    /// `expert` of MoE layer `layer` as a slot holds it (in [`HostExperts::format`]).
    pub fn expert_bytes(&self, layer: usize, expert: u32) -> Result<Vec<u8>> {
        let (layout, format) = match (self.layers.get(layer), self.format(layer)) {
            (Some(l), Some(f)) => (l, f),
            _ => {
                return Err(Error::Config(format!(
                    "moe layer {layer} of {}",
                    self.layers.len()
                )));
            }
        };
        let e = expert as usize;
        if e >= self.n_experts {
            return Err(Error::Config(format!(
                "expert {e} of layer {layer}, expected below {}",
                self.n_experts
            )));
        }
        if let Some(tier) = &self.tier
            && format.gate_up.is_ggml()
            && format.down.is_ggml()
        {
            // The file's blocks as they are: what the mapping would give, padded alike.
            let mut bytes = tier.expert_for_device(layer, expert)?;
            bytes.resize(bytes.len().next_multiple_of(4), 0);
            return Ok(bytes);
        }
        expert_bytes(
            &self.src,
            self.fp8_block,
            layout,
            [e, self.n_experts, self.hidden, self.inter],
            format,
        )
    }
}
