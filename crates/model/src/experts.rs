//! SwiGLU MLPs and sets of them: a dense MLP, a shared expert or a block's routed experts,
//! in the form the engine executes (plain matmuls, packed for the fused CPU kernel, or a
//! GGUF's ggml blocks in place), and how the loader builds them.

use strata_kernels::ggml::{GgmlExperts, fused_moe_ggml};
use strata_kernels::moe::{ExpertBatch, MoeOptions, fused_moe_grouped, group_by_expert};
use strata_kernels::{Expert, MoeExperts, PackedFormat, dense_mlp, fused_moe};

use crate::Result;
use crate::linear::{Built, Linear, Loader, Weight};
use crate::names::{ExpertPart, converted_expert};
use crate::ops::silu_mul;
use crate::routing::Routing;
use crate::tensors::{MatrixSpec, MlpTensors};

/// `down(silu(gate(x)) * up(x))`.
#[derive(Debug)]
pub struct Mlp {
    /// Gate projection `[inter, hidden]`.
    pub gate: Linear,
    /// Up projection `[inter, hidden]`.
    pub up: Linear,
    /// Down projection `[hidden, inter]`.
    pub down: Linear,
}

impl Mlp {
    /// Loads the projections `t` names as a dense layer.
    pub fn load(ld: &Loader, t: &MlpTensors) -> Result<Mlp> {
        let linear = |m: &MatrixSpec| ld.linear(&m.name, m.rows, m.cols, m.bias);
        Ok(Mlp {
            gate: linear(&t.gate)?,
            up: linear(&t.up)?,
            down: linear(&t.down)?,
        })
    }

    /// Loads a routed expert's projections `t` in the expert format.
    pub(crate) fn load_expert(ld: &Loader, t: &MlpTensors) -> Result<Mlp> {
        let linear = |m: &MatrixSpec| ld.expert_linear(&m.name, m.rows, m.cols);
        Ok(Mlp {
            gate: linear(&t.gate)?,
            up: linear(&t.up)?,
            down: linear(&t.down)?,
        })
    }

    /// `x: [m, hidden]` -> `[m, hidden]`.
    pub fn forward(&self, x: &[f32], m: usize) -> Vec<f32> {
        let mut g = self.gate.forward(x, m);
        let u = self.up.forward(x, m);
        silu_mul(&mut g, &u);
        self.down.forward(&g, m)
    }

    /// Parameter count.
    pub fn params(&self) -> usize {
        [&self.gate, &self.up, &self.down]
            .iter()
            .map(|l| l.n_out * l.k_in)
            .sum()
    }

    /// Bytes of weights.
    pub fn weight_bytes(&self) -> usize {
        self.gate.weight_bytes() + self.up.weight_bytes() + self.down.weight_bytes()
    }
}

/// SwiGLU MLPs of one shape (routed experts, or a single dense MLP / shared expert) in
/// one of the engine's executable forms.
#[derive(Debug)]
pub enum ExpertSet {
    /// Plain matmuls per expert: the f32 reference path.
    Plain(Vec<Mlp>),
    /// Packed for the fused CPU MoE kernel (BF16, INT8 or INT4).
    Packed(MoeExperts),
    /// ggml blocks read in place by the fused ggml MoE kernel (a GGUF's experts).
    Ggml(GgmlExperts),
}

impl ExpertSet {
    /// Keeps `mlps` as they are (`fmt` is `None`) or packs them, dropping the originals.
    /// MLPs whose weights are all ggml blocks become a [`ExpertSet::Ggml`] set whatever
    /// `fmt` says: their kernels read the blocks in place.
    pub fn new(
        mlps: Vec<Mlp>,
        hidden: usize,
        inter: usize,
        fmt: Option<PackedFormat>,
    ) -> Result<ExpertSet> {
        let blocks = |f: fn(&Mlp) -> &Linear| mlps.iter().map(|m| f(m).ggml().cloned()).collect();
        let (gate, up, down): (Option<Vec<_>>, Option<Vec<_>>, Option<Vec<_>>) =
            (blocks(|m| &m.gate), blocks(|m| &m.up), blocks(|m| &m.down));
        if let (Some(gate), Some(up), Some(down)) = (gate, up, down)
            && !mlps.is_empty()
        {
            return Ok(ExpertSet::Ggml(GgmlExperts::new(
                gate, up, down, hidden, inter,
            )?));
        }
        let Some(fmt) = fmt else {
            return Ok(ExpertSet::Plain(mlps));
        };
        let packed = mlps
            .iter()
            .map(
                |m| match (m.gate.bf16_slice(), m.up.bf16_slice(), m.down.bf16_slice()) {
                    (Some(g), Some(u), Some(d)) => Expert::pack(g, u, d, hidden, inter, fmt),
                    _ => Expert::pack(
                        &m.gate.weight_f32(),
                        &m.up.weight_f32(),
                        &m.down.weight_f32(),
                        hidden,
                        inter,
                        fmt,
                    ),
                },
            )
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ExpertSet::Packed(MoeExperts::new(hidden, inter, packed)?))
    }

    /// Number of MLPs.
    pub fn len(&self) -> usize {
        match self {
            ExpertSet::Plain(v) => v.len(),
            ExpertSet::Packed(p) => p.len(),
            ExpertSet::Ggml(g) => g.len(),
        }
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of weights (packed bytes include scales).
    pub fn weight_bytes(&self) -> usize {
        match self {
            ExpertSet::Plain(v) => v.iter().map(Mlp::weight_bytes).sum(),
            ExpertSet::Packed(p) => p.experts().iter().map(|e| e.bytes()).sum(),
            ExpertSet::Ggml(g) => g.bytes(),
        }
    }

    /// Weighted sum of the routed experts' outputs for `x: [T, hidden]`, `[T, hidden]`.
    pub fn run(&self, x: &[f32], routing: &Routing) -> Result<Vec<f32>> {
        let t = routing.tokens();
        let hidden = x.len() / t.max(1);
        let mut out = vec![0.0f32; x.len()];
        match self {
            ExpertSet::Packed(p) => fused_moe(p, x, &routing.ids, &routing.weights, &mut out)?,
            ExpertSet::Ggml(g) => {
                let batches =
                    group_by_expert(g.len(), &routing.ids, &routing.weights, routing.top_k)?;
                fused_moe_ggml(g, x, &batches, &mut out, &MoeOptions::default())?;
            }
            ExpertSet::Plain(experts) => {
                let k = routing.top_k;
                let mut rows_of: Vec<Vec<(usize, f32)>> = vec![Vec::new(); experts.len()];
                for (i, (&e, &w)) in routing.ids.iter().zip(&routing.weights).enumerate() {
                    rows_of[e as usize].push((i / k, w));
                }
                for (expert, rows) in experts.iter().zip(&rows_of) {
                    if rows.is_empty() {
                        continue;
                    }
                    let mut xs = Vec::with_capacity(rows.len() * hidden);
                    for &(r, _) in rows {
                        xs.extend_from_slice(&x[r * hidden..(r + 1) * hidden]);
                    }
                    let y = expert.forward(&xs, rows.len());
                    for (&(r, w), yr) in rows.iter().zip(y.chunks_exact(hidden)) {
                        for (o, v) in out[r * hidden..(r + 1) * hidden].iter_mut().zip(yr) {
                            *o += w * v;
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Adds `Σ w · expert(x[row])` over the given (expert, rows, weights) `batches` into
    /// `out: [T, hidden]`: the CPU's share of a step whose experts are split across devices.
    pub fn run_batches(&self, x: &[f32], batches: &[ExpertBatch], out: &mut [f32]) -> Result<()> {
        match self {
            ExpertSet::Packed(p) => {
                let opts = MoeOptions {
                    accumulate: true,
                    ..MoeOptions::default()
                };
                fused_moe_grouped(p, x, batches, out, &opts)?;
            }
            ExpertSet::Ggml(g) => {
                let opts = MoeOptions {
                    accumulate: true,
                    ..MoeOptions::default()
                };
                fused_moe_ggml(g, x, batches, out, &opts)?;
            }
            ExpertSet::Plain(experts) => {
                let hidden = experts.first().map_or(0, |m| m.gate.k_in);
                let t = x.len() / hidden.max(1);
                if out.len() != x.len() {
                    return Err(crate::Error::Input(format!(
                        "expert output has {} values, expected {} like the input",
                        out.len(),
                        x.len()
                    )));
                }
                for b in batches {
                    let expert = experts.get(b.expert).ok_or_else(|| {
                        crate::Error::Input(format!(
                            "expert {} routed, expected below {}",
                            b.expert,
                            experts.len()
                        ))
                    })?;
                    if let Some(&r) = b.tokens.iter().find(|&&r| r as usize >= t) {
                        return Err(crate::Error::Input(format!(
                            "token {r} routed to expert {}, expected below {t}",
                            b.expert
                        )));
                    }
                    let mut xs = Vec::with_capacity(b.tokens.len() * hidden);
                    for &r in &b.tokens {
                        let r = r as usize;
                        xs.extend_from_slice(&x[r * hidden..(r + 1) * hidden]);
                    }
                    let y = expert.forward(&xs, b.tokens.len());
                    for ((&r, &w), yr) in
                        b.tokens.iter().zip(&b.weights).zip(y.chunks_exact(hidden))
                    {
                        let r = r as usize;
                        for (o, v) in out[r * hidden..(r + 1) * hidden].iter_mut().zip(yr) {
                            *o += w * v;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Every token of `x: [T, hidden]` through MLP 0 (a dense MLP or shared expert).
    pub fn dense(&self, x: &[f32], t: usize) -> Result<Vec<f32>> {
        match self {
            ExpertSet::Plain(v) => Ok(v[0].forward(x, t)),
            ExpertSet::Packed(p) => {
                let mut out = vec![0.0f32; x.len()];
                dense_mlp(p, x, &mut out, false)?;
                Ok(out)
            }
            ExpertSet::Ggml(g) => {
                let all = ExpertBatch {
                    expert: 0,
                    tokens: (0..t as u32).collect(),
                    weights: vec![1.0; t],
                };
                let mut out = vec![0.0f32; x.len()];
                fused_moe_ggml(g, x, &[all], &mut out, &MoeOptions::default())?;
                Ok(out)
            }
        }
    }
}

impl Loader<'_> {
    /// SwiGLU MLPs of one shape stored under `prefix` (routed experts, a shared expert, a
    /// dense MLP): `load` builds them from the checkpoint and they are packed in `fmt`
    /// (`None`: kept as they are). A converted model maps `{prefix}.{e}.gate_up` and
    /// `.down` (packed) or reads `.gate`, `.up`, `.down` (plain) instead of calling `load`.
    pub fn expert_set(
        &self,
        prefix: &str,
        n: usize,
        hidden: usize,
        inter: usize,
        fmt: Option<PackedFormat>,
        load: impl FnOnce() -> Result<Vec<Mlp>>,
    ) -> Result<ExpertSet> {
        let set = if self.converted() {
            self.quietly(|| self.stored_expert_set(prefix, n, hidden, inter))?
        } else {
            let mlps = self.quietly(load)?;
            ExpertSet::new(mlps, hidden, inter, fmt)?
        };
        match &set {
            ExpertSet::Packed(p) => {
                for (e, x) in p.experts().iter().enumerate() {
                    let (gu, down) = x.parts();
                    let name = |part| converted_expert(prefix, e, part);
                    self.keep(name(ExpertPart::GateUp), Built::Packed(gu.clone()));
                    self.keep(name(ExpertPart::Down), Built::Packed(down.clone()));
                }
            }
            ExpertSet::Ggml(g) => {
                for e in 0..g.len() {
                    let (gate, up, down) = g.expert(e);
                    let parts = [(ExpertPart::Gate, gate), (ExpertPart::Up, up)];
                    for (part, m) in parts.into_iter().chain([(ExpertPart::Down, down)]) {
                        let l = Linear {
                            n_out: m.n(),
                            k_in: m.k(),
                            weight: Weight::Ggml(m.clone()),
                            bias: None,
                        };
                        self.keep(converted_expert(prefix, e, part), Built::Linear(l));
                    }
                }
            }
            ExpertSet::Plain(mlps) => {
                for (e, m) in mlps.iter().enumerate() {
                    let parts = [
                        (ExpertPart::Gate, &m.gate),
                        (ExpertPart::Up, &m.up),
                        (ExpertPart::Down, &m.down),
                    ];
                    for (part, l) in parts {
                        self.keep(converted_expert(prefix, e, part), Built::Linear(l.clone()));
                    }
                }
            }
        }
        Ok(set)
    }

    fn stored_expert_set(
        &self,
        prefix: &str,
        n: usize,
        hidden: usize,
        inter: usize,
    ) -> Result<ExpertSet> {
        if self.has(&converted_expert(prefix, 0, ExpertPart::GateUp)) {
            let i_pad = inter.div_ceil(16) * 16;
            let experts = (0..n)
                .map(|e| {
                    let name = |part| converted_expert(prefix, e, part);
                    let gu = self.stored_packed(&name(ExpertPart::GateUp), 2 * i_pad, hidden)?;
                    let down = self.stored_packed(&name(ExpertPart::Down), hidden, inter)?;
                    Ok(Expert::from_parts(gu, down)?)
                })
                .collect::<Result<Vec<_>>>()?;
            return Ok(ExpertSet::Packed(MoeExperts::new(hidden, inter, experts)?));
        }
        let plain = |e: usize, part: ExpertPart, n_out: usize, k_in: usize| {
            let t = self.tensor(&converted_expert(prefix, e, part))?;
            t.expect_shape(&[n_out, k_in])?;
            self.linear_from(&t, 0, n_out, k_in, None, false)
        };
        let mlps = (0..n)
            .map(|e| {
                Ok(Mlp {
                    gate: plain(e, ExpertPart::Gate, inter, hidden)?,
                    up: plain(e, ExpertPart::Up, inter, hidden)?,
                    down: plain(e, ExpertPart::Down, hidden, inter)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        ExpertSet::new(mlps, hidden, inter, None)
    }
}
