//! `strata.ops`: the fused MoE operator on Strata's CPU kernels, for other engines (vLLM,
//! SGLang, plain torch/numpy code).
//!
//! [`MoeWeights`] packs a layer's experts once into a packed format (BF16, INT8, INT4), or
//! takes them as ggml blocks (a GGUF's `*_exps` tensors, see [`crate::ggml`]);
//! [`fused_moe`] then computes `out[t] = Σ_j w[t, j] · expert_{ids[t, j]}(x[t])` reading the
//! activations and writing the output in place: nothing of the `[T, H]` tensors is copied.
//! Expert weights come in vLLM's layouts: `w13 [E, 2I, H]` (gate rows, then up rows) or
//! separate `w1`/`w3 [E, I, H]`, and `w2 [E, H, I]`. An expert split along its intermediate
//! dimension (a tensor-parallel rank's slice) is just a smaller `I`: its output is the
//! rank's partial sum.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use std::borrow::Cow;
use strata_kernels::ggml::{GgmlExperts, GgmlType, fused_moe_ggml};
use strata_kernels::moe::{Expert, MoeExperts, MoeOptions, fused_moe_with, group_by_expert};

use half::bf16;
use strata_kernels::{KernelError, PackSource, PackedFormat};

use crate::buffer::{Array, Elem, View, disjoint};
use crate::ggml;

/// A kernel error as a Python `ValueError` with the kernel's message.
fn kernel_err(e: KernelError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// `bf16`, `int8` (one scale per row), `int4` (one scale per 32 values), or a name with an
/// explicit group as `PackedFormat::name` writes it (`int8g64`, `int4g128`).
fn parse_format(name: &str) -> PyResult<PackedFormat> {
    let fmt = match name {
        "bf16" => PackedFormat::Bf16,
        "int8" => PackedFormat::Int8 { group: None },
        "int4" => PackedFormat::Int4 { group: 32 },
        _ => {
            let group = |prefix: &str| {
                name.strip_prefix(prefix)
                    .and_then(|g| g.parse::<usize>().ok())
                    .filter(|g| matches!(g, 32 | 64 | 128))
            };
            match (group("int8g"), group("int4g")) {
                (Some(g), _) => PackedFormat::Int8 { group: Some(g) },
                (_, Some(g)) => PackedFormat::Int4 { group: g },
                _ => {
                    return Err(PyValueError::new_err(format!(
                        "format: expected bf16, int8, int4, int8g32/64/128 or int4g32/64/128, \
                         got '{name}'"
                    )));
                }
            }
        }
    };
    Ok(fmt)
}

/// Checks that `view` is `[dims...]`, naming what each dimension is.
fn check_shape<T: Elem>(view: &View<T>, want: &[(usize, &str)]) -> PyResult<()> {
    let got = view.shape();
    if got.len() != want.len() || got.iter().zip(want).any(|(g, (w, _))| g != w) {
        let names: Vec<String> = want.iter().map(|(n, what)| format!("{what}={n}")).collect();
        return Err(PyValueError::new_err(format!(
            "{}: expected shape [{}], got {:?}",
            view.name(),
            names.join(", "),
            got
        )));
    }
    Ok(())
}

/// Packs a layer from `w2 [E, H, I]` and `w13 [E, 2I, H]` or `w1`/`w3 [E, I, H]`, each
/// taken by `typed`, expert by expert: `convert` gives one expert's matrix in a type the
/// kernels pack from, so at most one expert is converted at a time.
fn pack_layer<T: Elem, S: PackSource>(
    w2: View<T>,
    w13: Option<&Bound<'_, PyAny>>,
    w1: Option<&Bound<'_, PyAny>>,
    w3: Option<&Bound<'_, PyAny>>,
    fmt: PackedFormat,
    typed: impl Fn(Array<'_, '_>) -> PyResult<View<T>>,
    convert: impl Fn(&[T]) -> Cow<'_, [S]>,
) -> PyResult<MoeExperts> {
    let &[e, h, i] = w2.shape() else {
        return Err(PyValueError::new_err(format!(
            "w2: expected shape [experts, hidden, intermediate], got {:?}",
            w2.shape()
        )));
    };
    let dtype = "float32 or bfloat16";
    let (e_, i_, h_) = ((e, "experts"), (i, "intermediate"), (h, "hidden"));
    // The gate matrices, and the up matrices when they are separate (else the second half
    // of each expert's w13 block).
    let (gates, ups) = match (w13, w1, w3) {
        (Some(w13), None, None) => {
            let w13 = typed(Array::new(w13, "w13", dtype)?)?;
            check_shape(&w13, &[e_, (2 * i, "2*intermediate"), h_])?;
            (w13, None)
        }
        (None, Some(w1), Some(w3)) => {
            let w1 = typed(Array::new(w1, "w1", dtype)?)?;
            let w3 = typed(Array::new(w3, "w3", dtype)?)?;
            check_shape(&w1, &[e_, i_, h_])?;
            check_shape(&w3, &[e_, i_, h_])?;
            (w1, Some(w3))
        }
        _ => {
            return Err(PyTypeError::new_err(
                "MoeWeights: give w13 (gate and up stacked) or both w1 and w3",
            ));
        }
    };
    let (a, down) = (gates.as_slice(), w2.as_slice());
    let b = ups.as_ref().map(View::as_slice);
    let ih = i * h;
    let experts = (0..e)
        .map(|x| {
            let (gate, up) = match b {
                Some(b) => (&a[x * ih..(x + 1) * ih], &b[x * ih..(x + 1) * ih]),
                None => (
                    &a[2 * x * ih..(2 * x + 1) * ih],
                    &a[(2 * x + 1) * ih..(2 * x + 2) * ih],
                ),
            };
            let (gate, up) = (convert(gate), convert(up));
            let down = convert(&down[x * ih..(x + 1) * ih]);
            Expert::pack(&gate, &up, &down, h, i, fmt)
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(kernel_err)?;
    MoeExperts::new(h, i, experts).map_err(kernel_err)
}

/// The experts a [`MoeWeights`] computes with.
enum Layer {
    /// Packed by Strata, in this format.
    Packed(MoeExperts, PackedFormat),
    /// ggml blocks of this type, as a GGUF file stores them.
    Ggml(GgmlExperts, GgmlType),
}

impl Layer {
    fn len(&self) -> usize {
        match self {
            Layer::Packed(e, _) => e.len(),
            Layer::Ggml(e, _) => e.len(),
        }
    }

    fn hidden(&self) -> usize {
        match self {
            Layer::Packed(e, _) => e.hidden(),
            Layer::Ggml(e, _) => e.hidden(),
        }
    }

    fn inter(&self) -> usize {
        match self {
            Layer::Packed(e, _) => e.inter(),
            Layer::Ggml(e, _) => e.inter(),
        }
    }

    /// The fused MoE of `x [T, H]` routed by `ids`/`w [T, k]` into `out [T, H]`.
    fn run(
        &self,
        x: &[f32],
        ids: &[u32],
        w: &[f32],
        k: usize,
        out: &mut [f32],
        opts: &MoeOptions,
    ) -> Result<(), KernelError> {
        match self {
            Layer::Packed(e, _) => fused_moe_with(e, x, ids, w, out, opts),
            Layer::Ggml(e, _) => {
                let batches = group_by_expert(e.len(), ids, w, k)?;
                fused_moe_ggml(e, x, &batches, out, opts)
            }
        }
    }
}

/// A layer's routed experts for the CPU kernels: packed by Strata, or ggml blocks.
#[pyclass(module = "strata._strata", frozen)]
pub struct MoeWeights {
    layer: Layer,
}

#[pymethods]
impl MoeWeights {
    /// Packs `w2 [E, H, I]` with `w13 [E, 2I, H]` (gate rows then up rows, vLLM's layout)
    /// or with `w1` (gate) and `w3` (up), both `[E, I, H]`; C-contiguous, all float32 or
    /// all bfloat16 (DLPack: a torch tensor), read one expert at a time.
    #[new]
    #[pyo3(signature = (w2, *, w13=None, w1=None, w3=None, format="bf16"))]
    fn new(
        w2: &Bound<'_, PyAny>,
        w13: Option<&Bound<'_, PyAny>>,
        w1: Option<&Bound<'_, PyAny>>,
        w3: Option<&Bound<'_, PyAny>>,
        format: &str,
    ) -> PyResult<MoeWeights> {
        let fmt = parse_format(format)?;
        let w2 = Array::new(w2, "w2", "float32 or bfloat16")?;
        let experts = if w2.is_bf16() {
            let as_bf16 = |a: Array<'_, '_>| a.typed::<i16>("bfloat16 (as w2)", false);
            // One expert at a time as `bf16` values (the kernels pack from those).
            pack_layer(as_bf16(w2)?, w13, w1, w3, fmt, as_bf16, |s: &[i16]| {
                Cow::Owned(s.iter().map(|&b| bf16::from_bits(b as u16)).collect())
            })?
        } else {
            let f32s = |a: Array<'_, '_>| a.typed::<f32>("float32 or bfloat16", false);
            // Float32 weights are packed from the caller's memory as they are.
            pack_layer(f32s(w2)?, w13, w1, w3, fmt, f32s, |s| Cow::Borrowed(s))?
        };
        Ok(MoeWeights {
            layer: Layer::Packed(experts, fmt),
        })
    }

    /// A layer's experts as ggml blocks of type `ggml_type` (a name, `"Q4_K"`, or ggml's id:
    /// gguf's `tensor.tensor_type`), uint8 arrays as a GGUF stores its `*_exps` tensors
    /// (`tensor.data` of the `gguf` package's reader): `w2` (`ffn_down_exps`) `[E, H, bytes
    /// of a row of I]` with `w13` (`ffn_gate_up_exps`) `[E, 2I, bytes of a row of H]` or
    /// `w1`/`w3` (`ffn_gate_exps`/`ffn_up_exps`) `[E, I, bytes of a row of H]`. The blocks
    /// are copied once, as they are, and computed in their own format.
    #[staticmethod]
    #[pyo3(signature = (ggml_type, w2, *, w13=None, w1=None, w3=None, hidden, intermediate))]
    fn from_ggml(
        ggml_type: &Bound<'_, PyAny>,
        w2: &Bound<'_, PyAny>,
        w13: Option<&Bound<'_, PyAny>>,
        w1: Option<&Bound<'_, PyAny>>,
        w3: Option<&Bound<'_, PyAny>>,
        hidden: usize,
        intermediate: usize,
    ) -> PyResult<MoeWeights> {
        let ty = ggml::parse_type(ggml_type)?;
        let experts = ggml::experts(ty, w2, w13, w1, w3, hidden, intermediate)?;
        Ok(MoeWeights {
            layer: Layer::Ggml(experts, ty),
        })
    }

    /// Number of experts.
    #[getter]
    fn num_experts(&self) -> usize {
        self.layer.len()
    }

    /// Hidden size `H`.
    #[getter]
    fn hidden_size(&self) -> usize {
        self.layer.hidden()
    }

    /// Intermediate size `I` (of this slice, for a tensor-parallel rank).
    #[getter]
    fn intermediate_size(&self) -> usize {
        self.layer.inter()
    }

    /// The format's name: packed (`bf16`, `int8`, `int4g32`...) or ggml's (`Q4_K`...).
    #[getter]
    fn format(&self) -> String {
        match &self.layer {
            Layer::Packed(_, fmt) => fmt.name(),
            Layer::Ggml(_, ty) => ty.name().to_string(),
        }
    }

    /// Bytes of weights and scales.
    #[getter]
    fn nbytes(&self) -> usize {
        match &self.layer {
            Layer::Packed(e, _) => e.experts().iter().map(Expert::bytes).sum(),
            Layer::Ggml(e, _) => e.bytes(),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "MoeWeights(experts={}, hidden={}, intermediate={}, format={})",
            self.layer.len(),
            self.layer.hidden(),
            self.layer.inter(),
            self.format()
        )
    }
}

/// `hidden_states`' token count, checking it is `[T, H]`.
fn tokens<T: Elem>(x: &View<T>, h: usize) -> PyResult<usize> {
    let &[t, xh] = x.shape() else {
        return Err(PyValueError::new_err(format!(
            "hidden_states: expected shape [tokens, hidden={h}], got {:?}",
            x.shape()
        )));
    };
    if xh != h {
        return Err(PyValueError::new_err(format!(
            "hidden_states: hidden size {xh}, the experts' is {h}"
        )));
    }
    Ok(t)
}

/// A bfloat16 value (its bit pattern, as an `int16` view carries it) as f32: exact.
fn bf16_to_f32(b: i16) -> f32 {
    f32::from_bits(u32::from(b as u16) << 16)
}

thread_local! {
    /// The f32 activations and output of a bfloat16 call, kept per calling thread so that
    /// each layer's call does not allocate and fault in fresh memory.
    static BF16_SCRATCH: std::cell::RefCell<(Vec<f32>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Threads of Strata's kernel pool in this process (started on first use; `STRATA_THREADS`
/// and `STRATA_CPUS` are read then): what a host engine's binding gave Strata.
#[pyfunction]
pub fn num_threads() -> usize {
    strata_kernels::num_threads()
}

/// The fused MoE layer into `out`: `hidden_states [T, H]`, `topk_weights [T, k]` float32,
/// `topk_ids [T, k]` int32 or int64, `out [T, H]` (written, or added to with
/// `accumulate`); each an array with the buffer protocol or a DLPack tensor (torch, numpy),
/// on the CPU, used in place. `dtype` is the activations' (`hidden_states` and `out`):
/// `float32`, or `bfloat16`: a DLPack bfloat16 tensor, or an `int16` view of one (numpy has
/// no bfloat16), converted to f32 here, in Rust, and the result rounded to nearest even as
/// torch rounds. By default: `bfloat16` for a DLPack bfloat16 `hidden_states`, else
/// `float32`. Returns nothing; the Python wrapper returns `out`.
#[pyfunction]
#[pyo3(signature = (hidden_states, weights, topk_weights, topk_ids, out, *, accumulate=false, dtype=None))]
pub fn fused_moe_into(
    hidden_states: &Bound<'_, PyAny>,
    weights: &MoeWeights,
    topk_weights: &Bound<'_, PyAny>,
    topk_ids: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    accumulate: bool,
    dtype: Option<&str>,
) -> PyResult<()> {
    let h = weights.layer.hidden();
    let opts = MoeOptions {
        accumulate,
        ..MoeOptions::default()
    };
    let routing = |t: usize| -> PyResult<(View<f32>, Vec<u32>, usize)> {
        let w = View::<f32>::new(topk_weights, "topk_weights", "float32", false)?;
        let k = w.shape().get(1).copied().unwrap_or(0);
        check_shape(&w, &[(t, "tokens"), (k, "topk")])?;
        let ids = expert_ids(topk_ids, t, k, weights.layer.len())?;
        Ok((w, ids, k))
    };
    // The GIL stays held: the views are only sound while no Python code can touch the
    // arrays (see crate::buffer). Strata's own pool threads do the work.
    let xs = Array::new(hidden_states, "hidden_states", "float32 or bfloat16")?;
    let bf16 = match dtype {
        None => xs.is_bf16(),
        Some("float32") => false,
        Some("bfloat16") => true,
        Some(other) => {
            return Err(PyValueError::new_err(format!(
                "dtype: expected float32 or bfloat16, got '{other}'"
            )));
        }
    };
    match bf16 {
        false => {
            let x = xs.typed::<f32>("float32 or bfloat16", false)?;
            let t = tokens(&x, h)?;
            let (w, ids, k) = routing(t)?;
            let mut o = View::<f32>::new(out, "out", "float32", true)?;
            check_shape(&o, &[(t, "tokens"), (h, "hidden")])?;
            disjoint(
                &o,
                &[("hidden_states", x.span()), ("topk_weights", w.span())],
            )?;
            weights
                .layer
                .run(x.as_slice(), &ids, w.as_slice(), k, o.as_mut_slice(), &opts)
                .map_err(kernel_err)
        }
        true => {
            let bf16 = "bfloat16 (a tensor, or a numpy int16 view of one)";
            let x = xs.typed::<i16>(bf16, false)?;
            let t = tokens(&x, h)?;
            let (w, ids, k) = routing(t)?;
            let mut o = View::<i16>::new(out, "out", bf16, true)?;
            check_shape(&o, &[(t, "tokens"), (h, "hidden")])?;
            disjoint(
                &o,
                &[("hidden_states", x.span()), ("topk_weights", w.span())],
            )?;
            BF16_SCRATCH.with_borrow_mut(|(xs, os)| {
                xs.clear();
                xs.extend(x.as_slice().iter().map(|&b| bf16_to_f32(b)));
                os.clear();
                if accumulate {
                    os.extend(o.as_slice().iter().map(|&b| bf16_to_f32(b)));
                } else {
                    os.resize(t * h, 0.0);
                }
                weights
                    .layer
                    .run(xs, &ids, w.as_slice(), k, os, &opts)
                    .map_err(kernel_err)?;
                for (d, &v) in o.as_mut_slice().iter_mut().zip(os.iter()) {
                    *d = half::bf16::from_f32(v).to_bits() as i16;
                }
                Ok(())
            })
        }
    }
}

/// `topk_ids [T, k]` (int32 or int64) as the kernel's `u32` ids, each checked to name an
/// expert. A copy, but of `T·k` small integers, not of the activations.
fn expert_ids(obj: &Bound<'_, PyAny>, t: usize, k: usize, experts: usize) -> PyResult<Vec<u32>> {
    let ids: Vec<i64> = match View::<i32>::new(obj, "topk_ids", "int32 or int64", false) {
        Ok(v) => {
            check_shape(&v, &[(t, "tokens"), (k, "topk")])?;
            v.as_slice().iter().map(|&i| i64::from(i)).collect()
        }
        // Not int32: int64 then (its error names both); other failures are final.
        Err(e) if !e.is_instance_of::<PyTypeError>(obj.py()) => return Err(e),
        Err(_) => {
            let v = View::<i64>::new(obj, "topk_ids", "int32 or int64", false)?;
            check_shape(&v, &[(t, "tokens"), (k, "topk")])?;
            v.as_slice().to_vec()
        }
    };
    ids.iter()
        .enumerate()
        .map(|(j, &id)| {
            u32::try_from(id)
                .ok()
                .filter(|&u| (u as usize) < experts)
                .ok_or_else(|| {
                    PyValueError::new_err(format!(
                        "topk_ids: id {id} at token {}, slot {} is not an expert (0..{experts})",
                        j / k.max(1),
                        j % k.max(1)
                    ))
                })
        })
        .collect()
}
