//! One generation step of one sequence: sample a token from the logits, detokenize it,
//! check the stop conditions, decide whether and why the sequence ends, and count it.
//!
//! [`SequenceState`] holds what a sequence carries between steps (its [`Sampler`], its
//! [`StreamDecoder`], the prompt and generated ids the penalties look at, its limits);
//! [`SequenceState::accept`] turns one row of logits into a [`StepOutcome`]. The batched
//! [`Engine`](crate::engine::Engine), the continuous-batching
//! [`Scheduler`](crate::scheduler::Scheduler) and the command line's single-device loops
//! all drive sequences through it, so they sample, stop, report text and count alike.
//!
//! A sequence may carry a [`Constraint`] (structured outputs, see [`crate::grammar`]): the
//! logits are masked by it before sampling, it advances with each sampled token, and the
//! sequence ends (`Stop`) as soon as the grammar is complete, without waiting for the model
//! to choose end-of-sequence. A [lazy](Grammar::lazy) grammar waits until the output holds
//! one of its triggers (a tool call's opening marker), then constrains from the trigger on.
//!
//! A key design decision made here is how tokens are counted, as OpenAI's API reports
//! `usage.completion_tokens` (and as the server always has): every sampled token counts,
//! including the one that completed a stop string (its text is cut at the stop string, but
//! the model generated it), except an end-of-sequence id, which ends the sequence without
//! being part of its output.

use crate::grammar::{Constraint, Grammar, GrammarError, GrammarStats};
use crate::sampling::{Sampler, SamplingError};
use crate::text::{StopReason, StreamDecoder, TextError, Tokenizer};

/// Why generation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// The model produced an end-of-sequence token or a stop string appeared.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The model's context is full.
    ContextFull,
}

/// A step that could not complete; the sequence cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The sampler refused the logits.
    #[error("sampling failed: {0}")]
    Sampling(#[from] SamplingError),
    /// The tokenizer could not decode the ids.
    #[error("detokenizing failed: {0}")]
    Text(#[from] TextError),
    /// The grammar engine failed.
    #[error("structured output failed: {0}")]
    Grammar(#[from] GrammarError),
}

/// Limits and options of one sequence.
#[derive(Debug, Clone, Copy)]
pub struct SequenceOptions<'a> {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Context length: prompt plus generated tokens.
    pub ctx_size: usize,
    /// Strings that end generation (not included in the text).
    pub stop: &'a [String],
    /// Keep generating past end-of-sequence ids.
    pub ignore_eos: bool,
    /// `Some(n)`: report each token's log-probability and the `n` most likely others.
    pub top_logprobs: Option<usize>,
    /// Special ids kept in the text although special tokens are skipped
    /// ([`StreamDecoder::keep_special`]).
    pub keep_special: &'a [u32],
}

/// Log-probabilities of one generated token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    /// The chosen token's log-probability.
    pub logprob: f32,
    /// The most likely tokens with theirs, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// A counted token of one step.
#[derive(Debug, Clone, PartialEq)]
pub struct StepToken {
    /// Token id.
    pub id: u32,
    /// Its log-probabilities, when the sequence asked for them.
    pub logprobs: Option<TokenLogprobs>,
}

/// What one step produced.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutcome {
    /// The sampled token, when it counts as generated (`None` for an end-of-sequence id).
    pub token: Option<StepToken>,
    /// Text completed by this step (possibly empty: text is held back while it may be the
    /// start of a stop string or an incomplete character).
    pub text: String,
    /// Set when the sequence ended with this step.
    pub finish: Option<FinishReason>,
    /// Text released because the sequence ended at a limit (what was held back); comes
    /// after `text`.
    pub tail: String,
}

/// A sequence between steps.
#[derive(Debug)]
pub struct SequenceState<'t> {
    sampler: Sampler,
    tokenizer: &'t Tokenizer,
    decoder: StreamDecoder<'t>,
    /// Prompt then generated ids: what the penalties look at.
    history: Vec<u32>,
    prompt_len: usize,
    max_tokens: usize,
    ctx_size: usize,
    top_logprobs: Option<usize>,
    finish: Option<FinishReason>,
    grammar: Option<Constraint>,
    /// A lazy grammar before its trigger.
    waiting: Option<Grammar>,
}

impl<'t> SequenceState<'t> {
    /// A sequence that continues `prompt`; an empty stop string is an error.
    pub fn new(
        tokenizer: &'t Tokenizer,
        sampler: Sampler,
        prompt: &[u32],
        opts: SequenceOptions<'_>,
    ) -> Result<Self, TextError> {
        let mut decoder = StreamDecoder::new(tokenizer, opts.stop, true)?;
        if opts.ignore_eos {
            decoder.set_stop_ids(&[]);
        }
        decoder.keep_special(opts.keep_special);
        let mut history = Vec::with_capacity(prompt.len() + opts.max_tokens.min(4096));
        history.extend_from_slice(prompt);
        Ok(SequenceState {
            sampler,
            tokenizer,
            decoder,
            history,
            prompt_len: prompt.len(),
            max_tokens: opts.max_tokens,
            ctx_size: opts.ctx_size,
            top_logprobs: opts.top_logprobs,
            finish: None,
            grammar: None,
            waiting: None,
        })
    }

    /// Constrains every later token to `grammar`, starting to compute its first mask now;
    /// a lazy grammar waits for its trigger in the output.
    pub fn constrain(&mut self, grammar: Grammar) -> Result<(), GrammarError> {
        if grammar.triggers().is_empty() {
            self.grammar = Some(grammar.start()?);
        } else {
            self.waiting = Some(grammar);
        }
        Ok(())
    }

    /// Starts the waiting lazy grammar if the output now holds one of its triggers, fed
    /// the output from the trigger on: the generated ids themselves where the trigger
    /// begins a token, else the text from the trigger re-encoded.
    fn start_at_trigger(&mut self) -> Result<(), TextError> {
        let Some(waiting) = &self.waiting else {
            return Ok(());
        };
        // A trigger spelled byte by byte takes as many tokens as it has bytes; one more
        // for a token that begins before it.
        let longest = waiting
            .triggers()
            .iter()
            .map(String::len)
            .max()
            .unwrap_or(0);
        let generated = self.generated();
        let window = &generated[generated.len().saturating_sub(longest + 1)..];
        let text = self.tokenizer.decode(window, false)?;
        let found = |text: &str| {
            waiting
                .triggers()
                .iter()
                .filter_map(|t| text.find(t.as_str()))
                .min()
        };
        if found(&text).is_none() {
            return Ok(());
        }
        // The token the trigger begins in: the shortest tail of the window that holds it.
        for start in (0..window.len()).rev() {
            let tail = self.tokenizer.decode(&window[start..], false)?;
            let Some(pos) = found(&tail) else {
                continue;
            };
            let ids = if pos == 0 {
                window[start..].to_vec()
            } else {
                self.tokenizer.encode(&tail[pos..], false)?
            };
            if let Some(grammar) = self.waiting.take() {
                // Output that goes on otherwise than the grammar allows stays free text,
                // as it would be without a grammar: a lazy grammar only narrows a call the
                // model has begun as the grammar's sentences begin.
                self.grammar = grammar.start_after(&ids).ok();
            }
            break;
        }
        Ok(())
    }

    /// Time spent on the grammar, if the sequence has one.
    pub fn grammar_stats(&self) -> Option<GrammarStats> {
        self.grammar.as_ref().map(Constraint::stats)
    }

    /// Samples the next token from `logits` (the model's output after the last token fed),
    /// detokenizes it and decides whether the sequence ends. Call it only while
    /// [`SequenceState::finish`] is `None`.
    pub fn accept(&mut self, logits: &[f32]) -> Result<StepOutcome, StepError> {
        let token = match self.grammar.as_mut() {
            Some(g) => {
                let masked = g.apply(logits)?;
                sample(&mut self.sampler, masked, &self.history, self.top_logprobs)?
            }
            None => sample(&mut self.sampler, logits, &self.history, self.top_logprobs)?,
        };
        let piece = self.decoder.push(token.id)?;
        let mut complete = false;
        let token = match piece.stop {
            Some(StopReason::Eos(_)) => None,
            _ => {
                if let Some(g) = self.grammar.as_mut() {
                    complete = g.commit(token.id)?;
                }
                self.history.push(token.id);
                self.start_at_trigger()?;
                Some(token)
            }
        };
        // With the token in the history, the cache holds every id but it: one more
        // position is needed to feed it.
        let finish = if piece.stop.is_some() || complete {
            Some(FinishReason::Stop)
        } else if self.generated().len() >= self.max_tokens {
            Some(FinishReason::Length)
        } else if self.history.len() >= self.ctx_size {
            Some(FinishReason::ContextFull)
        } else {
            None
        };
        // A completed grammar releases what the decoder held back (a stop string ends
        // with its text cut, an end-of-sequence id has flushed it already).
        let tail = match finish {
            Some(FinishReason::Length | FinishReason::ContextFull) => self.decoder.finish()?.text,
            Some(FinishReason::Stop) if piece.stop.is_none() => self.decoder.finish()?.text,
            _ => String::new(),
        };
        self.finish.clone_from(&finish);
        Ok(StepOutcome {
            token,
            text: piece.text,
            finish,
            tail,
        })
    }

    /// The generated ids so far (every counted token, see the module docs).
    pub fn generated(&self) -> &[u32] {
        &self.history[self.prompt_len..]
    }

    /// The id to feed the model next: the last one generated (or the prompt's last).
    pub fn next_input(&self) -> &[u32] {
        &self.history[self.history.len().saturating_sub(1)..]
    }

    /// Why the sequence ended, once it has.
    pub fn finish(&self) -> Option<&FinishReason> {
        self.finish.as_ref()
    }

    /// The generated ids, consuming the state.
    pub fn into_generated(mut self) -> Vec<u32> {
        self.history.split_off(self.prompt_len)
    }
}

/// Samples one token (with its log-probabilities when `top_logprobs` asks for them).
fn sample(
    sampler: &mut Sampler,
    logits: &[f32],
    history: &[u32],
    top_logprobs: Option<usize>,
) -> Result<StepToken, SamplingError> {
    Ok(match top_logprobs {
        Some(n) => {
            let s = sampler.sample_with_logprobs(logits, history, n)?;
            StepToken {
                id: s.id,
                logprobs: Some(TokenLogprobs {
                    logprob: s.logprob,
                    top: s.top,
                }),
            }
        }
        None => StepToken {
            id: sampler.sample(logits, history)?,
            logprobs: None,
        },
    })
}
