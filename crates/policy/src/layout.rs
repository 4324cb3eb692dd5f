//! Expert weight layouts on machines with near-data-processing DIMMs, weight moves over
//! the DIMM-Link, and the costs that depend on them (seed 000, section 4.2, eq. 1-4, 6).
//!
//! Key types: [`Layout`] (an expert's weights striped over every DIMM, or localized on
//! one), [`Migration`] (a policy's request to change a layout over the DIMM-Link) and
//! [`NdpCosts`] (the layout-dependent times: host DRAM reads, GPU misses, CPU experts,
//! NDP experts, per-DIMM contention, link moves).
//!
//! A key design decision: the host's memory bandwidth is shared evenly by the DIMMs, so a
//! localized expert is read by the CPU or the GPU at `cpu.mem_bw / dimms` (19.2 GB/s on
//! seed 000's 8 channels x 2 DIMMs of DDR5-4800) and a striped one at the full `cpu.mem_bw`
//! (eq. 2-3), which matches the paper's "aggregate internal bandwidth 8x the host's"
//! (16 x 153.6 GB/s against 307.2 GB/s) without a constant of its own. The contention a
//! read causes on a DIMM (eq. 6) is the DRAM time of the bytes it takes from that DIMM at
//! the DIMM's internal bandwidth: the channel, not the DRAM, is what limits the host, so a
//! DIMM serving the host at its 19.2 GB/s share is busy only an eighth of the time.

use crate::{CostModel, Device};

/// Where one routed expert's weights lie in host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Layout {
    /// Interleaved over every DIMM: the host reads it at full bandwidth; no NDP unit holds
    /// it whole. The default of ordinary memory.
    #[default]
    Striped,
    /// Whole on one DIMM: its NDP unit can compute it; the host reads it at one DIMM's
    /// share of the bandwidth.
    Localized(u16),
}

/// A layout change carried out over the DIMM-Link, in the background.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    /// MoE layer of the expert.
    pub layer: usize,
    /// Expert id.
    pub expert: u32,
    /// Its layout when the move completes.
    pub to: Layout,
}

/// Layout-dependent costs of one routed expert on a machine with NDP DIMMs.
#[derive(Debug, Clone, Copy)]
pub struct NdpCosts<'a> {
    cost: &'a CostModel,
}

impl<'a> NdpCosts<'a> {
    /// The costs of `cost`'s machine and model (a machine without NDP has no units and
    /// one DIMM's worth of nothing: NDP times are infinite).
    pub fn new(cost: &'a CostModel) -> Self {
        Self { cost }
    }

    /// The cost model.
    pub fn cost(&self) -> &'a CostModel {
        self.cost
    }

    /// NDP units.
    pub fn units(&self) -> u16 {
        self.cost.hw.ndp.as_ref().map_or(0, |n| n.units as u16)
    }

    /// DIMMs sharing the host bandwidth (at least the NDP units, at least 1).
    pub fn dimms(&self) -> u32 {
        self.cost
            .hw
            .ndp
            .as_ref()
            .map_or(1, |n| n.dimms.max(n.units))
            .max(1)
    }

    fn bytes(&self) -> f64 {
        self.cost.expert_bytes() as f64
    }

    /// The host's read bandwidth of one DIMM, bytes/s.
    pub fn dimm_host_bw(&self) -> f64 {
        self.cost.hw.cpu.mem_bw / self.dimms() as f64
    }

    /// `T_DRAM(W, M)`: time for the host (CPU, or the GPU's DMA) to read the expert.
    pub fn host_read(&self, layout: Layout) -> f64 {
        match layout {
            Layout::Striped => self.bytes() / self.cost.hw.cpu.mem_bw,
            Layout::Localized(_) => self.bytes() / self.dimm_host_bw(),
        }
    }

    /// How long a host read of the expert keeps DIMMs busy (eq. 6's contention): every
    /// DIMM for its share of a striped expert (`None`), or its own DIMM for all of a
    /// localized one, at the DIMM's internal bandwidth.
    pub fn contention(&self, layout: Layout) -> (Option<u16>, f64) {
        let bw = self
            .cost
            .hw
            .ndp
            .as_ref()
            .map_or(self.cost.hw.cpu.mem_bw, |n| n.mem_bw);
        match layout {
            Layout::Striped => (None, self.bytes() / self.dimms() as f64 / bw),
            Layout::Localized(d) => (Some(d), self.bytes() / bw),
        }
    }

    /// Eq. 1: a GPU-resident expert.
    pub fn gpu_hit(&self, tokens: u32) -> f64 {
        self.cost.expert_time(Device::Gpu, tokens)
    }

    /// Copy time of a missing expert: the PCIe copy or the DRAM read, whichever is slower.
    pub fn copy(&self, layout: Layout) -> f64 {
        self.cost.expert_transfer_time().max(self.host_read(layout))
    }

    /// Eq. 2: a missing expert loaded on demand.
    pub fn gpu_miss(&self, tokens: u32, layout: Layout) -> f64 {
        self.gpu_hit(tokens).max(self.copy(layout))
    }

    /// Eq. 3: the expert on the CPU.
    pub fn cpu(&self, tokens: u32, layout: Layout) -> f64 {
        if tokens == 0 {
            return 0.0;
        }
        self.cost
            .expert_time(Device::Cpu, tokens)
            .max(self.host_read(layout))
    }

    /// Eq. 4: the expert on the NDP unit of the DIMM holding it (compute or internal read).
    pub fn ndp(&self, tokens: u32) -> f64 {
        self.cost.expert_time(Device::Ndp(0), tokens)
    }

    /// Time to move one expert over the DIMM-Link (relayout or rebalancing).
    pub fn link_move(&self) -> f64 {
        match &self.cost.hw.ndp {
            Some(n) if n.link_bw > 0.0 => self.bytes() / n.link_bw,
            _ => f64::INFINITY,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Hardware, ModelShape};

    #[test]
    fn localized_reads_are_one_dimms_share() {
        let c = CostModel::new(
            Hardware::load("trimoe-h100").unwrap(),
            ModelShape::load("deepseek-v2").unwrap(),
            16.0,
            16.0,
        )
        .unwrap();
        let n = NdpCosts::new(&c);
        assert_eq!(n.dimms(), 16);
        let ratio = n.host_read(Layout::Localized(3)) / n.host_read(Layout::Striped);
        assert!((ratio - 16.0).abs() < 1e-9, "{ratio}");
        // A striped read takes a sixteenth from each DIMM, a localized one all from one,
        // each at the internal 153.6 GB/s: an eighth of the host's read time.
        let (all, t) = n.contention(Layout::Striped);
        let (one, u) = n.contention(Layout::Localized(3));
        assert_eq!((all, one), (None, Some(3)));
        assert!((u / t - 16.0).abs() < 1e-9);
        assert!((n.host_read(Layout::Localized(3)) / u - 8.0).abs() < 1e-9);
        // A miss is never cheaper than a hit, nor than its copy.
        for t in [1, 64, 4096] {
            assert!(n.gpu_miss(t, Layout::Striped) >= n.gpu_hit(t));
            assert!(n.gpu_miss(t, Layout::Localized(0)) >= n.copy(Layout::Localized(0)));
            assert!(n.cpu(t, Layout::Localized(0)) >= n.cpu(t, Layout::Striped));
        }
        assert!(n.link_move().is_finite() && n.ndp(1) > 0.0);
    }
}
