//! Hugging Face safetensors: single files and sharded directories (`model.safetensors.index.json`).
//!
//! File layout: an 8-byte little-endian header length `N`, `N` bytes of JSON mapping tensor
//! names to `{dtype, shape, data_offsets: [begin, end]}` (offsets relative to the end of the
//! header), then the data. Every offset is checked against the file length, every byte length
//! against dtype x shape, and tensors may not overlap.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::{DType, Error, MappedFile, Result, TensorView};

/// Largest header we accept (the format's own reference reader uses 100 MB).
const MAX_HEADER_BYTES: u64 = 100 << 20;
/// Largest tensor rank we accept.
const MAX_RANK: usize = 8;

#[derive(Deserialize)]
struct RawEntry {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

fn parse_dtype(s: &str) -> DType {
    match s {
        "F32" => DType::F32,
        "F16" => DType::F16,
        "BF16" => DType::BF16,
        "F8_E4M3" => DType::F8E4M3,
        "F64" => DType::Other("F64"),
        "I64" => DType::Other("I64"),
        "I32" => DType::Other("I32"),
        "I16" => DType::Other("I16"),
        "I8" => DType::Other("I8"),
        "U8" => DType::Other("U8"),
        "BOOL" => DType::Other("BOOL"),
        "F8_E5M2" => DType::Other("F8_E5M2"),
        _ => DType::Other("unknown"),
    }
}

/// One tensor's header entry: name, dtype, shape and the absolute byte range of its data.
pub type HeaderEntry = (String, DType, Vec<usize>, std::ops::Range<usize>);

/// Parses and validates a safetensors header held in `bytes` (the whole file).
pub fn parse_header(path: &Path, bytes: &[u8]) -> Result<Vec<HeaderEntry>> {
    let bad = |m: String| Error::malformed(path, m);
    if bytes.len() < 8 {
        return Err(bad(format!(
            "truncated safetensors file: {} bytes, shorter than the 8-byte header length",
            bytes.len()
        )));
    }
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    if n > MAX_HEADER_BYTES {
        return Err(bad(format!(
            "safetensors header of {n} bytes exceeds the limit of {MAX_HEADER_BYTES}"
        )));
    }
    let data_start = 8 + n as usize;
    if data_start > bytes.len() {
        return Err(bad(format!(
            "truncated safetensors file: header says {n} bytes but the file has {} after the length",
            bytes.len() - 8
        )));
    }
    let json = std::str::from_utf8(&bytes[8..data_start])
        .map_err(|e| bad(format!("safetensors header is not UTF-8: {e}")))?;
    let raw: BTreeMap<String, serde_json::Value> = serde_json::from_str(json.trim_end())
        .map_err(|e| bad(format!("safetensors header is not a JSON object: {e}")))?;
    let data_len = (bytes.len() - data_start) as u64;
    let mut out = Vec::with_capacity(raw.len());
    for (name, value) in raw {
        if name == "__metadata__" {
            continue;
        }
        let entry: RawEntry = serde_json::from_value(value)
            .map_err(|e| bad(format!("tensor `{name}`: invalid header entry: {e}")))?;
        let dtype = parse_dtype(&entry.dtype);
        if entry.shape.len() > MAX_RANK {
            return Err(bad(format!(
                "tensor `{name}`: rank {} exceeds the limit of {MAX_RANK}",
                entry.shape.len()
            )));
        }
        let [begin, end] = entry.data_offsets;
        if begin > end || end > data_len {
            return Err(bad(format!(
                "tensor `{name}`: data offsets [{begin}, {end}] out of range (data section is {data_len} bytes)"
            )));
        }
        let numel = entry
            .shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| {
                bad(format!(
                    "tensor `{name}`: shape {:?} overflows",
                    entry.shape
                ))
            })?;
        if let Some(size) = dtype.size() {
            let want = numel.checked_mul(size as u64);
            if want != Some(end - begin) {
                return Err(bad(format!(
                    "tensor `{name}`: {} x {:?} needs {} bytes but data offsets span {}",
                    entry.dtype,
                    entry.shape,
                    numel.saturating_mul(size as u64),
                    end - begin
                )));
            }
        }
        let shape = entry.shape.iter().map(|&d| d as usize).collect();
        out.push((
            name,
            dtype,
            shape,
            data_start + begin as usize..data_start + end as usize,
        ));
    }
    // Overlapping tensors mean a corrupt or hostile file.
    let mut ranges: Vec<_> = out.iter().map(|t| (t.3.start, t.3.end, &t.0)).collect();
    ranges.sort();
    for w in ranges.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(bad(format!(
                "tensors `{}` and `{}` overlap",
                w[0].2, w[1].2
            )));
        }
    }
    Ok(out)
}

/// The tensors of one or more safetensors files, by name.
#[derive(Debug, Clone, Default)]
pub struct Checkpoint {
    root: PathBuf,
    tensors: HashMap<String, TensorView>,
}

impl Checkpoint {
    /// Opens a single safetensors file.
    pub fn open_file(path: &Path) -> Result<Self> {
        let mut ck = Checkpoint {
            root: path.to_owned(),
            tensors: HashMap::new(),
        };
        ck.add_file(path)?;
        Ok(ck)
    }

    /// Opens every safetensors file of a model directory: the shards listed in
    /// `model.safetensors.index.json` if present, else `model.safetensors`, else every
    /// `*.safetensors` file in the directory.
    pub fn open_dir(dir: &Path) -> Result<Self> {
        let mut ck = Checkpoint {
            root: dir.to_owned(),
            tensors: HashMap::new(),
        };
        let index = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if index.exists() {
            let text = std::fs::read_to_string(&index).map_err(|source| Error::Io {
                path: index.clone(),
                source,
            })?;
            #[derive(Deserialize)]
            struct Index {
                weight_map: BTreeMap<String, String>,
            }
            let idx: Index = serde_json::from_str(&text)
                .map_err(|e| Error::malformed(&index, format!("invalid index: {e}")))?;
            let mut shards: Vec<String> = idx.weight_map.values().cloned().collect();
            shards.sort();
            shards.dedup();
            for s in &shards {
                if s.contains('/') || s.contains('\\') || s.starts_with('.') {
                    return Err(Error::malformed(
                        &index,
                        format!(
                            "shard name `{s}` must be a plain file name in the model directory"
                        ),
                    ));
                }
            }
            shards.iter().map(|s| dir.join(s)).collect()
        } else if dir.join("model.safetensors").exists() {
            vec![dir.join("model.safetensors")]
        } else {
            let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
                .map_err(|source| Error::Io {
                    path: dir.to_owned(),
                    source,
                })?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
                .collect();
            v.sort();
            v
        };
        if files.is_empty() {
            return Err(Error::malformed(
                dir,
                "no safetensors files in the model directory",
            ));
        }
        for f in &files {
            ck.add_file(f)?;
        }
        Ok(ck)
    }

    fn add_file(&mut self, path: &Path) -> Result<()> {
        let file = MappedFile::open(path)?;
        for (name, dtype, shape, range) in parse_header(path, file.bytes())? {
            let view = TensorView::new(file.clone(), name.clone(), dtype, shape, range);
            if self.tensors.insert(name.clone(), view).is_some() {
                return Err(Error::malformed(
                    path,
                    format!("tensor `{name}` appears in more than one file"),
                ));
            }
        }
        Ok(())
    }

    /// The directory or file this checkpoint was opened from.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Looks a tensor up by name.
    pub fn get(&self, name: &str) -> Result<&TensorView> {
        self.tensors.get(name).ok_or_else(|| Error::MissingTensor {
            path: self.root.clone(),
            name: name.to_owned(),
        })
    }

    /// Whether a tensor is present.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Every tensor, in no particular order.
    pub fn tensors(&self) -> impl Iterator<Item = &TensorView> {
        self.tensors.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, data: usize) -> Vec<u8> {
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.extend(std::iter::repeat_n(0u8, data));
        v
    }

    fn check_err(bytes: &[u8], want: &str) {
        let err = parse_header(Path::new("x.safetensors"), bytes)
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "error `{err}` should contain `{want}`");
        assert!(
            err.starts_with("x.safetensors: "),
            "error `{err}` should name the file"
        );
    }

    #[test]
    fn valid_header_parses() {
        let b = file(
            r#"{"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}"#,
            24,
        );
        let t = parse_header(Path::new("x"), &b).unwrap();
        assert_eq!(t[0].2, vec![2, 3]);
        assert_eq!(t[0].3.len(), 24);
    }

    #[test]
    fn malformed_headers_name_the_problem() {
        check_err(&[1, 2, 3], "truncated");
        let full = file(
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
            4,
        );
        check_err(&full[..20], "truncated");
        check_err(&file("not json", 0), "not a JSON object");
        check_err(
            &file(
                r#"{"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}"#,
                10,
            ),
            "out of range",
        );
        check_err(
            &file(
                r#"{"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,24]}}"#,
                24,
            ),
            "needs 12 bytes",
        );
        check_err(
            &file(
                r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}}"#,
                8,
            ),
            "overlap",
        );
        check_err(
            &file(
                r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,4]}}"#,
                8,
            ),
            "overflows",
        );
        let mut huge = file("{}", 0);
        huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        check_err(&huge, "exceeds the limit");
    }
}
