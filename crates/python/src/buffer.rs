//! Zero-copy views of Python arrays: numpy arrays and anything else with the buffer
//! protocol, and any tensor exporting DLPack (torch, JAX, numpy too; see [`crate::dlpack`]).
//!
//! A key design decision: the views are taken and used while the interpreter is attached
//! (the GIL is held, see [`crate::ops`]), so no Python code runs while Rust reads or writes
//! the memory; each view also keeps its exporter alive (a buffer) or owns the exported
//! tensor (DLPack) until it is dropped.
#![allow(unsafe_code)]

use pyo3::buffer::{Element, PyBuffer, PyUntypedBuffer};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::dlpack::{DlDataType, DlTensor};

/// An element type a view can hold, with its DLPack type.
pub(crate) trait Elem: Element {
    /// The DLPack type of the same bits. `i16` stands for bfloat16: a buffer of int16 (numpy
    /// has no bfloat16; a torch bfloat16 tensor viewed as int16) or a DLPack bfloat16 tensor.
    const DL: DlDataType;
}

impl Elem for f32 {
    const DL: DlDataType = DlDataType::scalar(2, 32);
}
impl Elem for i16 {
    const DL: DlDataType = DlDataType::scalar(4, 16);
}
impl Elem for i32 {
    const DL: DlDataType = DlDataType::scalar(0, 32);
}
impl Elem for i64 {
    const DL: DlDataType = DlDataType::scalar(0, 64);
}
impl Elem for u8 {
    const DL: DlDataType = DlDataType::scalar(1, 8);
}

/// Where an array's memory comes from.
enum Source {
    Buffer(PyUntypedBuffer),
    DlPack(DlTensor),
}

/// An argument's memory before its element type is checked.
pub(crate) struct Array<'a, 'py> {
    src: Source,
    obj: &'a Bound<'py, PyAny>,
    name: &'static str,
}

impl<'a, 'py> Array<'a, 'py> {
    /// `obj`'s memory through the buffer protocol, else through DLPack; a `TypeError` when
    /// it has neither (`dtype` names what was expected, for the message).
    pub(crate) fn new(
        obj: &'a Bound<'py, PyAny>,
        name: &'static str,
        dtype: &str,
    ) -> PyResult<Array<'a, 'py>> {
        let src = match PyUntypedBuffer::get(obj) {
            Ok(b) => Source::Buffer(b),
            Err(_) => match DlTensor::take(obj, name)? {
                Some(t) => Source::DlPack(t),
                None => {
                    let ty = obj
                        .get_type()
                        .name()
                        .map_or_else(|_| "?".into(), |n| n.to_string());
                    return Err(PyTypeError::new_err(format!(
                        "{name}: expected a {dtype} array (the buffer protocol or DLPack: \
                         numpy, torch...), got {ty}"
                    )));
                }
            },
        };
        Ok(Array { src, obj, name })
    }

    /// Whether it is a DLPack bfloat16 tensor.
    pub(crate) fn is_bf16(&self) -> bool {
        matches!(&self.src, Source::DlPack(t) if t.dtype() == i16::DL)
    }

    /// The view as `T` (`dtype`, the name for messages): a `TypeError` for another element
    /// type, a `ValueError` when it is not C-contiguous or, with `writable`, read-only.
    pub(crate) fn typed<T: Elem>(self, dtype: &str, writable: bool) -> PyResult<View<T>> {
        let name = self.name;
        let wrong = |got: String, why: String| {
            PyTypeError::new_err(format!("{name}: expected dtype {dtype}, got {got}{why}"))
        };
        let (keep, ptr, shape, readonly) = match self.src {
            Source::Buffer(untyped) => {
                let format = untyped.format().to_string_lossy().into_owned();
                let buf = untyped
                    .into_typed::<T>()
                    .map_err(|e| wrong(dtype_of(self.obj, &format), format!(" ({e})")))?;
                if !buf.is_c_contiguous() {
                    return Err(PyValueError::new_err(format!(
                        "{name}: not C-contiguous (shape {:?}, strides {:?} bytes); pass a \
                         contiguous array (numpy.ascontiguousarray, tensor.contiguous()): \
                         views are used in place, never copied",
                        buf.shape(),
                        buf.strides()
                    )));
                }
                let (ptr, shape) = (buf.buf_ptr().cast::<T>(), buf.shape().to_vec());
                let readonly = buf.readonly();
                (Keep::Buffer(buf), ptr, shape, readonly)
            }
            Source::DlPack(t) => {
                if t.dtype() != T::DL {
                    return Err(wrong(t.dtype().name(), String::new()));
                }
                if writable && t.copied() {
                    return Err(PyValueError::new_err(format!(
                        "{name}: its producer exported a copy through DLPack, and the result \
                         is written into it"
                    )));
                }
                let ptr = t.data().cast::<T>();
                if !ptr.is_aligned() {
                    return Err(PyValueError::new_err(format!(
                        "{name}: data at {ptr:p} is not aligned for {dtype}"
                    )));
                }
                let (shape, readonly) = (t.shape().to_vec(), t.readonly());
                (Keep::DlPack(t), ptr, shape, readonly)
            }
        };
        if writable && readonly {
            return Err(PyValueError::new_err(format!(
                "{name}: the array is read-only, and the result is written into it"
            )));
        }
        let len = shape.iter().product();
        Ok(View {
            _keep: keep,
            ptr,
            len,
            shape,
            readonly,
            name,
        })
    }
}

/// What keeps a view's memory alive (held, never read).
#[allow(dead_code)]
enum Keep<T> {
    Buffer(PyBuffer<T>),
    DlPack(DlTensor),
}

/// A checked array: element type `T`, C-contiguous, writable if asked.
pub(crate) struct View<T> {
    _keep: Keep<T>,
    ptr: *mut T,
    len: usize,
    shape: Vec<usize>,
    readonly: bool,
    name: &'static str,
}

/// What `obj` holds, for messages: numpy's dtype name where it has one, else the buffer's
/// struct format.
fn dtype_of(obj: &Bound<'_, PyAny>, format: &str) -> String {
    obj.getattr("dtype")
        .and_then(|d| d.str().map(|s| s.to_string()))
        .unwrap_or_else(|_| format!("buffer format '{format}'"))
}

impl<T: Elem> View<T> {
    /// Takes `obj` as `T` (see [`Array::new`] and [`Array::typed`]).
    pub(crate) fn new(
        obj: &Bound<'_, PyAny>,
        name: &'static str,
        dtype: &str,
        writable: bool,
    ) -> PyResult<View<T>> {
        Array::new(obj, name, dtype)?.typed(dtype, writable)
    }

    /// The shape.
    pub(crate) fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The name the caller gave it (for messages).
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    /// Address range of the data, for overlap checks.
    pub(crate) fn span(&self) -> std::ops::Range<usize> {
        let start = self.ptr as usize;
        start..start + self.len * size_of::<T>()
    }

    /// The elements in C order, without a copy.
    pub(crate) fn as_slice(&self) -> &[T] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the memory is C-contiguous with `len` elements of `T` (a buffer's format,
        // size and alignment checked by `into_typed`; a DLPack tensor's type, strides and
        // alignment checked in `typed`), and stays valid while `self._keep` holds it. The
        // GIL is held by every caller, so no Python code writes it meanwhile; a mutable view
        // of the same memory is refused by `disjoint`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The elements in C order, writable, without a copy.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [T] {
        if self.len == 0 || self.readonly {
            return &mut [];
        }
        // SAFETY: as in `as_slice`, and the memory is writable (checked in `typed`); this is
        // the only Rust reference to it (`&mut self`), and callers check with `disjoint`
        // that no other view they read overlaps it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// Fails when `out`'s memory overlaps one of `inputs`' (reading and writing the same memory
/// at once would be undefined behaviour).
pub(crate) fn disjoint<T: Elem>(
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
