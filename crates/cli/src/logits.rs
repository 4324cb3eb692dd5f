//! `strata logits`: the logits at every position of a token sequence, as a float32 NumPy
//! array `[n_tokens, vocab]`.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use strata_model::{LogitsWanted, SeqInput};

use crate::model_arg::{Device, DeviceArgs, ModelArgs};

/// Arguments of `strata logits`.
#[derive(Debug, Args)]
pub struct LogitsArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Token ids, comma separated (e.g. `1,2,3`).
    #[arg(long, value_name = "IDS")]
    tokens: String,
    /// Output file (.npy, float32, [n_tokens, vocab]); written atomically.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Feed this many tokens per forward pass through the KV cache (1 = token by token);
    /// default: all at once.
    #[arg(long, value_name = "N")]
    chunk: Option<usize>,
    // Last: its help headings would otherwise take in the options after it.
    #[command(flatten)]
    device: DeviceArgs,
}

/// Parses `1,2,3` into ids.
fn parse_tokens(s: &str) -> anyhow::Result<Vec<u32>> {
    let ids = s
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .enumerate()
        .map(|(i, t)| {
            t.parse::<u32>()
                .with_context(|| format!("--tokens: item {} (`{t}`) is not a token id", i + 1))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    if ids.is_empty() {
        bail!("--tokens: no token ids given");
    }
    Ok(ids)
}

pub fn run(args: LogitsArgs) -> anyhow::Result<()> {
    let device = args.device.checked()?;
    let tokens = parse_tokens(&args.tokens)?;
    let chunk = match args.chunk {
        Some(0) => bail!("--chunk must be at least 1"),
        Some(n) => n,
        None => tokens.len(),
    };
    let dir = args.model.dir()?;
    if device != Device::Cpu {
        let (model, hybrid) = match device {
            Device::Hybrid => {
                let h = args.device.hybrid_model(&dir, args.model.load_options())?;
                (h.gpu, h.exec)
            }
            _ => (args.device.gpu_model(&dir)?, None),
        };
        let vocab = model.config.vocab_size;
        let mut cache = model.new_cache(tokens.len())?;
        let mut logits = Vec::with_capacity(tokens.len() * vocab);
        for part in tokens.chunks(chunk) {
            logits.extend(model.forward(part, &mut cache)?);
        }
        strata_formats::npy::write_f32(&args.out, &[tokens.len(), vocab], &logits)?;
        if let Some(exec) = hybrid {
            eprintln!("[hybrid, policy {}: {}]", exec.policy_name(), exec.stats());
        }
        return Ok(());
    }
    let (mut model, _) = args.model.load_model(&dir)?;
    let ssd = args.device.ssd_tier(&dir, &mut model)?;
    let vocab = model.config.vocab_size;
    let mut cache = model.new_cache();
    let mut logits = Vec::with_capacity(tokens.len() * vocab);
    for part in tokens.chunks(chunk) {
        let mut seqs = [SeqInput {
            tokens: part,
            cache: &mut cache,
            logits: LogitsWanted::All,
        }];
        logits.extend(model.forward(&mut seqs)?.remove(0));
    }
    strata_formats::npy::write_f32(&args.out, &[tokens.len(), vocab], &logits)?;
    if let Some(tier) = ssd {
        eprintln!("[expert cache: {}]", tier.stats());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_tokens;

    #[test]
    fn token_lists() {
        assert_eq!(parse_tokens("1,2, 3").unwrap(), vec![1, 2, 3]);
        assert!(parse_tokens("").is_err());
        let err = parse_tokens("1,x").unwrap_err().to_string();
        assert!(err.contains("item 2"), "{err}");
    }
}
