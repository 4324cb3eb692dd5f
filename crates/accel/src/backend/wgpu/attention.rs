//! Encoding [`Op::Attention`] and [`Op::MlaAttention`]: one workgroup per query row and
//! head, or, when those are too few to fill the device (a decoded token has one row), flash
//! decoding: the cached positions split into ranges, one workgroup per row, head and range
//! writing its partial softmax state, then one per row and head combining them.

use super::WgpuDevice;
use crate::device::{Buffer, WeightType};
use crate::{Error, Result};

/// Rows x heads from which attention runs one workgroup per row and head, unsplit.
const ROWS_WITHOUT_SPLIT: u32 = 512;

/// Partial states (row x head x range) one split dispatch may write: bounds the scratch
/// buffer at 8,192 x (512 + 2) f32 (16.8 MB at MLA's latent width, plus 1 MB of MLA's
/// queries in latent space).
const MAX_PARTIAL_STATES: u32 = 8192;

/// Positions per range at the finest split (a workgroup's chunk).
const MIN_SPAN: u32 = 64;

/// Query rows per workgroup of the tiled prefill kernel (`attention_tiles.wgsl`), which
/// takes heads whose width is a multiple of 16 up to 128 from that many rows on.
const TILE_ROWS: u32 = 16;

/// Whether attention over `n_tokens` rows of `head_dim` takes the tiled prefill kernel.
fn tiled(n_tokens: u32, head_dim: u32) -> bool {
    n_tokens >= TILE_ROWS && head_dim.is_multiple_of(16) && head_dim <= 128
}

/// The ranges of flash decoding over `ctx` cached positions for `rows` rows x heads: `(span,
/// splits)`, or `None` to run unsplit.
fn split_plan(rows: u32, n_heads: u32, ctx: u32, max_groups: u32) -> Option<(u32, u32)> {
    if rows >= ROWS_WITHOUT_SPLIT || ctx <= MIN_SPAN {
        return None;
    }
    let splits = ctx
        .div_ceil(MIN_SPAN)
        .min(MAX_PARTIAL_STATES / rows)
        .min(max_groups / n_heads);
    if splits < 2 {
        return None;
    }
    let span = ctx.div_ceil(splits);
    Some((span, ctx.div_ceil(span)))
}

/// What an attention kernel accumulates per row and head, and so the width of its partial
/// states: values (GQA, `head_dim` of them) or latents (MLA, `kv_lora`; split, MLA absorbs
/// each query into latent space in a pass of its own first).
#[derive(Clone, Copy)]
enum Accumulates {
    Values(u32),
    Latents(u32),
}

impl WgpuDevice {
    /// [`Op::Attention`]; `buffers` is `[q, k, v, out]`, `dims` is `[n_tokens, start_pos,
    /// n_heads, n_kv_heads, head_dim, window]`.
    pub(super) fn attention(
        &self,
        buffers: [&Buffer; 4],
        cache: WeightType,
        dims: [u32; 6],
        scale: f32,
    ) -> Result<()> {
        let [q, k, v, out] = buffers;
        let [_, _, n_heads, n_kv_heads, head_dim, _] = dims;
        if head_dim > 256 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
            return Err(Error::Shape {
                op: "attention",
                message: format!(
                    "head_dim {head_dim} (at most 256), {n_heads} heads over {n_kv_heads} kv heads"
                ),
            });
        }
        self.dispatch_attention(
            "attention",
            cache,
            &[
                (q, "queries"),
                (k, "key cache"),
                (v, "value cache"),
                (out, "attention output"),
            ],
            &dims,
            scale,
            Accumulates::Values(head_dim),
        )
    }

    /// [`Op::MlaAttention`]; `buffers` is `[q, latent, k_rope, kv_b, out]`, `dims` is
    /// `[n_tokens, start_pos, n_heads, kv_lora, nope, rope, v_dim]`.
    pub(super) fn mla_attention(
        &self,
        buffers: [&Buffer; 5],
        cache: WeightType,
        dims: [u32; 7],
        scale: f32,
    ) -> Result<()> {
        let [q, latent, k_rope, kv_b, out] = buffers;
        let [_, _, _, kv_lora, _, rope, _] = dims;
        if kv_lora > 512 || rope > 64 {
            return Err(Error::Shape {
                op: "mla attention",
                message: format!(
                    "latent rank {kv_lora} (at most 512), rotary dims {rope} (at most 64)"
                ),
            });
        }
        self.dispatch_attention(
            "mla_attention",
            cache,
            &[
                (q, "queries"),
                (latent, "latent cache"),
                (k_rope, "rotary key cache"),
                (kv_b, "kv_b_proj"),
                (out, "attention output"),
            ],
            &dims,
            scale,
            Accumulates::Latents(kv_lora),
        )
    }

    /// Dispatches an attention kernel for caches stored as `cache` (the kernel's WTYPE):
    /// its uniform words are the op's `dims` (`n_tokens, start_pos, n_heads` first), the
    /// softmax `scale`, then the split's span, ranges and pass (0 ranges, 1 merge, 2 MLA's
    /// query absorption). Prefill's rows of values go to the tiled kernel instead
    /// ([`tiled`]). Its bindings: `buffers` in order (each one binding, named in the
    /// error when it is not) and the scratch of partial states (what it `accumulates` per
    /// row, head and range, then for MLA each row and head's query in latent space).
    fn dispatch_attention(
        &self,
        kernel: &'static str,
        cache: WeightType,
        buffers: &[(&Buffer, &str)],
        dims: &[u32],
        scale: f32,
        accumulates: Accumulates,
    ) -> Result<()> {
        if !matches!(cache, WeightType::F32 | WeightType::F16) {
            return Err(Error::Unsupported(format!(
                "{kernel} over a {} cache",
                cache.name()
            )));
        }
        let mut bindings = buffers
            .iter()
            .map(|&(b, what)| self.single(b, what))
            .collect::<Result<Vec<_>>>()?;
        let (n_tokens, start_pos, n_heads) = (dims[0], dims[1], dims[2]);
        let words = |span: u32, splits: u32, merge: u32| -> Vec<u32> {
            let tail = [scale.to_bits(), span, splits, merge];
            dims.iter().copied().chain(tail).collect()
        };
        if let Accumulates::Values(head_dim) = accumulates
            && tiled(n_tokens, head_dim)
        {
            let groups = (n_heads, n_tokens.div_ceil(TILE_ROWS));
            return self.dispatch("attention_tiles", cache, &words(0, 0, 0), &bindings, groups);
        }
        let rows = n_heads * n_tokens;
        let max_groups = self.device.limits().max_compute_workgroups_per_dimension;
        let Some((span, splits)) = split_plan(rows, n_heads, start_pos + n_tokens, max_groups)
        else {
            bindings.push(&self.dummy);
            return self.dispatch(
                kernel,
                cache,
                &words(0, 0, 0),
                &bindings,
                (n_heads, n_tokens),
            );
        };
        let (width, q_lat) = match accumulates {
            Accumulates::Values(w) => (w, 0),
            Accumulates::Latents(w) => (w, rows * w),
        };
        let part = self.partials(u64::from(rows * splits * (width + 2) + q_lat) * 4)?;
        bindings.push(&part);
        if q_lat > 0 {
            let blocks = width.div_ceil(64);
            self.dispatch(
                kernel,
                cache,
                &words(span, splits, 2),
                &bindings,
                (n_heads * blocks, n_tokens),
            )?;
        }
        self.dispatch(
            kernel,
            cache,
            &words(span, splits, 0),
            &bindings,
            (n_heads * splits, n_tokens),
        )?;
        self.dispatch(
            kernel,
            cache,
            &words(span, splits, 1),
            &bindings,
            (n_heads, n_tokens),
        )
    }

    /// The scratch buffer of attention's partial states, at least `bytes` long, from the
    /// pool (within the device budget, like every other scratch buffer). Later dispatches
    /// reuse it (the queue orders them after the earlier ones' reads); a larger one replaces
    /// it, the old one kept alive by wgpu while recorded commands use it.
    fn partials(&self, bytes: u64) -> Result<wgpu::Buffer> {
        let mut slot = super::lock(&self.partials);
        if let Some(b) = &*slot
            && b.bytes() >= bytes
        {
            return Ok(self.single(b, "attention partial states")?.clone());
        }
        // The smaller one goes back to the pool first, so that it counts once.
        *slot = None;
        let b = self.alloc_buffer(bytes.next_power_of_two(), 0, "attention partial states")?;
        let raw = self.single(&b, "attention partial states")?.clone();
        *slot = Some(b);
        Ok(raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoding_splits_the_context_and_prefill_does_not() {
        // One decoded token of 32 heads over 544 positions: 9 ranges of 61.
        assert_eq!(split_plan(32, 32, 544, 65535), Some((61, 9)));
        // A 512-token prompt has rows enough; a short context needs no split.
        assert_eq!(split_plan(32 * 512, 32, 512, 65535), None);
        assert_eq!(split_plan(32, 32, 64, 65535), None);
        // The scratch bound: 256 rows x heads keep at most 32 ranges.
        assert_eq!(split_plan(256, 16, 100_000, 65535).map(|s| s.1), Some(32));
        // Every position lies in a range and no range is empty.
        for ctx in [65, 100, 544, 4097, 32_768] {
            let (span, splits) = split_plan(16, 16, ctx, 65535).unwrap();
            assert!(span * splits >= ctx && span * (splits - 1) < ctx, "{ctx}");
        }
    }
}
