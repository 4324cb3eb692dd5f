//! The AMX tile program on the software tile unit ([`Kernel::AmxSoft`]), against the reference
//! and the portable kernel: every packed format, row counts around the 32-row block (0, 1, 31,
//! 32, 33, 65), `n` not a multiple of the 32-column block, `k` odd multiples of the tile depth
//! and ragged, scale groups of 32 to 128 and per row, and `k` runs split into several panels.
//! The fused MoE operator runs through it too. Integer formats must match the portable kernel bit for bit where both flush at the same
//! points: both sum exactly in i32 and flush each scale group to f32 in the same order.

use super::{Kernel, run_block};
use crate::isa::Isa;
use crate::moe::{Expert, ExpertBatch, MoeExperts, fused_moe_ref, group_by_expert, run_waves};
use crate::packed::tests::{FORMATS, assert_close, rand_vec};
use crate::packed::{Activations, Kind, PackedFormat, PackedMatrix};

/// Checks `[m, k] x [n, k]ᵀ` in `fmt` on the software tile unit.
fn check(fmt: PackedFormat, m: usize, n: usize, k: usize, seed: &mut u64) {
    let x = rand_vec(m * k, seed);
    let w = rand_vec(n * k, seed);
    let p = PackedMatrix::pack(&w, n, k, fmt).expect("valid format");
    let what = format!("{} {m}x{n}x{k}", fmt.name());
    let mut want = vec![0.0; m * n];
    p.matmul_ref(&x, m, &mut want).expect("shapes agree");
    let mut got = vec![f32::NAN; m * n];
    p.matmul_on(Kernel::AmxSoft, &x, m, &mut got);
    assert_close(&want, &got, &format!("{what} AmxSoft"));
    // Per-row scales flush once per panel, and the paths size panels differently (L2 for
    // AMX, L1 for the others: 512 `k` or more at 4 strips), so those agree only within one.
    if p.kind != Kind::Bf16 && (p.group < p.k_pad || p.k_pad <= 512) {
        let mut port = vec![f32::NAN; m * n];
        p.matmul_on(Kernel::Isa(Isa::Portable), &x, m, &mut port);
        assert_eq!(got, port, "{what}: AmxSoft and Portable differ");
    }
}

#[test]
fn amx_tile_program_matches_reference_on_ragged_shapes() {
    let mut seed = 23;
    // (n, k): one strip; 40 and 100 columns (ragged strip pairs, 2 and 4 per task block);
    // k = 3, 5, 7 tile depths of 32 (BF16) or 64 (INT), a ragged 200, and 1024, whose rows
    // of activations take a padding line.
    let nk = [(16, 96), (40, 320), (70, 224), (100, 200), (40, 1024)];
    for fmt in FORMATS {
        for m in [0, 1, 31, 32, 33, 65] {
            for &(n, k) in &nk {
                check(fmt, m, n, k, &mut seed);
            }
        }
    }
}

#[test]
fn amx_tile_program_carries_accumulation_across_panels() {
    // A task block of 4 strips keeps a panel of 512 KiB: 4096 `k` for BF16, 8192 for INT8,
    // 16384 for INT4, so these `k` split into a full panel and a short one.
    let mut seed = 29;
    check(PackedFormat::Bf16, 33, 64, 4096 + 96, &mut seed);
    check(
        PackedFormat::Int8 { group: None },
        1,
        64,
        8192 + 64,
        &mut seed,
    );
    check(
        PackedFormat::Int4 { group: 128 },
        1,
        64,
        16384 + 128,
        &mut seed,
    );
}

#[test]
fn amx_tile_program_matches_naive_moe_in_every_format() {
    // Expert batches of 1 to 35 rows (one or two 32-row blocks, ragged), `inter` not a
    // multiple of 32, `hidden` not a multiple of 64.
    let mut seed = 41;
    let (n_exp, h, inter, k) = (4, 136, 48, 2);
    for fmt in FORMATS {
        let experts = (0..n_exp)
            .map(|_| {
                let (g, u) = (
                    rand_vec(inter * h, &mut seed),
                    rand_vec(inter * h, &mut seed),
                );
                let d = rand_vec(h * inter, &mut seed);
                Expert::pack(&g, &u, &d, h, inter, fmt).expect("packs")
            })
            .collect();
        let ex = MoeExperts::new(h, inter, experts).expect("same shape");
        for t in [1usize, 17, 35] {
            let x = rand_vec(t * h, &mut seed);
            // Expert 0 takes every token, the others share the second slot.
            let ids: Vec<u32> = (0..t * k)
                .map(|i| {
                    if i % k == 0 {
                        0
                    } else {
                        1 + (i / k % 3) as u32
                    }
                })
                .collect();
            let wts: Vec<f32> = (0..t * k).map(|i| 0.3 + (i % 4) as f32 * 0.2).collect();
            let mut want = vec![0.0; t * h];
            fused_moe_ref(&ex, &x, &ids, &wts, &mut want).expect("valid");
            let batches = group_by_expert(n_exp, &ids, &wts, k).expect("valid");
            let active: Vec<&ExpertBatch> = batches.iter().collect();
            let mut got = vec![0.0; t * h];
            run_waves(&ex, &x, &active, &mut got, &|_| Kernel::AmxSoft, 1 << 16);
            // The intermediate activations are re-rounded: compare as the MoE tests do.
            let scale = want.iter().fold(1e-3f32, |a, v| a.max(v.abs()));
            for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                assert!(
                    (a - b).abs() <= 2e-3 * scale,
                    "{} T={t}: element {i}: want {a}, got {b}",
                    fmt.name()
                );
            }
        }
    }
}

#[test]
fn activations_are_padded_for_the_kernel_that_reads_them() {
    let w = rand_vec(32 * 64, &mut 3);
    let p = PackedMatrix::pack(&w, 32, 64, PackedFormat::Bf16).expect("valid format");
    let x = rand_vec(33 * 64, &mut 4);
    let pad = |kernel| Activations::quantize(&p, 33, kernel, |r| &x[r * 64..][..64]).m_pad;
    assert_eq!(pad(Kernel::AmxSoft), 64);
    assert_eq!(pad(Kernel::Isa(Isa::Portable)), 33);
    assert_eq!(
        Activations::quantize(&p, 0, Kernel::AmxSoft, |_| &x[..64]).m_pad,
        32
    );
}

#[test]
#[should_panic(
    expected = "AMX blocks read whole 32-row blocks: rows 0..33, activations padded to 33 rows"
)]
fn tile_program_refuses_activations_padded_for_another_kernel() {
    let w = rand_vec(32 * 64, &mut 5);
    let p = PackedMatrix::pack(&w, 32, 64, PackedFormat::Bf16).expect("valid format");
    let x = rand_vec(33 * 64, &mut 6);
    let a = Activations::quantize(&p, 33, Kernel::Isa(Isa::Portable), |r| &x[r * 64..][..64]);
    let mut out = vec![0.0; 33 * 32];
    run_block(Kernel::AmxSoft, &p, &a, 0..33, 0..2, &mut out, 32);
}

/// The hardware unit cannot be made where AMX was not detected, so no tile instruction runs on
/// a CPU or OS without AMX, whatever the caller asks.
#[cfg(target_arch = "x86_64")]
#[test]
fn hardware_tiles_exist_only_where_amx_was_detected() {
    let made = std::panic::catch_unwind(super::amx_hw::HwTiles::new).is_ok();
    assert_eq!(made, crate::isa::detected() == Isa::Amx);
}
