//! Self-attention over a batch of sequences with a per-sequence KV cache: grouped-query
//! attention (Llama, Qwen, Mixtral, GLM-4.5) and DeepSeek's multi-head latent attention.
//!
//! A key design decision made here is that MLA caches only the compressed latent
//! (`kv_lora_rank` values plus the shared rotary key per position) and attends in latent
//! space by absorbing `kv_b_proj` into the query and the output ("weight absorption"),
//! so its cache is 10-20x smaller than full keys and values, as in the reference
//! implementation's cache.

use std::ops::Range;

use crate::Result;
use crate::cache::LayerCache;
use crate::config::{AttentionConfig, GqaConfig, MlaConfig};
use crate::linear::{Linear, Loader};
use crate::names::AttentionNames;
use crate::ops::{parallel_map, rms_norm, softmax};
use crate::rope::Rope;
use crate::tensors::{AttentionTensors, MatrixSpec, TensorSpec};
use strata_kernels::vector::{axpy_rows, dot, dot_rows};

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

/// What every attention layer of one forward pass shares: the batch's layout and the
/// rotary and score settings.
#[derive(Debug)]
pub(crate) struct Batch<'a> {
    /// Rows in the batch.
    pub t: usize,
    /// Every row's position in its sequence.
    pub positions: Vec<usize>,
    /// Where each sequence's rows are.
    pub spans: Vec<SeqSpan>,
    /// Rotary embedding.
    pub rope: &'a Rope,
    /// Softmax scale of attention scores.
    pub scale: f32,
    /// RMSNorm epsilon (q/k norms).
    pub eps: f32,
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
}

impl Attention {
    /// Loads the attention block named by `n`.
    pub fn load(
        ld: &Loader,
        n: &AttentionNames,
        cfg: &AttentionConfig,
        hidden: usize,
    ) -> Result<Attention> {
        let proj = |m: &MatrixSpec| ld.projection(&m.name, m.rows, m.cols, m.bias);
        let vector = |t: &TensorSpec| ld.f32(&t.name, &t.shape);
        Ok(match AttentionTensors::new(n, cfg, hidden) {
            AttentionTensors::Gqa(t) => Attention::Gqa(Gqa {
                q: proj(&t.q)?,
                k: proj(&t.k)?,
                v: proj(&t.v)?,
                o: proj(&t.o)?,
                q_norm: t.q_norm.as_ref().map(vector).transpose()?,
                k_norm: t.k_norm.as_ref().map(vector).transpose()?,
            }),
            AttentionTensors::Mla(t) => Attention::Mla(Mla {
                q_a: match &t.q_a {
                    Some((q_a, norm)) => Some((proj(q_a)?, vector(norm)?)),
                    None => None,
                },
                q: proj(&t.q)?,
                kv_a: proj(&t.kv_a)?,
                kv_a_norm: vector(&t.kv_a_norm)?,
                kv_b: vector(&t.kv_b)?,
                o: proj(&t.o)?,
            }),
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

/// Query rows of one sequence's prompt that one attention task takes: a long prompt is split
/// so that its heads' work spreads evenly over the cores (nine heads on two cores left one
/// waiting a ninth of the time).
const ROWS_PER_TASK: usize = 32;

/// One attention task: query rows `rows` of span `span` for head `head`.
#[derive(Clone)]
struct HeadTask {
    span: usize,
    head: usize,
    rows: Range<usize>,
}

/// The attention tasks of a batch: every span's rows in chunks, for every head.
fn head_tasks(spans: &[SeqSpan], n_heads: usize) -> Vec<HeadTask> {
    let mut tasks = Vec::new();
    for (span, s) in spans.iter().enumerate() {
        for head in 0..n_heads {
            for start in (0..s.len).step_by(ROWS_PER_TASK) {
                let rows = start..(start + ROWS_PER_TASK).min(s.len);
                tasks.push(HeadTask { span, head, rows });
            }
        }
    }
    tasks
}

/// Scatters the tasks' outputs (`[rows, width]` each) into `[T, n_heads * width]`.
fn scatter_heads(
    outs: Vec<Vec<f32>>,
    tasks: &[HeadTask],
    spans: &[SeqSpan],
    n_heads: usize,
    width: usize,
    t: usize,
) -> Vec<f32> {
    let mut attn = vec![0.0f32; t * n_heads * width];
    for (task, out) in tasks.iter().zip(outs) {
        for (i, r) in task.rows.clone().enumerate() {
            let dst = (spans[task.span].row + r) * n_heads * width + task.head * width;
            attn[dst..dst + width].copy_from_slice(&out[i * width..(i + 1) * width]);
        }
    }
    attn
}

impl Gqa {
    /// Attention of the batch's rows `h: [T, hidden]`, appending the new keys and
    /// values to each sequence's cache; returns `[T, hidden]`.
    pub(crate) fn forward(
        &self,
        cfg: &GqaConfig,
        h: &[f32],
        b: &Batch,
        caches: &mut [&mut LayerCache],
    ) -> Vec<f32> {
        let Batch {
            t,
            ref positions,
            ref spans,
            rope,
            scale,
            eps,
        } = *b;
        let GqaConfig {
            n_heads,
            n_kv_heads,
            head_dim: hd,
            sliding_window,
            ..
        } = *cfg;
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
        let kv_w = cfg.kv_width();
        for (s, cache) in spans.iter().zip(caches.iter_mut()) {
            cache.append(
                &k[s.row * kv_w..(s.row + s.len) * kv_w],
                &v[s.row * kv_w..(s.row + s.len) * kv_w],
                kv_w,
                kv_w,
            );
        }
        let caches: &[&mut LayerCache] = caches;
        let group = n_heads / n_kv_heads;
        let tasks = head_tasks(spans, n_heads);
        let outs = parallel_map(tasks.len(), |i| {
            let HeadTask { span, head, rows } = tasks[i].clone();
            let (cache, span) = (&caches[span], &spans[span]);
            let kv_head = head / group;
            let mut out = vec![0.0f32; rows.len() * hd];
            let mut scores = Vec::new();
            for r in rows.clone() {
                let pos = span.start_pos + r;
                let lo = sliding_window.map_or(0, |w| (pos + 1).saturating_sub(w));
                let qrow = &q[(span.row + r) * n_heads * hd + head * hd..][..hd];
                let first = lo * kv_w + kv_head * hd;
                scores.clear();
                scores.resize(pos + 1 - lo, 0.0);
                dot_rows(qrow, &cache.a()[first..], kv_w, &mut scores);
                for s in &mut scores {
                    *s *= scale;
                }
                softmax(&mut scores);
                let o = &mut out[(r - rows.start) * hd..][..hd];
                axpy_rows(&scores, &cache.b()[first..], kv_w, o);
            }
            out
        });
        let attn = scatter_heads(outs, &tasks, spans, n_heads, hd, t);
        self.o.forward(&attn, t)
    }
}

impl Mla {
    /// Attention of the batch's rows `h: [T, hidden]`, appending the new latents and
    /// rotary keys to each sequence's cache; returns `[T, hidden]`.
    pub(crate) fn forward(
        &self,
        cfg: &MlaConfig,
        h: &[f32],
        b: &Batch,
        caches: &mut [&mut LayerCache],
    ) -> Vec<f32> {
        let Batch {
            t,
            ref positions,
            ref spans,
            rope,
            scale,
            ..
        } = *b;
        let MlaConfig {
            n_heads,
            kv_lora_rank: kv_lora,
            qk_nope_head_dim: nope,
            qk_rope_head_dim: rope_dim,
            v_head_dim: v_dim,
            ..
        } = *cfg;
        let qk = cfg.qk_head_dim();
        let mut q = match &self.q_a {
            Some((q_a, norm)) => {
                let mut c = q_a.forward(h, t);
                rms_norm(&mut c, norm, MlaConfig::NORM_EPS);
                self.q.forward(&c, t)
            }
            None => self.q.forward(h, t),
        };
        apply_rope_rows(&mut q, positions, qk, nope, rope);
        let kv = self.kv_a.forward(h, t);
        let kv_w = kv_lora + rope_dim;
        let mut latent = Vec::with_capacity(t * kv_lora);
        let mut k_rope = Vec::with_capacity(t * rope_dim);
        for row in kv.chunks_exact(kv_w) {
            latent.extend_from_slice(&row[..kv_lora]);
            k_rope.extend_from_slice(&row[kv_lora..]);
        }
        rms_norm(&mut latent, &self.kv_a_norm, MlaConfig::NORM_EPS);
        apply_rope_rows(&mut k_rope, positions, rope_dim, 0, rope);
        for (s, cache) in spans.iter().zip(caches.iter_mut()) {
            cache.append(
                &latent[s.row * kv_lora..(s.row + s.len) * kv_lora],
                &k_rope[s.row * rope_dim..(s.row + s.len) * rope_dim],
                kv_lora,
                rope_dim,
            );
        }
        let caches: &[&mut LayerCache] = caches;
        let (l, rd, vd) = (kv_lora, rope_dim, v_dim);
        let tasks = head_tasks(spans, n_heads);
        let outs = parallel_map(tasks.len(), |i| {
            let HeadTask { span, head, rows } = tasks[i].clone();
            let (cache, span) = (&caches[span], &spans[span]);
            let w_head = &self.kv_b[head * (nope + vd) * l..(head + 1) * (nope + vd) * l];
            let (w_uk, w_uv) = w_head.split_at(nope * l);
            let mut out = vec![0.0f32; rows.len() * vd];
            let (mut q_lat, mut o_lat) = (vec![0.0f32; l], vec![0.0f32; l]);
            let (mut scores, mut rope_scores) = (Vec::new(), Vec::new());
            for r in rows.clone() {
                let pos = span.start_pos + r;
                let qrow = &q[(span.row + r) * n_heads * qk + head * qk..][..qk];
                // Absorb W_UK: q_lat = W_UKᵀ q_nope, so q_nope · (W_UK c) = q_lat · c.
                q_lat.fill(0.0);
                for (d, &qd) in qrow[..nope].iter().enumerate() {
                    for (ql, w) in q_lat.iter_mut().zip(&w_uk[d * l..(d + 1) * l]) {
                        *ql += qd * w;
                    }
                }
                scores.resize(pos + 1, 0.0);
                rope_scores.resize(pos + 1, 0.0);
                dot_rows(&q_lat, cache.a(), l, &mut scores);
                dot_rows(&qrow[nope..], cache.b(), rd, &mut rope_scores);
                for (s, r) in scores.iter_mut().zip(&rope_scores) {
                    *s = (*s + r) * scale;
                }
                softmax(&mut scores);
                o_lat.fill(0.0);
                axpy_rows(&scores, cache.a(), l, &mut o_lat);
                // Absorb W_UV: out = W_UV · Σ p_j c_j.
                for (vi, o) in out[(r - rows.start) * vd..][..vd].iter_mut().enumerate() {
                    *o = dot(&w_uv[vi * l..(vi + 1) * l], &o_lat);
                }
            }
            out
        });
        let attn = scatter_heads(outs, &tasks, spans, n_heads, vd, t);
        self.o.forward(&attn, t)
    }
}
