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
mod tests;
