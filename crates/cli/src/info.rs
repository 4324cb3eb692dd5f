//! `strata info`: what a model is and what it costs to run.
//!
//! A key design decision: everything is computed from the config and the stored tensor
//! table, without reading weights, so `info` answers at once even for models far larger
//! than memory. Only the bytes the weights take *as loaded* depend on the load (packing,
//! `--weights`): a converted model's tensor table gives them exactly, and `--load` measures
//! them for other sources.

use std::collections::BTreeMap;

use clap::Args;
use strata_model::config::{
    AttentionConfig, FfnConfig, GqaConfig, MlaConfig, ModelConfig, MoeConfig, Scoring,
};
use strata_model::source::Source;
use strata_model::{MemoryPlan, Model};

use crate::model_arg::ModelArgs;

/// Arguments of `strata info`.
#[derive(Debug, Args)]
pub struct InfoArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    json: bool,
    /// Load the weights (with `--dtype`/`--weights`) to measure the memory they take as
    /// loaded; without it nothing but the config and the tensor table is read.
    #[arg(long)]
    load: bool,
}

fn human(n: usize) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.2}B", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.2}M", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.1}K", n / 1e3)
    } else {
        format!("{n}")
    }
}

fn bytes(n: usize) -> String {
    let n = n as f64;
    if n >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", n / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", n / (1u64 << 20) as f64)
    }
}

pub fn run(args: InfoArgs) -> anyhow::Result<()> {
    let dir = args.model.dir()?;
    let (config, src) = strata_model::model::open(&dir)?;
    let mut dtypes: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut file_bytes = 0usize;
    for (dtype, n) in src.stored_tensors() {
        let e = dtypes.entry(dtype).or_default();
        e.0 += 1;
        e.1 += n;
        file_bytes += n;
    }
    let loaded = match (&src, args.load) {
        // A converted model maps what it stores: its tensor table is the loaded size.
        (Source::Strata(_), false) => Some(file_bytes),
        (_, false) => None,
        (_, true) => {
            let model = Model::from_source(config.clone(), &src, args.model.load_options())?;
            Some(model.param_counts().weight_bytes)
        }
    };
    let plan = MemoryPlan::of(&config, &src, args.model.load_options());
    let cfg = &config;
    let (total, active) = cfg.param_counts();
    let kv_per_token = strata_model::memory::kv_bytes_per_token(cfg) as usize;
    let n_moe = cfg
        .layers
        .iter()
        .filter(|l| matches!(l, FfnConfig::Moe(_)))
        .count();
    let moe = cfg.layers.iter().find_map(|l| match l {
        FfnConfig::Moe(m) => Some(m),
        FfnConfig::Dense(_) => None,
    });
    // With the memory available now, would the routed experts run from the SSD tier?
    let expert_cache = strata_model::memory::available_bytes()
        .and_then(|a| plan.expert_cache_budget(a, plan.expert_cache_reserve()));
    let attention = attention_line(cfg);
    let experts = moe.map(experts_line);
    if args.json {
        let doc = serde_json::json!({
            "path": dir,
            "architecture": cfg.arch.hf_name(),
            "layers": cfg.n_layers(),
            "moe_layers": n_moe,
            "hidden_size": cfg.hidden_size,
            "vocab_size": cfg.vocab_size,
            "attention": attention,
            "experts": moe.map(|m| serde_json::json!({
                "routed": m.router.n_experts,
                "top_k": m.router.top_k,
                "intermediate": m.intermediate,
                "shared": m.shared.is_some(),
            })),
            "parameters": {"total": total, "active_per_token": active},
            "dtypes": dtypes.iter().map(|(k, (n, b))| (k.clone(), serde_json::json!({"tensors": n, "bytes": b}))).collect::<serde_json::Map<_, _>>(),
            "weight_bytes_on_disk": file_bytes,
            "weight_bytes_loaded": loaded,
            "kv_cache_bytes_per_token": kv_per_token,
            "memory": {
                "private_weight_bytes": plan.private_weights,
                "mapped_weight_bytes": plan.mapped_weights,
                "needs_bytes_at_context": plan.needs(cfg.max_position_embeddings as u64),
                "available_bytes": strata_model::memory::available_bytes(),
                "expert_cache_bytes": expert_cache,
            },
            "slow_types": slow_types(&dtypes),
            "device_f16_types": device_f16(&dtypes).iter().map(|d| serde_json::json!({
                "type": d.name, "tensors": d.tensors, "bytes": d.bytes, "f16_bytes": d.f16_bytes,
            })).collect::<Vec<_>>(),
            "max_position_embeddings": cfg.max_position_embeddings,
        });
        outln!("{}", serde_json::to_string_pretty(&doc)?)?;
        return Ok(());
    }
    let dt: Vec<String> = dtypes
        .iter()
        .map(|(k, (n, b))| format!("{k} ({n} tensors, {})", bytes(*b)))
        .collect();
    outln!("model          {}", dir.display())?;
    outln!("architecture   {}", cfg.arch.hf_name())?;
    outln!(
        "layers         {} ({n_moe} mixture-of-experts, {} dense)",
        cfg.n_layers(),
        cfg.n_layers() - n_moe
    )?;
    outln!("hidden / vocab {} / {}", cfg.hidden_size, cfg.vocab_size)?;
    outln!("attention      {attention}")?;
    outln!(
        "experts        {}",
        experts.unwrap_or_else(|| "none (dense model)".into())
    )?;
    outln!(
        "parameters     {} total, {} active per token",
        human(total),
        human(active)
    )?;
    outln!("dtypes         {}", dt.join(", "))?;
    let as_loaded = match loaded {
        Some(b) => format!("{} as loaded", bytes(b)),
        None => "--load to measure them as loaded".into(),
    };
    outln!(
        "memory         {} of weights on disk, {as_loaded}; KV cache {} per token",
        bytes(file_bytes),
        if kv_per_token >= 1 << 20 {
            bytes(kv_per_token)
        } else {
            format!("{:.1} KiB", kv_per_token as f64 / 1024.0)
        }
    )?;
    outln!(
        "resident       {} copied into memory, {} used in place from the file (page cache)",
        bytes(plan.private_weights as usize),
        bytes(plan.mapped_weights as usize)
    )?;
    let available =
        strata_model::memory::available_bytes().map_or("unknown".into(), |a| bytes(a as usize));
    outln!(
        "a full context  needs {} of private memory for one sequence of {} positions (available: {available})",
        bytes(plan.needs(cfg.max_position_embeddings as u64) as usize),
        cfg.max_position_embeddings
    )?;
    if let Some(b) = expert_cache {
        outln!("{}", ssd_line(&plan, b))?;
    }
    let slow = slow_types(&dtypes);
    if !slow.is_empty() {
        outln!(
            "kernels        {} dequantized per row block to f32 (no int8 kernel yet, slower)",
            slow.join(", ")
        )?;
    }
    let widened = device_f16(&dtypes);
    if !widened.is_empty() {
        let list: Vec<String> = widened
            .iter()
            .map(|d| {
                let (n, b, f) = (d.tensors, bytes(d.bytes), bytes(d.f16_bytes));
                format!("{} ({n} tensors, {b} -> {f})", d.name)
            })
            .collect();
        outln!(
            "on a GPU       {} dequantized to F16 on upload (the device kernels read the other types as stored)",
            list.join(", ")
        )?;
    }
    outln!("context        {} positions", cfg.max_position_embeddings)?;
    Ok(())
}

/// A ggml block type the accelerator has no kernel for: `--device gpu|hybrid` stores it as
/// F16 (`strata_exec`'s device types).
struct DeviceF16 {
    name: String,
    tensors: usize,
    bytes: usize,
    f16_bytes: usize,
}

fn device_f16(dtypes: &BTreeMap<String, (usize, usize)>) -> Vec<DeviceF16> {
    dtypes
        .iter()
        .filter_map(|(name, &(tensors, bytes))| {
            let f16 = strata_exec::device_f16_bytes(name, bytes as u64)?;
            Some(DeviceF16 {
                name: name.clone(),
                tensors,
                bytes,
                f16_bytes: f16 as usize,
            })
        })
        .collect()
}

/// The attention kind and its heads, as `info` shows them.
/// The line that says a model's routed experts will run from the SSD tier, with its cache.
fn ssd_line(plan: &MemoryPlan, cache: u64) -> String {
    format!(
        "SSD tier       the routed experts ({}) do not fit in the memory available: they will \
         be read from the file into an expert cache of {} (--expert-cache)",
        bytes(plan.mapped_experts as usize),
        bytes(cache as usize)
    )
}

fn attention_line(cfg: &ModelConfig) -> String {
    match &cfg.attention {
        AttentionConfig::Gqa(GqaConfig {
            n_heads,
            n_kv_heads,
            head_dim,
            ..
        }) => format!("GQA, {n_heads} query / {n_kv_heads} key-value heads of {head_dim}"),
        AttentionConfig::Mla(MlaConfig {
            n_heads,
            q_lora_rank,
            kv_lora_rank,
            ..
        }) => format!(
            "MLA, {n_heads} heads, kv_lora_rank {kv_lora_rank}, q_lora_rank {}",
            q_lora_rank.map_or("none".to_string(), |r| r.to_string())
        ),
    }
}

/// The experts and their router, as `info` shows them.
fn experts_line(m: &MoeConfig) -> String {
    let r = &m.router;
    format!(
        "{} routed (top-{}, intermediate {}), {} shared; router {}{}{}",
        r.n_experts,
        r.top_k,
        m.intermediate,
        m.shared.as_ref().map_or("none".to_string(), |s| format!(
            "1 of intermediate {}",
            s.intermediate
        )),
        match r.scoring {
            Scoring::Softmax => "softmax",
            Scoring::Sigmoid => "sigmoid",
        },
        r.groups.map_or(String::new(), |g| format!(
            ", {} groups keep {}",
            g.n_group, g.topk_group
        )),
        if r.norm_topk_prob {
            ", renormalised"
        } else {
            ""
        },
    )
}

/// Stored quantized types that have no int8 kernel (they run on the generic path).
fn slow_types(dtypes: &BTreeMap<String, (usize, usize)>) -> Vec<String> {
    dtypes
        .keys()
        .filter(|name| {
            strata_kernels::ggml::GgmlType::ALL.iter().any(|t| {
                t.name() == name.as_str()
                    && t.block_size() > 1
                    && !strata_kernels::ggml::has_fast_kernel(*t)
            })
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use strata_model::{Model, Precision};

    /// The config-only counts agree with the loaded model's on every fixture, and so does
    /// the KV cache size.
    #[test]
    fn config_counts_match_the_loaded_model() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut paths = Vec::new();
        for dir in ["tests/fixtures", "tests/fixtures-gguf"] {
            for e in std::fs::read_dir(root.join(dir)).expect("fixtures") {
                let p = e.expect("entry").path();
                if p.join("config.json").is_file() || p.extension().is_some_and(|x| x == "gguf") {
                    paths.push(p);
                }
            }
        }
        assert!(paths.len() >= 20);
        for p in paths {
            let m = Model::load(&p, Precision::Fast).expect("fixture loads");
            let c = m.param_counts();
            assert_eq!(
                m.config.param_counts(),
                (c.total, c.active),
                "{}",
                p.display()
            );
            let floats: usize = m.new_cache().widths().iter().map(|(a, b)| a + b).sum();
            let bytes = strata_model::memory::kv_bytes_per_token(&m.config) as usize;
            assert_eq!(bytes, 4 * floats, "{}", p.display());
        }
    }
}
