use super::*;
use crate::packed::tests::rand_vec;

const SHAPES: [(usize, usize, usize); 9] = [
    (3, 70, 128),
    (1, 1, 16),
    (3, 5, 16),
    (4, 4, 64),
    (5, 7, 128),
    (8, 17, 128),
    (13, 3, 64),
    (6, 9, 24),
    (2, 33, 7),
];

/// The scores on every path against plain sums in f64, and each query's scores the same bits
/// alone as among others (its tile's other rows do not touch it).
#[test]
fn scores_match_plain_sums_on_every_path() {
    let mut seed = 7;
    for (nq, nk, d) in SHAPES {
        let stride = d + 5;
        let q = rand_vec(nq * d, &mut seed);
        let keys = rand_vec(nk * stride, &mut seed);
        for isa in Isa::available() {
            let mut out = vec![f32::NAN; nq * nk];
            scores_on(isa, &q, nq, &keys, stride, nk, &mut out);
            for i in 0..nq {
                for j in 0..nk {
                    let (qi, kj) = (&q[i * d..][..d], &keys[j * stride..][..d]);
                    let want: f64 = qi.iter().zip(kj).map(|(a, b)| *a as f64 * *b as f64).sum();
                    let mag: f64 = qi.iter().zip(kj).map(|(a, b)| (a * b).abs() as f64).sum();
                    let got = out[i * nk + j] as f64;
                    assert!(
                        (got - want).abs() <= 1e-6 * mag + 1e-30,
                        "{isa:?} {nq}x{nk}x{d} at ({i}, {j}): {got} vs {want}"
                    );
                }
                let mut alone = vec![f32::NAN; nk];
                scores_on(isa, &q[i * d..][..d], 1, &keys, stride, nk, &mut alone);
                assert_eq!(
                    bits(&alone),
                    bits(&out[i * nk..][..nk]),
                    "{isa:?} {nq}x{nk}x{d}: query {i} alone"
                );
            }
        }
    }
}

/// The weighted sums on every path: bit for bit one fused multiply-add per row in order,
/// continued from the sums given.
#[test]
fn mix_is_one_fused_chain_per_value_on_every_path() {
    let mut seed = 11;
    for (nq, nk, d) in SHAPES.into_iter().chain([(5, 6, 150), (4, 2, 80)]) {
        let stride = d + 3;
        let p = rand_vec(nq * nk, &mut seed);
        let v = rand_vec(nk * stride, &mut seed);
        let start = rand_vec(nq * d, &mut seed);
        let mut want = start.clone();
        for i in 0..nq {
            for c in 0..d {
                let s = &mut want[i * d + c];
                for j in 0..nk {
                    *s = p[i * nk + j].mul_add(v[j * stride + c], *s);
                }
            }
        }
        for isa in Isa::available() {
            let mut out = start.clone();
            mix_on(isa, &p, nq, &v, stride, nk, &mut out);
            assert_eq!(bits(&out), bits(&want), "{isa:?} {nq}x{nk}x{d}");
        }
    }
}

/// `exp` within 2 ulp of the standard library's over the softmax's range, and
/// `exp_shifted` the same bits and sum on every path.
#[test]
fn exp_is_accurate_and_the_same_on_every_path() {
    for i in 0..=20_000 {
        let x = -87.0 + 87.5 * i as f32 / 20_000.0;
        let (got, want) = (exp(x), x.exp());
        assert!(
            (got - want).abs() <= 2.0 * f32::EPSILON * want,
            "exp({x}) = {got}, std {want}"
        );
    }
    assert_eq!(exp(-1e30), exp(EXP_MIN));
    assert_eq!(exp(f32::NEG_INFINITY), exp(EXP_MIN));
    assert_eq!(exp(0.0), 1.0);
    let mut seed = 3;
    for n in [0, 1, 15, 16, 17, 64, 100] {
        let x: Vec<f32> = rand_vec(n, &mut seed).iter().map(|v| v * 80.0).collect();
        let shift = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut want = x.clone();
        let want_sum = exp_shifted_ref(&mut want, shift);
        for isa in Isa::available() {
            let mut got = x.clone();
            let sum = exp_shifted_on(isa, &mut got, shift);
            assert_eq!(bits(&got), bits(&want), "{isa:?} n {n}");
            assert_eq!(sum.to_bits(), want_sum.to_bits(), "{isa:?} n {n} sum");
        }
        let plain: f32 = want.iter().sum();
        assert!((want_sum - plain).abs() <= 1e-5 * plain.max(1.0), "n {n}");
    }
}

/// Empty blocks: no queries, no keys, or rows of no values (a `k = 0` gemm).
#[test]
fn empty_blocks_give_empty_sums_on_every_path() {
    for isa in Isa::available() {
        let mut out = vec![f32::NAN; 6];
        scores_on(isa, &[], 2, &[], 0, 3, &mut out);
        assert_eq!(out, [0.0; 6], "{isa:?}");
        scores_on(isa, &[1.0; 32], 2, &[], 16, 0, &mut []);
        scores_on(isa, &[], 0, &[1.0; 16], 16, 1, &mut []);
        let mut sums = [2.0f32; 4];
        mix_on(isa, &[], 2, &[], 2, 0, &mut sums);
        mix_on(isa, &[0.5; 3], 3, &[], 0, 1, &mut []);
        assert_eq!(sums, [2.0; 4], "{isa:?}");
    }
}

/// A block whose last key would end past the cache is refused, naming the shape.
#[test]
#[should_panic(expected = "scores: 3 rows of 16 values, 20 apart, need 56 values, got 55")]
fn a_block_past_the_cache_is_refused() {
    let mut out = vec![0.0; 3];
    scores(&[0.0; 16], 1, &[0.0; 55], 20, 3, &mut out);
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn max_is_the_largest_value_with_nan_ignored() {
    let mut seed = 3;
    for len in [0usize, 1, 15, 16, 17, 40, 128] {
        let mut x = rand_vec(len, &mut seed);
        if len > 3 {
            x[2] = f32::NAN;
        }
        for init in [f32::NEG_INFINITY, 0.1, 5.0] {
            let want = x.iter().copied().fold(init, f32::max);
            assert_eq!(
                max(&x, init).to_bits(),
                want.to_bits(),
                "len {len} init {init}"
            );
            assert_eq!(
                max_body(&x, init).to_bits(),
                want.to_bits(),
                "len {len} portable"
            );
        }
    }
    assert!(max(&[f32::NAN; 20], f32::NAN).is_nan());
}
