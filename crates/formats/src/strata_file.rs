//! The engine's own model file (`.strata`): weights already in the kernels' packed layout,
//! written once by `strata convert` and loaded by mapping.
//!
//! Layout (all integers little-endian):
//!
//! | bytes        | content                                                        |
//! |--------------|----------------------------------------------------------------|
//! | 0..8         | magic `STRATA\0\0`                                             |
//! | 8..12        | file format version ([`VERSION`])                              |
//! | 12..16       | packed layout version ([`strata_kernels::packed::LAYOUT_VERSION`]) |
//! | 16..24       | directory offset (absolute)                                    |
//! | 24..32       | directory length                                               |
//! | 32..64       | zero                                                           |
//! | 64..         | tensor data and blobs, each starting at a multiple of 64       |
//! | directory    | JSON: `config`, `metadata`, `blobs`, `tensors`                 |
//!
//! The directory lists every tensor as `{name, kind, shape, offset, length}` (absolute byte
//! offsets); `kind` is `f32`, `bf16` or `packed` with `packed: {format, n, k, scales_offset,
//! scales_length}` where `format` is a [`PackedFormat`] name (`bf16`, `int8`, `int8g64`,
//! `int4g32`...). `config` and `metadata` are JSON documents this module does not interpret
//! (the model's normalised configuration, the tokenizer's special tokens); `blobs` are named
//! byte strings (`tokenizer.json`).
//!
//! Key types: [`StrataWriter`] (streams tensors to a temporary file and renames it into
//! place at [`StrataWriter::finish`]; dropping it unfinished removes the temporary file),
//! [`parse_header`] (validates the header and directory against a file's bytes: what the
//! `strata_header` fuzz target drives) and [`StrataFile`] (maps a file, then builds views
//! on what `parse_header` validated).
//!
//! A key design decision: the directory sits after the data (its offset in the fixed
//! header) so the writer streams each tensor to disk as it comes, holding at most one in
//! memory, and the reader still finds everything from the first 64 bytes. Every region is
//! 64-byte aligned in the file, and a mapping is page aligned, so packed matrices are used
//! in place by the kernels with the alignment their loads want.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use strata_kernels::ggml::{GgmlMatrix, GgmlType};
use strata_kernels::packed::{LAYOUT_VERSION, PackedLayout, StableBytes};
use strata_kernels::{PackedFormat, PackedMatrix};

use crate::{DType, Error, MappedFile, Result, TensorView};

/// First eight bytes of every `.strata` file.
pub const MAGIC: [u8; 8] = *b"STRATA\0\0";
/// Version of the file format (header and directory) this module reads and writes.
pub const VERSION: u32 = 1;
/// Alignment of every region in the file.
pub const ALIGN: u64 = 64;
/// Bytes of the fixed header.
const HEADER: u64 = 64;

/// The element kind of a stored tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoredKind {
    /// Little-endian f32 values.
    F32,
    /// Little-endian BF16 values.
    Bf16,
    /// A [`PackedMatrix`] in this format (values then scales).
    Packed(PackedFormat),
    /// A `[n, k]` matrix of ggml blocks of this type, as a GGUF stores them (kind
    /// `ggml:<TYPE>` in the directory).
    Ggml(GgmlType),
}

/// A [`PackedFormat`] from its [`PackedFormat::name`].
pub fn parse_packed_format(name: &str) -> Option<PackedFormat> {
    let group = |s: &str| s.parse::<usize>().ok();
    match name {
        "bf16" => Some(PackedFormat::Bf16),
        "int8" => Some(PackedFormat::Int8 { group: None }),
        _ => {
            if let Some(g) = name.strip_prefix("int8g") {
                Some(PackedFormat::Int8 {
                    group: Some(group(g)?),
                })
            } else {
                Some(PackedFormat::Int4 {
                    group: group(name.strip_prefix("int4g")?)?,
                })
            }
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct PackedEntry {
    format: String,
    n: usize,
    k: usize,
    scales_offset: u64,
    scales_length: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct TensorEntry {
    name: String,
    kind: String,
    shape: Vec<usize>,
    offset: u64,
    length: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    packed: Option<PackedEntry>,
}

#[derive(Debug, Serialize, Deserialize)]
struct BlobEntry {
    name: String,
    offset: u64,
    length: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Directory {
    config: Value,
    #[serde(default)]
    metadata: Value,
    #[serde(default)]
    blobs: Vec<BlobEntry>,
    tensors: Vec<TensorEntry>,
}

/// Writes a `.strata` file: add tensors and blobs, then [`StrataWriter::finish`].
///
/// Data goes to `<path>.tmp` as it is added; `finish` writes the directory, syncs and
/// renames the file into place. A writer dropped before `finish` (an error on the way)
/// removes the temporary file, so a failed conversion leaves nothing behind.
#[derive(Debug)]
pub struct StrataWriter {
    path: PathBuf,
    tmp: PathBuf,
    out: Option<BufWriter<File>>,
    pos: u64,
    tensors: Vec<TensorEntry>,
    blobs: Vec<BlobEntry>,
}

impl StrataWriter {
    /// Starts writing the file `path` (through a temporary file beside it).
    pub fn create(path: &Path) -> Result<Self> {
        let mut name = path.file_name().unwrap_or_default().to_os_string();
        name.push(".tmp");
        let tmp = path.with_file_name(name);
        let file = File::create(&tmp).map_err(|source| Error::Io {
            path: tmp.clone(),
            source,
        })?;
        let mut w = StrataWriter {
            path: path.to_owned(),
            tmp,
            out: Some(BufWriter::with_capacity(1 << 20, file)),
            pos: 0,
            tensors: Vec::new(),
            blobs: Vec::new(),
        };
        w.write(&[0; HEADER as usize])?;
        Ok(w)
    }

    fn io(&self, source: std::io::Error) -> Error {
        Error::Io {
            path: self.tmp.clone(),
            source,
        }
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let out = self.out.as_mut().expect("writer is open until finish");
        out.write_all(bytes).map_err(|e| Error::Io {
            path: self.tmp.clone(),
            source: e,
        })?;
        self.pos += bytes.len() as u64;
        Ok(())
    }

    /// Pads to the alignment and writes `bytes`; returns their absolute offset.
    fn region(&mut self, bytes: &[u8]) -> Result<u64> {
        let pad = self.pos.next_multiple_of(ALIGN) - self.pos;
        self.write(&[0; ALIGN as usize][..pad as usize])?;
        let at = self.pos;
        self.write(bytes)?;
        Ok(at)
    }

    fn check_name(&self, name: &str) -> Result<()> {
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(Error::BadTensor {
                path: self.path.clone(),
                name: name.to_owned(),
                message: "written twice".into(),
            });
        }
        Ok(())
    }

    /// Adds f32 values of `shape`.
    pub fn add_f32(&mut self, name: &str, shape: &[usize], values: &[f32]) -> Result<()> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add_raw(name, "f32", shape, &bytes, values.len())
    }

    /// Adds BF16 values of `shape`.
    pub fn add_bf16(&mut self, name: &str, shape: &[usize], values: &[half::bf16]) -> Result<()> {
        let bytes: Vec<u8> = values
            .iter()
            .flat_map(|v| v.to_bits().to_le_bytes())
            .collect();
        self.add_raw(name, "bf16", shape, &bytes, values.len())
    }

    fn add_raw(
        &mut self,
        name: &str,
        kind: &str,
        shape: &[usize],
        bytes: &[u8],
        count: usize,
    ) -> Result<()> {
        self.check_name(name)?;
        if shape.iter().product::<usize>() != count {
            return Err(Error::BadTensor {
                path: self.path.clone(),
                name: name.to_owned(),
                message: format!("shape {shape:?} does not hold {count} values"),
            });
        }
        let offset = self.region(bytes)?;
        self.tensors.push(TensorEntry {
            name: name.to_owned(),
            kind: kind.to_owned(),
            shape: shape.to_vec(),
            offset,
            length: bytes.len() as u64,
            packed: None,
        });
        Ok(())
    }

    /// Adds a packed matrix (its values, then its scales).
    pub fn add_packed(&mut self, name: &str, m: &PackedMatrix) -> Result<()> {
        self.check_name(name)?;
        let data = m.data_bytes();
        let offset = self.region(data)?;
        let scales = m.scale_bytes();
        let scales_offset = self.region(&scales)?;
        self.tensors.push(TensorEntry {
            name: name.to_owned(),
            kind: "packed".into(),
            shape: vec![m.n(), m.k()],
            offset,
            length: data.len() as u64,
            packed: Some(PackedEntry {
                format: m.format().name(),
                n: m.n(),
                k: m.k(),
                scales_offset,
                scales_length: scales.len() as u64,
            }),
        });
        Ok(())
    }

    /// Adds a matrix of ggml blocks as they are (a GGUF tensor kept in its own format).
    pub fn add_ggml(&mut self, name: &str, m: &GgmlMatrix) -> Result<()> {
        self.check_name(name)?;
        let offset = self.region(m.bytes())?;
        self.tensors.push(TensorEntry {
            name: name.to_owned(),
            kind: format!("ggml:{}", m.ty().name()),
            shape: vec![m.n(), m.k()],
            offset,
            length: m.bytes().len() as u64,
            packed: None,
        });
        Ok(())
    }

    /// Adds a named byte string (a tokenizer file).
    pub fn add_blob(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        let offset = self.region(bytes)?;
        self.blobs.push(BlobEntry {
            name: name.to_owned(),
            offset,
            length: bytes.len() as u64,
        });
        Ok(())
    }

    /// Writes the directory with `config` and `metadata`, and moves the file into place.
    pub fn finish(mut self, config: Value, metadata: Value) -> Result<()> {
        let dir = Directory {
            config,
            metadata,
            blobs: std::mem::take(&mut self.blobs),
            tensors: std::mem::take(&mut self.tensors),
        };
        let json =
            serde_json::to_vec(&dir).map_err(|e| Error::malformed(&self.path, e.to_string()))?;
        let dir_offset = self.region(&json)?;
        let mut out = self.out.take().expect("writer is open until finish");
        let mut head = Vec::with_capacity(HEADER as usize);
        head.extend_from_slice(&MAGIC);
        head.extend_from_slice(&VERSION.to_le_bytes());
        head.extend_from_slice(&LAYOUT_VERSION.to_le_bytes());
        head.extend_from_slice(&dir_offset.to_le_bytes());
        head.extend_from_slice(&(json.len() as u64).to_le_bytes());
        let done = (|| {
            out.seek(SeekFrom::Start(0))?;
            out.write_all(&head)?;
            let file = out.into_inner().map_err(|e| e.into_error())?;
            file.sync_all()
        })();
        done.map_err(|e| self.io(e))?;
        std::fs::rename(&self.tmp, &self.path).map_err(|source| Error::Io {
            path: self.path.clone(),
            source,
        })?;
        Ok(())
    }
}

impl Drop for StrataWriter {
    fn drop(&mut self) {
        if self.out.is_some() || self.tmp.exists() {
            self.out = None;
            // Best effort: an unfinished file must not be mistaken for a model.
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// One tensor of a [`StrataFile`], validated.
#[derive(Debug, Clone)]
pub struct StoredTensor {
    /// Name (the Hugging Face name for raw tensors; see the model loader for packed ones).
    pub name: String,
    /// Element kind.
    pub kind: StoredKind,
    /// Shape (`[n, k]` for packed matrices).
    pub shape: Vec<usize>,
    data: Range<usize>,
    scales: Range<usize>,
    view: Option<TensorView>,
}

impl StoredTensor {
    /// The f32 or BF16 tensor as a view on the mapped file (`None` for packed ones).
    pub fn view(&self) -> Option<&TensorView> {
        self.view.as_ref()
    }
}

/// A mapped `.strata` file, validated at open.
pub struct StrataFile {
    map: MappedFile,
    owner: Arc<dyn StableBytes>,
    config: Value,
    metadata: Value,
    tensors: Vec<StoredTensor>,
    index: HashMap<String, usize>,
    blobs: HashMap<String, Range<usize>>,
}

impl std::fmt::Debug for StrataFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StrataFile")
            .field("path", &self.path())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

// SAFETY: a `MappedFile` holds one read-only mapping behind an `Arc`: `bytes()` returns the
// same address and length for as long as any clone lives. (A file changed on disk while
// mapped is outside what any mmap loader can defend against; see `MappedFile::open`.)
unsafe impl StableBytes for MappedFile {
    fn stable_bytes(&self) -> &[u8] {
        self.bytes()
    }
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b.try_into().expect("4 bytes"))
}

fn le_u64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b.try_into().expect("8 bytes"))
}

/// One tensor entry of a [`StrataHeader`], validated.
#[derive(Debug, Clone)]
pub struct HeaderTensor {
    /// Name.
    pub name: String,
    /// Element kind.
    pub kind: StoredKind,
    /// Shape (`[n, k]` for packed matrices).
    pub shape: Vec<usize>,
    /// Byte range of the values in the file (64-byte aligned).
    pub data: Range<usize>,
    /// Byte range of a packed matrix's f32 scales (empty for plain tensors).
    pub scales: Range<usize>,
}

/// The fixed header and directory of a `.strata` file, every entry checked against the
/// file's bytes: what [`StrataFile::open`] maps.
#[derive(Debug, Clone)]
pub struct StrataHeader {
    /// The model configuration stored at conversion.
    pub config: Value,
    /// Free-form metadata stored at conversion.
    pub metadata: Value,
    /// Tensors in file order, names unique.
    pub tensors: Vec<HeaderTensor>,
    /// Named blobs and their byte ranges, names unique.
    pub blobs: Vec<(String, Range<usize>)>,
}

/// Parses and validates the `.strata` file held in `bytes` (the whole file); `path` names
/// it in errors. Every range it returns lies inside `bytes`, starts at a multiple of
/// [`ALIGN`] and is exactly as long as its kind and shape need.
pub fn parse_header(path: &Path, b: &[u8]) -> Result<StrataHeader> {
    let bad = |m: String| Error::malformed(path, m);
    if b.len() >= MAGIC.len() && b[..8] != MAGIC {
        return Err(bad(format!(
            "not a .strata file: magic {:?}, expected {:?}",
            String::from_utf8_lossy(&b[..8]),
            String::from_utf8_lossy(&MAGIC)
        )));
    }
    if b.len() < HEADER as usize {
        return Err(bad(format!(
            "truncated: {} bytes, shorter than the {HEADER}-byte header",
            b.len()
        )));
    }
    let version = le_u32(&b[8..12]);
    if version != VERSION {
        return Err(bad(format!(
            "file format version {version}, this build reads version {VERSION}; re-run `strata convert`"
        )));
    }
    let layout = le_u32(&b[12..16]);
    if layout != LAYOUT_VERSION {
        return Err(bad(format!(
            "packed layout version {layout}, this build's kernels use version {LAYOUT_VERSION}; re-run `strata convert` on the original model"
        )));
    }
    let len = b.len() as u64;
    let (dir_off, dir_len) = (le_u64(&b[16..24]), le_u64(&b[24..32]));
    let in_file = |off: u64, n: u64| off.checked_add(n).is_some_and(|end| end <= len);
    if !in_file(dir_off, dir_len) || dir_off < HEADER {
        return Err(bad(format!(
            "directory at {dir_off}..+{dir_len} is outside the file's {len} bytes (truncated?)"
        )));
    }
    let dir: Directory = serde_json::from_slice(&b[dir_off as usize..(dir_off + dir_len) as usize])
        .map_err(|e| bad(format!("invalid directory JSON: {e}")))?;
    let region = |what: &str, name: &str, off: u64, n: u64| -> Result<Range<usize>> {
        let err = |m: String| Error::BadTensor {
            path: path.to_owned(),
            name: name.to_owned(),
            message: format!("{what} {m}"),
        };
        if !in_file(off, n) || off < HEADER {
            return Err(err(format!(
                "bytes {off}..+{n} are outside the file's data ({len} bytes)"
            )));
        }
        if !off.is_multiple_of(ALIGN) {
            return Err(err(format!("offset {off} is not a multiple of {ALIGN}")));
        }
        Ok(off as usize..(off + n) as usize)
    };
    let mut tensors: Vec<HeaderTensor> = Vec::with_capacity(dir.tensors.len());
    let mut names = HashSet::with_capacity(dir.tensors.len());
    for e in dir.tensors {
        let name = e.name.as_str();
        let bad_tensor = |message: String| Error::BadTensor {
            path: path.to_owned(),
            name: name.to_owned(),
            message,
        };
        let data = region("data", name, e.offset, e.length)?;
        let numel = e
            .shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| bad_tensor(format!("shape {:?} overflows", e.shape)))?;
        let (kind, scales) = match (e.kind.as_str(), &e.packed) {
            (k @ ("f32" | "bf16"), None) => (
                float_kind(k, &e.shape, numel, data.len()).map_err(bad_tensor)?,
                0..0,
            ),
            ("packed", Some(p)) => {
                let fmt = parse_packed_format(&p.format)
                    .ok_or_else(|| bad_tensor(format!("unknown packed format `{}`", p.format)))?;
                if e.shape != [p.n, p.k] {
                    return Err(bad_tensor(format!(
                        "shape {:?} disagrees with packed [{}, {}]",
                        e.shape, p.n, p.k
                    )));
                }
                let scales = region("scales", name, p.scales_offset, p.scales_length)?;
                // Values take at least half a byte each (int4), so a matrix inside the file
                // has `n * k <= 2 * len`; bounding `n` and `k` so also keeps the layout's
                // padded sizes (rows to 32, columns to 128) far from overflowing.
                let most = (len as usize).saturating_mul(2);
                if p.n > most || p.k > most || numel > most {
                    return Err(bad_tensor(format!(
                        "packed [{}, {}] cannot fit in the file's {len} bytes",
                        p.n, p.k
                    )));
                }
                let layout =
                    PackedLayout::new(fmt, p.n, p.k).map_err(|err| bad_tensor(err.to_string()))?;
                if layout.data_bytes != data.len() || layout.scales * 4 != scales.len() {
                    return Err(bad_tensor(format!(
                        "{} [{}, {}] needs {} value bytes and {} scale bytes, the directory says {} and {}",
                        p.format,
                        p.n,
                        p.k,
                        layout.data_bytes,
                        layout.scales * 4,
                        data.len(),
                        scales.len()
                    )));
                }
                (StoredKind::Packed(fmt), scales)
            }
            (k, None) if k.starts_with("ggml:") => (
                ggml_kind(k, &e.shape, data.len()).map_err(bad_tensor)?,
                0..0,
            ),
            (k, _) => {
                return Err(bad_tensor(format!(
                    "unknown tensor kind `{k}` (expected f32, bf16, ggml:<TYPE> or packed with its packed entry)"
                )));
            }
        };
        if !names.insert(e.name.clone()) {
            return Err(bad_tensor("listed twice".into()));
        }
        tensors.push(HeaderTensor {
            name: e.name,
            kind,
            shape: e.shape,
            data,
            scales,
        });
    }
    let mut blobs = Vec::with_capacity(dir.blobs.len());
    let mut blob_names = HashSet::with_capacity(dir.blobs.len());
    for bl in dir.blobs {
        let r = region("blob", &bl.name, bl.offset, bl.length)?;
        if !blob_names.insert(bl.name.clone()) {
            return Err(Error::BadTensor {
                path: path.to_owned(),
                name: bl.name,
                message: "blob listed twice".into(),
            });
        }
        blobs.push((bl.name, r));
    }
    Ok(StrataHeader {
        config: dir.config,
        metadata: dir.metadata,
        tensors,
        blobs,
    })
}

/// The kind of an `f32` or `bf16` tensor, whose data must hold exactly its shape.
fn float_kind(
    k: &str,
    shape: &[usize],
    numel: usize,
    data_len: usize,
) -> Result<StoredKind, String> {
    let (kind, size) = if k == "f32" {
        (StoredKind::F32, 4)
    } else {
        (StoredKind::Bf16, 2)
    };
    if numel.checked_mul(size) != Some(data_len) {
        return Err(format!(
            "{k} shape {:?} needs {} bytes, the directory says {}",
            shape,
            numel.saturating_mul(size),
            data_len
        ));
    }
    Ok(kind)
}

/// The kind of a `ggml:<TYPE>` tensor: whole blocks of that type, `[n, k]`.
fn ggml_kind(k: &str, shape: &[usize], data_len: usize) -> Result<StoredKind, String> {
    let name = &k["ggml:".len()..];
    let ty = GgmlType::ALL
        .into_iter()
        .find(|t| t.name() == name)
        .ok_or_else(|| format!("unknown ggml type `{name}`"))?;
    let [n, k] = shape[..] else {
        return Err(format!("ggml blocks need a shape [n, k], got {:?}", shape));
    };
    let want = ty
        .row_bytes(k as u64)
        .and_then(|r| r.checked_mul(n as u64))
        .ok_or_else(|| format!("rows of {k} values are not whole {ty} blocks"))?;
    if want != data_len as u64 {
        return Err(format!(
            "{ty} [{n}, {k}] needs {want} bytes, the directory says {}",
            data_len
        ));
    }
    Ok(StoredKind::Ggml(ty))
}

impl StrataFile {
    /// Whether `path` starts with the `.strata` magic (false when it cannot be read).
    pub fn sniff(path: &Path) -> bool {
        use std::io::Read;
        let mut magic = [0u8; 8];
        File::open(path)
            .and_then(|mut f| f.read_exact(&mut magic))
            .is_ok_and(|()| magic == MAGIC)
    }

    /// Maps and validates `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let map = MappedFile::open(path)?;
        let header = parse_header(path, map.bytes())?;
        let owner: Arc<dyn StableBytes> = Arc::new(map.clone());
        let mut index = HashMap::with_capacity(header.tensors.len());
        let tensors = header
            .tensors
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                index.insert(t.name.clone(), i);
                let dtype = match t.kind {
                    StoredKind::F32 => Some(DType::F32),
                    StoredKind::Bf16 => Some(DType::BF16),
                    StoredKind::Packed(_) | StoredKind::Ggml(_) => None,
                };
                let view = dtype.map(|d| {
                    TensorView::new(
                        map.clone(),
                        t.name.clone(),
                        d,
                        t.shape.clone(),
                        t.data.clone(),
                    )
                });
                StoredTensor {
                    name: t.name,
                    kind: t.kind,
                    shape: t.shape,
                    data: t.data,
                    scales: t.scales,
                    view,
                }
            })
            .collect();
        Ok(StrataFile {
            map,
            owner,
            config: header.config,
            metadata: header.metadata,
            tensors,
            index,
            blobs: header.blobs.into_iter().collect(),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        self.map.path()
    }

    /// The model configuration stored at conversion.
    pub fn config(&self) -> &Value {
        &self.config
    }

    /// Free-form metadata stored at conversion (source, options, tokenizer special tokens).
    pub fn metadata(&self) -> &Value {
        &self.metadata
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> &[StoredTensor] {
        &self.tensors
    }

    /// A tensor by name.
    pub fn get(&self, name: &str) -> Option<&StoredTensor> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// A named blob's bytes.
    pub fn blob(&self, name: &str) -> Option<&[u8]> {
        self.blobs.get(name).map(|r| &self.map.bytes()[r.clone()])
    }

    /// Bytes a tensor occupies in the file (values and scales).
    pub fn stored_bytes(&self, t: &StoredTensor) -> usize {
        t.data.len() + t.scales.len()
    }

    /// A tensor of ggml blocks as a matrix viewing the mapped bytes (nothing is copied).
    pub fn ggml(&self, t: &StoredTensor) -> Result<GgmlMatrix> {
        let bad = |message: String| Error::BadTensor {
            path: self.path().to_owned(),
            name: t.name.clone(),
            message,
        };
        let StoredKind::Ggml(ty) = t.kind else {
            return Err(bad("expected ggml blocks".into()));
        };
        GgmlMatrix::from_stored(
            self.owner.clone(),
            ty,
            t.shape[0],
            t.shape[1],
            t.data.clone(),
        )
        .map_err(|e| bad(e.to_string()))
    }

    /// A packed tensor as a matrix viewing the mapped bytes (nothing is copied).
    pub fn packed(&self, t: &StoredTensor) -> Result<PackedMatrix> {
        let bad = |message: String| Error::BadTensor {
            path: self.path().to_owned(),
            name: t.name.clone(),
            message,
        };
        let StoredKind::Packed(fmt) = t.kind else {
            return Err(bad(
                "expected a packed matrix, stored as plain values".into()
            ));
        };
        PackedMatrix::from_stored(
            self.owner.clone(),
            fmt,
            t.shape[0],
            t.shape[1],
            t.data.clone(),
            t.scales.clone(),
        )
        .map_err(|e| bad(e.to_string()))
    }
}

#[cfg(test)]
mod tests;
