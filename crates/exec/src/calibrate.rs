//! The accelerator's own figures for the cost model: what one of the model's experts costs
//! to upload and to run on this device, measured with the executor's own slots and kernel,
//! replacing a preset's GPU and link constants (`--device hybrid` without `--hardware`).
//!
//! The cost model prices a GPU expert as `max(2 P t / gpu.flops, bytes / gpu.mem_bw)` for
//! `t` tokens and an upload as `bytes / pcie.bw`; the three are set so that it reproduces
//! the measured times at one pair and at [`DeviceFigures::MANY`] pairs, and the measured upload. The
//! figures are the kernel's achieved rates, not the device's peaks: what placement needs.

use std::time::Instant;

use strata_accel::{Device, ExpertSlots, Op};
use strata_policy::Hardware;

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
