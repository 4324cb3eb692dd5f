//! Checkpoint formats for Strata: bytes in, tensors out.
//!
//! - [`safetensors`]: Hugging Face safetensors files and sharded directories, through mmap.
//! - [`DType`] and [`TensorView`]: a typed, shaped window on mapped bytes.
//! - [`strata_file`]: the engine's own packed model file, written by `strata convert`.
//!
//! A key design decision made in this crate is that loaders validate everything they read
//! (lengths, offsets, dtypes, shapes) and report the file and tensor in every error, because
//! checkpoints are user input: a hostile or truncated file must never panic or read out of range.

#![deny(missing_docs)]

mod error;
pub mod gguf;
mod mmap;
pub mod npy;
pub mod safetensors;
pub mod strata_file;
mod tensor;

pub use error::{Error, Result};
pub use mmap::MappedFile;
pub use tensor::{DType, TensorView};
