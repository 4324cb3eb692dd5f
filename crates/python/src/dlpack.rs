//! The consumer side of DLPack (<https://dmlc.github.io/dlpack/latest/python_spec.html>):
//! a tensor of torch, numpy (>= 1.23), JAX... read and written in place, without a copy.
//!
//! `obj.__dlpack__(max_version=(1, 0))` returns a capsule named `dltensor_versioned`
//! holding a `DLManagedTensorVersioned` (producers that predate versioning reject the
//! keyword, and `obj.__dlpack__()` returns `dltensor` with a `DLManagedTensor`). The
//! consumer renames the capsule `used_dltensor[_versioned]`, so that the capsule's
//! destructor leaves it alone, and calls the tensor's deleter when it is done with the
//! memory: [`DlTensor`]'s `Drop`. Only CPU tensors are taken (`__dlpack_device__` is asked
//! first, so a CUDA tensor is refused before anything is exported).
#![allow(unsafe_code)]

use std::ffi::{CStr, c_void};
use std::ptr::NonNull;

use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyTuple};

/// `DLDeviceType::kDLCPU`.
const KDL_CPU: i32 = 1;
/// `DLPACK_FLAG_BITMASK_READ_ONLY`.
const FLAG_READ_ONLY: u64 = 1;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`.
const FLAG_IS_COPIED: u64 = 2;
/// The DLPack ABI version this module reads (`DLPACK_MAJOR_VERSION`).
const MAJOR: u32 = 1;

/// `DLDevice`.
#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

/// `DLDataType`: type code (`kDLInt` 0, `kDLUInt` 1, `kDLFloat` 2, `kDLBfloat` 4...), bits,
/// lanes.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

impl DlDataType {
    /// A scalar (one lane) type.
    pub(crate) const fn scalar(code: u8, bits: u8) -> DlDataType {
        DlDataType {
            code,
            bits,
            lanes: 1,
        }
    }

    /// The usual name (`float32`, `bfloat16`, `int64`...), for messages.
    pub(crate) fn name(self) -> String {
        let kind = match self.code {
            0 => "int",
            1 => "uint",
            2 => "float",
            4 => "bfloat",
            5 => "complex",
            6 => "bool",
            c => return format!("DLPack type code {c} of {} bits", self.bits),
        };
        match self.lanes {
            1 => format!("{kind}{}", self.bits),
            l => format!("{kind}{}x{l}", self.bits),
        }
    }
}

/// `DLTensor`.
#[repr(C)]
struct RawTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

/// `DLManagedTensor` (unversioned).
#[repr(C)]
struct Managed {
    dl_tensor: RawTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut Managed)>,
}

/// `DLManagedTensorVersioned`.
#[repr(C)]
struct ManagedVersioned {
    major: u32,
    minor: u32,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut ManagedVersioned)>,
    flags: u64,
    dl_tensor: RawTensor,
}

/// A taken tensor: which struct, for the deleter.
enum Owned {
    Unversioned(NonNull<Managed>),
    Versioned(NonNull<ManagedVersioned>),
}

/// An exported CPU tensor this module owns until it drops it (then the producer's deleter
/// runs): its checked shape, element type and data address.
pub(crate) struct DlTensor {
    owned: Owned,
    shape: Vec<usize>,
    dtype: DlDataType,
    data: *mut u8,
    readonly: bool,
    copied: bool,
}

/// The device as torch names it, for messages.
fn device_name(ty: i32, id: i32) -> String {
    let name = match ty {
        1 => "cpu",
        2 | 13 => "cuda",
        3 => "cuda_host",
        7 => "vulkan",
        8 => "metal",
        10 => "rocm",
        14 => "oneapi",
        _ => return format!("DLPack device type {ty}, id {id}"),
    };
    format!("{name}:{id}")
}

impl DlTensor {
    /// Exports `obj` through `__dlpack__`, or `None` when it has no such method. Errors
    /// name the argument: a tensor on another device than the CPU, a malformed export.
    pub(crate) fn take(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Option<DlTensor>> {
        let py = obj.py();
        if !obj.hasattr("__dlpack__")? {
            return Ok(None);
        }
        if let Ok(dev) = obj.call_method0("__dlpack_device__") {
            let (ty, id): (i32, i32) = dev.extract()?;
            if ty != KDL_CPU {
                return Err(PyTypeError::new_err(format!(
                    "{name}: a tensor on {}; strata.ops computes on the CPU, pass a CPU \
                     tensor (tensor.cpu())",
                    device_name(ty, id)
                )));
            }
        }
        let kwargs = PyDict::new(py);
        kwargs.set_item("max_version", PyTuple::new(py, [MAJOR, 0])?)?;
        let capsule = match obj.call_method("__dlpack__", (), Some(&kwargs)) {
            // A producer from before DLPack 1.0 does not know `max_version`.
            Err(e) if e.is_instance_of::<PyTypeError>(py) => obj.call_method0("__dlpack__"),
            r => r,
        }
        .map_err(|e| match e.is_instance_of::<PyBufferError>(py) {
            // A refusal: numpy's of a read-only array without DLPack 1.0's flag, torch's of a
            // tensor that requires grad.
            true => {
                PyValueError::new_err(format!("{name}: cannot be exported through DLPack ({e})"))
            }
            // Other errors keep their type, with the argument's name.
            false => PyErr::from_type(e.get_type(py), format!("{name}: {}", e.value(py))),
        })?;
        let capsule = capsule.cast_into::<PyCapsule>().map_err(|_| {
            PyTypeError::new_err(format!("{name}: __dlpack__ did not return a capsule"))
        })?;
        Self::from_capsule(&capsule, name).map(Some)
    }

    /// Takes the tensor out of `capsule` (renaming it as used), then checks it.
    fn from_capsule(capsule: &Bound<'_, PyCapsule>, name: &str) -> PyResult<DlTensor> {
        const VERSIONED: &CStr = c"dltensor_versioned";
        const UNVERSIONED: &CStr = c"dltensor";
        let cap = capsule.as_ptr();
        // SAFETY: `cap` is a live capsule (`capsule` holds a reference). `PyCapsule_IsValid`
        // only compares names; `PyCapsule_GetPointer` with the matching name returns the
        // pointer the producer stored, a `DLManagedTensor[Versioned]` by the DLPack spec.
        // Renaming it transfers the ownership to us (the capsule's destructor then does not
        // call the deleter): from here the deleter is called exactly once, by `Drop`.
        let owned = unsafe {
            let take = |want: &CStr, used: &CStr| -> PyResult<*mut c_void> {
                let p = pyo3::ffi::PyCapsule_GetPointer(cap, want.as_ptr());
                if p.is_null() || pyo3::ffi::PyCapsule_SetName(cap, used.as_ptr()) != 0 {
                    return Err(PyErr::fetch(capsule.py()));
                }
                Ok(p)
            };
            if pyo3::ffi::PyCapsule_IsValid(cap, VERSIONED.as_ptr()) == 1 {
                let p = take(VERSIONED, c"used_dltensor_versioned")?;
                Owned::Versioned(NonNull::new_unchecked(p.cast()))
            } else if pyo3::ffi::PyCapsule_IsValid(cap, UNVERSIONED.as_ptr()) == 1 {
                let p = take(UNVERSIONED, c"used_dltensor")?;
                Owned::Unversioned(NonNull::new_unchecked(p.cast()))
            } else {
                return Err(PyTypeError::new_err(format!(
                    "{name}: __dlpack__ returned a capsule that is neither a DLPack tensor \
                     nor unused"
                )));
            }
        };
        // From here `t` owns it: every return below drops it, which runs the deleter.
        let mut t = DlTensor {
            owned,
            shape: Vec::new(),
            dtype: DlDataType::scalar(0, 0),
            data: std::ptr::null_mut(),
            readonly: true,
            copied: false,
        };
        // SAFETY: the pointer is the producer's live managed tensor (above); a versioned
        // one is only read past its version when the major version is ours, as the spec
        // requires.
        let (raw, flags) = unsafe {
            match &t.owned {
                Owned::Unversioned(m) => (&m.as_ref().dl_tensor, 0),
                Owned::Versioned(m) => {
                    let m = m.as_ref();
                    if m.major != MAJOR {
                        return Err(PyValueError::new_err(format!(
                            "{name}: DLPack version {}, this module reads version {MAJOR}",
                            m.major
                        )));
                    }
                    (&m.dl_tensor, m.flags)
                }
            }
        };
        if raw.device.device_type != KDL_CPU {
            return Err(PyTypeError::new_err(format!(
                "{name}: a tensor on {}; strata.ops computes on the CPU",
                device_name(raw.device.device_type, raw.device.device_id)
            )));
        }
        let ndim = usize::try_from(raw.ndim).unwrap_or(0);
        // SAFETY: the shape and strides arrays hold `ndim` entries each (strides may be
        // NULL: C order); neither is read when `ndim` is 0.
        let (shape, strides) = unsafe {
            let shape = if ndim == 0 {
                &[][..]
            } else {
                std::slice::from_raw_parts(raw.shape, ndim)
            };
            let strides = (ndim > 0 && !raw.strides.is_null())
                .then(|| std::slice::from_raw_parts(raw.strides, ndim));
            (shape, strides)
        };
        let dims: Vec<usize> = shape
            .iter()
            .map(|&d| usize::try_from(d).ok())
            .collect::<Option<_>>()
            .ok_or_else(|| PyValueError::new_err(format!("{name}: negative shape {shape:?}")))?;
        if let Some(strides) = strides {
            check_c_contiguous(name, &dims, strides)?;
        }
        t.dtype = raw.dtype;
        t.data = raw.data.cast::<u8>().wrapping_add(raw.byte_offset as usize);
        t.readonly = flags & FLAG_READ_ONLY != 0;
        t.copied = flags & FLAG_IS_COPIED != 0;
        t.shape = dims;
        Ok(t)
    }

    /// The shape.
    pub(crate) fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The element type.
    pub(crate) fn dtype(&self) -> DlDataType {
        self.dtype
    }

    /// Address of the first element (C order).
    pub(crate) fn data(&self) -> *mut u8 {
        self.data
    }

    /// Whether the producer marked it read-only (DLPack 1.0; unversioned exports cannot say,
    /// and producers refuse to export read-only memory that way).
    pub(crate) fn readonly(&self) -> bool {
        self.readonly
    }

    /// Whether the producer exported a copy (DLPack 1.0): writing it would be lost.
    pub(crate) fn copied(&self) -> bool {
        self.copied
    }
}

/// Refuses strides other than C order's (in elements), ignoring dimensions of size 1 (their
/// stride is never used) and empty tensors.
fn check_c_contiguous(name: &str, shape: &[usize], strides: &[i64]) -> PyResult<()> {
    if shape.contains(&0) {
        return Ok(());
    }
    let mut want = 1i64;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d != 1 && s != want {
            return Err(PyValueError::new_err(format!(
                "{name}: not C-contiguous (shape {shape:?}, strides {strides:?} elements); pass \
                 a contiguous tensor (tensor.contiguous(), numpy.ascontiguousarray): tensors \
                 are used in place, never copied"
            )));
        }
        want = want.saturating_mul(d as i64);
    }
    Ok(())
}

impl Drop for DlTensor {
    fn drop(&mut self) {
        // The deleter may release Python objects (numpy's and torch's do): it runs attached
        // to the interpreter.
        Python::attach(|_| match self.owned {
            // SAFETY: the managed tensor is ours (its capsule was renamed as used) and its
            // deleter has not run: `Drop` runs once. Nothing reads it afterwards.
            Owned::Unversioned(m) => unsafe {
                if let Some(d) = (*m.as_ptr()).deleter {
                    d(m.as_ptr());
                }
            },
            // SAFETY: as above.
            Owned::Versioned(m) => unsafe {
                if let Some(d) = (*m.as_ptr()).deleter {
                    d(m.as_ptr());
                }
            },
        });
    }
}
