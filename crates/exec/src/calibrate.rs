//! The machine's own figures for the cost model, replacing a preset's constants
//! (`--device hybrid` without `--hardware`): what one of the model's experts costs to
//! upload and to run on the accelerator, measured with the executor's own slots and
//! kernel ([`DeviceFigures`]), and to run on the CPU's kernels ([`CpuFigures`]).
//!
//! The cost model prices a GPU expert as `max(2 P t / gpu.flops, bytes / gpu.mem_bw)` for
//! `t` tokens and an upload as `bytes / pcie.bw`; the three are set so that it reproduces
//! the measured times at one pair and at [`DeviceFigures::MANY`] pairs, and the measured upload. The
//! figures are the kernel's achieved rates, not the device's peaks: what placement needs.
//! A CPU expert is priced from a table of measured times against its tokens
//! (`cpu.expert_table`), which the cost model interpolates.

use std::time::Instant;

use strata_accel::{Device, ExpertSlots, Op};
use strata_kernels::moe::ExpertBatch;
use strata_model::experts::ExpertSet;
use strata_policy::{ExpertTable, Hardware};

use crate::Result;
use crate::weights::HostExperts;

/// Repeats of each measurement; the best one counts (noise only adds time).
const REPEATS: usize = 3;

/// What one expert of the first MoE layer costs on `dev`, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceFigures {
    /// Its bytes as the device stores them.
    pub expert_bytes: u64,
    /// Uploading it from host memory into a slot.
    pub upload_s: f64,
    /// Both kernel stages for one (token, expert) pair.
    pub one_pair_s: f64,
    /// Both kernel stages for [`Self::MANY`] pairs on it.
    pub many_pairs_s: f64,
}

impl DeviceFigures {
    /// Pairs of the many-token measurement: past the point where the kernel stops being
    /// bound by reading the expert.
    pub const MANY: usize = 64;

    /// Measures on `dev` with `host`'s first expert.
    pub fn measure(dev: &dyn Device, host: &HostExperts) -> Result<DeviceFigures> {
        let format = host.format(0).ok_or_else(|| {
            crate::Error::Config("the checkpoint has no routed experts to measure".into())
        })?;
        let (h, inter) = (host.hidden(), host.inter());
        let bytes = host.expert_bytes(0, 0)?;
        let slots = ExpertSlots::new(dev, 1, h as u32, inter as u32, &[format])?;
        let upload_s = best(|| {
            let landed = slots.refill_bytes(dev, 0, &bytes)?;
            dev.wait(&landed)?;
            Ok(())
        })?;
        let x = dev.alloc((Self::MANY * h * 4) as u64, 0, "calibration input")?;
        dev.wait(&dev.upload(&x, 0, &vec![0u8; Self::MANY * h * 4])?)?;
        let act = dev.alloc(
            (Self::MANY * inter * 4) as u64,
            0,
            "calibration activations",
        )?;
        let y = dev.alloc((Self::MANY * h * 4) as u64, 0, "calibration outputs")?;
        let time = |n: usize| -> Result<f64> {
            let pairs: Vec<u8> = (0..n as u32)
                .flat_map(|t| [t, 0])
                .flat_map(u32::to_le_bytes)
                .collect();
            let pb = dev.alloc(pairs.len() as u64, 0, "calibration pairs")?;
            dev.wait(&dev.upload(&pb, 0, &pairs)?)?;
            best(|| {
                for (stage, input, out) in [(0, &x, &act), (1, &act, &y)] {
                    dev.enqueue(&Op::ExpertFfn {
                        x: input,
                        slots: &slots,
                        format,
                        pairs: &pb,
                        out,
                        n_pairs: n as u32,
                        experts: 1,
                        stage,
                    })?;
                }
                dev.synchronize()?;
                Ok(())
            })
        };
        let one_pair_s = time(1)?;
        let many_pairs_s = time(Self::MANY)?;
        Ok(DeviceFigures {
            expert_bytes: bytes.len() as u64,
            upload_s,
            one_pair_s,
            many_pairs_s,
        })
    }

    /// `hw` with its GPU and link rates replaced by these figures for experts of
    /// `hidden x inter` at `bits` per weight, as the cost model counts them (their sources
    /// say so): its GPU expert times at one and [`Self::MANY`] pairs are then the measured ones.
    pub fn apply(&self, hw: &mut Hardware, hidden: usize, inter: usize, bits: f64) {
        let params = (3 * hidden * inter) as f64;
        let bytes = self.expert_bytes as f64;
        hw.pcie.bw = bytes / self.upload_s;
        hw.gpu.mem_bw = params * bits / 8.0 / self.one_pair_s;
        hw.gpu.flops = 2.0 * params * Self::MANY as f64 / self.many_pairs_s;
        let how = format!(
            "measured at start: one expert of {:.2} MB uploads in {:.3} ms, runs one pair in \
             {:.3} ms and {} pairs in {:.3} ms",
            bytes / 1e6,
            self.upload_s * 1e3,
            self.one_pair_s * 1e3,
            Self::MANY,
            self.many_pairs_s * 1e3
        );
        for key in ["pcie.bw", "gpu.mem_bw", "gpu.flops"] {
            hw.sources.insert(key.into(), how.clone());
        }
    }
}

/// What one routed expert costs on the CPU's kernels (the executor's CPU share runs on
/// them), in seconds against the tokens it computes.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuFigures {
    /// `[tokens, seconds]` for each of [`Self::TOKENS`].
    pub points: Vec<[f64; 2]>,
}

impl CpuFigures {
    /// Token counts measured: decode's one, a few, and prefill's many per expert (where
    /// the matrix units take over), past which the time is proportional.
    pub const TOKENS: [usize; 4] = [1, 4, 16, 64];

    /// Measures the first few experts of `layers` (each an MoE layer's routed experts), in
    /// turn, at each of [`Self::TOKENS`]. Each runs once before it is timed, so the mapped
    /// file's pages are resident as for a running model; the times are those of weights as
    /// warm as the caches keep them.
    pub fn measure(layers: &[&ExpertSet], hidden: usize) -> Result<CpuFigures> {
        let used: Vec<(&ExpertSet, usize)> = layers
            .iter()
            .flat_map(|set| (0..set.len()).map(move |e| (*set, e)))
            .take(REPEATS)
            .collect();
        if used.is_empty() {
            return Err(crate::Error::Config(
                "the checkpoint has no routed experts to measure".into(),
            ));
        }
        let most = Self::TOKENS[Self::TOKENS.len() - 1];
        // Small activations, so that no kernel meets infinities or subnormals.
        let x: Vec<f32> = (0..most * hidden)
            .map(|i| ((i * 7919) % 2001) as f32 * 1e-3 - 1.0)
            .collect();
        let mut out = vec![0.0f32; most * hidden];
        let batch = |expert: usize, tokens: usize| ExpertBatch {
            expert,
            tokens: (0..tokens as u32).collect(),
            weights: vec![1.0; tokens],
        };
        for &(set, e) in &used {
            set.run_batches(&x[..hidden], &[batch(e, 1)], &mut out[..hidden])?;
        }
        let mut points = Vec::new();
        for tokens in Self::TOKENS {
            let mut next = used.iter().cycle();
            let seconds = best(|| {
                let &(set, e) = next.next().expect("a cycle of a non-empty list");
                let n = tokens * hidden;
                Ok(set.run_batches(&x[..n], &[batch(e, tokens)], &mut out[..n])?)
            })?;
            points.push([tokens as f64, seconds]);
        }
        Ok(CpuFigures { points })
    }

    /// `hw` with these times as its CPU expert table for experts of `hidden x inter` at
    /// `bits` per weight (the cost model's CPU expert time is then the measured one).
    pub fn apply(&self, hw: &mut Hardware, hidden: usize, inter: usize, bits: f64) {
        hw.cpu.expert_table = Some(ExpertTable {
            hidden,
            moe_intermediate: inter,
            bits,
            points: self.points.clone(),
        });
        let times: Vec<String> = self
            .points
            .iter()
            .map(|[t, s]| format!("{t} in {:.3} ms", s * 1e3))
            .collect();
        hw.sources.insert(
            "cpu.expert_table".into(),
            format!(
                "measured at start: one expert's tokens {}",
                times.join(", ")
            ),
        );
    }
}

/// The shortest of [`REPEATS`] runs of `f`, in seconds.
fn best(mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut best = f64::MAX;
    for _ in 0..REPEATS {
        let start = Instant::now();
        f()?;
        best = best.min(start.elapsed().as_secs_f64().max(1e-9));
    }
    Ok(best)
}
