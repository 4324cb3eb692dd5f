//! Zero-copy views of Python buffers: numpy arrays and anything else with the buffer
//! protocol (a torch CPU tensor through `tensor.numpy()`, which shares its memory).
//!
//! A key design decision: the views are taken and used while the interpreter is attached
//! (the GIL is held, see [`crate::ops`]), so no Python code runs while Rust reads or writes
//! the memory; each buffer also keeps its exporter alive until it is dropped.
#![allow(unsafe_code)]

use pyo3::buffer::{Element, PyBuffer, PyUntypedBuffer};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

/// A checked buffer: element type `T`, C-contiguous, writable if asked.
pub(crate) struct View<T> {
    buf: PyBuffer<T>,
    name: &'static str,
}

/// What `obj` holds, for messages: numpy's dtype name where it has one, else the buffer's
/// struct format.
fn dtype_of(obj: &Bound<'_, PyAny>, format: &str) -> String {
    obj.getattr("dtype")
        .and_then(|d| d.str().map(|s| s.to_string()))
        .unwrap_or_else(|_| format!("buffer format '{format}'"))
}

impl<T: Element> View<T> {
    /// Takes `obj`'s buffer as `dtype` (the numpy name, for messages): a `TypeError` when it
    /// has no buffer or another element type, a `ValueError` when it is not C-contiguous or,
    /// with `writable`, read-only.
    pub(crate) fn new(
        obj: &Bound<'_, PyAny>,
        name: &'static str,
        dtype: &str,
        writable: bool,
    ) -> PyResult<View<T>> {
        let untyped = PyUntypedBuffer::get(obj).map_err(|_| {
            let ty = obj
                .get_type()
                .name()
                .map_or_else(|_| "?".into(), |n| n.to_string());
            PyTypeError::new_err(format!(
                "{name}: expected a {dtype} array with the buffer protocol (numpy; a torch CPU \
                 tensor passes through .numpy()), got {ty}"
            ))
        })?;
        let format = untyped.format().to_string_lossy().into_owned();
        let buf = untyped.into_typed::<T>().map_err(|e| {
            PyTypeError::new_err(format!(
                "{name}: expected dtype {dtype}, got {} ({e})",
                dtype_of(obj, &format)
            ))
        })?;
        if !buf.is_c_contiguous() {
            return Err(PyValueError::new_err(format!(
                "{name}: not C-contiguous (shape {:?}, strides {:?} bytes); pass a contiguous \
                 array (numpy.ascontiguousarray, tensor.contiguous()): views are used in place, \
                 never copied",
                buf.shape(),
                buf.strides()
            )));
        }
        if writable && buf.readonly() {
            return Err(PyValueError::new_err(format!(
                "{name}: the array is read-only, and the result is written into it"
            )));
        }
        Ok(View { buf, name })
    }

    /// The shape.
    pub(crate) fn shape(&self) -> &[usize] {
        self.buf.shape()
    }

    /// The name the caller gave it (for messages).
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    /// Address range of the data, for overlap checks.
    pub(crate) fn span(&self) -> std::ops::Range<usize> {
        let start = self.buf.buf_ptr() as usize;
        start..start + self.buf.len_bytes()
    }

    /// The elements in C order, without a copy.
    pub(crate) fn as_slice(&self) -> &[T] {
        match self.buf.as_slice_ptr() {
            // SAFETY: the buffer is C-contiguous with `item_count` elements of `T` (format,
            // size and alignment checked by `into_typed`), and stays valid while `self.buf`
            // holds it. The GIL is held by every caller, so no Python code writes it
            // meanwhile; a mutable view of the same memory is refused by `disjoint`.
            Some(p) if self.buf.item_count() > 0 => unsafe { p.as_ref() },
            _ => &[],
        }
    }

    /// The elements in C order, writable, without a copy.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [T] {
        match self.buf.as_slice_ptr() {
            // SAFETY: as in `as_slice`, and the buffer is writable (checked in `new`); this
            // is the only Rust reference to it (`&mut self`), and callers check with
            // `disjoint` that no other view they read overlaps it.
            Some(mut p) if self.buf.item_count() > 0 && !self.buf.readonly() => unsafe {
                p.as_mut()
            },
            _ => &mut [],
        }
    }
}

/// Fails when `out`'s memory overlaps one of `inputs`' (reading and writing the same memory
/// at once would be undefined behaviour).
pub(crate) fn disjoint<T: Element>(
    out: &View<T>,
    inputs: &[(&'static str, std::ops::Range<usize>)],
) -> PyResult<()> {
    let o = out.span();
    for (name, r) in inputs {
        if o.start < r.end && r.start < o.end {
            return Err(PyValueError::new_err(format!(
                "{}: overlaps {name}; the output must be a separate array",
                out.name()
            )));
        }
    }
    Ok(())
}
