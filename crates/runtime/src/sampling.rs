//! Choosing the next token from the model's logits.
//!
//! [`SamplingParams`] holds the user's settings (validated by [`SamplingParams::validate`]);
//! a [`Sampler`] applies them to one sequence's logits step after step with its own seeded
//! random generator, and reports log-probabilities for the server ([`Sampled`]).
//!
//! The order of operations follows Hugging Face transformers and vLLM, whose OpenAI-style
//! parameters users tune against:
//! 1. penalties on the raw logits: repetition (`l / p` if `l > 0` else `l * p`, over the
//!    distinct ids of the history, as in transformers and llama.cpp), then presence and
//!    frequency (`l -= presence + count * frequency`, as in the OpenAI API);
//! 2. temperature 0 means greedy: the argmax, ties to the lowest id;
//! 3. temperature (`l / T`);
//! 4. top-k, 5. softmax, 6. top-p (the smallest set of most probable tokens whose mass
//!    reaches `p`), 7. min-p (drop tokens below `min_p` times the top probability);
//! 8. one draw from what is left, renormalised.
//!
//! llama.cpp applies temperature last, after the truncations, so there top-p and min-p see
//! the untempered distribution; we keep the transformers/vLLM order because the server
//! speaks their API.
//!
//! A key design decision made here is the random generator: ChaCha8 from `rand_chacha`
//! (already in the dependency tree through `tokenizers`), whose output for a seed is fixed
//! across versions and platforms, and uniforms built from its raw 64-bit output with our
//! own 53-bit conversion rather than `rand`'s distributions, whose algorithms may change
//! between releases: the same seed gives the same tokens on every machine and release.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

/// Errors of sampling: invalid settings, or logits with nothing to choose from.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    /// A setting is out of its range.
    #[error("invalid sampling parameter {name} = {value}: expected {expected}")]
    InvalidParam {
        /// The setting's name (`temperature`, `top_p`, ...).
        name: &'static str,
        /// Its value as given.
        value: String,
        /// The allowed range.
        expected: &'static str,
    },
    /// The logits slice is empty.
    #[error("no logits to sample from (empty vocabulary)")]
    EmptyLogits,
    /// Every logit is NaN or minus infinity after the penalties.
    #[error("all {len} logits are NaN or minus infinity: nothing to sample")]
    NoCandidates {
        /// Number of logits.
        len: usize,
    },
}

/// Sampling settings. The default samples from the full distribution at temperature 1.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature, `>= 0`; `0` picks the most likely token (greedy).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` keeps all.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`, in
    /// `(0, 1]`; `1` keeps all.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one, in `[0, 1]`; `0`
    /// keeps all.
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of ids in the history by this, `> 0`;
    /// `1` is off.
    pub repetition_penalty: f32,
    /// Subtract from the logit of every id present in the history, in `[-2, 2]`.
    pub presence_penalty: f32,
    /// Subtract this times the id's count in the history, in `[-2, 2]`.
    pub frequency_penalty: f32,
    /// Seed of the random generator; `None` draws one from the operating system's hasher
    /// keys (different every run).
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding: always the most likely token.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Checks every setting's range.
    pub fn validate(&self) -> Result<(), SamplingError> {
        fn check(
            name: &'static str,
            value: f32,
            ok: bool,
            expected: &'static str,
        ) -> Result<(), SamplingError> {
            if ok && value.is_finite() {
                Ok(())
            } else {
                Err(SamplingError::InvalidParam {
                    name,
                    value: value.to_string(),
                    expected,
                })
            }
        }
        let t = self.temperature;
        check("temperature", t, t >= 0.0, "a finite number >= 0")?;
        let p = self.top_p;
        check("top_p", p, p > 0.0 && p <= 1.0, "a number in (0, 1]")?;
        let m = self.min_p;
        check("min_p", m, (0.0..=1.0).contains(&m), "a number in [0, 1]")?;
        let r = self.repetition_penalty;
        check("repetition_penalty", r, r > 0.0, "a finite number > 0")?;
        let pp = self.presence_penalty;
        check(
            "presence_penalty",
            pp,
            (-2.0..=2.0).contains(&pp),
            "a number in [-2, 2]",
        )?;
        let f = self.frequency_penalty;
        check(
            "frequency_penalty",
            f,
            (-2.0..=2.0).contains(&f),
            "a number in [-2, 2]",
        )?;
        Ok(())
    }

    fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }
}

/// A chosen token with log-probabilities.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// The chosen id.
    pub id: u32,
    /// Its log-probability under the model's distribution (log-softmax of the raw
    /// logits, before penalties, temperature and truncation, as vLLM reports by default).
    pub logprob: f32,
    /// The most likely ids under the same distribution with their log-probabilities, most
    /// likely first (ties: lower id first).
    pub top: Vec<(u32, f32)>,
}

/// Samples tokens for one sequence; holds the random generator's state.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    /// Scratch: (id, logit or probability) of the tokens still in play.
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    /// A sampler with validated settings.
    pub fn new(params: SamplingParams) -> Result<Self, SamplingError> {
        params.validate()?;
        let seed = params.seed.unwrap_or_else(|| {
            // RandomState is keyed from the OS's randomness once per process and then
            // varied per instance: an unpredictable seed without another dependency.
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(0x5eed);
            h.finish()
        });
        Ok(Self {
            params,
            rng: ChaCha8Rng::seed_from_u64(seed),
            candidates: Vec::new(),
        })
    }

    /// The settings this sampler applies.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Chooses the next id from `logits` (one per vocabulary entry). `history` holds the
    /// ids the penalties look at (the caller decides: prompt and output, or output only);
    /// ids outside the vocabulary are ignored.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> Result<u32, SamplingError> {
        if logits.is_empty() {
            return Err(SamplingError::EmptyLogits);
        }
        if self.params.temperature == 0.0 && !self.params.has_penalties() {
            // Greedy without penalties needs no copy of the logits.
            return largest(logits, 1)
                .first()
                .filter(|&&(_, l)| l != f32::NEG_INFINITY)
                .map(|&(id, _)| id)
                .ok_or(SamplingError::NoCandidates { len: logits.len() });
        }
        self.candidates.clear();
        self.candidates
            .extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        if self.params.has_penalties() {
            apply_penalties(&mut self.candidates, history, &self.params);
        }
        self.candidates
            .retain(|&(_, l)| !l.is_nan() && l != f32::NEG_INFINITY);
        if self.candidates.is_empty() {
            return Err(SamplingError::NoCandidates { len: logits.len() });
        }
        if self.params.temperature == 0.0 {
            return Ok(argmax(&self.candidates));
        }
        let inv_t = 1.0 / self.params.temperature;
        for c in &mut self.candidates {
            c.1 *= inv_t;
        }
        let k = self.params.top_k;
        if k > 0 && k < self.candidates.len() {
            self.candidates.select_nth_unstable_by(k - 1, by_value_desc);
            self.candidates.truncate(k);
        }
        softmax_unnormalised(&mut self.candidates);
        if self.params.top_p < 1.0 {
            top_p(&mut self.candidates, self.params.top_p);
        }
        if self.params.min_p > 0.0 {
            let max = self.candidates.iter().map(|c| c.1).fold(0.0f32, f32::max);
            let threshold = self.params.min_p * max;
            self.candidates.retain(|&(_, p)| p >= threshold);
        }
        let total: f64 = self.candidates.iter().map(|c| f64::from(c.1)).sum();
        let target = self.uniform() * total;
        let mut acc = 0.0f64;
        for &(id, p) in &self.candidates {
            acc += f64::from(p);
            if acc > target {
                return Ok(id);
            }
        }
        // Rounding left `target` at the very end: the last candidate.
        Ok(self.candidates.last().map_or(0, |c| c.0))
    }

    /// [`Sampler::sample`], plus the chosen id's log-probability and the `top_n` most
    /// likely ids with theirs (see [`Sampled`] for which distribution).
    pub fn sample_with_logprobs(
        &mut self,
        logits: &[f32],
        history: &[u32],
        top_n: usize,
    ) -> Result<Sampled, SamplingError> {
        let id = self.sample(logits, history)?;
        let lse = log_sum_exp(logits);
        let logprob = |l: f32| {
            if l.is_nan() {
                f32::NEG_INFINITY
            } else {
                l - lse
            }
        };
        let mut top = largest(logits, top_n);
        for t in &mut top {
            t.1 = logprob(t.1);
        }
        Ok(Sampled {
            id,
            logprob: logprob(logits[id as usize]),
            top,
        })
    }

    /// A uniform number in [0, 1) with 53 random bits.
    fn uniform(&mut self) -> f64 {
        (self.rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Larger value first; equal values (`-0.0 == 0.0`): lower id first, so every truncation
/// is deterministic and agrees with greedy's tie rule. Values are never NaN here.
fn by_value_desc(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.partial_cmp(&a.1)
        .unwrap_or(Ordering::Equal)
        .then(a.0.cmp(&b.0))
}

/// The id of the largest value, ties to the lowest id. `candidates` is in id order.
fn argmax(candidates: &[(u32, f32)]) -> u32 {
    let mut best = candidates[0];
    for &c in &candidates[1..] {
        if c.1 > best.1 {
            best = c;
        }
    }
    best.0
}

/// Applies the penalties in place; `candidates[i]` must still hold id `i`.
fn apply_penalties(candidates: &mut [(u32, f32)], history: &[u32], params: &SamplingParams) {
    let mut counts: HashMap<u32, u32> = HashMap::with_capacity(history.len());
    for &id in history {
        if (id as usize) < candidates.len() {
            *counts.entry(id).or_default() += 1;
        }
    }
    let r = params.repetition_penalty;
    for (&id, &count) in &counts {
        let l = &mut candidates[id as usize].1;
        if r != 1.0 {
            *l = if *l > 0.0 { *l / r } else { *l * r };
        }
        *l -= params.presence_penalty + count as f32 * params.frequency_penalty;
    }
}

/// Replaces logits by `exp(l - max)` (probabilities up to a common factor). Logits of
/// plus infinity share all the mass.
fn softmax_unnormalised(candidates: &mut [(u32, f32)]) {
    let max = candidates
        .iter()
        .map(|c| c.1)
        .fold(f32::NEG_INFINITY, f32::max);
    for c in candidates {
        c.1 = if max == f32::INFINITY {
            f32::from(u8::from(c.1 == f32::INFINITY))
        } else {
            (c.1 - max).exp()
        };
    }
}

/// Keeps the smallest set of most likely candidates whose mass reaches `p` of the total,
/// sorted most likely first. Only candidates above a threshold are sorted: those below
/// `(1 - p) / (2n)` of the total weigh at most `(1 - p) / 2` together, so the kept set
/// always lies above it.
fn top_p(candidates: &mut Vec<(u32, f32)>, p: f32) {
    let total: f64 = candidates.iter().map(|c| f64::from(c.1)).sum();
    let floor = (1.0 - f64::from(p)) / (2.0 * candidates.len() as f64) * total;
    candidates.retain(|c| f64::from(c.1) >= floor);
    candidates.sort_unstable_by(by_value_desc);
    let target = f64::from(p) * total;
    let mut acc = 0.0f64;
    let mut keep = candidates.len();
    for (i, c) in candidates.iter().enumerate() {
        acc += f64::from(c.1);
        if acc >= target {
            keep = i + 1;
            break;
        }
    }
    candidates.truncate(keep.max(1));
}

/// `log(sum(exp(l)))` over the logits, NaN counted as minus infinity.
fn log_sum_exp(logits: &[f32]) -> f32 {
    let max = logits
        .iter()
        .filter(|l| !l.is_nan())
        .fold(f32::NEG_INFINITY, |m, &l| m.max(l));
    if !max.is_finite() {
        return max;
    }
    let sum: f64 = logits
        .iter()
        .filter(|l| !l.is_nan())
        .map(|&l| f64::from((l - max).exp()))
        .sum();
    max + sum.ln() as f32
}

/// The `n` largest logits with their ids, largest first (ties: lower id first), NaN
/// counted as minus infinity. One pass with a small sorted buffer: `n` is a handful.
fn largest(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    if n == 0 {
        return top;
    }
    for (i, &l) in logits.iter().enumerate() {
        let l = if l.is_nan() { f32::NEG_INFINITY } else { l };
        // Ids arrive in increasing order, so an equal value never displaces an earlier id.
        if top.len() == n && l <= top[n - 1].1 {
            continue;
        }
        let at = top.partition_point(|&(_, v)| v >= l);
        top.insert(at, (i as u32, l));
        top.truncate(n);
    }
    top
}

#[cfg(test)]
mod tests {
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
}
