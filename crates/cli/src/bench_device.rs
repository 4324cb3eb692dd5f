//! `strata bench device`: the accelerator's kernels on a GGUF's blocks, against the device's
//! own limits measured in the same run.
//!
//! Limits: the copy bandwidth (a buffer-to-buffer copy, bytes read plus bytes written per
//! second, as copy bandwidths are quoted), the streaming bandwidth of a compute kernel
//! (`x += y`, two reads and a write per value), the upload bandwidth from host memory, and the
//! arithmetic peak of fused multiply-adds in f32 and f16 ([`Op::FmaPeak`]). Kernels: the
//! quantized matrix product ([`Op::Matmul`], 1, 8 and 512 rows) at Qwen3-30B-A3B's projection
//! shapes, as weight bytes read per second against the copy and streaming bandwidths; the
//! grouped expert
//! kernel ([`Op::ExpertFfn`], both stages) at T tokens routed uniformly over a layer's
//! experts, as TFLOPS (`6 P H I` for P token-expert pairs) against the f16 peak and expert
//! bytes read per second.
//!
//! A kernel's time is the device's, from the return of the submission to completion of a
//! batch of launches; the host's time per launch (recording, then the submission call, where
//! wgpu encodes the commands for the driver) is shown beside it. Batches grow until the
//! device's part takes `--min-seconds`. Weights come from
//! device memory, not its cache: each matrix has enough copies to span 256 MiB, launches
//! rotate through them, and expert launches at few tokens rotate the routing over the
//! layer's experts. Results are read back and must be finite.

use std::time::Instant;

use anyhow::{Context, ensure};
use clap::Args;
use serde_json::{Value, json};
use strata_accel::{Buffer, Device, DeviceOptions, ExpertFormat, ExpertSlots, Op, WeightType};
use strata_kernels::ggml::{GgmlType, random_blocks};

use crate::bench::Lcg;

/// Arguments of `strata bench device`.
#[derive(Debug, Clone, Args)]
pub struct BenchDeviceArgs {
    /// Hidden size H (default: Qwen3-30B-A3B).
    #[arg(long, default_value_t = 2048)]
    pub hidden: usize,
    /// Width of the attention's query projection (heads x head size).
    #[arg(long, default_value_t = 4096)]
    pub q_dim: usize,
    /// Vocabulary (rows of the LM head).
    #[arg(long, default_value_t = 151_936)]
    pub vocab: usize,
    /// Intermediate size I of one expert.
    #[arg(long, default_value_t = 768)]
    pub inter: usize,
    /// Routed experts per layer.
    #[arg(long, default_value_t = 128)]
    pub experts: usize,
    /// Experts per token.
    #[arg(long, default_value_t = 8)]
    pub topk: usize,
    /// Weight types, as a GGUF names them (q4_k, q8_0, q6_k, q5_k, q5_0, q4_0, iq4_xs),
    /// int8 and int4 (a converted model's packed integers), or bf16, f16 and f32.
    #[arg(long, value_delimiter = ',', default_value = "q4_k,q8_0")]
    pub formats: Vec<String>,
    /// Token counts of the grouped expert kernel.
    #[arg(long, value_delimiter = ',', default_value = "1,64,512")]
    pub tokens: Vec<usize>,
    /// Minimum timed seconds per point.
    #[arg(long, default_value_t = 0.2)]
    pub min_seconds: f64,
    /// Device index (`strata devices`).
    #[arg(long, default_value_t = 0)]
    pub device_index: usize,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Run prefill's token counts through the row kernels too, not the tiled ones (to
    /// compare the two).
    #[arg(long)]
    pub no_tiles: bool,
}

/// Bytes each rotated set of weight copies spans (at most 64 copies): far past any GPU's
/// last-level cache.
const ROTATION_BYTES: u64 = 256 << 20;

/// Seconds per launch: recording on the host, the submission call (where wgpu encodes the
/// recorded commands for the driver), and the device's run after it.
#[derive(Debug, Clone, Copy)]
struct LaunchTime {
    record: f64,
    submit: f64,
    device: f64,
}

/// Times what `record` enqueues: batches of launches, doubled until the device's part of a
/// batch takes `min_seconds` (at most 4096 launches).
fn time_launches(
    dev: &dyn Device,
    min_seconds: f64,
    mut record: impl FnMut(usize) -> anyhow::Result<()>,
) -> anyhow::Result<LaunchTime> {
    record(0)?;
    dev.synchronize()?;
    let mut reps = 1usize;
    loop {
        let start = Instant::now();
        for i in 0..reps {
            record(i + 1)?;
        }
        let recorded = Instant::now();
        let done = dev.submit()?;
        let submitted = Instant::now();
        dev.wait(&done)?;
        let finished = Instant::now();
        let device = (finished - submitted).as_secs_f64();
        if device >= min_seconds || reps >= 4096 {
            let per = |d: std::time::Duration| d.as_secs_f64() / reps as f64;
            return Ok(LaunchTime {
                record: per(recorded - start),
                submit: per(submitted - recorded),
                device: device / reps as f64,
            });
        }
        let want = (min_seconds / device.max(1e-7) * reps as f64 * 1.2).ceil() as usize;
        reps = want.max(reps * 2).min(4096);
    }
}

/// The f32 values of `buf`'s first `n` floats; fails unless all are finite.
fn finite(dev: &dyn Device, buf: &Buffer, n: usize, what: &str) -> anyhow::Result<()> {
    let bytes = dev.download(buf, 0, n as u64 * 4)?;
    let bad = bytes
        .chunks_exact(4)
        .filter(|b| !f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite())
        .count();
    ensure!(bad == 0, "{what}: {bad} of {n} outputs are not finite");
    Ok(())
}

/// `rows` rows of `k` values of `wtype`: 16 rows of random valid blocks, repeated (the
/// kernels' speed does not depend on the values, and generating every row would dominate
/// the run).
fn weight_bytes(
    wtype: WeightType,
    rows: usize,
    k: usize,
    seed: &mut u64,
) -> anyhow::Result<Vec<u8>> {
    let sample_rows = rows.min(16);
    let sample = match GgmlType::ALL
        .into_iter()
        .find(|g| wtype.is_ggml() && g.name().eq_ignore_ascii_case(wtype.name()))
    {
        Some(ggml) => random_blocks(ggml, sample_rows * k / wtype.block().0, seed),
        None if !wtype.is_quantized() => {
            // Floats (a checkpoint's BF16, types widened to F16 on upload): small values.
            let mut rng = Lcg(*seed);
            *seed = seed.wrapping_add(1);
            wtype.encode(&rng.vec(sample_rows * k, 0.1))?
        }
        None => {
            // A converted model's packed integers: random values, a scale per row or per 32.
            let q: Vec<i8> = random_blocks(GgmlType::Q8_0, sample_rows * k / 32, seed)
                .chunks_exact(34)
                .flat_map(|b| b[2..].iter().map(|&v| v as i8 >> 4))
                .collect();
            let scales = vec![1e-2f32; sample_rows * k / 32];
            let scales = match wtype {
                WeightType::Int8 => &scales[..sample_rows],
                _ => &scales[..],
            };
            wtype.encode_int_rows(&q, scales, k)?
        }
    };
    let row = wtype.row_bytes(k) as usize;
    Ok((0..rows)
        .flat_map(|r| &sample[(r % sample_rows) * row..][..row])
        .copied()
        .collect())
}

/// A buffer holding `data` (split at `granule` bytes past the binding limit).
fn upload(dev: &dyn Device, data: &[u8], granule: u64, label: &str) -> anyhow::Result<Buffer> {
    let buf = dev.alloc(data.len() as u64, granule, label)?;
    dev.wait(&dev.upload(&buf, 0, data)?)?;
    Ok(buf)
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn u32_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The device's limits: copy, streaming and upload bandwidth (bytes per second) and FMA
/// peaks (FLOPS).
struct Limits {
    copy: f64,
    /// A compute kernel's streaming bandwidth (`x += y` over 96 MiB each: two reads and a
    /// write per value), the ceiling the weight kernels are compared with: on an H200 the
    /// copy command moved 847 GB/s where HBM moves several TB/s.
    stream: f64,
    upload: f64,
    /// One expert's upload, as a cache miss makes it (warm, 2.65 MB).
    expert_upload: f64,
    /// Seconds of one host round trip of 8 KiB.
    round_trip: f64,
    f32_flops: f64,
    f16_flops: Option<f64>,
}

fn measure_limits(dev: &dyn Device, min_seconds: f64) -> anyhow::Result<Limits> {
    let len = 256u64 << 20;
    let (src, dst) = (
        dev.alloc(len, 4, "copy src")?,
        dev.alloc(len, 4, "copy dst")?,
    );
    let copy_s = time_launches(dev, min_seconds, |_| Ok(dev.copy(&src, 0, &dst, 0, len)?))?.device;
    // Each operand in one binding (lavapipe's limit is 128 MiB), together far past any
    // GPU's last-level cache.
    let stream_len = 96u64 << 20;
    let (x, y) = (
        dev.alloc(stream_len, 0, "stream x")?,
        dev.alloc(stream_len, 0, "stream y")?,
    );
    let add = Op::Add {
        x: &x,
        y: &y,
        gate: None,
        n: (stream_len / 4) as u32,
        dim: 1,
    };
    let stream_s = time_launches(dev, min_seconds, |_| Ok(dev.enqueue(&add)?))?.device;
    let host = vec![1u8; len as usize];
    let start = Instant::now();
    dev.wait(&dev.upload(&dst, 0, &host)?)?;
    let upload_s = start.elapsed().as_secs_f64();
    // What an expert cache miss moves: one Qwen3-30B-A3B expert in Q4_K (three 768 x 2,048
    // matrices of 144-byte blocks per 256 values), through the staging belt, warm: the best
    // of eight. (The 256 MiB upload above is a first one: its staging memory is new.)
    const EXPERT_BYTES: usize = 3 * 768 * 8 * 144;
    let expert = vec![1u8; EXPERT_BYTES];
    let mut expert_s = f64::MAX;
    for i in 0..8u64 {
        let start = Instant::now();
        dev.wait(&dev.upload(&dst, (i % 4) * EXPERT_BYTES as u64, &expert)?)?;
        expert_s = expert_s.min(start.elapsed().as_secs_f64());
    }
    // A host round trip as the hybrid layout makes one per MoE layer: an empty submission's
    // worth of work, then 8 KiB read back (a decoded token's routing and router input),
    // warm, the median of 101.
    let mut trips: Vec<f64> = (0..101)
        .map(|_| {
            let start = Instant::now();
            dev.download(&src, 0, 8 << 10)?;
            Ok(start.elapsed().as_secs_f64())
        })
        .collect::<anyhow::Result<_>>()?;
    trips.sort_by(f64::total_cmp);
    let round_trip = trips[trips.len() / 2];
    let workgroups = 65_535u32;
    let out = dev.alloc(workgroups as u64 * 64 * 4, 0, "fma peak")?;
    let peak = |half: bool| -> anyhow::Result<f64> {
        // Rounds per invocation grow until one launch takes a few milliseconds, so launch
        // overhead does not count (lavapipe gets there at the first size).
        let mut iters = 8u32;
        loop {
            let op = Op::FmaPeak {
                out: &out,
                workgroups,
                iters,
                half,
            };
            let s = time_launches(dev, 0.0, |_| Ok(dev.enqueue(&op)?))?.device;
            if s > 5e-3 || iters >= 1 << 16 {
                let s = time_launches(dev, min_seconds, |_| Ok(dev.enqueue(&op)?))?.device;
                finite(dev, &out, 64, "fma peak")?;
                return Ok(workgroups as f64 * 64.0 * 128.0 * iters as f64 / s);
            }
            iters *= 4;
        }
    };
    let f32_flops = peak(false)?;
    let f16_flops = if dev.info().shader_f16 {
        Some(peak(true)?)
    } else {
        None
    };
    Ok(Limits {
        copy: 2.0 * len as f64 / copy_s,
        stream: 3.0 * stream_len as f64 / stream_s,
        upload: len as f64 / upload_s,
        expert_upload: EXPERT_BYTES as f64 / expert_s,
        round_trip,
        f32_flops,
        f16_flops,
    })
}

/// One timed point.
struct Point {
    kernel: String,
    wtype: WeightType,
    shape: String,
    time: LaunchTime,
    /// Weight bytes read per launch.
    bytes: f64,
    flops: f64,
}

/// `Op::Matmul` of `m` rows over a `[n, k]` weight of `wtype`.
fn time_matmul(
    dev: &dyn Device,
    args: &BenchDeviceArgs,
    wtype: WeightType,
    (name, n, k): (&str, usize, usize),
    rng: &mut Lcg,
) -> anyhow::Result<Vec<Point>> {
    let bytes = wtype.bytes(n * k);
    let data = weight_bytes(wtype, n, k, &mut rng.0)?;
    let copies = ROTATION_BYTES.div_ceil(bytes).clamp(1, 64) as usize;
    let weights: Vec<Buffer> = (0..copies)
        .map(|_| upload(dev, &data, wtype.row_granule(k), name))
        .collect::<anyhow::Result<_>>()?;
    // Prefill's 512 tokens where a prompt runs them (the LM head sees one token).
    let tokens: &[usize] = if name == "output" {
        &[1, 8]
    } else {
        &[1, 8, 512]
    };
    let mut points = Vec::new();
    for &m in tokens {
        let x = upload(dev, &f32_bytes(&rng.vec(m * k, 2.0)), 0, "x")?;
        let out = dev.alloc((m * n * 4) as u64, 4, "out")?;
        let time = time_launches(dev, args.min_seconds, |i| {
            Ok(dev.enqueue(&Op::Matmul {
                x: &x,
                w: &weights[i % copies],
                wtype,
                bias: None,
                out: &out,
                m: m as u32,
                n: n as u32,
                k: k as u32,
            })?)
        })?;
        finite(dev, &out, m * n.min(4096), name)?;
        points.push(Point {
            kernel: format!("matmul {name}"),
            wtype,
            shape: format!("{m}x{k} . [{n},{k}]"),
            time,
            bytes: bytes as f64,
            flops: 2.0 * (m * n * k) as f64,
        });
    }
    Ok(points)
}

/// Both stages of `Op::ExpertFfn` at each token count, every expert in `wtype`.
fn time_experts(
    dev: &dyn Device,
    args: &BenchDeviceArgs,
    wtype: WeightType,
    rng: &mut Lcg,
) -> anyhow::Result<Vec<Point>> {
    let (h, inter, n_exp, topk) = (args.hidden, args.inter, args.experts, args.topk);
    let format = ExpertFormat::uniform(wtype);
    let slots = ExpertSlots::new(dev, n_exp as u32, h as u32, inter as u32, &[format])?;
    let (g, u) = (
        weight_bytes(wtype, inter, h, &mut rng.0)?,
        weight_bytes(wtype, inter, h, &mut rng.0)?,
    );
    let d = weight_bytes(wtype, h, inter, &mut rng.0)?;
    for s in 0..n_exp {
        slots.refill_parts(dev, s as u32, format, [&g, &u, &d])?;
    }
    dev.synchronize()?;
    let expert_bytes = format.bytes(h as u32, inter as u32) as f64;
    let mut points = Vec::new();
    for &tokens in &args.tokens {
        let n_pairs = tokens * topk;
        // Token t's j-th expert is (t * topk + j + offset) % experts: every expert gets the
        // same share; successive launches move the offset so few tokens touch new experts.
        let rotations = if n_pairs >= n_exp {
            1
        } else {
            n_exp.div_ceil(n_pairs)
        };
        let pair_sets: Vec<Buffer> = (0..rotations)
            .map(|r| {
                let mut pairs: Vec<(u32, u32)> = (0..n_pairs)
                    .map(|p| ((p / topk) as u32, ((p + r * n_pairs) % n_exp) as u32))
                    .collect();
                pairs.sort_by_key(|&(_, e)| e);
                let flat: Vec<u32> = pairs.iter().flat_map(|&(t, e)| [t, e]).collect();
                upload(dev, &u32_bytes(&flat), 0, "pairs")
            })
            .collect::<anyhow::Result<_>>()?;
        let x = upload(dev, &f32_bytes(&rng.vec(tokens * h, 2.0)), 0, "x")?;
        let act = dev.alloc((n_pairs * inter * 4) as u64, 0, "act")?;
        let y = dev.alloc((n_pairs * h * 4) as u64, 0, "y")?;
        let time = time_launches(dev, args.min_seconds, |i| {
            for (stage, input, out) in [(0, &x, &act), (1, &act, &y)] {
                dev.enqueue(&Op::ExpertFfn {
                    x: input,
                    slots: &slots,
                    format,
                    pairs: &pair_sets[i % rotations],
                    out,
                    n_pairs: n_pairs as u32,
                    experts: n_pairs.min(n_exp) as u32,
                    stage,
                })?;
            }
            Ok(())
        })?;
        finite(dev, &y, n_pairs * h, "expert_ffn")?;
        points.push(Point {
            kernel: "expert_ffn".into(),
            wtype,
            shape: format!("T={tokens}, {n_pairs} pairs over {n_exp} experts of {h}x{inter}"),
            time,
            bytes: n_pairs.min(n_exp) as f64 * expert_bytes,
            flops: 6.0 * (n_pairs * h * inter) as f64,
        });
    }
    Ok(points)
}

pub fn run(args: BenchDeviceArgs) -> anyhow::Result<()> {
    let dev = strata_accel::open(&DeviceOptions {
        index: args.device_index,
        no_tiles: args.no_tiles,
        ..Default::default()
    })
    .context("opening the accelerator")?;
    let dev = &*dev;
    let wtypes: Vec<WeightType> = args
        .formats
        .iter()
        .map(|f| {
            let other = WeightType::ALL
                .into_iter()
                .find(|t| !t.is_ggml() && t.name() == f);
            WeightType::from_ggml_name(f)
                .or(other)
                .with_context(|| format!("--formats: `{f}` is not a type the device reads"))
        })
        .collect::<anyhow::Result<_>>()?;
    let limits = measure_limits(dev, args.min_seconds)?;
    let mut rng = Lcg(0x9e37_79b9_7f4a_7c15);
    let shapes = [
        ("attn_q", args.q_dim, args.hidden),
        ("attn_output", args.hidden, args.q_dim),
        ("output", args.vocab, args.hidden),
    ];
    let mut points = Vec::new();
    for &wtype in &wtypes {
        for shape in shapes {
            points.extend(time_matmul(dev, &args, wtype, shape, &mut rng)?);
        }
        points.extend(time_experts(dev, &args, wtype, &mut rng)?);
    }
    let info = dev.info();
    if args.json {
        let rows: Vec<Value> = points
            .iter()
            .map(|p| {
                json!({
                    "kernel": p.kernel, "type": p.wtype.name(), "shape": p.shape,
                    "us": p.time.device * 1e6, "record_us": p.time.record * 1e6,
                    "submit_us": p.time.submit * 1e6,
                    "weight_gbps": p.bytes / p.time.device / 1e9,
                    "of_copy_bw": p.bytes / p.time.device / limits.copy,
                    "of_stream_bw": p.bytes / p.time.device / limits.stream,
                    "tflops": p.flops / p.time.device / 1e12,
                    "of_f16_peak": limits.f16_flops.map(|f| p.flops / p.time.device / f),
                })
            })
            .collect();
        let doc = json!({
            "device": info.name, "backend": info.backend, "driver": info.driver,
            "subgroups": info.subgroups, "shader_f16": info.shader_f16,
            "tiles": !args.no_tiles,
            "copy_gbps": limits.copy / 1e9, "stream_gbps": limits.stream / 1e9,
            "upload_gbps": limits.upload / 1e9,
            "expert_upload_gbps": limits.expert_upload / 1e9,
            "round_trip_us": limits.round_trip * 1e6,
            "f32_tflops": limits.f32_flops / 1e12,
            "f16_tflops": limits.f16_flops.map(|f| f / 1e12),
            "points": rows,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!(
        "device: {} ({}, {}){}",
        info.name,
        info.backend,
        info.driver,
        if args.no_tiles {
            ", row kernels only (--no-tiles)"
        } else {
            ""
        }
    );
    println!(
        "limits: copy {:.0} GB/s (read + write), stream {:.0} GB/s (a kernel's x += y), upload {:.1} GB/s (256 MiB, the first) and {:.1} GB/s (an expert's 2.65 MB, warm), a host round trip of 8 KiB {:.0} us, FMA f32 {:.1} TFLOPS, f16 {}",
        limits.copy / 1e9,
        limits.stream / 1e9,
        limits.upload / 1e9,
        limits.expert_upload / 1e9,
        limits.round_trip * 1e6,
        limits.f32_flops / 1e12,
        limits
            .f16_flops
            .map_or("n/a".into(), |f| format!("{:.1} TFLOPS", f / 1e12)),
    );
    println!(
        "| kernel | type | shape | device us | host us (record + submit) | weights GB/s (of copy, of stream) | TFLOPS (of f16 peak) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for p in &points {
        let gbps = p.bytes / p.time.device;
        let flops = p.flops / p.time.device;
        let of_peak = limits
            .f16_flops
            .map_or(String::new(), |f| format!(" ({:.1}%)", 100.0 * flops / f));
        println!(
            "| {} | {} | {} | {:.1} | {:.1} + {:.1} | {:.1} ({:.1}%, {:.1}%) | {:.3}{of_peak} |",
            p.kernel,
            p.wtype.name(),
            p.shape,
            p.time.device * 1e6,
            p.time.record * 1e6,
            p.time.submit * 1e6,
            gbps / 1e9,
            100.0 * gbps / limits.copy,
            100.0 * gbps / limits.stream,
            flops / 1e12,
        );
    }
    Ok(())
}
