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
use strata_kernels::attention as blocks;
use strata_kernels::vector::{axpy_rows, axpy_rows2, dot, dot_rows, dot_rows2};

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
    let row_len = (x.len() / positions.len().max(1)).max(1);
    // A prompt's rows in parallel tasks (on the calling thread alone, 1% of a 512-token
    // prefill while the other cores waited).
    let rows = crate::ops::ROWS_PER_TASK;
    strata_kernels::parallel_chunks_mut(x, rows * row_len, |task, chunk| {
        let (mut cos, mut sin) = (vec![0.0; half], vec![0.0; half]);
        for (row, &pos) in chunk
            .chunks_exact_mut(row_len)
            .zip(&positions[task * rows..])
        {
            rope.cos_sin(pos, &mut cos, &mut sin);
            for head in row.chunks_exact_mut(stride) {
                rope.apply(&mut head[offset..], &cos, &sin);
            }
        }
    });
}

/// Query rows of one sequence's prompt that one attention task takes: a long prompt is split
/// so that its heads' work spreads evenly over the cores (nine heads on two cores left one
/// waiting a ninth of the time).
const ROWS_PER_TASK: usize = 32;

/// One attention task: query rows `rows` of span `span` for `n` heads from `head` on (heads
/// that read the same cache rows: one pass over the rows serves them all).
#[derive(Clone)]
struct HeadTask {
    span: usize,
    head: usize,
    n: usize,
    rows: Range<usize>,
}

/// The attention tasks of a batch: every span's rows in chunks, for every `n` heads (`n`
/// divides `n_heads`).
fn head_tasks(spans: &[SeqSpan], n_heads: usize, n: usize) -> Vec<HeadTask> {
    debug_assert!(n > 0 && n_heads.is_multiple_of(n));
    let mut tasks = Vec::new();
    for (span, s) in spans.iter().enumerate() {
        for head in (0..n_heads).step_by(n) {
            for start in (0..s.len).step_by(ROWS_PER_TASK) {
                let rows = start..(start + ROWS_PER_TASK).min(s.len);
                tasks.push(HeadTask {
                    span,
                    head,
                    n,
                    rows,
                });
            }
        }
    }
    tasks
}

/// Scatters the tasks' outputs (`[rows, n * width]` each) into `[T, n_heads * width]`, blocks
/// of rows in parallel (a prompt's megabytes copied on one thread left the others waiting).
fn scatter_heads(
    outs: Vec<Vec<f32>>,
    tasks: &[HeadTask],
    spans: &[SeqSpan],
    n_heads: usize,
    width: usize,
    t: usize,
) -> Vec<f32> {
    let row_w = n_heads * width;
    let mut attn = strata_kernels::zeroed_f32(t * row_w);
    let rows_per_task = crate::ops::ROWS_PER_TASK;
    strata_kernels::parallel_chunks_mut(&mut attn, rows_per_task * row_w, |c, block| {
        let first = c * rows_per_task;
        let rows = first..first + block.len() / row_w.max(1);
        for (task, out) in tasks.iter().zip(&outs) {
            let (w, row0) = (task.n * width, spans[task.span].row + task.rows.start);
            let overlap = row0.max(rows.start)..(row0 + task.rows.len()).min(rows.end);
            for g in overlap {
                let (i, dst) = (g - row0, (g - first) * row_w + task.head * width);
                block[dst..dst + w].copy_from_slice(&out[i * w..(i + 1) * w]);
            }
        }
    });
    attn
}

/// Cache rows per block of a task whose heads go in pairs: a block of keys (or values) stays
/// in cache while every query row of the task passes over it (at a 2,048-token prompt a key
/// head's keys and values no longer fit in L2, and each row read them from memory).
const KEYS_PER_BLOCK: usize = 64;

/// The cache positions each query row of `rows` attends to: up to its own, within the window.
fn key_ranges(span: &SeqSpan, rows: &Range<usize>, window: Option<usize>) -> Vec<Range<usize>> {
    rows.clone()
        .map(|r| {
            let pos = span.start_pos + r;
            window.map_or(0, |w| (pos + 1).saturating_sub(w))..pos + 1
        })
        .collect()
}

/// Calls `f(row, positions)` for every query row of a task (its keys `keys[row]`) and every
/// block of those positions, block by block: every row's share of one block runs before the
/// next block. Blocks of [`KEYS_PER_BLOCK`] for pairs of heads; one block per row for one
/// head (whose weighted sums add into the output once, as [`axpy_rows`] does).
fn by_key_blocks(keys: &[Range<usize>], heads: usize, mut f: impl FnMut(usize, Range<usize>)) {
    let lo = keys.iter().map(|k| k.start).min().unwrap_or(0);
    let hi = keys.iter().map(|k| k.end).max().unwrap_or(0);
    let block = if heads == 2 { KEYS_PER_BLOCK } else { hi - lo };
    let mut b = lo;
    while b < hi {
        let e = (b + block).min(hi);
        for (r, k) in keys.iter().enumerate() {
            let js = b.max(k.start)..e.min(k.end);
            if !js.is_empty() {
                f(r, js);
            }
        }
        b = e;
    }
}

/// Cache rows per block of a GQA task: a block's keys, values and scores stay in L2 while all
/// the task's queries pass over it (at 128 values a head, 64 KiB of keys and of values).
const KEY_BLOCK: usize = 128;

/// One key head's keys and values in a layer cache: row `j` at `j * stride`.
struct KvBlocks<'a> {
    keys: &'a [f32],
    values: &'a [f32],
    stride: usize,
}

/// Softmax attention of `group` query heads per row (`qs`: `[rows x group, d]`, already
/// scaled) over the cache positions each row sees (`keys[row]`). The positions go in blocks of
/// [`KEY_BLOCK`] aligned to the cache, each row keeping a running maximum and sum (its
/// weighted sums rescaled when the maximum grows), so a row's result does not depend on the
/// other rows of its task. Returns `[rows x group, d]`.
fn attend(qs: &[f32], group: usize, keys: &[Range<usize>], cache: &KvBlocks) -> Vec<f32> {
    let nq = keys.len() * group;
    let d = qs.len().checked_div(nq).unwrap_or(0);
    let lo = keys.iter().map(|k| k.start).min().unwrap_or(0);
    let hi = keys.iter().map(|k| k.end).max().unwrap_or(0);
    let mut out = vec![0.0f32; nq * d];
    let mut max = vec![f32::NEG_INFINITY; nq];
    let mut sum = vec![0.0f32; nq];
    let mut block = vec![0.0f32; nq * KEY_BLOCK];
    let mut b = lo - lo % KEY_BLOCK;
    while b < hi {
        let js = b.max(lo)..(b + KEY_BLOCK).min(hi);
        let (nb, at) = (js.len(), js.start * cache.stride);
        let s = &mut block[..nq * nb];
        blocks::scores(qs, nq, &cache.keys[at..], cache.stride, nb, s);
        for (i, row) in s.chunks_exact_mut(nb).enumerate() {
            // The row's positions within the block (empty when it sees none of them).
            let k = &keys[i / group];
            let v0 = k.start.clamp(js.start, js.end) - js.start;
            let v1 = k.end.clamp(js.start, js.end) - js.start;
            row[..v0].fill(0.0);
            row[v1..].fill(0.0);
            if v0 == v1 {
                continue;
            }
            let seen = &mut row[v0..v1];
            let m = blocks::max(seen, max[i]);
            // The sums so far in units of the new maximum (zero before the first block).
            let rescale = blocks::exp(max[i] - m);
            sum[i] = sum[i] * rescale + blocks::exp_shifted(seen, m);
            if rescale != 1.0 {
                out[i * d..(i + 1) * d]
                    .iter_mut()
                    .for_each(|o| *o *= rescale);
            }
            max[i] = m;
        }
        blocks::mix(s, nq, &cache.values[at..], cache.stride, nb, &mut out);
        b += KEY_BLOCK;
    }
    for (o, &s) in out.chunks_exact_mut(d.max(1)).zip(&sum) {
        let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
        o.iter_mut().for_each(|v| *v *= inv);
    }
    out
}

/// `scores[q][at] = qs[q] · rows[..]`: the scores of one or two query heads against the same
/// cache rows (two in one pass), into positions `at` of each head's scores.
fn scores_of(
    qs: &[&[f32]],
    rows: &[f32],
    stride: usize,
    scores: &mut [Vec<f32>],
    at: Range<usize>,
) {
    match (qs, scores) {
        ([a, b], [sa, sb]) => dot_rows2([a, b], rows, stride, [&mut sa[at.clone()], &mut sb[at]]),
        (qs, scores) => {
            for (q, s) in qs.iter().zip(scores) {
                dot_rows(q, rows, stride, &mut s[at.clone()]);
            }
        }
    }
}

/// `sums[q] += Σ_j probs[q][at][j] · rows[j]` for one or two heads (`sums`: theirs side by
/// side), over the same cache rows (two in one pass, continuing the running sums).
fn mix_rows(probs: &[Vec<f32>], at: Range<usize>, rows: &[f32], stride: usize, sums: &mut [f32]) {
    let width = sums.len() / probs.len().max(1);
    match probs {
        [a, b] => {
            let (sa, sb) = sums.split_at_mut(width);
            axpy_rows2([&a[at.clone()], &b[at]], rows, stride, [sa, sb]);
        }
        probs => {
            for (p, s) in probs.iter().zip(sums.chunks_exact_mut(width)) {
                axpy_rows(&p[at.clone()], rows, stride, s);
            }
        }
    }
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
        // One task per key head: its `group` query heads read the same keys and values.
        let tasks = head_tasks(spans, n_heads, group);
        let outs = parallel_map(tasks.len(), |i| {
            let task = &tasks[i];
            let (cache, span) = (&caches[task.span], &spans[task.span]);
            // The task's queries, scaled, `[rows x group, hd]`: the heads of a key head are
            // side by side in `q`.
            let width = group * hd;
            let mut qs = Vec::with_capacity(task.rows.len() * width);
            for r in task.rows.clone() {
                let at = (span.row + r) * n_heads * hd + task.head * hd;
                qs.extend(q[at..at + width].iter().map(|v| v * scale));
            }
            let keys = key_ranges(span, &task.rows, sliding_window);
            let at = task.head / group * hd;
            let cache = KvBlocks {
                keys: &cache.a()[at..],
                values: &cache.b()[at..],
                stride: kv_w,
            };
            attend(&qs, group, &keys, &cache)
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
        // Every head reads the same latents: heads in pairs.
        let pair = if n_heads.is_multiple_of(2) { 2 } else { 1 };
        let tasks = head_tasks(spans, n_heads, pair);
        let outs = parallel_map(tasks.len(), |i| {
            let HeadTask {
                span,
                head,
                n,
                rows,
            } = tasks[i].clone();
            let (cache, span) = (&caches[span], &spans[span]);
            let heads = head..head + n;
            let keys = key_ranges(span, &rows, None);
            let qrow = |r: usize, h: usize| &q[(span.row + r) * n_heads * qk + h * qk..][..qk];
            // Absorb W_UK: q_lat = W_UKᵀ q_nope, so q_nope · (W_UK c) = q_lat · c.
            let q_lat: Vec<Vec<Vec<f32>>> = rows
                .clone()
                .map(|r| {
                    let absorb = |h: usize| {
                        let w_uk = &self.kv_b[h * (nope + vd) * l..][..nope * l];
                        let mut q_lat = vec![0.0f32; l];
                        for (d, &qd) in qrow(r, h)[..nope].iter().enumerate() {
                            for (ql, w) in q_lat.iter_mut().zip(&w_uk[d * l..(d + 1) * l]) {
                                *ql += qd * w;
                            }
                        }
                        q_lat
                    };
                    heads.clone().map(absorb).collect()
                })
                .collect();
            let zeros = |k: &Range<usize>| vec![vec![0.0f32; k.len()]; n];
            let mut probs: Vec<Vec<Vec<f32>>> = keys.iter().map(zeros).collect();
            let mut rope_scores: Vec<Vec<Vec<f32>>> = keys.iter().map(zeros).collect();
            // Each row's queries, resolved once for all of its blocks.
            let q_lats: Vec<Vec<&[f32]>> = q_lat
                .iter()
                .map(|q| q.iter().map(Vec::as_slice).collect())
                .collect();
            let q_ropes: Vec<Vec<&[f32]>> = rows
                .clone()
                .map(|r| heads.clone().map(|h| &qrow(r, h)[nope..]).collect())
                .collect();
            by_key_blocks(&keys, n, |i, js| {
                let at = js.start - keys[i].start..js.end - keys[i].start;
                let latents = &cache.a()[js.start * l..];
                scores_of(&q_lats[i], latents, l, &mut probs[i], at.clone());
                let k_ropes = &cache.b()[js.start * rd..];
                scores_of(&q_ropes[i], k_ropes, rd, &mut rope_scores[i], at);
            });
            for (p, rs) in probs.iter_mut().flatten().zip(rope_scores.iter().flatten()) {
                for (s, r) in p.iter_mut().zip(rs) {
                    *s = (*s + r) * scale;
                }
                softmax(p);
            }
            let mut o_lat = vec![0.0f32; rows.len() * n * l];
            by_key_blocks(&keys, n, |i, js| {
                let at = js.start - keys[i].start..js.end - keys[i].start;
                let s = &mut o_lat[i * n * l..(i + 1) * n * l];
                mix_rows(&probs[i], at, &cache.a()[js.start * l..], l, s);
            });
            // The sums join zeroed latents, as `axpy_rows` adds its sum.
            o_lat.iter_mut().for_each(|v| *v += 0.0);
            // Absorb W_UV: out = W_UV · Σ p_j c_j.
            let mut out = vec![0.0f32; rows.len() * n * vd];
            let per_row = out.chunks_exact_mut(n * vd).zip(o_lat.chunks_exact(n * l));
            for (out_row, o_lat) in per_row {
                let per_head = heads.clone().zip(out_row.chunks_exact_mut(vd));
                for ((h, o), o_lat) in per_head.zip(o_lat.chunks_exact(l)) {
                    let w_uv = &self.kv_b[h * (nope + vd) * l + nope * l..][..vd * l];
                    for (vi, o) in o.iter_mut().enumerate() {
                        *o = dot(&w_uv[vi * l..(vi + 1) * l], o_lat);
                    }
                }
            }
            out
        });
        let attn = scatter_heads(outs, &tasks, spans, n_heads, vd, t);
        self.o.forward(&attn, t)
    }
}

#[cfg(test)]
mod tests;
