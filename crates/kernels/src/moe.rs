//! The fused MoE operator: routed tokens in, weighted sum of expert MLP outputs out.
//!
//! [`fused_moe`] takes hidden states `[T, H]` and the router's top-k ids and weights `[T, k]`
//! and computes, for every token, `Σ_j w_j · down_e(SiLU(gate_e(x)) * up_e(x))` over its
//! experts `e = ids[j]`. Steps: group tokens by expert ([`group_by_expert`]); then, wave by
//! wave (a few thousand (token, expert) rows, so that a long prompt's scratch stays small and
//! is reused across calls): convert each expert's rows once for its format; one task set over
//! (expert, row chunk, column block) for gate and up together with SiLU(gate) * up in the
//! task's epilogue; convert the intermediate rows; one task set over (expert, row chunk, column
//! block) for down; the weighted combine in f32, token by token in a fixed expert order so
//! results do not depend on thread timing or wave boundaries.
//!
//! Gate and up are packed as one matrix whose 16-column strips alternate gate and up for the
//! same intermediate columns, so a task owns matching gate and up outputs and applies the
//! activation without a second pass. A dense MLP or shared expert is an [`MoeExperts`] of one
//! expert that every token uses with weight 1 ([`dense_mlp`]).
//!
//! A key design decision: the instruction set is chosen per expert from its token count (AMX
//! for [`MoeOptions::amx_min_tokens`] rows or more, AVX-512 below), but all experts' tasks
//! share one dynamically claimed task set, so a skewed routing keeps every core busy.
//!
//! The AMX/AVX-512 crossover ([`DEFAULT_AMX_MIN_TOKENS`]) was measured with `strata bench moe
//! --crossover` on a 16-core Xeon with AMX (2026-11-24, docs/benchmarks.md): one expert of the
//! Qwen3-30B-A3B shape is faster on AMX from 16 tokens in BF16 (0.21 vs 0.34 ms; equal at 8)
//! and in INT8 (0.13 vs 0.14 ms; 1.26x at 128). Integer formats with scales per group flush
//! their tiles once per group, so AMX pays only where groups are long ([`amx_from`]).

use std::ops::Range;

use crate::buf::SharedMut;
use crate::error::{KernelError, check_len};
use crate::isa::Isa;
use crate::packed::micro::{self, Kernel, M_CHUNK, N_BLOCK_STRIPS};
use crate::packed::{Activations, Kind, PackSource, PackedFormat, PackedMatrix, STRIP};
use crate::parallel_for;

/// Tokens per expert from which AMX is used instead of AVX-512 for BF16 and INT8 experts
/// (measured, see the module docs; grouped integers: [`amx_from`]).
pub const DEFAULT_AMX_MIN_TOKENS: usize = 16;

/// Tokens per expert from which INT4 experts with scales per 64 `k` or more use AMX.
const AMX_MIN_TOKENS_INT4: usize = 64;

/// Tokens per expert from which experts whose gate/up projection is `w` run on AMX, given the
/// BF16/INT8 threshold `min`; `None`: never. `strata bench moe --crossover` on the 2-vCPU
/// Xeon with AMX (2026-11-29, docs/benchmarks.md), AVX-512 time / AMX time at 16 / 32 / 64 /
/// 128 / 256 tokens per expert, two rounds: INT8 per row 1.05-1.21 / 1.37-1.40 / 1.22-1.43 /
/// 1.53-1.58 / 1.63-1.73; INT8 per 128 0.96-0.97 / 1.11-1.12 / 1.10-1.24 / 1.09-1.18 /
/// 0.99-1.16; per 64 0.88-0.92 / 1.00-1.01 / 0.85-1.03 / 0.99-1.00 / 0.80-0.86; per 32
/// 0.79-0.91 at 64-256; INT4 per 128 0.70-0.73 / 1.05 / 1.20-1.49 / 1.32-1.43 / 0.81-1.11;
/// per 64 (the default) 1.02-1.23 at 64-256 and behind below; per 32 0.58-0.80 everywhere.
fn amx_from(w: &PackedMatrix, min: usize) -> Option<usize> {
    match w.kind {
        Kind::Bf16 => Some(min),
        Kind::Int8 if w.group >= 128 => Some(min),
        Kind::Int4 if w.group >= 64 => Some(min.max(AMX_MIN_TOKENS_INT4)),
        Kind::Int8 | Kind::Int4 => None,
    }
}

/// One expert's MLP: fused gate/up `[2 I, H]` (strips interleaved) and down `[H, I]`.
#[derive(Debug, Clone)]
pub struct Expert {
    gate_up: PackedMatrix,
    down: PackedMatrix,
}

impl Expert {
    /// Packs row-major `gate: [inter, hidden]`, `up: [inter, hidden]`, `down: [hidden, inter]`.
    pub fn pack<T: PackSource>(
        gate: &[T],
        up: &[T],
        down: &[T],
        hidden: usize,
        inter: usize,
        fmt: PackedFormat,
    ) -> Result<Self, KernelError> {
        const OP: &str = "expert pack";
        check_len(OP, "gate", inter * hidden, gate.len())?;
        check_len(OP, "up", inter * hidden, up.len())?;
        check_len(OP, "down", hidden * inter, down.len())?;
        let i_pad = inter.div_ceil(STRIP) * STRIP;
        // Row 32 b + c is gate row 16 b + c, row 32 b + 16 + c is up row 16 b + c.
        let mut gu = vec![0.0f32; 2 * i_pad * hidden];
        for i in 0..inter {
            let (b, c) = (i / STRIP, i % STRIP);
            for (src, half) in [(gate, 0), (up, STRIP)] {
                let row = (2 * b * STRIP + half + c) * hidden;
                for (d, s) in gu[row..row + hidden]
                    .iter_mut()
                    .zip(&src[i * hidden..(i + 1) * hidden])
                {
                    *d = s.to_f32();
                }
            }
        }
        Ok(Self {
            gate_up: PackedMatrix::pack(&gu, 2 * i_pad, hidden, fmt)?,
            down: PackedMatrix::pack(down, hidden, inter, fmt)?,
        })
    }

    /// Bytes of packed weights and scales.
    pub fn bytes(&self) -> usize {
        self.gate_up.bytes() + self.down.bytes()
    }

    /// An expert from matrices laid out as [`Expert::pack`] makes them (for example mapped
    /// from a converted model file): `gate_up` `[2 I_pad, H]` with gate and up strips
    /// interleaved, `down` `[H, I]`, both in one format.
    pub fn from_parts(gate_up: PackedMatrix, down: PackedMatrix) -> Result<Self, KernelError> {
        let i_pad = down.k.div_ceil(STRIP) * STRIP;
        if gate_up.n != 2 * i_pad || gate_up.k != down.n || gate_up.fmt != down.fmt {
            return Err(KernelError::Mismatch {
                op: "expert from parts",
                what: format!(
                    "gate_up {} [{}, {}] and down {} [{}, {}] do not form one expert",
                    gate_up.fmt.name(),
                    gate_up.n,
                    gate_up.k,
                    down.fmt.name(),
                    down.n,
                    down.k
                ),
            });
        }
        Ok(Self { gate_up, down })
    }

    /// The fused gate/up matrix and the down matrix.
    pub fn parts(&self) -> (&PackedMatrix, &PackedMatrix) {
        (&self.gate_up, &self.down)
    }
}

/// A set of experts of one shape, indexed by expert id.
#[derive(Debug)]
pub struct MoeExperts {
    experts: Vec<Expert>,
    hidden: usize,
    inter: usize,
}

impl MoeExperts {
    /// Collects experts packed for `hidden` and `inter`.
    pub fn new(hidden: usize, inter: usize, experts: Vec<Expert>) -> Result<Self, KernelError> {
        for (e, x) in experts.iter().enumerate() {
            if x.gate_up.k != hidden || x.down.n != hidden || x.down.k != inter {
                return Err(KernelError::Mismatch {
                    op: "moe experts",
                    what: format!(
                        "expert {e} is packed for hidden {} inter {}, expected hidden {hidden} inter {inter}",
                        x.gate_up.k, x.down.k
                    ),
                });
            }
        }
        Ok(Self {
            experts,
            hidden,
            inter,
        })
    }

    /// Number of experts.
    pub fn len(&self) -> usize {
        self.experts.len()
    }

    /// True when there is no expert.
    pub fn is_empty(&self) -> bool {
        self.experts.is_empty()
    }

    /// Hidden size `H`.
    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// Intermediate size `I`.
    pub fn inter(&self) -> usize {
        self.inter
    }

    /// The experts.
    pub fn experts(&self) -> &[Expert] {
        &self.experts
    }
}

/// The tokens routed to one expert, with their combine weights.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertBatch {
    /// Expert id.
    pub expert: usize,
    /// Token indices (rows of the hidden states), increasing.
    pub tokens: Vec<u32>,
    /// Combine weight of each token.
    pub weights: Vec<f32>,
}

/// Knobs of [`fused_moe_with`].
#[derive(Debug, Clone)]
pub struct MoeOptions<'a> {
    /// Only experts with `mask[e] == true` are computed (the others run elsewhere).
    pub expert_mask: Option<&'a [bool]>,
    /// Add into `out` instead of overwriting it (partial sums from other devices or nodes).
    pub accumulate: bool,
    /// Force one instruction set for every expert (capped to [`Isa::selected`]: what the CPU
    /// has, and `STRATA_KERNEL`).
    pub isa: Option<Isa>,
    /// Experts with at least this many tokens use AMX (BF16, INT8 per row or per 128 or more;
    /// INT4 per 64 or more from at least 64 tokens; shorter groups never do).
    pub amx_min_tokens: usize,
}

impl Default for MoeOptions<'_> {
    fn default() -> Self {
        Self {
            expert_mask: None,
            accumulate: false,
            isa: None,
            amx_min_tokens: DEFAULT_AMX_MIN_TOKENS,
        }
    }
}

/// Groups routing `[T, k]` by expert: one batch per expert with tokens, in expert order.
pub fn group_by_expert(
    n_experts: usize,
    topk_ids: &[u32],
    topk_weights: &[f32],
    k: usize,
) -> Result<Vec<ExpertBatch>, KernelError> {
    check_len(
        "group by expert",
        "topk_weights",
        topk_ids.len(),
        topk_weights.len(),
    )?;
    let mut by: Vec<ExpertBatch> = (0..n_experts)
        .map(|expert| ExpertBatch {
            expert,
            tokens: Vec::new(),
            weights: Vec::new(),
        })
        .collect();
    for (j, (&e, &w)) in topk_ids.iter().zip(topk_weights).enumerate() {
        let b = by
            .get_mut(e as usize)
            .ok_or_else(|| KernelError::Mismatch {
                op: "group by expert",
                what: format!("expert id {e} at slot {j}, expected below {n_experts}"),
            })?;
        b.tokens.push((j / k.max(1)) as u32);
        b.weights.push(w);
    }
    Ok(by.into_iter().filter(|b| !b.tokens.is_empty()).collect())
}

/// [`fused_moe_with`] with default options.
pub fn fused_moe(
    experts: &MoeExperts,
    hidden: &[f32],
    topk_ids: &[u32],
    topk_weights: &[f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    fused_moe_with(
        experts,
        hidden,
        topk_ids,
        topk_weights,
        out,
        &MoeOptions::default(),
    )
}

/// The MoE layer: `out[t] = Σ_j topk_weights[t, j] · expert_{topk_ids[t, j]}(hidden[t])`.
///
/// `hidden` and `out` are `[T, H]`; `topk_ids` and `topk_weights` are `[T, k]`.
pub fn fused_moe_with(
    experts: &MoeExperts,
    hidden: &[f32],
    topk_ids: &[u32],
    topk_weights: &[f32],
    out: &mut [f32],
    opts: &MoeOptions,
) -> Result<(), KernelError> {
    let h = experts.hidden;
    if !hidden.len().is_multiple_of(h.max(1)) {
        return Err(KernelError::Mismatch {
            op: "fused moe",
            what: format!(
                "hidden has {} elements, not a multiple of H = {h}",
                hidden.len()
            ),
        });
    }
    let t = hidden.len() / h.max(1);
    let k = topk_ids.len().checked_div(t).unwrap_or(0);
    check_len("fused moe", "topk_ids", t * k, topk_ids.len())?;
    let batches = group_by_expert(experts.len(), topk_ids, topk_weights, k)?;
    fused_moe_grouped(experts, hidden, &batches, out, opts)
}

/// A dense MLP (or shared expert): every token through expert 0 of `mlp` with weight 1.
pub fn dense_mlp(
    mlp: &MoeExperts,
    hidden: &[f32],
    out: &mut [f32],
    accumulate: bool,
) -> Result<(), KernelError> {
    let t = hidden.len() / mlp.hidden.max(1);
    let batch = ExpertBatch {
        expert: 0,
        tokens: (0..t as u32).collect(),
        weights: vec![1.0; t],
    };
    let opts = MoeOptions {
        accumulate,
        ..MoeOptions::default()
    };
    fused_moe_grouped(mlp, hidden, &[batch], out, &opts)
}

/// Bytes of f32 scratch (gate/up activations and down outputs) one wave may use: waves bound
/// the memory a long prompt touches per call, and the buffers are kept per calling thread so
/// a call does not pay page faults for fresh memory (a 4096-token call used to fault in about
/// 0.5 GB).
const WAVE_SCRATCH_BYTES: usize = 24 << 20;

/// A run of rows of one batch: rows `rows` of `batch` (rows are indices into its tokens).
pub(crate) struct Segment<'b> {
    pub(crate) batch: &'b ExpertBatch,
    pub(crate) rows: Range<usize>,
}

/// One parallel task: rows `rows` of segment `s`, strips `strips` of its expert's matrix.
struct Task {
    s: usize,
    rows: Range<usize>,
    strips: Range<usize>,
}

fn tasks(segs: &[Segment], strips: usize) -> Vec<Task> {
    let mut v = Vec::new();
    for (s, seg) in segs.iter().enumerate() {
        let m = seg.rows.len();
        for r0 in (0..m).step_by(M_CHUNK) {
            for s0 in (0..strips).step_by(N_BLOCK_STRIPS) {
                v.push(Task {
                    s,
                    rows: r0..(r0 + M_CHUNK).min(m),
                    strips: s0..(s0 + N_BLOCK_STRIPS).min(strips),
                });
            }
        }
    }
    v
}

/// Splits the active batches into waves of at most `wave_rows` rows, in batch order (a batch
/// larger than a wave is split into several segments).
pub(crate) fn waves<'b>(active: &[&'b ExpertBatch], wave_rows: usize) -> Vec<Vec<Segment<'b>>> {
    let mut all = Vec::new();
    let mut cur: Vec<Segment<'b>> = Vec::new();
    let mut used = 0;
    for &batch in active {
        let mut r = 0;
        while r < batch.tokens.len() {
            if used == wave_rows {
                all.push(std::mem::take(&mut cur));
                used = 0;
            }
            let n = (batch.tokens.len() - r).min(wave_rows - used);
            cur.push(Segment {
                batch,
                rows: r..r + n,
            });
            used += n;
            r += n;
        }
    }
    if !cur.is_empty() {
        all.push(cur);
    }
    all
}

/// Runs `f` on a zeroed `[len]` accumulator tile of this thread, reused across tasks.
fn with_tile<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    thread_local! {
        static TILE: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    }
    let mut tile = TILE.take();
    tile.clear();
    tile.resize(len, 0.0);
    let r = f(&mut tile);
    TILE.set(tile);
    r
}

thread_local! {
    /// Per calling thread: the wave buffers `mid` and `y`, reused across calls.
    static SCRATCH: std::cell::Cell<(Vec<f32>, Vec<f32>)> =
        const { std::cell::Cell::new((Vec::new(), Vec::new())) };
}

/// The batches a fused MoE call computes: each checked against `n_experts` experts and `t`
/// tokens, then those that have tokens and that `opts.expert_mask` selects.
pub(crate) fn active_batches<'b>(
    op: &'static str,
    n_experts: usize,
    t: usize,
    batches: &'b [ExpertBatch],
    opts: &MoeOptions,
) -> Result<Vec<&'b ExpertBatch>, KernelError> {
    let mut active = Vec::with_capacity(batches.len());
    for b in batches {
        let bad = |what: String| KernelError::Mismatch { op, what };
        if b.expert >= n_experts {
            return Err(bad(format!("expert {} of {n_experts}", b.expert)));
        }
        check_len(op, "batch weights", b.tokens.len(), b.weights.len())?;
        if let Some(&tok) = b.tokens.iter().find(|&&x| x as usize >= t) {
            return Err(bad(format!("token {tok} routed, expected below {t}")));
        }
        let selected = opts
            .expert_mask
            .is_none_or(|m| m.get(b.expert) == Some(&true));
        if selected && !b.tokens.is_empty() {
            active.push(b);
        }
    }
    Ok(active)
}

/// Runs the MoE layer on routing already grouped by expert (see [`group_by_expert`]).
///
/// Token rows are processed in waves of at most a few thousand (token, expert) rows; within a
/// wave every step is one task set over all its experts. Each token's expert outputs are added
/// in batch order, whatever the waves and thread timing.
pub fn fused_moe_grouped(
    experts: &MoeExperts,
    hidden: &[f32],
    batches: &[ExpertBatch],
    out: &mut [f32],
    opts: &MoeOptions,
) -> Result<(), KernelError> {
    const OP: &str = "fused moe";
    let (h, inter) = (experts.hidden, experts.inter);
    let t = hidden.len() / h.max(1);
    check_len(OP, "hidden", t * h, hidden.len())?;
    check_len(OP, "out", t * h, out.len())?;
    let active = active_batches(OP, experts.len(), t, batches, opts)?;
    if !opts.accumulate {
        out.fill(0.0);
    }
    if active.is_empty() {
        return Ok(());
    }
    let wave_rows = (WAVE_SCRATCH_BYTES / (4 * (h + inter)) / M_CHUNK).max(1) * M_CHUNK;
    // `STRATA_KERNEL` caps the path here too (`Isa::selected` is at most what the CPU has).
    let best = Isa::selected();
    let amx_min = match experts.experts.first() {
        Some(x) => amx_from(&x.gate_up, opts.amx_min_tokens),
        None => Some(opts.amx_min_tokens),
    };
    let pick = |m: usize| {
        Kernel::Isa(match opts.isa {
            Some(forced) => forced.min(best),
            None if amx_min.is_some_and(|min| m >= min) => best,
            None => best.min(Isa::Avx512),
        })
    };
    run_waves(experts, hidden, &active, out, &pick, wave_rows);
    Ok(())
}

/// Runs the active batches wave by wave on this thread's reused scratch, each expert on kernel
/// `pick(its token count)`.
pub(crate) fn run_waves(
    experts: &MoeExperts,
    hidden: &[f32],
    active: &[&ExpertBatch],
    out: &mut [f32],
    pick: &(impl Fn(usize) -> Kernel + Sync),
    wave_rows: usize,
) {
    let (mut mid, mut y) = SCRATCH.take();
    for wave in waves(active, wave_rows) {
        run_wave(experts, hidden, &wave, out, pick, &mut mid, &mut y);
    }
    SCRATCH.set((mid, y));
}

/// One wave of [`fused_moe_grouped`]: gate/up, SiLU, down and the weighted combine into `out`.
fn run_wave(
    experts: &MoeExperts,
    hidden: &[f32],
    segs: &[Segment],
    out: &mut [f32],
    pick: &(impl Fn(usize) -> Kernel + Sync),
    mid: &mut Vec<f32>,
    y: &mut Vec<f32>,
) {
    let (h, inter) = (experts.hidden, experts.inter);
    // Each segment's kernel, from its expert's token count: its activations are converted
    // (and padded) for it.
    let kernel: Vec<Kernel> = segs.iter().map(|s| pick(s.batch.tokens.len())).collect();
    // Row offset of each segment in the wave's stacked buffers.
    let mut row0 = Vec::with_capacity(segs.len() + 1);
    row0.push(0usize);
    for s in segs {
        row0.push(row0.last().copied().unwrap_or(0) + s.rows.len());
    }
    let rows_total = row0[segs.len()];
    let expert = |s: usize| &experts.experts[segs[s].batch.expert];
    let tok = |s: usize, r: usize| segs[s].batch.tokens[segs[s].rows.start + r] as usize;

    // 1. Convert each segment's token rows for gate/up.
    let x_act: Vec<Activations> = convert_all(segs.len(), |s| {
        Activations::quantize(&expert(s).gate_up, segs[s].rows.len(), kernel[s], |r| {
            let tk = tok(s, r);
            &hidden[tk * h..(tk + 1) * h]
        })
    });

    // 2. Gate and up with SiLU(gate) * up, into `mid: [rows_total, inter]` (every element is
    //    written: the strip pairs cover all intermediate columns).
    mid.resize(rows_total * inter, 0.0);
    {
        let mid_w = SharedMut::new(&mut mid[..]);
        let list = tasks(segs, expert(0).gate_up.strips());
        parallel_for(list.len(), |i| {
            let task = &list[i];
            let w = &expert(task.s).gate_up;
            let ldo = task.strips.len() * STRIP;
            with_tile(task.rows.len() * ldo, |tile| {
                micro::run_block(
                    kernel[task.s],
                    w,
                    &x_act[task.s],
                    task.rows.clone(),
                    task.strips.clone(),
                    tile,
                    ldo,
                );
                // Strip pair (2 p, 2 p + 1) holds gate and up of intermediate columns 16 p ...
                let c0 = task.strips.start / 2 * STRIP;
                let cols = (task.strips.len() / 2 * STRIP).min(inter.saturating_sub(c0));
                for (i, r) in task.rows.clone().enumerate() {
                    // SAFETY: this task alone writes these columns of this segment row.
                    let dst = unsafe { mid_w.part((row0[task.s] + r) * inter + c0, cols) };
                    for (p, d) in dst.chunks_mut(STRIP).enumerate() {
                        let g = &tile[i * ldo + 2 * p * STRIP..][..STRIP];
                        let u = &tile[i * ldo + (2 * p + 1) * STRIP..][..STRIP];
                        micro::silu_mul(g, u, d);
                    }
                }
            });
        });
    }

    // 3. Convert the intermediate rows for down.
    let m_act: Vec<Activations> = convert_all(segs.len(), |s| {
        let base = row0[s] * inter;
        Activations::quantize(&expert(s).down, segs[s].rows.len(), kernel[s], |r| {
            &mid[base + r * inter..base + (r + 1) * inter]
        })
    });

    // 4. Down into `y: [rows_total, h]` (every element written).
    y.resize(rows_total * h, 0.0);
    {
        let y_w = SharedMut::new(&mut y[..]);
        let list = tasks(segs, expert(0).down.strips());
        parallel_for(list.len(), |i| {
            let task = &list[i];
            let w = &expert(task.s).down;
            let ldo = task.strips.len() * STRIP;
            with_tile(task.rows.len() * ldo, |tile| {
                micro::run_block(
                    kernel[task.s],
                    w,
                    &m_act[task.s],
                    task.rows.clone(),
                    task.strips.clone(),
                    tile,
                    ldo,
                );
                let c0 = task.strips.start * STRIP;
                let cols = ldo.min(h - c0);
                for (i, r) in task.rows.clone().enumerate() {
                    // SAFETY: this task alone writes these columns of this segment row.
                    let dst = unsafe { y_w.part((row0[task.s] + r) * h + c0, cols) };
                    dst.copy_from_slice(&tile[i * ldo..i * ldo + cols]);
                }
            });
        });
    }

    // 5. Weighted combine: the wave's rows grouped by token (a stable sort keeps segment
    //    order within a token, so every token adds its experts in batch order), then tasks
    //    over runs of tokens; each output row is read and written once per wave.
    let mut entries: Vec<(u32, u32, f32)> = Vec::with_capacity(rows_total);
    for (s, seg) in segs.iter().enumerate() {
        for r in 0..seg.rows.len() {
            let wt = seg.batch.weights[seg.rows.start + r];
            entries.push((tok(s, r) as u32, (row0[s] + r) as u32, wt));
        }
    }
    entries.sort_by_key(|e| e.0);
    const COMBINE_ROWS: usize = 64;
    let out_w = SharedMut::new(out);
    let y = &y[..];
    let entries = &entries[..];
    parallel_for(rows_total.div_ceil(COMBINE_ROWS), |c| {
        // Chunk `c` owns the tokens whose first entry lies in its range of entries.
        let owns = |i: usize| i == 0 || entries[i].0 != entries[i - 1].0;
        let mut i = c * COMBINE_ROWS;
        let end = ((c + 1) * COMBINE_ROWS).min(rows_total);
        while i < end && !owns(i) {
            i += 1;
        }
        while i < end {
            let t = entries[i].0 as usize;
            // SAFETY: only the chunk holding a token's first entry writes that token's row.
            let o = unsafe { out_w.part(t * h, h) };
            while i < rows_total && entries[i].0 as usize == t {
                let (_, row, wt) = entries[i];
                let row = row as usize * h;
                micro::axpy(o, wt, &y[row..row + h]);
                i += 1;
            }
        }
    });
}

/// Runs `convert(s)` for every segment in parallel and collects the results in order.
pub(crate) fn convert_all<T: Send>(n: usize, convert: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let mut slots: Vec<Option<T>> = (0..n).map(|_| None).collect();
    {
        let w = SharedMut::new(&mut slots);
        parallel_for(n, |b| {
            let value = Some(convert(b));
            // SAFETY: task `b` alone writes slot `b`.
            let slot = unsafe { w.part(b, 1) };
            slot[0] = value;
        });
    }
    slots
        .into_iter()
        .map(|s| s.expect("every slot converted"))
        .collect()
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Plain reference for [`fused_moe`]: token by token, expert by expert, with
/// [`PackedMatrix::matmul_ref`] (the same activation rounding as the fast path).
pub fn fused_moe_ref(
    experts: &MoeExperts,
    hidden: &[f32],
    topk_ids: &[u32],
    topk_weights: &[f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    let h = experts.hidden;
    let inter = experts.inter;
    let t = hidden.len() / h.max(1);
    check_len("fused moe ref", "out", t * h, out.len())?;
    out.fill(0.0);
    let k = topk_ids.len().checked_div(t).unwrap_or(0);
    for tok in 0..t {
        let x = &hidden[tok * h..(tok + 1) * h];
        for j in 0..k {
            let e = experts
                .experts
                .get(topk_ids[tok * k + j] as usize)
                .ok_or_else(|| KernelError::Mismatch {
                    op: "fused moe ref",
                    what: format!("expert id {} out of range", topk_ids[tok * k + j]),
                })?;
            let mut gu = vec![0.0f32; e.gate_up.n];
            e.gate_up.matmul_ref(x, 1, &mut gu)?;
            let act: Vec<f32> = (0..inter)
                .map(|i| {
                    let (b, c) = (i / STRIP, i % STRIP);
                    silu(gu[2 * b * STRIP + c]) * gu[2 * b * STRIP + STRIP + c]
                })
                .collect();
            let mut y = vec![0.0f32; h];
            e.down.matmul_ref(&act, 1, &mut y)?;
            for (o, v) in out[tok * h..(tok + 1) * h].iter_mut().zip(&y) {
                *o += topk_weights[tok * k + j] * v;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
