//! Checkpoint formats for Strata: bytes in, tensors out.
//!
//! - [`safetensors`]: Hugging Face safetensors files and sharded directories, through mmap.
//! - [`DType`] and [`TensorView`]: a typed, shaped window on mapped bytes.
//! - [`strata_file`]: the engine's own packed model file, written by `strata convert`.
//! - `uring` (Linux): many positioned reads in flight through io_uring, for the SSD tier.
//!
//! A key design decision made in this crate is that loaders validate everything they read
//! (lengths, offsets, dtypes, shapes) and report the file and tensor in every error, because
//! checkpoints are user input: a hostile or truncated file must never panic or read out of range.
//!
//! ```
//! use strata_formats::DType;
//! use strata_formats::safetensors::Checkpoint;
//!
//! // A safetensors file of one tensor: the header's length (u64, little-endian), the JSON
//! // header, then the data.
//! let header = br#"{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}"#;
//! let mut file = (header.len() as u64).to_le_bytes().to_vec();
//! file.extend_from_slice(header);
//! file.extend([1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()));
//! let dir = std::env::temp_dir().join(format!("strata-formats-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let path = dir.join("model.safetensors");
//! std::fs::write(&path, &file)?;
//!
//! // Mapped, not read: `w` is a typed view on the file's bytes.
//! let ckpt = Checkpoint::open_file(&path)?;
//! let w = ckpt.get("w")?;
//! assert_eq!((w.dtype(), w.shape()), (DType::F32, &[2, 2][..]));
//! assert_eq!(w.to_f32()?, [1.0, 2.0, 3.0, 4.0]);
//!
//! // Truncated: an error naming the file, not a panic or a read past its end.
//! std::fs::write(&path, &file[..file.len() - 4])?;
//! let err = Checkpoint::open_file(&path).unwrap_err();
//! assert!(err.to_string().contains("model.safetensors"), "{err}");
//! std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]

mod error;
pub mod gguf;
mod mmap;
pub mod npy;
pub mod safetensors;
pub mod strata_file;
mod tensor;
#[cfg(target_os = "linux")]
pub mod uring;

pub use error::{Error, Result};
pub use mmap::MappedFile;
pub use tensor::{DType, TensorView};
