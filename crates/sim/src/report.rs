//! What a simulation run measured, and its timeline.
//!
//! Key types: [`Report`] (latencies, tokens/s, utilisation, PCIe bytes, hit rate,
//! predictor accuracy) and [`Op`] (one operation on one device lane). The timeline is
//! written in the Chrome trace event format, which Perfetto opens.
//!
//! A key design decision: utilisation is measured per phase over the wall time of that
//! phase's steps, from the operations themselves, so it is what a profiler would show.

use serde::Serialize;
use strata_policy::{CostModel, Phase};

/// A device lane of the timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Lane {
    /// The GPU stream.
    Gpu,
    /// The CPU expert pool.
    Cpu,
    /// The host-to-device link.
    Pcie,
    /// One near-data processing unit (and the DIMM it sits on).
    Ndp(u16),
    /// The DIMM-Link between NDP DIMMs (layout moves).
    Link,
}

/// One operation on one lane.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Op {
    /// Where it ran.
    pub lane: Lane,
    /// Start, seconds.
    pub start: f64,
    /// End, seconds.
    pub end: f64,
    /// What it was.
    pub name: String,
    /// Step index.
    pub step: usize,
    /// Transformer layer index (`n_layers` for the LM head).
    pub layer: usize,
    /// For GPU experts: when their weights were on the GPU (0 otherwise).
    pub weights_ready: f64,
}

/// Per-phase totals.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PhaseStats {
    /// Tokens processed.
    pub tokens: usize,
    /// Wall time of the phase's steps, seconds.
    pub seconds: f64,
    /// Tokens per second.
    pub tokens_per_s: f64,
    /// Routed (token, expert) activations.
    pub activations: u64,
    /// Of those, on an expert already resident on the GPU.
    pub hits: u64,
    /// Of those, computed on the GPU.
    pub on_gpu: u64,
    /// `hits / activations`.
    pub hit_rate: f64,
    /// Busy fraction of the GPU, CPU and PCIe over the phase.
    pub util_gpu: f64,
    /// CPU busy fraction.
    pub util_cpu: f64,
    /// PCIe busy fraction.
    pub util_pcie: f64,
}

/// The result of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Policy name.
    pub policy: String,
    /// Hardware description.
    pub hardware: String,
    /// Prefill totals.
    pub prefill: PhaseStats,
    /// Decode totals.
    pub decode: PhaseStats,
    /// Latency of every step, seconds.
    pub step_latency_s: Vec<f64>,
    /// Mean decode latency per MoE layer (attention to combine), seconds.
    pub decode_layer_latency_s: Vec<f64>,
    /// Bytes copied host to device.
    pub pcie_bytes: u64,
    /// Predicted experts found among the next step's experts / next step's experts.
    pub predictor_accuracy: Option<f64>,
    /// Peak GPU memory used by routed experts, bytes.
    pub peak_expert_bytes: u64,
    /// The GPU's budget for routed experts, bytes.
    pub expert_budget_bytes: u64,
    /// Every operation (not serialised; see [`Report::chrome_trace`]).
    #[serde(skip)]
    pub ops: Vec<Op>,
    #[serde(skip)]
    phases: Vec<(Phase, f64, f64)>,
    #[serde(skip)]
    pred: (u64, u64),
    #[serde(skip)]
    layer_sums: Vec<f64>,
}

impl Report {
    pub(crate) fn new(policy: &str, cost: &CostModel, n_moe: usize) -> Self {
        Self {
            policy: policy.to_string(),
            hardware: cost.hw.description.clone(),
            prefill: PhaseStats::default(),
            decode: PhaseStats::default(),
            step_latency_s: Vec::new(),
            decode_layer_latency_s: vec![0.0; n_moe],
            pcie_bytes: 0,
            predictor_accuracy: None,
            peak_expert_bytes: 0,
            expert_budget_bytes: 0,
            ops: Vec::new(),
            phases: Vec::new(),
            pred: (0, 0),
            layer_sums: vec![0.0; n_moe],
        }
    }

    fn phase_mut(&mut self, phase: Phase) -> &mut PhaseStats {
        match phase {
            Phase::Prefill => &mut self.prefill,
            Phase::Decode => &mut self.decode,
        }
    }

    pub(crate) fn add_prediction(&mut self, hit: usize, of: usize) {
        self.pred.0 += hit as u64;
        self.pred.1 += of as u64;
    }

    pub(crate) fn add_activations(&mut self, phase: Phase, n: usize, hit: bool, on_gpu: bool) {
        let p = self.phase_mut(phase);
        p.activations += n as u64;
        if hit {
            p.hits += n as u64;
        }
        if on_gpu {
            p.on_gpu += n as u64;
        }
    }

    pub(crate) fn add_step(&mut self, phase: Phase, tokens: usize, seconds: f64, layers: &[f64]) {
        let start = self.phases.last().map_or(0.0, |p| p.2);
        self.phases.push((phase, start, start + seconds));
        self.step_latency_s.push(seconds);
        let p = self.phase_mut(phase);
        p.tokens += tokens;
        p.seconds += seconds;
        if phase == Phase::Decode {
            for (s, l) in self.layer_sums.iter_mut().zip(layers) {
                *s += l;
            }
        }
    }

    pub(crate) fn finish(&mut self, ops: Vec<Op>, peak: u64, budget: u64) {
        self.peak_expert_bytes = peak;
        self.expert_budget_bytes = budget;
        let decode_steps = self.phases.iter().filter(|p| p.0 == Phase::Decode).count();
        for (d, s) in self.decode_layer_latency_s.iter_mut().zip(&self.layer_sums) {
            *d = s / decode_steps.max(1) as f64;
        }
        if self.pred.1 > 0 {
            self.predictor_accuracy = Some(self.pred.0 as f64 / self.pred.1 as f64);
        }
        // Busy time per lane inside each phase's step windows.
        let mut busy = [[0.0f64; 3]; 2];
        for op in &ops {
            let lane = match op.lane {
                Lane::Gpu => 0,
                Lane::Cpu => 1,
                Lane::Pcie => 2,
                Lane::Ndp(_) | Lane::Link => continue,
            };
            for &(phase, a, b) in &self.phases {
                let overlap = op.end.min(b) - op.start.max(a);
                if overlap > 0.0 {
                    busy[(phase == Phase::Decode) as usize][lane] += overlap;
                }
            }
        }
        for (i, phase) in [Phase::Prefill, Phase::Decode].into_iter().enumerate() {
            let p = self.phase_mut(phase);
            if p.seconds > 0.0 {
                p.tokens_per_s = p.tokens as f64 / p.seconds;
                p.util_gpu = busy[i][0] / p.seconds;
                p.util_cpu = busy[i][1] / p.seconds;
                p.util_pcie = busy[i][2] / p.seconds;
            }
            if p.activations > 0 {
                p.hit_rate = p.hits as f64 / p.activations as f64;
            }
        }
        self.ops = ops;
    }

    /// The timeline as Chrome trace event JSON (open in Perfetto or chrome://tracing).
    pub fn chrome_trace(&self) -> serde_json::Value {
        let tid = |l: Lane| match l {
            Lane::Gpu => 0,
            Lane::Cpu => 1,
            Lane::Pcie => 2,
            Lane::Link => 3,
            Lane::Ndp(u) => 4 + u as usize,
        };
        let mut names = vec![
            (0, "GPU".to_string()),
            (1, "CPU".into()),
            (2, "PCIe H2D".into()),
        ];
        if self.ops.iter().any(|o| o.lane == Lane::Link) {
            names.push((3, "DIMM-Link".into()));
        }
        let mut units: Vec<u16> = self
            .ops
            .iter()
            .filter_map(|o| match o.lane {
                Lane::Ndp(u) => Some(u),
                _ => None,
            })
            .collect();
        units.sort_unstable();
        units.dedup();
        names.extend(units.iter().map(|&u| (4 + u as usize, format!("NDP {u}"))));
        let mut events: Vec<serde_json::Value> = names
            .iter()
            .map(|(tid, name)| {
                serde_json::json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": name}})
            })
            .collect();
        for op in &self.ops {
            events.push(serde_json::json!({
                "name": op.name,
                "ph": "X",
                "pid": 1,
                "tid": tid(op.lane),
                "ts": op.start * 1e6,
                "dur": (op.end - op.start) * 1e6,
                "args": {"step": op.step, "layer": op.layer},
            }));
        }
        serde_json::json!({ "traceEvents": events, "displayTimeUnit": "ms" })
    }
}
