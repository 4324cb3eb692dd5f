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
        for (budget, rule, prefetch) in [
            (min, Replacement::Lru, true),
            (min, Replacement::Lfu, false),
            (min + min / 2, rules[2], true),
            (4 * min, rules[1], true),
            (1 << 30, rules[0], true),
        ] {
            let mut model = Model::load(&path, Precision::Fast).unwrap();
            let opts = SsdOptions {
                budget,
                replacement: rule,
                prefetch,
                readers: 3,
                ..SsdOptions::default()
            };
            let tier = attach_ssd_tier(&mut model, &path, &opts).unwrap();
            let got = bits(&run(&model, &prompt, &next).unwrap());
            let s = tier.stats();
            let what = format!(
                "{name}, budget {budget} ({} slots), {rule:?}, prefetch {prefetch}: {s:?}",
                s.slots
            );
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
