//! `strata info`: what a model is and what it costs to run.

use std::collections::BTreeMap;

use clap::Args;
use strata_model::Model;
use strata_model::config::{AttentionConfig, FfnConfig, Scoring};

use crate::model_arg::ModelArgs;

/// Arguments of `strata info`.
#[derive(Debug, Args)]
pub struct InfoArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    json: bool,
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
    let model = Model::from_source(config, &src, args.model.load_options())?;
    let cfg = &model.config;
    let counts = model.param_counts();
    let kv_per_token: usize = model
        .new_cache()
        .widths()
        .iter()
        .map(|(a, b)| (a + b) * 4)
        .sum();
    let n_moe = cfg
        .layers
        .iter()
        .filter(|l| matches!(l, FfnConfig::Moe(_)))
        .count();
    let moe = cfg.layers.iter().find_map(|l| match l {
        FfnConfig::Moe(m) => Some(m),
        FfnConfig::Dense(_) => None,
    });
    let attention = match &cfg.attention {
        AttentionConfig::Gqa {
            n_heads,
            n_kv_heads,
            head_dim,
            ..
        } => format!("GQA, {n_heads} query / {n_kv_heads} key-value heads of {head_dim}"),
        AttentionConfig::Mla {
            n_heads,
            q_lora_rank,
            kv_lora_rank,
            ..
        } => format!(
            "MLA, {n_heads} heads, kv_lora_rank {kv_lora_rank}, q_lora_rank {}",
            q_lora_rank.map_or("none".to_string(), |r| r.to_string())
        ),
    };
    let experts = moe.map(|m| {
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
    });
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
            "parameters": {"total": counts.total, "active_per_token": counts.active},
            "dtypes": dtypes.iter().map(|(k, (n, b))| (k.clone(), serde_json::json!({"tensors": n, "bytes": b}))).collect::<serde_json::Map<_, _>>(),
            "weight_bytes_on_disk": file_bytes,
            "weight_bytes_loaded": counts.weight_bytes,
            "kv_cache_bytes_per_token": kv_per_token,
            "max_position_embeddings": cfg.max_position_embeddings,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    let dt: Vec<String> = dtypes
        .iter()
        .map(|(k, (n, b))| format!("{k} ({n} tensors, {})", bytes(*b)))
        .collect();
    println!("model          {}", dir.display());
    println!("architecture   {}", cfg.arch.hf_name());
    println!(
        "layers         {} ({n_moe} mixture-of-experts, {} dense)",
        cfg.n_layers(),
        cfg.n_layers() - n_moe
    );
    println!("hidden / vocab {} / {}", cfg.hidden_size, cfg.vocab_size);
    println!("attention      {attention}");
    println!(
        "experts        {}",
        experts.unwrap_or_else(|| "none (dense model)".into())
    );
    println!(
        "parameters     {} total, {} active per token",
        human(counts.total),
        human(counts.active)
    );
    println!("dtypes         {}", dt.join(", "));
    println!(
        "memory         {} of weights on disk, {} as loaded (fast path); KV cache {} per token",
        bytes(file_bytes),
        bytes(counts.weight_bytes),
        if kv_per_token >= 1 << 20 {
            bytes(kv_per_token)
        } else {
            format!("{:.1} KiB", kv_per_token as f64 / 1024.0)
        }
    );
    println!("context        {} positions", cfg.max_position_embeddings);
    Ok(())
}
