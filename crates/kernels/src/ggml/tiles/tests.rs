//! The tile path (weights decoded to BF16 tiles, packed micro-kernels) against its plain twin:
//! BF16-rounded activations times BF16-rounded dequantized weights, summed in f32. Run on the
//! AMX tile program (software tile unit), the portable micro-kernel and every AVX-512 path the
//! CPU has, for every readable type.

use super::super::tests::{
    GENERIC, INTEGER, bf16_twin, check, magnitudes, matrix, moe_twin, rand_x,
};
use super::*;
use crate::ggml::matrix::Form;
use crate::ggml::moe::fused_moe_ggml_as;
use crate::ggml::{GgmlExperts, GgmlType};
use crate::moe::group_by_expert;

/// The kernels the tile path can run on here.
fn kernels() -> Vec<Kernel> {
    let mut v = vec![Kernel::AmxSoft, Kernel::Isa(Isa::Portable)];
    v.extend(
        Isa::available()
            .into_iter()
            .filter(|&i| i >= Isa::Avx512)
            .map(Kernel::Isa),
    );
    v
}

#[test]
fn tile_matmul_matches_its_bf16_twin_on_every_type_and_kernel() {
    let mut seed = 7;
    for ty in INTEGER.into_iter().chain(GENERIC) {
        let bs = ty.block_size();
        for &(m, n, k) in &[
            // Fewer tokens than one AMX block, a partial strip.
            (1, 17, 256),
            // Ragged tokens and rows, more rows than one tile.
            (45, 70, 512),
            // More tokens than one task: the tile is decoded twice.
            (TILE_TOKENS + 13, 33, 256),
            // `k` not a multiple of 32 (block-size-1 types only): padded columns.
            (40, 20, 100),
        ] {
            if k % bs != 0 {
                continue;
            }
            let w = matrix(ty, n, k, &mut seed);
            let x = rand_x(m * k, &mut seed);
            let want = bf16_twin(&w, &x, m);
            let mag = magnitudes(&x, &w.dequantize(), m, n, k);
            for kernel in kernels() {
                let mut got = vec![f32::NAN; m * n];
                w.matmul_as(Isa::Portable, Form::Bf16(kernel), &x, m, &mut got);
                check(
                    ty,
                    &format!("{kernel:?} {m}x{n}x{k}"),
                    &got,
                    &want,
                    &mag,
                    1e-5,
                );
            }
        }
    }
}

#[test]
fn tiles_are_taken_for_many_tokens_on_avx512_and_amx_only() {
    let w = matrix(GgmlType::Q4_K, 64, 256, &mut 1);
    for (isa, min) in [
        (Isa::Avx512, TILE_MIN_TOKENS_AVX512),
        (Isa::Amx, TILE_MIN_TOKENS_AMX),
    ] {
        assert_eq!(w.form(isa, min), Form::Bf16(Kernel::Isa(isa)));
        assert_eq!(w.form(isa, min - 1), Form::Q8(256));
    }
    for isa in [Isa::Portable, Isa::Avx2] {
        assert_eq!(w.form(isa, 4096), Form::Q8(256));
    }
    let f16 = matrix(GgmlType::F16, 64, 256, &mut 1);
    assert_eq!(f16.form(Isa::Avx2, 64), Form::F32);
    assert_eq!(f16.form(Isa::Amx, 64), Form::Bf16(Kernel::Isa(Isa::Amx)));
}

#[test]
fn fused_moe_on_tiles_matches_its_bf16_twin() {
    let (h, inter, n_exp, k) = (256, 256, 5, 2);
    let mut seed = 11;
    for (tg, td) in [
        (GgmlType::Q4_K, GgmlType::Q6_K),
        (GgmlType::IQ2_XXS, GgmlType::Q8_0),
    ] {
        let gate = matrix(tg, n_exp * inter, h, &mut seed);
        let up = matrix(tg, n_exp * inter, h, &mut seed);
        let down = matrix(td, n_exp * h, inter, &mut seed);
        let experts =
            GgmlExperts::from_stacked(&gate, &up, &down, n_exp, h, inter).expect("valid experts");
        // Expert 4 gets no token, expert 0 all 40 of them, the others ragged shares.
        let t = 40;
        let x = rand_x(t * h, &mut seed);
        let ids: Vec<u32> = (0..t).flat_map(|i| [0, 1 + (i % 3) as u32]).collect();
        let weights: Vec<f32> = (0..t * k).map(|i| 0.3 + 0.1 * (i % 4) as f32).collect();
        let batches = group_by_expert(n_exp, &ids, &weights, k).expect("valid routing");
        let want = moe_twin(&experts, &x, &batches, |_| true);
        let scale = want.iter().fold(0.0f32, |a, v| a.max(v.abs())).max(1e-3);
        for kernel in kernels() {
            let mut got = vec![f32::NAN; t * h];
            fused_moe_ggml_as(&experts, &x, &batches, &mut got, Form::Bf16(kernel)).expect("runs");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                // The intermediate is rounded to BF16 between gate/up and down, so a value
                // near a rounding boundary may round the other way than in the twin.
                assert!(
                    (g - w).abs() <= 2e-3 * scale,
                    "{tg}/{td} {kernel:?} output {i}: {g} vs {w}"
                );
            }
        }
    }
}
