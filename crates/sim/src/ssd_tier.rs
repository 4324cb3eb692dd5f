//! The SSD tier (issue #29) simulated: a model's routed experts read from its file into a DRAM
//! cache of fixed slots, replayed over a routing workload with the executor's own slot
//! bookkeeping and replacement rules ([`SlotCache`]), and timed with the cost model's CPU
//! rates and the machine's drive ([`strata_policy::SsdSpec`]).
//!
//! Each MoE layer runs as `strata_exec`'s `SsdTier` runs it: its experts are looked up (a use
//! of each at the layer's step), the missing ones are read together at the drive's rate in the
//! order the layer lists them, the CPU computes the resident ones meanwhile and each missing one
//! once its bytes have landed. Attention (with the router), dense and shared layers come
//! before, the LM head after the last layer, as in the policy simulator. Not modelled: reads
//! ahead on a guess (the executor applies the next layer's router to this layer's hidden
//! states, which a trace does not carry), so the figures are those of `--no-expert-prefetch`;
//! and every expert is read as `expert_bytes` bytes (the cost model's `--bits`).

use std::collections::HashSet;

use serde::Serialize;
use strata_policy::replacement::Replacement;
use strata_policy::slots::{ExpertKey, Lookup, SlotCache, pins, top30_share};
use strata_policy::{CostModel, Device, Phase};

use crate::workload::{Step, Workload};
use crate::{Error, Result};

/// The cache to simulate.
#[derive(Debug, Clone)]
pub struct SsdTierParams {
    /// Bytes of cache slots.
    pub cache_bytes: u64,
    /// Which cached expert gives up its slot.
    pub rule: Replacement,
    /// Experts read at start and never evicted: `(moe layer, expert)`.
    pub pinned: Vec<(usize, u32)>,
    /// Expert activation counts, `[moe layer][expert]` (a routing trace's): their most used
    /// are pinned as well, as the engine pins them (`strata_policy::slots::pins`).
    pub pin_profile: Option<Vec<Vec<u64>>>,
}

/// One phase's figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PhaseFigures {
    /// New tokens.
    pub tokens: usize,
    /// Simulated seconds.
    pub seconds: f64,
    /// The same steps with every expert in memory (no reads).
    pub in_memory_seconds: f64,
    /// Experts looked up (one per expert per layer call).
    pub lookups: u64,
    /// Found in a slot.
    pub hits: u64,
    /// Bytes read from the drive.
    pub bytes_read: u64,
}

impl PhaseFigures {
    /// Tokens per second.
    pub fn tokens_per_s(&self) -> f64 {
        self.tokens as f64 / self.seconds.max(f64::MIN_POSITIVE)
    }

    /// Tokens per second with every expert in memory.
    pub fn in_memory_tokens_per_s(&self) -> f64 {
        self.tokens as f64 / self.in_memory_seconds.max(f64::MIN_POSITIVE)
    }

    /// Share of lookups found in a slot.
    pub fn hit_rate(&self) -> f64 {
        self.hits as f64 / self.lookups.max(1) as f64
    }
}

/// What the simulated tier did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SsdTierReport {
    /// Slots the budget holds.
    pub slots: usize,
    /// Bytes read per expert.
    pub expert_bytes: u64,
    /// The prompts.
    pub prefill: PhaseFigures,
    /// The generated tokens.
    pub decode: PhaseFigures,
    /// Routing skew: the share of lookups that went to each layer's most used 30% of experts.
    pub top30_share: f64,
    /// Experts pinned, read before the first step.
    pub pinned: usize,
    /// Seconds their reads took, back to back at the drive's rate (not in any phase).
    pub pin_seconds: f64,
}

/// Replays `workload` through the tier `params` describes on `cost`'s machine, which must
/// describe its drive (`ssd`).
pub fn simulate_ssd_tier(
    cost: &CostModel,
    workload: &Workload,
    params: &SsdTierParams,
) -> Result<SsdTierReport> {
    let m = &cost.model;
    let ssd = cost.hw.ssd.as_ref().ok_or_else(|| {
        Error::Mismatch(
            "the hardware has no `ssd` (read_bw, latency_s): the SSD tier needs the drive's \
             measured rate"
                .into(),
        )
    })?;
    let moe_layers = workload.moe_layers();
    if moe_layers != m.moe_layers() || workload.n_experts != m.n_experts {
        return Err(Error::Mismatch(format!(
            "the workload routes {moe_layers} MoE layers of {} experts, the model has {} of {}",
            workload.n_experts,
            m.moe_layers(),
            m.n_experts
        )));
    }
    let expert_bytes = cost.expert_bytes().max(1);
    let slots = (params.cache_bytes / expert_bytes) as usize;
    if slots < workload.top_k {
        return Err(Error::Mismatch(format!(
            "a cache of {} bytes holds {slots} experts of {expert_bytes} bytes; a token routes \
             to {} per layer, so it needs at least {} bytes",
            params.cache_bytes,
            workload.top_k,
            expert_bytes * workload.top_k as u64
        )));
    }
    let pinned = pins(
        &params.pinned,
        params.pin_profile.as_deref(),
        slots,
        workload.top_k,
    );
    if pinned.len() + workload.top_k > slots {
        return Err(Error::Mismatch(format!(
            "{} pinned experts leave fewer than the {} slots a token needs in a cache of {slots}",
            pinned.len(),
            workload.top_k
        )));
    }
    let mut cache = SlotCache::new(slots, params.rule);
    let keys: HashSet<ExpertKey> = pinned.iter().map(|&(l, e)| (l as u32, e)).collect();
    cache.pin(keys.iter().copied());
    // Read at start, as the engine does: in the cache before the first step.
    for &key in &keys {
        let slot = cache.claim(key, 0, &keys).expect("room was checked");
        cache.filled(slot, true);
    }
    let pin_seconds = match keys.len() {
        0 => 0.0,
        n => ssd.latency_s + (n as u64 * expert_bytes) as f64 / ssd.read_bw,
    };
    let mut tier = Tier {
        cost,
        read_s: |bytes: u64| bytes as f64 / ssd.read_bw,
        latency_s: ssd.latency_s,
        expert_bytes,
        cache,
        step: 0,
        uses: vec![vec![0; m.n_experts]; moe_layers],
    };
    let (mut prefill, mut decode) = (PhaseFigures::default(), PhaseFigures::default());
    for (si, step) in workload.steps.iter().enumerate() {
        let phase = match step.phase {
            Phase::Prefill => &mut prefill,
            Phase::Decode => &mut decode,
        };
        tier.step(si, step, phase)?;
    }
    Ok(SsdTierReport {
        slots,
        expert_bytes,
        prefill,
        decode,
        top30_share: top30_share(&tier.uses),
        pinned: keys.len(),
        pin_seconds,
    })
}

struct Tier<'a, R: Fn(u64) -> f64> {
    cost: &'a CostModel,
    read_s: R,
    latency_s: f64,
    expert_bytes: u64,
    cache: SlotCache,
    /// The executor's step: one per MoE layer call.
    step: u64,
    uses: Vec<Vec<u64>>,
}

impl<R: Fn(u64) -> f64> Tier<'_, R> {
    /// One forward pass: adds its tokens, time and cache figures to `out`.
    fn step(&mut self, si: usize, step: &Step, out: &mut PhaseFigures) -> Result<()> {
        let cost = self.cost;
        let m = &cost.model;
        let ctx = step.context + step.tokens / 2;
        let mut t = 0.0;
        let mut in_memory = 0.0;
        for li in 0..m.n_layers {
            let attention = cost.attention_time(step.tokens, ctx);
            if li < m.dense_layers || li - m.dense_layers >= m.moe_layers() {
                let dense = attention + cost.dense_mlp_time(step.tokens);
                (t, in_memory) = (t + dense, in_memory + dense);
                continue;
            }
            let l = li - m.dense_layers;
            let before = attention + cost.shared_time(step.tokens);
            let (experts, experts_in_memory) = self.moe_layer(si, l, step, out)?;
            t += before + experts;
            in_memory += before + experts_in_memory;
        }
        let head_rows = if step.phase == Phase::Prefill {
            1
        } else {
            step.tokens
        };
        let head = cost.head_time(head_rows);
        out.tokens += step.tokens;
        out.seconds += t + head;
        out.in_memory_seconds += in_memory + head;
        Ok(())
    }

    /// MoE layer `l`'s routed experts: `(seconds from the tier, seconds from memory)`.
    fn moe_layer(
        &mut self,
        si: usize,
        l: usize,
        step: &Step,
        out: &mut PhaseFigures,
    ) -> Result<(f64, f64)> {
        let routing = &step.layers[l];
        // Tokens per expert, in the order the layer first lists them.
        let mut order: Vec<u32> = Vec::new();
        let mut tokens = vec![0u32; self.cost.model.n_experts];
        for &e in &routing.ids {
            let n = tokens.get_mut(e as usize).ok_or_else(|| {
                Error::Mismatch(format!("step {si}, MoE layer {l}: expert {e} out of range"))
            })?;
            if *n == 0 {
                order.push(e);
            }
            *n += 1;
        }
        self.step += 1;
        let key = |e: u32| (l as u32, e);
        let keep: HashSet<ExpertKey> = order.iter().map(|&e| key(e)).collect();
        let (mut resident, mut missing) = (Vec::new(), Vec::new());
        for &e in &order {
            self.cache.touch(key(e), self.step);
            self.uses[l][e as usize] += 1;
            out.lookups += 1;
            if self.cache.lookup(key(e)) == Lookup::Ready {
                out.hits += 1;
                resident.push(e);
            } else {
                missing.push(e);
            }
        }
        let compute = |e: &u32| self.cost.expert_time(Device::Cpu, tokens[*e as usize]);
        let in_memory: f64 = order.iter().map(compute).sum();
        // The resident experts first; each missing one when its read has landed (the reads
        // back to back at the drive's rate, after one latency).
        let mut cpu: f64 = resident.iter().map(compute).sum();
        let mut landed = self.latency_s;
        let mut keep = keep;
        for (i, &e) in missing.iter().enumerate() {
            let slot = match self.cache.claim(key(e), self.step, &keep) {
                Some(slot) => slot,
                None => {
                    // Every slot holds one of this layer's experts: as in the executor, which
                    // frees an expert's slot once it is computed, the read waits for what is
                    // computed so far.
                    keep = missing[i..].iter().map(|&e| key(e)).collect();
                    landed = landed.max(cpu);
                    self.cache.claim(key(e), self.step, &keep).ok_or_else(|| {
                        Error::Mismatch(format!(
                            "step {si}, MoE layer {l}: every one of the {} slots is pinned",
                            self.cache.len()
                        ))
                    })?
                }
            };
            landed += (self.read_s)(self.expert_bytes);
            out.bytes_read += self.expert_bytes;
            cpu = cpu.max(landed) + compute(&e);
            self.cache.filled(slot, true);
        }
        Ok((cpu, in_memory))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{SyntheticParams, synthetic};
    use strata_policy::{Hardware, ModelShape, SsdSpec};

    fn cost() -> CostModel {
        let mut hw = Hardware::load("local").unwrap();
        hw.ssd = Some(SsdSpec {
            read_bw: 1e9,
            latency_s: 0.0,
        });
        CostModel::new(hw, ModelShape::load("qwen3-30b-a3b").unwrap(), 4.5, 4.5).unwrap()
    }

    fn workload(cost: &CostModel) -> Workload {
        let m = &cost.model;
        synthetic(&SyntheticParams {
            requests: 1,
            prompt_tokens: 32,
            decode_tokens: 16,
            ..SyntheticParams::calibrated(m.moe_layers(), m.n_experts, m.top_k)
        })
    }

    #[test]
    fn a_cache_of_every_expert_reads_each_once_and_a_small_one_reads_more() {
        let cost = cost();
        let w = workload(&cost);
        let m = &cost.model;
        let all = (m.moe_layers() * m.n_experts) as u64 * cost.expert_bytes();
        let params = |cache_bytes| SsdTierParams {
            cache_bytes,
            rule: Replacement::Lfu,
            pinned: Vec::new(),
            pin_profile: None,
        };
        let big = simulate_ssd_tier(&cost, &w, &params(all)).unwrap();
        let used: u64 = {
            let mut seen = HashSet::new();
            for s in &w.steps {
                for (l, r) in s.layers.iter().enumerate() {
                    seen.extend(r.ids.iter().map(|&e| (l, e)));
                }
            }
            seen.len() as u64
        };
        let read = big.prefill.bytes_read + big.decode.bytes_read;
        assert_eq!(
            read,
            used * cost.expert_bytes(),
            "each used expert read once"
        );
        // The workload's own most used experts pinned: read at start, never again.
        let pinned = SsdTierParams {
            pin_profile: Some(w.profile()),
            ..params(all)
        };
        let p = simulate_ssd_tier(&cost, &w, &pinned).unwrap();
        assert!(p.pinned > 0 && p.pinned <= p.slots / 2, "{p:?}");
        assert!(p.pin_seconds >= (p.pinned as u64 * cost.expert_bytes()) as f64 / 1e12);
        assert_eq!(
            p.prefill.bytes_read + p.decode.bytes_read,
            (used - p.pinned as u64) * cost.expert_bytes()
        );
        assert_eq!(
            big.prefill.lookups + big.decode.lookups - (big.prefill.hits + big.decode.hits),
            used
        );
        assert_eq!((big.prefill.tokens, big.decode.tokens), (32, 16));
        // Reads only slow it down; from memory it is the in-memory time.
        assert!(big.decode.seconds >= big.decode.in_memory_seconds);
        assert!(big.prefill.seconds > big.prefill.in_memory_seconds);

        let min = cost.expert_bytes() * m.top_k as u64;
        let small = simulate_ssd_tier(&cost, &w, &params(min)).unwrap();
        assert_eq!(small.slots, m.top_k);
        assert!(small.decode.bytes_read > big.decode.bytes_read);
        assert!(small.decode.hit_rate() < big.decode.hit_rate());
        assert!(small.decode.tokens_per_s() < big.decode.tokens_per_s());
        assert_eq!(small.decode.in_memory_seconds, big.decode.in_memory_seconds);
        // Decode bound by reads: at least each token's missed bytes at the drive's rate.
        let per_token = small.decode.bytes_read as f64 / 1e9 / small.decode.tokens as f64;
        assert!(1.0 / small.decode.tokens_per_s() >= per_token);

        let e = simulate_ssd_tier(&cost, &w, &params(min - 1)).unwrap_err();
        assert!(e.to_string().contains("needs at least"), "{e}");
        let mut no_drive = cost.clone();
        no_drive.hw.ssd = None;
        let e = simulate_ssd_tier(&no_drive, &w, &params(all)).unwrap_err();
        assert!(e.to_string().contains("no `ssd`"), "{e}");
    }
}
