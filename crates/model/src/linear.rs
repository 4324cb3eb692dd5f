//! Linear layers and the loader that builds them from checkpoint tensors.
//!
//! A [`Linear`] holds `W: [n_out, k_in]` (the `nn.Linear` layout) in one of the engine's
//! weight formats and an optional bias. [`Precision`] picks the format at load time:
//! `F32` converts everything to f32 (the reference path); `Fast` keeps BF16 checkpoints
//! mapped as they are and converts other float types to BF16 once.
//!
//! Converted models: a [`Loader`] made with [`Loader::recording`] keeps everything it hands
//! to the model (f32 vectors, linear layers as built, packed expert sets) under the name it
//! was asked for, and [`Recording::write`] stores that in a `.strata` file. A loader over
//! such a file ([`Source::Strata`]) answers the same requests from the file: packed
//! matrices and BF16 weights are mapped in place, so loading is a mapping, not a
//! conversion, and the model code is the same for every source.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;

use half::bf16;
use serde_json::{Value, json};
use strata_formats::TensorView;
use strata_formats::strata_file::{StrataFile, StrataWriter, parse_packed_format};
use strata_kernels::ggml::GgmlMatrix;
use strata_kernels::{PackedFormat, PackedMatrix};

use crate::source::{Source, Tensor};
use crate::{Error, Result};

/// Numeric mode of the weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// Every weight in f32: the reference path (`--dtype f32`).
    F32,
    /// BF16 weights (mapped when the checkpoint is BF16), f32 activations and accumulation.
    #[default]
    Fast,
}

/// Weight storage of a [`Linear`].
#[derive(Debug, Clone)]
pub enum Weight {
    /// Owned f32 values.
    F32(Vec<f32>),
    /// BF16 values viewed in the mapped checkpoint, from element `offset`.
    MappedBf16 {
        /// The tensor holding the values.
        view: TensorView,
        /// First element.
        offset: usize,
    },
    /// Owned BF16 values (converted at load from F32/F16 checkpoints).
    Bf16(Vec<bf16>),
    /// Packed for the CPU kernels (AMX / AVX-512 / portable).
    Packed(PackedMatrix),
    /// ggml blocks computed in place (a GGUF tensor, mapped).
    Ggml(GgmlMatrix),
}

/// `y = x · Wᵀ (+ b)` with `W: [n_out, k_in]`.
#[derive(Debug, Clone)]
pub struct Linear {
    /// Output features.
    pub n_out: usize,
    /// Input features.
    pub k_in: usize,
    pub(crate) weight: Weight,
    pub(crate) bias: Option<Vec<f32>>,
}

impl Linear {
    /// A linear layer from f32 values (used by tests and derived weights).
    pub fn from_f32(w: Vec<f32>, n_out: usize, k_in: usize, bias: Option<Vec<f32>>) -> Linear {
        assert_eq!(w.len(), n_out * k_in);
        Linear {
            n_out,
            k_in,
            weight: Weight::F32(w),
            bias,
        }
    }

    /// The weights as BF16 when they are stored so (mapped or owned).
    pub fn bf16_slice(&self) -> Option<&[bf16]> {
        match &self.weight {
            Weight::MappedBf16 { view, offset } => view
                .as_bf16()
                .map(|s| &s[*offset..*offset + self.n_out * self.k_in]),
            Weight::Bf16(v) => Some(v),
            Weight::F32(_) | Weight::Packed(_) | Weight::Ggml(_) => None,
        }
    }

    /// The weights as ggml blocks, when they are stored so.
    pub fn ggml(&self) -> Option<&GgmlMatrix> {
        match &self.weight {
            Weight::Ggml(m) => Some(m),
            _ => None,
        }
    }

    /// This layer with its weights packed in `fmt` for the CPU kernels; ggml blocks stay as
    /// they are (their kernels read them in place).
    pub fn packed(self, fmt: PackedFormat) -> Result<Linear> {
        if matches!(self.weight, Weight::Ggml(_)) {
            return Ok(self);
        }
        let packed = self.pack_matrix(fmt)?;
        Ok(Linear {
            weight: Weight::Packed(packed),
            ..self
        })
    }

    fn pack_matrix(&self, fmt: PackedFormat) -> Result<PackedMatrix> {
        Ok(match self.bf16_slice() {
            Some(w) => PackedMatrix::pack(w, self.n_out, self.k_in, fmt)?,
            None => PackedMatrix::pack(&self.weight_f32(), self.n_out, self.k_in, fmt)?,
        })
    }

    /// The weights as f32 (a copy unless already f32).
    pub fn weight_f32(&self) -> Vec<f32> {
        match &self.weight {
            Weight::F32(w) => w.clone(),
            Weight::Packed(p) => p.dequantize(),
            Weight::Ggml(m) => m.dequantize(),
            _ => self
                .bf16_slice()
                .expect("bf16 weights")
                .iter()
                .map(|v| v.to_f32())
                .collect(),
        }
    }

    /// Row `i` of the weights as f32 (embedding lookup; embeddings are never packed: the
    /// tied LM head is a packed copy, see `Model::from_source`).
    pub fn row_f32(&self, i: usize, out: &mut [f32]) {
        let k = self.k_in;
        match &self.weight {
            Weight::F32(w) => out.copy_from_slice(&w[i * k..(i + 1) * k]),
            Weight::Packed(_) => {
                unreachable!("row access to a packed matrix (embeddings stay unpacked)")
            }
            Weight::Ggml(m) => m
                .dequantize_row(i, out)
                .expect("rows are checked against the vocabulary"),
            _ => {
                let w = self.bf16_slice().expect("bf16 weights");
                for (o, v) in out.iter_mut().zip(&w[i * k..(i + 1) * k]) {
                    *o = v.to_f32();
                }
            }
        }
    }

    /// Bytes the weights occupy.
    pub fn weight_bytes(&self) -> usize {
        match &self.weight {
            Weight::F32(w) => w.len() * 4,
            Weight::Packed(p) => p.bytes(),
            Weight::Ggml(m) => m.bytes().len(),
            _ => self.n_out * self.k_in * 2,
        }
    }

    /// `x: [m, k_in]` -> `[m, n_out]`.
    pub fn forward(&self, x: &[f32], m: usize) -> Vec<f32> {
        let mut out = strata_kernels::zeroed_f32(m * self.n_out);
        self.forward_into(x, m, &mut out);
        out
    }

    /// `x: [m, k_in]` -> `out: [m, n_out]`.
    pub fn forward_into(&self, x: &[f32], m: usize, out: &mut [f32]) {
        use strata_kernels::gemm;
        match &self.weight {
            Weight::F32(w) => gemm::matmul_f32(x, w, out, m, self.n_out, self.k_in),
            Weight::Packed(p) => p
                .matmul(x, m, out)
                .expect("packed matmul shapes are checked at load"),
            Weight::Ggml(g) => g
                .matmul(x, m, out)
                .expect("ggml matmul shapes are checked at load"),
            _ => {
                let w = self.bf16_slice().expect("bf16 weights");
                gemm::matmul_bf16(x, w, out, m, self.n_out, self.k_in)
            }
        }
        if let Some(b) = &self.bias {
            for row in out.chunks_exact_mut(self.n_out) {
                crate::ops::add_assign(row, b);
            }
        }
    }
}

/// How to load a model's weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadOptions {
    /// Numeric mode.
    pub precision: Precision,
    /// Packed format of routed experts in the fast path (`--weights`).
    pub experts: PackedFormat,
    /// Fast path on a GGUF: run quantized tensors as the file stores them (the default).
    /// `false` dequantizes and repacks them like any other checkpoint (`experts` then
    /// applies).
    pub keep_blocks: bool,
}

impl LoadOptions {
    /// The defaults for `precision`: BF16 experts.
    pub fn new(precision: Precision) -> LoadOptions {
        LoadOptions {
            precision,
            experts: PackedFormat::Bf16,
            keep_blocks: true,
        }
    }
}

impl From<Precision> for LoadOptions {
    fn from(precision: Precision) -> LoadOptions {
        LoadOptions::new(precision)
    }
}

impl LoadOptions {
    /// The options as stored in a converted model's metadata.
    pub fn to_json(&self) -> Value {
        let precision = match self.precision {
            Precision::F32 => "f32",
            Precision::Fast => "fast",
        };
        json!({"precision": precision, "experts": self.experts.name()})
    }

    /// The options a converted model was built with (its metadata's `options`).
    pub fn stored(f: &StrataFile) -> Result<LoadOptions> {
        let o = &f.metadata()["options"];
        let bad = |what: &str| {
            Error::Format(strata_formats::Error::Malformed {
                path: f.path().to_owned(),
                message: format!("metadata.options.{what} is missing or invalid, got {o}"),
            })
        };
        let precision = match o["precision"].as_str() {
            Some("fast") => Precision::Fast,
            Some("f32") => Precision::F32,
            _ => return Err(bad("precision")),
        };
        let experts = o["experts"]
            .as_str()
            .and_then(parse_packed_format)
            .ok_or_else(|| bad("experts"))?;
        Ok(LoadOptions {
            precision,
            experts,
            keep_blocks: true,
        })
    }
}

/// One thing a recording [`Loader`] handed to the model.
#[derive(Debug, Clone)]
pub(crate) enum Built {
    /// f32 values of a shape (norms, biases, routers).
    F32(Vec<usize>, Vec<f32>),
    /// A layer's weights as built (f32, BF16 or packed); its bias is recorded as `F32`.
    Linear(Linear),
    /// A packed matrix (one part of a packed expert).
    Packed(PackedMatrix),
}

/// What a recording [`Loader`] built, by name: the contents of a converted model.
#[derive(Debug, Default)]
pub struct Recording {
    entries: Vec<(String, Built)>,
}

impl Recording {
    /// Stores every entry in `w` (a name recorded twice is stored once: the same request
    /// gives the same answer).
    pub fn write(&self, w: &mut StrataWriter) -> Result<()> {
        let mut seen = HashSet::new();
        for (name, built) in &self.entries {
            if !seen.insert(name.as_str()) {
                continue;
            }
            match built {
                Built::F32(shape, v) => w.add_f32(name, shape, v)?,
                Built::Packed(p) => w.add_packed(name, p)?,
                Built::Linear(l) => {
                    let shape = [l.n_out, l.k_in];
                    match &l.weight {
                        Weight::F32(v) => w.add_f32(name, &shape, v)?,
                        Weight::Packed(p) => w.add_packed(name, p)?,
                        Weight::Ggml(m) => w.add_ggml(name, m)?,
                        _ => w.add_bf16(name, &shape, l.bf16_slice().expect("bf16 weights"))?,
                    }
                }
            }
        }
        Ok(())
    }

    /// Number of entries recorded.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Builds layers from a model's tensors by Hugging Face name, checking shapes.
pub struct Loader<'a> {
    src: &'a Source,
    precision: Precision,
    experts: PackedFormat,
    keep_blocks: bool,
    fp8_block: Option<[usize; 2]>,
    /// Everything handed out, when converting.
    record: Option<RefCell<Recording>>,
    /// Nonzero while building something recorded as a whole (an expert set's layers).
    quiet: Cell<u32>,
}

impl<'a> Loader<'a> {
    /// A loader over `src` producing weights as `opts` says.
    pub fn new(src: &'a Source, opts: LoadOptions) -> Self {
        Loader {
            src,
            precision: opts.precision,
            experts: opts.experts,
            keep_blocks: opts.keep_blocks,
            fp8_block: None,
            record: None,
            quiet: Cell::new(0),
        }
    }

    /// This loader, keeping what it builds for [`Loader::into_recording`].
    pub fn recording(mut self) -> Self {
        self.record = Some(RefCell::new(Recording::default()));
        self
    }

    /// What this loader built (empty unless made with [`Loader::recording`]).
    pub fn into_recording(self) -> Recording {
        self.record.map(RefCell::into_inner).unwrap_or_default()
    }

    pub(crate) fn keep(&self, name: String, built: Built) {
        if let Some(r) = &self.record
            && self.quiet.get() == 0
        {
            r.borrow_mut().entries.push((name, built));
        }
    }

    pub(crate) fn quietly<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.quiet.set(self.quiet.get() + 1);
        let out = f();
        self.quiet.set(self.quiet.get() - 1);
        out
    }

    pub(crate) fn converted(&self) -> bool {
        matches!(self.src, Source::Strata(_))
    }

    /// The packed matrix a converted model stores as `name`, checked to be `[n, k]`.
    pub(crate) fn stored_packed(&self, name: &str, n: usize, k: usize) -> Result<PackedMatrix> {
        let t = self.tensor(name)?;
        t.expect_shape(&[n, k])?;
        let bad = || {
            Error::Format(strata_formats::Error::BadTensor {
                path: self.src.path().to_owned(),
                name: name.to_owned(),
                message: "expected a packed matrix, stored as plain values".into(),
            })
        };
        t.stored_packed().ok_or_else(bad)?
    }

    /// Reads FP8 weights with `weight_scale_inv` blocks of this size.
    pub fn with_fp8_block(mut self, block: Option<[usize; 2]>) -> Self {
        self.fp8_block = block;
        self
    }

    /// A tensor by Hugging Face name (FP8 ones with their block scales).
    pub fn tensor(&self, name: &str) -> Result<Tensor<'a>> {
        self.src.tensor_fp8(name, self.fp8_block)
    }

    /// The packed format of routed experts, or `None` on the f32 reference path (plain
    /// matmuls, no packing).
    pub fn expert_format(&self) -> Option<PackedFormat> {
        (self.precision == Precision::Fast).then_some(self.experts)
    }

    /// The packed format of dense weights (attention, dense MLPs, shared experts, LM head)
    /// stored in tensor `name`: BF16 on the fast path, except that f32 checkpoints keep
    /// dense weights in f32 (their routers would otherwise flip on rounding); `None` means
    /// plain matmuls.
    pub fn dense_format(&self, name: &str) -> Option<PackedFormat> {
        let f32_stored = self.tensor(name).is_ok_and(|t| t.is_f32());
        (self.precision == Precision::Fast && !f32_stored).then_some(PackedFormat::Bf16)
    }

    /// The tensors.
    pub fn source(&self) -> &'a Source {
        self.src
    }

    /// The precision weights are built in.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Whether tensor `name` exists.
    pub fn has(&self, name: &str) -> bool {
        self.tensor(name).is_ok()
    }

    /// A float tensor of exactly `shape`, converted to f32.
    pub fn f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let t = self.tensor(name)?;
        t.expect_shape(shape)?;
        let v = t.to_f32()?;
        self.keep(name.to_owned(), Built::F32(shape.to_vec(), v.clone()));
        Ok(v)
    }

    /// `{prefix}.weight` `[n_out, k_in]` and, if `bias`, `{prefix}.bias` `[n_out]`.
    pub fn linear(&self, prefix: &str, n_out: usize, k_in: usize, bias: bool) -> Result<Linear> {
        let l = self.linear_unrecorded(prefix, n_out, k_in, bias)?;
        self.keep(format!("{prefix}.weight"), Built::Linear(l.clone()));
        Ok(l)
    }

    fn linear_unrecorded(
        &self,
        prefix: &str,
        n_out: usize,
        k_in: usize,
        bias: bool,
    ) -> Result<Linear> {
        let t = self.tensor(&format!("{prefix}.weight"))?;
        t.expect_shape(&[n_out, k_in])?;
        let bias = if bias {
            Some(self.f32(&format!("{prefix}.bias"), &[n_out])?)
        } else {
            None
        };
        self.linear_from(&t, 0, n_out, k_in, bias, false)
    }

    /// A projection (attention, LM head) `{prefix}.weight` `[n_out, k_in]` (+ bias), packed
    /// for the CPU kernels on the fast path.
    pub fn projection(
        &self,
        prefix: &str,
        n_out: usize,
        k_in: usize,
        bias: bool,
    ) -> Result<Linear> {
        let name = format!("{prefix}.weight");
        let stored = match self.tensor(&name)?.stored_packed() {
            Some(_) => Some(self.stored_packed(&name, n_out, k_in)?),
            None => None,
        };
        let l = match stored {
            Some(p) => Linear {
                n_out,
                k_in,
                weight: Weight::Packed(p),
                bias: if bias {
                    Some(self.f32(&format!("{prefix}.bias"), &[n_out])?)
                } else {
                    None
                },
            },
            None => {
                let l = self.linear_unrecorded(prefix, n_out, k_in, bias)?;
                match self.dense_format(&name) {
                    Some(fmt) => l.packed(fmt)?,
                    None => l,
                }
            }
        };
        self.keep(name, Built::Linear(l.clone()));
        Ok(l)
    }

    /// `l` (weights `{prefix}.weight`) packed in `fmt` as a separate copy: the tied LM head,
    /// which needs the kernels' layout while the embedding keeps rows. A converted model
    /// maps the copy it stored as `{prefix}.weight.packed`.
    pub fn packed_copy(&self, prefix: &str, l: &Linear, fmt: PackedFormat) -> Result<Linear> {
        let name = format!("{prefix}.weight.packed");
        let p = if self.converted() {
            self.stored_packed(&name, l.n_out, l.k_in)?
        } else {
            l.pack_matrix(fmt)?
        };
        self.keep(name, Built::Packed(p.clone()));
        Ok(Linear {
            n_out: l.n_out,
            k_in: l.k_in,
            weight: Weight::Packed(p),
            bias: l.bias.clone(),
        })
    }

    /// An expert's projection `{prefix}.weight` `[n_out, k_in]`, in the expert format.
    pub fn expert_linear(&self, prefix: &str, n_out: usize, k_in: usize) -> Result<Linear> {
        let t = self.tensor(&format!("{prefix}.weight"))?;
        t.expect_shape(&[n_out, k_in])?;
        self.linear_from(&t, 0, n_out, k_in, None, true)
    }

    /// A linear layer from rows `row0..row0 + n_out` of `t` (one expert's slice of a
    /// stacked tensor when `row0 > 0`). In the fast path, dense layers keep f32 tensors in
    /// f32 and map BF16 ones as they are, while `expert` layers always use the compact
    /// expert format: experts are where the bytes are.
    pub fn linear_from(
        &self,
        t: &Tensor,
        row0: usize,
        n_out: usize,
        k_in: usize,
        bias: Option<Vec<f32>>,
        expert: bool,
    ) -> Result<Linear> {
        if self.precision == Precision::Fast
            && self.keep_blocks
            && let Some(m) = t.ggml_rows(row0, n_out)?
        {
            return Ok(Linear {
                n_out,
                k_in,
                weight: Weight::Ggml(m),
                bias,
            });
        }
        let weight = match (self.precision, t.mapped_bf16()) {
            (Precision::Fast, Some((view, offset))) => Weight::MappedBf16 {
                view: view.clone(),
                offset: offset + row0 * k_in,
            },
            (Precision::Fast, None) if t.is_f32() && !expert => {
                Weight::F32(t.rows_f32(row0, n_out)?)
            }
            (Precision::Fast, None) => Weight::Bf16(
                t.rows_f32(row0, n_out)?
                    .into_iter()
                    .map(bf16::from_f32)
                    .collect(),
            ),
            (Precision::F32, _) => Weight::F32(t.rows_f32(row0, n_out)?),
        };
        Ok(Linear {
            n_out,
            k_in,
            weight,
            bias,
        })
    }

    /// A linear layer in f32 whatever the precision (routers: their choices must not flip).
    pub fn linear_f32(&self, prefix: &str, n_out: usize, k_in: usize) -> Result<Linear> {
        let w = self.f32(&format!("{prefix}.weight"), &[n_out, k_in])?;
        Ok(Linear::from_f32(w, n_out, k_in, None))
    }
}

/// Writes a converted model: `recording` (from a [`Loader::recording`] that built a model
/// from `config` with `opts`), `blobs` (tokenizer files) and `metadata` (merged with the
/// options), atomically at `path`.
pub fn write_converted(
    path: &std::path::Path,
    config: &crate::config::ModelConfig,
    opts: LoadOptions,
    recording: &Recording,
    blobs: &[(&str, &[u8])],
    mut metadata: Value,
) -> Result<()> {
    let config = serde_json::to_value(config).map_err(|e| {
        Error::Format(strata_formats::Error::Malformed {
            path: path.to_owned(),
            message: format!("cannot serialise the model config: {e}"),
        })
    })?;
    if !metadata.is_object() {
        metadata = json!({});
    }
    metadata["options"] = opts.to_json();
    let mut w = StrataWriter::create(path)?;
    recording.write(&mut w)?;
    for (name, bytes) in blobs {
        w.add_blob(name, bytes)?;
    }
    w.finish(config, metadata)?;
    Ok(())
}
