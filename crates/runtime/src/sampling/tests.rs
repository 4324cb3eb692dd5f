use super::*;

/// A seeded pseudo-random logit vector (splitmix64), values in [-5, 5).
fn random_logits(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            ((z >> 40) as f32 / (1u64 << 24) as f32) * 10.0 - 5.0
        })
        .collect()
}

fn argmax_ref(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

fn sampler(params: SamplingParams) -> Sampler {
    Sampler::new(params).unwrap()
}

#[test]
fn greedy_is_argmax_with_ties_to_lowest_id() {
    let mut s = sampler(SamplingParams::greedy());
    for (n, seed) in [(1, 1), (2, 2), (7, 3), (1000, 4), (151_936, 5)] {
        let logits = random_logits(n, seed);
        assert_eq!(s.sample(&logits, &[]).unwrap(), argmax_ref(&logits));
    }
    assert_eq!(s.sample(&[1.0, 3.0, 3.0, 2.0], &[]).unwrap(), 1);
    assert_eq!(
        s.sample(&[f32::NAN, 0.5, f32::NEG_INFINITY], &[]).unwrap(),
        1
    );
}

#[test]
fn top_k_one_and_tiny_top_p_are_greedy() {
    for seed in 0..20u64 {
        let logits = random_logits(513, seed);
        let want = argmax_ref(&logits);
        let mut k1 = sampler(SamplingParams {
            top_k: 1,
            seed: Some(seed),
            ..SamplingParams::default()
        });
        let mut p0 = sampler(SamplingParams {
            top_p: 1e-6,
            temperature: 1.5,
            seed: Some(seed),
            ..SamplingParams::default()
        });
        assert_eq!(k1.sample(&logits, &[]).unwrap(), want);
        assert_eq!(p0.sample(&logits, &[]).unwrap(), want);
    }
    // Ties: the lowest id, as greedy.
    let mut k1 = sampler(SamplingParams {
        top_k: 1,
        seed: Some(1),
        ..SamplingParams::default()
    });
    assert_eq!(k1.sample(&[0.0, 2.0, 2.0], &[]).unwrap(), 1);
}

/// Draws `n` samples and returns each id's frequency.
fn frequencies(params: SamplingParams, logits: &[f32], n: usize) -> Vec<f64> {
    let mut s = sampler(params);
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..n {
        counts[s.sample(logits, &[]).unwrap() as usize] += 1;
    }
    counts.iter().map(|&c| c as f64 / n as f64).collect()
}

fn assert_close(got: &[f64], want: &[f64], tol: f64) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol,
            "id {i}: frequency {g}, expected {w} (all: {got:?})"
        );
    }
}

#[test]
fn temperature_one_matches_the_softmax() {
    // 100k draws: the standard error of a frequency is at most 0.0016; tolerance 0.008.
    let probs = [0.1, 0.2, 0.3, 0.4, 0.0];
    let logits: Vec<f32> = probs.iter().map(|&p: &f64| (p as f32).ln()).collect();
    let params = SamplingParams {
        seed: Some(7),
        ..SamplingParams::default()
    };
    assert_close(&frequencies(params, &logits, 100_000), &probs, 0.008);
}

#[test]
fn temperature_reshapes_the_distribution() {
    let logits = [0.0f32, 1.0, 2.0];
    let t = 2.0f64;
    let z: f64 = logits.iter().map(|&l| (f64::from(l) / t).exp()).sum();
    let want: Vec<f64> = logits
        .iter()
        .map(|&l| (f64::from(l) / t).exp() / z)
        .collect();
    let params = SamplingParams {
        temperature: 2.0,
        seed: Some(3),
        ..SamplingParams::default()
    };
    assert_close(&frequencies(params, &logits, 100_000), &want, 0.008);
}

#[test]
fn top_k_top_p_and_min_p_truncate_and_renormalise() {
    let probs = [0.05f64, 0.1, 0.15, 0.3, 0.4];
    let logits: Vec<f32> = probs.iter().map(|&p| (p as f32).ln()).collect();
    let base = SamplingParams {
        seed: Some(11),
        ..SamplingParams::default()
    };
    // top-k 2: ids 4 and 3, renormalised.
    let got = frequencies(
        SamplingParams {
            top_k: 2,
            ..base.clone()
        },
        &logits,
        50_000,
    );
    assert_close(&got, &[0.0, 0.0, 0.0, 0.3 / 0.7, 0.4 / 0.7], 0.01);
    // top-p 0.75: 0.4 + 0.3 = 0.7 < 0.75, so 0.15 joins.
    let got = frequencies(
        SamplingParams {
            top_p: 0.75,
            ..base.clone()
        },
        &logits,
        50_000,
    );
    assert_close(&got, &[0.0, 0.0, 0.15 / 0.85, 0.3 / 0.85, 0.4 / 0.85], 0.01);
    // min-p 0.3: keep p >= 0.12.
    let got = frequencies(
        SamplingParams {
            min_p: 0.3,
            ..base.clone()
        },
        &logits,
        50_000,
    );
    assert_close(&got, &[0.0, 0.0, 0.15 / 0.85, 0.3 / 0.85, 0.4 / 0.85], 0.01);
    // min-p 0.8: only the top token is left.
    let got = frequencies(SamplingParams { min_p: 0.8, ..base }, &logits, 1000);
    assert_eq!(got, [0.0, 0.0, 0.0, 0.0, 1.0]);
}

#[test]
fn top_p_matches_a_full_sort_on_a_large_vocabulary() {
    // The thresholded sort must keep exactly the nucleus a full sort keeps: with top-p
    // followed by min-p 0 and a fixed seed, compare against a plain implementation.
    let logits = random_logits(50_000, 99);
    for &p in &[0.05f32, 0.5, 0.9, 0.999] {
        let mut c: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        softmax_unnormalised(&mut c);
        let mut full = c.clone();
        full.sort_by(by_value_desc);
        let total: f64 = full.iter().map(|x| f64::from(x.1)).sum();
        let mut acc = 0.0;
        let keep = full
            .iter()
            .position(|x| {
                acc += f64::from(x.1);
                acc >= f64::from(p) * total
            })
            .unwrap()
            + 1;
        top_p(&mut c, p);
        assert_eq!(c.len(), keep, "top_p {p}");
        assert_eq!(c, full[..keep].to_vec(), "top_p {p}");
    }
}

#[test]
fn repetition_penalty_changes_the_choice() {
    let logits = [2.0f32, 1.8, -1.0, -1.1];
    let mut plain = sampler(SamplingParams::greedy());
    assert_eq!(plain.sample(&logits, &[0]).unwrap(), 0);
    let mut penalised = sampler(SamplingParams {
        repetition_penalty: 1.5,
        ..SamplingParams::greedy()
    });
    // 2.0 / 1.5 = 1.33 < 1.8.
    assert_eq!(penalised.sample(&logits, &[0, 0]).unwrap(), 1);
    // Negative logits are multiplied: -1.0 * 1.5 = -1.5 < -1.1.
    assert_eq!(penalised.sample(&logits[2..], &[0]).unwrap(), 1);
    // Ids outside the vocabulary are ignored.
    assert_eq!(penalised.sample(&logits, &[17, 400]).unwrap(), 0);
}

#[test]
fn presence_and_frequency_penalties() {
    let logits = [1.0f32, 0.7, 0.0];
    let mut presence = sampler(SamplingParams {
        presence_penalty: 0.5,
        ..SamplingParams::greedy()
    });
    assert_eq!(presence.sample(&logits, &[0]).unwrap(), 1);
    let mut frequency = sampler(SamplingParams {
        frequency_penalty: 0.2,
        ..SamplingParams::greedy()
    });
    // One occurrence: 0.8 > 0.7; two: 0.6 < 0.7.
    assert_eq!(frequency.sample(&logits, &[0]).unwrap(), 0);
    assert_eq!(frequency.sample(&logits, &[0, 0]).unwrap(), 1);
}

#[test]
fn same_seed_same_sequence() {
    let logits = random_logits(3000, 5);
    let params = SamplingParams {
        temperature: 0.9,
        top_k: 50,
        top_p: 0.95,
        min_p: 0.01,
        seed: Some(1234),
        ..SamplingParams::default()
    };
    let run = |params: SamplingParams| {
        let mut s = sampler(params);
        (0..200)
            .map(|_| s.sample(&logits, &[]).unwrap())
            .collect::<Vec<_>>()
    };
    let a = run(params.clone());
    assert_eq!(a, run(params.clone()));
    let b = run(SamplingParams {
        seed: Some(1235),
        ..params
    });
    assert_ne!(a, b);
    // The draws vary (this is not greedy in disguise).
    assert!(a.iter().any(|&x| x != a[0]));
}

#[test]
fn logprobs_are_the_raw_log_softmax() {
    let logits = [1.0f32, 3.0, 2.0, 3.0, f32::NAN];
    let mut s = sampler(SamplingParams::greedy());
    let out = s.sample_with_logprobs(&logits, &[], 3).unwrap();
    let lse = (1.0f64.exp() + 2.0 * 3.0f64.exp() + 2.0f64.exp()).ln() as f32;
    assert_eq!(out.id, 1);
    assert!((out.logprob - (3.0 - lse)).abs() < 1e-6);
    let ids: Vec<u32> = out.top.iter().map(|t| t.0).collect();
    assert_eq!(ids, [1, 3, 2]);
    assert!((out.top[2].1 - (2.0 - lse)).abs() < 1e-6);
    let probs: f32 = logits[..4].iter().map(|&l| (l - lse).exp()).sum();
    assert!((probs - 1.0).abs() < 1e-6);
    // More alternatives than ids: all of them; none asked: none.
    assert_eq!(
        s.sample_with_logprobs(&logits, &[], 10).unwrap().top.len(),
        5
    );
    assert!(
        s.sample_with_logprobs(&logits, &[], 0)
            .unwrap()
            .top
            .is_empty()
    );
    // Penalties change the choice, not the reported distribution.
    let mut p = sampler(SamplingParams {
        repetition_penalty: 10.0,
        ..SamplingParams::greedy()
    });
    let out = p.sample_with_logprobs(&logits, &[1, 3], 1).unwrap();
    assert_eq!(out.id, 2);
    assert!((out.logprob - (2.0 - lse)).abs() < 1e-6);
    assert_eq!(out.top[0].0, 1);
}

#[test]
fn invalid_params_are_rejected() {
    let bad = [
        SamplingParams {
            temperature: -0.1,
            ..SamplingParams::default()
        },
        SamplingParams {
            temperature: f32::NAN,
            ..SamplingParams::default()
        },
        SamplingParams {
            temperature: f32::INFINITY,
            ..SamplingParams::default()
        },
        SamplingParams {
            top_p: 0.0,
            ..SamplingParams::default()
        },
        SamplingParams {
            top_p: 1.01,
            ..SamplingParams::default()
        },
        SamplingParams {
            min_p: -0.01,
            ..SamplingParams::default()
        },
        SamplingParams {
            min_p: 1.5,
            ..SamplingParams::default()
        },
        SamplingParams {
            repetition_penalty: 0.0,
            ..SamplingParams::default()
        },
        SamplingParams {
            presence_penalty: 2.5,
            ..SamplingParams::default()
        },
        SamplingParams {
            frequency_penalty: -3.0,
            ..SamplingParams::default()
        },
    ];
    for params in bad {
        let err = Sampler::new(params.clone()).unwrap_err();
        assert!(
            matches!(err, SamplingError::InvalidParam { .. }),
            "{params:?}: {err}"
        );
    }
    let err = SamplingParams {
        top_p: 0.0,
        ..SamplingParams::default()
    }
    .validate()
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid sampling parameter top_p = 0: expected a number in (0, 1]"
    );
    assert!(SamplingParams::default().validate().is_ok());
    assert!(SamplingParams::greedy().validate().is_ok());
}

#[test]
fn largest_matches_a_full_sort() {
    for (len, seed) in [(0, 1), (1, 2), (5, 3), (17, 4), (1000, 5)] {
        // Quantised so that ties occur.
        let logits: Vec<f32> = random_logits(len, seed).iter().map(|l| l.round()).collect();
        let mut sorted: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        sorted.sort_by(by_value_desc);
        for n in [0, 1, 3, 7, 2000] {
            let want = &sorted[..n.min(len)];
            assert_eq!(largest(&logits, n), want, "len {len} n {n}");
        }
    }
}

#[test]
fn infinite_logits_take_all_the_mass() {
    let logits = [0.0, f32::INFINITY, 5.0, f32::INFINITY];
    let got = frequencies(
        SamplingParams {
            seed: Some(5),
            ..SamplingParams::default()
        },
        &logits,
        10_000,
    );
    assert_eq!(got[0] + got[2], 0.0);
    assert!((got[1] - 0.5).abs() < 0.03, "{got:?}");
    let mut greedy = sampler(SamplingParams::greedy());
    assert_eq!(greedy.sample(&logits, &[]).unwrap(), 1);
}

#[test]
fn nothing_to_sample_is_an_error() {
    let mut s = sampler(SamplingParams::default());
    assert_eq!(s.sample(&[], &[]), Err(SamplingError::EmptyLogits));
    assert_eq!(
        s.sample(&[f32::NAN, f32::NEG_INFINITY], &[]),
        Err(SamplingError::NoCandidates { len: 2 })
    );
}
