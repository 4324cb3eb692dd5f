//! What a device did: the host's traffic with it ([`Traffic`]) and device time per kernel
//! ([`KernelTimes`]), for finding where a step's time goes on a real GPU.
//!
//! A backend that can time its dispatches (`STRATA_GPU_PROFILE=1` with the wgpu backend:
//! timestamp queries around each dispatch) adds up each kernel's calls and device time;
//! [`crate::Device::kernel_times`] returns the totals so far and [`KernelTimes::since`] the
//! part of a run between two readings (prefill, decode).

use std::collections::BTreeMap;

/// What the host has asked of a device since it was opened: the figures behind "host
/// round trips and submissions per token".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Submissions of recorded work to the device's queue.
    pub submissions: u64,
    /// Downloads: each one a host round trip (the host waits for the device's result).
    pub downloads: u64,
    /// Bytes uploaded from the host.
    pub uploaded: u64,
    /// Bytes downloaded to the host.
    pub downloaded: u64,
    /// Kernel dispatches recorded.
    pub dispatches: u64,
    /// Bind groups created for them (the others reused one).
    pub bind_groups: u64,
    /// Host time spent recording them, in nanoseconds: what a step costs the CPU before the
    /// device starts on it.
    pub record_ns: u64,
    /// Host time spent finishing the recorded commands and submitting them, in nanoseconds:
    /// where wgpu tracks every dispatch's buffers, places the barriers and encodes the
    /// driver's commands (on an H100 most of a decoded token's time, 11-82 us a dispatch).
    pub submit_ns: u64,
    /// Host time blocked waiting for the device (a download's result, an event), in
    /// nanoseconds, summed over the threads that wait: in the hybrid layout under
    /// `ktransformers` (one waiting thread), the device's part of a step that the host did
    /// not overlap with its own work.
    pub wait_ns: u64,
    /// Kernels compiled (a GPU driver compiles each one on its first use unless
    /// [`crate::Device::prepare_kernels`] compiled it ahead).
    pub compiled: u64,
}

impl Traffic {
    /// What happened between `earlier` and `self`.
    pub fn since(self, earlier: Traffic) -> Traffic {
        Traffic {
            submissions: self.submissions - earlier.submissions,
            downloads: self.downloads - earlier.downloads,
            uploaded: self.uploaded - earlier.uploaded,
            downloaded: self.downloaded - earlier.downloaded,
            dispatches: self.dispatches - earlier.dispatches,
            bind_groups: self.bind_groups - earlier.bind_groups,
            record_ns: self.record_ns - earlier.record_ns,
            submit_ns: self.submit_ns - earlier.submit_ns,
            wait_ns: self.wait_ns - earlier.wait_ns,
            compiled: self.compiled - earlier.compiled,
        }
    }
}

/// A kernel's dispatches and their device time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelTime {
    /// Dispatches timed.
    pub calls: u64,
    /// Device time from each dispatch's start to its end, summed, in nanoseconds.
    pub ns: u64,
}

/// Timed dispatches by kernel (its shader and weight type, as `matmul_q q4_k`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelTimes {
    /// Each kernel's totals.
    pub kernels: BTreeMap<String, KernelTime>,
    /// Dispatches recorded while profiling but not timed (a submission held more than its
    /// query set has room for).
    pub untimed: u64,
}

impl KernelTimes {
    /// Adds one timed dispatch of `kernel`.
    pub fn add(&mut self, kernel: &str, ns: u64) {
        let t = self.kernels.entry(kernel.to_string()).or_default();
        t.calls += 1;
        t.ns += ns;
    }

    /// What was timed between `earlier` and `self`.
    pub fn since(&self, earlier: &KernelTimes) -> KernelTimes {
        let mut kernels = BTreeMap::new();
        for (name, t) in &self.kernels {
            let before = earlier.kernels.get(name).copied().unwrap_or_default();
            if t.calls > before.calls {
                kernels.insert(
                    name.clone(),
                    KernelTime {
                        calls: t.calls - before.calls,
                        ns: t.ns - before.ns,
                    },
                );
            }
        }
        KernelTimes {
            kernels,
            untimed: self.untimed - earlier.untimed,
        }
    }

    /// Device time of every timed dispatch, in nanoseconds.
    pub fn total_ns(&self) -> u64 {
        self.kernels.values().map(|t| t.ns).sum()
    }

    /// The kernels, most device time first.
    pub fn by_time(&self) -> Vec<(&str, KernelTime)> {
        let mut v: Vec<_> = self.kernels.iter().map(|(n, t)| (n.as_str(), *t)).collect();
        v.sort_by(|a, b| b.1.ns.cmp(&a.1.ns).then(a.0.cmp(b.0)));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_keeps_only_what_ran_between_the_readings() {
        let mut a = KernelTimes::default();
        a.add("matmul_q q4_k", 100);
        a.add("attention f16", 50);
        let before = a.clone();
        a.add("matmul_q q4_k", 30);
        a.add("topk f32", 7);
        a.untimed = 2;
        let d = a.since(&before);
        assert_eq!(d.kernels.len(), 2);
        assert_eq!(d.kernels["matmul_q q4_k"], KernelTime { calls: 1, ns: 30 });
        assert_eq!(d.kernels["topk f32"], KernelTime { calls: 1, ns: 7 });
        assert_eq!(d.untimed, 2);
        assert_eq!(d.total_ns(), 37);
        assert_eq!(d.by_time()[0].0, "matmul_q q4_k");
    }
}
