//! `MoeWeights.from_ggml`: a layer's experts as ggml blocks, the `*_exps` tensors of a GGUF
//! file, computed by `strata_kernels::ggml` in their own format (no requantization).
//!
//! A key design decision: the blocks are copied once into memory Rust owns. Borrowing the
//! caller's array for the life of the weights would need it to stay unchanged while no call
//! holds the GIL, which neither the buffer protocol nor DLPack promises (a torch tensor can
//! be written in place at any time); a copy of the quantized bytes costs what the file
//! takes, and the caller may drop its own.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use strata_kernels::ggml::{GgmlExperts, GgmlMatrix, GgmlType};

use crate::buffer::View;

/// `obj` as a ggml type: its name (`"Q4_K"`, any case) or ggml's id (an int, such as the
/// `gguf` package's `GGMLQuantizationType`, `tensor.tensor_type`).
pub(crate) fn parse_type(obj: &Bound<'_, PyAny>) -> PyResult<GgmlType> {
    let ty = if let Ok(id) = obj.extract::<u32>() {
        GgmlType::from_id(id)
    } else if let Ok(name) = obj.extract::<String>() {
        GgmlType::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(&name))
    } else {
        return Err(PyTypeError::new_err(
            "ggml_type: expected a ggml type name (\"Q4_K\") or id (gguf's tensor_type)",
        ));
    };
    let ty = ty.ok_or_else(|| {
        PyValueError::new_err(format!(
            "ggml_type: unknown ggml type {}",
            obj.repr().map_or_else(|_| "?".into(), |r| r.to_string())
        ))
    })?;
    if !ty.can_dequantize() {
        return Err(PyValueError::new_err(format!(
            "ggml_type: {} has no kernel in Strata",
            ty.name()
        )));
    }
    Ok(ty)
}

/// The bytes of `ty` rows of `k` values; a `ValueError` naming `what` (`hidden` or
/// `intermediate`) when `k` is not a whole number of blocks.
fn row_bytes(ty: GgmlType, k: usize, what: &str) -> PyResult<usize> {
    ty.row_bytes(k as u64).map(|b| b as usize).ok_or_else(|| {
        PyValueError::new_err(format!(
            "{what}={k} is not a multiple of {}'s block of {} values",
            ty.name(),
            ty.block_size()
        ))
    })
}

/// `obj`, `[experts, rows, row_bytes]` uint8 blocks of rows of `k` values (a GGUF `*_exps`
/// tensor as the `gguf` package reads it), copied into one `[experts · rows, k]` matrix.
fn stacked(
    obj: &Bound<'_, PyAny>,
    name: &'static str,
    ty: GgmlType,
    experts: Option<usize>,
    rows: usize,
    k: usize,
    row_bytes: usize,
) -> PyResult<(GgmlMatrix, usize)> {
    let v = View::<u8>::new(obj, name, "uint8", false)?;
    let e = match (experts, v.shape()) {
        (Some(e), _) => e,
        (None, [e, ..]) => *e,
        (None, s) => {
            return Err(PyValueError::new_err(format!(
                "{name}: expected shape [experts, rows, bytes per row], got {s:?}"
            )));
        }
    };
    let want = e * rows * row_bytes;
    let got = v.as_slice().len();
    if got != want {
        return Err(PyValueError::new_err(format!(
            "{name}: {e} experts of [{rows}, {k}] {} take {want} bytes, got {got}",
            ty.name()
        )));
    }
    if v.shape() != [e, rows, row_bytes] {
        return Err(PyValueError::new_err(format!(
            "{name}: expected shape [experts={e}, rows={rows}, bytes per row={row_bytes}] \
             (a GGUF *_exps tensor's data), got {:?}",
            v.shape()
        )));
    }
    let m = GgmlMatrix::from_vec(ty, e * rows, k, v.as_slice().to_vec())
        .map_err(|err| PyValueError::new_err(err.to_string()))?;
    Ok((m, e))
}

/// The experts from `w2` (`ffn_down_exps`, `[E, H, row bytes of I]`) and `w13`
/// (`ffn_gate_up_exps`, `[E, 2I, row bytes of H]`, gate rows then up rows) or `w1`/`w3`
/// (`ffn_gate_exps`/`ffn_up_exps`, `[E, I, row bytes of H]`), all of type `ty`.
pub(crate) fn experts(
    ty: GgmlType,
    w2: &Bound<'_, PyAny>,
    w13: Option<&Bound<'_, PyAny>>,
    w1: Option<&Bound<'_, PyAny>>,
    w3: Option<&Bound<'_, PyAny>>,
    hidden: usize,
    inter: usize,
) -> PyResult<GgmlExperts> {
    let (rb_h, rb_i) = (
        row_bytes(ty, hidden, "hidden")?,
        row_bytes(ty, inter, "intermediate")?,
    );
    let (down, e) = stacked(w2, "w2", ty, None, hidden, inter, rb_i)?;
    let kernel = |r: Result<GgmlExperts, _>| {
        r.map_err(|err: strata_kernels::KernelError| PyValueError::new_err(err.to_string()))
    };
    match (w13, w1, w3) {
        (Some(w13), None, None) => {
            let (gu, _) = stacked(w13, "w13", ty, Some(e), 2 * inter, hidden, rb_h)?;
            let expert_rows = |half: usize| {
                (0..e)
                    .map(|x| gu.rows((2 * x + half) * inter..(2 * x + half + 1) * inter))
                    .collect::<Result<Vec<_>, _>>()
            };
            let downs = (0..e)
                .map(|x| down.rows(x * hidden..(x + 1) * hidden))
                .collect::<Result<Vec<_>, _>>();
            kernel(
                expert_rows(0).and_then(|gates| {
                    GgmlExperts::new(gates, expert_rows(1)?, downs?, hidden, inter)
                }),
            )
        }
        (None, Some(w1), Some(w3)) => {
            let (gate, _) = stacked(w1, "w1", ty, Some(e), inter, hidden, rb_h)?;
            let (up, _) = stacked(w3, "w3", ty, Some(e), inter, hidden, rb_h)?;
            kernel(GgmlExperts::from_stacked(
                &gate, &up, &down, e, hidden, inter,
            ))
        }
        _ => Err(PyTypeError::new_err(
            "MoeWeights.from_ggml: give w13 (gate and up stacked) or both w1 and w3",
        )),
    }
}
