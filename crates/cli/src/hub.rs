//! Models named by a Hugging Face hub id (`org/name`): found in the local hub cache or
//! downloaded into it, with the same cache layout and environment variables (`HF_HOME`,
//! `HF_ENDPOINT`, `HF_TOKEN`) as the Python `huggingface_hub`.

use std::path::PathBuf;

use anyhow::{Context, bail};
use hf_hub::api::sync::{ApiBuilder, ApiRepo};

/// Files a model directory needs besides its weights.
const REQUIRED: &[&str] = &["config.json", "tokenizer.json"];
/// Files used when present.
const OPTIONAL: &[&str] = &[
    "tokenizer_config.json",
    "generation_config.json",
    "chat_template.jinja",
];

/// Whether `s` looks like a hub id rather than a path.
pub fn looks_like_hub_id(s: &str) -> bool {
    let mut parts = s.split('/');
    let (Some(org), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let ok = |p: &str| {
        !p.is_empty()
            && !p.starts_with('.')
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    ok(org) && ok(name)
}

/// The local snapshot directory of hub model `id`, downloading what is missing.
pub fn fetch(id: &str) -> anyhow::Result<PathBuf> {
    let api = ApiBuilder::from_env()
        .with_progress(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .build()
        .with_context(|| format!("{id}: cannot set up the Hugging Face hub client"))?;
    let repo = api.model(id.to_owned());
    let get = |repo: &ApiRepo, file: &str| {
        repo.get(file).with_context(|| {
            format!("{id}: fetching {file} from the Hugging Face hub (or its cache)")
        })
    };
    let config = get(&repo, REQUIRED[0])?;
    for file in &REQUIRED[1..] {
        get(&repo, file)?;
    }
    for file in OPTIONAL {
        // Optional files: absent from many repositories.
        let _ = repo.get(file);
    }
    match repo.get("model.safetensors.index.json") {
        Ok(index) => {
            let text = std::fs::read_to_string(&index)
                .with_context(|| format!("{}: cannot read", index.display()))?;
            let doc: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("{}: invalid JSON", index.display()))?;
            let Some(map) = doc.get("weight_map").and_then(|m| m.as_object()) else {
                bail!("{}: no weight_map", index.display());
            };
            let mut shards: Vec<&str> = map.values().filter_map(|v| v.as_str()).collect();
            shards.sort_unstable();
            shards.dedup();
            for shard in shards {
                get(&repo, shard)?;
            }
        }
        Err(_) => {
            get(&repo, "model.safetensors")?;
        }
    }
    let dir = config
        .parent()
        .map(PathBuf::from)
        .with_context(|| format!("{id}: cached config has no parent directory"))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::looks_like_hub_id;

    #[test]
    fn hub_ids() {
        assert!(looks_like_hub_id("Qwen/Qwen3-30B-A3B"));
        assert!(looks_like_hub_id("deepseek-ai/DeepSeek-V3"));
        assert!(!looks_like_hub_id("./models/x"));
        assert!(!looks_like_hub_id("/abs/path"));
        assert!(!looks_like_hub_id("a/b/c"));
        assert!(!looks_like_hub_id("models"));
    }
}
