//! Typed, shaped views on mapped bytes.

use std::ops::Range;

use half::{bf16, f16};

use crate::{Error, MappedFile, Result};

/// Element types of checkpoint tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    BF16,
    /// float8 e4m3fn (DeepSeek-V3 FP8 checkpoints).
    F8E4M3,
    /// Other element types a file may declare; carried so errors can name them.
    Other(&'static str),
}

impl DType {
    /// Bytes per element, when the type is byte-addressable.
    pub fn size(self) -> Option<usize> {
        match self {
            DType::F32 => Some(4),
            DType::F16 | DType::BF16 => Some(2),
            DType::F8E4M3 => Some(1),
            DType::Other(_) => None,
        }
    }

    /// The name safetensors uses.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::F8E4M3 => "F8_E4M3",
            DType::Other(s) => s,
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A tensor stored in a mapped file: name, dtype, shape and the byte range of its data.
#[derive(Debug, Clone)]
pub struct TensorView {
    file: MappedFile,
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    range: Range<usize>,
}

impl TensorView {
    pub(crate) fn new(
        file: MappedFile,
        name: String,
        dtype: DType,
        shape: Vec<usize>,
        range: Range<usize>,
    ) -> Self {
        TensorView {
            file,
            name,
            dtype,
            shape,
            range,
        }
    }

    /// Tensor name as stored.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Shape, outermost first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// The mapped file holding the data.
    pub fn file(&self) -> &MappedFile {
        &self.file
    }
    /// Raw bytes of the data.
    pub fn bytes(&self) -> &[u8] {
        &self.file.bytes()[self.range.clone()]
    }

    fn bad(&self, message: String) -> Error {
        Error::BadTensor {
            path: self.file.path().to_owned(),
            name: self.name.clone(),
            message,
        }
    }

    /// Fails unless the shape is exactly `want`.
    pub fn expect_shape(&self, want: &[usize]) -> Result<&Self> {
        if self.shape != want {
            return Err(self.bad(format!(
                "shape mismatch, expected {want:?} but got {:?}",
                self.shape
            )));
        }
        Ok(self)
    }

    /// Converts the data to f32 (a copy).
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        self.to_f32_range(0, self.numel())
    }

    /// Converts elements `start..start + len` to f32 (a copy).
    pub fn to_f32_range(&self, start: usize, len: usize) -> Result<Vec<f32>> {
        let size = self.dtype.size().unwrap_or(1);
        let end = start
            .checked_add(len)
            .filter(|&e| e <= self.numel())
            .ok_or_else(|| {
                self.bad(format!(
                    "element range {start}+{len} out of {} elements",
                    self.numel()
                ))
            })?;
        let b = &self.bytes()[start * size..end * size];
        Ok(match self.dtype {
            DType::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            DType::F16 => b
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            DType::BF16 => b
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            DType::F8E4M3 => b.iter().map(|&v| f8e4m3_to_f32(v)).collect(),
            DType::Other(name) => {
                return Err(self.bad(format!(
                    "unsupported dtype {name}, expected one of F32, F16, BF16, F8_E4M3"
                )));
            }
        })
    }

    /// Borrows the data as BF16 without copying, when it is stored as BF16 and aligned.
    pub fn as_bf16(&self) -> Option<&[bf16]> {
        if self.dtype != DType::BF16 {
            return None;
        }
        let b = self.bytes();
        if !(b.as_ptr() as usize).is_multiple_of(2) {
            return None;
        }
        // bf16 is a plain 2-byte value type; cast through half's bytemuck-free helper.
        let words: &[u16] = cast_u16(b)?;
        Some(half::slice::HalfBitsSliceExt::reinterpret_cast(words))
    }
}

fn cast_u16(b: &[u8]) -> Option<&[u16]> {
    if !b.len().is_multiple_of(2) || !(b.as_ptr() as usize).is_multiple_of(2) {
        return None;
    }
    // SAFETY: alignment and length are checked above; u16 has no invalid bit patterns; the
    // returned slice borrows `b`, so it cannot outlive the mapping. Little-endian host assumed
    // (x86_64 and aarch64, the targets Strata supports).
    Some(unsafe { std::slice::from_raw_parts(b.as_ptr().cast::<u16>(), b.len() / 2) })
}

/// Decodes one float8 e4m3fn value (no infinities; 0x7f/0xff are NaN).
pub fn f8e4m3_to_f32(v: u8) -> f32 {
    let sign = if v & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = ((v >> 3) & 0x0f) as i32;
    let man = (v & 0x07) as f32;
    if exp == 0x0f && (v & 0x07) == 0x07 {
        return f32::NAN;
    }
    if exp == 0 {
        sign * man / 8.0 * 2f32.powi(-6)
    } else {
        sign * (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    }
}
