//! Several sequences per forward pass on the accelerator (`GpuModel::forward_batch`, which
//! the scheduler drives through the `Backend` trait): each sequence's logits equal the same
//! sequence run alone, with prompt chunks beside decodes and every `LogitsWanted`, for
//! grouped-query and latent (MLA) attention, dense and MoE layers; rows copied out of one
//! device cache and into another (the prefix cache's path) continue as the original; a
//! cache from another backend is refused.

mod common;

use std::path::{Path, PathBuf};

use common::default_gpu;
use strata_exec::{GpuModel, GpuSeq};
use strata_model::backend::{Backend, BatchSeq};
use strata_model::{LogitsWanted, Model, Precision};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

/// Three token sequences of different lengths within the fixture's vocabulary.
fn sequences(gpu: &GpuModel) -> [Vec<u32>; 3] {
    let v = gpu.config.vocab_size as u32;
    let seq = |n: u32, mul: u32| (0..n).map(|i| (i * mul + 7) % v).collect();
    [seq(13, 31), seq(5, 17), seq(9, 101)]
}

/// Logits of `tokens` alone: the prompt `tokens[..split]` at once, then token by token.
fn alone(gpu: &GpuModel, tokens: &[u32], split: usize) -> Vec<Vec<f32>> {
    let mut cache = gpu.new_cache(tokens.len()).unwrap();
    let mut out = vec![gpu.forward_last(&tokens[..split], &mut cache).unwrap()];
    for t in &tokens[split..] {
        out.push(
            gpu.forward_last(std::slice::from_ref(t), &mut cache)
                .unwrap(),
        );
    }
    out
}

fn max_rel(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let max_ref = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let err = got
        .iter()
        .zip(want)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    err / max_ref
}

/// Runs the three sequences together as a scheduler would: the first prompt in two
/// chunks (the first chunk wants no logits), the others whole, then decodes, while the
/// first is still prefilling beside them; compares every logits row with the alone runs.
fn check(name: &str) {
    let Some(dev) = default_gpu() else { return };
    let gpu = GpuModel::load(dev, &fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let seqs = sequences(&gpu);
    let splits = [8, 3, 6];
    let want: Vec<_> = seqs
        .iter()
        .zip(splits)
        .map(|(s, split)| alone(&gpu, s, split))
        .collect();
    let mut caches: Vec<_> = seqs
        .iter()
        .map(|s| gpu.new_cache(s.len()).unwrap())
        .collect();
    let mut fed = [0usize; 3];
    let mut got: Vec<Vec<Vec<f32>>> = vec![Vec::new(); 3];
    // Step 0: first chunk of sequence 0 (no logits) beside the prompts of 1 and 2.
    // Later steps: sequence 0's last prompt chunk, then one token of every sequence.
    let mut step = 0;
    while fed.iter().zip(&seqs).any(|(&f, s)| f < s.len()) {
        let mut batch = Vec::new();
        let mut who = Vec::new();
        for (i, cache) in caches.iter_mut().enumerate() {
            let (start, len) = (fed[i], seqs[i].len());
            if start == len {
                continue;
            }
            let end = match (i, step) {
                (0, 0) => 4,
                _ if start == 0 => splits[i],
                (0, 1) => splits[0],
                _ => start + 1,
            };
            let logits = if i == 0 && step == 0 {
                LogitsWanted::None
            } else {
                LogitsWanted::Last
            };
            batch.push(GpuSeq {
                tokens: &seqs[i][start..end],
                cache,
                logits,
            });
            who.push((i, end));
        }
        let out = gpu.forward_batch(&mut batch).unwrap();
        for ((i, end), logits) in who.into_iter().zip(out) {
            fed[i] = end;
            if !logits.is_empty() {
                got[i].push(logits);
            }
        }
        step += 1;
    }
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.len(), w.len(), "{name}: sequence {i}'s logits rows");
        for (row, (a, b)) in g.iter().zip(w).enumerate() {
            let e = max_rel(a, b);
            assert!(
                e <= 1e-5,
                "{name}: sequence {i} row {row}: {e:.2e} from alone"
            );
        }
    }
}

macro_rules! fixtures {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            check(stringify!($name));
        }
    )*};
}

fixtures!(llama, qwen3_moe, deepseek_v2);

/// What the prefix cache does on the device: rows read out of one cache and written into a
/// fresh one continue the sequence exactly as the original cache does; `LogitsWanted::All`
/// of a batch returns every row.
#[test]
fn rows_copied_between_device_caches_continue_the_sequence() {
    let Some(dev) = default_gpu() else { return };
    let gpu = GpuModel::load(dev, &fixture("deepseek_v2")).unwrap();
    let [tokens, other, _] = sequences(&gpu);
    let mut first = Backend::new_cache(&gpu, 32).unwrap();
    let mut side = Backend::new_cache(&gpu, 32).unwrap();
    let mut batch = [
        BatchSeq {
            tokens: &tokens[..10],
            cache: &mut *first,
            logits: LogitsWanted::None,
        },
        BatchSeq {
            tokens: &other,
            cache: &mut *side,
            logits: LogitsWanted::All,
        },
    ];
    let out = Backend::forward(&gpu, &mut batch).unwrap();
    let vocab = gpu.config.vocab_size;
    assert_eq!((out[0].len(), out[1].len()), (0, other.len() * vocab));

    let rows: Vec<_> = (0..first.layers())
        .map(|l| first.read_rows(l, 0, 10).unwrap())
        .collect();
    assert!(
        first.read_rows(0, 5, 11).is_none(),
        "past the cached positions"
    );
    let mut copy = Backend::new_cache(&gpu, 32).unwrap();
    let refs: Vec<(&[f32], &[f32])> = rows.iter().map(|(a, b)| (&a[..], &b[..])).collect();
    copy.extend(10, &refs).unwrap();
    assert_eq!(copy.len(), 10);
    let mut continued = Vec::new();
    for cache in [&mut first, &mut copy] {
        let mut next = [BatchSeq {
            tokens: &tokens[10..],
            cache: &mut **cache,
            logits: LogitsWanted::All,
        }];
        continued.push(Backend::forward(&gpu, &mut next).unwrap().remove(0));
    }
    assert_eq!(continued[0].len(), (tokens.len() - 10) * vocab);
    assert_eq!(
        continued[0], continued[1],
        "the copied rows continue as the original"
    );
}

/// A cache made by the CPU model is refused by the GPU backend with a message, and one
/// made by the GPU by the CPU model.
#[test]
fn a_cache_from_another_backend_is_an_error() {
    let Some(dev) = default_gpu() else { return };
    let dir = fixture("llama");
    let gpu = GpuModel::load(dev, &dir).unwrap();
    let cpu = Model::load(&dir, Precision::F32).unwrap();
    for (backend, other) in [(&gpu as &dyn Backend, &cpu as &dyn Backend), (&cpu, &gpu)] {
        let mut cache = other.new_cache(8).unwrap();
        let mut batch = [BatchSeq {
            tokens: &[1, 2],
            cache: &mut *cache,
            logits: LogitsWanted::Last,
        }];
        let e = backend.forward(&mut batch).unwrap_err().to_string();
        assert!(e.contains("made by another backend"), "{e}");
    }
}
