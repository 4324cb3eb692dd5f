//! The fused MoE operator on experts stored as ggml blocks ([`GgmlExperts`]): a GGUF's
//! stacked `ffn_{gate,up,down}_exps` tensors, each expert a row range of them, read in place.
//!
//! Steps per wave of (expert, token) rows, each one task set over all the wave's experts so a
//! skewed routing keeps every core busy: convert each expert's token rows once (int8 or f32,
//! by the weights' type); gate and up for a block of intermediate rows in one task, with
//! `SiLU(gate) · up` in its epilogue; convert the intermediate rows; down, each task a block
//! of output columns over every expert, adding each row times its weight into the output in
//! batch order, so results do not depend on thread timing or wave boundaries. Experts
//! without tokens are never read, which is what keeps a mapped model's untouched experts out
//! of memory.

use std::ops::Range;

use crate::buf::SharedMut;
use crate::error::check_len;
use crate::moe::{ExpertBatch, MoeOptions, Segment, active_batches, convert_all, waves};
use crate::packed::micro;
use crate::{Isa, KernelError, parallel_for, vector};

use super::matrix::{Form, GgmlPath, Input};
use super::scratch::{Buffer, with_buffer};
use super::tiles::TileFormat;
use super::{GgmlMatrix, GgmlType};
use crate::packed::Activations;

/// (expert, token) rows per wave: bounds the intermediate buffers of a long prompt.
const WAVE_ROWS: usize = 2048;

/// A MoE layer's SwiGLU experts of one shape, as ggml block matrices.
#[derive(Debug, Clone)]
pub struct GgmlExperts {
    gate: Vec<GgmlMatrix>,
    up: Vec<GgmlMatrix>,
    down: Vec<GgmlMatrix>,
    hidden: usize,
    inter: usize,
}

impl GgmlExperts {
    /// Experts from per-expert matrices: `gate[e]`, `up[e]` `[inter, hidden]`, `down[e]`
    /// `[hidden, inter]`.
    pub fn new(
        gate: Vec<GgmlMatrix>,
        up: Vec<GgmlMatrix>,
        down: Vec<GgmlMatrix>,
        hidden: usize,
        inter: usize,
    ) -> Result<Self, KernelError> {
        let bad = |what: String| KernelError::Mismatch {
            op: "ggml experts",
            what,
        };
        if gate.len() != up.len() || gate.len() != down.len() {
            return Err(bad(format!(
                "{} gate, {} up and {} down matrices",
                gate.len(),
                up.len(),
                down.len()
            )));
        }
        for (e, ((g, u), d)) in gate.iter().zip(&up).zip(&down).enumerate() {
            let shapes = [(g.n(), g.k()), (u.n(), u.k()), (d.n(), d.k())];
            if shapes != [(inter, hidden), (inter, hidden), (hidden, inter)] {
                return Err(bad(format!(
                    "expert {e}: gate, up, down are {shapes:?}, expected [{inter}, {hidden}] twice and [{hidden}, {inter}]"
                )));
            }
        }
        Ok(Self {
            gate,
            up,
            down,
            hidden,
            inter,
        })
    }

    /// Experts from stacked tensors (`[E · inter, hidden]` twice and `[E · hidden, inter]`),
    /// expert `e` being rows `e · inter ..` and `e · hidden ..`: nothing is copied.
    pub fn from_stacked(
        gate: &GgmlMatrix,
        up: &GgmlMatrix,
        down: &GgmlMatrix,
        n_experts: usize,
        hidden: usize,
        inter: usize,
    ) -> Result<Self, KernelError> {
        let split = |m: &GgmlMatrix, rows: usize| {
            (0..n_experts)
                .map(|e| m.rows(e * rows..(e + 1) * rows))
                .collect::<Result<Vec<_>, _>>()
        };
        Self::new(
            split(gate, inter)?,
            split(up, inter)?,
            split(down, hidden)?,
            hidden,
            inter,
        )
    }

    /// Number of experts.
    pub fn len(&self) -> usize {
        self.gate.len()
    }

    /// True when there is no expert.
    pub fn is_empty(&self) -> bool {
        self.gate.is_empty()
    }

    /// Hidden size.
    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// Intermediate size.
    pub fn inter(&self) -> usize {
        self.inter
    }

    /// Expert `e`'s gate, up and down matrices.
    pub fn expert(&self, e: usize) -> (&GgmlMatrix, &GgmlMatrix, &GgmlMatrix) {
        (&self.gate[e], &self.up[e], &self.down[e])
    }

    /// Bytes of all experts' blocks.
    pub fn bytes(&self) -> usize {
        [&self.gate, &self.up, &self.down]
            .iter()
            .flat_map(|v| v.iter())
            .map(|m| m.bytes().len())
            .sum()
    }
}

/// One task: rows `tokens` of segment `s`, weight rows `rows`.
struct Task {
    s: usize,
    tokens: Range<usize>,
    rows: Range<usize>,
}

/// Tasks over every segment's token chunks and weight rows; `split(s)` gives segment `s`'s
/// weight rows and tokens per task.
fn tasks(segs: &[Segment], n_rows: usize, split: impl Fn(usize) -> (usize, usize)) -> Vec<Task> {
    let mut v = Vec::new();
    for (s, seg) in segs.iter().enumerate() {
        let m = seg.rows.len();
        let (rb, chunk) = split(s);
        for t0 in (0..m).step_by(chunk) {
            for r0 in (0..n_rows).step_by(rb) {
                v.push(Task {
                    s,
                    tokens: t0..(t0 + chunk).min(m),
                    rows: r0..(r0 + rb).min(n_rows),
                });
            }
        }
    }
    v
}

/// The MoE layer on block-format experts: `out[t] (+)= Σ w · expert(hidden[t])` over the
/// routing grouped by expert (`batches`, see [`crate::moe::group_by_expert`]).
/// `opts.expert_mask` and `opts.accumulate` apply as in [`crate::moe::fused_moe_with`];
/// `opts.isa` caps the path.
pub fn fused_moe_ggml(
    experts: &GgmlExperts,
    hidden: &[f32],
    batches: &[ExpertBatch],
    out: &mut [f32],
    opts: &MoeOptions,
) -> Result<(), KernelError> {
    fused_moe_ggml_on(experts, hidden, batches, out, opts, None)
}

/// [`fused_moe_ggml`] with every expert matrix along `path` instead of the one its type and
/// token count pick (benchmarks: `strata bench moe --crossover`). An error if the instruction
/// set used does not run `path` ([`GgmlPath::available`]).
pub fn fused_moe_ggml_along(
    experts: &GgmlExperts,
    hidden: &[f32],
    batches: &[ExpertBatch],
    out: &mut [f32],
    opts: &MoeOptions,
    path: GgmlPath,
) -> Result<(), KernelError> {
    fused_moe_ggml_on(experts, hidden, batches, out, opts, Some(path))
}

/// [`fused_moe_ggml`], along `path` if given.
fn fused_moe_ggml_on(
    experts: &GgmlExperts,
    hidden: &[f32],
    batches: &[ExpertBatch],
    out: &mut [f32],
    opts: &MoeOptions,
    path: Option<GgmlPath>,
) -> Result<(), KernelError> {
    const OP: &str = "fused moe (ggml)";
    let h = experts.hidden;
    let t = hidden.len() / h.max(1);
    check_len(OP, "hidden", t * h, hidden.len())?;
    check_len(OP, "out", t * h, out.len())?;
    let active = active_batches(OP, experts.len(), t, batches, opts)?;
    let isa = opts.isa.unwrap_or(Isa::selected()).min(Isa::selected());
    if let Some(path) = path
        && !GgmlPath::available(isa).contains(&path)
    {
        return Err(KernelError::Mismatch {
            op: OP,
            what: format!("the {} path does not run on {}", path.name(), isa.name()),
        });
    }
    if !opts.accumulate {
        out.fill(0.0);
    }
    let form_of = |w: &GgmlMatrix, m: usize| match path {
        Some(path) => w.form_on(isa, path),
        None => w.form(isa, m),
    };
    for wave in waves(&active, WAVE_ROWS) {
        run_wave(experts, hidden, &wave, out, isa, &form_of);
    }
    Ok(())
}

/// [`fused_moe_ggml`] with every matrix in `form` (tests: the tile path on the software tile
/// unit or portable code, whatever the CPU).
#[cfg(test)]
pub(crate) fn fused_moe_ggml_as(
    experts: &GgmlExperts,
    hidden: &[f32],
    batches: &[ExpertBatch],
    out: &mut [f32],
    form: Form,
) -> Result<(), KernelError> {
    let h = experts.hidden;
    let t = hidden.len() / h.max(1);
    let opts = MoeOptions::default();
    let active = active_batches("fused moe (ggml)", experts.len(), t, batches, &opts)?;
    out.fill(0.0);
    for wave in waves(&active, WAVE_ROWS) {
        run_wave(experts, hidden, &wave, out, Isa::Portable, &|_, _| form);
    }
    Ok(())
}

/// How one expert matrix computes `m` tokens.
type FormOf<'a> = &'a (dyn Fn(&GgmlMatrix, usize) -> Form + Sync);

fn run_wave(
    experts: &GgmlExperts,
    hidden: &[f32],
    segs: &[Segment],
    out: &mut [f32],
    isa: Isa,
    form_of: FormOf<'_>,
) {
    let (h, inter) = (experts.hidden, experts.inter);
    let mut row0 = vec![0usize];
    for s in segs {
        row0.push(row0[row0.len() - 1] + s.rows.len());
    }
    let rows_total = row0[segs.len()];
    let tok = |s: usize, r: usize| segs[s].batch.tokens[segs[s].rows.start + r] as usize;
    let expert = |s: usize| experts.expert(segs[s].batch.expert);
    // Each segment's forms for gate, up and down.
    let forms: Vec<[Form; 3]> = (0..segs.len())
        .map(|s| {
            let (g, u, d) = expert(s);
            let m = segs[s].rows.len();
            [form_of(g, m), form_of(u, m), form_of(d, m)]
        })
        .collect();

    // 1. Each segment's token rows, converted for gate (and for up when its type differs):
    // gathered from the wave's tokens converted once where gate takes tiles.
    let x_row = |s: usize| move |r: usize| &hidden[tok(s, r) * h..(tok(s, r) + 1) * h];
    let once = WaveRows::new(hidden, h, segs, |s| (expert(s).0, forms[s][0]));
    let x_in: Vec<(Input, Option<Input>)> = convert_all(segs.len(), |s| {
        let (g, u, _) = expert(s);
        let m = segs[s].rows.len();
        let [gf, uf, _] = forms[s];
        let gi = once
            .gather(g, gf, m, |r| tok(s, r))
            .unwrap_or_else(|| g.input(gf, m, x_row(s)));
        let ui = (gf != uf).then(|| u.input(uf, m, x_row(s)));
        (gi, ui)
    });

    // 2. SiLU(gate) · up into `mid: [rows_total, inter]` (every element written).
    with_buffer(Buffer::Mid, rows_total * inter, |mid| {
        {
            let mid_w = SharedMut::new(mid);
            let list = tasks(segs, inter, |s| {
                let (g, u, _) = expert(s);
                let [gf, uf, _] = forms[s];
                let rows = g.row_block(isa, gf).min(u.row_block(isa, uf));
                (rows, gf.token_chunk().min(uf.token_chunk()))
            });
            parallel_for(list.len(), |i| {
                let task = &list[i];
                let (g, u, _) = expert(task.s);
                let (gi, ui) = &x_in[task.s];
                let nr = task.rows.len();
                with_buffer(Buffer::Gate, task.tokens.len() * nr, |gate| {
                    g.block(isa, gi, task.rows.clone(), task.tokens.clone(), |t, v| {
                        let j = t - task.tokens.start;
                        gate[j * nr..(j + 1) * nr].copy_from_slice(v);
                    });
                    u.block(
                        isa,
                        ui.as_ref().unwrap_or(gi),
                        task.rows.clone(),
                        task.tokens.clone(),
                        |t, v| {
                            let j = t - task.tokens.start;
                            let row = row0[task.s] + t;
                            // SAFETY: this task alone writes these columns of this row.
                            let dst = unsafe { mid_w.part(row * inter + task.rows.start, nr) };
                            micro::silu_mul(&gate[j * nr..(j + 1) * nr], v, dst);
                        },
                    );
                });
            });
        }

        // 3. The intermediate rows converted for down.
        let m_in: Vec<Input> = convert_all(segs.len(), |s| {
            let base = row0[s] * inter;
            expert(s).2.input(forms[s][2], segs[s].rows.len(), |r| {
                &mid[base + r * inter..][..inter]
            })
        });

        // 4. Down, each row added into its token's output with its weight. A task owns a
        // block of output columns for every token and runs the segments in order, so each
        // token's experts add in batch order, as `combine` adds them, and the task's slice
        // of `out` stays in cache across the segments. (Down into a `[rows, h]` buffer, then
        // a combine, wrote and read that buffer through DRAM: 33 MB a layer for a 512-token
        // prompt of Qwen3-30B-A3B; the copies were 3-4% of the prefill.)
        let cols = down_columns(h);
        let out_w = SharedMut::new(out);
        parallel_for(h.div_ceil(cols), |c| {
            let columns = c * cols..((c + 1) * cols).min(h);
            for (s, seg) in segs.iter().enumerate() {
                let d = expert(s).2;
                let df = forms[s][2];
                let (rb, chunk) = (d.row_block(isa, df), df.token_chunk());
                let m = seg.rows.len();
                for t0 in (0..m).step_by(chunk) {
                    for r0 in columns.clone().step_by(rb) {
                        let rows = r0..(r0 + rb).min(columns.end);
                        d.block(
                            isa,
                            &m_in[s],
                            rows.clone(),
                            t0..(t0 + chunk).min(m),
                            |t, v| {
                                let w = seg.batch.weights[seg.rows.start + t];
                                // SAFETY: this task alone writes these columns of every row.
                                let dst =
                                    unsafe { out_w.part(tok(s, t) * h + rows.start, v.len()) };
                                vector::axpy(w, v, dst);
                            },
                        );
                    }
                }
            }
        });
    });
}

/// A wave's tokens converted once for each (type, tile format) its gate matrices take as
/// tiles, for [`Activations::gather`]: a token routed to eight experts was converted for each
/// (2-3% of a 512-token prompt's time on an Emerald Rapids core, 2026-12-01).
struct WaveRows {
    /// Each token's row among the converted ones (`u32::MAX`: not in the wave).
    place: Vec<u32>,
    /// Per (type, format): the converted rows, in chunks of [`WaveRows::CHUNK`] converted in
    /// parallel.
    sets: Vec<((GgmlType, TileFormat), Vec<Activations>)>,
}

impl WaveRows {
    const CHUNK: usize = 32;

    /// The tokens of `segs` (rows of `hidden`, `h` wide) converted for the tile forms of
    /// `gate(s)`, segment `s`'s gate matrix and its form.
    fn new<'e>(
        hidden: &[f32],
        h: usize,
        segs: &[Segment],
        gate: impl Fn(usize) -> (&'e GgmlMatrix, Form),
    ) -> Self {
        let mut sets: Vec<((GgmlType, TileFormat), Vec<Activations>)> = Vec::new();
        let mut tokens: Vec<usize> = Vec::new();
        let mut place = Vec::new();
        for s in 0..segs.len() {
            let (g, form) = gate(s);
            let Form::Tiles(_, fmt) = form else { continue };
            if sets.iter().any(|(key, _)| *key == (g.ty(), fmt)) {
                continue;
            }
            if tokens.is_empty() {
                tokens = segs
                    .iter()
                    .flat_map(|seg| &seg.batch.tokens[seg.rows.clone()])
                    .map(|&t| t as usize)
                    .collect();
                tokens.sort_unstable();
                tokens.dedup();
                place = vec![u32::MAX; hidden.len() / h.max(1)];
                for (i, &t) in tokens.iter().enumerate() {
                    place[t] = i as u32;
                }
            }
            let chunks = convert_all(tokens.len().div_ceil(Self::CHUNK), |c| {
                let chunk = &tokens[c * Self::CHUNK..((c + 1) * Self::CHUNK).min(tokens.len())];
                match g.input(form, chunk.len(), |i| &hidden[chunk[i] * h..][..h]) {
                    Input::Tiles(a, ..) => a,
                    _ => unreachable!("a tile form converts to tile activations"),
                }
            });
            sets.push(((g.ty(), fmt), chunks));
        }
        Self { place, sets }
    }

    /// The input of `g` in `form` for `m` rows, row `r` the token `token(r)`, gathered from the
    /// converted tokens; `None` where they were not converted for it.
    fn gather(
        &self,
        g: &GgmlMatrix,
        form: Form,
        m: usize,
        token: impl Fn(usize) -> usize,
    ) -> Option<Input> {
        let Form::Tiles(kernel, fmt) = form else {
            return None;
        };
        let (_, chunks) = self.sets.iter().find(|(key, _)| *key == (g.ty(), fmt))?;
        let a = Activations::gather(chunks, m, kernel, |r| {
            let i = self.place[token(r)] as usize;
            (i / Self::CHUNK, i % Self::CHUNK)
        });
        Some(Input::Tiles(a, kernel, fmt))
    }
}

/// Output columns per down task of [`run_wave`]: 128 (the in-register kernels' row block, two
/// tiles), or 64 where that would leave fewer than two tasks per thread.
fn down_columns(h: usize) -> usize {
    if h.div_ceil(128) >= 2 * crate::pool::num_threads() {
        128
    } else {
        64
    }
}

/// `out[t] += w · y` for every row of `pieces` (tokens, weights, unweighted output rows
/// `[tokens, h]`), each token's rows in piece order: the one combine order of the ggml MoE
/// layer, so a layer computed in pieces adds exactly as the fused call does.
fn combine<'a>(
    pieces: impl Iterator<Item = (&'a [u32], &'a [f32], &'a [f32])>,
    h: usize,
    out: &mut [f32],
) {
    let mut entries: Vec<(u32, &[f32], f32)> = Vec::new();
    for (tokens, weights, y) in pieces {
        for ((&t, &w), row) in tokens.iter().zip(weights).zip(y.chunks_exact(h)) {
            entries.push((t, row, w));
        }
    }
    entries.sort_by_key(|e| e.0);
    for &(t, row, w) in &entries {
        let t = t as usize;
        vector::axpy(w, row, &mut out[t * h..(t + 1) * h]);
    }
}

/// How [`fused_moe_ggml`] cuts a call over `batches`: waves of (token, expert) rows, each a
/// list of pieces (a batch, or the part of one that falls in the wave), in batch order. A
/// caller whose experts arrive at different times (a cache of experts read from disk)
/// computes each piece when its expert is there ([`ggml_piece_rows`]) and adds them with
/// [`combine_wave`], wave after wave: the result equals the fused call's bit for bit.
pub fn moe_waves(batches: &[ExpertBatch]) -> Vec<Vec<ExpertBatch>> {
    let active: Vec<&ExpertBatch> = batches.iter().filter(|b| !b.tokens.is_empty()).collect();
    waves(&active, WAVE_ROWS)
        .into_iter()
        .map(|wave| {
            wave.iter()
                .map(|seg| ExpertBatch {
                    expert: seg.batch.expert,
                    tokens: seg.batch.tokens[seg.rows.clone()].to_vec(),
                    weights: seg.batch.weights[seg.rows.clone()].to_vec(),
                })
                .collect()
        })
        .collect()
}

/// The unweighted outputs of pieces of one wave ([`moe_waves`]) whose experts `experts`
/// holds: for each piece, its tokens' rows `expert(hidden[t])`, back to back in piece order,
/// into `y: [Σ tokens, hidden]`, computed as [`fused_moe_ggml`] computes them.
pub fn ggml_piece_rows(
    experts: &GgmlExperts,
    hidden: &[f32],
    pieces: &[&ExpertBatch],
    y: &mut [f32],
) -> Result<(), KernelError> {
    const OP: &str = "ggml moe pieces";
    let h = experts.hidden;
    let t = hidden.len() / h.max(1);
    check_len(OP, "hidden", t * h, hidden.len())?;
    let rows: usize = pieces.iter().map(|p| p.tokens.len()).sum();
    check_len(OP, "y", rows * h, y.len())?;
    // Each piece's tokens as rows of their own, weight 1: `0 + 1 · y` is `y` exactly.
    let mut x = Vec::with_capacity(rows * h);
    let mut local = Vec::with_capacity(pieces.len());
    for p in pieces {
        let first = x.len() / h.max(1);
        for &tok in &p.tokens {
            let tok = tok as usize;
            if tok >= t {
                return Err(KernelError::Mismatch {
                    op: OP,
                    what: format!("token {tok} routed, expected below {t}"),
                });
            }
            x.extend_from_slice(&hidden[tok * h..(tok + 1) * h]);
        }
        local.push(ExpertBatch {
            expert: p.expert,
            tokens: (first as u32..(first + p.tokens.len()) as u32).collect(),
            weights: vec![1.0; p.tokens.len()],
        });
    }
    let active = active_batches(OP, experts.len(), rows, &local, &MoeOptions::default())?;
    let segs: Vec<Segment> = active
        .iter()
        .map(|&batch| Segment {
            batch,
            rows: 0..batch.tokens.len(),
        })
        .collect();
    y.fill(0.0);
    let isa = Isa::selected();
    run_wave(experts, &x, &segs, y, isa, &|w, m| w.form(isa, m));
    Ok(())
}

/// Adds one wave's pieces into `out: [T, hidden]` as [`fused_moe_ggml`] does: `ys[p]` holds
/// piece `p`'s rows from [`ggml_piece_rows`].
pub fn combine_wave(
    wave: &[ExpertBatch],
    ys: &[&[f32]],
    hidden: usize,
    out: &mut [f32],
) -> Result<(), KernelError> {
    const OP: &str = "ggml moe combine";
    check_len(OP, "piece outputs", wave.len(), ys.len())?;
    for (p, y) in wave.iter().zip(ys) {
        check_len(OP, "piece rows", p.tokens.len() * hidden, y.len())?;
        check_len(OP, "piece weights", p.tokens.len(), p.weights.len())?;
        if let Some(&t) = p
            .tokens
            .iter()
            .find(|&&t| (t as usize + 1) * hidden > out.len())
        {
            return Err(KernelError::Mismatch {
                op: OP,
                what: format!(
                    "token {t} past the output's {} rows",
                    out.len() / hidden.max(1)
                ),
            });
        }
    }
    let pieces = wave
        .iter()
        .zip(ys)
        .map(|(p, y)| (&p.tokens[..], &p.weights[..], *y));
    combine(pieces, hidden, out);
    Ok(())
}

/// Plain reference for [`fused_moe_ggml`]: token by token, expert by expert, with
/// [`GgmlMatrix::matmul_ref`] (the same activation rounding as the fast path).
pub fn fused_moe_ggml_ref(
    experts: &GgmlExperts,
    hidden: &[f32],
    batches: &[ExpertBatch],
    out: &mut [f32],
) -> Result<(), KernelError> {
    let (h, inter) = (experts.hidden, experts.inter);
    check_len("fused moe (ggml) ref", "out", hidden.len(), out.len())?;
    out.fill(0.0);
    for b in batches {
        let (g, u, d) = experts.expert(b.expert);
        for (&t, &w) in b.tokens.iter().zip(&b.weights) {
            let x = &hidden[t as usize * h..(t as usize + 1) * h];
            let (mut gv, mut uv) = (vec![0.0; inter], vec![0.0; inter]);
            g.matmul_ref(x, 1, &mut gv)?;
            u.matmul_ref(x, 1, &mut uv)?;
            let mid: Vec<f32> = gv
                .iter()
                .zip(&uv)
                .map(|(&g, &u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            let mut y = vec![0.0; h];
            d.matmul_ref(&mid, 1, &mut y)?;
            for (o, v) in out[t as usize * h..(t as usize + 1) * h].iter_mut().zip(&y) {
                *o += w * v;
            }
        }
    }
    Ok(())
}
