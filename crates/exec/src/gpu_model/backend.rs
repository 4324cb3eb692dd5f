//! [`GpuModel`] as the engine's [`Backend`]: the scheduler's batches run through
//! [`GpuModel::forward_batch`], and the prefix cache (in host memory) copies rows out of and
//! into [`GpuCache`]s. So `strata serve`, `strata batch`, `strata generate` and Python's
//! `LLM` run on the accelerator with continuous batching, the prefix cache, tools and
//! structured outputs, through the same generation step as on the CPU.

use std::any::Any;
use std::sync::Arc;

use strata_model::backend::{Backend, BackendError, BatchSeq, CacheMemory, SeqCache, own_caches};
use strata_model::config::ModelConfig;
use strata_model::memory::kv_bytes_per_token;
use strata_model::{RoutingTap, check_rows};

use strata_accel::WeightType;

use super::{GpuCache, GpuModel, GpuSeq, f32s};

impl SeqCache for GpuCache {
    fn len(&self) -> usize {
        self.len
    }

    fn bytes(&self) -> usize {
        let buffers = self.k.iter().chain(&self.v).chain([&self.rope_table]);
        buffers.map(|b| b.bytes() as usize).sum()
    }

    fn layers(&self) -> usize {
        self.widths.len()
    }

    fn read_rows(&self, layer: usize, start: usize, end: usize) -> Option<(Vec<f32>, Vec<f32>)> {
        let &(wa, wb) = self.widths.get(layer)?;
        if start > end || end > self.len {
            return None;
        }
        let read = |buf, w: usize| {
            let row = self.kv_type.bytes(w);
            let bytes = self
                .dev
                .download(buf, start as u64 * row, (end - start) as u64 * row);
            bytes.ok().map(|b| match self.kv_type {
                WeightType::F16 => b
                    .chunks_exact(2)
                    .map(|h| half::f16::from_le_bytes([h[0], h[1]]).to_f32())
                    .collect(),
                _ => f32s(&b).collect(),
            })
        };
        Some((read(&self.k[layer], wa)?, read(&self.v[layer], wb)?))
    }

    fn extend(&mut self, n: usize, rows: &[(&[f32], &[f32])]) -> Result<(), BackendError> {
        check_rows(&self.widths, n, rows)?;
        if self.len + n > self.capacity {
            return Err(BackendError::new(format!(
                "kv cache extend: {} cached + {n} positions exceed the capacity of {}",
                self.len, self.capacity
            )));
        }
        for (layer, ((a, b), &(wa, wb))) in rows.iter().zip(&self.widths).enumerate() {
            let upload = |buf, w: usize, v: &[f32]| -> Result<(), BackendError> {
                let at = self.kv_type.bytes(self.len * w);
                let bytes = self.kv_type.encode(v).map_err(BackendError::new)?;
                self.dev
                    .upload(buf, at, &bytes)
                    .map_err(BackendError::new)?;
                Ok(())
            };
            upload(&self.k[layer], wa, a)?;
            upload(&self.v[layer], wb, b)?;
        }
        self.len += n;
        Ok(())
    }

    fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl Backend for GpuModel {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn device(&self) -> &'static str {
        "gpu"
    }

    fn new_cache(&self, ctx: usize) -> Result<Box<dyn SeqCache>, BackendError> {
        Ok(Box::new(
            GpuModel::new_cache(self, ctx).map_err(BackendError::new)?,
        ))
    }

    fn forward(&self, seqs: &mut [BatchSeq<'_>]) -> Result<Vec<Vec<f32>>, BackendError> {
        let mut inputs: Vec<GpuSeq<'_>> = own_caches::<GpuCache>(seqs, "gpu")?
            .into_iter()
            .map(|(tokens, cache, logits)| GpuSeq {
                tokens,
                cache,
                logits,
            })
            .collect();
        self.forward_batch(&mut inputs).map_err(BackendError::new)
    }

    fn set_routing_tap(&self, tap: Option<Arc<dyn RoutingTap>>) {
        match self.tap.write() {
            Ok(mut t) => *t = tap,
            Err(poisoned) => *poisoned.into_inner() = tap,
        }
    }

    fn cache_memory(&self) -> CacheMemory {
        let info = self.dev.info();
        let use_ = self.dev.memory();
        let total = match (info.memory, use_.budget) {
            (None, u64::MAX) => None,
            (memory, budget) => Some(memory.unwrap_or(u64::MAX).min(budget)),
        };
        CacheMemory::Device {
            name: info.name.clone(),
            // Values as the device stores them (kv_bytes_per_token counts f32), and each cache
            // also holds its rotary table, `dim` f32 values per position.
            kv_per_token: kv_bytes_per_token(&self.config) / 4 * self.kv_type.bytes(1)
                + (self.rope.dim() * 4) as u64,
            free: total.map(|t| t.saturating_sub(use_.live)),
        }
    }
}
