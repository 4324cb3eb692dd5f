//! The tile path (weights decoded to BF16 or INT8 tiles, packed micro-kernels) against its
//! plain twins: BF16-rounded activations times BF16-rounded dequantized weights, or per-token
//! int8 activations times the INT8 tile's weights, summed in f32. Run on the AMX tile program
//! (software tile unit), the AVX-512 integer tiles on the software VNNI unit, the portable
//! micro-kernel and every AVX-512 and AMX path the CPU has, for every readable type.

use super::super::tests::{
    GENERIC, INTEGER, check, magnitudes, matrix, moe_twin, rand_x, stacked_experts, tile_twin,
};
use super::*;
use crate::ggml::GgmlType;
use crate::ggml::dot::Q8Layout;
use crate::ggml::matrix::Form;
use crate::ggml::moe::fused_moe_ggml_as;
use crate::moe::group_by_expert;

/// The kernels the tile path can run on here (AVX2 and AVX-VNNI take tiles only for some
/// types or when forced, but run every tile the same way).
fn kernels() -> Vec<Kernel> {
    let mut v = vec![Kernel::AmxSoft, Kernel::Isa(Isa::Portable)];
    #[cfg(target_arch = "x86_64")]
    v.push(Kernel::VnniSoft);
    if Isa::Avx512.is_available() {
        v.push(Kernel::Avx512Fma);
    }
    if Kernel::Avx512Dpbf16.is_available() {
        v.push(Kernel::Avx512Dpbf16);
    }
    v.extend(
        Isa::available()
            .into_iter()
            .filter(|&i| i >= Isa::Avx2)
            .map(Kernel::Isa),
    );
    v
}

const FORMATS: [TileFormat; 2] = [TileFormat::Bf16, TileFormat::Int8];

#[test]
fn tile_matmul_matches_its_twin_on_every_type_format_and_kernel() {
    let mut seed = 7;
    for (ty, fmt) in INTEGER
        .into_iter()
        .chain(GENERIC)
        .flat_map(|t| FORMATS.map(|f| (t, f)))
    {
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
            let want = tile_twin(&w, &x, m, fmt);
            let mag = magnitudes(&x, &w.dequantize(), m, n, k);
            for kernel in kernels() {
                let mut got = vec![f32::NAN; m * n];
                w.matmul_as(Isa::Portable, Form::Tiles(kernel, fmt), &x, m, &mut got);
                check(
                    ty,
                    &format!("{fmt:?} {kernel:?} {m}x{n}x{k}"),
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
fn tiles_are_taken_for_many_tokens_on_avx512_amx_and_for_exact_types_on_avx_vnni() {
    if forced() != (None, None) {
        return; // STRATA_GGML_TILES set: the choice is the environment's.
    }
    // Q6_K: INT8 tiles with a scale per 16 on AVX-512 (on AMX until its BF16 tiles take
    // over), from few tokens; on AVX-VNNI from the threshold of every exact type.
    let w = matrix(GgmlType::Q6_K, 64, 256, &mut 1);
    let avx512_int8 = Form::Tiles(Kernel::Isa(Isa::Avx512), TileFormat::Int8);
    for isa in [Isa::Avx512, Isa::Amx] {
        assert_eq!(w.form(isa, INT8_MIN_TOKENS_Q6_K), avx512_int8);
        assert_eq!(
            w.form(isa, INT8_MIN_TOKENS_Q6_K - 1),
            Form::Q8(256, Q8Layout::Natural)
        );
    }
    assert_eq!(w.form(Isa::Avx512, 4096), avx512_int8);
    let min = TILE_MIN_TOKENS_AMX_SLOW_BF16_FILL;
    assert_eq!(w.form(Isa::Amx, min - 1), avx512_int8);
    assert_eq!(
        w.form(Isa::Amx, min),
        Form::Tiles(Kernel::Isa(Isa::Amx), TileFormat::Bf16)
    );
    assert_eq!(
        w.form(Isa::AvxVnni, INT8_MIN_TOKENS_AVX_VNNI),
        Form::Tiles(Kernel::Isa(Isa::AvxVnni), TileFormat::Int8)
    );
    assert_eq!(
        w.form(Isa::AvxVnni, INT8_MIN_TOKENS_AVX_VNNI - 1),
        Form::Q8(256, Q8Layout::Natural)
    );
    for isa in [Isa::Portable, Isa::Avx2] {
        assert_eq!(w.form(isa, 4096), Form::Q8(256, Q8Layout::Natural));
    }
    // AVX-VNNI: INT8 tiles for every exact type from one threshold, Q3_K and Q8_0 from fewer
    // tokens.
    let avx_vnni = Form::Tiles(Kernel::Isa(Isa::AvxVnni), TileFormat::Int8);
    let q8_0 = matrix(GgmlType::Q8_0, 64, 256, &mut 1);
    let early = INT8_MIN_TOKENS_AVX_VNNI_EARLY;
    assert_eq!(q8_0.form(Isa::AvxVnni, early), avx_vnni);
    assert_eq!(
        q8_0.form(Isa::AvxVnni, early - 1),
        Form::Q8(32, Q8Layout::Natural)
    );
    assert_eq!(q8_0.form(Isa::Avx2, 4096), Form::Q8(32, Q8Layout::Natural));
    let q3_k = matrix(GgmlType::Q3_K, 64, 256, &mut 1);
    let (vnni_min, avx512_min) = (early, INT8_MIN_TOKENS_Q3_K);
    assert_eq!(q3_k.form(Isa::AvxVnni, vnni_min), avx_vnni);
    assert_eq!(
        q3_k.form(Isa::AvxVnni, vnni_min - 1),
        Form::Q8(32, Q8Layout::Natural)
    );
    for isa in [Isa::Avx512, Isa::Amx] {
        assert_eq!(q3_k.form(isa, avx512_min), avx512_int8);
        assert_eq!(
            q3_k.form(isa, avx512_min - 1),
            Form::Q8(32, Q8Layout::Natural)
        );
    }
    // Q2_K, stored exactly with a scale and a bias per 16: early on AVX-512, from the general
    // threshold on AVX-VNNI.
    let q2_k = matrix(GgmlType::Q2_K, 64, 256, &mut 1);
    assert_eq!(q2_k.form(Isa::AvxVnni, INT8_MIN_TOKENS_AVX_VNNI), avx_vnni);
    assert!(!matches!(
        q2_k.form(Isa::AvxVnni, INT8_MIN_TOKENS_AVX_VNNI - 1),
        Form::Tiles(..)
    ));
    for isa in [Isa::Avx512, Isa::Amx] {
        assert_eq!(q2_k.form(isa, INT8_MIN_TOKENS_Q2_K), avx512_int8);
        assert!(!matches!(
            q2_k.form(isa, INT8_MIN_TOKENS_Q2_K - 1),
            Form::Tiles(..)
        ));
    }
    // Q4_K takes AVX-512 INT8 tiles from fewer tokens, on AMX until its BF16 tiles take over.
    let q4_k = matrix(GgmlType::Q4_K, 64, 256, &mut 1);
    let int8 = Form::Tiles(Kernel::Isa(Isa::Avx512), TileFormat::Int8);
    assert_eq!(q4_k.form(Isa::AvxVnni, INT8_MIN_TOKENS_AVX_VNNI), avx_vnni);
    assert_eq!(
        q4_k.form(Isa::AvxVnni, INT8_MIN_TOKENS_AVX_VNNI - 1),
        Form::Q8(256, Q8Layout::Natural)
    );
    for isa in [Isa::Avx512, Isa::Amx] {
        // Its VNNI row-dot kernel reads activations in nibble pairs.
        let pairs = if cfg!(target_arch = "x86_64") {
            Q8Layout::NibblePairs
        } else {
            Q8Layout::Natural
        };
        assert_eq!(
            q4_k.form(isa, INT8_MIN_TOKENS_Q4_K - 1),
            Form::Q8(256, pairs)
        );
        assert_eq!(q4_k.form(isa, INT8_MIN_TOKENS_Q4_K), int8);
        assert_eq!(q4_k.form(isa, TILE_MIN_TOKENS_AMX - 1), int8);
    }
    assert_eq!(q4_k.form(Isa::Avx512, 4096), int8);
    let amx_bf16 = Form::Tiles(Kernel::Isa(Isa::Amx), TileFormat::Bf16);
    assert_eq!(q4_k.form(Isa::Amx, TILE_MIN_TOKENS_AMX), amx_bf16);
    // So do Q8_0, IQ4_XS, Q5_K and Q5_0, from their own thresholds; on AMX their BF16 tiles take
    // over from theirs (Q8_0's at once).
    for (w, early, amx) in [
        (&q8_0, INT8_MIN_TOKENS_Q8_0, TILE_MIN_TOKENS_AMX_Q8_0),
        (
            &matrix(GgmlType::IQ4_XS, 64, 256, &mut 1),
            INT8_MIN_TOKENS_IQ4_XS,
            TILE_MIN_TOKENS_AMX_IQ4_XS,
        ),
        (
            &matrix(GgmlType::Q5_K, 64, 256, &mut 1),
            INT8_MIN_TOKENS_Q5_K,
            TILE_MIN_TOKENS_AMX_Q5_K,
        ),
        (
            &matrix(GgmlType::Q5_0, 64, 256, &mut 1),
            INT8_MIN_TOKENS_Q4_0_Q5_0,
            TILE_MIN_TOKENS_AMX,
        ),
    ] {
        for isa in [Isa::Avx512, Isa::Amx] {
            assert!(!matches!(w.form(isa, early - 1), Form::Tiles(..)));
        }
        assert_eq!(w.form(Isa::Avx512, early), int8);
        assert_eq!(w.form(Isa::Avx512, 4096), int8);
        if early < amx {
            assert_eq!(w.form(Isa::Amx, amx - 1), int8);
        }
        assert_eq!(w.form(Isa::Amx, amx), amx_bf16);
    }
    // Q2_K's BF16 tiles take over from the general threshold.
    let q2_k = matrix(GgmlType::Q2_K, 64, 256, &mut 1);
    assert_eq!(q2_k.form(Isa::Amx, TILE_MIN_TOKENS_AMX - 1), int8);
    assert_eq!(q2_k.form(Isa::Amx, TILE_MIN_TOKENS_AMX), amx_bf16);
    // Types without an integer form take BF16 tiles.
    let f16 = matrix(GgmlType::F16, 64, 256, &mut 1);
    let bf16 = TileFormat::Bf16;
    assert_eq!(f16.form(Isa::Avx2, 64), Form::F32);
    for (isa, min) in [
        (Isa::Avx512, TILE_MIN_TOKENS_AVX512),
        (Isa::Amx, TILE_MIN_TOKENS_AMX),
    ] {
        assert_eq!(f16.form(isa, min), Form::Tiles(Kernel::Isa(isa), bf16));
        assert_eq!(f16.form(isa, min - 1), Form::F32);
    }
}

#[test]
fn fused_moe_on_tiles_matches_its_twin() {
    let (h, inter, n_exp, k) = (256, 256, 5, 2);
    let mut seed = 11;
    for (tg, td) in [
        (GgmlType::Q4_K, GgmlType::Q6_K),
        (GgmlType::IQ2_XXS, GgmlType::Q8_0),
    ] {
        let experts = stacked_experts((tg, td), n_exp, h, inter, &mut seed);
        // Expert 4 gets no token, expert 0 all 40 of them, the others ragged shares.
        let t = 40;
        let x = rand_x(t * h, &mut seed);
        let ids: Vec<u32> = (0..t).flat_map(|i| [0, 1 + (i % 3) as u32]).collect();
        let weights: Vec<f32> = (0..t * k).map(|i| 0.3 + 0.1 * (i % 4) as f32).collect();
        let batches = group_by_expert(n_exp, &ids, &weights, k).expect("valid routing");
        for fmt in FORMATS {
            let want = moe_twin(&experts, &x, &batches, |_, _| Some(fmt));
            let scale = want.iter().fold(0.0f32, |a, v| a.max(v.abs())).max(1e-3);
            for kernel in kernels() {
                let mut got = vec![f32::NAN; t * h];
                let form = Form::Tiles(kernel, fmt);
                fused_moe_ggml_as(&experts, &x, &batches, &mut got, form).expect("runs");
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    // The intermediate is rounded (BF16 or int8) between gate/up and down, so
                    // a value near a rounding boundary may round the other way than in the
                    // twin.
                    assert!(
                        (g - w).abs() <= 2e-3 * scale,
                        "{tg}/{td} {fmt:?} {kernel:?} output {i}: {g} vs {w}"
                    );
                }
            }
        }
    }
}

/// A benchmark's forced path (`fused_moe_ggml_along`) runs every expert along it on every
/// instruction set here, equal to that path's twin; a path the instruction set lacks is an
/// error naming both that leaves the output as it was.
#[test]
fn forced_paths_match_their_twins() {
    use crate::ggml::{GgmlPath, fused_moe_ggml_along};
    use crate::moe::MoeOptions;
    let (h, inter, n_exp, k, t) = (256, 256, 4, 2, 12);
    let mut seed = 31;
    let types = (GgmlType::Q4_K, GgmlType::Q6_K);
    let experts = stacked_experts(types, n_exp, h, inter, &mut seed);
    let x = rand_x(t * h, &mut seed);
    let ids: Vec<u32> = (0..t).flat_map(|i| [0, 1 + (i % 3) as u32]).collect();
    let weights: Vec<f32> = (0..t * k).map(|i| 0.3 + 0.1 * (i % 4) as f32).collect();
    let batches = group_by_expert(n_exp, &ids, &weights, k).expect("valid routing");
    for isa in Isa::available() {
        for path in GgmlPath::available(isa) {
            let opts = MoeOptions {
                isa: Some(isa),
                ..MoeOptions::default()
            };
            let mut got = vec![f32::NAN; t * h];
            fused_moe_ggml_along(&experts, &x, &batches, &mut got, &opts, path).expect("runs");
            let (g, ..) = experts.expert(0);
            let fmt = match g.form_on(isa, path) {
                Form::Tiles(_, fmt) => Some(fmt),
                _ => None,
            };
            let want = moe_twin(&experts, &x, &batches, |_, _| fmt);
            let scale = want.iter().fold(0.0f32, |a, v| a.max(v.abs())).max(1e-3);
            // As `fused_moe_on_tiles_matches_its_twin`: the rounded intermediate may round
            // the other way near a boundary.
            let tol = if fmt.is_some() { 2e-3 } else { 1e-4 };
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= tol * scale,
                    "{} on {isa:?} output {i}: {g} vs {w}",
                    path.name()
                );
            }
        }
    }
    let opts = MoeOptions {
        isa: Some(Isa::Avx2),
        ..MoeOptions::default()
    };
    let mut out = vec![0.0; t * h];
    let err = fused_moe_ggml_along(&experts, &x, &batches, &mut out, &opts, GgmlPath::Int8Tiles)
        .unwrap_err();
    assert!(
        err.to_string().contains("int8-tiles path does not run on"),
        "{err}"
    );
}

/// Random shapes through the INT8 tiles of every integer type: ragged rows, `k` a multiple of
/// 256, 1 to 70 tokens, on the software tile unit and every AVX-512 / AMX path here.
#[test]
fn int8_tiles_match_their_twin_on_random_shapes() {
    let mut seed = 23u64;
    let mut next = |below: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % below
    };
    for ty in INTEGER {
        for _ in 0..3 {
            let (m, n, k) = (
                1 + next(70) as usize,
                1 + next(150) as usize,
                256 * (1 + next(3) as usize),
            );
            let mut s = next(1 << 30);
            let w = matrix(ty, n, k, &mut s);
            let x = rand_x(m * k, &mut s);
            let want = tile_twin(&w, &x, m, TileFormat::Int8);
            let mag = magnitudes(&x, &w.dequantize(), m, n, k);
            for kernel in kernels() {
                let mut got = vec![f32::NAN; m * n];
                let form = Form::Tiles(kernel, TileFormat::Int8);
                w.matmul_as(Isa::Portable, form, &x, m, &mut got);
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

/// The direct fills (AVX-512: Q4_K's and Q6_K's INT8 and BF16 tiles, unpacked and transposed
/// in registers) write the same tiles, scales and biases as the generic fills, on
/// ragged row counts.
#[test]
fn direct_fills_equal_the_generic_fills() {
    if Isa::selected() < Isa::Avx512 {
        eprintln!("SKIPPED: no AVX-512 selected here, the direct tile fills do not run");
        return;
    }
    let k = 512;
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for ty in [
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q3_K,
        GgmlType::Q8_0,
        GgmlType::IQ4_XS,
        GgmlType::Q4_0,
        GgmlType::Q5_0,
    ] {
        for n in [1, 16, 33, 64] {
            let wm = matrix(ty, n, k, &mut (n as u64));
            let w = Rows {
                ty,
                n,
                k,
                bytes: wm.bytes(),
            };
            let bf16 = TileFormat::Bf16.layout(ty, n, k);
            let fill_bf16 = |direct: bool| {
                let mut bytes = vec![7u8; bf16.data_bytes];
                if direct {
                    super::fill(w, &mut bytes, &bf16);
                } else {
                    with_scratch(|s| fill_body::<false>(s, w, &mut bytes, &bf16));
                }
                bytes
            };
            assert!(
                fill_bf16(false) == fill_bf16(true),
                "{ty} {n} rows: BF16 tiles differ"
            );
            let layout = TileFormat::Int8.layout(ty, n, k);
            let fill = |direct: bool| {
                let mut bytes = vec![7u8; layout.data_bytes];
                let (mut sc, mut bias) = (vec![7.0f32; layout.scales], vec![7.0f32; layout.scales]);
                if direct {
                    int8::fill(w, &mut bytes, &mut sc, &mut bias, &layout);
                } else {
                    with_scratch(|s| {
                        int8::fill_body::<false, false>(
                            s, w, &mut bytes, &mut sc, &mut bias, &layout,
                        )
                    });
                }
                (bytes, sc, bias)
            };
            let (want, got) = (fill(false), fill(true));
            assert!(want.0 == got.0, "{ty} {n} rows: INT8 tile bytes differ");
            assert_eq!(bits(&want.1), bits(&got.1), "{ty} {n} rows: scales differ");
            if int8::biased(ty) {
                assert_eq!(bits(&want.2), bits(&got.2), "{ty} {n} rows: biases differ");
            }
        }
    }
}

/// The INT8 fill with its AVX2 transpose equals the scalar fill byte for byte: exact types
/// transposed from their decoded values, requantized ones from their rows, ragged rows.
#[test]
fn avx2_int8_fills_equal_the_scalar_fills() {
    if !Isa::available().contains(&Isa::Avx2) {
        eprintln!("NOT CHECKED: this CPU has no AVX2, so the AVX2 tile fill cannot run");
        return;
    }
    let k = 512;
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for ty in [
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q8_0,
        GgmlType::IQ4_XS,
        GgmlType::Q5_K,
    ] {
        for n in [1, 16, 33, 64] {
            let wm = matrix(ty, n, k, &mut (n as u64 + 5));
            let w = Rows {
                ty,
                n,
                k,
                bytes: wm.bytes(),
            };
            let layout = TileFormat::Int8.layout(ty, n, k);
            let fill = |avx2: bool| {
                let mut bytes = vec![7u8; layout.data_bytes];
                let (mut sc, mut bias) = (vec![7.0f32; layout.scales], vec![7.0f32; layout.scales]);
                with_scratch(|s| {
                    if avx2 {
                        // The CPU has AVX2 (checked above), which is all `AVX2` asks.
                        int8::fill_body::<false, true>(
                            s, w, &mut bytes, &mut sc, &mut bias, &layout,
                        )
                    } else {
                        int8::fill_body::<false, false>(
                            s, w, &mut bytes, &mut sc, &mut bias, &layout,
                        )
                    }
                });
                (bytes, sc, bias)
            };
            let (want, got) = (fill(false), fill(true));
            assert!(want.0 == got.0, "{ty} {n} rows: INT8 tile bytes differ");
            assert_eq!(bits(&want.1), bits(&got.1), "{ty} {n} rows: scales differ");
            if int8::biased(ty) {
                assert_eq!(bits(&want.2), bits(&got.2), "{ty} {n} rows: biases differ");
            }
        }
    }
}

/// Relative RMS error of `got` against `want` (f64).
fn rel_rms(got: &[f32], want: &[f64]) -> f64 {
    let (mut e, mut s) = (0.0, 0.0);
    for (g, w) in got.iter().zip(want) {
        e += (f64::from(*g) - w).powi(2);
        s += w * w;
    }
    (e / s.max(1e-300)).sqrt()
}

/// Both tile formats (and the row-dot kernels) against `x · Wᵀ` in f64 on the reference
/// dequantizer's weights: plain activations, and activations with a few outlier channels (64x
/// the rest), which int8 activations resolve coarsely around them (hence a scale per 32 or
/// 256, not per token). Prints the errors (`--nocapture`); asserts bounds that hold with
/// margin.
#[test]
fn int8_and_bf16_tiles_accuracy_against_f64() {
    let (m, n, k) = (32, 64, 2048);
    let mut seed = 31;
    let x = rand_x(m * k, &mut seed);
    let mut outliers = x.clone();
    for row in outliers.chunks_exact_mut(k) {
        for c in [7, 300, 1200, 2001] {
            row[c] *= 64.0;
        }
    }
    for ty in INTEGER {
        let w = matrix(ty, n, k, &mut seed);
        let wf = w.dequantize();
        // The row-dot kernels' int8 activations (a scale per 32 or 256), for comparison.
        let wm_form = w.form(Isa::Portable, m);
        let mut line = format!("{ty:>7}");
        for (name, x) in [("plain", &x), ("outliers", &outliers)] {
            let mut want = vec![0.0f64; m * n];
            for t in 0..m {
                for j in 0..n {
                    want[t * n + j] = (0..k)
                        .map(|p| f64::from(x[t * k + p]) * f64::from(wf[j * k + p]))
                        .sum();
                }
            }
            let mut errs = [0.0; 3];
            let forms = FORMATS.map(|f| Form::Tiles(Kernel::Isa(Isa::Portable), f));
            for (e, form) in errs.iter_mut().zip(forms.into_iter().chain([wm_form])) {
                let mut got = vec![f32::NAN; m * n];
                w.matmul_as(Isa::Portable, form, x, m, &mut got);
                *e = rel_rms(&got, &want);
            }
            line += &format!(
                "  {name}: bf16 {:.2e} int8 {:.2e} row-dot {:.2e}",
                errs[0], errs[1], errs[2]
            );
            // Per-token activation scales gave 6.4e-2 .. 7.3e-2 with outliers; per 256 (the
            // types whose row-dot kernels, like llama.cpp's, quantize so) 3.0e-2 .. 3.4e-2,
            // per 32 0.9e-2 .. 1.3e-2.
            let per_256 = crate::ggml::vecdot::activation_block(ty) == 256;
            let bound = match (name, per_256) {
                ("plain", _) => 1e-2,
                (_, true) => 4e-2,
                _ => 2.5e-2,
            };
            assert!(errs[0] < 5e-3 && errs[1] < bound, "{ty} {name}: {errs:?}");
        }
        println!("{line}");
    }
}

/// Timing of one 64-row tile, k 2048, on one thread: the decode (fill) against the
/// micro-kernel at several token counts, per format and kernel. Run by hand:
/// `cargo test -p strata-kernels --release -- --ignored tile_fill_and_kernel_timing --nocapture`.
#[test]
#[ignore = "timing, run by hand"]
fn tile_fill_and_kernel_timing() {
    use std::time::Instant;
    let (n, k) = (TILE_ROWS, 2048);
    let time = |f: &mut dyn FnMut()| {
        f();
        let (t0, mut iters) = (Instant::now(), 0u32);
        while t0.elapsed().as_secs_f64() < 0.2 {
            f();
            iters += 1;
        }
        t0.elapsed().as_secs_f64() / f64::from(iters)
    };
    for ty in [
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q3_K,
        GgmlType::Q8_0,
        GgmlType::IQ4_XS,
    ] {
        let wm = matrix(ty, n, k, &mut 3);
        let w = Rows {
            ty,
            n,
            k,
            bytes: wm.bytes(),
        };
        for fmt in FORMATS {
            let layout = fmt.layout(ty, n, k);
            let mut tile = Arc::new(TileBytes(AlignedBuf::zeroed(tile_bytes(w, fmt, &layout))));
            let fill_s = time(&mut || drop(decode(w, fmt, &layout, &mut tile)));
            let (mut q, mut d, mut mm) = (
                vec![0i8; n * k],
                vec![0.0; n * k / 16],
                vec![0.0; n * k / 16],
            );
            let unpack_s = time(&mut || {
                crate::ggml::unpack::unpack_rows(
                    Isa::selected(),
                    ty,
                    w.bytes,
                    &mut q,
                    &mut d,
                    &mut mm,
                );
            });
            let mut line = format!(
                "{ty:>6} {fmt:?}: fill {:6.1} us (block decoders {:5.1})",
                fill_s * 1e6,
                unpack_s * 1e6
            );
            // The kernel alone, on the tile as decoded (the biases of types with mins not
            // added).
            let view = decode(w, fmt, &layout, &mut tile);
            // BF16 tiles on both AVX-512 multiplies where the CPU has `vdpbf16ps` (the path
            // takes the faster, `crate::isa::bf16_dot_on_dpbf16`).
            let both = [Kernel::Avx512Fma, Kernel::Avx512Dpbf16];
            let bf16_twins = both
                .into_iter()
                .filter(|k| fmt == TileFormat::Bf16 && k.is_available());
            let isas = Isa::available().into_iter().filter(|&i| i >= Isa::Avx512);
            for kernel in isas.map(Kernel::Isa).chain(bf16_twins) {
                let name = match kernel {
                    Kernel::Isa(isa) => isa.name(),
                    Kernel::Avx512Dpbf16 => "avx512-dpbf16",
                    _ => "avx512-fma",
                };
                for m in [32usize, 256, 512] {
                    let x = rand_x(m * k, &mut 5);
                    let a = activations(ty, k, m, kernel, fmt, |r| &x[r * k..(r + 1) * k]);
                    let mut out = vec![0.0f32; m * n];
                    let s = time(&mut || {
                        micro::run_block(kernel, &view, &a, 0..m, 0..4, &mut out, n);
                    });
                    let gops = 2.0 * (n * k * m) as f64 / s / 1e9;
                    let share = fill_s / (fill_s + s) * 100.0;
                    line += &format!(
                        " | {name} m{m}: {:7.1} us {gops:5.0} GOPS fill {share:2.0}%",
                        s * 1e6
                    );
                }
            }
            println!("{line}");
        }
    }
}

/// Tiles whose blocks come from DRAM against tiles decoded again from cache: the fill alone
/// and the whole tile (fill, kernel at 32 tokens, biases) per 64x2048 tile, cycling through
/// more rows than the caches hold. Measured on an Emerald Rapids core (2026-12-01): Q4_K
/// fill 6.0-6.9 us cold against 4.5 hot, the tile 28-31 us against 25.7; Q6_K fill 9.8-12.1
/// against 7.6, the tile 36-39 against 33.
/// `cargo test -p strata-kernels --release -- --ignored cold_tile_timing --nocapture`.
#[test]
#[ignore = "timing, run by hand"]
fn cold_tile_timing() {
    use std::time::Instant;
    let (n, k, tiles, m) = (TILE_ROWS, 2048, 640, 32);
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
        let wm = matrix(ty, n * tiles, k, &mut 3);
        let tile_len = wm.bytes().len() / tiles;
        let (fmt, kernel) = (TileFormat::Int8, Kernel::Isa(Isa::selected()));
        let layout = fmt.layout(ty, n, k);
        let x = rand_x(m * k, &mut 5);
        let a = activations(ty, k, m, kernel, fmt, |r| &x[r * k..(r + 1) * k]);
        let mut line = format!("{ty:>6}");
        for (name, with_kernel, cold) in [
            ("fill cold", false, true),
            ("fill hot", false, false),
            ("tile cold", true, true),
            ("tile hot", true, false),
        ] {
            let mut best = f64::MAX;
            for _ in 0..5 {
                let t0 = Instant::now();
                for i in 0..tiles {
                    let at = if cold { i * tile_len } else { 0 };
                    let w = Rows {
                        ty,
                        n,
                        k,
                        bytes: &wm.bytes()[at..at + tile_len],
                    };
                    if with_kernel {
                        block(w, kernel, fmt, &a, 0..m, |_, v| {
                            std::hint::black_box(v);
                        });
                    } else {
                        with_tile(tile_bytes(w, fmt, &layout), |tile| {
                            drop(decode(w, fmt, &layout, tile));
                        });
                    }
                }
                best = best.min(t0.elapsed().as_secs_f64() / tiles as f64);
            }
            line += &format!(" | {name} {:6.2} us", best * 1e6);
        }
        println!("{line}");
    }
}

/// A dense projection through the tile path against its tiles' kernel alone: GOPS of
/// `GgmlMatrix::matmul` (4096x2048, 512 tokens, the pool's threads) and of one tile's kernel
/// on one thread.
/// `cargo test -p strata-kernels --release -- --ignored dense_matmul_timing --nocapture`.
#[test]
#[ignore = "timing, run by hand"]
fn dense_matmul_timing() {
    use std::time::Instant;
    let (n, k, m) = (4096, 2048, 512);
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
        let wm = matrix(ty, n, k, &mut 3);
        let x = rand_x(m * k, &mut 5);
        let mut out = vec![0.0f32; m * n];
        wm.matmul(&x, m, &mut out).unwrap();
        let mut best = f64::MAX;
        for _ in 0..20 {
            let t0 = Instant::now();
            wm.matmul(&x, m, &mut out).unwrap();
            best = best.min(t0.elapsed().as_secs_f64());
        }
        let gops = 2.0 * (n * k * m) as f64 / best / 1e9;
        println!(
            "{ty:>6}: matmul {:.2} ms, {gops:.0} GOPS on {} threads",
            best * 1e3,
            crate::pool::num_threads()
        );
    }
}
