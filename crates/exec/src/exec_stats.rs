//! [`ExecStats`]: what the hybrid executor did, summed over a run.

use std::fmt;
use std::time::Duration;

#[cfg(doc)]
use crate::DeferredExperts;

/// What happened, summed over the run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExecStats {
    /// Forward passes (steps).
    pub steps: usize,
    /// MoE layers executed.
    pub layers: usize,
    /// Expert tasks run on the GPU.
    pub gpu_experts: usize,
    /// Expert tasks run on the CPU.
    pub cpu_experts: usize,
    /// (token, expert) pairs computed on the GPU.
    pub gpu_pairs: usize,
    /// (token, expert) pairs computed on the CPU.
    pub cpu_pairs: usize,
    /// Tasks whose output was deferred to the next layer.
    pub deferred_experts: usize,
    /// GPU tasks whose expert was resident when the policy decided.
    pub hits: usize,
    /// GPU tasks whose expert had to be copied.
    pub misses: usize,
    /// Expert copies to the device (cache, staging and initial).
    pub uploads: usize,
    /// Bytes of those copies.
    pub upload_bytes: u64,
    /// Copies placed before the first step (the policy's initial residency).
    pub initial_uploads: usize,
    /// Copies through the staging slots.
    pub staged: usize,
    /// Copies the device worker ran in the background, with no layer waiting on them:
    /// prefetches for later layers or steps, and the initial residency.
    pub prefetched: usize,
    /// Experts the policy evicted.
    pub evictions: usize,
    /// Copies refused: no free slot, no staging slot, or staged without a GPU task.
    pub refused_transfers: usize,
    /// GPU tasks run on the CPU because their expert was not on the device.
    pub fallbacks: usize,
    /// Most experts resident at once.
    pub peak_resident: usize,
    /// Bytes of the expert slots allocated on the device.
    pub slot_bytes_allocated: u64,
    /// Time the device worker spent (uploads, kernels, read-back).
    pub gpu_time: Duration,
    /// Time the CPU kernels spent (but on the deferred experts the hybrid layout runs
    /// itself while the device works: [`DeferredExperts`]).
    pub cpu_time: Duration,
}

impl ExecStats {
    /// GPU tasks served from the cache, `hits / (hits + misses)`.
    pub fn hit_rate(&self) -> f64 {
        self.hits as f64 / (self.hits + self.misses).max(1) as f64
    }
}

impl fmt::Display for ExecStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "gpu hit rate {:.1}% ({} hits, {} misses), uploads {} ({:.2} MiB, {} initial, {} staged, \
             {} in the background), \
             evictions {}, experts gpu {} / cpu {} ({} deferred), pairs gpu {} / cpu {}, \
             time gpu {:.1} ms / cpu {:.1} ms, refused {}, fallbacks {}",
            100.0 * self.hit_rate(),
            self.hits,
            self.misses,
            self.uploads,
            self.upload_bytes as f64 / (1 << 20) as f64,
            self.initial_uploads,
            self.staged,
            self.prefetched,
            self.evictions,
            self.gpu_experts,
            self.cpu_experts,
            self.deferred_experts,
            self.gpu_pairs,
            self.cpu_pairs,
            self.gpu_time.as_secs_f64() * 1e3,
            self.cpu_time.as_secs_f64() * 1e3,
            self.refused_transfers,
            self.fallbacks,
        )
    }
}
