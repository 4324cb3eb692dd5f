//! Memory admission: what a model needs that the OS cannot page back to its file, checked
//! against what is available before anything is loaded, so a run that cannot fit is refused
//! with a message instead of being killed by the kernel's OOM killer halfway through.
//!
//! A key design decision: weights used in place from a mapped file (GGUF blocks, BF16
//! safetensors, converted models) are *not* counted as needed. Their pages are shared and
//! clean; the kernel evicts and re-reads them under pressure, so a model larger than RAM
//! still runs (slower). What counts is private memory: weights the loader converts or
//! repacks, the KV cache of the sequences to be run, and a fixed scratch reserve.

use crate::config::ModelConfig;
use crate::linear::{LoadOptions, Precision};
use crate::source::Source;
use crate::{Error, Result};

/// Scratch the kernels and activations may use (per-thread tiles, MoE wave buffers, logits).
pub const SCRATCH_BYTES: u64 = 512 << 20;

/// A model's memory, estimated from its config and stored tensors without loading them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryPlan {
    /// Weight bytes the loader copies into private memory (converted, repacked or f32).
    pub private_weights: u64,
    /// Weight bytes used in place from the mapped file (page cache: shared, evictable).
    pub mapped_weights: u64,
    /// Of those, the routed experts' (a GGUF's `*_exps` tensors): what an expert cache can
    /// read from the file instead of mapping (the SSD tier).
    pub mapped_experts: u64,
    /// KV cache bytes per position of one sequence (f32 keys and values, or MLA latents).
    pub kv_per_token: u64,
}

impl MemoryPlan {
    /// The plan of `config` loaded from `src` with `opts`.
    pub fn of(config: &ModelConfig, src: &Source, opts: LoadOptions) -> MemoryPlan {
        let (private, mapped, mapped_experts) = weight_bytes(src, opts);
        MemoryPlan {
            private_weights: private,
            mapped_weights: mapped,
            mapped_experts,
            kv_per_token: kv_bytes_per_token(config),
        }
    }

    /// Private bytes a run of `positions` cached positions in all (context x sequences)
    /// needs: copied weights, KV cache and scratch.
    pub fn needs(&self, positions: u64) -> u64 {
        self.private_weights + self.kv_per_token.saturating_mul(positions) + SCRATCH_BYTES
    }

    /// Fails unless [`MemoryPlan::needs`]`(positions)` fits in the memory available now;
    /// `lower` says which options lower the need. Passes when the available memory cannot
    /// be read (not Linux).
    pub fn check(&self, positions: u64, lower: &str) -> Result<()> {
        let Some(available) = available_bytes() else {
            return Ok(());
        };
        let needs = self.needs(positions);
        if needs <= available {
            return Ok(());
        }
        Err(Error::Memory(format!(
            "not enough memory: this run needs {} of private memory ({} of converted weights, \
             {} of KV cache for {positions} positions, {} of scratch) and {} is available; \
             {lower}",
            gib(needs),
            gib(self.private_weights),
            gib(self.kv_per_token.saturating_mul(positions)),
            gib(SCRATCH_BYTES),
            gib(available),
        )))
    }
}

impl MemoryPlan {
    /// Cached positions (all sequences together) that fit next to the copied weights and the
    /// scratch reserve in `available` bytes: what a server's context can be sized from.
    pub fn positions_that_fit(&self, available: u64) -> u64 {
        let free = available.saturating_sub(self.private_weights + SCRATCH_BYTES);
        free / self.kv_per_token.max(1)
    }

    /// The expert cache a run gets when the mapped routed experts do not fit in `available`
    /// bytes (measured after the load: copied weights already taken) beside the other mapped
    /// weights and `reserve` (KV caches, scratch): the bytes left for it; `None` when they fit.
    pub fn expert_cache_budget(&self, available: u64, reserve: u64) -> Option<u64> {
        let other = self.mapped_weights.saturating_sub(self.mapped_experts);
        let room = available.saturating_sub(other + reserve);
        (self.mapped_experts > room).then_some(room)
    }

    /// What an automatic expert cache keeps back beside the weights: the KV cache of 4096
    /// positions and 1 GiB of scratch.
    pub fn expert_cache_reserve(&self) -> u64 {
        self.kv_per_token * 4096 + (1 << 30)
    }
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

/// KV cache bytes per position of one sequence.
pub fn kv_bytes_per_token(cfg: &ModelConfig) -> u64 {
    (cfg.attention.kv_elems() * cfg.n_layers() * 4) as u64
}

/// `(private, mapped, mapped routed experts)` weight bytes: which stored tensors the loader
/// copies under `opts`.
fn weight_bytes(src: &Source, opts: LoadOptions) -> (u64, u64, u64) {
    let fast = opts.precision == Precision::Fast;
    // Bytes per value of a repacked routed expert.
    let expert_bytes = |elems: u64| match opts.experts {
        strata_kernels::PackedFormat::Bf16 => 2 * elems,
        strata_kernels::PackedFormat::Int8 { .. } => elems + elems / 16,
        strata_kernels::PackedFormat::Int4 { .. } => elems / 2 + elems / 8,
    };
    let (mut private, mut mapped, mut experts) = (0u64, 0u64, 0u64);
    match src {
        Source::Gguf(g) => {
            for t in g.tensors() {
                let elems = t.n_elements();
                let f32_stored = t.ggml_type == strata_kernels::ggml::GgmlType::F32;
                if !fast {
                    private += 4 * elems;
                } else if opts.keep_blocks && !f32_stored {
                    mapped += t.n_bytes;
                    if t.name.contains("_exps.") {
                        experts += t.n_bytes;
                    }
                } else if f32_stored {
                    private += t.n_bytes;
                } else if t.name.contains("_exps.") {
                    private += expert_bytes(elems);
                } else {
                    private += 2 * elems;
                }
            }
        }
        Source::Safetensors(ck) => {
            for t in ck.tensors() {
                let elems = t.numel() as u64;
                let bytes = t.bytes().len() as u64;
                if !fast {
                    private += 4 * elems;
                } else if t.name().contains(".experts.") {
                    private += expert_bytes(elems);
                } else if t.name().contains("embed_tokens") && t.as_bf16().is_some() {
                    mapped += bytes;
                } else if t.dtype() == strata_formats::DType::F32 {
                    private += bytes;
                } else {
                    // Projections are packed for the kernels: a BF16 copy.
                    private += 2 * elems;
                }
            }
        }
        Source::Strata(f) => {
            for t in f.tensors() {
                mapped += f.stored_bytes(t) as u64;
            }
        }
    }
    (private, mapped, experts)
}

/// What can be allocated without swapping or the OOM killer: `MemAvailable` from
/// `/proc/meminfo` (page cache that can be dropped included), and inside a memory cgroup (a
/// container, `systemd-run -p MemoryMax=`) no more than its smallest limit on the way to the
/// root less the anonymous memory it holds. `None` where neither can be read.
pub fn available_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok();
    let line = info
        .as_deref()
        .and_then(|i| i.lines().find(|l| l.starts_with("MemAvailable:")));
    let host = line
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map(|kib| kib * 1024);
    match (host, cgroup_room()) {
        (Some(h), Some(c)) => Some(h.min(c)),
        (h, c) => h.or(c),
    }
}

/// The room left in this process's memory cgroup (v2 or v1): its smallest limit up to the
/// root, less its anonymous memory (page cache is reclaimed under the limit). `None` outside
/// a limited cgroup.
fn cgroup_room() -> Option<u64> {
    let groups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let read = |p: &std::path::Path| std::fs::read_to_string(p).ok();
    let stat_value = |stat: &str, key: &str| {
        let line = stat
            .lines()
            .find(|l| l.split_whitespace().next() == Some(key))?;
        line.split_whitespace().nth(1)?.parse::<u64>().ok()
    };
    // v1 "N:memory:/path" first, else v2 "0::/path".
    let (root, limit_file, anon_key, rel) = match groups
        .lines()
        .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_owned()))
    {
        Some(p) => (
            "/sys/fs/cgroup/memory",
            "memory.limit_in_bytes",
            "total_rss",
            p,
        ),
        None => {
            let p = groups.lines().find_map(|l| l.strip_prefix("0::"))?;
            ("/sys/fs/cgroup", "memory.max", "anon", p.to_owned())
        }
    };
    let leaf = std::path::Path::new(root).join(rel.trim_start_matches('/'));
    let mut limit: Option<u64> = None;
    for dir in leaf.ancestors().take_while(|d| d.starts_with(root)) {
        let l = read(&dir.join(limit_file)).and_then(|v| v.trim().parse::<u64>().ok());
        // v1 writes "no limit" as a page-rounded i64::MAX, v2 as "max" (not a number).
        if let Some(l) = l.filter(|&l| l < 1 << 60) {
            limit = Some(limit.map_or(l, |m: u64| m.min(l)));
        }
    }
    let anon = read(&leaf.join("memory.stat")).and_then(|s| stat_value(&s, anon_key));
    Some(limit?.saturating_sub(anon.unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_that_cannot_fit_is_refused_with_what_it_needs() {
        let plan = MemoryPlan {
            private_weights: 1 << 30,
            mapped_weights: 1 << 40,
            mapped_experts: 0,
            kv_per_token: 1 << 20,
        };
        assert_eq!(plan.needs(10), (1 << 30) + (10 << 20) + SCRATCH_BYTES);
        if available_bytes().is_some() {
            let err = plan.check(1 << 20, "use fewer positions").unwrap_err();
            let msg = err.to_string();
            assert!(msg.starts_with("not enough memory"), "{msg}");
            assert!(
                msg.contains("1024.00 GiB of KV cache for 1048576 positions"),
                "{msg}"
            );
            assert!(msg.ends_with("use fewer positions"), "{msg}");
            // Mapped weights are not counted: a small run of a huge mapped model passes.
            plan.check(16, "").expect("fits");
        }
        // 3 GiB available: 1 GiB of weights and 0.5 GiB of scratch leave 1.5 GiB, 1536
        // positions of 1 MiB.
        assert_eq!(plan.positions_that_fit(3 << 30), 1536);
        assert_eq!(plan.positions_that_fit(1 << 30), 0);
    }

    #[test]
    fn routed_experts_that_do_not_fit_get_the_memory_left_as_their_cache() {
        let plan = MemoryPlan {
            private_weights: 1 << 30,
            mapped_weights: 20 << 30,
            mapped_experts: 18 << 30,
            kv_per_token: 1 << 20,
        };
        // 8 GiB free: 2 GiB of other mapped weights and 1 GiB kept back leave 5 GiB.
        assert_eq!(plan.expert_cache_budget(8 << 30, 1 << 30), Some(5 << 30));
        assert_eq!(plan.expert_cache_budget(24 << 30, 1 << 30), None);
        assert_eq!(plan.expert_cache_budget(1 << 30, 1 << 30), Some(0));
    }

    #[test]
    fn available_memory_is_read_on_linux() {
        if cfg!(target_os = "linux") {
            let a = available_bytes().expect("MemAvailable");
            assert!(a > 1 << 20, "{a}");
        }
    }
}
