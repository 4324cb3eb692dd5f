//! What a generation engine runs its forward passes on: a [`Backend`] (the CPU's
//! [`Model`], or a model on an accelerator, `strata_exec::GpuModel`) and the per-sequence
//! caches it makes ([`SeqCache`]). The runtime's scheduler, prefix cache and engine step
//! any backend alike, so every `--device` gets continuous batching, the prefix cache, tools
//! and structured outputs from one generation step.
//!
//! A key design decision made here is that caches are trait objects that the backend that
//! made them downcasts: the scheduler holds one type of sequence whatever the device, and a
//! cache handed to a backend that did not make it is an error, not undefined behaviour.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use crate::config::ModelConfig;
use crate::memory::{MemoryPlan, available_bytes};
use crate::{KvCache, LogitsWanted, Model, RoutingTap, SeqInput};

/// An error from a backend (the model's, or the accelerator's), as it said it.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct BackendError(Box<dyn std::error::Error + Send + Sync>);

impl BackendError {
    /// Wraps a backend's own error (or a message).
    pub fn new(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> BackendError {
        BackendError(e.into())
    }
}

impl From<crate::Error> for BackendError {
    fn from(e: crate::Error) -> BackendError {
        BackendError::new(e)
    }
}

/// One sequence's KV cache, wherever it lives.
pub trait SeqCache: Send + fmt::Debug {
    /// Positions cached.
    fn len(&self) -> usize;
    /// Whether nothing is cached.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Bytes it holds.
    fn bytes(&self) -> usize;
    /// Layers it caches.
    fn layers(&self) -> usize;
    /// Layer `layer`'s two buffers for positions `start..end`, copied out (`None` when out
    /// of range): what the prefix cache keeps.
    fn read_rows(&self, layer: usize, start: usize, end: usize) -> Option<(Vec<f32>, Vec<f32>)>;
    /// Appends `n` positions computed elsewhere (the prefix cache's copy of an identical
    /// prefix): one `(a, b)` pair of `n` rows per layer, in layer order.
    fn extend(&mut self, n: usize, rows: &[(&[f32], &[f32])]) -> Result<(), BackendError>;
    /// Drops every position from `len` on.
    fn truncate(&mut self, len: usize);
    /// For the backend that made it.
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// One sequence's part of a batched forward pass on any backend.
#[derive(Debug)]
pub struct BatchSeq<'a> {
    /// New tokens to run.
    pub tokens: &'a [u32],
    /// The sequence's cache (made by the same backend); the new tokens are appended.
    pub cache: &'a mut dyn SeqCache,
    /// Which logits to return.
    pub logits: LogitsWanted,
}

/// Where a backend's KV caches live, and so what admission checks them against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheMemory {
    /// In host memory, beside the weights the plan copies.
    Host(MemoryPlan),
    /// In an accelerator's memory.
    Device {
        /// The device, for messages.
        name: String,
        /// Cache bytes per position of one sequence.
        kv_per_token: u64,
        /// Bytes the device can still allocate; `None` when neither the API nor a budget
        /// says (Mesa's lavapipe): the caches cannot be admitted against it.
        free: Option<u64>,
    },
}

impl CacheMemory {
    /// Cache bytes per position of one sequence.
    pub fn kv_per_token(&self) -> u64 {
        match self {
            CacheMemory::Host(plan) => plan.kv_per_token,
            CacheMemory::Device { kv_per_token, .. } => *kv_per_token,
        }
    }
}

/// Runs a model's forward passes for the engine.
pub trait Backend: Send + Sync + fmt::Debug {
    /// The model's configuration.
    fn config(&self) -> &ModelConfig;
    /// Where it runs, for logs and statistics (`cpu`, `gpu`).
    fn device(&self) -> &'static str;
    /// An empty cache for one sequence of up to `ctx` positions (a backend whose caches
    /// grow may ignore `ctx`).
    fn new_cache(&self, ctx: usize) -> Result<Box<dyn SeqCache>, BackendError>;
    /// Runs the new tokens of every sequence in one batch, appending to each cache; returns,
    /// per sequence, the logits it asked for, row-major `[rows, vocab]`.
    fn forward(&self, seqs: &mut [BatchSeq<'_>]) -> Result<Vec<Vec<f32>>, BackendError>;
    /// Where its caches live.
    fn cache_memory(&self) -> CacheMemory;
    /// Reports every later pass's routing to `tap` (`None` removes it): the server's live
    /// expert view.
    fn set_routing_tap(&self, tap: Option<Arc<dyn RoutingTap>>);
    /// The CPU model, for what only it has (the hybrid executor behind its MoE blocks).
    fn cpu_model_mut(&mut self) -> Option<&mut Model> {
        None
    }
}

/// One sequence of a batch with its cache as the backend's own type `C`.
pub type OwnSeq<'s, 'a, C> = (&'a [u32], &'s mut C, LogitsWanted);

/// The batch's caches as `backend`'s own type `C`; a cache that another backend made (a bug
/// in the caller) is an error naming it.
pub fn own_caches<'s, 'a, C: 'static>(
    seqs: &'s mut [BatchSeq<'a>],
    backend: &str,
) -> Result<Vec<OwnSeq<'s, 'a, C>>, BackendError> {
    seqs.iter_mut()
        .map(|s| {
            let cache = s.cache.as_any_mut().downcast_mut::<C>().ok_or_else(|| {
                BackendError::new(format!(
                    "a KV cache made by another backend was passed to the {backend} backend"
                ))
            })?;
            Ok((s.tokens, cache, s.logits))
        })
        .collect()
}

impl SeqCache for KvCache {
    fn len(&self) -> usize {
        KvCache::len(self)
    }

    fn bytes(&self) -> usize {
        KvCache::bytes(self)
    }

    fn layers(&self) -> usize {
        self.widths().len()
    }

    fn read_rows(&self, layer: usize, start: usize, end: usize) -> Option<(Vec<f32>, Vec<f32>)> {
        let (a, b) = self.rows(layer, start, end)?;
        Some((a.to_vec(), b.to_vec()))
    }

    fn extend(&mut self, n: usize, rows: &[(&[f32], &[f32])]) -> Result<(), BackendError> {
        Ok(KvCache::extend(self, n, rows.iter().copied())?)
    }

    fn truncate(&mut self, len: usize) {
        KvCache::truncate(self, len);
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl Backend for Model {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn device(&self) -> &'static str {
        "cpu"
    }

    fn new_cache(&self, _ctx: usize) -> Result<Box<dyn SeqCache>, BackendError> {
        Ok(Box::new(Model::new_cache(self)))
    }

    fn forward(&self, seqs: &mut [BatchSeq<'_>]) -> Result<Vec<Vec<f32>>, BackendError> {
        let mut inputs: Vec<SeqInput<'_>> = own_caches::<KvCache>(seqs, "cpu")?
            .into_iter()
            .map(|(tokens, cache, logits)| SeqInput {
                tokens,
                cache,
                logits,
            })
            .collect();
        Ok(Model::forward(self, &mut inputs)?)
    }

    fn cache_memory(&self) -> CacheMemory {
        CacheMemory::Host(self.memory())
    }

    fn set_routing_tap(&self, tap: Option<Arc<dyn RoutingTap>>) {
        Model::set_routing_tap(self, tap);
    }

    fn cpu_model_mut(&mut self) -> Option<&mut Model> {
        Some(self)
    }
}

/// Fails unless `positions` cached positions (all sequences) fit where `memory` says the
/// caches live, beside `host_extra` bytes of host memory (the prefix cache); `lower` says
/// which options lower the need. Passes when the host's free memory cannot be read.
pub fn check_cache_memory(
    memory: &CacheMemory,
    positions: u64,
    host_extra: u64,
    lower: &str,
) -> Result<(), crate::Error> {
    match memory {
        CacheMemory::Host(plan) => {
            let extra = host_extra.div_ceil(plan.kv_per_token.max(1));
            plan.check(positions.saturating_add(extra), lower)
        }
        CacheMemory::Device {
            name,
            kv_per_token,
            free,
        } => {
            let needs = kv_per_token.saturating_mul(positions);
            if let Some(free) = *free
                && needs > free
            {
                return Err(crate::Error::Memory(format!(
                    "not enough memory on {name}: the KV cache for {positions} positions needs \
                     {} and {} is free there; {lower}",
                    gib(needs),
                    gib(free)
                )));
            }
            if let Some(available) = available_bytes()
                && host_extra > available
            {
                return Err(crate::Error::Memory(format!(
                    "not enough memory: the prefix cache needs {} of host memory and {} is \
                     available; {lower}",
                    gib(host_extra),
                    gib(available)
                )));
            }
            Ok(())
        }
    }
}

/// Cached positions (all sequences together) that fit where `memory` says the caches live,
/// beside `host_extra` bytes of the host's (`None` when the free memory cannot be read).
pub fn positions_that_fit(memory: &CacheMemory, host_extra: u64) -> Option<u64> {
    match memory {
        CacheMemory::Host(plan) => available_bytes().map(|a| {
            plan.positions_that_fit(a)
                .saturating_sub(host_extra.div_ceil(plan.kv_per_token.max(1)))
        }),
        CacheMemory::Device {
            kv_per_token, free, ..
        } => free.map(|f| f / kv_per_token.max(&1)),
    }
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}
