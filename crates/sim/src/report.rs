//! What a simulation run measured, and its timeline.
//!
//! Key types: [`Report`] (latencies, tokens/s, utilisation, PCIe bytes, hit rate,
//! predictor accuracy, a load predictor's hot-expert accuracy) and [`Op`] (one operation
//! on one device lane, with the FLOPs it executed). [`hot_overlap`] scores one layer's
//! predicted loads. The timeline is
//! written in the Chrome trace event format, which Perfetto opens.
//!
//! A key design decision: utilisation is measured per phase over the wall time of that
//! phase's steps, from the operations themselves, so it is what a profiler would show.

use serde::Serialize;
use strata_policy::{CostModel, Phase};

/// A device lane of the timeline, ordered as a timeline shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
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

impl Lane {
    /// The lane's name on a timeline: `GPU`, `CPU`, `PCIe H2D`, `DIMM-Link`, `NDP 3`.
    pub fn label(self) -> String {
        match self {
            Lane::Gpu => "GPU".into(),
            Lane::Cpu => "CPU".into(),
            Lane::Pcie => "PCIe H2D".into(),
            Lane::Link => "DIMM-Link".into(),
            Lane::Ndp(u) => format!("NDP {u}"),
        }
    }
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
    /// FLOPs it executed: the matmuls of routed and shared experts, 0 for other work.
    pub flops: f64,
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
    /// Hot-expert accuracy of a load predictor ([`hot_overlap`]), over every scored
    /// (decode step, MoE layer): realised hot experts also predicted hot / realised hot
    /// experts. `None` when the policy predicts no loads.
    pub hot_expert_accuracy: Option<f64>,
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
    hot: (u64, u64),
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
            hot_expert_accuracy: None,
            peak_expert_bytes: 0,
            expert_budget_bytes: 0,
            ops: Vec::new(),
            phases: Vec::new(),
            pred: (0, 0),
            hot: (0, 0),
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

    pub(crate) fn add_load_prediction(&mut self, predicted: &[f64], loads: &[u32]) {
        let (hit, of) = hot_overlap(predicted, loads);
        self.hot.0 += hit as u64;
        self.hot.1 += of as u64;
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
        if self.hot.1 > 0 {
            self.hot_expert_accuracy = Some(self.hot.0 as f64 / self.hot.1 as f64);
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
        let mut names: Vec<(usize, String)> = [Lane::Gpu, Lane::Cpu, Lane::Pcie]
            .into_iter()
            .map(|l| (tid(l), l.label()))
            .collect();
        if self.ops.iter().any(|o| o.lane == Lane::Link) {
            names.push((tid(Lane::Link), Lane::Link.label()));
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
        names.extend(
            units
                .iter()
                .map(|&u| (tid(Lane::Ndp(u)), Lane::Ndp(u).label())),
        );
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

/// Share of a layer's experts that are hot: the complement of the coldest 70% (seed 000
/// figure 3, where the coldest 70% of experts take about 8% of the tokens).
pub const HOT_SHARE: f64 = 0.3;

/// How many of one layer's realised hot experts a load prediction also calls hot:
/// `(hits, hot)`.
///
/// `hot` is the number of hot experts, `n - floor(0.7 n)` of the `n` experts (see
/// [`HOT_SHARE`]) but at most the number that received tokens; the realised hot set is the
/// `hot` busiest experts of `loads`, the predicted one the `hot` largest of `predicted`
/// (ties by lower id; experts predicted at zero are never hot). Realised ties at the cut count in the prediction's favour: any
/// predicted expert as busy as the `hot`-th busiest is a hit while hot slots remain, so
/// the score is the best over every valid realised hot set.
pub fn hot_overlap(predicted: &[f64], loads: &[u32]) -> (usize, usize) {
    let n = loads.len();
    let active = loads.iter().filter(|&&x| x > 0).count();
    let hot = (n - (n as f64 * (1.0 - HOT_SHARE)) as usize).min(active);
    if hot == 0 {
        return (0, 0);
    }
    let mut real: Vec<u32> = loads.to_vec();
    real.sort_unstable_by(|a, b| b.cmp(a));
    let cut = real[hot - 1];
    let above = loads.iter().filter(|&&x| x > cut).count();
    let mut ids: Vec<usize> = (0..n).collect();
    let p = |e: usize| predicted.get(e).copied().unwrap_or(0.0);
    ids.sort_by(|&a, &b| p(b).total_cmp(&p(a)).then(a.cmp(&b)));
    let (mut sure, mut tied) = (0, 0);
    for &e in ids[..hot].iter().filter(|&&e| p(e) > 0.0) {
        if loads[e] > cut {
            sure += 1;
        } else if loads[e] == cut {
            tied += 1;
        }
    }
    (sure + tied.min(hot - above), hot)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hot_overlap_scores_the_top_30_percent() {
        // Ten experts: the hot set is the 3 busiest.
        let loads = [9, 8, 7, 1, 1, 1, 0, 0, 0, 0];
        assert_eq!(
            hot_overlap(&[9.0, 8.0, 7.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], &loads),
            (3, 3)
        );
        // Predicting expert 3 instead of 2 misses one.
        assert_eq!(
            hot_overlap(&[9.0, 8.0, 0.0, 7.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], &loads),
            (2, 3)
        );
        // Ties at the cut: 5 and 9 both hold 4 tokens; either fills the third slot, but
        // predicting both still gives only one slot.
        let tied = [9, 8, 0, 0, 0, 4, 0, 0, 0, 4];
        let both = [0.0, 0.0, 0.0, 0.0, 0.0, 5.0, 0.0, 0.0, 0.0, 5.0];
        assert_eq!(hot_overlap(&both, &tied), (1, 3));
        let mut good = both;
        good[0] = 6.0;
        assert_eq!(hot_overlap(&good, &tied), (2, 3));
        // Fewer active experts than hot slots: only the active ones are scored.
        let sparse = [0, 0, 5, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(hot_overlap(&[1.0; 10], &sparse), (0, 1));
        assert_eq!(hot_overlap(&[], &[0; 4]), (0, 0));
    }
}
