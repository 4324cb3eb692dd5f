//! `strata bench moe`: one MoE layer on the CPU kernels, against the machine's own limits.
//!
//! For each (format, token count) it times `fused_moe` with uniform routing (token `t`'s
//! `j`-th expert is `(t * topk + j + offset) % experts`, so every expert gets `tokens * topk /
//! experts` tokens), and reports seconds per call, achieved TFLOPS (`6 T k H I` per call) and
//! expert-weight bytes read per second. In the same run (before and after the timed points,
//! keeping the larger of each) it measures the AMX and AVX-512 compute peaks and the DRAM read
//! bandwidth and prints each figure as a fraction of its limit.
//!
//! Weights stay in DRAM: successive calls rotate the routing offset (decode touches the next
//! `topk` experts each call) and the layer (`--layers`), and one layer of the default shape
//! (1.2 GB in BF16) is far larger than any L3. Every expert has its own random weights by
//! default: with copies of a few experts (`--distinct`), a virtual machine whose host merges
//! identical pages served the copies from cache and decode read "faster than DRAM".
//! Accuracy is each format's relative RMS error against f32 math on the unquantized weights.

use std::time::Instant;

use anyhow::{Context, bail, ensure};
use clap::Args;
use serde_json::{Value, json};
use strata_kernels::gemm::matmul_f32;
use strata_kernels::ggml::{
    self, GgmlExperts, GgmlMatrix, GgmlType, fused_moe_ggml, has_fast_kernel,
};
use strata_kernels::moe::DEFAULT_AMX_MIN_TOKENS;
use strata_kernels::moe::group_by_expert;
use strata_kernels::{
    Expert, Isa, MoeExperts, MoeOptions, PackedFormat, fused_moe_with, num_threads, peak,
};

mod crossover;

/// Arguments of `strata bench moe`.
#[derive(Debug, Clone, Args)]
pub struct BenchMoeArgs {
    /// Hidden size H (default: Qwen3-30B-A3B).
    #[arg(long, default_value_t = 2048)]
    pub hidden: usize,
    /// Intermediate size I of one expert.
    #[arg(long, default_value_t = 768)]
    pub inter: usize,
    /// Routed experts per layer.
    #[arg(long, default_value_t = 128)]
    pub experts: usize,
    /// Experts per token.
    #[arg(long, default_value_t = 8)]
    pub topk: usize,
    /// Weight formats: packed bf16, int8 (per-row scales), int8g32/64/128, int4 (= int4g64),
    /// int4g32/64/128; or ggml blocks as a GGUF stores them (q4_0, q8_0, q4_k, q5_k, q6_k,
    /// iq4_xs, ...: random valid blocks, computed in place).
    #[arg(long, value_delimiter = ',', default_value = "bf16,int8,int4")]
    pub formats: Vec<String>,
    /// Token counts per call.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64,512,4096")]
    pub tokens: Vec<usize>,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Draw TFLOPS and GB/s against tokens per expert for each format, under the measured
    /// peaks (a roofline), into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<std::path::PathBuf>,
    /// Layers of experts to rotate through, so weights come from DRAM.
    #[arg(long, default_value_t = 1)]
    pub layers: usize,
    /// Minimum timed seconds per point (at least 3 calls after one warm-up call).
    #[arg(long, default_value_t = 1.0)]
    pub min_seconds: f64,
    /// Distinct random experts per layer (default: all); the rest are copies of them. Copies
    /// read faster than DRAM on some virtual machines (the host merges identical pages, so
    /// they share cache lines): keep the default for honest bandwidth figures.
    #[arg(long)]
    pub distinct: Option<usize>,
    /// Also time one expert along each path per tokens per expert, to find the crossovers:
    /// AMX against AVX-512 for packed formats; for GGUF formats the row-dot kernels against
    /// INT8 and BF16 tiles, beside the path taken by default.
    #[arg(long)]
    pub crossover: bool,
}

fn parse_format(s: &str) -> anyhow::Result<PackedFormat> {
    let group = |rest: &str| -> anyhow::Result<usize> {
        rest.parse()
            .with_context(|| format!("format {s:?}: group {rest:?} is not a number"))
    };
    Ok(match s.trim() {
        "bf16" => PackedFormat::Bf16,
        "int8" => PackedFormat::Int8 { group: None },
        "int4" => PackedFormat::Int4 { group: 64 },
        f if f.starts_with("int8g") => PackedFormat::Int8 {
            group: Some(group(&f[5..])?),
        },
        f if f.starts_with("int4g") => PackedFormat::Int4 {
            group: group(&f[5..])?,
        },
        f => bail!("unknown format {f:?}, expected bf16, int8, int8gN, int4 or int4gN"),
    })
}

/// A deterministic stream of values in [-0.5, 0.5).
pub(crate) struct Lcg(pub(crate) u64);

impl Lcg {
    pub(crate) fn vec(&mut self, len: usize, scale: f32) -> Vec<f32> {
        (0..len)
            .map(|_| {
                self.0 = self
                    .0
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (((self.0 >> 40) as f32 / (1u64 << 24) as f32) - 0.5) * scale
            })
            .collect()
    }
}

/// Unquantized weights of one expert.
struct F32Expert {
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
}

/// The machine's limits, measured at the start of the run.
struct Peaks {
    amx_bf16: Option<f64>,
    amx_int8: Option<f64>,
    avx512_bf16: Option<f64>,
    avx512_fma: Option<f64>,
    avx512_vnni: Option<f64>,
    avx_vnni: Option<f64>,
    avx2_int8: Option<f64>,
    avx2_fma: Option<f64>,
    read_gbs: f64,
}

impl Peaks {
    /// The larger of each figure: peaks are measured before and after the timed points, and a
    /// busy host only ever lowers them.
    fn max(self, o: Peaks) -> Peaks {
        let m = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        Peaks {
            amx_bf16: m(self.amx_bf16, o.amx_bf16),
            amx_int8: m(self.amx_int8, o.amx_int8),
            avx512_bf16: m(self.avx512_bf16, o.avx512_bf16),
            avx512_fma: m(self.avx512_fma, o.avx512_fma),
            avx512_vnni: m(self.avx512_vnni, o.avx512_vnni),
            avx_vnni: m(self.avx_vnni, o.avx_vnni),
            avx2_int8: m(self.avx2_int8, o.avx2_int8),
            avx2_fma: m(self.avx2_fma, o.avx2_fma),
            read_gbs: self.read_gbs.max(o.read_gbs),
        }
    }

    fn measure() -> Self {
        Peaks {
            amx_bf16: peak::amx_bf16_tflops(0.3),
            amx_int8: peak::amx_int8_tops(0.3),
            avx512_bf16: peak::avx512_bf16_tflops(0.3),
            avx512_fma: peak::avx512_fma_tflops(0.3),
            avx512_vnni: peak::avx512_vnni_tops(0.3),
            avx_vnni: peak::avx_vnni_tops(0.3),
            avx2_int8: peak::avx2_int8_tops(0.3),
            avx2_fma: peak::avx2_fma_tflops(0.3),
            read_gbs: peak::read_gbs(1 << 30, 3),
        }
    }

    /// The compute peak of the path a call ran on, in T(FL)OPS.
    fn compute(&self, isa: Isa, fmt: PackedFormat) -> Option<f64> {
        let bf16 = fmt == PackedFormat::Bf16;
        match (isa, bf16) {
            (Isa::Amx, true) => self.amx_bf16,
            (Isa::Amx, false) => self.amx_int8,
            // The BF16 tiles run on `vdpbf16ps` only where it beats f32 FMA.
            (Isa::Avx512, true) if strata_kernels::isa::bf16_dot_on_dpbf16() => self.avx512_bf16,
            (Isa::Avx512, true) => self.avx512_fma,
            (Isa::Avx512, false) => self.avx512_vnni,
            (Isa::Avx2 | Isa::AvxVnni, true) => self.avx2_fma,
            (Isa::Avx2, false) => self.avx2_int8,
            (Isa::AvxVnni, false) => self.avx_vnni,
            (Isa::Portable, _) => None,
        }
    }
}

/// Median seconds of `f(call)` over at least 3 calls and `min_s` seconds, after a warm-up.
pub(crate) fn time_calls(
    min_s: f64,
    mut f: impl FnMut(usize) -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    f(0)?;
    let start = Instant::now();
    let mut times = Vec::new();
    while times.len() < 3 || (start.elapsed().as_secs_f64() < min_s && times.len() < 2000) {
        let t0 = Instant::now();
        f(times.len() + 1)?;
        times.push(t0.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Uniform routing of `t` tokens over `e` experts, starting at expert `offset`.
fn routing(t: usize, k: usize, e: usize, offset: usize) -> (Vec<u32>, Vec<f32>) {
    let ids = (0..t * k).map(|i| ((i + offset) % e) as u32).collect();
    (ids, vec![1.0 / k as f32; t * k])
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Experts whose f32 weights are kept for the accuracy check (its routing uses only these).
const ACC_EXPERTS: usize = 8;

/// f32 MoE on the unquantized weights of experts `0 .. src.len()`.
fn moe_f32(src: &[F32Expert], h: usize, i: usize, x: &[f32], ids: &[u32], wts: &[f32]) -> Vec<f32> {
    let t = x.len() / h;
    let k = ids.len() / t.max(1);
    let mut out = vec![0.0f32; t * h];
    let (mut g, mut u, mut y) = (vec![0.0; i], vec![0.0; i], vec![0.0; h]);
    for tok in 0..t {
        let xt = &x[tok * h..(tok + 1) * h];
        for j in 0..k {
            let e = &src[ids[tok * k + j] as usize % src.len()];
            matmul_f32(xt, &e.gate, &mut g, 1, i, h);
            matmul_f32(xt, &e.up, &mut u, 1, i, h);
            let act: Vec<f32> = g.iter().zip(&u).map(|(g, u)| silu(*g) * u).collect();
            matmul_f32(&act, &e.down, &mut y, 1, h, i);
            for (o, v) in out[tok * h..(tok + 1) * h].iter_mut().zip(&y) {
                *o += wts[tok * k + j] * v;
            }
        }
    }
    out
}

fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "n/a".into(), |v| format!("{v:.digits$}"))
}

/// Runs `strata bench moe`.
pub fn bench_moe(args: &BenchMoeArgs) -> anyhow::Result<()> {
    let (h, inter, e, k) = (args.hidden, args.inter, args.experts, args.topk);
    ensure!(h > 0 && inter > 0, "hidden and inter must be positive");
    ensure!(
        k > 0 && k <= e,
        "topk {k} must be between 1 and the number of experts {e}"
    );
    let distinct = args.distinct.unwrap_or(e).min(e);
    ensure!(
        args.layers > 0 && distinct > 0,
        "layers and distinct must be positive"
    );
    let (ggml, packed): (Vec<&String>, Vec<&String>) =
        args.formats.iter().partition(|s| ggml_type(s).is_some());
    let formats = packed
        .iter()
        .map(|s| parse_format(s))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let threads = num_threads();
    let detected = strata_kernels::isa::detected();
    let selected = Isa::selected();
    if !args.json {
        eprintln!(
            "measuring peaks on {threads} threads (detected {}, selected {})...",
            detected.name(),
            selected.name()
        );
    }
    let first_peaks = Peaks::measure();
    let mut results = Vec::new();
    let mut points = Vec::new();
    let mut accuracy = Vec::new();
    let mut crossover = Vec::new();
    let mut rng = Lcg(0x5eed);
    for &fmt in &formats {
        if !args.json {
            eprintln!(
                "packing {} x {} experts in {}...",
                args.layers,
                e,
                fmt.name()
            );
        }
        let (layers, src, expert_bytes) = pack_layers(args, fmt, distinct, &mut rng)?;

        // Accuracy against f32 on the unquantized weights.
        let t_acc = 32;
        let x = rng.vec(t_acc * h, 2.0);
        let (ids, wts) = routing(t_acc, k, src.len(), 0);
        let want = moe_f32(&src, h, inter, &x, &ids, &wts);
        let mut got = vec![0.0; t_acc * h];
        fused_moe_with(&layers[0], &x, &ids, &wts, &mut got, &MoeOptions::default())?;
        let rel = rel_rms_err(&want, &got);
        accuracy.push(json!({"format": fmt.name(), "tokens": t_acc, "rel_rms_err": rel}));

        for &t in &args.tokens {
            let x = rng.vec(t * h, 2.0);
            let mut out = vec![0.0f32; t * h];
            let per_call = (t * k).min(e);
            let seconds = time_calls(args.min_seconds, |c| {
                let (ids, wts) = routing(t, k, e, (c * t * k) % e);
                let layer = &layers[c % layers.len()];
                fused_moe_with(layer, &x, &ids, &wts, &mut out, &MoeOptions::default())?;
                Ok(())
            })?;
            let tokens_per_expert = (t * k).div_ceil(e);
            let isa = if tokens_per_expert >= DEFAULT_AMX_MIN_TOKENS {
                selected
            } else {
                selected.min(Isa::Avx512)
            };
            let flops = 6.0 * (t * k) as f64 * (h * inter) as f64;
            let tflops = flops / seconds / 1e12;
            let weight_gbs = (per_call * expert_bytes) as f64 / seconds / 1e9;
            points.push(Some((isa, fmt)));
            results.push(json!({
                "format": fmt.name(),
                "tokens": t,
                "tokens_per_expert": (t * k) as f64 / e as f64,
                "isa": isa.name(),
                "seconds": seconds,
                "tflops": tflops,
                "weight_gbs": weight_gbs,
            }));
            if !args.json {
                eprintln!("  {} T={t}: {:.3} ms", fmt.name(), seconds * 1e3);
            }
        }

        if args.crossover {
            crossover.extend(crossover::packed(
                &layers[0],
                fmt,
                args.min_seconds.min(0.5),
                &mut rng,
            )?);
        }
    }
    for name in ggml {
        let ty = ggml_type(name).expect("partitioned by ggml_type");
        points.extend(bench_ggml(
            args,
            ty,
            &mut rng,
            &mut results,
            &mut accuracy,
            &mut crossover,
        )?);
    }
    if !args.json {
        eprintln!("measuring peaks again...");
    }
    let peaks = first_peaks.max(Peaks::measure());
    add_peak_fractions(&mut results, points, &peaks);
    let doc = json!({
        "shape": {"hidden": h, "inter": inter, "experts": e, "topk": k},
        "machine": {
            "threads": threads,
            "detected_isa": detected.name(),
            "selected_isa": selected.name(),
            "amx_min_tokens": DEFAULT_AMX_MIN_TOKENS,
        },
        "peaks": {
            "amx_bf16_tflops": peaks.amx_bf16,
            "amx_int8_tops": peaks.amx_int8,
            "avx512_bf16_tflops": peaks.avx512_bf16,
            "avx512_fma_tflops": peaks.avx512_fma,
            "avx512_vnni_tops": peaks.avx512_vnni,
            "avx_vnni_tops": peaks.avx_vnni,
            "avx2_int8_tops": peaks.avx2_int8,
            "avx2_fma_tflops": peaks.avx2_fma,
            "read_gbs": peaks.read_gbs,
        },
        "results": results,
        "accuracy": accuracy,
        "crossover": crossover,
    });
    if let Some(path) = &args.plot {
        crate::plot::write(path, crate::plot::roofline(&doc))?;
    }
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&doc)?)?;
    } else {
        print_table(&doc)?;
    }
    Ok(())
}

/// `args.layers` layers of `args.experts` random experts packed as `fmt`, `distinct` of
/// them different per layer; with the f32 weights of layer 0's first experts (for the
/// accuracy check) and the bytes of one packed expert.
fn pack_layers(
    args: &BenchMoeArgs,
    fmt: PackedFormat,
    distinct: usize,
    rng: &mut Lcg,
) -> anyhow::Result<(Vec<MoeExperts>, Vec<F32Expert>, usize)> {
    // Weight scale about 1 / sqrt(fan-in), as in trained layers. The f32 weights of the
    // first few experts of layer 0 are kept for the accuracy check.
    let (h, inter, e) = (args.hidden, args.inter, args.experts);
    let mut src: Vec<F32Expert> = Vec::new();
    let mut layers = Vec::with_capacity(args.layers);
    let mut expert_bytes = 0;
    for l in 0..args.layers {
        let mut all = Vec::with_capacity(e);
        for d in 0..distinct {
            let f = F32Expert {
                gate: rng.vec(inter * h, 2.0 / (h as f32).sqrt()),
                up: rng.vec(inter * h, 2.0 / (h as f32).sqrt()),
                down: rng.vec(h * inter, 2.0 / (inter as f32).sqrt()),
            };
            let x = Expert::pack(&f.gate, &f.up, &f.down, h, inter, fmt)
                .with_context(|| format!("packing experts as {}", fmt.name()))?;
            expert_bytes = x.bytes();
            all.push(x);
            if l == 0 && d < ACC_EXPERTS {
                src.push(f);
            }
        }
        for x in distinct..e {
            all.push(all[x % distinct].clone());
        }
        layers.push(MoeExperts::new(h, inter, all)?);
    }
    Ok((layers, src, expert_bytes))
}

/// Each result's fraction of the compute peak of its kernel and of the memory read peak.
fn add_peak_fractions(
    results: &mut [Value],
    points: Vec<Option<(Isa, PackedFormat)>>,
    peaks: &Peaks,
) {
    for (r, point) in results.iter_mut().zip(points) {
        let tflops = r["tflops"].as_f64().unwrap_or(f64::NAN);
        let weight_gbs = r["weight_gbs"].as_f64().unwrap_or(f64::NAN);
        // ggml rows on the block kernels (no packed point) run AVX-512 VNNI or AVX2 int8,
        // unless the type takes the generic f32 path; on BF16 tiles, the BF16 peak.
        let peak = match point {
            Some((isa, fmt)) => peaks.compute(isa, fmt),
            None if r["isa"] == "avx512" => peaks.avx512_vnni,
            None if r["isa"] == "avx2" => peaks.avx2_int8,
            None => None,
        };
        r["frac_compute_peak"] = json!(peak.map(|p| tflops / p));
        r["frac_read_gbs"] = json!(weight_gbs / peaks.read_gbs);
    }
}

/// `‖got - want‖ / ‖want‖` (root mean square error relative to the reference's).
fn rel_rms_err(want: &[f32], got: &[f32]) -> f64 {
    let num: f64 = want
        .iter()
        .zip(got)
        .map(|(a, b)| f64::from(a - b).powi(2))
        .sum();
    let den: f64 = want.iter().map(|a| f64::from(*a).powi(2)).sum();
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// The ggml block type a `--formats` entry names (`q4_k`, `IQ4_XS`), if any.
fn ggml_type(name: &str) -> Option<GgmlType> {
    GgmlType::ALL
        .into_iter()
        .find(|t| t.block_size() > 1 && t.name().eq_ignore_ascii_case(name))
}

/// One ggml format's points: experts of random valid blocks, computed in place by
/// `fused_moe_ggml`; accuracy against f32 on the dequantized weights (so it measures the
/// kernels' activation rounding, not the quantization of the weights). Returns, per point,
/// the tile path's instruction set and format where it ran on tiles (for its %peak).
fn bench_ggml(
    args: &BenchMoeArgs,
    ty: GgmlType,
    rng: &mut Lcg,
    results: &mut Vec<Value>,
    accuracy: &mut Vec<Value>,
    crossover: &mut Vec<Value>,
) -> anyhow::Result<Vec<Option<(Isa, PackedFormat)>>> {
    let (h, inter, e, k) = (args.hidden, args.inter, args.experts, args.topk);
    ensure!(
        ty.can_dequantize() && h % ty.block_size() == 0 && inter % ty.block_size() == 0,
        "{ty} needs hidden and inter to be multiples of {}",
        ty.block_size()
    );
    let distinct = args.distinct.unwrap_or(e).min(e);
    let name = ty.name().to_ascii_lowercase();
    if !args.json {
        eprintln!("writing {} x {e} experts as {ty} blocks...", args.layers);
    }
    let mut seed = rng.0;
    let mut matrix = |n: usize, kk: usize| {
        let bytes = ggml::random_blocks(ty, n * kk / ty.block_size(), &mut seed);
        GgmlMatrix::from_vec(ty, n, kk, bytes)
    };
    let mut layers = Vec::with_capacity(args.layers);
    for _ in 0..args.layers {
        let (mut g, mut u, mut d) = (Vec::new(), Vec::new(), Vec::new());
        for x in 0..e {
            if x < distinct {
                g.push(matrix(inter, h)?);
                u.push(matrix(inter, h)?);
                d.push(matrix(h, inter)?);
            } else {
                let c = x % distinct;
                let (gc, uc, dc) = (g[c].clone(), u[c].clone(), d[c].clone());
                g.push(gc);
                u.push(uc);
                d.push(dc);
            }
        }
        layers.push(GgmlExperts::new(g, u, d, h, inter)?);
    }
    rng.0 = seed;
    let expert_bytes = layers[0].bytes() / e;

    let t_acc = 32;
    let x = rng.vec(t_acc * h, 2.0);
    let src: Vec<F32Expert> = (0..ACC_EXPERTS.min(e))
        .map(|x| {
            let (g, u, d) = layers[0].expert(x);
            F32Expert {
                gate: g.dequantize(),
                up: u.dequantize(),
                down: d.dequantize(),
            }
        })
        .collect();
    let (ids, wts) = routing(t_acc, k, src.len(), 0);
    let want = moe_f32(&src, h, inter, &x, &ids, &wts);
    let mut got = vec![0.0; t_acc * h];
    let batches = group_by_expert(e, &ids, &wts, k)?;
    fused_moe_ggml(&layers[0], &x, &batches, &mut got, &MoeOptions::default())?;
    let rel = rel_rms_err(&want, &got);
    accuracy.push(json!({"format": name, "tokens": t_acc, "rel_rms_err": rel}));

    let mut points = Vec::new();
    for &t in &args.tokens {
        let x = rng.vec(t * h, 2.0);
        let mut out = vec![0.0f32; t * h];
        let per_call = (t * k).min(e);
        let seconds = time_calls(args.min_seconds, |c| {
            let (ids, wts) = routing(t, k, e, (c * t * k) % e);
            let batches = group_by_expert(e, &ids, &wts, k)?;
            let layer = &layers[c % layers.len()];
            fused_moe_ggml(layer, &x, &batches, &mut out, &MoeOptions::default())?;
            Ok(())
        })?;
        let flops = 6.0 * (t * k) as f64 * (h * inter) as f64;
        // Routing spreads tokens evenly, so every expert's calls take the same path.
        let tiles = ggml::tile_path(Isa::selected(), ty, t * k / e);
        points.push(tiles);
        let path = match tiles {
            Some((isa, fmt)) => format!("{}-{}-tiles", isa.name(), fmt.name()),
            None if has_fast_kernel(ty) => ggml::row_dot_isa(Isa::selected()).name().to_string(),
            None => "generic".to_string(),
        };
        results.push(json!({
            "format": name,
            "tokens": t,
            "tokens_per_expert": (t * k) as f64 / e as f64,
            "isa": path,
            "seconds": seconds,
            "tflops": flops / seconds / 1e12,
            "weight_gbs": (per_call * expert_bytes) as f64 / seconds / 1e9,
        }));
        if !args.json {
            eprintln!("  {name} T={t}: {:.3} ms", seconds * 1e3);
        }
    }
    if args.crossover {
        if !args.json {
            eprintln!("  {name}: timing each path per tokens per expert...");
        }
        let min_s = args.min_seconds.min(0.5);
        crossover.extend(crossover::ggml(&layers, ty, min_s, rng)?);
    }
    Ok(points)
}

/// The results, each column as wide as its widest cell: names such as `portable` or
/// `iq4_xs` and JSON numbers (whose `Display` ignores widths) cannot push a row out of line.
fn results_table(doc: &Value) -> String {
    let f = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    let header = [
        "format",
        "tokens",
        "isa",
        "seconds",
        "TFLOPS",
        "%peak",
        "weight GB/s",
        "%read",
    ];
    let mut rows = vec![header.map(String::from)];
    for r in doc["results"].as_array().into_iter().flatten() {
        rows.push([
            r["format"].as_str().unwrap_or("?").to_owned(),
            r["tokens"].to_string(),
            r["isa"].as_str().unwrap_or("?").to_owned(),
            format!("{:.6}", f(&r["seconds"])),
            format!("{:.3}", f(&r["tflops"])),
            fmt_opt(r["frac_compute_peak"].as_f64().map(|v| v * 100.0), 1),
            format!("{:.1}", f(&r["weight_gbs"])),
            format!("{:.1}", f(&r["frac_read_gbs"]) * 100.0),
        ]);
    }
    let width = |c: usize| rows.iter().map(|r| r[c].len()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..header.len()).map(width).collect();
    let mut out = String::new();
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(c, (cell, &w))| match c {
                0 => format!("{cell:<w$}"),
                _ => format!("{cell:>w$}"),
            })
            .collect();
        out += &cells.join("  ");
        out.push('\n');
    }
    out
}

fn print_table(doc: &Value) -> std::io::Result<()> {
    let p = &doc["peaks"];
    let f = |v: &Value| v.as_f64();
    outln!(
        "shape: hidden {} inter {} experts {} topk {}; threads {}, isa {}",
        doc["shape"]["hidden"],
        doc["shape"]["inter"],
        doc["shape"]["experts"],
        doc["shape"]["topk"],
        doc["machine"]["threads"],
        doc["machine"]["selected_isa"].as_str().unwrap_or("?"),
    )?;
    outln!(
        "peaks: AMX BF16 {} TFLOPS, AMX INT8 {} TOPS, AVX-512 BF16 {} TFLOPS, AVX-512 FMA {} TFLOPS, AVX-512 VNNI {} TOPS, AVX-VNNI {} TOPS, AVX2 INT8 {} TOPS, AVX2 FMA {} TFLOPS, read {} GB/s",
        fmt_opt(f(&p["amx_bf16_tflops"]), 2),
        fmt_opt(f(&p["amx_int8_tops"]), 2),
        fmt_opt(f(&p["avx512_bf16_tflops"]), 3),
        fmt_opt(f(&p["avx512_fma_tflops"]), 3),
        fmt_opt(f(&p["avx512_vnni_tops"]), 3),
        fmt_opt(f(&p["avx_vnni_tops"]), 3),
        fmt_opt(f(&p["avx2_int8_tops"]), 3),
        fmt_opt(f(&p["avx2_fma_tflops"]), 3),
        fmt_opt(f(&p["read_gbs"]), 1),
    )?;
    out!("{}", results_table(doc))?;
    for a in doc["accuracy"].as_array().into_iter().flatten() {
        outln!(
            "accuracy {:<8} relative RMS error vs f32: {:.2e}",
            a["format"].as_str().unwrap_or("?"),
            f(&a["rel_rms_err"]).unwrap_or(f64::NAN)
        )?;
    }
    for line in crossover::lines(doc) {
        outln!("{line}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::results_table;

    /// Regression: `tokens` (a JSON number) and 8-letter isa names broke the columns.
    #[test]
    fn results_table_columns_line_up() {
        let row = |format: &str, tokens: u64, isa: &str| {
            serde_json::json!({
                "format": format, "tokens": tokens, "isa": isa, "seconds": 0.0123,
                "tflops": 1.5, "frac_compute_peak": null, "weight_gbs": 812.25,
                "frac_read_gbs": 0.5,
            })
        };
        let doc = serde_json::json!({ "results": [
            row("bf16", 1, "avx512"),
            row("iq4_xs", 4096, "portable"),
        ]});
        let table = results_table(&doc);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3, "{table}");
        // Cells are separated by two spaces or more; right-aligned columns end where their
        // header ends.
        let ends = |line: &str| -> Vec<usize> {
            let b = line.as_bytes();
            let gap = |i: usize| i == b.len() || (i + 1 < b.len() && &b[i..i + 2] == b"  ");
            (1..=b.len())
                .filter(|&i| b[i - 1] != b' ' && gap(i))
                .collect()
        };
        let header = ends(lines[0]);
        assert_eq!(header.len(), 8, "{table}");
        for line in &lines[1..] {
            assert_eq!(ends(line)[1..], header[1..], "{table}");
        }
    }
}
