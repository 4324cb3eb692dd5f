//! CoX-MoE's coalescing-aware orchestration (seed 001, section 4.1): where the three
//! non-MoE operations of a layer run, how experts are split between the GPU and the CPU
//! over the whole batch, and the micro-batch size of the non-MoE part under a VRAM budget.
//!
//! Key types: [`PhaseWork`] (one phase of a batch: sequences, new tokens, context),
//! [`Assignment`] (the device of QKV projection, attention and output projection),
//! [`OpCost`] (one operation's equations 3-6), [`ExpertPlan`] (equations 7-9, the
//! expert co-execution split of one layer), [`VramUse`] and [`PhasePlan`], and the
//! search [`plan_phase`].
//!
//! The latency model is the paper's: each operation costs the PCIe loads of operands
//! that live on the other device (eq. 4), a roofline over its two operands and its FLOPs
//! on its device, once per micro-batch (eq. 5), and the KV store over PCIe when the keys
//! and values are made on one device and cached on the other (eq. 6); the layer is the sum
//! (eq. 2). Experts run once over the whole batch: pinned experts on the GPU, the others
//! either streamed to the GPU or computed on the CPU, split to balance the devices.
//!
//! A key design decision: the search is exhaustive over the 8 assignments, both homes of
//! the KV cache and the candidate micro-batch sizes, because each evaluation is a closed
//! formula; the optimum is then exact for the model rather than a heuristic's, and the
//! tests can check it against brute force.

use crate::{CostModel, Device, Phase};

/// Bytes per activation and KV element (BF16, as in the paper's setup).
pub const ACT_BYTES: f64 = 2.0;

/// One phase of a batch, as the planner sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PhaseWork {
    /// Prefill or decode.
    pub phase: Phase,
    /// Sequences in the batch.
    pub batch: usize,
    /// New tokens per sequence in one step (the prompt in prefill, 1 in decode).
    pub seq: usize,
    /// Positions each new token attends to on average (prompt length in prefill, the
    /// mean KV length over decode).
    pub context: usize,
    /// Positions cached per sequence at the end of the run (prompt + generated), which
    /// sizes the KV cache.
    pub kv_positions: usize,
}

impl PhaseWork {
    /// Tokens of one step of the whole batch.
    pub fn tokens(&self) -> usize {
        self.batch * self.seq
    }
}

/// The device of each non-MoE operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assignment {
    /// QKV projection (op 0).
    pub qkv: Device,
    /// Attention (op 1).
    pub attn: Device,
    /// Output projection (op 2).
    pub out: Device,
}

impl Assignment {
    /// Everything on the GPU.
    pub const GPU: Assignment = Assignment {
        qkv: Device::Gpu,
        attn: Device::Gpu,
        out: Device::Gpu,
    };

    /// The prior systems' fixed placement (FlexGen, MoE-Lightning): everything on the
    /// GPU in prefill, attention on the CPU over a host-memory KV cache in decode.
    pub fn prior_works(phase: Phase) -> Assignment {
        match phase {
            Phase::Prefill => Assignment::GPU,
            Phase::Decode => Assignment {
                attn: Device::Cpu,
                ..Assignment::GPU
            },
        }
    }

    /// All 8 assignments of the three operations to the CPU or the GPU.
    pub fn all() -> Vec<Assignment> {
        let d = |b: usize| if b == 1 { Device::Cpu } else { Device::Gpu };
        (0..8)
            .map(|m| Assignment {
                qkv: d(m & 1),
                attn: d((m >> 1) & 1),
                out: d((m >> 2) & 1),
            })
            .collect()
    }

    /// The devices in operation order.
    pub fn devices(&self) -> [Device; 3] {
        [self.qkv, self.attn, self.out]
    }
}

/// One non-MoE operation's operands and work for one micro-batch (the paper's table 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OpShape {
    /// First operand (activations) bytes.
    pub dx: f64,
    /// Second operand (weights or the KV cache) bytes.
    pub dy: f64,
    /// FLOPs.
    pub flops: f64,
    /// Output bytes (the next operation's first operand).
    pub out: f64,
}

/// Parameters of the QKV and output projections of one layer.
pub fn projection_params(cost: &CostModel) -> (u64, u64) {
    let m = &cost.model;
    let o = (m.n_heads * m.head_dim * m.hidden) as u64;
    (m.attn_params.saturating_sub(o), o.min(m.attn_params))
}

/// Table 1 for a micro-batch of `mb` sequences.
pub fn op_shapes(cost: &CostModel, w: &PhaseWork, mb: usize) -> [OpShape; 3] {
    let m = &cost.model;
    let wb = cost.gpu_bits / 8.0;
    let t = (mb * w.seq) as f64;
    let (qkv_p, o_p) = projection_params(cost);
    let q = (m.n_heads * m.head_dim) as f64;
    let kv = m.kv_elems() as f64;
    let h = m.hidden as f64;
    // Causal prefill attends to half the prompt on average; decode to the whole cache.
    let ctx = match w.phase {
        Phase::Prefill => w.context as f64 / 2.0,
        Phase::Decode => w.context as f64,
    };
    let attn_dy = match w.phase {
        Phase::Prefill => t * kv * ACT_BYTES,
        Phase::Decode => mb as f64 * w.context as f64 * kv * ACT_BYTES,
    };
    [
        OpShape {
            dx: t * h * ACT_BYTES,
            dy: qkv_p as f64 * wb,
            flops: 2.0 * t * qkv_p as f64,
            out: t * (q + kv) * ACT_BYTES,
        },
        OpShape {
            dx: t * q * ACT_BYTES,
            dy: attn_dy,
            flops: 4.0 * t * ctx * q,
            out: t * q * ACT_BYTES,
        },
        OpShape {
            dx: t * q * ACT_BYTES,
            dy: o_p as f64 * wb,
            flops: 2.0 * t * o_p as f64,
            out: t * h * ACT_BYTES,
        },
    ]
}

/// One operation's latency terms over all micro-batches (equations 3-6), seconds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct OpCost {
    /// PCIe loads of operands made or kept on the other device (eq. 4).
    pub load: f64,
    /// Roofline compute (eq. 5).
    pub comp: f64,
    /// KV store over PCIe (eq. 6).
    pub store: f64,
}

impl OpCost {
    /// The operation's latency (eq. 3).
    pub fn total(&self) -> f64 {
        self.load + self.comp + self.store
    }
}

/// Peak FLOP/s and memory bandwidth of a device for dense work.
pub fn peaks(cost: &CostModel, d: Device) -> (f64, f64) {
    match d {
        Device::Gpu => (cost.hw.gpu.flops, cost.hw.gpu.mem_bw),
        _ => (cost.hw.cpu.matmul_flops, cost.hw.cpu.mem_bw),
    }
}

/// Roofline time of one operation on `d` (eq. 5 for one micro-batch).
pub fn roofline(cost: &CostModel, d: Device, s: &OpShape) -> f64 {
    let (f, bw) = peaks(cost, d);
    ((s.dx + s.dy) / bw).max(s.flops / f)
}

/// PCIe time of `bytes` (one copy).
pub fn pcie(cost: &CostModel, bytes: f64) -> f64 {
    if bytes <= 0.0 {
        0.0
    } else {
        cost.hw.pcie.latency_s + bytes / cost.hw.pcie.bw
    }
}

/// Where attention's second operand lives: the new keys and values on the QKV device in
/// prefill, the KV cache's home in decode.
pub fn attn_operand_home(phase: Phase, qkv: Device, kv_home: Device) -> Device {
    match phase {
        Phase::Prefill => qkv,
        Phase::Decode => kv_home,
    }
}

/// Equations 3-6 for the three non-MoE operations, `n_micro` micro-batches of `mb`
/// sequences, the residual stream on the GPU and the KV cache on `kv_home`.
pub fn op_costs(
    cost: &CostModel,
    w: &PhaseWork,
    a: Assignment,
    mb: usize,
    kv_home: Device,
) -> [OpCost; 3] {
    let shapes = op_shapes(cost, w, mb);
    let m = w.batch.div_ceil(mb.max(1)) as f64;
    let devs = a.devices();
    let mut out = [OpCost::default(); 3];
    for i in 0..3 {
        let prev = if i == 0 { Device::Gpu } else { devs[i - 1] };
        let s = &shapes[i];
        let mut load = 0.0;
        if prev != devs[i] {
            load += pcie(cost, s.dx);
        }
        // Attention's second operand: in prefill the new keys and values, made by the QKV
        // projection; in decode the KV cache, read across PCIe when it lives on the other
        // device (weights always live with their operation).
        if i == 1 && attn_operand_home(w.phase, devs[0], kv_home) != devs[1] {
            load += pcie(cost, s.dy);
        }
        // The output projection's result returns to the GPU for the router and experts.
        if i == 2 && devs[2] != Device::Gpu {
            load += pcie(cost, s.out);
        }
        let store = if i == 1 && devs[0] != kv_home {
            let m_ = &cost.model;
            pcie(cost, (mb * w.seq) as f64 * m_.kv_elems() as f64 * ACT_BYTES)
        } else {
            0.0
        };
        out[i] = OpCost {
            load: m * load,
            comp: m * roofline(cost, devs[i], s),
            store: m * store,
        };
    }
    out
}

/// How one layer's experts run (equations 7-9).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ExpertPlan {
    /// Pinned experts computed on the GPU.
    pub gpu: Vec<u32>,
    /// Experts copied to the GPU for this layer and computed there.
    pub streamed: Vec<u32>,
    /// Experts computed on the CPU.
    pub cpu: Vec<u32>,
    /// GPU compute, seconds.
    pub gpu_s: f64,
    /// PCIe host-to-device time of streamed weights and returned CPU results, seconds.
    pub pcie_s: f64,
    /// CPU compute plus the copy of its input rows, seconds.
    pub cpu_s: f64,
    /// The stage's latency: the slowest of GPU, CPU and link.
    pub time: f64,
}

/// GPU time of one expert over `tokens` rows in `n_micro` micro-batches (the weights are
/// read from VRAM once per micro-batch).
pub fn gpu_expert_time(cost: &CostModel, tokens: f64, n_micro: usize) -> f64 {
    if tokens <= 0.0 {
        return 0.0;
    }
    let m = n_micro.max(1) as f64;
    let flops = 2.0 * cost.model.expert_params() as f64 * tokens;
    let bytes = cost.expert_bytes() as f64;
    (flops / cost.hw.gpu.flops).max(m * bytes / cost.hw.gpu.mem_bw)
}

/// Equations 7-9: each active expert runs on the GPU (pinned, or streamed over PCIe
/// first) or on the CPU (`co_execute`; without it every non-pinned expert is streamed).
/// Experts go to the CPU in order of how much GPU and PCIe time they free per second of
/// CPU time, and the prefix that minimises the stage's time is kept; a pinned expert may
/// run on the CPU too when the GPU is the bottleneck (the host keeps every weight).
/// `tokens[e]` is the rows routed to expert `e` over the whole batch; `n_micro` > 1 runs
/// the GPU experts per micro-batch (the baselines' schedule).
pub fn expert_stage(
    cost: &CostModel,
    tokens: &[f64],
    resident: &[bool],
    co_execute: bool,
    n_micro: usize,
) -> ExpertPlan {
    let h = cost.model.hidden as f64;
    let tx = cost.expert_transfer_time();
    // (expert, gpu time, transfer time, cpu time, rows)
    let mut items: Vec<(u32, f64, f64, f64, f64)> = tokens
        .iter()
        .enumerate()
        .filter(|(_, t)| **t > 0.0)
        .map(|(e, &t)| {
            let pinned = resident.get(e).copied().unwrap_or(false);
            let c = cost.expert_time(Device::Cpu, t.ceil() as u32) + pcie(cost, t * h * ACT_BYTES);
            (
                e as u32,
                gpu_expert_time(cost, t, n_micro),
                if pinned { 0.0 } else { tx },
                c,
                t,
            )
        })
        .collect();
    items.sort_by(|a, b| {
        ((b.1 + b.2) / b.3.max(1e-12))
            .total_cmp(&((a.1 + a.2) / a.3.max(1e-12)))
            .then(a.0.cmp(&b.0))
    });
    // Totals with everything on the GPU side, then move items[..j] to the CPU.
    let mut g: f64 = items.iter().map(|i| i.1).sum();
    let mut p: f64 = items.iter().map(|i| i.2).sum();
    let (mut c, mut back) = (0.0, 0.0);
    // The link carries the streamed weights and the CPU's results; the GPU computes a
    // streamed expert as it lands (the simulator times the two staging buffers exactly).
    let stage = |g: f64, p: f64, c: f64, back: f64| {
        let pc = p + if back > 0.0 { pcie(cost, back) } else { 0.0 };
        (g.max(c).max(pc), pc)
    };
    let (mut best_t, mut best_pc) = stage(g, p, c, back);
    let mut best = (0, g, c);
    if co_execute {
        for (j, it) in items.iter().enumerate() {
            g -= it.1;
            p -= it.2;
            c += it.3;
            back += it.4 * h * ACT_BYTES;
            let (t, pc) = stage(g, p.max(0.0), c, back);
            if t < best_t {
                (best_t, best_pc, best) = (t, pc, (j + 1, g, c));
            }
        }
    }
    let (j, g, c) = best;
    let mut plan = ExpertPlan {
        gpu_s: g,
        pcie_s: best_pc,
        cpu_s: c,
        time: best_t,
        ..ExpertPlan::default()
    };
    plan.cpu = items[..j].iter().map(|i| i.0).collect();
    plan.cpu.sort_unstable();
    let mut gpu_side: Vec<&(u32, f64, f64, f64, f64)> = items[j..].iter().collect();
    // Streamed experts heaviest first, so the staging pipeline starts on long work.
    gpu_side.sort_by(|a, b| b.4.total_cmp(&a.4).then(a.0.cmp(&b.0)));
    for i in gpu_side {
        if i.2 > 0.0 {
            plan.streamed.push(i.0);
        } else {
            plan.gpu.push(i.0);
        }
    }
    plan
}

/// What occupies VRAM under a plan, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct VramUse {
    /// Non-expert weights on the GPU (embedding, head, routers, shared experts, dense
    /// layers, and the projections assigned to the GPU).
    pub weights: f64,
    /// KV cache, when it lives on the GPU.
    pub kv: f64,
    /// Activations: the whole batch's hidden states for the coalesced experts and the
    /// GPU operations' micro-batch intermediates (attention scores included).
    pub activations: f64,
    /// Kernel workspace: two staging buffers for streamed experts, the largest expert's
    /// intermediate rows, and the fixed context the caller names.
    pub workspace: f64,
    /// Pinned experts.
    pub experts: f64,
}

impl VramUse {
    /// Everything but the pinned experts.
    pub fn fixed(&self) -> f64 {
        self.weights + self.kv + self.activations + self.workspace
    }

    /// Everything.
    pub fn total(&self) -> f64 {
        self.fixed() + self.experts
    }
}

/// VRAM of everything but pinned experts for a plan; `max_expert_tokens` is the most rows
/// any expert gets at once, `context_bytes` the fixed CUDA context and library workspace.
pub fn vram_fixed(
    cost: &CostModel,
    w: &PhaseWork,
    a: Assignment,
    mb: usize,
    kv_home: Device,
    max_expert_tokens: f64,
    context_bytes: f64,
) -> VramUse {
    let m = &cost.model;
    let wb = cost.gpu_bits / 8.0;
    let l = m.n_layers as f64;
    let (qkv_p, o_p) = projection_params(cost);
    let mut weights = (m.gpu_params() as f64 - l * m.attn_params as f64) * wb;
    if a.qkv == Device::Gpu {
        weights += l * qkv_p as f64 * wb;
    }
    if a.out == Device::Gpu {
        weights += l * o_p as f64 * wb;
    }
    let kv = if kv_home == Device::Gpu {
        (w.batch * w.kv_positions) as f64 * m.kv_elems() as f64 * ACT_BYTES * m.n_layers as f64
    } else {
        0.0
    };
    let t = (mb * w.seq) as f64;
    let q = (m.n_heads * m.head_dim) as f64;
    let mut act = 2.0 * w.tokens() as f64 * m.hidden as f64 * ACT_BYTES;
    if a.qkv == Device::Gpu || a.attn == Device::Gpu {
        act += t * (q + m.kv_elems() as f64) * ACT_BYTES;
    }
    if a.attn == Device::Gpu {
        // Unfused attention materialises the score matrix of the micro-batch.
        act += t * w.context as f64 * m.n_heads as f64 * ACT_BYTES + t * q * ACT_BYTES;
    }
    let workspace = 2.0 * cost.expert_bytes() as f64
        + max_expert_tokens * 2.0 * m.moe_intermediate as f64 * ACT_BYTES
        + context_bytes;
    VramUse {
        weights,
        kv,
        activations: act,
        workspace,
        experts: 0.0,
    }
}

/// Switches of the orchestration, for the paper's ablation (table 3).
#[derive(Debug, Clone, PartialEq)]
pub struct CoxOptions {
    /// Experts over the whole batch (else per micro-batch, the baselines' way).
    pub coalesce: bool,
    /// Non-pinned experts may run on the CPU (else they are all streamed to the GPU).
    pub co_execute: bool,
    /// Search the placement of the non-MoE operations (else the prior systems' fixed one,
    /// [`Assignment::prior_works`], with the KV cache in host memory).
    pub offload_ops: bool,
    /// Candidate micro-batch sizes (sequences); empty means the powers of two up to the
    /// batch, and the batch itself.
    pub micro_batches: Vec<usize>,
    /// Fixed VRAM for the CUDA context and library workspace, bytes.
    pub context_bytes: f64,
}

impl CoxOptions {
    /// The full system.
    pub fn full(context_bytes: f64) -> Self {
        Self {
            coalesce: true,
            co_execute: true,
            offload_ops: true,
            micro_batches: Vec::new(),
            context_bytes,
        }
    }

    fn candidates(&self, batch: usize) -> Vec<usize> {
        if !self.micro_batches.is_empty() {
            return self
                .micro_batches
                .iter()
                .copied()
                .filter(|&m| m >= 1 && m <= batch)
                .collect();
        }
        let mut v: Vec<usize> = std::iter::successors(Some(1usize), |m| m.checked_mul(2))
            .take_while(|&m| m < batch)
            .collect();
        v.push(batch.max(1));
        v
    }
}

/// A phase's chosen plan.
#[derive(Debug, Clone, PartialEq)]
pub struct PhasePlan {
    /// Devices of the non-MoE operations.
    pub assignment: Assignment,
    /// Micro-batch size of the non-MoE part, sequences.
    pub micro_batch: usize,
    /// Micro-batches.
    pub n_micro: usize,
    /// Where the KV cache lives.
    pub kv_home: Device,
    /// Experts pinned in VRAM, counted over all MoE layers.
    pub pinned: usize,
    /// VRAM use.
    pub vram: VramUse,
    /// Non-MoE operations' costs of one layer.
    pub ops: [OpCost; 3],
    /// Expert stage of each MoE layer.
    pub experts: Vec<ExpertPlan>,
    /// Sum over layers of equation 2 (one step of the whole batch), seconds.
    pub step_s: f64,
}

/// Expected rows per expert of each MoE layer for `tokens` tokens: `tokens * top_k *
/// popularity[l][e]`, except that a token picks `top_k` distinct experts, so no expert
/// gets more rows than there are tokens; the excess of a capped expert goes to the others
/// in proportion to their popularity (water-filling).
pub fn expected_rows(cost: &CostModel, popularity: &[Vec<f64>], tokens: usize) -> Vec<Vec<f64>> {
    let k = cost.model.top_k as f64;
    popularity
        .iter()
        .map(|p| {
            let sum: f64 = p.iter().sum();
            let mut q: Vec<f64> = p
                .iter()
                .map(|x| k * x / sum.max(f64::MIN_POSITIVE))
                .collect();
            let mut capped = vec![false; q.len()];
            for _ in 0..q.len() {
                let excess: f64 = q.iter().map(|x| (x - 1.0).max(0.0)).sum();
                if excess <= 1e-12 {
                    break;
                }
                for (x, c) in q.iter_mut().zip(capped.iter_mut()) {
                    if *x >= 1.0 {
                        *x = 1.0;
                        *c = true;
                    }
                }
                let free: f64 = q
                    .iter()
                    .zip(&capped)
                    .filter(|(_, c)| !**c)
                    .map(|(x, _)| x)
                    .sum();
                if free <= 0.0 {
                    break;
                }
                for (x, c) in q.iter_mut().zip(&capped) {
                    if !c {
                        *x += excess * *x / free;
                    }
                }
            }
            q.iter().map(|x| x * tokens as f64).collect()
        })
        .collect()
}

/// Residency masks from a global priority order of `(layer, expert)` and a pin count.
pub fn residency(
    n_layers: usize,
    n_experts: usize,
    order: &[(usize, u32)],
    pinned: usize,
) -> Vec<Vec<bool>> {
    let mut r = vec![vec![false; n_experts]; n_layers];
    for &(l, e) in order.iter().take(pinned) {
        if let Some(x) = r.get_mut(l).and_then(|v| v.get_mut(e as usize)) {
            *x = true;
        }
    }
    r
}

/// Evaluates one configuration; `None` when it does not fit in VRAM.
#[allow(clippy::too_many_arguments)]
pub fn evaluate(
    cost: &CostModel,
    w: &PhaseWork,
    rows: &[Vec<f64>],
    order: &[(usize, u32)],
    a: Assignment,
    mb: usize,
    kv_home: Device,
    opts: &CoxOptions,
) -> Option<PhasePlan> {
    let n_micro = w.batch.div_ceil(mb.max(1));
    let expert_micro = if opts.coalesce { 1 } else { n_micro };
    let max_rows = rows
        .iter()
        .flat_map(|r| r.iter().copied())
        .fold(0.0, f64::max)
        / expert_micro as f64;
    let mut vram = vram_fixed(cost, w, a, mb, kv_home, max_rows, opts.context_bytes);
    let free = cost.hw.gpu.mem_bytes - vram.fixed();
    if free < 0.0 {
        return None;
    }
    let eb = cost.expert_bytes().max(1) as f64;
    let pinned = ((free / eb) as usize).min(order.len());
    vram.experts = pinned as f64 * eb;
    let resident = residency(rows.len(), cost.model.n_experts, order, pinned);
    let ops = op_costs(cost, w, a, mb, kv_home);
    let non_moe: f64 = ops.iter().map(OpCost::total).sum();
    let experts: Vec<ExpertPlan> = rows
        .iter()
        .zip(&resident)
        .map(|(r, res)| expert_stage(cost, r, res, opts.co_execute, expert_micro))
        .collect();
    let dense = cost.model.n_layers as f64 * non_moe;
    let step_s = dense + experts.iter().map(|e| e.time).sum::<f64>();
    Some(PhasePlan {
        assignment: a,
        micro_batch: mb,
        n_micro,
        kv_home,
        pinned,
        vram,
        ops,
        experts,
        step_s,
    })
}

/// Strategy-aware micro-batch determination (section 4.1.2): the feasible assignment,
/// KV home and micro-batch size with the smallest step time. `popularity[l][e]` is the
/// share of layer `l`'s routed rows that expert `e` takes; `order` the pinning priority
/// (expert-aware stratification's, or any other). `None` when nothing fits.
pub fn plan_phase(
    cost: &CostModel,
    w: &PhaseWork,
    popularity: &[Vec<f64>],
    order: &[(usize, u32)],
    kv_homes: &[Device],
    opts: &CoxOptions,
) -> Option<PhasePlan> {
    let rows = expected_rows(cost, popularity, w.tokens());
    let (assignments, homes) = if opts.offload_ops {
        (Assignment::all(), kv_homes.to_vec())
    } else {
        (vec![Assignment::prior_works(w.phase)], vec![Device::Cpu])
    };
    let mut best: Option<PhasePlan> = None;
    for &kv in &homes {
        for &a in &assignments {
            for mb in opts.candidates(w.batch) {
                if let Some(p) = evaluate(cost, w, &rows, order, a, mb, kv, opts)
                    && best.as_ref().is_none_or(|b| p.step_s < b.step_s)
                {
                    best = Some(p);
                }
            }
        }
    }
    best
}

#[cfg(test)]
mod tests;
