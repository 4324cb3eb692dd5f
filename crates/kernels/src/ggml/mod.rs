//! ggml's quantized block formats (the tensors of GGUF files), computed where they lie.
//!
//! - [`GgmlType`]: every element type a GGUF may declare, with its block geometry.
//! - [`dequantize_row`] / [`dequantize_row_bf16`]: the scalar reference decoders, bit for bit
//!   what ggml's `dequantize_row_*` compute.

mod dequant;
mod iq;
mod types;

pub use dequant::{QuantError, dequantize_row, dequantize_row_bf16};
pub use types::{GgmlType, QK_K};
