//! ggml's quantized block formats (the tensors of GGUF files), computed where they lie.
//!
//! - [`GgmlType`]: every element type a GGUF may declare, with its block geometry.
//! - [`dequantize_row`] / [`dequantize_row_bf16`]: the scalar reference decoders, bit for bit
//!   what ggml's `dequantize_row_*` compute.
//! - [`GgmlMatrix`]: a `[n, k]` matrix of blocks viewed in place (a mapped file's bytes) with
//!   `y = x · Wᵀ` on int8 kernels (AVX-512 VNNI, AVX2, portable) for the integer types and a generic
//!   dequantizing path for the rest; with many tokens on AVX-512 or AMX, on INT8 or BF16 tiles
//!   decoded in cache and fed to the packed micro-kernels (`tiles`).
//! - [`GgmlExperts`] and [`fused_moe_ggml`]: a MoE layer's experts as three stacked block
//!   tensors, each expert addressed in place.
//!
//! A key design decision made here is that weights are never converted at load: llama.cpp's
//! files are used as they are, so a model takes the memory it takes on disk and its pages
//! stay file-backed. Decoding happens per row block inside the kernels, in cache.

use half::f16;

mod dequant;
mod dot;
mod iq;
mod matrix;
mod moe;
mod scratch;
mod tiles;
mod types;
mod unpack;
mod vecdot;

pub use dequant::{QuantError, dequantize_row, dequantize_row_bf16};
pub use matrix::{GgmlMatrix, GgmlPath};
pub use moe::{
    GgmlExperts, combine_wave, fused_moe_ggml, fused_moe_ggml_along, fused_moe_ggml_ref,
    ggml_piece_rows, moe_waves,
};
pub use types::{GgmlType, QK_K};

/// The instruction set and packed format of the tile path for one matrix call of `ty` with
/// `tokens` tokens on `isa`, when that path is taken (AVX-512 or AMX, and enough tokens to
/// repay decoding a tile); `None` when the block kernels run.
pub fn tile_path(
    isa: crate::Isa,
    ty: GgmlType,
    tokens: usize,
) -> Option<(crate::Isa, crate::PackedFormat)> {
    tiles::tile_for(isa, tokens, ty).map(|(kernel, fmt)| match kernel {
        crate::packed::micro::Kernel::Isa(on) => (on, fmt.packed(ty)),
        #[cfg(test)]
        _ => (isa, fmt.packed(ty)),
    })
}

/// The instruction set the row-dot kernels of the integer types run on when `isa` is
/// selected: AVX-512 VNNI from [`crate::Isa::Avx512`] up, else AVX2 (AVX-VNNI CPUs too, see
/// `vecdot::kernel`) or portable code.
pub fn row_dot_isa(isa: crate::Isa) -> crate::Isa {
    match isa.min(crate::Isa::Avx512) {
        crate::Isa::AvxVnni => crate::Isa::Avx2,
        isa => isa,
    }
}

/// Whether the int8 kernels compute `ty` in place; other readable types are dequantized to
/// f32 per row block (several times slower, named so by `strata info`).
pub fn has_fast_kernel(ty: GgmlType) -> bool {
    unpack::decoder(ty).is_some()
}

#[cfg(test)]
mod tests;

/// `n_blocks` random but valid blocks of `ty` (random bytes; f16 scale fields hold small
/// finite values, f32/BF16 values lie in [-0.5, 0.5)): weights of any shape for kernel tests
/// and benchmarks.
pub fn random_blocks(ty: GgmlType, n_blocks: usize, seed: &mut u64) -> Vec<u8> {
    let bb = ty.block_bytes();
    let mut v: Vec<u8> = (0..n_blocks * bb)
        .map(|_| {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (*seed >> 33) as u8
        })
        .collect();
    let f16_fields: &[usize] = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::IQ4_XS => &[0],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        GgmlType::F16 => &[0],
        GgmlType::IQ2_XXS | GgmlType::IQ2_S | GgmlType::IQ3_S | GgmlType::IQ1_S => &[0],
        _ => &[],
    };
    for b in 0..n_blocks {
        for (i, &off) in f16_fields.iter().enumerate() {
            let val = f16::from_f32(0.01 + 0.003 * ((b + i) % 7) as f32);
            v[b * bb + off..b * bb + off + 2].copy_from_slice(&val.to_le_bytes());
        }
    }
    match ty {
        // Finite values: random f32 / bf16 bits include NaN and huge exponents.
        GgmlType::F32 => {
            for c in v.chunks_exact_mut(4) {
                let x = (c[0] as f32 - 128.0) / 256.0;
                c.copy_from_slice(&x.to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for c in v.chunks_exact_mut(2) {
                let x = half::bf16::from_f32((c[0] as f32 - 128.0) / 256.0);
                c.copy_from_slice(&x.to_le_bytes());
            }
        }
        _ => {}
    }
    v
}

#[cfg(test)]
pub(crate) mod test_util {
    use super::GgmlMatrix;
    pub(crate) use super::random_blocks;

    /// How far a kernel's outputs (`m` tokens of `x` times `w`, token-major) may lie from
    /// the reference's `want`: `1e-4 · (1 + |want|)`, plus a few ulps of `Σ|w·x|`, since
    /// float sums taken in another order differ by the rounding of their largest partial
    /// sums, and an output that cancels to near zero still carries that of terms thousands
    /// of times larger.
    pub(crate) fn dot_tolerances(w: &GgmlMatrix, x: &[f32], m: usize, want: &[f32]) -> Vec<f32> {
        let (n, k) = (w.n(), w.k());
        let wd = w.dequantize();
        (0..m * n)
            .map(|i| {
                let (t, r) = (i / n, i % n);
                let mass: f32 = (0..k).map(|c| (wd[r * k + c] * x[t * k + c]).abs()).sum();
                1e-4 * (1.0 + want[i].abs()) + 4.0 * f32::EPSILON * mass
            })
            .collect()
    }
}
