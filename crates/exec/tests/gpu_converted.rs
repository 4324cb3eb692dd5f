//! Converted models (`strata convert`) on the accelerator: every fixture converted on the
//! f32 path runs on the device within 1e-3 x max|ref| of the CPU f32 path on its source;
//! converted with packed BF16, int8 or int4 experts, within a looser bound of the CPU
//! running the same file (the CPU rounds activations to BF16 or quantizes them per token,
//! the device keeps them f32), and measurably apart from the unquantized source, so the
//! device is shown to read the file's packed weights.

mod common;

use std::path::{Path, PathBuf};

use common::default_gpu;
use serde_json::json;
use strata_accel::{Device, ExpertFormat, ExpertSlots, Op, WeightType};
use strata_exec::{GpuModel, HostExperts};
use strata_kernels::PackedFormat;
use strata_model::config::{FfnConfig, ModelConfig};
use strata_model::linear::write_converted;
use strata_model::model::open;
use strata_model::names::{self, ExpertLayout, ExpertPart, LayerNames};
use strata_model::source::Source;
use strata_model::{LoadOptions, LogitsWanted, Model, Precision, SeqInput};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

/// A Qwen3-MoE GGUF whose rows are whole blocks of 32 (hidden and expert width 256): its
/// experts converted to packed integers are stored as such on the device; the fixtures'
/// widths of 18-40 are not, and run widened to f32.
const WIDE: &str = "../fixtures-gguf/qwen3_moe_k.q8_0.gguf";

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-accel-converted-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name.replace(['/', '.'], "_"))
}

fn convert(src: &Path, opts: LoadOptions, out: &Path) {
    let (config, source) = open(src).unwrap();
    let (_, rec) = Model::convert(config.clone(), &source, opts).unwrap();
    write_converted(out, &config, opts, &rec, &[], json!({})).unwrap();
}

fn tokens(vocab: usize) -> Vec<u32> {
    (0..9u32).map(|i| (i * 37 + 3) % vocab as u32).collect()
}

fn cpu_logits(model: &Model, tokens: &[u32]) -> Vec<f32> {
    let mut cache = model.new_cache();
    let mut seqs = [SeqInput {
        tokens,
        cache: &mut cache,
        logits: LogitsWanted::All,
    }];
    model.forward(&mut seqs).unwrap().remove(0)
}

/// Prefill all but the last two tokens, then decode them one at a time.
fn gpu_logits(gpu: &GpuModel, tokens: &[u32]) -> Vec<f32> {
    let mut cache = gpu.new_cache(tokens.len()).unwrap();
    let split = tokens.len() - 2;
    let mut got = gpu.forward(&tokens[..split], &mut cache).unwrap();
    for t in &tokens[split..] {
        got.extend(gpu.forward(std::slice::from_ref(t), &mut cache).unwrap());
    }
    got
}

fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let max_ref = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    got.iter()
        .zip(want)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()))
        / max_ref
}

/// Converts `name` with `opts`; returns (device vs CPU on the file, device on the file vs
/// CPU f32 on the source).
fn errors(name: &str, opts: LoadOptions, tag: &str) -> Option<(f32, f32)> {
    let dev = default_gpu()?;
    let src = fixture(name);
    let out = tmp(&format!("{name}-{tag}.strata"));
    convert(&src, opts, &out);
    let cpu_file = Model::load(&out, opts).unwrap();
    let cpu_src = Model::load(&src, Precision::F32).unwrap();
    let gpu = GpuModel::load(dev, &out).unwrap_or_else(|e| panic!("{name} {tag}: {e}"));
    let toks = tokens(gpu.config.vocab_size);
    let got = gpu_logits(&gpu, &toks);
    let e_file = rel_err(&got, &cpu_logits(&cpu_file, &toks));
    let e_src = rel_err(&got, &cpu_logits(&cpu_src, &toks));
    println!("{name} {tag}: vs CPU on the file {e_file:.2e}, vs f32 source {e_src:.2e}");
    std::fs::remove_file(&out).unwrap();
    Some((e_file, e_src))
}

fn f32_path(name: &str) {
    let Some((e_file, e_src)) = errors(name, Precision::F32.into(), "f32") else {
        return;
    };
    assert!(e_file <= 1e-3, "{name}: {e_file:.2e} > 1e-3");
    assert!(e_src <= 1e-3, "{name}: {e_src:.2e} > 1e-3");
}

fn packed(name: &str, experts: PackedFormat, bound: f32) {
    let opts = LoadOptions {
        precision: Precision::Fast,
        experts,
        keep_blocks: false,
    };
    let Some((e_file, e_src)) = errors(name, opts, &experts.name()) else {
        return;
    };
    assert!(e_file <= bound, "{name}: {e_file:.2e} > {bound:.0e}");
    // Quantized experts move the logits: the device must not have read other weights.
    if experts != PackedFormat::Bf16 {
        assert!(
            e_src > 1e-4,
            "{name}: {e_src:.2e}, quantization not visible"
        );
    }
}

macro_rules! f32_fixtures {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            f32_path(stringify!($name));
        }
    )*};
}

f32_fixtures!(
    llama,
    qwen2,
    qwen2_moe,
    qwen3_moe,
    qwen3_moe_bf16,
    qwen3_moe_stacked,
    mixtral,
    glm4_moe,
    deepseek_v2,
    deepseek_v3,
    deepseek_v3_fp8
);

#[test]
fn packed_bf16_experts() {
    for name in ["qwen3_moe_bf16", "qwen2_moe"] {
        packed(name, PackedFormat::Bf16, 1e-2);
    }
}

#[test]
fn packed_int8_experts() {
    for name in ["qwen3_moe", "mixtral", "deepseek_v3"] {
        packed(name, PackedFormat::Int8 { group: None }, 1e-2);
    }
    // Stored as integers on the device. This fixture's routing is near ties (it was made to
    // tell quantizers apart), so the CPU's activations quantized per token move it further.
    packed(WIDE, PackedFormat::Int8 { group: None }, 5e-2);
}

#[test]
fn packed_int4_experts() {
    for name in ["qwen3_moe_stacked", "glm4_moe"] {
        packed(name, PackedFormat::Int4 { group: 32 }, 1e-2);
    }
    packed(WIDE, PackedFormat::Int4 { group: 32 }, 5e-2);
}

/// A converted model's packed INT8 (a scale per row) and INT4 (a scale per 32) experts take
/// their file's bytes on the device, within 2%: the kernels read the integers, they are not
/// widened to floats there.
#[test]
fn packed_integer_experts_take_their_file_bytes_on_the_device() {
    if default_gpu().is_none() {
        return;
    }
    for experts in [
        PackedFormat::Int8 { group: None },
        PackedFormat::Int4 { group: 32 },
    ] {
        let opts = LoadOptions {
            precision: Precision::Fast,
            experts,
            keep_blocks: false,
        };
        let out = tmp(&format!("wide-{}-bytes.strata", experts.name()));
        convert(&fixture(WIDE), opts, &out);
        let (config, src) = open(&out).unwrap();
        let mut file = 0u64;
        let mut n = 0u64;
        for (i, ffn) in config.layers.iter().enumerate() {
            let FfnConfig::Moe(moe) = ffn else { continue };
            let ExpertLayout::Converted { prefix } =
                LayerNames::new(i).moe(&src, moe.shared.as_ref()).experts
            else {
                panic!("layer {i}'s experts are not converted");
            };
            for e in 0..moe.router.n_experts {
                for part in [ExpertPart::GateUp, ExpertPart::Down] {
                    let t = src
                        .tensor(&names::converted_expert(&prefix, e, part))
                        .unwrap();
                    file += t.stored_packed().unwrap().unwrap().bytes() as u64;
                }
                n += 1;
            }
        }
        let host = HostExperts::open(&out).unwrap();
        let format = host.format(0).unwrap();
        assert_eq!(
            format,
            ExpertFormat::uniform(match experts {
                PackedFormat::Int8 { .. } => WeightType::Int8,
                _ => WeightType::Int4,
            })
        );
        let on_device = n * host.slot_bytes();
        let ratio = on_device as f64 / file as f64;
        println!(
            "{}: routed experts {on_device} bytes on the device, {file} in the file \
             ({ratio:.4}x)",
            experts.name()
        );
        assert!((ratio - 1.0).abs() <= 0.02, "{ratio:.4}x the file's bytes");
        experts_equal_their_values(&host, &src, &config, &out);
        std::fs::remove_file(&out).unwrap();
    }
}

/// Each expert of the first MoE layer, as the device stores it (`HostExperts`: integers
/// laid out by rows, gate and up split from their fused strips), computes on the device what
/// its dequantized values compute on the CPU in f32.
fn experts_equal_their_values(host: &HostExperts, src: &Source, config: &ModelConfig, out: &Path) {
    let dev = default_gpu().unwrap();
    let (h, inter) = (host.hidden(), host.inter());
    let format = host.format(0).unwrap();
    let slots = ExpertSlots::new(&*dev, 1, h as u32, inter as u32, &[format]).unwrap();
    let layer = config
        .layers
        .iter()
        .position(|l| matches!(l, FfnConfig::Moe(_)))
        .unwrap();
    let prefix = format!("model.layers.{layer}.mlp.experts");
    let x: Vec<f32> = (0..3 * h)
        .map(|i| ((i * 7919) % 201) as f32 / 100.0 - 1.0)
        .collect();
    let pairs: Vec<u32> = (0..3u32).flat_map(|r| [r, 0]).collect();
    let (xb, pb) = (upload(&*dev, &x), upload_u32(&*dev, &pairs));
    let act = dev.alloc((3 * inter * 4) as u64, 0, "act").unwrap();
    let y = dev.alloc((3 * h * 4) as u64, 0, "y").unwrap();
    for e in 0..host.n_experts() {
        slots
            .refill_bytes(&*dev, 0, &host.expert_bytes(0, e as u32).unwrap())
            .unwrap();
        for (stage, input, out) in [(0, &xb, &act), (1, &act, &y)] {
            dev.enqueue(&Op::ExpertFfn {
                x: input,
                slots: &slots,
                format,
                pairs: &pb,
                out,
                n_pairs: 3,
                experts: 1,
                stage,
            })
            .unwrap();
        }
        let got = f32s(&dev.download(&y, 0, (3 * h * 4) as u64).unwrap());
        // The reference: the file's packed matrices dequantized, the fused gate/up split by
        // its strips of 16 rows (row 32 b + c is gate row 16 b + c, 32 b + 16 + c up's).
        let values = |part| {
            let name = names::converted_expert(&prefix, e, part);
            src.tensor(&name)
                .unwrap()
                .stored_packed()
                .unwrap()
                .unwrap()
                .dequantize()
        };
        let (gu, d) = (values(ExpertPart::GateUp), values(ExpertPart::Down));
        let row = |i: usize, up: usize| &gu[(32 * (i / 16) + 16 * up + i % 16) * h..][..h];
        let g: Vec<f32> = (0..inter).flat_map(|i| row(i, 0).to_vec()).collect();
        let u: Vec<f32> = (0..inter).flat_map(|i| row(i, 1).to_vec()).collect();
        let mut want = Vec::new();
        for t in x.chunks_exact(h) {
            want.extend(expert_ref(t, &g, &u, &d, h, inter));
        }
        let e_rel = rel_err(&got, &want);
        assert!(
            e_rel < 1e-5,
            "{} expert {e} of {}: {e_rel:.2e}",
            format.gate_up.name(),
            out.display()
        );
    }
}

/// `down(silu(gate x) * up x)` of one expert on the CPU, in f32.
fn expert_ref(x: &[f32], g: &[f32], u: &[f32], d: &[f32], h: usize, i: usize) -> Vec<f32> {
    let dot = |w: &[f32], v: &[f32]| w.iter().zip(v).map(|(a, b)| a * b).sum::<f32>();
    let act: Vec<f32> = (0..i)
        .map(|r| {
            let (a, b) = (dot(&g[r * h..][..h], x), dot(&u[r * h..][..h], x));
            a / (1.0 + (-a).exp()) * b
        })
        .collect();
    (0..h).map(|c| dot(&d[c * i..][..i], &act)).collect()
}

fn upload(dev: &dyn Device, v: &[f32]) -> strata_accel::Buffer {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let b = dev.alloc(bytes.len() as u64, 0, "x").unwrap();
    dev.upload(&b, 0, &bytes).unwrap();
    b
}

fn upload_u32(dev: &dyn Device, v: &[u32]) -> strata_accel::Buffer {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let b = dev.alloc(bytes.len() as u64, 0, "pairs").unwrap();
    dev.upload(&b, 0, &bytes).unwrap();
    b
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}
