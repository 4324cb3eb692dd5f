//! Where weights come from: a safetensors checkpoint or a GGUF file, both looked up by
//! Hugging Face tensor name.
//!
//! A key design decision made here is that the model code asks for every tensor by its
//! Hugging Face name (`model.layers.3.mlp.experts.5.gate_proj.weight`) whatever the file
//! format: the GGUF side translates names (`blk.3.ffn_gate_exps.weight`, expert 5) and
//! shapes, so one set of layer constructors serves both formats. A tensor that a GGUF stores
//! in another form (DeepSeek's `kv_b_proj`, split by llama.cpp's converter) is rebuilt once
//! at load. A converted `.strata` file ([`Source::Strata`]) stores what the loader built
//! from another source under the names it asked for, with packed matrices mapped in place
//! (see [`crate::linear::Loader`]).

use std::path::Path;
use std::sync::Arc;

use strata_formats::gguf::{GgmlType, GgufFile, TensorInfo, dequantize_row};
use strata_formats::safetensors::Checkpoint;
use strata_formats::strata_file::{StoredKind, StoredTensor, StrataFile};
use strata_formats::{DType, TensorView};
use strata_kernels::ggml::GgmlMatrix;
use strata_kernels::packed::StableBytes;

use crate::{Error, Result};

/// The tensors of a model, by Hugging Face name.
#[derive(Debug)]
pub enum Source {
    /// Safetensors files of a Hugging Face directory.
    Safetensors(Checkpoint),
    /// A GGUF file (names translated with [`crate::gguf::hf_to_gguf`]).
    Gguf(GgufFile),
    /// A converted model (`strata convert`): weights as the loader built them.
    Strata(StrataFile),
}

/// One tensor as the model sees it: possibly one expert's slice of a stacked GGUF tensor.
#[derive(Debug, Clone)]
pub struct Tensor<'a> {
    kind: Kind<'a>,
    name: String,
    shape: Vec<usize>,
    /// First row (of `shape[last]`-long rows) of this tensor inside the stored one.
    row_offset: usize,
    /// FP8 block scales: values `[ceil(n/bn), ceil(k/bk)]`, their row length, block size.
    fp8_scale: Option<(Vec<f32>, usize, [usize; 2])>,
}

#[derive(Debug, Clone)]
enum Kind<'a> {
    St(&'a TensorView),
    Gguf(&'a GgufFile, &'a TensorInfo),
    /// A packed matrix of a converted model (used by the loader in place, never as values).
    Packed(&'a StrataFile, &'a StoredTensor),
    /// Values computed at load from other GGUF tensors (DeepSeek's `kv_b_proj` rebuilt from
    /// llama.cpp's `attn_k_b`/`attn_v_b`), with the type those are stored in: the fast path
    /// keeps f32 only for f32 files, as for stored tensors.
    Built(&'a GgufFile, Arc<[f32]>, GgmlType),
}

impl Source {
    /// The file or directory the tensors come from.
    pub fn path(&self) -> &Path {
        match self {
            Source::Safetensors(c) => c.root(),
            Source::Gguf(g) => g.path(),
            Source::Strata(f) => f.path(),
        }
    }

    /// Looks up a tensor by Hugging Face name.
    pub fn tensor(&self, name: &str) -> Result<Tensor<'_>> {
        self.tensor_fp8(name, None)
    }

    /// Looks up a tensor; FP8 tensors are paired with their `weight_scale_inv` tensor of
    /// `block = [rows, cols]` blocks (from `quantization_config.weight_block_size`).
    pub fn tensor_fp8(&self, name: &str, block: Option<[usize; 2]>) -> Result<Tensor<'_>> {
        match self {
            Source::Safetensors(ck) => {
                let v = ck.get(name)?;
                let mut t = Tensor {
                    kind: Kind::St(v),
                    name: name.to_owned(),
                    shape: v.shape().to_vec(),
                    row_offset: 0,
                    fp8_scale: None,
                };
                if v.dtype() == DType::F8E4M3 {
                    let scale_name = format!("{}_scale_inv", name);
                    let (Some(block), true) = (block, v.shape().len() == 2) else {
                        return Err(t.bad(
                            "FP8 weights need a 2-D shape and quantization_config.weight_block_size".into(),
                        ));
                    };
                    let s = ck.get(&scale_name)?;
                    let want = [
                        v.shape()[0].div_ceil(block[0]),
                        v.shape()[1].div_ceil(block[1]),
                    ];
                    s.expect_shape(&want)?;
                    t.fp8_scale = Some((s.to_f32()?, want[1], block));
                }
                Ok(t)
            }
            Source::Gguf(g) => {
                let missing = || {
                    Error::Format(strata_formats::Error::MissingTensor {
                        path: g.path().to_owned(),
                        name: format!("{name} (no GGUF equivalent found)"),
                    })
                };
                let (gname, expert) = crate::gguf::hf_to_gguf(name, |n| g.tensor_info(n).is_some())
                    .ok_or_else(missing)?;
                if gname.ends_with(".attn_kv_b.weight") && g.tensor_info(&gname).is_none() {
                    return kv_b_from_split(g, &gname);
                }
                let info = g.tensor(&gname)?;
                let full = info.shape();
                let (shape, row_offset) = match expert {
                    None => (full, 0),
                    Some(e) => {
                        if full.len() != 3 || e >= full[0] {
                            return Err(Error::Format(strata_formats::Error::BadTensor {
                                path: g.path().to_owned(),
                                name: gname,
                                message: format!(
                                    "expected [experts, rows, cols] with expert {e}, got {full:?}"
                                ),
                            }));
                        }
                        (full[1..].to_vec(), e * full[1])
                    }
                };
                Ok(Tensor {
                    kind: Kind::Gguf(g, info),
                    name: gname,
                    shape,
                    row_offset,
                    fp8_scale: None,
                })
            }
            Source::Strata(f) => {
                let t = f.get(name).ok_or_else(|| {
                    Error::Format(strata_formats::Error::MissingTensor {
                        path: f.path().to_owned(),
                        name: name.to_owned(),
                    })
                })?;
                let kind = match t.view() {
                    Some(v) => Kind::St(v),
                    None => Kind::Packed(f, t),
                };
                Ok(Tensor {
                    kind,
                    name: name.to_owned(),
                    shape: t.shape.clone(),
                    row_offset: 0,
                    fp8_scale: None,
                })
            }
        }
    }

    /// `(element type, bytes)` of every stored tensor.
    pub fn stored_tensors(&self) -> Vec<(String, usize)> {
        match self {
            Source::Safetensors(ck) => ck
                .tensors()
                .map(|t| (t.dtype().to_string(), t.bytes().len()))
                .collect(),
            Source::Gguf(g) => g
                .tensors()
                .iter()
                .map(|t| (t.ggml_type.name().to_string(), t.n_bytes as usize))
                .collect(),
            Source::Strata(f) => f
                .tensors()
                .iter()
                .map(|t| (stored_kind_name(t.kind), f.stored_bytes(t)))
                .collect(),
        }
    }

    /// Whether a tensor exists.
    pub fn has(&self, name: &str) -> bool {
        self.tensor(name).is_ok()
    }
}

fn stored_kind_name(kind: StoredKind) -> String {
    match kind {
        StoredKind::F32 => "F32".into(),
        StoredKind::Bf16 => "BF16".into(),
        StoredKind::Packed(fmt) => format!("packed {}", fmt.name()),
        StoredKind::Ggml(ty) => ty.name().to_owned(),
    }
}

/// DeepSeek's `kv_b_proj` rebuilt from llama.cpp's split `attn_k_b` / `attn_v_b` (what its
/// converter writes since it absorbs MLA's up-projections), for a missing `attn_kv_b`
/// named `gname`. Done once at load; the model then sees a plain f32 tensor.
fn kv_b_from_split<'a>(g: &'a GgufFile, gname: &str) -> Result<Tensor<'a>> {
    let part = |which: &str| -> Result<(Vec<f32>, Vec<usize>, String, GgmlType)> {
        let name = gname.replace("attn_kv_b", which);
        let info = g.tensor(&name)?;
        let t = Tensor {
            kind: Kind::Gguf(g, info),
            name: name.clone(),
            shape: info.shape(),
            row_offset: 0,
            fp8_scale: None,
        };
        Ok((t.to_f32()?, t.shape, name, info.ggml_type))
    };
    let (k, k_shape, k_name, k_type) = part("attn_k_b")?;
    let (v, v_shape, v_name, _) = part("attn_v_b")?;
    let name = format!("{k_name} + {v_name}");
    let Some((values, rows)) = crate::gguf::kv_b_from_split(&k, &k_shape, &v, &v_shape) else {
        return Err(Error::Format(strata_formats::Error::BadTensor {
            path: g.path().to_owned(),
            name,
            message: format!(
                "expected [heads, kv_lora_rank, nope] and [heads, v_head_dim, kv_lora_rank], got {k_shape:?} and {v_shape:?}"
            ),
        }));
    };
    Ok(Tensor {
        kind: Kind::Built(g, values.into(), k_type),
        name,
        shape: vec![rows, k_shape[1]],
        row_offset: 0,
        fp8_scale: None,
    })
}

impl Tensor<'_> {
    /// The tensor's name as the model asked for it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Shape, outermost first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn bad(&self, message: String) -> Error {
        let path = match &self.kind {
            Kind::St(v) => v.file().path().to_owned(),
            Kind::Gguf(g, _) | Kind::Built(g, ..) => g.path().to_owned(),
            Kind::Packed(f, _) => f.path().to_owned(),
        };
        Error::Format(strata_formats::Error::BadTensor {
            path,
            name: self.name.clone(),
            message,
        })
    }

    /// Fails unless the shape is `want` (a vector may be stored as `[n]` or `[1, n]`).
    pub fn expect_shape(&self, want: &[usize]) -> Result<()> {
        if self.shape != want {
            return Err(self.bad(format!(
                "shape mismatch, expected {want:?} but got {:?}",
                self.shape
            )));
        }
        Ok(())
    }

    fn row_len(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    /// Rows `row0..row0 + n_rows` of this tensor as f32 (dequantized when quantized).
    pub fn rows_f32(&self, row0: usize, n_rows: usize) -> Result<Vec<f32>> {
        let k = self.row_len();
        let rows_total: usize = self.shape.iter().rev().skip(1).product();
        if row0 + n_rows > rows_total {
            return Err(self.bad(format!(
                "rows {row0}..{} out of {rows_total}",
                row0 + n_rows
            )));
        }
        match &self.kind {
            Kind::St(v) => {
                let mut out = v.to_f32_range((self.row_offset + row0) * k, n_rows * k)?;
                if let Some((scale, cols, [bn, bk])) = &self.fp8_scale {
                    for (r, row) in out.chunks_exact_mut(k).enumerate() {
                        let srow = &scale[(self.row_offset + row0 + r) / bn * cols..][..*cols];
                        for (c, x) in row.iter_mut().enumerate() {
                            *x *= srow[c / bk];
                        }
                    }
                }
                Ok(out)
            }
            Kind::Gguf(g, info) => {
                let row_bytes = info.row_bytes() as usize;
                let start = (self.row_offset + row0) * row_bytes;
                let bytes = &g.data(info)[start..start + n_rows * row_bytes];
                let mut out = vec![0.0f32; n_rows * k];
                dequantize_row(info.ggml_type, bytes, &mut out)
                    .map_err(|e| self.bad(e.to_string()))?;
                Ok(out)
            }
            Kind::Built(_, values, _) => {
                Ok(values[(self.row_offset + row0) * k..][..n_rows * k].to_vec())
            }
            Kind::Packed(..) => Err(self.bad(
                "stored packed for the kernels; the model asked for its values (the file does not match this model code: re-run `strata convert`)".into(),
            )),
        }
    }

    /// All values as f32.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let rows: usize = self.shape.iter().rev().skip(1).product();
        self.rows_f32(0, rows)
    }

    /// The safetensors view and element offset, when the data is BF16 that can be used in
    /// place.
    pub fn mapped_bf16(&self) -> Option<(&TensorView, usize)> {
        match &self.kind {
            Kind::St(v) if v.dtype() == DType::BF16 && v.as_bf16().is_some() => {
                Some((v, self.row_offset * self.row_len()))
            }
            _ => None,
        }
    }

    /// Whether the stored values are f32 (kept as f32 for dense layers in the fast path).
    pub fn is_f32(&self) -> bool {
        match &self.kind {
            Kind::St(v) => v.dtype() == DType::F32,
            Kind::Gguf(_, info) => info.ggml_type == GgmlType::F32,
            Kind::Built(_, _, ty) => *ty == GgmlType::F32,
            Kind::Packed(..) => false,
        }
    }

    /// Whether the data are ggml blocks as a GGUF stores them (a GGUF tensor, or ggml blocks
    /// of a converted model), whose bytes [`Tensor::ggml_rows`] views.
    pub fn is_ggml(&self) -> bool {
        match &self.kind {
            Kind::Gguf(..) => true,
            Kind::Packed(_, t) => matches!(t.kind, StoredKind::Ggml(_)),
            Kind::St(_) | Kind::Built(..) => false,
        }
    }

    /// The stored element type's name (`BF16`, `Q4_K`, ...).
    pub fn dtype_name(&self) -> String {
        match &self.kind {
            Kind::St(v) => v.dtype().to_string(),
            Kind::Gguf(_, info) => info.ggml_type.name().to_string(),
            Kind::Built(_, _, ty) => ty.name().to_string(),
            Kind::Packed(_, t) => stored_kind_name(t.kind),
        }
    }

    /// The packed matrix a converted model stores under this name, mapped in place.
    pub fn stored_packed(&self) -> Option<Result<strata_kernels::PackedMatrix>> {
        match &self.kind {
            Kind::Packed(f, t) if matches!(t.kind, StoredKind::Packed(_)) => {
                Some(f.packed(t).map_err(Error::Format))
            }
            _ => None,
        }
    }

    /// Rows `row0 .. row0 + n_rows` as ggml blocks viewed in the mapped file, when the
    /// tensor is a GGUF tensor in any type but F32 (the fast path keeps F32 weights as f32)
    /// or ggml blocks of a converted model; `None` otherwise. A type without a kernel is
    /// an error naming the tensor.
    pub fn ggml_rows(&self, row0: usize, n_rows: usize) -> Result<Option<GgmlMatrix>> {
        let k = self.row_len();
        let (matrix, first) = match &self.kind {
            Kind::Gguf(g, info) if info.ggml_type != GgmlType::F32 => {
                let bytes = g.data(info);
                let start = bytes.as_ptr() as usize - g.file().bytes().as_ptr() as usize;
                let rows = info.n_rows() as usize;
                let owner: Arc<dyn StableBytes> = Arc::new(g.file().clone());
                let m = GgmlMatrix::from_stored(
                    owner,
                    info.ggml_type,
                    rows,
                    k,
                    start..start + bytes.len(),
                );
                (m.map_err(|e| self.bad(e.to_string()))?, self.row_offset)
            }
            Kind::Packed(f, t) if matches!(t.kind, StoredKind::Ggml(_)) => {
                (f.ggml(t).map_err(Error::Format)?, self.row_offset)
            }
            _ => return Ok(None),
        };
        let rows = first + row0..first + row0 + n_rows;
        matrix
            .rows(rows)
            .map(Some)
            .map_err(|e| self.bad(e.to_string()))
    }
}
