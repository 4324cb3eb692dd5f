//! `strata convert`: writes a model in the engine's own packed format (`.strata`), so that
//! later loads map the weights instead of converting them.
//!
//! The model is loaded once from its source (a Hugging Face directory, FP8 included, or a
//! GGUF file) with the chosen `--dtype` and `--weights`, while the loader records what it
//! builds; the recording, the normalised config and the tokenizer (its `tokenizer.json`,
//! special tokens and chat template) go into one self-contained file. A key design decision:
//! conversion reuses the loading code rather than a second path over the checkpoint, so a
//! converted model computes bit for bit what its source computes with the same options.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;
use serde_json::{Value, json};
use strata_model::Model;
use strata_model::linear::write_converted;
use strata_model::model::STRATA_FILE;
use strata_model::source::Source;

use crate::model_arg::ModelArgs;
use crate::progress::Progress;

/// Arguments of `strata convert`.
#[derive(Debug, Args)]
pub struct ConvertArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Where to write: a file ending in `.strata`, or a directory (created if needed) that
    /// will hold `model.strata`. Either is then a `--model` for the other commands.
    #[arg(long, short = 'o', value_name = "PATH")]
    out: PathBuf,
}

/// The output file for `--out`, and whether its directory was created for it.
fn out_file(out: &Path) -> anyhow::Result<(PathBuf, bool)> {
    if out.extension().is_some_and(|e| e == "strata") && !out.is_dir() {
        return Ok((out.to_owned(), false));
    }
    let created = !out.exists();
    std::fs::create_dir_all(out)
        .with_context(|| format!("{}: cannot create the output directory", out.display()))?;
    Ok((out.join(STRATA_FILE), created))
}

/// The source's `tokenizer.json` bytes and its special tokens, or `None` when the source
/// carries no tokenizer (test fixtures).
fn tokenizer(src_path: &Path, src: &Source) -> anyhow::Result<Option<(Vec<u8>, Value)>> {
    let json = match src {
        Source::Safetensors(_) => {
            let p = src_path.join("tokenizer.json");
            if !p.is_file() {
                return Ok(None);
            }
            std::fs::read(&p).with_context(|| format!("{}: cannot read", p.display()))?
        }
        Source::Gguf(g) => {
            if g.get_str_array("tokenizer.ggml.tokens").is_none() {
                return Ok(None);
            }
            let doc = strata_formats::gguf::tokenizer::tokenizer_json(g)?;
            serde_json::to_vec(&doc)?
        }
        Source::Strata(_) => bail!("{}: already a converted model", src_path.display()),
    };
    let tok = strata_runtime::engine::load_tokenizer(src_path)
        .with_context(|| format!("{}: cannot load the tokenizer", src_path.display()))?;
    let m = tok.meta();
    let meta = json!({
        "bos_id": m.bos_id,
        "eos_ids": m.eos_ids,
        "add_bos": m.add_bos,
        "chat_template": m.chat_template,
    });
    Ok(Some((json, meta)))
}

pub fn run(args: ConvertArgs) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let src_path = args.model.dir()?;
    let (out, created) = out_file(&args.out)?;
    let done = convert(&args, &src_path, &out, t0);
    if done.is_err() && created {
        // The file itself is never left half-written; drop the directory made for it.
        let _ = std::fs::remove_dir(&args.out);
    }
    done
}

fn convert(args: &ConvertArgs, src_path: &Path, out: &Path, t0: Instant) -> anyhow::Result<()> {
    let opts = args.model.load_options();
    let (config, src) = strata_model::model::open(src_path)?;
    let tok = tokenizer(src_path, &src)?;
    let name = src_path.file_name().unwrap_or(src_path.as_os_str());
    let mut progress = Progress::new(
        format!("converting {}", name.to_string_lossy()),
        config.n_layers() as u64,
        "layers",
    );
    let (_model, recording) =
        Model::convert_with_progress(config.clone(), &src, opts, &mut |done, _| {
            progress.set(done as u64, "")
        })?;
    drop(progress);
    let mut metadata = json!({
        "source": src_path.display().to_string(),
        "strata_version": env!("CARGO_PKG_VERSION"),
    });
    let mut blobs: Vec<(&str, &[u8])> = Vec::new();
    if let Some((json, meta)) = &tok {
        blobs.push(("tokenizer.json", json));
        metadata["tokenizer"] = meta.clone();
    } else {
        eprintln!(
            "note: {} has no tokenizer; the converted model runs from token ids only",
            src_path.display()
        );
    }
    write_converted(out, &config, opts, &recording, &blobs, metadata)?;
    let size = std::fs::metadata(out)
        .with_context(|| format!("{}: cannot stat", out.display()))?
        .len();
    outln!(
        "wrote {} ({} entries, {:.1} MiB, experts {}) in {:.2} s",
        out.display(),
        recording.len(),
        size as f64 / (1u64 << 20) as f64,
        opts.experts.name(),
        t0.elapsed().as_secs_f64()
    )?;
    Ok(())
}
