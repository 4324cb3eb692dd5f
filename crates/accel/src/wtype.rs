//! How weights are stored on the device: f32, two 16-bit floats per 32-bit word, or
//! llama.cpp's quantized blocks exactly as a GGUF file stores them.
//!
//! A key design decision made here is that a quantized matrix goes to the device as the
//! file's bytes (a Q4_K expert takes its 4.5 bits per weight of device memory and of
//! transfer), and the kernels decode the blocks as they read them. Rows are stored back to
//! back as in the file, so a row may start at any byte: the shaders read bytes out of
//! 32-bit words (`shaders/quant/common.wgsl`). Each type's block layout is decoded in one
//! shader file (`shaders/quant/<type>.wgsl`), whose geometry is the table in
//! [`WeightType::block`]; tests check both against the CPU's reference dequantizers.

use crate::{Error, Result};

/// Storage type of a weight on the device.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightType {
    /// One f32 per word.
    F32,
    /// Two bfloat16 per word, element 0 in the low half.
    Bf16,
    /// Two IEEE half floats per word, element 0 in the low half.
    F16,
    /// ggml Q4_0: blocks of 32, an f16 scale and 4-bit values.
    Q4_0,
    /// ggml Q5_0: blocks of 32, an f16 scale and 5-bit values.
    Q5_0,
    /// ggml Q8_0: blocks of 32, an f16 scale and 8-bit values.
    Q8_0,
    /// ggml Q4_K: super-blocks of 256, 6-bit scales and mins per 32, 4-bit values.
    Q4_K,
    /// ggml Q5_K: super-blocks of 256, 6-bit scales and mins per 32, 5-bit values.
    Q5_K,
    /// ggml Q6_K: super-blocks of 256, 8-bit scales per 16, 6-bit values.
    Q6_K,
    /// ggml IQ4_XS: super-blocks of 256, 6-bit scales per 32, 4-bit non-linear values.
    IQ4_XS,
}

impl WeightType {
    /// Every type, floats first.
    pub const ALL: [WeightType; 10] = [
        WeightType::F32,
        WeightType::Bf16,
        WeightType::F16,
        WeightType::Q4_0,
        WeightType::Q5_0,
        WeightType::Q8_0,
        WeightType::Q4_K,
        WeightType::Q5_K,
        WeightType::Q6_K,
        WeightType::IQ4_XS,
    ];

    /// `(elements, bytes)` of one block: the one table of the device formats' geometry
    /// (ggml's for the quantized types).
    pub fn block(self) -> (usize, usize) {
        match self {
            WeightType::F32 => (1, 4),
            WeightType::Bf16 | WeightType::F16 => (1, 2),
            WeightType::Q4_0 => (32, 18),
            WeightType::Q5_0 => (32, 22),
            WeightType::Q8_0 => (32, 34),
            WeightType::Q4_K => (256, 144),
            WeightType::Q5_K => (256, 176),
            WeightType::Q6_K => (256, 210),
            WeightType::IQ4_XS => (256, 136),
        }
    }

    /// Whether the type stores ggml blocks (decoded by the kernels).
    pub fn is_quantized(self) -> bool {
        self.block().0 > 1
    }

    /// The device type holding a GGUF tensor's blocks as they are, by ggml's type name
    /// (`Q4_K`); `None` for types the kernels do not decode (dequantize those to
    /// [`WeightType::F16`]).
    pub fn from_ggml_name(name: &str) -> Option<WeightType> {
        WeightType::ALL
            .into_iter()
            .find(|t| t.is_quantized() && t.name().eq_ignore_ascii_case(name))
    }

    /// Exact bytes of one row of `k` elements (`k` a whole number of blocks).
    pub fn row_bytes(self, k: usize) -> u64 {
        let (elems, bytes) = self.block();
        (k.div_ceil(elems) * bytes) as u64
    }

    /// Bytes of `n` elements (a whole number of blocks), rounded up to whole 32-bit words.
    pub fn bytes(self, n: usize) -> u64 {
        self.row_bytes(n).next_multiple_of(4)
    }

    /// Whether rows of `k` elements are whole blocks of this type.
    pub fn fits_row(self, k: usize) -> bool {
        k.is_multiple_of(self.block().0)
    }

    /// The split granule of a row-major matrix with rows of `k` elements: whole rows that
    /// are also whole 32-bit words (pass it to [`crate::Device::alloc`]).
    pub fn row_granule(self, k: usize) -> u64 {
        let row = self.row_bytes(k.max(1));
        match row % 4 {
            0 => row,
            2 => 2 * row,
            _ => 4 * row,
        }
    }

    /// Encodes f32 values in this type (round to nearest even); the quantized types are
    /// only uploaded as stored, never encoded here.
    pub fn encode(self, v: &[f32]) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(self.bytes(v.len()) as usize);
        match self {
            WeightType::F32 => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            WeightType::Bf16 => v
                .iter()
                .for_each(|x| out.extend(half::bf16::from_f32(*x).to_le_bytes())),
            WeightType::F16 => v
                .iter()
                .for_each(|x| out.extend(half::f16::from_f32(*x).to_le_bytes())),
            _ => {
                return Err(Error::Unsupported(format!(
                    "encoding f32 values as {} (quantized weights are uploaded as stored)",
                    self.name()
                )));
            }
        }
        out.resize(self.bytes(v.len()) as usize, 0);
        Ok(out)
    }

    /// Name as printed by `strata devices` (ggml's, lower case, for the quantized types).
    pub fn name(self) -> &'static str {
        match self {
            WeightType::F32 => "f32",
            WeightType::Bf16 => "bf16",
            WeightType::F16 => "f16",
            WeightType::Q4_0 => "q4_0",
            WeightType::Q5_0 => "q5_0",
            WeightType::Q8_0 => "q8_0",
            WeightType::Q4_K => "q4_k",
            WeightType::Q5_K => "q5_k",
            WeightType::Q6_K => "q6_k",
            WeightType::IQ4_XS => "iq4_xs",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_of_odd_block_sizes_split_at_whole_words() {
        // Q6_K rows of 768 are 630 bytes: two rows make whole words.
        assert_eq!(WeightType::Q6_K.row_bytes(768), 630);
        assert_eq!(WeightType::Q6_K.row_granule(768), 1260);
        // Q8_0 rows of 32 are 34 bytes.
        assert_eq!(WeightType::Q8_0.row_granule(32), 68);
        assert_eq!(WeightType::Q4_K.bytes(512), 288);
        assert_eq!(WeightType::from_ggml_name("Q4_K"), Some(WeightType::Q4_K));
        assert_eq!(WeightType::from_ggml_name("Q3_K"), None);
        assert_eq!(WeightType::from_ggml_name("F16"), None);
        assert!(WeightType::Q4_0.encode(&[0.0; 32]).is_err());
        assert_eq!(WeightType::Bf16.encode(&[1.0]).unwrap(), [0x80, 0x3f, 0, 0]);
    }
}
