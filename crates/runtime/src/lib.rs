//! Generation on top of a model on any backend ([`strata_model::backend::Backend`]: the
//! CPU's [`strata_model::Model`], or a device model): text in, tokens and text out.
//!
//! Its one job is the generation loop and what surrounds it: the tokenizer and chat
//! template ([`text`]), sampling ([`sampling`]), structured outputs ([`grammar`]), one
//! sequence's step ([`step::SequenceState`]: mask, sample, detokenize, stop strings, finish
//! reason, counting) and continuous batching ([`scheduler`]: the one generation loop, on its
//! own thread, with a shared [`prefix_cache::PrefixCache`] of prompt prefixes), which the
//! server, `strata batch`, `strata chat` and Python submit to, and which
//! [`scheduler::generate_batch`] runs a whole batch on. Every front end's sequences are
//! stepped through [`step`] by that loop, so they stop and count alike.
//!
//! ```
//! use std::path::Path;
//! use strata_model::Precision;
//! use strata_runtime::engine::Engine;
//! use strata_runtime::sampling::SamplingParams;
//! use strata_runtime::scheduler::{GenRequest, generate_batch};
//!
//! let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/strata-tiny-moe");
//! let engine = Engine::load(&dir, Precision::Fast)?;
//! let prompt = engine.text_prompt("Once upon a time")?;
//! let request = GenRequest::new(prompt, 32, SamplingParams::greedy());
//! let (outputs, stats) = generate_batch(&engine, &[request], |_, piece| print!("{piece}"))?;
//! assert!(!outputs[0].tokens.is_empty() && outputs[0].tokens.len() <= 32);
//! println!("\n{:?}: {:.1} tok/s", outputs[0].finish, stats.decode_tps());
//! # Ok::<(), strata_runtime::engine::EngineError>(())
//! ```
#![deny(missing_docs)]

pub mod engine;
pub mod grammar;
pub mod prefix_cache;
pub mod sampling;
pub mod scheduler;
pub mod step;
pub mod text;
