//! The quantized weight formats on the device (ggml blocks as a GGUF stores them, a converted
//! model's packed integers by rows) against the CPU's reference dequantizers (for the
//! integers, their values times their scales): the block geometry, every kernel that reads them
//! (matmul, embedding gather, grouped experts with mixed gate/up and down types) on
//! random blocks, extreme blocks (all bits set, sign bits only, zero values) and zero
//! blocks, ragged shapes, weights split across bindings, with and without subgroups.

mod common;

use std::sync::Arc;

use common::{Rng, down, gpu, max_err, up, up_u32};
use strata_accel::{Device, DeviceOptions, ExpertFormat, ExpertSlots, Op, WeightType};
use strata_kernels::ggml::{GgmlType, dequantize_row, random_blocks};

/// Every quantized type the device stores.
fn quantized() -> impl Iterator<Item = WeightType> {
    WeightType::ALL.into_iter().filter(|t| t.is_quantized())
}

fn ggml(t: WeightType) -> GgmlType {
    GgmlType::ALL
        .into_iter()
        .find(|g| g.name().eq_ignore_ascii_case(t.name()))
        .unwrap_or_else(|| panic!("no ggml type named {}", t.name()))
}

/// Byte offsets of each block's f16 scale fields (kept finite in the extreme blocks).
fn f16_fields(t: WeightType) -> &'static [usize] {
    match t {
        WeightType::Q4_K | WeightType::Q5_K => &[0, 2],
        WeightType::Q6_K => &[208],
        _ => &[0],
    }
}

/// Devices to run on: subgroup reductions (where the adapter has them) and the tiled
/// kernels at many tokens, then plain reductions and the row kernels at every token count;
/// each with bindings of at most `max_binding` bytes so weights split into chunks.
fn devices(max_binding: u64) -> Vec<Arc<dyn Device>> {
    [false, true]
        .into_iter()
        .filter_map(|plain| {
            gpu(DeviceOptions {
                max_binding: Some(max_binding),
                no_subgroups: plain,
                no_tiles: plain,
                ..DeviceOptions::default()
            })
        })
        .collect()
}

/// `rows` rows of `k` values of `t` and the values they hold (the reference). ggml blocks
/// (dequantized by the CPU's reference) are a mix of random blocks, all bits set, only
/// sign/high bits, zero values, and zero blocks (scale 0); packed integers are random, at
/// both ends of their range, or zero, under random, large and zero scales.
fn weights(t: WeightType, rows: usize, k: usize, rng: &mut u64) -> (Vec<u8>, Vec<f32>) {
    if !t.is_quantized() {
        return floats(t, rows, k, rng);
    }
    if !t.is_ggml() {
        return integers(t, rows, k, rng);
    }
    let (qk, bb) = t.block();
    let n_blocks = rows * k / qk;
    let mut bytes = random_blocks(ggml(t), n_blocks, rng);
    for (b, block) in bytes.chunks_exact_mut(bb).enumerate() {
        let fill = match b % 7 {
            1 => Some(0xff),
            3 => Some(0x80),
            5 => Some(0x00),
            _ => None,
        };
        if let Some(v) = fill {
            let keep = f16_fields(t);
            for (i, x) in block.iter_mut().enumerate() {
                if !keep.iter().any(|&f| i == f || i == f + 1) {
                    *x = v;
                }
            }
        }
        if b % 11 == 6 {
            block.fill(0);
        }
    }
    let mut values = vec![0.0; rows * k];
    dequantize_row(ggml(t), &bytes, &mut values).unwrap();
    (bytes, values)
}

/// Random floats in `t` (read by the kernels over blocks as groups of 32) and the values
/// stored.
fn floats(t: WeightType, rows: usize, k: usize, rng: &mut u64) -> (Vec<u8>, Vec<f32>) {
    let mut r = Rng::new(*rng);
    *rng = rng.wrapping_add(1);
    let values = r.vec(rows * k);
    let bytes = t.encode(&values).unwrap();
    let stored = match t {
        WeightType::Bf16 => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        WeightType::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        _ => values,
    };
    (bytes, stored)
}

/// Packed integers of `t` ([`WeightType::encode_int_rows`]) and their values.
fn integers(t: WeightType, rows: usize, k: usize, rng: &mut u64) -> (Vec<u8>, Vec<f32>) {
    let (lo, hi, per_row) = match t {
        WeightType::Int8 => (-128i32, 127i32, 1),
        _ => (-8, 7, k / 32),
    };
    let mut next = || {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        *rng
    };
    let span = (hi - lo + 1) as u64;
    let q: Vec<i8> = (0..rows * k)
        .map(|i| match (i / 32) % 5 {
            1 => lo as i8,
            2 => hi as i8,
            3 => 0,
            _ => (lo + (next() % span) as i32) as i8,
        })
        .collect();
    let scales: Vec<f32> = (0..rows * per_row)
        .map(|g| match g % 4 {
            1 => 0.0,
            2 => 3.0e3,
            _ => (next() % 1000) as f32 * 1e-4 + 1e-3,
        })
        .collect();
    let group = k / per_row;
    let values = q
        .iter()
        .enumerate()
        .map(|(i, &v)| f32::from(v) * scales[i / group])
        .collect();
    (t.encode_int_rows(&q, &scales, k).unwrap(), values)
}

fn upload(dev: &dyn Device, t: WeightType, bytes: &[u8], k: usize) -> strata_accel::Buffer {
    let mut padded = bytes.to_vec();
    padded.resize(padded.len().next_multiple_of(4), 0);
    let b = dev
        .alloc(padded.len() as u64, t.row_granule(k), "weights")
        .unwrap();
    dev.upload(&b, 0, &padded).unwrap();
    b
}

#[test]
fn the_geometry_is_ggmls() {
    for t in quantized().filter(|t| t.is_ggml()) {
        let g = ggml(t);
        assert_eq!(t.block(), (g.block_size(), g.block_bytes()), "{}", t.name());
        assert_eq!(WeightType::from_ggml_name(g.name()), Some(t));
        assert_eq!(t.row_bytes(2 * g.block_size()), 2 * g.block_bytes() as u64);
    }
}

#[test]
fn quantized_matmul_matches_the_dequantized_reference() {
    let mut seed = 5u64;
    let mut rng = Rng::new(3);
    for dev in devices(2048) {
        for t in quantized() {
            let qk = t.block().0;
            // m past the row kernel's 8 tokens per pass; odd row counts; 1-3 blocks per
            // row; from 32 tokens the tiled kernel, whole and ragged tiles, rows over chunks.
            let shapes = [
                (1, 3, qk),
                (9, 7, 2 * qk),
                (3, 5, 3 * qk),
                (0, 2, qk),
                (40, 37, 2 * qk),
                (64, 70, qk),
            ];
            for &(m, n, k) in &shapes {
                let k = k.max(32);
                let (w, wf) = weights(t, n, k, &mut seed);
                let x = rng.vec(m * k);
                let bias = rng.vec(n);
                let mut want = vec![0.0; m * n];
                strata_kernels::gemm::matmul_f32_ref(&x, &wf, &mut want, m, n, k);
                for (i, v) in want.iter_mut().enumerate() {
                    *v += bias[i % n];
                }
                let (wb, xb, bb) = (upload(&*dev, t, &w, k), up(&*dev, &x), up(&*dev, &bias));
                let out = dev.alloc((m * n).max(1) as u64 * 4, 0, "out").unwrap();
                dev.enqueue(&Op::Matmul {
                    x: &xb,
                    w: &wb,
                    wtype: t,
                    bias: Some(&bb),
                    out: &out,
                    m: m as u32,
                    n: n as u32,
                    k: k as u32,
                })
                .unwrap();
                let got = down(&*dev, &out, m * n);
                let err = max_err(&got, &want);
                assert!(err < 1e-4, "{} m={m} n={n} k={k}: error {err}", t.name());
            }
        }
    }
}

#[test]
fn quantized_rows_of_any_length_are_refused() {
    let Some(dev) = devices(2048).pop() else {
        return;
    };
    let w = dev.alloc(144 * 4, 0, "w").unwrap();
    let x = dev.alloc(4 * 128, 0, "x").unwrap();
    let out = dev.alloc(4 * 4, 0, "out").unwrap();
    let err = dev
        .enqueue(&Op::Matmul {
            x: &x,
            w: &w,
            wtype: WeightType::Q4_K,
            bias: None,
            out: &out,
            m: 1,
            n: 1,
            k: 128,
        })
        .unwrap_err();
    assert!(err.to_string().contains("not whole q4_k blocks"), "{err}");
}

#[test]
fn quantized_embedding_gathers_the_dequantized_rows() {
    let mut seed = 9u64;
    for dev in devices(2048) {
        for t in quantized() {
            let (v, dim) = (13, t.block().0.max(64));
            let (table, tf) = weights(t, v, dim, &mut seed);
            let ids = [0u32, 12, 5, 5, 7];
            let tb = upload(&*dev, t, &table, dim);
            let ib = up_u32(&*dev, &ids);
            let out = dev.alloc((ids.len() * dim) as u64 * 4, 0, "out").unwrap();
            dev.enqueue(&Op::Embed {
                table: &tb,
                wtype: t,
                ids: &ib,
                out: &out,
                rows: ids.len() as u32,
                dim: dim as u32,
            })
            .unwrap();
            let got = down(&*dev, &out, ids.len() * dim);
            let want: Vec<f32> = ids
                .iter()
                .flat_map(|&i| tf[i as usize * dim..][..dim].to_vec())
                .collect();
            // Exact but for a fused multiply-add the compiler may form.
            let err = max_err(&got, &want);
            assert!(err < 1e-6, "{}: error {err}", t.name());
        }
    }
}

#[test]
fn quantized_experts_match_the_dequantized_reference() {
    let mut seed = 11u64;
    let mut rng = Rng::new(4);
    // Gate/up and down types as GGUF mixes ship them (Q4_K_M keeps down in Q6_K).
    let mixes = [
        (WeightType::Q4_K, WeightType::Q6_K),
        (WeightType::Q8_0, WeightType::Q8_0),
        (WeightType::IQ4_XS, WeightType::Q5_0),
        (WeightType::Q5_K, WeightType::Q4_0),
        // A converted model's packed integers.
        (WeightType::Int8, WeightType::Int8),
        (WeightType::Int4, WeightType::Int4),
        // Floats (a checkpoint's BF16, types dequantized to F16 on upload) as groups of 32.
        (WeightType::Bf16, WeightType::Bf16),
        (WeightType::F16, WeightType::F16),
        (WeightType::F32, WeightType::F32),
    ];
    // Slots of 100-230 KB: two per binding, so the three slots take two chunks.
    for dev in devices(480 << 10) {
        for (gu, dt) in mixes {
            let (h, inter, n_exp, k) = (256usize, 96usize, 3usize, 2usize);
            let inter = if dt.block().0 == 256 { 256 } else { inter };
            let format = ExpertFormat {
                gate_up: gu,
                down: dt,
            };
            let slots =
                ExpertSlots::new(&*dev, n_exp as u32, h as u32, inter as u32, &[format]).unwrap();
            let mut experts = Vec::new();
            for s in 0..n_exp {
                let (g, gf) = weights(gu, inter, h, &mut seed);
                let (u, uf) = weights(gu, inter, h, &mut seed);
                let (d, df) = weights(dt, h, inter, &mut seed);
                slots
                    .refill_parts(&*dev, s as u32, format, [&g, &u, &d])
                    .unwrap();
                experts.push([gf, uf, df]);
            }
            // 11 tokens: a few pairs per expert (the row kernel); 75: about 50 per expert
            // (tiles, where the device takes them), runs that cross tiles' edges.
            for tokens in [11, 75] {
                let x = rng.vec(tokens * h);
                // Token r chooses experts r % n and (r + 1 + r / 3) % n; pairs sorted by slot
                // so runs of one expert share decoded groups.
                let ids: Vec<usize> = (0..tokens)
                    .flat_map(|r| [r % n_exp, (r + 1 + r / 3) % n_exp])
                    .collect();
                let mut order: Vec<usize> = (0..tokens * k).collect();
                order.sort_by_key(|&p| ids[p]);
                let pairs: Vec<u32> = order
                    .iter()
                    .flat_map(|&p| [(p / k) as u32, ids[p] as u32])
                    .collect();
                let n_pairs = order.len();
                let (xb, pb) = (up(&*dev, &x), up_u32(&*dev, &pairs));
                let act = dev.alloc((n_pairs * inter * 4) as u64, 0, "act").unwrap();
                let y = dev.alloc((n_pairs * h * 4) as u64, 0, "y").unwrap();
                for (stage, input, out) in [(0, &xb, &act), (1, &act, &y)] {
                    dev.enqueue(&Op::ExpertFfn {
                        x: input,
                        slots: &slots,
                        format,
                        pairs: &pb,
                        out,
                        n_pairs: n_pairs as u32,
                        experts: n_exp as u32,
                        stage,
                    })
                    .unwrap();
                }
                let got = down(&*dev, &y, n_pairs * h);
                let mut want = Vec::with_capacity(n_pairs * h);
                for &p in &order {
                    let [g, u, d] = &experts[ids[p]];
                    let row = &x[(p / k) * h..][..h];
                    let (mut gx, mut ux) = (vec![0.0; inter], vec![0.0; inter]);
                    strata_kernels::gemm::matmul_f32_ref(row, g, &mut gx, 1, inter, h);
                    strata_kernels::gemm::matmul_f32_ref(row, u, &mut ux, 1, inter, h);
                    for (a, b) in gx.iter_mut().zip(&ux) {
                        *a = *a / (1.0 + (-*a).exp()) * b;
                    }
                    let mut yr = vec![0.0; h];
                    strata_kernels::gemm::matmul_f32_ref(&gx, d, &mut yr, 1, h, inter);
                    want.extend(yr);
                }
                let err = max_err(&got, &want);
                assert!(
                    err < 1e-4,
                    "{}/{} at {tokens} tokens: error {err}",
                    gu.name(),
                    dt.name()
                );
            }
        }
    }
}
