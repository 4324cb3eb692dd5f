use super::*;
use crate::packed::tests::{FORMATS, kernels, rand_vec};

fn make_experts(n: usize, h: usize, inter: usize, fmt: PackedFormat, seed: &mut u64) -> MoeExperts {
    let experts = (0..n)
        .map(|_| {
            let g = rand_vec(inter * h, seed);
            let u = rand_vec(inter * h, seed);
            let d = rand_vec(h * inter, seed);
            Expert::pack(&g, &u, &d, h, inter, fmt).expect("packs")
        })
        .collect();
    MoeExperts::new(h, inter, experts).expect("same shape")
}

/// Compares with a tolerance for activation re-rounding between the two f32 orders.
fn assert_moe_close(want: &[f32], got: &[f32], what: &str) {
    let scale = want.iter().fold(1e-3f32, |a, v| a.max(v.abs()));
    for (i, (a, b)) in want.iter().zip(got).enumerate() {
        assert!(
            (a - b).abs() <= 2e-3 * scale,
            "{what}: element {i}: want {a}, got {b} (scale {scale})"
        );
    }
}

#[test]
fn fused_moe_matches_naive_moe() {
    let mut seed = 21;
    let (n_exp, h, inter, k) = (5, 72, 40, 2);
    for fmt in [FORMATS[0], FORMATS[1], FORMATS[4]] {
        let ex = make_experts(n_exp, h, inter, fmt, &mut seed);
        // (tokens, routing): random, all on one expert, expert 4 never used, T = 1, T = 0.
        for (t, pattern) in [(9usize, 0u8), (33, 1), (40, 2), (1, 0), (0, 0)] {
            let x = rand_vec(t * h, &mut seed);
            let mut ids = Vec::new();
            for tok in 0..t {
                for j in 0..k {
                    ids.push(match pattern {
                        0 => ((tok * 7 + j * 3) % n_exp) as u32,
                        1 => [2, 0][j],
                        _ => ((tok + j) % 4) as u32,
                    });
                }
            }
            let wts: Vec<f32> = (0..t * k).map(|i| 0.25 + (i % 3) as f32 * 0.3).collect();
            let mut want = vec![0.0; t * h];
            fused_moe_ref(&ex, &x, &ids, &wts, &mut want).expect("valid");
            for isa in Isa::available() {
                for amx_min_tokens in [1, 1000] {
                    let mut got = vec![f32::NAN; t * h];
                    let opts = MoeOptions {
                        isa: Some(isa),
                        amx_min_tokens,
                        ..MoeOptions::default()
                    };
                    fused_moe_with(&ex, &x, &ids, &wts, &mut got, &opts).expect("valid");
                    assert_moe_close(
                        &want,
                        &got,
                        &format!("{} {isa:?} T={t} pattern {pattern}", fmt.name()),
                    );
                }
            }
        }
    }
}

#[test]
fn small_waves_give_the_same_result() {
    let mut seed = 31;
    let (h, inter, t, k) = (40, 24, 23, 3);
    let ex = make_experts(4, h, inter, PackedFormat::Bf16, &mut seed);
    let x = rand_vec(t * h, &mut seed);
    // Expert 1 takes most tokens, so its batch is split across waves.
    let ids: Vec<u32> = (0..t * k)
        .map(|i| if i % k == 0 { 1 } else { (i % 4) as u32 })
        .collect();
    let wts: Vec<f32> = (0..t * k).map(|i| 0.1 + (i % 5) as f32 * 0.2).collect();
    let mut want = vec![0.0; t * h];
    fused_moe_ref(&ex, &x, &ids, &wts, &mut want).expect("valid");
    let batches = group_by_expert(4, &ids, &wts, k).expect("valid");
    let active: Vec<&ExpertBatch> = batches.iter().collect();
    for kernel in kernels() {
        for wave_rows in [1, 5, 7, 1000] {
            let mut got = vec![0.0; t * h];
            run_waves(&ex, &x, &active, &mut got, &|_| kernel, wave_rows);
            let what = format!("{kernel:?}, waves of {wave_rows} rows");
            assert_moe_close(&want, &got, &what);
        }
    }
}

#[test]
fn expert_mask_and_accumulate_split_the_work() {
    let mut seed = 8;
    let (h, inter, t) = (48, 32, 6);
    let ex = make_experts(4, h, inter, PackedFormat::Bf16, &mut seed);
    let x = rand_vec(t * h, &mut seed);
    let ids: Vec<u32> = (0..t * 2).map(|i| (i % 4) as u32).collect();
    let wts = vec![0.5f32; t * 2];
    let mut full = vec![0.0; t * h];
    fused_moe(&ex, &x, &ids, &wts, &mut full).expect("valid");
    let (even, odd) = ([true, false, true, false], [false, true, false, true]);
    let mut split = vec![0.0; t * h];
    let o1 = MoeOptions {
        expert_mask: Some(&even),
        ..MoeOptions::default()
    };
    fused_moe_with(&ex, &x, &ids, &wts, &mut split, &o1).expect("valid");
    let o2 = MoeOptions {
        expert_mask: Some(&odd),
        accumulate: true,
        ..MoeOptions::default()
    };
    fused_moe_with(&ex, &x, &ids, &wts, &mut split, &o2).expect("valid");
    assert_moe_close(&full, &split, "masked halves");
}

#[test]
fn dense_mlp_is_an_expert_with_weight_one() {
    let mut seed = 9;
    let (h, inter, t) = (40, 24, 5);
    let mlp = make_experts(1, h, inter, PackedFormat::Int8 { group: None }, &mut seed);
    let x = rand_vec(t * h, &mut seed);
    let mut want = vec![0.0; t * h];
    fused_moe_ref(&mlp, &x, &vec![0; t], &vec![1.0; t], &mut want).expect("valid");
    let mut got = vec![1.0; t * h];
    dense_mlp(&mlp, &x, &mut got, false).expect("valid");
    assert_moe_close(&want, &got, "dense mlp");
}

#[test]
fn bad_routing_is_an_error() {
    let mut seed = 1;
    let ex = make_experts(2, 32, 16, PackedFormat::Bf16, &mut seed);
    let x = vec![0.0; 32];
    let mut out = vec![0.0; 32];
    assert!(fused_moe(&ex, &x, &[5], &[1.0], &mut out).is_err());
    assert!(fused_moe(&ex, &x[..31], &[0], &[1.0], &mut out).is_err());
    assert!(fused_moe(&ex, &x, &[0, 1], &[1.0], &mut out).is_err());
}

#[test]
fn amx_takes_integer_experts_only_with_long_scale_groups() {
    let mut seed = 61;
    let (h, inter) = (256, 32);
    let from = |fmt: PackedFormat, seed: &mut u64| {
        let x = make_experts(1, h, inter, fmt, seed);
        amx_from(&x.experts[0].gate_up, DEFAULT_AMX_MIN_TOKENS)
    };
    let int8 = |group| PackedFormat::Int8 { group };
    let int4 = |group| PackedFormat::Int4 { group };
    assert_eq!(from(PackedFormat::Bf16, &mut seed), Some(16));
    assert_eq!(from(int8(None), &mut seed), Some(16));
    assert_eq!(from(int8(Some(128)), &mut seed), Some(16));
    assert_eq!(from(int8(Some(64)), &mut seed), None);
    assert_eq!(from(int8(Some(32)), &mut seed), None);
    assert_eq!(from(int4(128), &mut seed), Some(64));
    assert_eq!(from(int4(64), &mut seed), Some(64));
    assert_eq!(from(int4(32), &mut seed), None);
}
