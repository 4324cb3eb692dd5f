//! Every block type's kernels against their plain twins (`matmul_ref`, `fused_moe_ggml_ref`)
//! and against f32 arithmetic on the dequantized weights, on every instruction-set path.

use half::{bf16, f16};

use super::matrix::Form;
use super::test_util::random_blocks;
use super::tiles::TileFormat;
use super::*;
use crate::moe::{ExpertBatch, MoeOptions, group_by_expert};
use crate::{Isa, KernelError};

pub(super) const INTEGER: [GgmlType; 12] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
];
/// Types computed by dequantizing to f32 (the grid-based i-quants among them).
pub(super) const GENERIC: [GgmlType; 7] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_S,
    GgmlType::IQ1_S,
];

pub(super) fn rand_x(n: usize, seed: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((*seed >> 33) % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

pub(super) fn matrix(ty: GgmlType, n: usize, k: usize, seed: &mut u64) -> GgmlMatrix {
    let blocks = n * k / ty.block_size();
    GgmlMatrix::from_vec(ty, n, k, random_blocks(ty, blocks, seed)).expect("valid matrix")
}

/// `n_exp` experts of `h` hidden and `inter` intermediate values: gate and up of type `tg`,
/// down of `td`, random blocks drawn from `seed` in that order.
pub(super) fn stacked_experts(
    (tg, td): (GgmlType, GgmlType),
    n_exp: usize,
    h: usize,
    inter: usize,
    seed: &mut u64,
) -> GgmlExperts {
    let gate = matrix(tg, n_exp * inter, h, seed);
    let up = matrix(tg, n_exp * inter, h, seed);
    let down = matrix(td, n_exp * h, inter, seed);
    GgmlExperts::from_stacked(&gate, &up, &down, n_exp, h, inter).expect("valid experts")
}

/// `|got - want| <= tol · (Σ_p |x_p w_p| + 1e-6)` per output: error relative to the terms'
/// magnitude, which is what both roundings scale with.
pub(super) fn check(ty: GgmlType, what: &str, got: &[f32], want: &[f32], mag: &[f32], tol: f32) {
    for (i, ((g, w), m)) in got.iter().zip(want).zip(mag).enumerate() {
        assert!(
            (g - w).abs() <= tol * (m + 1e-6),
            "{ty} {what} output {i}: {g} vs {w} (magnitude {m})"
        );
    }
}

/// `Σ_p |x_p| |w_p|` per output.
pub(super) fn magnitudes(x: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut out = vec![0.0; m * n];
    for t in 0..m {
        for j in 0..n {
            out[t * n + j] = (0..k).map(|p| (x[t * k + p] * w[j * k + p]).abs()).sum();
        }
    }
    out
}

fn round_bf16(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect()
}

/// The tile path's twin: `x · Wᵀ` with both rounded to BF16, summed in f32.
pub(super) fn bf16_twin(w: &GgmlMatrix, x: &[f32], m: usize) -> Vec<f32> {
    let (n, k) = (w.n(), w.k());
    let (xr, wr) = (round_bf16(x), round_bf16(&w.dequantize()));
    let mut out = vec![0.0; m * n];
    crate::gemm::matmul_f32_ref(&xr, &wr, &mut out, m, n, k);
    out
}

/// The INT8 tile path's twin: `x` quantized per 32, `W` as the INT8 tile holds it (exact or
/// requantized per 32 from the reference dequantizer's values), summed in f32.
pub(super) fn int8_twin(w: &GgmlMatrix, x: &[f32], m: usize) -> Vec<f32> {
    use super::tiles::int8;
    let (n, k) = (w.n(), w.k());
    let mut wf = w.dequantize();
    if !int8::exact(w.ty()) {
        for row in wf.chunks_exact_mut(k.max(1)) {
            for g in row.chunks_mut(int8::GROUP) {
                let mut v = [0.0f32; int8::GROUP];
                v[..g.len()].copy_from_slice(g);
                let mut q = [0u8; int8::GROUP];
                let scale = int8::requantize(&v, &mut q);
                for (w, q) in g.iter_mut().zip(q) {
                    *w = (i32::from(q) - 128) as f32 * scale;
                }
            }
        }
    }
    let k_pad = k.div_ceil(64).max(1) * 64;
    let a = crate::packed::Activations::int8_grouped(
        k_pad,
        m,
        crate::packed::micro::Kernel::Isa(Isa::Portable),
        int8::group(w.ty()),
        crate::ggml::vecdot::activation_block(w.ty()),
        |r| &x[r * k..(r + 1) * k],
    );
    let xq: Vec<f32> = (0..m)
        .flat_map(|t| (0..k).map(move |p| (t, p)))
        .map(|(t, p)| a.value(t, p))
        .collect();
    let mut out = vec![0.0; m * n];
    crate::gemm::matmul_f32_ref(&xq, &wf, &mut out, m, n, k);
    out
}

/// The twin of the tile path in `fmt`.
pub(super) fn tile_twin(w: &GgmlMatrix, x: &[f32], m: usize, fmt: TileFormat) -> Vec<f32> {
    match fmt {
        TileFormat::Bf16 => bf16_twin(w, x, m),
        TileFormat::Int8 => int8_twin(w, x, m),
    }
}

/// One expert's SwiGLU on one token, computed as the path `tiles` selects computes it: the
/// tile path's rounding (BF16 or INT8), or the block kernels' (`matmul_ref`).
pub(super) fn expert_twin(
    e: (&GgmlMatrix, &GgmlMatrix, &GgmlMatrix),
    x: &[f32],
    tiles: impl Fn(&GgmlMatrix) -> Option<TileFormat>,
) -> Vec<f32> {
    let (g, u, d) = e;
    let mm = |w: &GgmlMatrix, x: &[f32]| {
        if let Some(fmt) = tiles(w) {
            tile_twin(w, x, 1, fmt)
        } else {
            let mut y = vec![0.0; w.n()];
            w.matmul_ref(x, 1, &mut y).expect("shapes agree");
            y
        }
    };
    let mid: Vec<f32> = mm(g, x)
        .iter()
        .zip(mm(u, x))
        .map(|(&g, u)| g / (1.0 + (-g).exp()) * u)
        .collect();
    mm(d, &mid)
}

/// The MoE layer, matrix `w` of expert `e` computed as `tiles(e, w)` says.
pub(super) fn moe_twin(
    experts: &GgmlExperts,
    x: &[f32],
    batches: &[ExpertBatch],
    tiles: impl Fn(usize, &GgmlMatrix) -> Option<TileFormat>,
) -> Vec<f32> {
    let h = experts.hidden();
    let mut out = vec![0.0; x.len()];
    for b in batches {
        for (&t, &w) in b.tokens.iter().zip(&b.weights) {
            let t = t as usize;
            let y = expert_twin(experts.expert(b.expert), &x[t * h..(t + 1) * h], |w| {
                tiles(b.expert, w)
            });
            for (o, v) in out[t * h..(t + 1) * h].iter_mut().zip(y) {
                *o += w * v;
            }
        }
    }
    out
}

#[test]
fn matmul_matches_its_twin_and_f32_on_every_type_and_path() {
    let mut seed = 42;
    for ty in INTEGER.into_iter().chain(GENERIC) {
        let bs = ty.block_size().max(32);
        for &(m, n, k) in &[
            (1, 1, bs),
            (3, 17, 2 * bs),
            (0, 5, bs),
            (70, 33, 256),
            (5, 40, 512),
            // More rows than one task takes on either path.
            (2, 300, 256),
        ] {
            if k % ty.block_size() != 0 {
                continue;
            }
            let w = matrix(ty, n, k, &mut seed);
            let x = rand_x(m * k, &mut seed);
            let wf = w.dequantize();
            let mag = magnitudes(&x, &wf, m, n, k);
            let mut want = vec![0.0; m * n];
            w.matmul_ref(&x, m, &mut want).expect("shapes agree");
            let mut exact = vec![0.0; m * n];
            crate::gemm::matmul_f32_ref(&x, &wf, &mut exact, m, n, k);
            // Int8 activations round each value by at most half a step of amax / 127.
            let act_tol = if w.has_fast_kernel() {
                0.5 / 127.0 * 2.0
            } else {
                1e-5
            };
            check(ty, "twin vs f32", &want, &exact, &mag, act_tol);
            for isa in Isa::available() {
                let mut got = vec![f32::NAN; m * n];
                w.matmul_with(isa, &x, m, &mut got).expect("shapes agree");
                let want = match w.form(isa, m) {
                    Form::Tiles(_, fmt) => tile_twin(&w, &x, m, fmt),
                    _ => want.clone(),
                };
                check(ty, &format!("{isa:?} {m}x{n}x{k}"), &got, &want, &mag, 1e-5);
            }
        }
    }
}

/// A token's outputs do not depend on the tokens computed beside it, on the integer and
/// generic paths (below the tile threshold): the same bits alone as in any batch, so a
/// request's answer does not change with the load (the prefix cache's load test relies on
/// it). The BF16 tiles that take over for many tokens on AVX-512 and AMX round differently
/// and are not covered.
#[test]
fn a_tokens_outputs_do_not_depend_on_its_batch() {
    let mut seed = 9;
    for ty in INTEGER.into_iter().chain(GENERIC) {
        let k = ty.block_size().max(32) * 8;
        let n = 37;
        let w = matrix(ty, n, k, &mut seed);
        // Up to 7 tokens, fewer than any tile path of this type takes (Q3_K's INT8 tiles start
        // at 4, Q4_K's at 8).
        let untiled = |m: usize| {
            Isa::available()
                .into_iter()
                .all(|isa| !matches!(w.form(isa, m), Form::Tiles(..)))
        };
        let m = (1..=7)
            .take_while(|&m| untiled(m))
            .last()
            .expect("one token never tiles");
        let x = rand_x(m * k, &mut seed);
        for isa in Isa::available() {
            let mut batch = vec![f32::NAN; m * n];
            w.matmul_with(isa, &x, m, &mut batch).expect("shapes agree");
            // Every token alone, and every run of tokens starting at each offset.
            for (start, len) in (0..m)
                .map(|t| (t, 1))
                .chain([(1, 2), (2, 3), (3, 4), (4, 3)])
                .filter(|&(start, len)| start + len <= m)
            {
                let xs = &x[start * k..(start + len) * k];
                let mut part = vec![f32::NAN; len * n];
                w.matmul_with(isa, xs, len, &mut part)
                    .expect("shapes agree");
                let want = &batch[start * n..(start + len) * n];
                assert!(
                    part.iter()
                        .zip(want)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{ty} {isa:?}: tokens {start}..{} alone differ from the batch of {m}",
                    start + len
                );
            }
        }
    }
}

#[test]
fn zero_and_extreme_scales() {
    for ty in INTEGER {
        let k = ty.block_size().max(256);
        let mut seed = 5;
        let mut bytes = random_blocks(ty, 2 * k / ty.block_size(), &mut seed);
        // Row 0 all zero bytes (zero scales), row 1 scales at f16's largest finite value.
        let half = bytes.len() / 2;
        bytes[..half].fill(0);
        let big = f16::from_f32(60000.0).to_le_bytes();
        for b in bytes[half..].chunks_exact_mut(ty.block_bytes()) {
            let off = match ty {
                GgmlType::Q2_K => 80,
                GgmlType::Q3_K => 108,
                GgmlType::Q6_K => 208,
                _ => 0,
            };
            b[off..off + 2].copy_from_slice(&big);
        }
        let w = GgmlMatrix::from_vec(ty, 2, k, bytes).expect("valid matrix");
        let x = rand_x(3 * k, &mut seed);
        let mut want = vec![0.0; 6];
        w.matmul_ref(&x, 3, &mut want).expect("shapes agree");
        let mag = magnitudes(&x, &w.dequantize(), 3, 2, k);
        for isa in Isa::available() {
            let mut got = vec![f32::NAN; 6];
            w.matmul_with(isa, &x, 3, &mut got).expect("shapes agree");
            assert!(got.iter().step_by(2).all(|&v| v == 0.0), "{ty} zero row");
            check(ty, "extreme", &got, &want, &mag, 1e-5);
        }
    }
}

#[test]
fn fused_moe_matches_its_twin() {
    let (h, inter, n_exp, k) = (256, 256, 6, 2);
    let mut seed = 9;
    for (tg, td) in [
        (GgmlType::Q4_K, GgmlType::Q6_K),
        (GgmlType::Q8_0, GgmlType::Q4_0),
        (GgmlType::F16, GgmlType::IQ4_XS),
    ] {
        let experts = stacked_experts((tg, td), n_exp, h, inter, &mut seed);
        for t in [1usize, 3, 37] {
            let x = rand_x(t * h, &mut seed);
            // Expert 5 gets no token; expert 0 all of them.
            let ids: Vec<u32> = (0..t).flat_map(|i| [0, 1 + (i % 4) as u32]).collect();
            let weights: Vec<f32> = (0..t * k).map(|i| 0.25 + 0.1 * (i % 3) as f32).collect();
            let batches = group_by_expert(n_exp, &ids, &weights, k).expect("valid routing");
            let mut want = vec![0.0; t * h];
            fused_moe_ggml_ref(&experts, &x, &batches, &mut want).expect("shapes agree");
            let scale = want.iter().fold(0.0f32, |a, v| a.max(v.abs())).max(1e-3);
            assert_eq!(want, moe_twin(&experts, &x, &batches, |_, _| None));
            // The twin of the path `isa` takes, and its tolerance: on AVX-512, an expert with
            // many tokens takes the tile path (expert 0 at t = 37), the others the block
            // kernels; a tiled expert's intermediate is rounded to BF16, where an
            // accumulation-order difference can flip a value near a rounding boundary.
            let twin_on = |isa: Isa| {
                let tokens = |e: usize| {
                    batches
                        .iter()
                        .find(|b| b.expert == e)
                        .map_or(0, |b| b.tokens.len())
                };
                let tiled = |e, w: &GgmlMatrix| match w.form(isa, tokens(e)) {
                    Form::Tiles(_, fmt) => Some(fmt),
                    _ => None,
                };
                let (g, ..) = experts.expert(0);
                let tol = if (0..n_exp).any(|e| tiled(e, g).is_some()) {
                    2e-3
                } else {
                    1e-4
                };
                (moe_twin(&experts, &x, &batches, tiled), tol)
            };
            for isa in Isa::available() {
                let opts = MoeOptions {
                    isa: Some(isa),
                    ..MoeOptions::default()
                };
                let mut got = vec![f32::NAN; t * h];
                fused_moe_ggml(&experts, &x, &batches, &mut got, &opts).expect("runs");
                // `STRATA_KERNEL` caps the path the call takes, whatever `opts.isa` asks.
                let (want, tol) = twin_on(isa.min(Isa::selected()));
                for (g, w) in got.iter().zip(&want) {
                    assert!(
                        (g - w).abs() <= tol * scale,
                        "{tg}/{td} {isa:?} t {t}: {g} vs {w}"
                    );
                }
            }
            // Masked experts are skipped and accumulate adds.
            let mask: Vec<bool> = (0..n_exp).map(|e| e != 0).collect();
            let opts = MoeOptions {
                expert_mask: Some(&mask),
                accumulate: true,
                ..MoeOptions::default()
            };
            let only0: Vec<ExpertBatch> =
                batches.iter().filter(|b| b.expert == 0).cloned().collect();
            let mut got = vec![0.0; t * h];
            fused_moe_ggml(&experts, &x, &only0, &mut got, &MoeOptions::default()).expect("runs");
            fused_moe_ggml(&experts, &x, &batches, &mut got, &opts).expect("runs");
            let (want, tol) = twin_on(Isa::selected());
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (g - w).abs() <= tol * scale,
                    "mask + accumulate: {g} vs {w}"
                );
            }
        }
    }
}

#[test]
fn a_layer_computed_in_pieces_equals_the_fused_call_bit_for_bit() {
    // 300 tokens x top-8 = 2400 rows: two waves, one expert split across them; experts 0
    // and 1 take enough tokens for the tile path where the CPU has it.
    let (h, inter, n_exp, k, t) = (256, 256, 12, 8, 300);
    let mut seed = 31;
    let types = (GgmlType::Q4_K, GgmlType::Q6_K);
    let experts = stacked_experts(types, n_exp, h, inter, &mut seed);
    let x = rand_x(t * h, &mut seed);
    let ids: Vec<u32> = (0..t)
        .flat_map(|i| (0..k).map(move |j| ((i * 7 + j * (1 + i % 3)) % n_exp) as u32))
        .collect();
    // Distinct experts per token (what a router gives).
    let ids: Vec<u32> = ids
        .chunks(k)
        .flat_map(|c| {
            let mut v: Vec<u32> = Vec::new();
            for &e in c {
                let mut e = e;
                while v.contains(&e) {
                    e = (e + 1) % n_exp as u32;
                }
                v.push(e);
            }
            v
        })
        .collect();
    let weights: Vec<f32> = (0..t * k).map(|i| 0.05 + 0.01 * (i % 7) as f32).collect();
    let batches = group_by_expert(n_exp, &ids, &weights, k).expect("valid routing");
    let mut want = vec![0.0; t * h];
    fused_moe_ggml(&experts, &x, &batches, &mut want, &MoeOptions::default()).expect("runs");

    let waves = moe_waves(&batches);
    assert_eq!(waves.len(), 2, "the routing spans two waves");
    let mut got = vec![0.0; t * h];
    for wave in &waves {
        // Pieces computed out of order, some alone, some together, as experts arrive.
        let order: Vec<usize> = (0..wave.len()).rev().collect();
        let mut ys: Vec<Vec<f32>> = vec![Vec::new(); wave.len()];
        for group in order.chunks(3) {
            let pieces: Vec<&ExpertBatch> = group.iter().map(|&p| &wave[p]).collect();
            let rows: usize = pieces.iter().map(|p| p.tokens.len()).sum();
            let mut y = vec![f32::NAN; rows * h];
            ggml_piece_rows(&experts, &x, &pieces, &mut y).expect("runs");
            let mut at = 0;
            for &p in group {
                let n = wave[p].tokens.len() * h;
                ys[p] = y[at..at + n].to_vec();
                at += n;
            }
        }
        let ys: Vec<&[f32]> = ys.iter().map(Vec::as_slice).collect();
        combine_wave(wave, &ys, h, &mut got).expect("shapes agree");
    }
    assert!(
        got.iter()
            .zip(&want)
            .all(|(g, w)| g.to_bits() == w.to_bits()),
        "pieces differ from the fused call"
    );
    // A piece routed past the hidden states, and outputs of the wrong size, are errors.
    let bad = ExpertBatch {
        expert: 0,
        tokens: vec![t as u32],
        weights: vec![1.0],
    };
    let mut y = vec![0.0; h];
    assert!(ggml_piece_rows(&experts, &x, &[&bad], &mut y).is_err());
    assert!(combine_wave(&waves[0], &[], h, &mut got).is_err());
}

#[test]
fn bad_matrices_are_errors_naming_the_problem() {
    let err = |r: Result<GgmlMatrix, KernelError>| r.expect_err("refused").to_string();
    let bytes = vec![0u8; 2 * 144];
    assert!(
        err(GgmlMatrix::from_vec(
            GgmlType::Q4_K,
            2,
            256,
            bytes[..287].to_vec()
        ))
        .contains("needs 288 bytes, got 287")
    );
    assert!(
        err(GgmlMatrix::from_vec(GgmlType::Q4_K, 1, 100, bytes.clone()))
            .contains("not whole Q4_K blocks")
    );
    assert!(
        err(GgmlMatrix::from_vec(GgmlType::NVFP4, 1, 64, vec![0; 36]))
            .contains("NVFP4 has no kernel")
    );
    let w = GgmlMatrix::from_vec(GgmlType::Q4_K, 2, 256, bytes).expect("valid");
    assert!(w.rows(1..3).is_err());
    let mut out = vec![0.0; 2];
    assert!(w.matmul(&[0.0; 255], 1, &mut out).is_err());
    assert!(w.dequantize_row(2, &mut [0.0; 256]).is_err());
}
