//! Throughput-mode simulation: a batch of hundreds of sequences, prefill then decode,
//! over micro-batches on GPU, CPU and PCIe timelines (each direction of the link its
//! own lane), for CoX-MoE (seed 001) and its baselines FlexGen and MoE-Lightning.
//!
//! Key entry points: [`System`] (what runs), [`Setup`] (batch, lengths, expert
//! popularity and pinning order), [`run`] (one system on one setup) and
//! [`ThroughputReport`] (generated tokens/s and device utilisation).
//!
//! Per layer and micro-batch the simulator issues the non-MoE operations (QKV
//! projection, attention, output projection) on their devices with the activation and KV
//! copies between them, then the experts:
//! - CoX-MoE runs the plan of [`strata_policy::throughput::plan_phase`]: each operation on
//!   its assigned device, software-pipelined over micro-batches (op 0 of micro-batch `j`
//!   beside op 1 of `j - 1` and op 2 of `j - 2`, the overlap of its figure 5(a)), then the
//!   experts once over the whole batch: pinned ones on the GPU, streamed ones through two
//!   staging buffers (copy `i` waits for the GPU to finish streamed expert `i - 2`), the
//!   rest on the CPU with their rows copied over and back.
//! - FlexGen (zig-zag block schedule): the next layer's non-resident weights load while
//!   the current layer computes; micro-batches run one after another, decode attention on
//!   the CPU, experts on the GPU per micro-batch.
//! - MoE-Lightning (CGOPipe): the same weight paging and CPU attention, but the GPU runs
//!   the pre-attention work of micro-batch `j + 1` while the CPU attends for `j`, so the
//!   devices overlap.
//!
//! Decode is simulated at `decode_samples` evenly spaced steps, each standing for its
//! share of the generated tokens (the step time grows only through the attention's KV
//! length, linearly).
//!
//! A key design decision: the baselines get the same cost model, the same VRAM accounting
//! and a search over their micro-batch size by simulation (their papers search with their
//! own cost models); what differs between systems is only the schedule each paper
//! describes, never a per-system factor.

use strata_policy::throughput::{
    ACT_BYTES, Assignment, CoxOptions, PhasePlan, PhaseWork, attn_operand_home, expected_rows,
    gpu_expert_time, op_shapes, pcie, plan_phase, roofline,
};
use strata_policy::{CostModel, Device, Phase};

use crate::{Error, Result};
use strata_policy::rng::SplitMix;

/// The system being simulated.
#[derive(Debug, Clone, PartialEq)]
pub enum System {
    /// CoX-MoE with its switches; `overlap` pipelines the prefill micro-batches over the
    /// devices (the ablation's technique (c)).
    Cox {
        /// Orchestration switches.
        opts: CoxOptions,
        /// Software-pipeline the prefill micro-batches.
        overlap: bool,
    },
    /// FlexGen's zig-zag block schedule.
    FlexGen,
    /// MoE-Lightning's CPU-GPU-I/O pipeline.
    MoeLightning,
}

impl System {
    /// Short name.
    pub fn name(&self) -> String {
        match self {
            System::Cox { .. } => "cox-moe".into(),
            System::FlexGen => "flexgen".into(),
            System::MoeLightning => "moe-lightning".into(),
        }
    }
}

/// One throughput run's workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Setup {
    /// Sequences.
    pub batch: usize,
    /// Prompt tokens per sequence.
    pub prompt: usize,
    /// Generated tokens per sequence.
    pub generate: usize,
    /// `[moe_layer][expert]`: share of the layer's routed rows each expert takes.
    pub popularity: Vec<Vec<f64>>,
    /// Pinning priority of `(moe_layer, expert)` for CoX-MoE (stratification's order).
    pub order: Vec<(usize, u32)>,
    /// Fixed VRAM for the CUDA context and library workspace, bytes.
    pub context_bytes: f64,
    /// Decode steps simulated (at least 1).
    pub decode_samples: usize,
}

/// Expert popularity of a synthetic model: Zipf with exponent growing linearly from
/// `skew_first` to `skew_last` over the layers, experts shuffled per layer (the same
/// family as [`crate::workload::SyntheticParams`]).
pub fn zipf_popularity(
    moe_layers: usize,
    n_experts: usize,
    skew_first: f64,
    skew_last: f64,
    seed: u64,
) -> Vec<Vec<f64>> {
    let mut rng = SplitMix::new(seed);
    (0..moe_layers)
        .map(|l| {
            let f = if moe_layers > 1 {
                l as f64 / (moe_layers - 1) as f64
            } else {
                1.0
            };
            let s = skew_first + (skew_last - skew_first) * f;
            let mut perm: Vec<usize> = (0..n_experts).collect();
            for i in (1..perm.len()).rev() {
                perm.swap(i, rng.below(i + 1));
            }
            let mut w = vec![0.0; n_experts];
            for (rank, &e) in perm.iter().enumerate() {
                w[e] = 1.0 / ((rank + 1) as f64).powf(s);
            }
            let t: f64 = w.iter().sum();
            w.iter().map(|x| x / t).collect()
        })
        .collect()
}

/// What a throughput run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct ThroughputReport {
    /// System name.
    pub system: String,
    /// Generated tokens per second over prefill and decode (`batch * generate / total`).
    pub tokens_per_s: f64,
    /// Prefill seconds.
    pub prefill_s: f64,
    /// Decode seconds.
    pub decode_s: f64,
    /// GPU busy share of the run.
    pub util_gpu: f64,
    /// CPU busy share.
    pub util_cpu: f64,
    /// Host-to-device link busy share.
    pub util_pcie: f64,
    /// Micro-batch size (sequences) of prefill and decode.
    pub micro_batch: (usize, usize),
    /// Routed experts resident in VRAM (all MoE layers together) in prefill and decode.
    pub pinned: (usize, usize),
    /// A one-line description of the chosen schedule.
    pub plan: String,
}

const GPU: usize = 0;
const CPU: usize = 1;
const H2D: usize = 2;
const D2H: usize = 3;

/// In-order device timelines.
#[derive(Debug, Clone, Default)]
struct Lanes {
    free: [f64; 4],
    busy: [f64; 4],
    /// Latest end of any operation (the serialisation point without overlap).
    last: f64,
}

impl Lanes {
    fn op(&mut self, lane: usize, ready: f64, dur: f64) -> f64 {
        let start = self.free[lane].max(ready);
        let end = start + dur.max(0.0);
        self.free[lane] = end;
        self.busy[lane] += dur.max(0.0);
        self.last = self.last.max(end);
        end
    }

    fn link(from: Device, to: Device) -> usize {
        if from == Device::Gpu && to != Device::Gpu {
            D2H
        } else {
            H2D
        }
    }

    fn dev(d: Device) -> usize {
        if d == Device::Gpu { GPU } else { CPU }
    }
}

/// Micro-batch sizes covering `batch` in pieces of `mb`.
fn pieces(batch: usize, mb: usize) -> Vec<usize> {
    let mb = mb.max(1);
    let mut v = vec![mb; batch / mb];
    if !batch.is_multiple_of(mb) {
        v.push(batch % mb);
    }
    v
}

/// GPU work of a layer that is neither attention nor routed experts: shared experts or the
/// dense MLP.
fn dense_gpu(cost: &CostModel, layer: usize, tokens: usize) -> f64 {
    if layer < cost.model.dense_layers {
        cost.dense_mlp_time(tokens)
    } else {
        cost.shared_time(tokens)
    }
}

fn work(setup: &Setup, phase: Phase, step: usize) -> PhaseWork {
    match phase {
        Phase::Prefill => PhaseWork {
            phase,
            batch: setup.batch,
            seq: setup.prompt,
            context: setup.prompt,
            kv_positions: setup.prompt + setup.generate,
        },
        Phase::Decode => PhaseWork {
            phase,
            batch: setup.batch,
            seq: 1,
            context: setup.prompt + step,
            kv_positions: setup.prompt + setup.generate,
        },
    }
}

/// The decode steps simulated and the weight of each.
fn decode_steps(setup: &Setup) -> Vec<(usize, f64)> {
    let n = setup.decode_samples.clamp(1, setup.generate.max(1));
    (0..n)
        .map(|i| {
            let step = ((2 * i + 1) * setup.generate) / (2 * n);
            (step, setup.generate as f64 / n as f64)
        })
        .collect()
}

/// One step's rows per expert drawn around `expected` (rows for `tokens` tokens): each
/// expert's count is binomial with `tokens` trials (Poisson when its mean is small, normal
/// when large), so a small batch leaves rarely chosen experts idle, as real routing does.
/// Seeded per step, so every system sees the same routing.
fn sample_rows(expected: &[Vec<f64>], tokens: usize, seed: u64) -> Vec<Vec<f64>> {
    let mut rng = SplitMix::new(seed);
    let n = tokens as f64;
    expected
        .iter()
        .map(|layer| {
            layer
                .iter()
                .map(|&mean| {
                    let q = (mean / n.max(1.0)).clamp(0.0, 1.0);
                    let draw = if mean < 30.0 {
                        // Poisson by inversion.
                        let (mut k, mut p, u) = (0.0, (-mean).exp(), rng.uniform());
                        let mut cdf = p;
                        while u > cdf && k < n {
                            k += 1.0;
                            p *= mean / k;
                            cdf += p;
                        }
                        k
                    } else {
                        (mean + (mean * (1.0 - q)).sqrt() * rng.normal()).round()
                    };
                    draw.clamp(0.0, n)
                })
                .collect()
        })
        .collect()
}

/// One step of CoX-MoE under `plan`; returns the step's makespan.
fn cox_step(
    cost: &CostModel,
    plan: &PhasePlan,
    w: &PhaseWork,
    rows: &[Vec<f64>],
    overlap: bool,
    lanes: &mut Lanes,
) -> f64 {
    let devs = plan.assignment.devices();
    let h = cost.model.hidden as f64;
    let tx = cost.expert_transfer_time();
    let parts = pieces(w.batch, plan.micro_batch);
    let shapes: Vec<_> = parts.iter().map(|&mb| op_shapes(cost, w, mb)).collect();
    let mut t_in = 0.0f64;
    // GPU ends of the previous layer's last two streamed experts (their staging buffers).
    let mut buf_free = [0.0f64; 2];
    for layer in 0..cost.model.n_layers {
        let moe = layer.checked_sub(cost.model.dense_layers);
        let ep = moe.and_then(|m| plan.experts.get(m));
        let r: &[f64] = moe.and_then(|m| rows.get(m)).map_or(&[], Vec::as_slice);
        let rows_of = |e: u32| r.get(e as usize).copied().unwrap_or(0.0);
        // Experts no token chose this step are not copied.
        let streamed: Vec<u32> = ep.map_or(Vec::new(), |ep| {
            ep.streamed
                .iter()
                .copied()
                .filter(|&e| rows_of(e) > 0.0)
                .collect()
        });
        // The first two staging copies start with the layer.
        let mut copies: Vec<f64> = Vec::new();
        for slot in buf_free.iter().take(streamed.len().min(2)) {
            copies.push(lanes.op(H2D, t_in.max(*slot), tx));
        }
        // Non-MoE operations, software-pipelined over micro-batches when overlapping.
        let m = parts.len();
        let mut x = vec![t_in; m];
        let mut done = t_in;
        let serial = !overlap && w.phase == Phase::Prefill;
        let issue = |j: usize, i: usize, lanes: &mut Lanes, x: &mut Vec<f64>| {
            let s = &shapes[j][i];
            let prev = if i == 0 { Device::Gpu } else { devs[i - 1] };
            let mut r = if serial { x[j].max(lanes.last) } else { x[j] };
            if prev != devs[i] {
                r = lanes.op(Lanes::link(prev, devs[i]), r, pcie(cost, s.dx));
            }
            let home = attn_operand_home(w.phase, devs[0], plan.kv_home);
            if i == 1 && home != devs[1] {
                r = lanes.op(Lanes::link(home, devs[1]), r, pcie(cost, s.dy));
            }
            r = lanes.op(Lanes::dev(devs[i]), r, roofline(cost, devs[i], s));
            if i == 1 && devs[0] != plan.kv_home {
                let kv = (parts[j] * w.seq) as f64 * cost.model.kv_elems() as f64 * ACT_BYTES;
                // The store runs beside the attention; nothing waits on it in this layer.
                lanes.op(Lanes::link(devs[0], plan.kv_home), r, pcie(cost, kv));
            }
            if i == 2 && devs[2] != Device::Gpu {
                r = lanes.op(H2D, r, pcie(cost, s.out));
            }
            x[j] = r;
        };
        if serial {
            for j in 0..m {
                for i in 0..3 {
                    issue(j, i, lanes, &mut x);
                }
            }
        } else {
            for s in 0..m + 2 {
                for i in 0..3 {
                    if let Some(j) = s.checked_sub(i).filter(|&j| j < m) {
                        issue(j, i, lanes, &mut x);
                    }
                }
            }
        }
        for &e in &x {
            done = done.max(e);
        }
        let tokens = w.tokens();
        done = lanes.op(GPU, done, dense_gpu(cost, layer, tokens));
        let Some(ep) = ep else {
            t_in = done;
            continue;
        };
        // CPU experts: their rows go over, the CPU computes, the results come back.
        let cpu_rows: f64 = ep.cpu.iter().map(|&e| rows_of(e)).sum();
        let mut cpu_end = done;
        if !ep.cpu.is_empty() {
            let d = lanes.op(D2H, done, pcie(cost, cpu_rows * h * ACT_BYTES));
            let c: f64 = ep
                .cpu
                .iter()
                .map(|&e| cost.expert_time(Device::Cpu, rows_of(e).ceil() as u32))
                .sum();
            cpu_end = lanes.op(CPU, d, c);
        }
        let resident: f64 = ep
            .gpu
            .iter()
            .map(|&e| gpu_expert_time(cost, rows_of(e), 1))
            .sum();
        let mut gpu_end = lanes.op(GPU, done, resident);
        let mut ends: Vec<f64> = Vec::new();
        for (i, &e) in streamed.iter().enumerate() {
            let landed = match copies.get(i) {
                Some(&c) => c,
                None => {
                    let c = lanes.op(H2D, ends[i - 2], tx);
                    copies.push(c);
                    c
                }
            };
            gpu_end = lanes.op(GPU, landed.max(done), gpu_expert_time(cost, rows_of(e), 1));
            ends.push(gpu_end);
        }
        buf_free = [0.0; 2];
        for (slot, &e) in buf_free.iter_mut().zip(ends.iter().rev()) {
            *slot = e;
        }
        if !ep.cpu.is_empty() {
            cpu_end = lanes.op(H2D, cpu_end, pcie(cost, cpu_rows * h * ACT_BYTES));
        }
        t_in = gpu_end.max(cpu_end);
    }
    let rows_out = w.batch;
    lanes.op(GPU, t_in, cost.head_time(rows_out))
}

/// VRAM left for routed experts under a baseline's schedule with micro-batch `mb`, or
/// `None` when the fixed part does not fit: non-expert weights, the micro-batch's
/// activations (scores of GPU prefill attention included), two layers of expert weights
/// being paged, the context.
fn baseline_free(cost: &CostModel, w: &PhaseWork, mb: usize, context: f64) -> Option<f64> {
    let m = &cost.model;
    let t = (mb * w.seq) as f64;
    let q = (m.n_heads * m.head_dim) as f64;
    let mut act = t * (2.0 * m.hidden as f64 + q + m.kv_elems() as f64) * ACT_BYTES
        + t * m.top_k as f64 * 2.0 * m.moe_intermediate as f64 * ACT_BYTES;
    if w.phase == Phase::Prefill {
        act += t * w.context as f64 * m.n_heads as f64 * ACT_BYTES;
    }
    let paging = 2.0 * m.n_experts as f64 * cost.expert_bytes() as f64;
    let free = cost.hw.gpu.mem_bytes - cost.gpu_weight_bytes() as f64 - act - paging - context;
    (free >= 0.0).then_some(free)
}

/// One step of FlexGen (`pipelined == false`) or MoE-Lightning (`true`) with micro-batch
/// `mb`; returns the makespan, or `None` when it does not fit.
fn baseline_step(
    cost: &CostModel,
    w: &PhaseWork,
    rows: &[Vec<f64>],
    mb: usize,
    pipelined: bool,
    context: f64,
    lanes: &mut Lanes,
) -> Option<(f64, usize)> {
    let m = &cost.model;
    let free = baseline_free(cost, w, mb, context)?;
    let moe_layers = m.moe_layers().max(1);
    // Weights are split the same way in every layer (FlexGen's per-tensor percentages):
    // the first experts of each layer stay, the rest are paged in per layer.
    let per_layer =
        ((free / (moe_layers as f64 * cost.expert_bytes() as f64)) as usize).min(m.n_experts);
    let paged = (m.n_experts - per_layer) as f64;
    let page_s = pcie(cost, paged * cost.expert_bytes() as f64);
    let parts = pieces(w.batch, mb);
    let a = Assignment {
        qkv: Device::Gpu,
        attn: if w.phase == Phase::Decode {
            Device::Cpu
        } else {
            Device::Gpu
        },
        out: Device::Gpu,
    };
    // Expert time of each MoE layer for each distinct micro-batch size (at most two).
    let sizes: Vec<usize> = {
        let mut v = parts.clone();
        v.dedup();
        v
    };
    let ex_time: Vec<Vec<f64>> = rows
        .iter()
        .map(|r| {
            sizes
                .iter()
                .map(|&sz| {
                    let frac = sz as f64 / w.batch as f64;
                    r.iter().map(|&t| gpu_expert_time(cost, t * frac, 1)).sum()
                })
                .collect()
        })
        .collect();
    let mut t_in = 0.0f64;
    // GPU end of the layers whose paging buffer the next copy reuses.
    let mut layer_end: Vec<f64> = Vec::new();
    for layer in 0..m.n_layers {
        let moe = layer.checked_sub(m.dense_layers);
        // Zig-zag: this layer's weights were requested when layer - 2 finished (two
        // buffers), so they load while layer - 1 computes.
        let weights = match moe {
            Some(_) if paged > 0.0 => {
                let ready = layer
                    .checked_sub(2)
                    .and_then(|l| layer_end.get(l))
                    .copied()
                    .unwrap_or(0.0);
                lanes.op(H2D, ready, page_s)
            }
            _ => 0.0,
        };
        let mut chain_end = t_in;
        let mut pre_end = vec![t_in; parts.len()];
        let pre = |j: usize, lanes: &mut Lanes, start: f64| -> f64 {
            let s = op_shapes(cost, w, parts[j]);
            let mut r = lanes.op(GPU, start, roofline(cost, Device::Gpu, &s[0]));
            if a.attn == Device::Cpu {
                r = lanes.op(D2H, r, pcie(cost, s[0].out));
                r = lanes.op(CPU, r, roofline(cost, Device::Cpu, &s[1]));
                r = lanes.op(H2D, r, pcie(cost, s[1].out));
            } else {
                r = lanes.op(GPU, r, roofline(cost, Device::Gpu, &s[1]));
                // The KV cache lives in host memory for the CPU's decode attention.
                let kv = (parts[j] * w.seq) as f64 * m.kv_elems() as f64 * ACT_BYTES;
                lanes.op(D2H, r, pcie(cost, kv));
            }
            r
        };
        let post = |j: usize, lanes: &mut Lanes, start: f64| -> f64 {
            let s = op_shapes(cost, w, parts[j]);
            let tokens = parts[j] * w.seq;
            let mut r = lanes.op(GPU, start, roofline(cost, Device::Gpu, &s[2]));
            r = lanes.op(GPU, r, dense_gpu(cost, layer, tokens));
            if let Some(l) = moe {
                let k = sizes.iter().position(|&sz| sz == parts[j]).unwrap_or(0);
                r = lanes.op(GPU, r.max(weights), ex_time[l][k]);
            }
            r
        };
        if pipelined {
            // CGOPipe: pre-attention of j + 1 is issued before post-attention of j.
            for j in 0..=parts.len() {
                if j < parts.len() {
                    pre_end[j] = pre(j, lanes, t_in);
                }
                if j >= 1 {
                    chain_end = chain_end.max(post(j - 1, lanes, pre_end[j - 1]));
                }
            }
        } else {
            for j in 0..parts.len() {
                let p = pre(j, lanes, chain_end);
                chain_end = post(j, lanes, p);
            }
        }
        layer_end.push(chain_end);
        t_in = chain_end;
    }
    Some((
        lanes.op(GPU, t_in, cost.head_time(w.batch)),
        per_layer * moe_layers,
    ))
}

fn candidates(batch: usize) -> Vec<usize> {
    let mut v: Vec<usize> = std::iter::successors(Some(1usize), |m| m.checked_mul(2))
        .take_while(|&m| m < batch)
        .collect();
    v.push(batch.max(1));
    v
}

/// The micro-batch among [`candidates`] with the fastest baseline step (the first of equals);
/// `None` when none fits.
fn fastest_micro_batch(
    cost: &CostModel,
    w: &PhaseWork,
    rows: &[Vec<f64>],
    batch: usize,
    pipelined: bool,
    context: f64,
) -> Option<usize> {
    let mut best: Option<(f64, usize)> = None;
    for mb in candidates(batch) {
        let mut l = Lanes::default();
        if let Some((t, _)) = baseline_step(cost, w, rows, mb, pipelined, context, &mut l)
            && best.is_none_or(|b| t < b.0)
        {
            best = Some((t, mb));
        }
    }
    best.map(|(_, mb)| mb)
}

/// Simulates `system` on `setup`.
pub fn run(cost: &CostModel, system: &System, setup: &Setup) -> Result<ThroughputReport> {
    if setup.batch == 0 || setup.prompt == 0 || setup.generate == 0 {
        return Err(Error::Mismatch(format!(
            "throughput setup needs a batch, a prompt and generated tokens, got {} x {} + {}",
            setup.batch, setup.prompt, setup.generate
        )));
    }
    if setup.popularity.len() != cost.model.moe_layers() {
        return Err(Error::Mismatch(format!(
            "popularity has {} layers, the model {} MoE layers",
            setup.popularity.len(),
            cost.model.moe_layers()
        )));
    }
    let pre_w = work(setup, Phase::Prefill, 0);
    let steps = decode_steps(setup);
    // The routing every system is measured on: one draw per simulated step.
    let pre_sampled = sample_rows(
        &expected_rows(cost, &setup.popularity, pre_w.tokens()),
        pre_w.tokens(),
        1,
    );
    let dec_expected = expected_rows(cost, &setup.popularity, setup.batch);
    let dec_sampled: Vec<Vec<Vec<f64>>> = steps
        .iter()
        .map(|&(step, _)| sample_rows(&dec_expected, setup.batch, 2 + step as u64))
        .collect();
    let mut lanes_total = [0.0f64; 4];
    let (prefill_s, decode_s, micro, pinned, plan) = match system {
        System::Cox { opts, overlap } => {
            // Decode first: it decides where the KV cache lives, which prefill must honour.
            let mean_w = work(setup, Phase::Decode, setup.generate / 2);
            let homes = [Device::Gpu, Device::Cpu];
            let dplan = plan_phase(cost, &mean_w, &setup.popularity, &setup.order, &homes, opts)
                .ok_or_else(|| no_fit(system, setup, "decode"))?;
            let pplan = plan_phase(
                cost,
                &pre_w,
                &setup.popularity,
                &setup.order,
                &[dplan.kv_home],
                opts,
            )
            .ok_or_else(|| no_fit(system, setup, "prefill"))?;
            let mut lanes = Lanes::default();
            let p = cox_step(cost, &pplan, &pre_w, &pre_sampled, *overlap, &mut lanes);
            add(&mut lanes_total, &lanes.busy, 1.0);
            let mut d = 0.0;
            for (&(step, weight), rows) in steps.iter().zip(&dec_sampled) {
                let w = work(setup, Phase::Decode, step);
                let mut lanes = Lanes::default();
                d += weight * cox_step(cost, &dplan, &w, rows, true, &mut lanes);
                add(&mut lanes_total, &lanes.busy, weight);
            }
            let desc = format!(
                "prefill {} mb {} kv {:?}; decode {} mb {} kv {:?}",
                assign_str(pplan.assignment),
                pplan.micro_batch,
                pplan.kv_home,
                assign_str(dplan.assignment),
                dplan.micro_batch,
                dplan.kv_home,
            );
            (
                p,
                d,
                (pplan.micro_batch, dplan.micro_batch),
                (pplan.pinned, dplan.pinned),
                desc,
            )
        }
        System::FlexGen | System::MoeLightning => {
            let pipelined = *system == System::MoeLightning;
            let pre_rows = expected_rows(cost, &setup.popularity, pre_w.tokens());
            let dec_rows = expected_rows(cost, &setup.popularity, setup.batch);
            let mean_w = work(setup, Phase::Decode, setup.generate / 2);
            let fastest = |w: &PhaseWork, rows: &[Vec<f64>]| {
                fastest_micro_batch(cost, w, rows, setup.batch, pipelined, setup.context_bytes)
            };
            let pmb = fastest(&pre_w, &pre_rows).ok_or_else(|| no_fit(system, setup, "prefill"))?;
            let dmb = fastest(&mean_w, &dec_rows).ok_or_else(|| no_fit(system, setup, "decode"))?;
            let mut lanes = Lanes::default();
            let (p, ppin) = baseline_step(
                cost,
                &pre_w,
                &pre_sampled,
                pmb,
                pipelined,
                setup.context_bytes,
                &mut lanes,
            )
            .ok_or_else(|| no_fit(system, setup, "prefill"))?;
            add(&mut lanes_total, &lanes.busy, 1.0);
            let mut d = 0.0;
            let mut dpin = 0;
            for (&(step, weight), rows) in steps.iter().zip(&dec_sampled) {
                let w = work(setup, Phase::Decode, step);
                let mut lanes = Lanes::default();
                let (t, pin) = baseline_step(
                    cost,
                    &w,
                    rows,
                    dmb,
                    pipelined,
                    setup.context_bytes,
                    &mut lanes,
                )
                .ok_or_else(|| no_fit(system, setup, "decode"))?;
                dpin = pin;
                d += weight * t;
                add(&mut lanes_total, &lanes.busy, weight);
            }
            let desc = format!(
                "prefill attention GPU mb {pmb}; decode attention CPU mb {dmb}; experts on GPU per micro-batch, weights paged per layer"
            );
            (p, d, (pmb, dmb), (ppin, dpin), desc)
        }
    };
    let total = prefill_s + decode_s;
    let gen_tokens = (setup.batch * setup.generate) as f64;
    Ok(ThroughputReport {
        system: system.name(),
        tokens_per_s: gen_tokens / total,
        prefill_s,
        decode_s,
        util_gpu: lanes_total[GPU] / total,
        util_cpu: lanes_total[CPU] / total,
        util_pcie: lanes_total[H2D] / total,
        micro_batch: micro,
        pinned,
        plan,
    })
}

fn add(total: &mut [f64; 4], busy: &[f64; 4], weight: f64) {
    for (t, b) in total.iter_mut().zip(busy) {
        *t += weight * b;
    }
}

fn assign_str(a: Assignment) -> String {
    let c = |d: Device| if d == Device::Gpu { 'G' } else { 'C' };
    format!("qkv/attn/out {}{}{}", c(a.qkv), c(a.attn), c(a.out))
}

fn no_fit(system: &System, setup: &Setup, phase: &str) -> Error {
    Error::Mismatch(format!(
        "{}: no {phase} schedule fits in VRAM at batch {} and {} + {} tokens",
        system.name(),
        setup.batch,
        setup.prompt,
        setup.generate
    ))
}

#[cfg(test)]
mod tests;
