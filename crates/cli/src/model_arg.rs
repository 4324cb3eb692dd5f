//! The `--model` and `--dtype` options shared by the subcommands.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use strata_kernels::PackedFormat;
use strata_model::{LoadOptions, Precision};

/// The model that ships with the repository: `strata-tiny-moe`, a 24M-parameter Qwen3-MoE
/// trained on ShareGPT text (see its README). Found relative to the source tree.
pub const DEFAULT_MODEL: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/strata-tiny-moe");

/// Options naming the model and its numeric mode.
#[derive(Debug, Args)]
pub struct ModelArgs {
    /// Model: a Hugging Face model directory (config.json, *.safetensors, tokenizer.json),
    /// a .gguf file, or a hub id (`org/name`, cached under HF_HOME).
    /// Defaults to the strata-tiny-moe model shipped in the repository.
    #[arg(long, short = 'm', value_name = "PATH")]
    pub model: Option<PathBuf>,
    /// Numeric mode: `fast` (BF16 weights, f32 activations) or `f32` (everything in f32,
    /// the reference path).
    #[arg(long, value_enum, default_value_t = DType::Fast)]
    pub dtype: DType,
    /// Packed format of the routed experts on the fast path: `bf16`, `int8` (one scale per
    /// row), or `int4` (one scale per 32 values).
    #[arg(long, value_enum, default_value_t = Weights::Bf16)]
    pub weights: Weights,
    /// Where the model runs: `cpu`, or `gpu` (the whole model on the first accelerator,
    /// weights in the checkpoint's own precision; `--dtype` and `--weights` do not apply).
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    pub device: Device,
    /// Accelerator memory the model may use (`8G`, `512M`, bytes); default: no limit.
    #[arg(long, value_name = "BYTES")]
    pub vram_budget: Option<String>,
}

/// Values of `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Device {
    /// The CPU kernels.
    Cpu,
    /// The first accelerator (`strata devices` lists them).
    Gpu,
}

/// Values of `--weights`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Weights {
    /// BF16 experts.
    Bf16,
    /// INT8 experts, per-row scales, activations quantized per token.
    Int8,
    /// INT4 experts, per-32 group scales.
    Int4,
}

/// Values of `--dtype`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum DType {
    /// BF16 weights where the checkpoint allows, f32 activations.
    Fast,
    /// Everything in f32.
    F32,
}

impl ModelArgs {
    /// The model: a directory or `.gguf` file, checked to exist, or a hub id (`org/name`)
    /// found in the Hugging Face cache or downloaded into it.
    pub fn dir(&self) -> anyhow::Result<PathBuf> {
        let dir = self
            .model
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_MODEL));
        if !dir.exists() {
            let s = dir.to_string_lossy();
            if crate::hub::looks_like_hub_id(&s) {
                return crate::hub::fetch(&s);
            }
            bail!("{}: no such model directory or file", dir.display());
        }
        if dir.is_dir() && !dir.join("config.json").exists() {
            bail!(
                "{}: not a Hugging Face model directory (no config.json)",
                dir.display()
            );
        }
        if dir.is_file()
            && !dir
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
        {
            bail!(
                "{}: expected a model directory or a .gguf file",
                dir.display()
            );
        }
        dir.canonicalize()
            .with_context(|| format!("{}: cannot resolve path", dir.display()))
    }

    /// Loads the model onto the accelerator (`--device gpu`).
    pub fn gpu_model(&self, dir: &std::path::Path) -> anyhow::Result<strata_accel::GpuModel> {
        let budget = self
            .vram_budget
            .as_deref()
            .map(strata_accel::parse_bytes)
            .transpose()?;
        let dev = strata_accel::open(&strata_accel::DeviceOptions {
            vram_budget: budget,
            ..Default::default()
        })?;
        Ok(strata_accel::GpuModel::load(dev, dir)?)
    }

    /// How to load the weights.
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            precision: match self.dtype {
                DType::Fast => Precision::Fast,
                DType::F32 => Precision::F32,
            },
            experts: match self.weights {
                Weights::Bf16 => PackedFormat::Bf16,
                Weights::Int8 => PackedFormat::Int8 { group: None },
                Weights::Int4 => PackedFormat::Int4 { group: 32 },
            },
        }
    }
}
