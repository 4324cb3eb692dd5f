//! GGUF files (llama.cpp's single-file checkpoints), versions 2 and 3, little-endian, through
//! mmap.
//!
//! - [`GgufFile`]: an opened, fully validated file: metadata ([`Value`]), tensor infos
//!   ([`TensorInfo`]) and their bytes, borrowed from the mapping.
//! - [`parse_header`]: the parser behind it, over bytes already in memory (what the fuzzer
//!   drives).
//! - [`GgmlType`]: tensor element types and block geometry; [`dequantize_row`] and
//!   [`dequantize_row_bf16`] turn quantized blocks back into floats.
//! - [`tokenizer`]: a Hugging Face `tokenizer.json` built from the vocabulary in the metadata.
//!
//! Layout of a GGUF file: magic `GGUF`, u32 version, u64 tensor count, u64 metadata count, the
//! metadata key/values, the tensor infos (name, dims in ggml order, type, offset), padding to
//! `general.alignment` (default 32), then the data section; tensor offsets are relative to it.
//!
//! A key design decision made here is that the header is parsed eagerly and checked in full
//! (lengths against what the file still holds before anything is allocated, caps on counts,
//! string lengths, nesting and dims, overflow-checked sizes, aligned in-file non-overlapping
//! tensor data) so that every later access is a plain slice of the mapping that cannot fail.

pub mod tokenizer;

use std::collections::HashMap;
use std::path::Path;

pub use strata_kernels::ggml::{GgmlType, QK_K, QuantError, dequantize_row, dequantize_row_bf16};

use crate::{Error, MappedFile, Result};

/// Longest string (key, value or tensor name) the reader accepts, in bytes.
pub const MAX_STRING_LEN: u64 = 16 << 20;
/// Most elements in one metadata array.
pub const MAX_ARRAY_LEN: u64 = 1 << 26;
/// Deepest nesting of metadata arrays (an array of arrays is depth 2).
pub const MAX_ARRAY_DEPTH: usize = 4;
/// Most metadata key/value pairs.
pub const MAX_KV: u64 = 1 << 20;
/// Most tensors.
pub const MAX_TENSORS: u64 = 1 << 20;
/// Most dimensions of a tensor (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Alignment of the data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `uint8`.
    U8(u8),
    /// `int8`.
    I8(i8),
    /// `uint16`.
    U16(u16),
    /// `int16`.
    I16(i16),
    /// `uint32`.
    U32(u32),
    /// `int32`.
    I32(i32),
    /// `float32`.
    F32(f32),
    /// `bool`.
    Bool(bool),
    /// `string` (invalid UTF-8 is replaced by U+FFFD).
    Str(String),
    /// `array`, possibly of arrays.
    Array(Vec<Value>),
    /// `uint64`.
    U64(u64),
    /// `int64`.
    I64(i64),
    /// `float64`.
    F64(f64),
}

impl Value {
    /// GGUF's name of the value's type, for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::F32(_) => "f32",
            Value::Bool(_) => "bool",
            Value::Str(_) => "str",
            Value::Array(_) => "arr",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F64(_) => "f64",
        }
    }

    /// Any integer value, widened (files disagree on integer widths for the same key).
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// An integer value that fits in u32.
    pub fn as_u32(&self) -> Option<u32> {
        self.as_i128().and_then(|v| u32::try_from(v).ok())
    }

    /// An integer value that fits in u64.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|v| u64::try_from(v).ok())
    }

    /// An integer value that fits in i32.
    pub fn as_i32(&self) -> Option<i32> {
        self.as_i128().and_then(|v| i32::try_from(v).ok())
    }

    /// A float value (f32, or f64 narrowed).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// A bool value.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// A string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// An array value.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One tensor's header entry.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Tensor name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Element type.
    pub ggml_type: GgmlType,
    /// Dimensions in ggml order: `dims[0]` is the innermost (row length, contiguous).
    pub dims: Vec<u64>,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
    /// Size of the data in bytes.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        // Validated at parse time not to overflow; saturating for hand-made infos.
        self.dims.iter().fold(1u64, |a, &d| a.saturating_mul(d))
    }

    /// Length of one row (`dims[0]`, 1 for a scalar).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows (product of the outer dims).
    pub fn n_rows(&self) -> u64 {
        self.dims
            .iter()
            .skip(1)
            .fold(1u64, |a, &d| a.saturating_mul(d))
    }

    /// Bytes in one row.
    pub fn row_bytes(&self) -> u64 {
        // Validated at parse time: dims[0] is a whole number of blocks.
        self.ggml_type.row_bytes(self.row_len()).unwrap_or(0)
    }

    /// Shape outermost first, the PyTorch/safetensors convention (`dims` reversed).
    pub fn shape(&self) -> Vec<usize> {
        // Each dim fits usize: the data is inside a mapped file.
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// The parsed, validated header of a GGUF file.
#[derive(Debug, Clone)]
pub struct GgufHeader {
    version: u32,
    metadata: Vec<(String, Value)>,
    kv_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

/// An opened GGUF file: its validated header (reachable through `Deref`) and the mapping.
#[derive(Debug, Clone)]
pub struct GgufFile {
    file: MappedFile,
    header: GgufHeader,
}

impl std::ops::Deref for GgufFile {
    type Target = GgufHeader;
    fn deref(&self) -> &GgufHeader {
        &self.header
    }
}

impl GgufFile {
    /// Maps and validates the GGUF file at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let file = MappedFile::open(path)?;
        let header = parse_header(path, file.bytes())?;
        Ok(GgufFile { file, header })
    }

    /// The mapped file.
    pub fn file(&self) -> &MappedFile {
        &self.file
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// The parsed header.
    pub fn header(&self) -> &GgufHeader {
        &self.header
    }

    /// The info of tensor `name`, or a missing-tensor error naming the file.
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.header
            .tensor_info(name)
            .ok_or_else(|| Error::MissingTensor {
                path: self.path().to_owned(),
                name: name.to_owned(),
            })
    }

    /// The raw bytes of tensor `name`.
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8]> {
        Ok(self.data(self.tensor(name)?))
    }

    /// The raw bytes of a tensor of this file.
    ///
    /// # Panics
    /// If `info` is not one of this file's tensor infos (its range was validated for this file).
    pub fn data(&self, info: &TensorInfo) -> &[u8] {
        let start = (self.header.data_offset + info.offset) as usize;
        &self.file.bytes()[start..start + info.n_bytes as usize]
    }

    /// Tensor `name` converted to f32 (dequantized when quantized), in ggml order.
    pub fn tensor_to_f32(&self, name: &str) -> Result<Vec<f32>> {
        let info = self.tensor(name)?;
        let mut out = vec![0f32; info.n_elements() as usize];
        dequantize_row(info.ggml_type, self.data(info), &mut out).map_err(|e| {
            Error::BadTensor {
                path: self.path().to_owned(),
                name: name.to_owned(),
                message: e.to_string(),
            }
        })?;
        Ok(out)
    }

    fn key_error(&self, key: &str, message: String) -> Error {
        Error::malformed(self.path(), format!("metadata `{key}`: {message}"))
    }

    fn require<'a, T>(
        &'a self,
        key: &str,
        want: &str,
        get: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Result<T> {
        let v = self
            .metadata(key)
            .ok_or_else(|| self.key_error(key, "missing".into()))?;
        get(v)
            .ok_or_else(|| self.key_error(key, format!("expected {want} but got {}", describe(v))))
    }

    /// Metadata `key` as u32, or an error naming the file and key.
    pub fn require_u32(&self, key: &str) -> Result<u32> {
        self.require(key, "an integer fitting u32", Value::as_u32)
    }

    /// Metadata `key` as f32, or an error naming the file and key.
    pub fn require_f32(&self, key: &str) -> Result<f32> {
        self.require(key, "a float", Value::as_f32)
    }

    /// Metadata `key` as a string, or an error naming the file and key.
    pub fn require_str(&self, key: &str) -> Result<&str> {
        self.require(key, "a string", Value::as_str)
    }
}

fn describe(v: &Value) -> String {
    match v {
        Value::Array(a) => format!("an array of {} values", a.len()),
        Value::Str(_) => "a string".into(),
        other => format!("{other:?}"),
    }
}

impl GgufHeader {
    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Alignment of tensor data (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// All metadata, in file order.
    pub fn metadata_entries(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// Metadata value of `key`.
    pub fn metadata(&self, key: &str) -> Option<&Value> {
        self.kv_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// Metadata `key` as u32 (any integer type that fits).
    pub fn get_u32(&self, key: &str) -> Option<u32> {
        self.metadata(key)?.as_u32()
    }

    /// Metadata `key` as u64 (any integer type that fits).
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.metadata(key)?.as_u64()
    }

    /// Metadata `key` as f32 (f32 or f64).
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.metadata(key)?.as_f32()
    }

    /// Metadata `key` as bool.
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.metadata(key)?.as_bool()
    }

    /// Metadata `key` as a string.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.metadata(key)?.as_str()
    }

    /// Metadata `key` as an array of strings (`None` if any element is not a string).
    pub fn get_str_array(&self, key: &str) -> Option<Vec<&str>> {
        self.metadata(key)?
            .as_array()?
            .iter()
            .map(Value::as_str)
            .collect()
    }

    /// Metadata `key` as an array of f32 (`None` if any element is not a float).
    pub fn get_f32_array(&self, key: &str) -> Option<Vec<f32>> {
        self.metadata(key)?
            .as_array()?
            .iter()
            .map(Value::as_f32)
            .collect()
    }

    /// Metadata `key` as an array of i32 (`None` if any element is not an integer fitting i32).
    pub fn get_i32_array(&self, key: &str) -> Option<Vec<i32>> {
        self.metadata(key)?
            .as_array()?
            .iter()
            .map(Value::as_i32)
            .collect()
    }

    /// `general.architecture` (`llama`, `qwen2`, `qwen3moe`...).
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    /// All tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The info of tensor `name`.
    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }
}

/// Byte cursor over the header that turns every short read into an error naming the file.
struct Cursor<'a> {
    path: &'a Path,
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn err(&self, message: String) -> Error {
        Error::malformed(self.path, message)
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: u64, what: &dyn std::fmt::Display) -> Result<&'a [u8]> {
        if n > self.remaining() as u64 {
            return Err(self.err(format!(
                "truncated gguf file: {what} at offset {} needs {n} bytes but only {} remain",
                self.pos,
                self.remaining()
            )));
        }
        let out = &self.bytes[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &dyn std::fmt::Display) -> Result<[u8; N]> {
        let b = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    fn u32(&mut self, what: &dyn std::fmt::Display) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn std::fmt::Display) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &dyn std::fmt::Display) -> Result<String> {
        let len = self.u64(&format_args!("length of {what}"))?;
        if len > MAX_STRING_LEN {
            return Err(self.err(format!(
                "{what} at offset {}: string length {len} exceeds the limit of {MAX_STRING_LEN}",
                self.pos - 8
            )));
        }
        let b = self.take(len, what)?;
        Ok(String::from_utf8_lossy(b).into_owned())
    }

    /// Reads a value of GGUF type `ty`; `depth` counts enclosing arrays.
    fn value(&mut self, ty: u32, depth: usize, what: &dyn std::fmt::Display) -> Result<Value> {
        Ok(match ty {
            0 => Value::U8(u8::from_le_bytes(self.array(what)?)),
            1 => Value::I8(i8::from_le_bytes(self.array(what)?)),
            2 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            4 => Value::U32(self.u32(what)?),
            5 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            7 => {
                let [b] = self.array(what)?;
                if b > 1 {
                    return Err(self.err(format!(
                        "{what} at offset {}: bool byte is {b}, expected 0 or 1",
                        self.pos - 1
                    )));
                }
                Value::Bool(b == 1)
            }
            8 => Value::Str(self.string(what)?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.err(format!(
                        "{what}: arrays nested deeper than the limit of {MAX_ARRAY_DEPTH}"
                    )));
                }
                let elem = self.u32(&format_args!("element type of {what}"))?;
                let n = self.u64(&format_args!("length of {what}"))?;
                let min = min_value_bytes(elem).ok_or_else(|| {
                    self.err(format!("{what}: unknown array element type {elem}"))
                })?;
                if n > MAX_ARRAY_LEN {
                    return Err(self.err(format!(
                        "{what}: array length {n} exceeds the limit of {MAX_ARRAY_LEN}"
                    )));
                }
                // Refuse before allocating: a hostile length cannot make us reserve more than
                // the file could possibly hold.
                if n.saturating_mul(min) > self.remaining() as u64 {
                    return Err(self.err(format!(
                        "truncated gguf file: {what} declares {n} elements of type {elem} but only {} bytes remain",
                        self.remaining()
                    )));
                }
                let mut items = Vec::with_capacity(n as usize);
                for i in 0..n {
                    items.push(self.value(elem, depth + 1, &format_args!("{what}[{i}]"))?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(what)?),
            11 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            other => return Err(self.err(format!("{what}: unknown value type {other}"))),
        })
    }
}

/// The fewest bytes a value of GGUF type `ty` occupies, `None` for an unknown type.
fn min_value_bytes(ty: u32) -> Option<u64> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 => 8,
        9 => 12,
        10..=12 => 8,
        _ => return None,
    })
}

/// Parses and validates the GGUF file held in `bytes` (the whole file); `path` names it in
/// errors.
pub fn parse_header(path: &Path, bytes: &[u8]) -> Result<GgufHeader> {
    let mut c = Cursor {
        path,
        bytes,
        pos: 0,
    };
    let magic: [u8; 4] = c.array(&"magic")?;
    if &magic != b"GGUF" {
        return Err(c.err(format!(
            "not a gguf file: magic is {:?}, expected \"GGUF\"",
            String::from_utf8_lossy(&magic)
        )));
    }
    let version = c.u32(&"version")?;
    match version {
        2 | 3 => {}
        1 => {
            return Err(c.err(
                "gguf version 1 is not supported, expected version 2 or 3 (re-convert the model)"
                    .into(),
            ));
        }
        // A byte-swapped small version: the file was written big-endian.
        v if v & 0xffff == 0 && v != 0 => {
            return Err(c.err(format!(
                "big-endian gguf file (version field reads {v:#010x}), only little-endian files are supported"
            )));
        }
        v => {
            return Err(c.err(format!("unsupported gguf version {v}, expected 2 or 3")));
        }
    }
    let n_tensors = c.u64(&"tensor count")?;
    let n_kv = c.u64(&"metadata count")?;
    if n_tensors > MAX_TENSORS {
        return Err(c.err(format!(
            "tensor count {n_tensors} exceeds the limit of {MAX_TENSORS}"
        )));
    }
    if n_kv > MAX_KV {
        return Err(c.err(format!(
            "metadata count {n_kv} exceeds the limit of {MAX_KV}"
        )));
    }
    // Each pair holds at least a key length, a type and a 1-byte value; each tensor info at
    // least a name length, a dim count, a type and an offset.
    if n_kv.saturating_mul(13) + n_tensors.saturating_mul(24) > c.remaining() as u64 {
        return Err(c.err(format!(
            "truncated gguf file: {n_kv} metadata entries and {n_tensors} tensor infos cannot fit in the {} bytes that remain",
            c.remaining()
        )));
    }

    let mut metadata = Vec::with_capacity(n_kv as usize);
    let mut kv_index = HashMap::with_capacity(n_kv as usize);
    for i in 0..n_kv {
        let key = c.string(&format_args!("key of metadata entry {i}"))?;
        let ty = c.u32(&format_args!("type of metadata `{key}`"))?;
        let value = c.value(ty, 0, &format_args!("metadata `{key}`"))?;
        if kv_index.insert(key.clone(), metadata.len()).is_some() {
            return Err(c.err(format!("duplicate metadata key `{key}`")));
        }
        metadata.push((key, value));
    }

    let alignment = match kv_index.get("general.alignment").map(|&i| &metadata[i].1) {
        None => DEFAULT_ALIGNMENT,
        Some(&Value::U32(a)) if a.is_power_of_two() => a as u64,
        Some(v) => {
            return Err(c.err(format!(
                "metadata `general.alignment`: expected a power of two of type u32 but got {}",
                describe(v)
            )));
        }
    };

    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(n_tensors as usize);
    let mut tensor_index = HashMap::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        let info = tensor_info(&mut c, i, alignment)?;
        let name = info.name.clone();
        if tensor_index.insert(name.clone(), tensors.len()).is_some() {
            return Err(c.err(format!("duplicate tensor name `{name}`")));
        }
        tensors.push(info);
    }

    let data_offset = if n_tensors == 0 {
        c.pos as u64
    } else {
        (c.pos as u64).next_multiple_of(alignment)
    };
    let file_len = bytes.len() as u64;
    if data_offset > file_len {
        return Err(c.err(format!(
            "truncated gguf file: data section starts at {data_offset} but the file has {file_len} bytes"
        )));
    }
    let data_len = file_len - data_offset;
    for t in &tensors {
        let end = t.offset.checked_add(t.n_bytes);
        if end.is_none_or(|e| e > data_len) {
            return Err(c.err(format!(
                "tensor `{}`: data [{}, +{}) lies past the end of the data section ({data_len} bytes); file truncated?",
                t.name, t.offset, t.n_bytes
            )));
        }
    }
    // Overlapping tensors mean a corrupt or hostile file.
    let mut order: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    order.sort_by_key(|t| t.offset);
    for w in order.windows(2) {
        if w[1].offset < w[0].offset + w[0].n_bytes {
            return Err(c.err(format!(
                "tensors `{}` and `{}` overlap",
                w[0].name, w[1].name
            )));
        }
    }

    Ok(GgufHeader {
        version,
        metadata,
        kv_index,
        tensors,
        tensor_index,
        alignment,
        data_offset,
    })
}

/// Reads the info of tensor `i` and checks its dims, type, size and alignment.
fn tensor_info(c: &mut Cursor, i: u64, alignment: u64) -> Result<TensorInfo> {
    let name = c.string(&format_args!("name of tensor {i}"))?;
    let n_dims = c.u32(&format_args!("dim count of tensor `{name}`"))?;
    if n_dims as usize > MAX_DIMS {
        return Err(c.err(format!(
            "tensor `{name}`: {n_dims} dims exceed the limit of {MAX_DIMS}"
        )));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for d in 0..n_dims {
        dims.push(c.u64(&format_args!("dim {d} of tensor `{name}`"))?);
    }
    let type_id = c.u32(&format_args!("type of tensor `{name}`"))?;
    let ggml_type = GgmlType::from_id(type_id)
        .ok_or_else(|| c.err(format!("tensor `{name}`: unknown tensor type {type_id}")))?;
    let offset = c.u64(&format_args!("offset of tensor `{name}`"))?;
    let n_bytes = tensor_bytes(ggml_type, &dims)
        .map_err(|m| c.err(format!("tensor `{name}`: {ggml_type} x {dims:?}: {m}")))?;
    if offset % alignment != 0 {
        return Err(c.err(format!(
            "tensor `{name}`: data offset {offset} is not a multiple of the alignment {alignment}"
        )));
    }
    Ok(TensorInfo {
        name,
        ggml_type,
        dims,
        offset,
        n_bytes,
    })
}

/// Byte size of a tensor, checking block divisibility and overflow.
fn tensor_bytes(ty: GgmlType, dims: &[u64]) -> Result<u64, String> {
    let row = dims.first().copied().unwrap_or(1);
    let row_bytes = ty.row_bytes(row).ok_or_else(|| {
        format!(
            "row length {row} is not a multiple of the block size {}",
            ty.block_size()
        )
    })?;
    // ggml counts elements in i64. Check the rows alone too: with a zero-length row the
    // total is 0 however large the other dims are.
    let count = |ds: &[u64]| ds.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
    let fits = |n: Option<u64>| n.is_some_and(|n| n <= i64::MAX as u64);
    if !fits(count(dims)) || !fits(count(dims.get(1..).unwrap_or(&[]))) {
        return Err("element count overflows".into());
    }
    dims.iter()
        .skip(1)
        .try_fold(row_bytes, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| "byte size overflows".to_string())
}
