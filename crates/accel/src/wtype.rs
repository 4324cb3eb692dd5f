//! How weights are stored on the device: f32, two 16-bit floats per 32-bit word,
//! llama.cpp's quantized blocks exactly as a GGUF file stores them, or a converted model's
//! packed INT8/INT4 laid out by rows in the bytes the file takes.
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
    /// A converted model's packed INT8 (one scale per row), by rows: each row its f32
    /// scale, then its values as signed bytes ([`WeightType::encode_int_rows`]).
    Int8,
    /// A converted model's packed INT4 (a scale per 32), by rows of blocks of 32: an f32
    /// scale, then 16 bytes, value `i` in the low nibble of byte `i` and value `i + 16` in
    /// the high one, each stored plus 8.
    Int4,
}

impl WeightType {
    /// Every type, floats first.
    pub const ALL: [WeightType; 12] = [
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
        WeightType::Int8,
        WeightType::Int4,
    ];

    /// `(elements, bytes)` of one block: the one table of the device formats' geometry
    /// (ggml's for its quantized types; the packed integers' groups of 32, whose row may
    /// begin with [`WeightType::row_head`]).
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
            WeightType::Int8 => (32, 32),
            WeightType::Int4 => (32, 20),
        }
    }

    /// Bytes at the start of every row before its blocks (the packed INT8 row's scale).
    pub fn row_head(self) -> usize {
        match self {
            WeightType::Int8 => 4,
            _ => 0,
        }
    }

    /// Whether the type stores blocks the kernels decode (ggml's or the packed integers).
    pub fn is_quantized(self) -> bool {
        self.block().0 > 1
    }

    /// Whether the type is one of ggml's block types.
    pub fn is_ggml(self) -> bool {
        self.is_quantized() && !matches!(self, WeightType::Int8 | WeightType::Int4)
    }

    /// The device type holding a GGUF tensor's blocks as they are, by ggml's type name
    /// (`Q4_K`); `None` for types the kernels do not decode (dequantize those to
    /// [`WeightType::F16`]).
    pub fn from_ggml_name(name: &str) -> Option<WeightType> {
        WeightType::ALL
            .into_iter()
            .find(|t| t.is_ggml() && t.name().eq_ignore_ascii_case(name))
    }

    /// Exact bytes of one row of `k` elements (`k` a whole number of blocks).
    pub fn row_bytes(self, k: usize) -> u64 {
        let (elems, bytes) = self.block();
        (self.row_head() + k.div_ceil(elems) * bytes) as u64
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

    /// Rows of `k` integers `q` (row-major, without any storage offset: INT8 in
    /// `-128..=127`, INT4 in `-8..=7`) with their `scales` (one per row for
    /// [`WeightType::Int8`], one per 32 for [`WeightType::Int4`]) in this type's layout, in
    /// whole words: the one description of the packed integers' device layout, which the
    /// shaders (`quant/int8.wgsl`, `quant/int4.wgsl`) read.
    pub fn encode_int_rows(self, q: &[i8], scales: &[f32], k: usize) -> Result<Vec<u8>> {
        let n = q.len() / k.max(1);
        let per_row = match self {
            WeightType::Int8 => 1,
            WeightType::Int4 => k / 32,
            _ => 0,
        };
        if per_row == 0 || !self.fits_row(k) || q.len() != n * k || scales.len() != n * per_row {
            return Err(Error::Unsupported(format!(
                "{} integers with {} scales in rows of {k} as {}",
                q.len(),
                scales.len(),
                self.name()
            )));
        }
        let mut out = Vec::with_capacity(self.bytes(q.len()) as usize);
        for (row, sc) in q.chunks_exact(k).zip(scales.chunks_exact(per_row)) {
            if self == WeightType::Int8 {
                out.extend(sc[0].to_le_bytes());
                out.extend(row.iter().map(|&v| v as u8));
                continue;
            }
            for (block, d) in row.chunks_exact(32).zip(sc) {
                out.extend(d.to_le_bytes());
                let nibble = |v: i8| (v.clamp(-8, 7) + 8) as u8;
                out.extend((0..16).map(|i| nibble(block[i]) | nibble(block[i + 16]) << 4));
            }
        }
        out.resize(out.len().next_multiple_of(4), 0);
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
            WeightType::Int8 => "int8",
            WeightType::Int4 => "int4",
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
        // GGUF's integer tensor types are not the packed integers.
        assert_eq!(WeightType::from_ggml_name("I8"), None);
    }

    #[test]
    fn packed_integers_are_laid_out_by_rows() {
        let q: Vec<i8> = (0..64).map(|i| (i % 16) as i8 - 8).collect();
        let int8 = WeightType::Int8
            .encode_int_rows(&q, &[0.5, 2.0], 32)
            .unwrap();
        assert_eq!(int8.len() as u64, 2 * WeightType::Int8.row_bytes(32));
        assert_eq!(&int8[..4], &0.5f32.to_le_bytes());
        assert_eq!(int8[4], (-8i8) as u8);
        assert_eq!(&int8[36..40], &2.0f32.to_le_bytes());
        let int4 = WeightType::Int4
            .encode_int_rows(&q, &[0.5, 2.0], 32)
            .unwrap();
        assert_eq!(int4.len() as u64, 2 * WeightType::Int4.row_bytes(32));
        // Values 0 and 16 of the first block: -8 and -8, stored as 0 and 0; value 1 is -7.
        assert_eq!((int4[4], int4[5]), (0x00, 0x11));
        assert!(WeightType::Int4.encode_int_rows(&q, &[1.0], 32).is_err());
        assert!(
            WeightType::Q8_0
                .encode_int_rows(&q, &[1.0, 1.0], 32)
                .is_err()
        );
    }
}
