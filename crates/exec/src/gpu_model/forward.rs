//! The forward pass of [`GpuModel`], kernel by kernel on its device.

use strata_accel::{Buffer, Op, RopeKind};
use strata_model::config::RopeStyle;

use super::{Attn, Ffn, GpuCache, GpuModel, MLA_NORM_EPS, Matrix, Mlp, Moe, Shape};
use crate::{Error, Result};

impl GpuModel {
    fn scratch(&self, n: usize, label: &str) -> Result<Buffer> {
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

    fn rms_norm(
        &self,
        x: &Buffer,
        w: &Buffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<Buffer> {
        let out = self.scratch(rows * dim, "norm output")?;
        self.dev.enqueue(&Op::RmsNorm {
            x,
            w,
            out: &out,
            rows: rows as u32,
            dim: dim as u32,
            eps,
        })?;
        Ok(out)
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

    /// Runs `tokens` through the model after the cached positions, appending to `cache`;
    /// returns the logits of every new position, `[tokens, vocab]`.
    pub fn forward(&self, tokens: &[u32], cache: &mut GpuCache) -> Result<Vec<f32>> {
        self.forward_rows(tokens, cache, false)
    }

    /// [`GpuModel::forward`] returning only the last position's logits `[vocab]`
    /// (generation: the LM head runs on one row).
    pub fn forward_last(&self, tokens: &[u32], cache: &mut GpuCache) -> Result<Vec<f32>> {
        self.forward_rows(tokens, cache, true)
    }

    fn forward_rows(&self, tokens: &[u32], cache: &mut GpuCache, last: bool) -> Result<Vec<f32>> {
        let t = tokens.len();
        let (h, v) = (self.config.hidden_size, self.config.vocab_size);
        if let Some(&bad) = tokens.iter().find(|&&id| id as usize >= v) {
            return Err(Error::Shape {
                op: "forward",
                message: format!("token id {bad} is out of range for a vocabulary of {v}"),
            });
        }
        if cache.len + t > cache.capacity {
            return Err(Error::Shape {
                op: "forward",
                message: format!(
                    "{} cached + {t} new positions exceed the cache capacity of {}",
                    cache.len, cache.capacity
                ),
            });
        }
        if t == 0 {
            return Ok(Vec::new());
        }
        let dev = &*self.dev;
        let ids = dev.alloc(t as u64 * 4, 0, "token ids")?;
        dev.upload(
            &ids,
            0,
            &tokens
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect::<Vec<u8>>(),
        )?;
        let positions: Vec<u8> = (cache.len..cache.len + t)
            .flat_map(|p| (p as u32).to_le_bytes())
            .collect();
        let pos = dev.alloc(t as u64 * 4, 0, "positions")?;
        dev.upload(&pos, 0, &positions)?;
        let x = self.scratch(t * h, "residual")?;
        dev.enqueue(&Op::Embed {
            table: &self.embed.buf,
            wtype: self.embed.wtype,
            ids: &ids,
            out: &x,
            rows: t as u32,
            dim: h as u32,
        })?;
        for (li, layer) in self.layers.iter().enumerate() {
            let hs = self.rms_norm(&x, &layer.attn_norm, t, h, self.eps)?;
            let o = self.attention(&layer.attn, li, &hs, &pos, cache, t)?;
            dev.enqueue(&Op::Add {
                x: &x,
                y: &o,
                gate: None,
                n: (t * h) as u32,
                dim: h as u32,
            })?;
            let hs = self.rms_norm(&x, &layer.ffn_norm, t, h, self.eps)?;
            match &layer.ffn {
                Ffn::Dense(m) => {
                    let y = self.mlp(&hs, m, t)?;
                    dev.enqueue(&Op::Add {
                        x: &x,
                        y: &y,
                        gate: None,
                        n: (t * h) as u32,
                        dim: h as u32,
                    })?;
                }
                Ffn::Moe(moe) => self.moe(&x, &hs, moe, t)?,
            }
        }
        cache.len += t;
        let (x, rows) = if last && t > 1 {
            let row = self.scratch(h, "last row")?;
            dev.copy(&x, ((t - 1) * h * 4) as u64, &row, 0, (h * 4) as u64)?;
            (row, 1)
        } else {
            (x, t)
        };
        let xs = self.rms_norm(&x, &self.norm, rows, h, self.eps)?;
        let logits = self.matmul(&xs, self.lm_head.as_ref().unwrap_or(&self.embed), rows)?;
        let bytes = dev.download(&logits, 0, (rows * v * 4) as u64)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Rotates `heads` heads of `stride` values per row of `x`, from `offset` on.
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        x: &Buffer,
        pos: &Buffer,
        cache: &GpuCache,
        t: usize,
        heads: usize,
        stride: usize,
        offset: usize,
    ) -> Result<()> {
        Ok(self.dev.enqueue(&Op::Rope {
            x,
            positions: pos,
            table: &cache.rope_table,
            rows: t as u32,
            n_heads: heads as u32,
            head_stride: stride as u32,
            offset: offset as u32,
            half: (self.rope.dim() / 2) as u32,
            kind: match self.config.rope.style {
                RopeStyle::Neox => RopeKind::Neox,
                RopeStyle::Interleaved => RopeKind::Interleaved,
            },
        })?)
    }

    /// Self-attention of layer `li` for `hs: [t, hidden]`, appending to the cache;
    /// returns the output projection `[t, hidden]`.
    fn attention(
        &self,
        attn: &Attn,
        li: usize,
        hs: &Buffer,
        pos: &Buffer,
        cache: &GpuCache,
        t: usize,
    ) -> Result<Buffer> {
        let dev = &*self.dev;
        let (wa, wb) = self.shape.cache_widths();
        let (at_a, at_b) = ((cache.len * wa * 4) as u64, (cache.len * wb * 4) as u64);
        match (attn, self.shape) {
            (
                Attn::Gqa {
                    q,
                    k,
                    v,
                    o,
                    q_norm,
                    k_norm,
                },
                Shape::Gqa {
                    n_heads,
                    n_kv_heads,
                    head_dim,
                    window,
                },
            ) => {
                let mut qb = self.matmul(hs, q, t)?;
                let mut kb = self.matmul(hs, k, t)?;
                let vb = self.matmul(hs, v, t)?;
                if let Some(w) = q_norm {
                    qb = self.rms_norm(&qb, w, t * n_heads, head_dim, self.eps)?;
                }
                if let Some(w) = k_norm {
                    kb = self.rms_norm(&kb, w, t * n_kv_heads, head_dim, self.eps)?;
                }
                self.rope(&qb, pos, cache, t, n_heads, head_dim, 0)?;
                self.rope(&kb, pos, cache, t, n_kv_heads, head_dim, 0)?;
                dev.copy(&kb, 0, &cache.k[li], at_a, (t * wa * 4) as u64)?;
                dev.copy(&vb, 0, &cache.v[li], at_b, (t * wb * 4) as u64)?;
                let out = self.scratch(t * n_heads * head_dim, "attention output")?;
                dev.enqueue(&Op::Attention {
                    q: &qb,
                    k: &cache.k[li],
                    v: &cache.v[li],
                    out: &out,
                    n_tokens: t as u32,
                    start_pos: cache.len as u32,
                    n_heads: n_heads as u32,
                    n_kv_heads: n_kv_heads as u32,
                    head_dim: head_dim as u32,
                    window: window as u32,
                    scale: self.scale,
                })?;
                self.matmul(&out, o, t)
            }
            (
                Attn::Mla {
                    q_a,
                    q,
                    kv_a,
                    kv_a_norm,
                    kv_b,
                    o,
                },
                Shape::Mla {
                    n_heads,
                    kv_lora,
                    nope,
                    rope,
                    v_dim,
                },
            ) => {
                let qb = match q_a {
                    Some((q_a, norm)) => {
                        let c = self.matmul(hs, q_a, t)?;
                        let c = self.rms_norm(&c, norm, t, q_a.n, MLA_NORM_EPS)?;
                        self.matmul(&c, q, t)?
                    }
                    None => self.matmul(hs, q, t)?,
                };
                self.rope(&qb, pos, cache, t, n_heads, nope + rope, nope)?;
                // Split each row of kv_a's output into the latent and the rotary key.
                let kv = self.matmul(hs, kv_a, t)?;
                let latent = self.scratch(t * kv_lora, "latent")?;
                let k_rope = self.scratch(t * rope, "rotary key")?;
                let row = kv_lora + rope;
                for r in 0..t {
                    let src = (r * row * 4) as u64;
                    dev.copy(
                        &kv,
                        src,
                        &latent,
                        (r * kv_lora * 4) as u64,
                        (kv_lora * 4) as u64,
                    )?;
                    dev.copy(
                        &kv,
                        src + (kv_lora * 4) as u64,
                        &k_rope,
                        (r * rope * 4) as u64,
                        (rope * 4) as u64,
                    )?;
                }
                let latent = self.rms_norm(&latent, kv_a_norm, t, kv_lora, MLA_NORM_EPS)?;
                self.rope(&k_rope, pos, cache, t, 1, rope, 0)?;
                dev.copy(&latent, 0, &cache.k[li], at_a, (t * wa * 4) as u64)?;
                dev.copy(&k_rope, 0, &cache.v[li], at_b, (t * wb * 4) as u64)?;
                let out = self.scratch(t * n_heads * v_dim, "attention output")?;
                dev.enqueue(&Op::MlaAttention {
                    q: &qb,
                    latent: &cache.k[li],
                    k_rope: &cache.v[li],
                    kv_b,
                    out: &out,
                    n_tokens: t as u32,
                    start_pos: cache.len as u32,
                    n_heads: n_heads as u32,
                    kv_lora: kv_lora as u32,
                    nope: nope as u32,
                    rope: rope as u32,
                    v_dim: v_dim as u32,
                    scale: self.scale,
                })?;
                self.matmul(&out, o, t)
            }
            _ => Err(Error::Shape {
                op: "attention",
                message: "layer weights do not match the model's attention kind".into(),
            }),
        }
    }

    /// `x += routed experts (+ shared experts)` of `hs`.
    fn moe(&self, x: &Buffer, hs: &Buffer, moe: &Moe, t: usize) -> Result<()> {
        let dev = &*self.dev;
        let k = moe.params.k as usize;
        let h = self.config.hidden_size;
        if let Some(shared) = &moe.shared {
            let y = self.mlp(hs, shared, t)?;
            let gate = match &moe.shared_gate {
                Some(g) => Some(self.matmul(hs, g, t)?),
                None => None,
            };
            dev.enqueue(&Op::Add {
                x,
                y: &y,
                gate: gate.as_ref(),
                n: (t * h) as u32,
                dim: h as u32,
            })?;
        }
        let logits = self.matmul(hs, &moe.router, t)?;
        let ids = self.scratch(t * k, "expert ids")?;
        let weights = self.scratch(t * k, "expert weights")?;
        dev.enqueue(&Op::TopK {
            logits: &logits,
            bias: moe.correction_bias.as_ref(),
            ids: &ids,
            weights: &weights,
            tokens: t as u32,
            params: moe.params,
        })?;
        // Group the routed rows by expert on the host (the policy's decision point).
        let chosen: Vec<u32> = dev
            .download(&ids, 0, (t * k * 4) as u64)?
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let mut order: Vec<usize> = (0..t * k).collect();
        order.sort_by_key(|&p| chosen[p]);
        let mut pairs = Vec::with_capacity(2 * t * k * 4);
        let mut pair_of = vec![0u32; t * k];
        for (pi, &p) in order.iter().enumerate() {
            pairs.extend(((p / k) as u32).to_le_bytes());
            pairs.extend(chosen[p].to_le_bytes());
            pair_of[p] = pi as u32;
        }
        let pairs_buf = dev.alloc(pairs.len() as u64, 0, "expert pairs")?;
        dev.upload(&pairs_buf, 0, &pairs)?;
        let pair_of_buf = dev.alloc((t * k * 4) as u64, 0, "pair index")?;
        dev.upload(
            &pair_of_buf,
            0,
            &pair_of
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect::<Vec<u8>>(),
        )?;
        let inter = moe.slots.inter as usize;
        let act = self.scratch(t * k * inter, "expert activations")?;
        let y = self.scratch(t * k * h, "expert outputs")?;
        for (stage, input, out) in [(0, hs, &act), (1, &act, &y)] {
            dev.enqueue(&Op::ExpertFfn {
                x: input,
                slots: &moe.slots,
                pairs: &pairs_buf,
                out,
                n_pairs: (t * k) as u32,
                stage,
            })?;
        }
        Ok(dev.enqueue(&Op::MoeCombine {
            out: x,
            y: &y,
            weights: &weights,
            pair_of: &pair_of_buf,
            tokens: t as u32,
            hidden: h as u32,
            k: k as u32,
        })?)
    }
}
