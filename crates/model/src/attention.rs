//! Self-attention over a batch of sequences with a per-sequence KV cache: grouped-query
//! attention (Llama, Qwen, Mixtral, GLM-4.5) and DeepSeek's multi-head latent attention.
//!
//! A key design decision made here is that MLA caches only the compressed latent
//! (`kv_lora_rank` values plus the shared rotary key per position) and attends in latent
//! space by absorbing `kv_b_proj` into the query and the output ("weight absorption"),
//! so its cache is 10-20x smaller than full keys and values, as in the reference
//! implementation's cache.

use crate::Result;
use crate::cache::LayerCache;
use crate::config::AttentionConfig;
use crate::linear::{Linear, Loader};
use crate::names::AttentionNames;
use crate::ops::{parallel_map, rms_norm, softmax};
use crate::rope::Rope;
use strata_kernels::vector::{axpy, dot};

/// DeepSeek's `q_a_layernorm` and `kv_a_layernorm` use a fixed epsilon, not `rms_norm_eps`.
const MLA_NORM_EPS: f32 = 1e-6;

/// Where each sequence of a batch sits in the flattened rows.
#[derive(Debug, Clone)]
pub struct SeqSpan {
    /// First row of this sequence in the batch.
    pub row: usize,
    /// Number of new rows (tokens).
    pub len: usize,
    /// Position of the first new token (tokens already in the cache).
    pub start_pos: usize,
}

/// Weights of one attention layer.
#[derive(Debug)]
pub enum Attention {
    /// Grouped-query attention.
    Gqa(Gqa),
    /// Multi-head latent attention.
    Mla(Mla),
}

/// Grouped-query attention weights.
#[derive(Debug)]
pub struct Gqa {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    sliding_window: Option<usize>,
}

/// Multi-head latent attention weights.
#[derive(Debug)]
pub struct Mla {
    q_a: Option<(Linear, Vec<f32>)>,
    q: Linear,
    kv_a: Linear,
    kv_a_norm: Vec<f32>,
    /// `kv_b_proj` in f32, `[n_heads * (nope + v), kv_lora]`, absorbed per head.
    kv_b: Vec<f32>,
    o: Linear,
    n_heads: usize,
    kv_lora: usize,
    nope: usize,
    rope_dim: usize,
    v_dim: usize,
}

impl Attention {
    /// Loads the attention block named by `n`.
    pub fn load(
        ld: &Loader,
        n: &AttentionNames,
        cfg: &AttentionConfig,
        hidden: usize,
    ) -> Result<Attention> {
        Ok(match *cfg {
            AttentionConfig::Gqa {
                n_heads,
                n_kv_heads,
                head_dim,
                qkv_bias,
                o_bias,
                qk_norm,
                sliding_window,
            } => Attention::Gqa(Gqa {
                q: ld.projection(&n.q(), n_heads * head_dim, hidden, qkv_bias)?,
                k: ld.projection(&n.k(), n_kv_heads * head_dim, hidden, qkv_bias)?,
                v: ld.projection(&n.v(), n_kv_heads * head_dim, hidden, qkv_bias)?,
                o: ld.projection(&n.o(), hidden, n_heads * head_dim, o_bias)?,
                q_norm: if qk_norm {
                    Some(ld.f32(&n.q_norm(), &[head_dim])?)
                } else {
                    None
                },
                k_norm: if qk_norm {
                    Some(ld.f32(&n.k_norm(), &[head_dim])?)
                } else {
                    None
                },
                n_heads,
                n_kv_heads,
                head_dim,
                sliding_window,
            }),
            AttentionConfig::Mla {
                n_heads,
                q_lora_rank,
                kv_lora_rank,
                qk_nope_head_dim,
                qk_rope_head_dim,
                v_head_dim,
                bias,
            } => {
                let qk = qk_nope_head_dim + qk_rope_head_dim;
                let (q_a, q) = match q_lora_rank {
                    Some(r) => (
                        Some((
                            ld.projection(&n.q_a(), r, hidden, bias)?,
                            ld.f32(&n.q_a_norm(), &[r])?,
                        )),
                        ld.projection(&n.q_b(), n_heads * qk, r, false)?,
                    ),
                    None => (None, ld.projection(&n.q(), n_heads * qk, hidden, false)?),
                };
                Attention::Mla(Mla {
                    q_a,
                    q,
                    kv_a: ld.projection(
                        &n.kv_a(),
                        kv_lora_rank + qk_rope_head_dim,
                        hidden,
                        bias,
                    )?,
                    kv_a_norm: ld.f32(&n.kv_a_norm(), &[kv_lora_rank])?,
                    kv_b: ld.f32(
                        &format!("{}.weight", n.kv_b()),
                        &[n_heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank],
                    )?,
                    o: ld.projection(&n.o(), hidden, n_heads * v_head_dim, bias)?,
                    n_heads,
                    kv_lora: kv_lora_rank,
                    nope: qk_nope_head_dim,
                    rope_dim: qk_rope_head_dim,
                    v_dim: v_head_dim,
                })
            }
        })
    }

    /// Bytes of weights.
    pub fn weight_bytes(&self) -> usize {
        match self {
            Attention::Gqa(a) => {
                a.q.weight_bytes() + a.k.weight_bytes() + a.v.weight_bytes() + a.o.weight_bytes()
            }
            Attention::Mla(a) => {
                a.q_a.as_ref().map_or(0, |(l, _)| l.weight_bytes())
                    + a.q.weight_bytes()
                    + a.kv_a.weight_bytes()
                    + a.kv_b.len() * 4
                    + a.o.weight_bytes()
            }
        }
    }

    /// Parameter count.
    pub fn params(&self) -> usize {
        match self {
            Attention::Gqa(a) => [&a.q, &a.k, &a.v, &a.o]
                .iter()
                .map(|l| l.n_out * l.k_in)
                .sum(),
            Attention::Mla(a) => {
                a.q_a.as_ref().map_or(0, |(l, _)| l.n_out * l.k_in)
                    + a.q.n_out * a.q.k_in
                    + a.kv_a.n_out * a.kv_a.k_in
                    + a.kv_b.len()
                    + a.o.n_out * a.o.k_in
            }
        }
    }

    /// Widths of one cached position: (first buffer, second buffer) =
    /// (keys, values) for GQA, (latent, rotary key) for MLA.
    pub fn cache_widths(&self) -> (usize, usize) {
        match self {
            Attention::Gqa(a) => (a.n_kv_heads * a.head_dim, a.n_kv_heads * a.head_dim),
            Attention::Mla(a) => (a.kv_lora, a.rope_dim),
        }
    }

    /// Runs attention for all rows `h: [T, hidden]` of the batch, appending the new keys and
    /// values to each sequence's cache. Returns `[T, hidden]`.
    pub fn forward(
        &self,
        h: &[f32],
        spans: &[SeqSpan],
        caches: &mut [&mut LayerCache],
        rope: &Rope,
        scale: f32,
        eps: f32,
    ) -> Vec<f32> {
        let t: usize = spans.iter().map(|s| s.len).sum();
        let positions: Vec<usize> = spans
            .iter()
            .flat_map(|s| s.start_pos..s.start_pos + s.len)
            .collect();
        match self {
            Attention::Gqa(a) => a.forward(h, t, &positions, spans, caches, rope, scale, eps),
            Attention::Mla(a) => a.forward(h, t, &positions, spans, caches, rope, scale),
        }
    }
}

/// Rotates every `stride`-wide head of each row by its position.
fn apply_rope_rows(x: &mut [f32], positions: &[usize], stride: usize, offset: usize, rope: &Rope) {
    let half = rope.dim() / 2;
    let (mut cos, mut sin) = (vec![0.0; half], vec![0.0; half]);
    let row_len = x.len() / positions.len().max(1);
    for (row, &pos) in x.chunks_exact_mut(row_len.max(1)).zip(positions) {
        rope.cos_sin(pos, &mut cos, &mut sin);
        for head in row.chunks_exact_mut(stride) {
            rope.apply(&mut head[offset..], &cos, &sin);
        }
    }
}

/// Scatters per-(sequence, head) outputs `[len, width]` into `[T, n_heads * width]`.
fn scatter_heads(
    outs: Vec<Vec<f32>>,
    spans: &[SeqSpan],
    n_heads: usize,
    width: usize,
    t: usize,
) -> Vec<f32> {
    let mut attn = vec![0.0f32; t * n_heads * width];
    for (task, out) in outs.into_iter().enumerate() {
        let (s, head) = (task / n_heads, task % n_heads);
        for r in 0..spans[s].len {
            let dst = (spans[s].row + r) * n_heads * width + head * width;
            attn[dst..dst + width].copy_from_slice(&out[r * width..(r + 1) * width]);
        }
    }
    attn
}

impl Gqa {
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        h: &[f32],
        t: usize,
        positions: &[usize],
        spans: &[SeqSpan],
        caches: &mut [&mut LayerCache],
        rope: &Rope,
        scale: f32,
        eps: f32,
    ) -> Vec<f32> {
        let hd = self.head_dim;
        let mut q = self.q.forward(h, t);
        let mut k = self.k.forward(h, t);
        let v = self.v.forward(h, t);
        if let Some(w) = &self.q_norm {
            rms_norm(&mut q, w, eps);
        }
        if let Some(w) = &self.k_norm {
            rms_norm(&mut k, w, eps);
        }
        apply_rope_rows(&mut q, positions, hd, 0, rope);
        apply_rope_rows(&mut k, positions, hd, 0, rope);
        let kv_w = self.n_kv_heads * hd;
        for (s, cache) in spans.iter().zip(caches.iter_mut()) {
            cache.append(
                &k[s.row * kv_w..(s.row + s.len) * kv_w],
                &v[s.row * kv_w..(s.row + s.len) * kv_w],
                kv_w,
                kv_w,
            );
        }
        let caches: &[&mut LayerCache] = caches;
        let group = self.n_heads / self.n_kv_heads;
        let outs = parallel_map(spans.len() * self.n_heads, |task| {
            let (s, head) = (task / self.n_heads, task % self.n_heads);
            let span = &spans[s];
            let cache = &caches[s];
            let kv_head = head / group;
            let mut out = vec![0.0f32; span.len * hd];
            let mut scores = Vec::new();
            for r in 0..span.len {
                let pos = span.start_pos + r;
                let lo = self
                    .sliding_window
                    .map_or(0, |w| (pos + 1).saturating_sub(w));
                let qrow = &q[(span.row + r) * self.n_heads * hd + head * hd..][..hd];
                scores.clear();
                for j in lo..=pos {
                    let krow = &cache.a()[j * kv_w + kv_head * hd..][..hd];
                    scores.push(dot(qrow, krow) * scale);
                }
                softmax(&mut scores);
                let o = &mut out[r * hd..(r + 1) * hd];
                for (j, &p) in (lo..=pos).zip(&scores) {
                    axpy(p, &cache.b()[j * kv_w + kv_head * hd..][..hd], o);
                }
            }
            out
        });
        let attn = scatter_heads(outs, spans, self.n_heads, hd, t);
        self.o.forward(&attn, t)
    }
}

impl Mla {
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        h: &[f32],
        t: usize,
        positions: &[usize],
        spans: &[SeqSpan],
        caches: &mut [&mut LayerCache],
        rope: &Rope,
        scale: f32,
    ) -> Vec<f32> {
        let qk = self.nope + self.rope_dim;
        let mut q = match &self.q_a {
            Some((q_a, norm)) => {
                let mut c = q_a.forward(h, t);
                rms_norm(&mut c, norm, MLA_NORM_EPS);
                self.q.forward(&c, t)
            }
            None => self.q.forward(h, t),
        };
        apply_rope_rows(&mut q, positions, qk, self.nope, rope);
        let kv = self.kv_a.forward(h, t);
        let kv_w = self.kv_lora + self.rope_dim;
        let mut latent = Vec::with_capacity(t * self.kv_lora);
        let mut k_rope = Vec::with_capacity(t * self.rope_dim);
        for row in kv.chunks_exact(kv_w) {
            latent.extend_from_slice(&row[..self.kv_lora]);
            k_rope.extend_from_slice(&row[self.kv_lora..]);
        }
        rms_norm(&mut latent, &self.kv_a_norm, MLA_NORM_EPS);
        apply_rope_rows(&mut k_rope, positions, self.rope_dim, 0, rope);
        for (s, cache) in spans.iter().zip(caches.iter_mut()) {
            cache.append(
                &latent[s.row * self.kv_lora..(s.row + s.len) * self.kv_lora],
                &k_rope[s.row * self.rope_dim..(s.row + s.len) * self.rope_dim],
                self.kv_lora,
                self.rope_dim,
            );
        }
        let caches: &[&mut LayerCache] = caches;
        let (l, rd, vd) = (self.kv_lora, self.rope_dim, self.v_dim);
        let outs = parallel_map(spans.len() * self.n_heads, |task| {
            let (s, head) = (task / self.n_heads, task % self.n_heads);
            let span = &spans[s];
            let cache = &caches[s];
            let w_head = &self.kv_b[head * (self.nope + vd) * l..(head + 1) * (self.nope + vd) * l];
            let (w_uk, w_uv) = w_head.split_at(self.nope * l);
            let mut out = vec![0.0f32; span.len * vd];
            let (mut q_lat, mut o_lat, mut scores) = (vec![0.0f32; l], vec![0.0f32; l], Vec::new());
            for r in 0..span.len {
                let pos = span.start_pos + r;
                let qrow = &q[(span.row + r) * self.n_heads * qk + head * qk..][..qk];
                // Absorb W_UK: q_lat = W_UKᵀ q_nope, so q_nope · (W_UK c) = q_lat · c.
                q_lat.fill(0.0);
                for (d, &qd) in qrow[..self.nope].iter().enumerate() {
                    for (ql, w) in q_lat.iter_mut().zip(&w_uk[d * l..(d + 1) * l]) {
                        *ql += qd * w;
                    }
                }
                scores.clear();
                for j in 0..=pos {
                    let s = dot(&q_lat, &cache.a()[j * l..(j + 1) * l])
                        + dot(&qrow[self.nope..], &cache.b()[j * rd..(j + 1) * rd]);
                    scores.push(s * scale);
                }
                softmax(&mut scores);
                o_lat.fill(0.0);
                for (j, &p) in scores.iter().enumerate() {
                    axpy(p, &cache.a()[j * l..(j + 1) * l], &mut o_lat);
                }
                // Absorb W_UV: out = W_UV · Σ p_j c_j.
                for (vi, o) in out[r * vd..(r + 1) * vd].iter_mut().enumerate() {
                    *o = dot(&w_uv[vi * l..(vi + 1) * l], &o_lat);
                }
            }
            out
        });
        let attn = scatter_heads(outs, spans, self.n_heads, vd, t);
        self.o.forward(&attn, t)
    }
}
