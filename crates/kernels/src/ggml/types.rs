//! ggml tensor types: their on-disk ids, names and block geometry.
//!
//! [`GgmlType`] lists every type a current GGUF file may declare, so that a file holding, say,
//! IQ2_XXS tensors still opens (and `strata info` can describe it) even though only a subset of
//! types can be dequantized (see [`GgmlType::can_dequantize`]). A key design decision here is to
//! keep block geometry in one table (`geometry`) that both the reader (tensor byte sizes) and
//! the dequantizers (slice lengths) use, so the two can never disagree.

/// Number of weights in a k-quant super-block.
pub const QK_K: usize = 256;

/// The element type of a GGUF tensor (ggml's `enum ggml_type`).
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// 4-bit, blocks of 32 with an f16 scale.
    Q4_0,
    /// 4-bit, blocks of 32 with f16 scale and min.
    Q4_1,
    /// 5-bit, blocks of 32 with an f16 scale.
    Q5_0,
    /// 5-bit, blocks of 32 with f16 scale and min.
    Q5_1,
    /// 8-bit, blocks of 32 with an f16 scale.
    Q8_0,
    /// 8-bit, blocks of 32 with f16 scale and sum (activation format).
    Q8_1,
    /// 2-bit k-quant, super-blocks of 256.
    Q2_K,
    /// 3-bit k-quant, super-blocks of 256.
    Q3_K,
    /// 4-bit k-quant, super-blocks of 256.
    Q4_K,
    /// 5-bit k-quant, super-blocks of 256.
    Q5_K,
    /// 6-bit k-quant, super-blocks of 256.
    Q6_K,
    /// 8-bit k-quant with f32 scale (activation format).
    Q8_K,
    /// i-quant, 2.06 bits per weight.
    IQ2_XXS,
    /// i-quant, 2.31 bits per weight.
    IQ2_XS,
    /// i-quant, 3.06 bits per weight.
    IQ3_XXS,
    /// i-quant, 1.56 bits per weight.
    IQ1_S,
    /// Non-linear 4-bit, blocks of 32 with an f16 scale.
    IQ4_NL,
    /// i-quant, 3.44 bits per weight.
    IQ3_S,
    /// i-quant, 2.5 bits per weight.
    IQ2_S,
    /// Non-linear 4-bit, super-blocks of 256 with 6-bit sub-block scales.
    IQ4_XS,
    /// Signed 8-bit integer.
    I8,
    /// Signed 16-bit integer.
    I16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// IEEE binary64.
    F64,
    /// i-quant, 1.75 bits per weight.
    IQ1_M,
    /// bfloat16.
    BF16,
    /// Ternary, 1.69 bits per weight.
    TQ1_0,
    /// Ternary, 2.06 bits per weight.
    TQ2_0,
    /// OCP microscaling FP4, blocks of 32 with an E8M0 scale.
    MXFP4,
    /// NVIDIA FP4, blocks of 64 with four E4M3 scales.
    NVFP4,
    /// 1-bit, blocks of 128 with an f16 scale.
    Q1_0,
    /// 2-bit, blocks of 64 with an f16 scale.
    Q2_0,
}

impl GgmlType {
    /// Every type, in id order (for tests and listings).
    pub const ALL: [GgmlType; 35] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ3_XXS,
        GgmlType::IQ1_S,
        GgmlType::IQ4_NL,
        GgmlType::IQ3_S,
        GgmlType::IQ2_S,
        GgmlType::IQ4_XS,
        GgmlType::I8,
        GgmlType::I16,
        GgmlType::I32,
        GgmlType::I64,
        GgmlType::F64,
        GgmlType::IQ1_M,
        GgmlType::BF16,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
        GgmlType::MXFP4,
        GgmlType::NVFP4,
        GgmlType::Q1_0,
        GgmlType::Q2_0,
    ];

    /// The type with on-disk id `id`, if it is one this reader knows.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().find(|t| t.id() == id)
    }

    /// The on-disk id (ggml's enum value).
    pub fn id(self) -> u32 {
        self.geometry().0
    }

    /// ggml's name for the type (`"Q4_K"`, `"BF16"`...).
    pub fn name(self) -> &'static str {
        self.geometry().1
    }

    /// Number of weights in one block (1 for plain element types).
    pub fn block_size(self) -> usize {
        self.geometry().2
    }

    /// Bytes in one block.
    pub fn block_bytes(self) -> usize {
        self.geometry().3
    }

    /// Whether [`crate::ggml::dequantize_row`] supports this type.
    pub fn can_dequantize(self) -> bool {
        use GgmlType::*;
        matches!(
            self,
            F32 | F16
                | BF16
                | Q4_0
                | Q4_1
                | Q5_0
                | Q5_1
                | Q8_0
                | Q2_K
                | Q3_K
                | Q4_K
                | Q5_K
                | Q6_K
                | Q8_K
                | IQ4_NL
                | IQ4_XS
                | IQ2_XXS
                | IQ2_XS
                | IQ2_S
                | IQ3_XXS
                | IQ3_S
                | IQ1_S
                | IQ1_M
                | TQ1_0
                | TQ2_0
                | MXFP4
        )
    }

    /// Bytes needed for `n` weights, or `None` when `n` is not a whole number of blocks or the
    /// size overflows.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n.is_multiple_of(bs) {
            return None;
        }
        (n / bs).checked_mul(self.block_bytes() as u64)
    }

    /// (id, name, weights per block, bytes per block): the one table of block geometry,
    /// from ggml-common.h.
    fn geometry(self) -> (u32, &'static str, usize, usize) {
        use GgmlType::*;
        match self {
            F32 => (0, "F32", 1, 4),
            F16 => (1, "F16", 1, 2),
            Q4_0 => (2, "Q4_0", 32, 2 + 16),
            Q4_1 => (3, "Q4_1", 32, 2 + 2 + 16),
            Q5_0 => (6, "Q5_0", 32, 2 + 4 + 16),
            Q5_1 => (7, "Q5_1", 32, 2 + 2 + 4 + 16),
            Q8_0 => (8, "Q8_0", 32, 2 + 32),
            Q8_1 => (9, "Q8_1", 32, 4 + 32),
            Q2_K => (10, "Q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4),
            Q3_K => (11, "Q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12),
            Q4_K => (12, "Q4_K", QK_K, 2 + 2 + 12 + QK_K / 2),
            Q5_K => (13, "Q5_K", QK_K, 2 + 2 + 12 + QK_K / 8 + QK_K / 2),
            Q6_K => (14, "Q6_K", QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16),
            Q8_K => (15, "Q8_K", QK_K, 4 + QK_K + QK_K / 8),
            IQ2_XXS => (16, "IQ2_XXS", QK_K, 2 + QK_K / 4),
            IQ2_XS => (17, "IQ2_XS", QK_K, 2 + QK_K / 4 + QK_K / 32),
            IQ3_XXS => (18, "IQ3_XXS", QK_K, 2 + QK_K / 4 + QK_K / 8),
            IQ1_S => (19, "IQ1_S", QK_K, 2 + QK_K / 8 + QK_K / 16),
            IQ4_NL => (20, "IQ4_NL", 32, 2 + 16),
            IQ3_S => (21, "IQ3_S", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4),
            IQ2_S => (22, "IQ2_S", QK_K, 2 + QK_K / 4 + QK_K / 16),
            IQ4_XS => (23, "IQ4_XS", QK_K, 2 + 2 + QK_K / 64 + QK_K / 2),
            I8 => (24, "I8", 1, 1),
            I16 => (25, "I16", 1, 2),
            I32 => (26, "I32", 1, 4),
            I64 => (27, "I64", 1, 8),
            F64 => (28, "F64", 1, 8),
            IQ1_M => (29, "IQ1_M", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32),
            BF16 => (30, "BF16", 1, 2),
            TQ1_0 => (34, "TQ1_0", QK_K, 2 + 4 * 13),
            TQ2_0 => (35, "TQ2_0", QK_K, 2 + 64),
            MXFP4 => (39, "MXFP4", 32, 1 + 16),
            NVFP4 => (40, "NVFP4", 64, 4 + 32),
            Q1_0 => (41, "Q1_0", 128, 2 + 16),
            Q2_0 => (42, "Q2_0", 64, 2 + 16),
        }
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
