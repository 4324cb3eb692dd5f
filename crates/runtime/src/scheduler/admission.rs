//! Memory admission: the [`SchedulerConfig`] a front end's limits give on an engine, or a
//! refusal that says what it needs. `--max-batch` full contexts of KV cache and the prefix
//! cache must fit in the memory available now, so a full batch is never OOM-killed.
//! `strata serve`, `strata batch`, Python's `serve` and `LLM` all admit through here.

use super::SchedulerConfig;
use crate::engine::Engine;
use strata_model::backend::{CacheMemory, check_cache_memory, positions_that_fit};

/// How a front end spells its options in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spelling {
    /// `--max-batch` (the command line).
    Flags,
    /// `max_batch` (Python keyword arguments).
    Keywords,
}

impl Spelling {
    fn name(self, option: &str) -> String {
        match self {
            Spelling::Flags => format!("--{}", option.replace('_', "-")),
            Spelling::Keywords => option.to_string(),
        }
    }
}

/// What a front end asks of a scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerLimits {
    /// Most sequences decoded together.
    pub max_batch: usize,
    /// Most requests waiting for a place in the batch.
    pub max_queue: usize,
    /// Tokens per forward step.
    pub step_tokens: usize,
    /// Context per sequence; `None`: the model's, lowered to what fits.
    pub ctx_size: Option<usize>,
    /// Memory for the shared prefix cache in MiB (0 disables it).
    pub prefix_cache_mb: usize,
}

/// Limits that cannot be admitted.
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    /// A limit that must be positive is not (the message names it).
    #[error("{0}")]
    Invalid(String),
    /// The batch's contexts and the prefix cache do not fit in the memory available.
    #[error(transparent)]
    Memory(#[from] strata_model::Error),
}

impl SchedulerLimits {
    /// The checked configuration for `engine`. Without a context size, the model's is
    /// lowered (and logged) to what fits; a context that does not fit is refused with what
    /// it needs and which options lower it, spelled as `spelling` says.
    pub fn admit(
        &self,
        engine: &Engine,
        spelling: Spelling,
    ) -> Result<SchedulerConfig, AdmissionError> {
        for (option, v) in [
            ("max_batch", self.max_batch),
            ("max_queue", self.max_queue),
            ("step_tokens", self.step_tokens),
        ] {
            if v == 0 {
                return Err(AdmissionError::Invalid(format!(
                    "{} must be at least 1",
                    spelling.name(option)
                )));
            }
        }
        let max_ctx = engine.model.config().max_position_embeddings;
        let memory = engine.model.cache_memory();
        if let CacheMemory::Device {
            name, free: None, ..
        } = &memory
        {
            tracing::warn!(
                device = %name,
                "the device does not report its memory: the KV caches are not admitted \
                 against it (a --vram-budget has them checked)"
            );
        }
        let prefix_bytes = (self.prefix_cache_mb as u64).saturating_mul(1 << 20);
        let ctx_size = match self.ctx_size {
            Some(c) => c,
            None => {
                let fit = positions_that_fit(&memory, prefix_bytes)
                    .map_or(u64::MAX, |p| p / self.max_batch as u64);
                let ctx = (max_ctx as u64).min(fit) as usize;
                if ctx < max_ctx && ctx >= 2 {
                    tracing::info!(
                        ctx_size = ctx,
                        model_context = max_ctx,
                        max_batch = self.max_batch,
                        "context per sequence lowered to what fits in the available memory"
                    );
                }
                ctx.max(2)
            }
        };
        if !(2..=max_ctx).contains(&ctx_size) {
            return Err(AdmissionError::Invalid(format!(
                "{} must be between 2 and the model's context of {max_ctx}, got {ctx_size}",
                spelling.name("ctx_size")
            )));
        }
        let lower = format!(
            "lower {}, {} or {}",
            spelling.name("ctx_size"),
            spelling.name("max_batch"),
            spelling.name("prefix_cache_mb")
        );
        check_cache_memory(
            &memory,
            (ctx_size as u64).saturating_mul(self.max_batch as u64),
            prefix_bytes,
            &lower,
        )?;
        Ok(SchedulerConfig {
            max_batch: self.max_batch,
            max_queue: self.max_queue,
            step_tokens: self.step_tokens,
            ctx_size,
            prefix_cache_bytes: usize::try_from(prefix_bytes).unwrap_or(usize::MAX),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_named_as_the_front_end_spells_them() {
        assert_eq!(Spelling::Flags.name("prefix_cache_mb"), "--prefix-cache-mb");
        assert_eq!(
            Spelling::Keywords.name("prefix_cache_mb"),
            "prefix_cache_mb"
        );
    }
}
