//! The accelerator's hybrid layout (`--device hybrid`, llama.cpp's `-ngl 99 --n-cpu-moe`,
//! KTransformers' placement): attention, dense layers, shared experts, routers, norms and
//! the LM head on the device, the routed experts on the host, computed by the CPU's GGUF
//! kernels or by the [`ExpertExecutor`] installed on them (the hybrid executor, whose
//! policy may run some of them on the device again).
//!
//! A key design decision: one host round trip per MoE layer. The router runs on the device;
//! its input rows, the ids and the weights are gathered into one buffer and read back
//! together, while the shared experts, already submitted, run on the device as the host
//! computes the routed ones; their sum goes back up and joins the residual stream. When the
//! hybrid executor's policy runs some experts on the device again, they read the layer's
//! input where it already is and their outputs are combined into the residual stream there
//! ([`HybridExecutor::run_on_device`]): no second wait, whatever the policy.

use std::path::Path;
use std::sync::Arc;

use strata_accel::{Buffer, Device, Op};
use strata_model::model::{load_moe_blocks, open};
use strata_model::moe::MoeBlock;
use strata_model::{ExpertExecutor, LoadOptions, Routing, SeqSpan};

use super::{Ffn, GpuModel, Moe, Routed, f32s, to_bytes, u32s};
use crate::{DeferredExperts, HybridExecutor, Result};

impl GpuModel {
    /// Loads the checkpoint at `path` onto `dev` in the hybrid layout: every weight on the
    /// device but the routed experts, which stay in host memory as the CPU loads them (a
    /// GGUF's blocks mapped in place, packed as `opts` says otherwise).
    pub fn load_hybrid(dev: Arc<dyn Device>, path: &Path, opts: LoadOptions) -> Result<GpuModel> {
        let (config, src) = open(path)?;
        let blocks = load_moe_blocks(&config, &src, opts)?;
        GpuModel::build(dev, config, &src, Some(blocks))
    }

    /// Hands the host experts of every MoE layer to `executor`, the `i`-th MoE layer as
    /// MoE layer `i` (`None`: back to the CPU's fused kernels). Does nothing to layers whose
    /// experts are on the device.
    pub fn set_executor(&mut self, executor: Option<Arc<dyn ExpertExecutor>>) {
        self.beside = None;
        for (i, block) in self.host_blocks_mut().enumerate() {
            block.set_executor(i, executor.clone());
        }
    }

    /// [`GpuModel::set_executor`] for the hybrid executor. On this model's device it reads
    /// each layer's input where it already is and its outputs stay there, added into the
    /// residual stream by the device: the layer's one round trip (the routing and the
    /// CPU's input read back) is all it waits for. On another device it runs as any
    /// executor does, from the host.
    pub fn set_hybrid_executor(&mut self, executor: Option<Arc<HybridExecutor>>) {
        self.set_executor(executor.clone().map(|e| e as Arc<dyn ExpertExecutor>));
        self.beside = executor.filter(|e| Arc::ptr_eq(e.device(), &self.dev));
    }

    /// The host blocks, in MoE layer order.
    fn host_blocks_mut(&mut self) -> impl Iterator<Item = &mut MoeBlock> {
        self.layers.iter_mut().filter_map(|l| match &mut l.ffn {
            Ffn::Moe(m) => match &mut m.routed {
                Routed::Host(block) => Some(&mut **block),
                Routed::Device { .. } => None,
            },
            Ffn::Dense(_) => None,
        })
    }

    /// The MoE blocks whose routed experts are computed on the host, in MoE layer order
    /// (as [`GpuModel::set_executor`] numbers them; empty unless in the hybrid layout).
    pub fn host_moe_blocks(&self) -> Vec<&MoeBlock> {
        let blocks = self.layers.iter().filter_map(|l| match &l.ffn {
            Ffn::Moe(m) => match &m.routed {
                Routed::Host(block) => Some(&**block),
                Routed::Device { .. } => None,
            },
            Ffn::Dense(_) => None,
        });
        blocks.collect()
    }

    /// Keeps each token's best `2 * top_k` router candidates in every host block's
    /// routing (`false`: none, the default); policies such as HybriMoE score them. They
    /// are scored on the host, from the router input the layer reads back anyway.
    pub fn keep_candidates(&mut self, keep: bool) {
        for block in self.host_blocks_mut() {
            block.set_candidates(if keep { 2 * block.cfg.router.top_k } else { 0 });
        }
    }

    /// Whether the routed experts are computed on the host (the hybrid layout).
    pub fn experts_on_host(&self) -> bool {
        !self.host_moe_blocks().is_empty()
    }

    /// The MoE block of `layer`, its routed experts on the host: `x += ` its output on `hs`
    /// (`[t, hidden]`, laid out as `spans`), one read back and one upload. The experts the previous MoE layer
    /// deferred (`deferred`) run on the CPU while the device works, and join this layer's
    /// output; this layer's deferred ones take their place. With `norm` (a gain and an
    /// output), the updated rows' RMSNorm too, in the last add's dispatch.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn moe_on_host<'a>(
        &self,
        layer: &HostLayer<'a>,
        x: &Buffer,
        hs: &Buffer,
        t: usize,
        spans: &[SeqSpan],
        deferred: &mut Option<(&'a MoeBlock, DeferredExperts)>,
        norm: Option<(&Buffer, &Buffer)>,
    ) -> Result<()> {
        let &HostLayer { li, moe, block } = layer;
        let dev = &*self.dev;
        let (h, k) = (self.config.hidden_size, moe.params.k as usize);
        let (ids, weights) = self.route(hs, moe, t)?;
        let (rows, n) = ((t * h * 4) as u64, (t * k * 4) as u64);
        let gathered = self.scratch(t * h + 2 * t * k, "routing for the host")?;
        dev.copy(hs, 0, &gathered, 0, rows)?;
        dev.copy(&ids, 0, &gathered, rows, n)?;
        dev.copy(&weights, 0, &gathered, rows + n, n)?;
        let readback = dev.download_async(&gathered, 0, rows + 2 * n)?;
        // The device works on this layer's attention, routing and shared experts while the
        // host runs what the last MoE layer deferred, then the routed experts.
        self.shared_experts(x, hs, moe, t)?;
        dev.submit()?;
        let earlier = match deferred.take() {
            Some((b, work)) => Some(work.run(&b.experts)?),
            None => None,
        };
        let bytes = readback.wait()?;
        let (xs, rest) = bytes.split_at(rows as usize);
        let (id_bytes, weight_bytes) = rest.split_at(n as usize);
        let xs: Vec<f32> = f32s(xs).collect();
        // The device's top-k is the routing; candidates, where a policy wants them, are
        // scored by the host's copy of the router.
        let candidates = match block.candidates() {
            0 => None,
            _ => block.route(&xs, t).candidates,
        };
        let routing = Routing {
            top_k: k,
            ids: u32s(id_bytes).collect(),
            weights: f32s(weight_bytes).collect(),
            candidates,
        };
        if let Some(tap) = self.tap.read().ok().and_then(|t| t.clone()) {
            tap.on_routing(li, &routing);
        }
        let (mut y, on_device) = match &self.beside {
            Some(exec) => {
                let mut y = vec![0.0f32; xs.len()];
                let call = block.expert_call(&xs, &routing, spans);
                let share = exec.run_on_device(call, gathered, &mut y)?;
                *deferred = share.deferred.map(|work| (block, work));
                (y, share.combines)
            }
            None => (block.run_experts(&xs, &routing, spans)?, Vec::new()),
        };
        for (a, b) in y.iter_mut().zip(earlier.iter().flatten()) {
            *a += b;
        }
        let up = self.scratch(t * h, "routed experts' output")?;
        dev.upload(&up, 0, &to_bytes(&y))?;
        // The norm goes with the last add into `x`: the upload's, or the last combine's.
        let norm = norm.map(|(gain, out)| (gain, out, self.eps));
        if let (true, Some((w, out, eps))) = (on_device.is_empty(), norm) {
            return Ok(dev.enqueue(&Op::RmsNorm {
                x,
                residual: Some(&up),
                w,
                out,
                rows: t as u32,
                dim: h as u32,
                eps,
            })?);
        }
        self.add(x, &up, t)?;
        for (i, c) in on_device.iter().enumerate() {
            dev.enqueue(&Op::MoeCombine {
                out: x,
                y: &c.y,
                weights: &c.weights,
                pair_of: &c.pair_of,
                tokens: c.tokens,
                hidden: h as u32,
                k: c.k,
                norm: norm.filter(|_| i + 1 == on_device.len()),
            })?;
        }
        Ok(())
    }
}

/// One MoE layer whose routed experts are on the host, as a forward pass meets it.
pub(super) struct HostLayer<'a> {
    /// The model layer.
    pub(super) li: usize,
    pub(super) moe: &'a Moe,
    pub(super) block: &'a MoeBlock,
}
