//! The forward pass of [`GpuModel`]: the layer graph's steps ([`strata_model::Decoder`]),
//! kernel by kernel on its device, driven by [`strata_model::forward_pass`] as the CPU's are.

use std::ops::Range;

use strata_accel::{Buffer, CacheWrite, ExpertFormat, ExpertSlots, Op, RopeKind};
use strata_model::config::{GqaConfig, MlaConfig, MoeConfig, RopeStyle};
use strata_model::{Decoder, LogitsWanted, Norm, Routing, SeqSpan, forward_pass};

use strata_model::moe::MoeBlock;

use super::hybrid::HostLayer;
use super::{Attn, Ffn, GpuCache, GpuModel, GpuSeq, Matrix, Mlp, Moe, Routed, f32s, u32s};
use crate::{DeferredExperts, Error, Result};

/// Activations on the device: `n` rows.
pub(super) struct Rows {
    buf: Buffer,
    n: usize,
}

impl GpuModel {
    pub(super) fn scratch(&self, n: usize, label: &str) -> Result<Buffer> {
        Ok(self.dev.alloc(n as u64 * 4, 0, label)?)
    }

    fn matmul(&self, x: &Buffer, w: &Matrix, m: usize) -> Result<Buffer> {
        let out = self.scratch(m * w.n, "matmul output")?;
        self.dev.enqueue(&Op::Matmul {
            x,
            w: &w.buf,
            wtype: w.wtype,
            bias: w.bias.as_ref(),
            out: &out,
            m: m as u32,
            n: w.n as u32,
            k: w.k as u32,
        })?;
        Ok(out)
    }

    /// `x` normalised with the gain `w` into a new buffer; with `residual`, `x += residual`
    /// first, in place and in the same dispatch.
    fn rms_norm(
        &self,
        (x, residual): (&Buffer, Option<&Buffer>),
        w: &Buffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<Buffer> {
        let out = self.scratch(rows * dim, "norm output")?;
        self.dev.enqueue(&Op::RmsNorm {
            x,
            residual,
            w,
            out: &out,
            rows: rows as u32,
            dim: dim as u32,
            eps,
        })?;
        Ok(out)
    }

    /// The gain of the norm `norm` names.
    fn norm_weight(&self, norm: Norm) -> &Buffer {
        match norm {
            Norm::Attention(i) => &self.layers[i].attn_norm,
            Norm::Ffn(i) => &self.layers[i].ffn_norm,
            Norm::Final => &self.norm,
        }
    }

    /// `down(silu(gate x) * up x)`.
    fn mlp(&self, x: &Buffer, m: &Mlp, t: usize) -> Result<Buffer> {
        let g = self.matmul(x, &m.gate, t)?;
        let u = self.matmul(x, &m.up, t)?;
        self.dev.enqueue(&Op::SiluMul {
            x: &g,
            y: &u,
            n: (t * m.gate.n) as u32,
        })?;
        self.matmul(&g, &m.down, t)
    }

    /// `x += y`, both `[rows, hidden]`.
    pub(super) fn add(&self, x: &Buffer, y: &Buffer, rows: usize) -> Result<()> {
        let h = self.config.hidden_size;
        Ok(self.dev.enqueue(&Op::Add {
            x,
            y,
            gate: None,
            n: (rows * h) as u32,
            dim: h as u32,
        })?)
    }

    /// Runs `tokens` through the model after the cached positions, appending to `cache`;
    /// returns the logits of every new position, `[tokens, vocab]`.
    pub fn forward(&self, tokens: &[u32], cache: &mut GpuCache) -> Result<Vec<f32>> {
        self.forward_one(tokens, cache, LogitsWanted::All)
    }

    /// [`GpuModel::forward`] returning only the last position's logits `[vocab]`
    /// (generation: the LM head runs on one row).
    pub fn forward_last(&self, tokens: &[u32], cache: &mut GpuCache) -> Result<Vec<f32>> {
        self.forward_one(tokens, cache, LogitsWanted::Last)
    }

    fn forward_one(
        &self,
        tokens: &[u32],
        cache: &mut GpuCache,
        logits: LogitsWanted,
    ) -> Result<Vec<f32>> {
        let mut seqs = [GpuSeq {
            tokens,
            cache,
            logits,
        }];
        Ok(self.forward_batch(&mut seqs)?.remove(0))
    }

    /// Runs the new tokens of every sequence in one batch (their rows stacked through every
    /// matrix, norm and expert; attention per sequence over its own cache), appending to
    /// each cache; returns, per sequence, the logits it asked for, `[rows, vocab]`.
    pub fn forward_batch(&self, seqs: &mut [GpuSeq<'_>]) -> Result<Vec<Vec<f32>>> {
        let v = self.config.vocab_size;
        for s in seqs.iter() {
            if let Some(&bad) = s.tokens.iter().find(|&&id| id as usize >= v) {
                return Err(Error::Shape {
                    op: "forward",
                    message: format!("token id {bad} is out of range for a vocabulary of {v}"),
                });
            }
            let (len, t, cap) = (s.cache.len, s.tokens.len(), s.cache.capacity);
            if len + t > cap {
                return Err(Error::Shape {
                    op: "forward",
                    message: format!(
                        "{len} cached + {t} new positions exceed the cache capacity of {cap}"
                    ),
                });
            }
        }
        let t: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        if t == 0 {
            return Ok(vec![Vec::new(); seqs.len()]);
        }
        let dev = &*self.dev;
        let ids = dev.alloc(t as u64 * 4, 0, "token ids")?;
        dev.upload(
            &ids,
            0,
            &u32_bytes(seqs.iter().flat_map(|s| s.tokens.iter().copied())),
        )?;
        let pos = dev.alloc(t as u64 * 4, 0, "positions")?;
        let positions = seqs
            .iter()
            .flat_map(|s| (s.cache.len..s.cache.len + s.tokens.len()).map(|p| p as u32));
        dev.upload(&pos, 0, &u32_bytes(positions))?;
        let mut row = 0;
        let mut parts = Vec::with_capacity(seqs.len());
        for s in seqs.iter_mut() {
            let n = s.tokens.len();
            parts.push(Part {
                cache: &mut *s.cache,
                row,
                n,
                wanted: match s.logits {
                    LogitsWanted::All => 0..n,
                    LogitsWanted::Last => n.saturating_sub(1)..n,
                    LogitsWanted::None => 0..0,
                },
            });
            row += n;
        }
        let mut pass = GpuPass {
            m: self,
            parts,
            ids,
            pos,
            t,
            deferred: None,
        };
        let mut out = forward_pass(&self.graph, &mut pass)?.into_iter();
        let all = match out.next() {
            Some(rows) => dev.download(&rows.buf, 0, (rows.n * v * 4) as u64)?,
            None => Vec::new(),
        };
        let mut values = f32s(&all);
        let logits = pass.parts.iter().map(|part| {
            let n = part.wanted.len() * v;
            values.by_ref().take(n).collect()
        });
        Ok(logits.collect())
    }

    /// Rotates `heads` heads of `stride` values per row of `x`, from `offset` on; with
    /// `norm`, RMS-normalises each head with that gain first, in the same dispatch.
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        x: &Buffer,
        pos: &Buffer,
        table: &Buffer,
        t: usize,
        heads: usize,
        stride: usize,
        offset: usize,
        norm: Option<&Buffer>,
    ) -> Result<()> {
        Ok(self.dev.enqueue(&Op::Rope {
            x,
            positions: pos,
            table,
            rows: t as u32,
            n_heads: heads as u32,
            head_stride: stride as u32,
            offset: offset as u32,
            half: (self.rope.dim() / 2) as u32,
            kind: match self.config.rope.style {
                RopeStyle::Neox => RopeKind::Neox,
                RopeStyle::Interleaved => RopeKind::Interleaved,
            },
            norm: norm.map(|w| (w, self.eps)),
        })?)
    }

    /// `x += ` the shared experts of `moe` on `hs` (gated where the block gates them).
    pub(super) fn shared_experts(
        &self,
        x: &Buffer,
        hs: &Buffer,
        moe: &Moe,
        t: usize,
    ) -> Result<()> {
        let h = self.config.hidden_size;
        if let Some(shared) = &moe.shared {
            let y = self.mlp(hs, shared, t)?;
            let gate = match &moe.shared_gate {
                Some(g) => Some(self.matmul(hs, g, t)?),
                None => None,
            };
            self.dev.enqueue(&Op::Add {
                x,
                y: &y,
                gate: gate.as_ref(),
                n: (t * h) as u32,
                dim: h as u32,
            })?;
        }
        Ok(())
    }

    /// The router of `moe` on `hs`: each row's `k` expert ids and weights, on the device.
    pub(super) fn route(&self, hs: &Buffer, moe: &Moe, t: usize) -> Result<(Buffer, Buffer)> {
        let k = moe.params.k as usize;
        let logits = self.matmul(hs, &moe.router, t)?;
        let ids = self.scratch(t * k, "expert ids")?;
        let weights = self.scratch(t * k, "expert weights")?;
        self.dev.enqueue(&Op::TopK {
            logits: &logits,
            bias: moe.correction_bias.as_ref(),
            ids: &ids,
            weights: &weights,
            tokens: t as u32,
            params: moe.params,
        })?;
        Ok((ids, weights))
    }

    /// The MoE block of layer `li` with its routed experts on the device: `x += ` its
    /// output on `hs`, with no host round trip; with `norm` (a gain and an output), the
    /// updated rows' RMSNorm too, in the last dispatch.
    #[allow(clippy::too_many_arguments)]
    fn moe_on_device(
        &self,
        li: usize,
        x: &Buffer,
        hs: &Buffer,
        moe: &Moe,
        (slots, format): (&ExpertSlots, ExpertFormat),
        t: usize,
        norm: Option<(&Buffer, &Buffer)>,
    ) -> Result<()> {
        let dev = &*self.dev;
        let k = moe.params.k as usize;
        let h = self.config.hidden_size;
        self.shared_experts(x, hs, moe, t)?;
        let (ids, weights) = self.route(hs, moe, t)?;
        // Grouped by expert on the device: no round trip to the host inside a step.
        let n = t * k;
        let pairs = self.scratch(2 * n, "expert pairs")?;
        let pair_of = self.scratch(n, "pair index")?;
        dev.enqueue(&Op::MoeGroup {
            ids: &ids,
            pairs: &pairs,
            pair_of: &pair_of,
            tokens: t as u32,
            k: k as u32,
            n_experts: moe.params.n_experts,
        })?;
        self.report_routing(li, &ids, &weights, n, k)?;
        let inter = slots.inter as usize;
        let act = self.scratch(t * k * inter, "expert activations")?;
        let y = self.scratch(t * k * h, "expert outputs")?;
        for (stage, input, out) in [(0, hs, &act), (1, &act, &y)] {
            dev.enqueue(&Op::ExpertFfn {
                x: input,
                slots,
                format,
                pairs: &pairs,
                out,
                n_pairs: (t * k) as u32,
                experts: moe.params.n_experts,
                stage,
            })?;
        }
        Ok(dev.enqueue(&Op::MoeCombine {
            out: x,
            y: &y,
            weights: &weights,
            pair_of: &pair_of,
            tokens: t as u32,
            hidden: h as u32,
            k: k as u32,
            norm: norm.map(|(gain, out)| (gain, out, self.eps)),
        })?)
    }
}

impl GpuModel {
    /// Hands layer `li`'s routing of `n` entries to the installed tap, if any: only then
    /// are the ids and weights read back (a host round trip per layer, for tracing).
    fn report_routing(
        &self,
        li: usize,
        ids: &Buffer,
        weights: &Buffer,
        n: usize,
        k: usize,
    ) -> Result<()> {
        let tap = self.tap.read().ok().and_then(|t| t.clone());
        let Some(tap) = tap else { return Ok(()) };
        let ids = self.dev.download(ids, 0, (n * 4) as u64)?;
        let bytes = self.dev.download(weights, 0, (n * 4) as u64)?;
        let routing = Routing {
            top_k: k,
            ids: u32s(&ids).collect(),
            weights: f32s(&bytes).collect(),
            candidates: None,
        };
        tap.on_routing(li, &routing);
        Ok(())
    }
}

/// Little-endian bytes of `values`.
fn u32_bytes(values: impl Iterator<Item = u32>) -> Vec<u8> {
    values.flat_map(u32::to_le_bytes).collect()
}

/// One sequence's rows in a pass.
struct Part<'a> {
    cache: &'a mut GpuCache,
    /// Its first row among the pass's rows.
    row: usize,
    /// Its new rows.
    n: usize,
    /// Its rows whose logits are wanted, counted from `row`.
    wanted: Range<usize>,
}

/// One forward pass of the new tokens of one or more sequences on the device.
struct GpuPass<'a> {
    m: &'a GpuModel,
    parts: Vec<Part<'a>>,
    /// Token ids `[t]`, the sequences' one after the other.
    ids: Buffer,
    /// Positions `[t]`.
    pos: Buffer,
    t: usize,
    /// Experts the last MoE layer deferred to the CPU, with their block: run while the
    /// device works on the next MoE layer, which adds their output.
    deferred: Option<(&'a MoeBlock, DeferredExperts)>,
}

impl GpuPass<'_> {
    /// The graph gave layer `layer` a `block` its weights were not loaded for (the graph
    /// and the weights come from one config, so this is a bug, not bad input).
    fn mismatch(layer: usize, block: &str) -> Error {
        Error::Shape {
            op: "forward",
            message: format!(
                "layer {layer}: the layer graph's {block} differs from the loaded weights'"
            ),
        }
    }

    /// Layer `li`'s MoE block: `x += ` its output on `hs`, its routed experts where they
    /// were loaded; with `norm` (a gain and an output), the updated rows' RMSNorm in the
    /// last add's dispatch.
    fn moe_then(
        &mut self,
        li: usize,
        hs: &Rows,
        x: &mut Rows,
        norm: Option<(&Buffer, &Buffer)>,
    ) -> Result<()> {
        let m = self.m;
        let Ffn::Moe(moe) = &m.layers[li].ffn else {
            return Err(Self::mismatch(li, "feed-forward block"));
        };
        match &moe.routed {
            Routed::Device { slots, format } => {
                let on = (slots, *format);
                m.moe_on_device(li, &x.buf, &hs.buf, moe, on, self.t, norm)
            }
            Routed::Host(block) => {
                let spans = self.spans();
                let layer = HostLayer { li, moe, block };
                let (t, deferred) = (self.t, &mut self.deferred);
                m.moe_on_host(&layer, &x.buf, &hs.buf, t, &spans, deferred, norm)
            }
        }
    }

    /// The batch layout, as the CPU's executors see it.
    fn spans(&self) -> Vec<SeqSpan> {
        let span = |p: &Part| SeqSpan {
            row: p.row,
            len: p.n,
            start_pos: p.cache.len,
        };
        self.parts.iter().map(span).collect()
    }

    /// The rotary table of the cache with the most positions: it covers every position in
    /// the pass (each below its own cache's capacity).
    fn rope_table(&self) -> &Buffer {
        let widest = self.parts.iter().max_by_key(|p| p.cache.capacity);
        &widest.unwrap_or(&self.parts[0]).cache.rope_table
    }

    /// Appends every sequence's new cache entries, its rows of `a: [t, wa]` and
    /// `b: [t, wb]`, to its layer `li`'s two cache buffers.
    fn append(
        &self,
        li: usize,
        (a, wa): (&Buffer, usize),
        (b, wb): (&Buffer, usize),
    ) -> Result<()> {
        let dev = &self.m.dev;
        for p in self.parts.iter().filter(|p| p.n > 0) {
            let (c, at) = (&p.cache, p.cache.len as u64);
            let (row, n) = (p.row as u64, p.n as u64);
            let write = |src, dst, w: usize| CacheWrite {
                src,
                from: row * w as u64,
                dst,
                at: at * w as u64,
                n: n * w as u64,
            };
            dev.enqueue(&Op::CacheStore {
                writes: &[write(a, &c.k[li], wa), write(b, &c.v[li], wb)],
                cache: c.kv_type,
            })?;
        }
        Ok(())
    }

    /// `[t, out_w]`: `attend(part, q, out)` run for every sequence on its own rows of
    /// `q: [t, q_w]` (copied apart when the pass holds more than one sequence).
    fn per_sequence(
        &self,
        q: &Buffer,
        (q_w, out_w): (usize, usize),
        attend: impl Fn(&Part<'_>, &Buffer, &Buffer) -> Result<()>,
    ) -> Result<Buffer> {
        let m = self.m;
        let out = m.scratch(self.t * out_w, "attention output")?;
        if let [part] = self.parts.as_slice() {
            attend(part, q, &out)?;
            return Ok(out);
        }
        for p in self.parts.iter().filter(|p| p.n > 0) {
            let (q_row, out_row) = ((q_w * 4) as u64, (out_w * 4) as u64);
            let qs = m.scratch(p.n * q_w, "sequence queries")?;
            m.dev
                .copy(q, p.row as u64 * q_row, &qs, 0, p.n as u64 * q_row)?;
            let os = m.scratch(p.n * out_w, "sequence attention output")?;
            attend(p, &qs, &os)?;
            m.dev
                .copy(&os, 0, &out, p.row as u64 * out_row, p.n as u64 * out_row)?;
        }
        Ok(out)
    }
}

impl Decoder for GpuPass<'_> {
    type Act = Rows;
    type Error = Error;

    fn embed(&mut self) -> Result<Rows> {
        let (t, h) = (self.t, self.m.config.hidden_size);
        let x = self.m.scratch(t * h, "residual")?;
        self.m.dev.enqueue(&Op::Embed {
            table: &self.m.embed.buf,
            wtype: self.m.embed.wtype,
            ids: &self.ids,
            out: &x,
            rows: t as u32,
            dim: h as u32,
        })?;
        Ok(Rows { buf: x, n: t })
    }

    fn rms_norm(&mut self, x: &Rows, norm: Norm) -> Result<Rows> {
        let (m, n) = (self.m, x.n);
        let w = m.norm_weight(norm);
        let buf = m.rms_norm((&x.buf, None), w, n, m.config.hidden_size, m.eps)?;
        Ok(Rows { buf, n })
    }

    fn add_rms_norm(&mut self, x: &mut Rows, y: Rows, norm: Norm) -> Result<Rows> {
        let (m, n) = (self.m, x.n);
        let w = m.norm_weight(norm);
        let buf = m.rms_norm((&x.buf, Some(&y.buf)), w, n, m.config.hidden_size, m.eps)?;
        Ok(Rows { buf, n })
    }

    fn gqa(&mut self, li: usize, cfg: &GqaConfig, hs: &Rows) -> Result<Rows> {
        let Attn::Gqa {
            q,
            k,
            v,
            o,
            q_norm,
            k_norm,
        } = &self.m.layers[li].attn
        else {
            return Err(Self::mismatch(li, "attention"));
        };
        let (m, t, pos, table) = (self.m, self.t, &self.pos, self.rope_table());
        let (n_heads, n_kv_heads, head_dim) = (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim);
        let kv_w = cfg.kv_width();
        let qb = m.matmul(&hs.buf, q, t)?;
        let kb = m.matmul(&hs.buf, k, t)?;
        let vb = m.matmul(&hs.buf, v, t)?;
        // Qwen3's per-head norms run inside the rotation's dispatch.
        m.rope(&qb, pos, table, t, n_heads, head_dim, 0, q_norm.as_ref())?;
        m.rope(&kb, pos, table, t, n_kv_heads, head_dim, 0, k_norm.as_ref())?;
        self.append(li, (&kb, kv_w), (&vb, kv_w))?;
        let width = n_heads * head_dim;
        let out = self.per_sequence(&qb, (width, width), |p, q, out| {
            Ok(m.dev.enqueue(&Op::Attention {
                q,
                k: &p.cache.k[li],
                v: &p.cache.v[li],
                cache: p.cache.kv_type,
                out,
                n_tokens: p.n as u32,
                start_pos: p.cache.len as u32,
                n_heads: n_heads as u32,
                n_kv_heads: n_kv_heads as u32,
                head_dim: head_dim as u32,
                window: cfg.sliding_window.unwrap_or(0) as u32,
                scale: m.scale,
            })?)
        })?;
        Ok(Rows {
            buf: m.matmul(&out, o, t)?,
            n: t,
        })
    }

    fn mla(&mut self, li: usize, cfg: &MlaConfig, hs: &Rows) -> Result<Rows> {
        let Attn::Mla {
            q_a,
            q,
            kv_a,
            kv_a_norm,
            kv_b,
            o,
        } = &self.m.layers[li].attn
        else {
            return Err(Self::mismatch(li, "attention"));
        };
        let (m, t, pos, table) = (self.m, self.t, &self.pos, self.rope_table());
        let (n_heads, kv_lora, nope) = (cfg.n_heads, cfg.kv_lora_rank, cfg.qk_nope_head_dim);
        let (rope, v_dim) = (cfg.qk_rope_head_dim, cfg.v_head_dim);
        let eps = MlaConfig::NORM_EPS;
        let qb = match q_a {
            Some((q_a, norm)) => {
                let c = m.matmul(&hs.buf, q_a, t)?;
                let c = m.rms_norm((&c, None), norm, t, q_a.n, eps)?;
                m.matmul(&c, q, t)?
            }
            None => m.matmul(&hs.buf, q, t)?,
        };
        m.rope(&qb, pos, table, t, n_heads, nope + rope, nope, None)?;
        // Split each row of kv_a's output into the latent and the rotary key: one dispatch
        // each, where a copy per row took 2 t commands (1,024 a layer for a 512-token prompt).
        let kv = m.matmul(&hs.buf, kv_a, t)?;
        let latent = m.scratch(t * kv_lora, "latent")?;
        let k_rope = m.scratch(t * rope, "rotary key")?;
        for (dst, first, width) in [(&latent, 0, kv_lora), (&k_rope, kv_lora, rope)] {
            m.dev.enqueue(&Op::CopyColumns {
                src: &kv,
                src_width: (kv_lora + rope) as u32,
                first: first as u32,
                dst,
                width: width as u32,
                rows: t as u32,
            })?;
        }
        let latent = m.rms_norm((&latent, None), kv_a_norm, t, kv_lora, eps)?;
        m.rope(&k_rope, pos, table, t, 1, rope, 0, None)?;
        self.append(li, (&latent, kv_lora), (&k_rope, rope))?;
        let q_w = n_heads * (nope + rope);
        let out = self.per_sequence(&qb, (q_w, n_heads * v_dim), |p, q, out| {
            Ok(m.dev.enqueue(&Op::MlaAttention {
                q,
                latent: &p.cache.k[li],
                k_rope: &p.cache.v[li],
                cache: p.cache.kv_type,
                kv_b,
                out,
                n_tokens: p.n as u32,
                start_pos: p.cache.len as u32,
                n_heads: n_heads as u32,
                kv_lora: kv_lora as u32,
                nope: nope as u32,
                rope: rope as u32,
                v_dim: v_dim as u32,
                scale: m.scale,
            })?)
        })?;
        Ok(Rows {
            buf: m.matmul(&out, o, t)?,
            n: t,
        })
    }

    fn add(&mut self, x: &mut Rows, y: Rows) -> Result<()> {
        self.m.add(&x.buf, &y.buf, x.n)
    }

    fn dense_mlp(&mut self, li: usize, hs: &Rows, x: &mut Rows) -> Result<()> {
        let Ffn::Dense(mlp) = &self.m.layers[li].ffn else {
            return Err(Self::mismatch(li, "feed-forward block"));
        };
        let y = self.m.mlp(&hs.buf, mlp, self.t)?;
        self.m.add(&x.buf, &y, self.t)
    }

    fn moe(&mut self, li: usize, _: &MoeConfig, hs: &Rows, x: &mut Rows) -> Result<()> {
        self.moe_then(li, hs, x, None)
    }

    fn moe_rms_norm(
        &mut self,
        li: usize,
        _: &MoeConfig,
        hs: &Rows,
        x: &mut Rows,
        norm: Norm,
    ) -> Result<Rows> {
        let m = self.m;
        let out = m.scratch(x.n * m.config.hidden_size, "norm output")?;
        self.moe_then(li, hs, x, Some((m.norm_weight(norm), &out)))?;
        Ok(Rows { buf: out, n: x.n })
    }

    fn commit(&mut self) -> Result<()> {
        for p in &mut self.parts {
            p.cache.len += p.n;
        }
        Ok(())
    }

    /// Every sequence's wanted rows, gathered in order into one activation (one LM head
    /// pass); none when no sequence wants logits.
    fn wanted_rows(&mut self, x: Rows) -> Result<Vec<Rows>> {
        let n: usize = self.parts.iter().map(|p| p.wanted.len()).sum();
        if n == 0 {
            return Ok(Vec::new());
        }
        if n == self.t {
            return Ok(vec![x]);
        }
        let row = (self.m.config.hidden_size * 4) as u64;
        let rows = self
            .m
            .scratch(n * self.m.config.hidden_size, "wanted rows")?;
        let mut at = 0;
        for p in &self.parts {
            let (start, len) = ((p.row + p.wanted.start) as u64, p.wanted.len() as u64);
            if len > 0 {
                self.m
                    .dev
                    .copy(&x.buf, start * row, &rows, at * row, len * row)?;
            }
            at += len;
        }
        Ok(vec![Rows { buf: rows, n }])
    }

    fn lm_head(&mut self, x: &Rows) -> Result<Rows> {
        let m = self.m;
        let head = m.lm_head.as_ref().unwrap_or(&m.embed);
        Ok(Rows {
            buf: m.matmul(&x.buf, head, x.n)?,
            n: x.n,
        })
    }
}
