//! The SSD tier against the model run from memory: GGUF fixtures with cache budgets down to
//! the minimum, so experts are evicted, read again, fetched ahead on wrong guesses and read
//! while others are evicted; the logits of a prefill and of token-by-token decode equal the
//! mapped model's bit for bit, under every replacement rule, with and without prefetch.

use std::path::{Path, PathBuf};

use strata_exec::{SsdOptions, attach_ssd_tier, ssd_min_budget};
use strata_model::{LogitsWanted, Model, Precision, SeqInput};
use strata_policy::replacement::Replacement;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures-gguf")
        .join(name)
}

/// Prefill `prompt` (all logits), then decode `next` one token at a time (last logits).
fn run(model: &Model, prompt: &[u32], next: &[u32]) -> strata_model::Result<Vec<Vec<f32>>> {
    let mut cache = model.new_cache();
    let mut out = Vec::new();
    let mut seqs = [SeqInput {
        tokens: prompt,
        cache: &mut cache,
        logits: LogitsWanted::All,
    }];
    out.push(model.forward(&mut seqs)?.remove(0));
    for tok in next {
        let mut seqs = [SeqInput {
            tokens: std::slice::from_ref(tok),
            cache: &mut cache,
            logits: LogitsWanted::Last,
        }];
        out.push(model.forward(&mut seqs)?.remove(0));
    }
    Ok(out)
}

fn bits(v: &[Vec<f32>]) -> Vec<Vec<u32>> {
    v.iter()
        .map(|r| r.iter().map(|x| x.to_bits()).collect())
        .collect()
}

const FIXTURES: [&str; 3] = [
    "qwen3_moe_q32.q8_0.gguf",
    "mixtral.q8_0.gguf",
    "deepseek_v3.q8_0.gguf",
];

#[test]
fn a_tiny_cache_gives_the_logits_of_the_model_run_from_memory() {
    let prompt: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 200).collect();
    let next: Vec<u32> = (0..12).map(|i| (i * 53 + 11) % 200).collect();
    for name in FIXTURES {
        let path = fixture(name);
        let model = Model::load(&path, Precision::Fast).unwrap();
        let want = bits(&run(&model, &prompt, &next).unwrap());
        let min = ssd_min_budget(&model, &path).unwrap();
        let rules = [
            Replacement::Lru,
            Replacement::Lfu,
            Replacement::Ema { alpha: 0.3 },
        ];
        // Reads through io_uring (where the kernel allows it) and on threads, both ways.
        for (budget, rule, prefetch, io_uring) in [
            (min, Replacement::Lru, true, true),
            (min, Replacement::Lru, true, false),
            (min, Replacement::Lfu, false, true),
            (min, Replacement::Lfu, false, false),
            (min + min / 2, rules[2], true, true),
            (4 * min, rules[1], true, false),
            (1 << 30, rules[0], true, true),
        ] {
            let mut model = Model::load(&path, Precision::Fast).unwrap();
            let opts = SsdOptions {
                budget,
                replacement: rule,
                prefetch,
                readers: 3,
                io_uring,
                ..SsdOptions::default()
            };
            let tier = attach_ssd_tier(&mut model, &path, &opts).unwrap();
            let got = bits(&run(&model, &prompt, &next).unwrap());
            let s = tier.stats();
            let what = format!(
                "{name}, budget {budget} ({} slots), {rule:?}, prefetch {prefetch}: {s:?}",
                s.slots
            );
            if io_uring && !s.io_uring {
                eprintln!("NOT CHECKED: io_uring refused here, {what}");
            }
            assert!(
                s.io_uring || !io_uring || tier.take_note().is_some(),
                "{what}"
            );
            assert!(io_uring || !s.io_uring, "{what}: io_uring though not asked");
            assert!(got == want, "{what}: logits differ from the mapped model's");
            assert!(s.misses > 0 && s.bytes_read > 0, "{what}: nothing was read");
            assert_eq!(s.lookups, s.hits + s.in_flight + s.misses, "{what}");
            assert!(s.slots_used <= s.slots, "{what}");
            if budget == min {
                // Slots for one token's experts only: experts are read again and again.
                assert!(s.misses > s.slots as u64 * 2, "{what}: no evictions");
            }
            // A guess may take a quarter of the slots.
            if prefetch && s.slots >= 4 {
                assert!(s.prefetched > 0, "{what}: nothing fetched ahead");
            } else if !prefetch {
                assert_eq!(s.prefetched, 0, "{what}");
            }
            // Every MoE layer but the first is guessed for; a guess names some experts right.
            if prefetch {
                assert!(s.guess_lookups > 0 && s.guess_lookups < s.lookups, "{what}");
                assert!(s.guessed > 0 && s.guessed <= s.guess_lookups, "{what}");
            } else {
                assert_eq!(s.guess_lookups, 0, "{what}");
            }
        }
    }
}

#[test]
fn a_budget_below_one_tokens_experts_is_refused_naming_the_minimum() {
    let path = fixture("qwen3_moe_q32.q8_0.gguf");
    let mut model = Model::load(&path, Precision::Fast).unwrap();
    let min = ssd_min_budget(&model, &path).unwrap();
    let opts = SsdOptions {
        budget: min - 1,
        ..SsdOptions::default()
    };
    let e = attach_ssd_tier(&mut model, &path, &opts)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("needs at least") && e.contains("--expert-cache"),
        "{e}"
    );
    // A model whose experts are in memory has nothing to read.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3_moe_bf16");
    let mut model = Model::load(&dir, Precision::Fast).unwrap();
    let e = attach_ssd_tier(&mut model, &path, &SsdOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("ggml blocks"), "{e}");
}

#[test]
fn pinned_experts_keep_their_slots_and_too_many_pins_are_refused() {
    let path = fixture("qwen3_moe_q32.q8_0.gguf");
    let prompt: Vec<u32> = (0..16).map(|i| (i * 29 + 3) % 200).collect();
    let next: Vec<u32> = (0..8).map(|i| (i * 41 + 7) % 200).collect();
    let model = Model::load(&path, Precision::Fast).unwrap();
    let want = bits(&run(&model, &prompt, &next).unwrap());
    let min = ssd_min_budget(&model, &path).unwrap();
    let slot = min / model.moe_routers()[0].top_k() as u64;
    let pinned = vec![(0, 0), (0, 1), (1, 0)];
    let mut model = Model::load(&path, Precision::Fast).unwrap();
    let opts = SsdOptions {
        budget: min + 3 * slot,
        pinned: pinned.clone(),
        ..SsdOptions::default()
    };
    let tier = attach_ssd_tier(&mut model, &path, &opts).unwrap();
    assert!(
        bits(&run(&model, &prompt, &next).unwrap()) == want,
        "pins change nothing"
    );
    assert!(tier.stats().misses > 0);
    let mut model = Model::load(&path, Precision::Fast).unwrap();
    let opts = SsdOptions {
        budget: min + 2 * slot,
        pinned,
        ..SsdOptions::default()
    };
    let e = attach_ssd_tier(&mut model, &path, &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("pinned"), "{e}");
}

/// A profile's hottest experts are read at start (their bytes not counted as any token's),
/// hit from the first token on, up to half the slots; the logits do not change.
#[test]
fn a_profiles_hottest_experts_are_read_at_start_and_hit() {
    let path = fixture("qwen3_moe_q32.q8_0.gguf");
    let prompt: Vec<u32> = (0..16).map(|i| (i * 29 + 3) % 200).collect();
    let next: Vec<u32> = (0..8).map(|i| (i * 41 + 7) % 200).collect();
    let model = Model::load(&path, Precision::Fast).unwrap();
    let want = bits(&run(&model, &prompt, &next).unwrap());
    let min = ssd_min_budget(&model, &path).unwrap();
    let slot = min / model.moe_routers()[0].top_k() as u64;
    let shape: Vec<usize> = model.moe_routers().iter().map(|r| r.n_experts()).collect();
    // Every expert used once, experts 0 and 1 of every layer most.
    let profile: Vec<Vec<u64>> = shape
        .iter()
        .map(|&n| (0..n).map(|e| if e < 2 { 100 } else { 1 }).collect())
        .collect();
    let budget = 4 * min;
    let n = (budget / slot) as usize;
    let mut model = Model::load(&path, Precision::Fast).unwrap();
    let opts = SsdOptions {
        budget,
        pin_profile: Some(profile.clone()),
        ..SsdOptions::default()
    };
    let tier = attach_ssd_tier(&mut model, &path, &opts).unwrap();
    let s = tier.stats();
    assert_eq!(s.pinned.experts, n / 2, "half the slots: {s:?}");
    assert!(s.pinned.bytes >= (n / 2) as u64 * slot / 2, "{s:?}");
    assert_eq!((s.bytes_read, s.misses, s.slots_used), (0, 0, n / 2));
    assert!(bits(&run(&model, &prompt, &next).unwrap()) == want);
    assert!(
        tier.stats().hits > 0,
        "pinned experts hit: {:?}",
        tier.stats()
    );
    // A profile of another model is refused, naming both shapes.
    let mut wrong = profile;
    wrong.pop();
    let mut model = Model::load(&path, Precision::Fast).unwrap();
    let opts = SsdOptions {
        budget,
        pin_profile: Some(wrong),
        ..SsdOptions::default()
    };
    let e = attach_ssd_tier(&mut model, &path, &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("pin profile"), "{e}");
}
