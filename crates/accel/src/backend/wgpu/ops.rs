//! Encoding each [`Op`] as dispatches of its kernel: one function per op, each checking
//! the shapes its kernel supports and mapping the op's fields onto the kernel's uniform
//! words and bindings. Weights split across bindings (embedding tables, matrices, expert
//! slots) are dispatched once per chunk.
//!
//! The functions take the op's fields in the order `Op` declares them; where an op has
//! many, its buffers and its shape words are passed as arrays, destructured by name.

use super::WgpuDevice;
use super::pipeline::{linear_groups, rows_groups};
use crate::device::{
    Buffer, CacheWrite, ExpertFormat, ExpertSlots, MOE_GROUP_MAX_EXPERTS, Op, RopeKind, TopKParams,
    WeightType,
};
use crate::{Error, Result};

/// Fails unless rows of `k` values are whole blocks of `wtype` (the quantized kernels read
/// whole groups of 32).
fn check_rows(op: &'static str, wtype: WeightType, k: u32) -> Result<()> {
    if wtype.fits_row(k as usize) {
        return Ok(());
    }
    Err(Error::Shape {
        op,
        message: format!(
            "rows of {k} values are not whole {} blocks of {}",
            wtype.name(),
            wtype.block().0
        ),
    })
}

/// Tokens from which a quantized matmul takes the tiled kernel: one whole tile of 32 (below,
/// the row kernel's passes of 8 tokens waste no arithmetic on empty columns).
const TILE_MIN_TOKENS: u32 = 32;

/// Pairs per expert, on average, from which the grouped expert kernel takes tiles: half a
/// tile (each expert's last tile is partly empty; at decode's one pair per expert the
/// tiles would multiply 31 empty columns).
const TILE_MIN_PAIRS_PER_EXPERT: u32 = 16;

/// Rows (and tokens) of the tiled kernels' tiles (`quant/tile.wgsl`).
const TILE: u32 = 32;

/// Whether weights of `wtype` in rows of `k` values go through the kernels over blocks
/// (every quantized type; floats in rows of whole groups of 32, read as such groups),
/// rather than the float reference kernels that take rows of any length.
fn in_blocks(wtype: WeightType, k: u32) -> bool {
    wtype.is_quantized() || k.is_multiple_of(32)
}

/// A float as the uniform word the kernels read it from.
fn f(x: f32) -> u32 {
    x.to_bits()
}

impl WgpuDevice {
    /// Records `op`'s dispatches on the pending encoder.
    pub(super) fn encode(&self, op: &Op<'_>) -> Result<()> {
        match *op {
            Op::Embed {
                table,
                wtype,
                ids,
                out,
                rows,
                dim,
            } => self.embed(table, wtype, ids, out, rows, dim),
            Op::Matmul {
                x,
                w,
                wtype,
                bias,
                out,
                m,
                n,
                k,
            } => self.matmul(x, w, wtype, bias, out, [m, n, k]),
            Op::RmsNorm {
                x,
                residual,
                w,
                out,
                rows,
                dim,
                eps,
            } => self.rms_norm([x, w, out], residual, rows, dim, eps),
            Op::Rope {
                x,
                positions,
                table,
                rows,
                n_heads,
                head_stride,
                offset,
                half,
                kind,
                norm,
            } => self.rope(
                [x, positions, table],
                [rows, n_heads, head_stride, offset, half],
                kind,
                norm,
            ),
            Op::Attention {
                q,
                k,
                v,
                cache,
                out,
                n_tokens,
                start_pos,
                n_heads,
                n_kv_heads,
                head_dim,
                window,
                scale,
            } => self.attention(
                [q, k, v, out],
                cache,
                [n_tokens, start_pos, n_heads, n_kv_heads, head_dim, window],
                scale,
            ),
            Op::MlaAttention {
                q,
                latent,
                k_rope,
                cache,
                kv_b,
                out,
                n_tokens,
                start_pos,
                n_heads,
                kv_lora,
                nope,
                rope,
                v_dim,
                scale,
            } => self.mla_attention(
                [q, latent, k_rope, kv_b, out],
                cache,
                [n_tokens, start_pos, n_heads, kv_lora, nope, rope, v_dim],
                scale,
            ),
            Op::SiluMul { x, y, n } => self.silu_mul(x, y, n),
            Op::Add { x, y, gate, n, dim } => self.add(x, y, gate, n, dim),
            Op::TopK {
                logits,
                bias,
                ids,
                weights,
                tokens,
                params,
            } => self.topk(logits, bias, ids, weights, tokens, params),
            Op::ExpertFfn {
                x,
                slots,
                format,
                pairs,
                out,
                n_pairs,
                experts,
                stage,
            } => self.expert_ffn([x, pairs, out], slots, format, [n_pairs, experts, stage]),
            Op::MoeCombine {
                out,
                y,
                weights,
                pair_of,
                tokens,
                hidden,
                k,
                norm,
            } => self.moe_combine([out, y, weights, pair_of], [tokens, hidden, k], norm),
            Op::CacheStore { writes, cache } => self.cache_store(writes, cache),
            Op::CopyColumns {
                src,
                src_width,
                first,
                dst,
                width,
                rows,
            } => self.copy_columns([src, dst], [rows, src_width, first, width]),
            Op::MoeGroup {
                ids,
                pairs,
                pair_of,
                tokens,
                k,
                n_experts,
            } => self.moe_group([ids, pairs, pair_of], tokens, k, n_experts),
            Op::FmaPeak {
                out,
                workgroups,
                iters,
                half,
            } => self.fma_peak(out, workgroups, iters, half),
        }
    }

    /// [`Op::CacheStore`]: a copy each for an f32 cache, the packing kernel for an f16 one,
    /// two writes per dispatch.
    fn cache_store(&self, writes: &[CacheWrite], cache: WeightType) -> Result<()> {
        match cache {
            WeightType::F32 => {
                for w in writes {
                    self.copy_bytes(w.src, 4 * w.from, w.dst, 4 * w.at, 4 * w.n)?;
                }
                Ok(())
            }
            WeightType::F16 => {
                for pair in writes.chunks(2) {
                    let a = self.f16_write(&pair[0])?;
                    // A lone write binds its buffers twice and writes nothing second.
                    let b = match pair.get(1) {
                        Some(w) => self.f16_write(w)?,
                        None => F16Write { pairs: 0, ..a },
                    };
                    self.dispatch(
                        "cache_store",
                        WeightType::F32,
                        &[a.pairs, a.at, a.from, b.pairs, b.at, b.from],
                        &[a.src, a.dst, b.src, b.dst],
                        linear_groups(a.pairs as u64 + b.pairs as u64),
                    )?;
                }
                Ok(())
            }
            other => Err(Error::Unsupported(format!("a {} KV cache", other.name()))),
        }
    }

    /// One write into an f16 cache in the kernel's words, checked.
    fn f16_write<'b>(&'b self, w: &'b CacheWrite) -> Result<F16Write<'b>> {
        let (at, n) = (w.at, w.n);
        if !at.is_multiple_of(2) || !n.is_multiple_of(2) || 2 * (at + n) > w.dst.bytes() {
            return Err(Error::Shape {
                op: "cache_store",
                message: format!(
                    "{n} f16 values at {at} in a cache of {} bytes (both even, inside)",
                    w.dst.bytes()
                ),
            });
        }
        let word = |x: u64, what: &str| {
            u32::try_from(x).map_err(|_| Error::Limit {
                what: what.into(),
                got: x,
                limit: u32::MAX as u64,
            })
        };
        Ok(F16Write {
            src: self.single(w.src, "cache input")?,
            dst: self.single(w.dst, "f16 cache")?,
            pairs: word(n / 2, "f16 pairs stored at once")?,
            at: word(at / 2, "cache position")?,
            from: word(w.from, "source position")?,
        })
    }

    /// [`Op::CopyColumns`]; `dims` is `[rows, src_width, first, width]`.
    fn copy_columns(&self, [src, dst]: [&Buffer; 2], dims: [u32; 4]) -> Result<()> {
        let [rows, src_width, first, width] = dims;
        let (n, read) = (rows as u64 * width as u64, rows as u64 * src_width as u64);
        if first + width > src_width || 4 * read > src.bytes() || 4 * n > dst.bytes() {
            return Err(Error::Shape {
                op: "copy_columns",
                message: format!(
                    "columns {first}..{} of {rows} rows of {src_width} ({} bytes) into {} bytes",
                    first + width,
                    src.bytes(),
                    dst.bytes()
                ),
            });
        }
        self.dispatch(
            "copy_columns",
            WeightType::F32,
            &dims,
            &[
                self.single(src, "copied rows")?,
                self.single(dst, "copied columns")?,
            ],
            linear_groups(n),
        )
    }

    /// [`Op::MoeGroup`]: one workgroup; `buffers` is `[ids, pairs, pair_of]`.
    fn moe_group(&self, buffers: [&Buffer; 3], tokens: u32, k: u32, n_experts: u32) -> Result<()> {
        if n_experts > MOE_GROUP_MAX_EXPERTS {
            return Err(Error::Limit {
                what: "experts grouped on the device".into(),
                got: n_experts as u64,
                limit: MOE_GROUP_MAX_EXPERTS as u64,
            });
        }
        let [ids, pairs, pair_of] = buffers;
        self.dispatch(
            "moe_group",
            WeightType::F32,
            &[tokens * k, k, n_experts],
            &[
                self.single(ids, "expert ids")?,
                self.single(pairs, "expert pairs")?,
                self.single(pair_of, "pair index")?,
            ],
            (1, 1),
        )
    }

    /// [`Op::FmaPeak`]: the kernel in f16 (cached under [`WeightType::F16`]) or f32.
    fn fma_peak(&self, out: &Buffer, workgroups: u32, iters: u32, half: bool) -> Result<()> {
        if half && !self.info.shader_f16 {
            return Err(Error::Unsupported(format!(
                "f16 arithmetic on {}: the adapter lacks shader-f16",
                self.info.name
            )));
        }
        let need = workgroups as u64 * 64 * 4;
        if out.bytes() < need {
            return Err(Error::Shape {
                op: "fma_peak",
                message: format!("output of {} bytes, need {need}", out.bytes()),
            });
        }
        let wtype = if half {
            WeightType::F16
        } else {
            WeightType::F32
        };
        let out = self.single(out, "fma_peak output")?;
        let params = [iters, f(0.999), f(1e-3)];
        self.dispatch("fma_peak", wtype, &params, &[out], (workgroups, 1))
    }

    /// [`Op::Embed`]: one dispatch per chunk of the table, each gathering its rows.
    fn embed(
        &self,
        table: &Buffer,
        wtype: WeightType,
        ids: &Buffer,
        out: &Buffer,
        rows: u32,
        dim: u32,
    ) -> Result<()> {
        let t = self.raw(table)?;
        check_rows("embed", wtype, dim)?;
        let row_bytes = wtype.row_bytes(dim.max(1) as usize);
        let (ids, out) = (self.single(ids, "ids")?, self.single(out, "embed output")?);
        // A quantized table decodes a group of 32 per invocation.
        let per_row = if wtype.is_quantized() { dim / 32 } else { dim };
        for (ci, chunk) in t.chunks.iter().enumerate() {
            let r0 = (ci as u64 * (t.chunk_bytes / row_bytes)) as u32;
            let r1 = r0.saturating_add((chunk.size() / row_bytes) as u32);
            self.dispatch(
                if wtype.is_quantized() {
                    "embed_blocks"
                } else {
                    "embed"
                },
                wtype,
                &[rows, dim, r0, r1],
                &[chunk, ids, out],
                linear_groups(rows as u64 * per_row as u64),
            )?;
        }
        Ok(())
    }

    /// [`Op::Matmul`]: one dispatch per chunk of the weight, each computing its rows;
    /// `dims` is `[m, n, k]`.
    fn matmul(
        &self,
        x: &Buffer,
        w: &Buffer,
        wtype: WeightType,
        bias: Option<&Buffer>,
        out: &Buffer,
        dims: [u32; 3],
    ) -> Result<()> {
        let [m, n, k] = dims;
        let wr = self.raw(w)?;
        let (xb, ob) = (
            self.single(x, "matmul input")?,
            self.single(out, "matmul output")?,
        );
        let bb = self.single_or_dummy(bias, "bias")?;
        check_rows("matmul", wtype, k)?;
        // Rows per chunk: chunks are cut at whole rows that are whole words.
        let rows_per_chunk = wr.chunk_bytes / wtype.row_bytes(k.max(1) as usize);
        for (ci, chunk) in wr.chunks.iter().enumerate() {
            let n0 = ci as u64 * rows_per_chunk;
            if n0 >= n as u64 {
                break;
            }
            let n_rows = rows_per_chunk.min(n as u64 - n0) as u32;
            // Rows of blocks: tiles of 32 rows and tokens at many tokens, else one
            // workgroup per row; other float rows: 16x16 output tiles.
            let (name, groups) = if !in_blocks(wtype, k) {
                ("matmul", (n_rows.div_ceil(16), m.div_ceil(16)))
            } else if self.tiles && m >= TILE_MIN_TOKENS {
                ("matmul_tiles", (n_rows.div_ceil(TILE), m.div_ceil(TILE)))
            } else {
                ("matmul_rows", rows_groups(n_rows))
            };
            self.dispatch(
                name,
                wtype,
                &[m, k, n0 as u32, n_rows, n, bias.is_some() as u32],
                &[xb, chunk, bb, ob],
                groups,
            )?;
        }
        Ok(())
    }

    /// [`Op::RmsNorm`]; `buffers` is `[x, w, out]`.
    fn rms_norm(
        &self,
        [x, w, out]: [&Buffer; 3],
        residual: Option<&Buffer>,
        rows: u32,
        dim: u32,
        eps: f32,
    ) -> Result<()> {
        self.dispatch(
            "rms_norm",
            WeightType::F32,
            &[rows, dim, f(eps), residual.is_some() as u32],
            &[
                self.single(x, "rms_norm input")?,
                self.single(w, "rms_norm weight")?,
                self.single(out, "rms_norm output")?,
                self.single_or_dummy(residual, "residual")?,
            ],
            rows_groups(rows),
        )
    }

    /// [`Op::Rope`]; `buffers` is `[x, positions, table]`, `dims` is `[rows, n_heads,
    /// head_stride, offset, half]`. With a norm, one workgroup per head normalises and
    /// rotates it (one dispatch where a norm and a rotation took two).
    fn rope(
        &self,
        [x, positions, table]: [&Buffer; 3],
        dims: [u32; 5],
        kind: RopeKind,
        norm: Option<(&Buffer, f32)>,
    ) -> Result<()> {
        let [rows, n_heads, head_stride, offset, half] = dims;
        let mut params = vec![
            rows,
            n_heads,
            head_stride,
            offset,
            half,
            (kind == RopeKind::Interleaved) as u32,
        ];
        let mut buffers = vec![
            self.single(x, "rope data")?,
            self.single(positions, "positions")?,
            self.single(table, "rope table")?,
        ];
        let Some((w, eps)) = norm else {
            let groups = linear_groups(rows as u64 * n_heads as u64 * half as u64);
            return self.dispatch("rope", WeightType::F32, &params, &buffers, groups);
        };
        if offset + 2 * half > head_stride {
            return Err(Error::Shape {
                op: "rope",
                message: format!(
                    "{} rotated values from {offset} overrun heads of {head_stride}",
                    2 * half
                ),
            });
        }
        params.push(f(eps));
        buffers.push(self.single(w, "head norm weight")?);
        let groups = rows_groups(rows * n_heads);
        self.dispatch("head_norm_rope", WeightType::F32, &params, &buffers, groups)
    }

    /// [`Op::SiluMul`]: the elementwise kernel's mode 0.
    fn silu_mul(&self, x: &Buffer, y: &Buffer, n: u32) -> Result<()> {
        self.dispatch(
            "elementwise",
            WeightType::F32,
            &[n, 1, 0, 0],
            &[self.single(x, "gate")?, self.single(y, "up")?, &self.dummy],
            linear_groups(n as u64),
        )
    }

    /// [`Op::Add`]: the elementwise kernel's mode 1, gated when `gate` is given.
    fn add(&self, x: &Buffer, y: &Buffer, gate: Option<&Buffer>, n: u32, dim: u32) -> Result<()> {
        let g = self.single_or_dummy(gate, "gate")?;
        self.dispatch(
            "elementwise",
            WeightType::F32,
            &[n, dim.max(1), 1, gate.is_some() as u32],
            &[self.single(x, "sum")?, self.single(y, "addend")?, g],
            linear_groups(n as u64),
        )
    }

    /// [`Op::TopK`].
    fn topk(
        &self,
        logits: &Buffer,
        bias: Option<&Buffer>,
        ids: &Buffer,
        weights: &Buffer,
        tokens: u32,
        p: TopKParams,
    ) -> Result<()> {
        if p.n_experts > 256 || p.k == 0 || p.k > p.n_experts {
            return Err(Error::Shape {
                op: "topk",
                message: format!("top-{} of {} experts (at most 256)", p.k, p.n_experts),
            });
        }
        let (n_group, topk_group, top2) = p.groups.unwrap_or((1, 1, false));
        let b = self.single_or_dummy(bias, "router bias")?;
        self.dispatch(
            "topk",
            WeightType::F32,
            &[
                tokens,
                p.n_experts,
                p.k,
                p.sigmoid as u32,
                bias.is_some() as u32,
                n_group,
                topk_group,
                top2 as u32,
                p.norm as u32,
                f(p.scaling),
            ],
            &[
                self.single(logits, "router logits")?,
                b,
                self.single(ids, "expert ids")?,
                self.single(weights, "expert weights")?,
            ],
            rows_groups(tokens),
        )
    }

    /// [`Op::ExpertFfn`]: one dispatch per chunk of the slots, each serving the pairs
    /// whose slot it holds.
    /// `buffers` is `[x, pairs, out]`; `shape` is `[n_pairs, experts, stage]`.
    fn expert_ffn(
        &self,
        buffers: [&Buffer; 3],
        slots: &ExpertSlots,
        format: ExpertFormat,
        shape: [u32; 3],
    ) -> Result<()> {
        let [x, pairs, out] = buffers;
        let [n_pairs, experts, stage] = shape;
        format.check(slots.hidden, slots.inter)?;
        if format.bytes(slots.hidden, slots.inter) > slots.slot_bytes {
            return Err(Error::Shape {
                op: "expert ffn",
                message: format!(
                    "experts as {}/{} take {} bytes, more than a slot's {}",
                    format.gate_up.name(),
                    format.down.name(),
                    format.bytes(slots.hidden, slots.inter),
                    slots.slot_bytes
                ),
            });
        }
        let sr = self.raw(&slots.buffer)?;
        let slots_per_chunk = (sr.chunk_bytes / slots.slot_bytes) as u32;
        let wtype = format.stage_type(stage);
        let width = if stage == 0 {
            slots.inter
        } else {
            slots.hidden
        };
        let (xb, pb, ob) = (
            self.single(x, "expert input")?,
            self.single(pairs, "expert pairs")?,
            self.single(out, "expert output")?,
        );
        let [_, up_at, down_at] = format.offsets(slots.hidden, slots.inter);
        let (a_at, b_at) = if stage == 0 { (0, up_at) } else { (down_at, 0) };
        let k = if stage == 0 {
            slots.hidden
        } else {
            slots.inter
        };
        let blocks = in_blocks(wtype, k);
        let tiles = self.tiles
            && blocks
            && n_pairs >= TILE_MIN_PAIRS_PER_EXPERT * experts.clamp(1, slots.n_slots);
        for (ci, chunk) in sr.chunks.iter().enumerate() {
            let s0 = ci as u32 * slots_per_chunk;
            let (name, stride, groups) = if tiles {
                // Tiles of 32 output rows by 32 pairs (one expert's).
                (
                    "expert_tiles",
                    slots.slot_bytes,
                    (width.div_ceil(TILE), n_pairs.div_ceil(TILE)),
                )
            } else if blocks {
                // One workgroup per output row and 8 pairs (the kernel's TM).
                (
                    "expert_rows",
                    slots.slot_bytes,
                    (width, n_pairs.div_ceil(8)),
                )
            } else {
                // Elements: one invocation per output value.
                (
                    "expert_ffn",
                    slots.slot_bytes / wtype.block().1 as u64,
                    linear_groups(n_pairs as u64 * width as u64),
                )
            };
            self.dispatch(
                name,
                wtype,
                &[
                    n_pairs,
                    slots.hidden,
                    slots.inter,
                    stride as u32,
                    s0,
                    s0 + slots_per_chunk,
                    stage,
                    a_at as u32,
                    b_at as u32,
                ],
                &[xb, chunk, pb, ob],
                groups,
            )?;
        }
        Ok(())
    }

    /// [`Op::MoeCombine`]; `buffers` is `[out, y, weights, pair_of]`.
    fn moe_combine(
        &self,
        buffers: [&Buffer; 4],
        [tokens, hidden, k]: [u32; 3],
        norm: Option<(&Buffer, &Buffer, f32)>,
    ) -> Result<()> {
        let [out, y, weights, pair_of] = buffers;
        let mut bound = vec![
            self.single(out, "moe output")?,
            self.single(y, "expert outputs")?,
            self.single(weights, "expert weights")?,
            self.single(pair_of, "pair index")?,
        ];
        let Some((gain, normed, eps)) = norm else {
            let groups = linear_groups(tokens as u64 * hidden as u64);
            let params = [tokens, hidden, k];
            return self.dispatch("moe_combine", WeightType::F32, &params, &bound, groups);
        };
        if k > 64 {
            return Err(Error::Shape {
                op: "moe combine with norm",
                message: format!("{k} experts per token (at most 64)"),
            });
        }
        bound.push(self.single(gain, "norm weight")?);
        bound.push(self.single(normed, "norm output")?);
        let params = [tokens, hidden, k, f(eps)];
        let groups = rows_groups(tokens);
        self.dispatch("moe_combine_norm", WeightType::F32, &params, &bound, groups)
    }
}

/// One write of [`Op::CacheStore`] into an f16 cache: its bindings, and its pairs, cache
/// word and source element as the kernel takes them.
#[derive(Clone, Copy)]
struct F16Write<'b> {
    src: &'b wgpu::Buffer,
    dst: &'b wgpu::Buffer,
    pairs: u32,
    at: u32,
    from: u32,
}
