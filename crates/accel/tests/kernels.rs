//! Every GPU kernel against the CPU reference on random shapes, including 0, 1, odd sizes
//! and tensors split across bindings (a device opened with a tiny binding limit).

mod common;

use common::{Rng, down, gpu, max_err, up, up_u32};
use strata_accel::{
    CacheWrite, Device, DeviceOptions, ExpertFormat, ExpertSlots, Op, RopeKind, WeightType,
};
use strata_model::config::{RopeConfig, RopeScaling, RopeStyle};
use strata_model::rope::Rope;

/// A device whose bindings hold at most 400 bytes, so weights split into many chunks.
fn split_gpu() -> Option<std::sync::Arc<dyn Device>> {
    gpu(DeviceOptions {
        max_binding: Some(400),
        ..DeviceOptions::default()
    })
}

/// Values as the device stores them in `t` (rounded through bf16 or f16).
fn rounded(t: WeightType, v: &[f32]) -> Vec<f32> {
    match t {
        WeightType::F32 => v.to_vec(),
        WeightType::Bf16 => v
            .iter()
            .map(|x| half::bf16::from_f32(*x).to_f32())
            .collect(),
        WeightType::F16 => v.iter().map(|x| half::f16::from_f32(*x).to_f32()).collect(),
        q => panic!("{} is not a float type", q.name()),
    }
}

fn upload_weights(dev: &dyn Device, t: WeightType, v: &[f32], row: usize) -> strata_accel::Buffer {
    let bytes = t.encode(v).unwrap();
    let b = dev
        .alloc(bytes.len() as u64, t.row_granule(row), "weights")
        .unwrap();
    dev.upload(&b, 0, &bytes).unwrap();
    b
}

#[test]
fn matmul_matches_reference() {
    let Some(dev) = split_gpu() else { return };
    let mut rng = Rng::new(1);
    for &(m, n, k) in &[
        (1, 1, 1),
        (3, 5, 7),
        (17, 33, 19),
        (5, 40, 64),
        (0, 3, 4),
        (2, 9, 1),
        // Rows of whole groups of 32 at many tokens: the tiled kernel.
        (40, 37, 96),
    ] {
        for t in [WeightType::F32, WeightType::Bf16, WeightType::F16] {
            let x = rng.vec(m * k);
            let w = rng.vec(n * k);
            let bias = rng.vec(n);
            let wq = rounded(t, &w);
            let mut want = vec![0.0; m * n];
            strata_kernels::gemm::matmul_f32_ref(&x, &wq, &mut want, m, n, k);
            for (i, v) in want.iter_mut().enumerate() {
                *v += bias[i % n.max(1)];
            }
            let (xb, wb, bb) = (
                up(&*dev, &x),
                upload_weights(&*dev, t, &w, k),
                up(&*dev, &bias),
            );
            let out = dev.alloc((m * n * 4) as u64, 0, "out").unwrap();
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
            let e = max_err(&got, &want);
            assert!(
                e < 1e-5 * k as f32 + 1e-6,
                "matmul {m}x{n}x{k} {t:?}: error {e}"
            );
        }
    }
}

#[test]
fn embed_gathers_rows_across_chunks() {
    let Some(dev) = split_gpu() else { return };
    let mut rng = Rng::new(2);
    for t in [WeightType::F32, WeightType::Bf16] {
        let (rows, dim) = (23, 7);
        let table = rng.vec(rows * dim);
        let ids = [0u32, 22, 5, 5, 13, 1];
        let tb = upload_weights(&*dev, t, &table, dim);
        let ib = up_u32(&*dev, &ids);
        let out = dev.alloc((ids.len() * dim * 4) as u64, 0, "out").unwrap();
        dev.enqueue(&Op::Embed {
            table: &tb,
            wtype: t,
            ids: &ib,
            out: &out,
            rows: ids.len() as u32,
            dim: dim as u32,
        })
        .unwrap();
        let tq = rounded(t, &table);
        let want: Vec<f32> = ids
            .iter()
            .flat_map(|&i| tq[i as usize * dim..(i as usize + 1) * dim].to_vec())
            .collect();
        assert_eq!(down(&*dev, &out, want.len()), want, "{t:?}");
    }
}

#[test]
fn rms_norm_silu_add_match_reference() {
    let Some(dev) = gpu(DeviceOptions::default()) else {
        return;
    };
    let mut rng = Rng::new(3);
    // Rows of one to several rounds of the workgroup's 1,024 values, ragged or not.
    for &(rows, dim) in &[(1, 1), (3, 40), (7, 129), (2, 300), (1, 2048), (3, 2051)] {
        let (x, y) = (rng.vec(rows * dim), rng.vec(rows * dim));
        let w = rng.vec(dim);
        // Alone, then behind the residual add it fuses (x += y in place, then the norm).
        for fused in [false, true] {
            let mut sum = x.clone();
            if fused {
                sum.iter_mut().zip(&y).for_each(|(a, b)| *a += b);
            }
            let mut want = sum.clone();
            strata_model::ops::rms_norm(&mut want, &w, 1e-6);
            let (xb, yb, wb) = (up(&*dev, &x), up(&*dev, &y), up(&*dev, &w));
            let out = dev.alloc((rows * dim * 4) as u64, 0, "out").unwrap();
            dev.enqueue(&Op::RmsNorm {
                x: &xb,
                residual: fused.then_some(&yb),
                w: &wb,
                out: &out,
                rows: rows as u32,
                dim: dim as u32,
                eps: 1e-6,
            })
            .unwrap();
            let e = max_err(&down(&*dev, &out, rows * dim), &want);
            assert!(e < 1e-5, "rms_norm {rows}x{dim}, add {fused}: {e}");
            assert_eq!(down(&*dev, &xb, rows * dim), sum, "x after the add");
        }
    }
    for n in [1usize, 63, 1000] {
        let (g, u) = (rng.vec(n), rng.vec(n));
        let mut want = g.clone();
        strata_model::ops::silu_mul(&mut want, &u);
        let (gb, ub) = (up(&*dev, &g), up(&*dev, &u));
        dev.enqueue(&Op::SiluMul {
            x: &gb,
            y: &ub,
            n: n as u32,
        })
        .unwrap();
        assert!(max_err(&down(&*dev, &gb, n), &want) < 1e-6);
        // x += sigmoid(gate[row]) * y, rows of 3 (the last row partial when n % 3 != 0).
        let dim = 3;
        let gate = rng.vec(n.div_ceil(dim));
        let gtb = up(&*dev, &gate);
        let before = down(&*dev, &gb, n);
        dev.enqueue(&Op::Add {
            x: &gb,
            y: &ub,
            gate: Some(&gtb),
            n: n as u32,
            dim: dim as u32,
        })
        .unwrap();
        let want: Vec<f32> = (0..n)
            .map(|i| before[i] + strata_model::ops::sigmoid(gate[i / dim]) * u[i])
            .collect();
        assert!(max_err(&down(&*dev, &gb, n), &want) < 1e-6);
    }
}

/// RoPE against the CPU's, alone and fused behind a per-head RMSNorm (Qwen3's q_norm and
/// k_norm: one dispatch for both), over head widths past one workgroup's 64 invocations.
#[test]
fn rope_variants_match_reference() {
    let Some(dev) = gpu(DeviceOptions::default()) else {
        return;
    };
    let mut rng = Rng::new(4);
    let yarn = RopeScaling::Yarn {
        factor: 4.0,
        original_max_position_embeddings: 32.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attention_factor: 1.2,
        truncate: true,
        mscale_all_dim: 0.0,
    };
    // (style, head width, rotated dims, offset of the rotated part, scaling)
    let cases = [
        (RopeStyle::Neox, 12, 12, 0, RopeScaling::None),
        (RopeStyle::Neox, 12, 6, 0, RopeScaling::None),
        (RopeStyle::Interleaved, 10, 4, 6, yarn.clone()),
        (RopeStyle::Neox, 16, 16, 0, yarn),
        (RopeStyle::Neox, 192, 64, 128, RopeScaling::None),
        (RopeStyle::Interleaved, 256, 256, 0, RopeScaling::None),
    ];
    for (style, stride, dim, offset, scaling) in cases {
        let rope = Rope::new(&RopeConfig {
            theta: 10000.0,
            dim,
            style,
            scaling,
        });
        let (rows, heads, max_pos) = (5usize, 3usize, 40usize);
        let half = dim / 2;
        let mut table = Vec::new();
        let (mut c, mut s) = (vec![0.0; half], vec![0.0; half]);
        for p in 0..max_pos {
            rope.cos_sin(p, &mut c, &mut s);
            table.extend_from_slice(&c);
            table.extend_from_slice(&s);
        }
        let positions = [0u32, 1, 7, 39, 20];
        let x = rng.vec(rows * heads * stride);
        let gain: Vec<f32> = rng.vec(stride).iter().map(|g| 1.0 + g).collect();
        let eps = 1e-6;
        let (pb, tb, gb) = (
            up_u32(&*dev, &positions),
            up(&*dev, &table),
            up(&*dev, &gain),
        );
        for normed in [false, true] {
            let mut want = x.clone();
            for (r, row) in want.chunks_exact_mut(heads * stride).enumerate() {
                rope.cos_sin(positions[r] as usize, &mut c, &mut s);
                for h in row.chunks_exact_mut(stride) {
                    if normed {
                        let ms = h.iter().map(|v| v * v).sum::<f32>() / stride as f32;
                        let inv = 1.0 / (ms + eps).sqrt();
                        h.iter_mut().zip(&gain).for_each(|(v, g)| *v *= inv * g);
                    }
                    rope.apply(&mut h[offset..], &c, &s);
                }
            }
            let xb = up(&*dev, &x);
            dev.enqueue(&Op::Rope {
                x: &xb,
                positions: &pb,
                table: &tb,
                rows: rows as u32,
                n_heads: heads as u32,
                head_stride: stride as u32,
                offset: offset as u32,
                half: half as u32,
                kind: match style {
                    RopeStyle::Neox => RopeKind::Neox,
                    RopeStyle::Interleaved => RopeKind::Interleaved,
                },
                norm: normed.then_some((&gb, eps)),
            })
            .unwrap();
            let e = max_err(&down(&*dev, &xb, x.len()), &want);
            let tol = if normed { 1e-5 } else { 1e-6 };
            assert!(
                e < tol,
                "rope {style:?} dim {dim} of {stride}, norm {normed}: {e}"
            );
        }
    }
}

/// Plain causal GQA attention of `t` new rows at `start..` over `k, v: [ctx, kvh * hd]`.
#[allow(clippy::too_many_arguments)]
fn attention_ref(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    t: usize,
    start: usize,
    heads: usize,
    kvh: usize,
    hd: usize,
    window: usize,
    scale: f32,
) -> Vec<f32> {
    let mut out = vec![0.0; t * heads * hd];
    let kv_w = kvh * hd;
    for r in 0..t {
        let pos = start + r;
        let lo = if window > 0 {
            (pos + 1).saturating_sub(window)
        } else {
            0
        };
        for h in 0..heads {
            let g = h / (heads / kvh);
            let qr = &q[r * heads * hd + h * hd..][..hd];
            let mut sc: Vec<f32> = (lo..=pos)
                .map(|j| {
                    qr.iter()
                        .zip(&k[j * kv_w + g * hd..][..hd])
                        .map(|(a, b)| a * b)
                        .sum::<f32>()
                        * scale
                })
                .collect();
            strata_model::ops::softmax(&mut sc);
            for (j, p) in (lo..=pos).zip(&sc) {
                for d in 0..hd {
                    out[r * heads * hd + h * hd + d] += p * v[j * kv_w + g * hd + d];
                }
            }
        }
    }
    out
}

/// `v` as a KV cache stored as `t` (f16 through [`Op::CacheStore`], padded to an even
/// count), and the values as stored.
fn cache(dev: &dyn Device, v: &[f32], t: WeightType) -> (strata_accel::Buffer, Vec<f32>) {
    if t == WeightType::F32 {
        return (up(dev, v), v.to_vec());
    }
    let mut padded = v.to_vec();
    padded.resize(v.len().next_multiple_of(2), 0.0);
    let src = up(dev, &padded);
    let dst = dev
        .alloc(
            (2 * padded.len()).next_multiple_of(4) as u64,
            0,
            "f16 cache",
        )
        .unwrap();
    dev.enqueue(&Op::CacheStore {
        writes: &[CacheWrite {
            src: &src,
            from: 0,
            dst: &dst,
            at: 0,
            n: padded.len() as u64,
        }],
        cache: t,
    })
    .unwrap();
    let stored = v.iter().map(|x| half::f16::from_f32(*x).to_f32()).collect();
    (dst, stored)
}

#[test]
fn attention_prefill_and_decode_match_reference() {
    let Some(dev) = gpu(DeviceOptions::default()) else {
        return;
    };
    let mut rng = Rng::new(5);
    // (new rows, start position, heads, kv heads, head dim, window)
    for &(t, start, heads, kvh, hd, window) in &[
        (1, 0, 1, 1, 1, 0),
        (7, 0, 6, 2, 12, 0),
        (1, 150, 4, 2, 12, 0),
        (70, 3, 4, 1, 70, 0),
        (5, 90, 2, 2, 16, 40),
        (3, 10, 2, 1, 256, 0),
        // Decoding over long contexts splits them into ranges; a window empties some.
        (2, 300, 8, 2, 128, 0),
        (1, 1000, 4, 4, 64, 100),
        // Prefill's tiled kernel: 16 rows a workgroup, a partial last block, an offset, a
        // window, heads of 16 to 128.
        (40, 0, 4, 2, 64, 0),
        (33, 100, 2, 1, 128, 0),
        (20, 30, 2, 2, 16, 20),
        (16, 0, 8, 8, 32, 0),
    ] {
        for ct in [WeightType::F32, WeightType::F16] {
            let ctx = start + t;
            let (q, k, v) = (
                rng.vec(t * heads * hd),
                rng.vec(ctx * kvh * hd),
                rng.vec(ctx * kvh * hd),
            );
            let scale = 1.0 / (hd as f32).sqrt();
            let ((kb, k), (vb, v)) = (cache(&*dev, &k, ct), cache(&*dev, &v, ct));
            let want = attention_ref(&q, &k, &v, t, start, heads, kvh, hd, window, scale);
            let qb = up(&*dev, &q);
            let out = dev.alloc((want.len() * 4) as u64, 0, "out").unwrap();
            dev.enqueue(&Op::Attention {
                q: &qb,
                k: &kb,
                v: &vb,
                cache: ct,
                out: &out,
                n_tokens: t as u32,
                start_pos: start as u32,
                n_heads: heads as u32,
                n_kv_heads: kvh as u32,
                head_dim: hd as u32,
                window: window as u32,
                scale,
            })
            .unwrap();
            let e = max_err(&down(&*dev, &out, want.len()), &want);
            assert!(
                e < 1e-5,
                "attention t={t} start={start} hd={hd} {}: {e}",
                ct.name()
            );
        }
    }
}

/// `down(silu(gate x) * up x)` of one expert on the CPU.
pub fn expert_ref(x: &[f32], g: &[f32], u: &[f32], d: &[f32], h: usize, i: usize) -> Vec<f32> {
    let mut gx = vec![0.0; i];
    let mut ux = vec![0.0; i];
    strata_kernels::gemm::matmul_f32_ref(x, g, &mut gx, 1, i, h);
    strata_kernels::gemm::matmul_f32_ref(x, u, &mut ux, 1, i, h);
    strata_model::ops::silu_mul(&mut gx, &ux);
    let mut y = vec![0.0; h];
    strata_kernels::gemm::matmul_f32_ref(&gx, d, &mut y, 1, h, i);
    y
}

#[test]
fn grouped_experts_match_reference() {
    let Some(dev) = split_gpu() else { return };
    let mut rng = Rng::new(7);
    let (h, inter, n_exp, t, k) = (6usize, 5usize, 4usize, 9usize, 2usize);
    for wt in [WeightType::F32, WeightType::Bf16] {
        let slots = ExpertSlots::new(
            &*dev,
            n_exp as u32,
            h as u32,
            inter as u32,
            &[ExpertFormat::uniform(wt)],
        )
        .unwrap();
        let experts: Vec<[Vec<f32>; 3]> = (0..n_exp)
            .map(|_| [rng.vec(inter * h), rng.vec(inter * h), rng.vec(h * inter)])
            .collect();
        for (s, e) in experts.iter().enumerate() {
            slots
                .refill(&*dev, s as u32, wt, [&e[0], &e[1], &e[2]])
                .unwrap();
        }
        let x = rng.vec(t * h);
        // Routing: token r chooses experts (r % n, (r + 1 + r / 3) % n) with random weights.
        let ids: Vec<usize> = (0..t)
            .flat_map(|r| [r % n_exp, (r + 1 + r / 3) % n_exp])
            .collect();
        let weights = rng.vec(t * k);
        let mut order: Vec<usize> = (0..t * k).collect();
        order.sort_by_key(|&p| ids[p]);
        let pairs: Vec<u32> = order
            .iter()
            .flat_map(|&p| [(p / k) as u32, ids[p] as u32])
            .collect();
        let mut pair_of = vec![0u32; t * k];
        for (pi, &p) in order.iter().enumerate() {
            pair_of[p] = pi as u32;
        }
        let init = rng.vec(t * h);
        let mut want = init.clone();
        for r in 0..t {
            for j in 0..k {
                let e = &experts[ids[r * k + j]];
                let (g, u, d) = (rounded(wt, &e[0]), rounded(wt, &e[1]), rounded(wt, &e[2]));
                let y = expert_ref(&x[r * h..(r + 1) * h], &g, &u, &d, h, inter);
                for c in 0..h {
                    want[r * h + c] += weights[r * k + j] * y[c];
                }
            }
        }
        let (xb, pb, pob, wb, ob) = (
            up(&*dev, &x),
            up_u32(&*dev, &pairs),
            up_u32(&*dev, &pair_of),
            up(&*dev, &weights),
            up(&*dev, &init),
        );
        let np = t * k;
        let act = dev.alloc((np * inter * 4) as u64, 0, "act").unwrap();
        let y = dev.alloc((np * h * 4) as u64, 0, "y").unwrap();
        for (stage, input, out) in [(0, &xb, &act), (1, &act, &y)] {
            dev.enqueue(&Op::ExpertFfn {
                x: input,
                slots: &slots,
                format: ExpertFormat::uniform(wt),
                pairs: &pb,
                out,
                n_pairs: np as u32,
                experts: n_exp as u32,
                stage,
            })
            .unwrap();
        }
        dev.enqueue(&Op::MoeCombine {
            out: &ob,
            y: &y,
            weights: &wb,
            pair_of: &pob,
            tokens: t as u32,
            hidden: h as u32,
            k: k as u32,
            norm: None,
        })
        .unwrap();
        let e = max_err(&down(&*dev, &ob, t * h), &want);
        assert!(e < 1e-5, "grouped experts {wt:?}: {e}");
    }
}

/// MLA written out without absorption: per head, keys `W_UK c_j` (+ the shared rotary key)
/// and values `W_UV c_j` are materialised, then plain causal softmax attention.
#[allow(clippy::too_many_arguments)]
fn mla_ref(
    q: &[f32],
    lat: &[f32],
    kr: &[f32],
    wkvb: &[f32],
    t: usize,
    start: usize,
    heads: usize,
    (l, nope, rd, vd): (usize, usize, usize, usize),
    scale: f32,
) -> Vec<f32> {
    let qk = nope + rd;
    let mut out = vec![0.0; t * heads * vd];
    for h in 0..heads {
        let w = &wkvb[h * (nope + vd) * l..(h + 1) * (nope + vd) * l];
        let proj = |rows: std::ops::Range<usize>, c: &[f32]| -> Vec<f32> {
            rows.map(|r| (0..l).map(|i| w[r * l + i] * c[i]).sum())
                .collect()
        };
        let ctx = start + t;
        let keys: Vec<Vec<f32>> = (0..ctx)
            .map(|j| proj(0..nope, &lat[j * l..(j + 1) * l]))
            .collect();
        let vals: Vec<Vec<f32>> = (0..ctx)
            .map(|j| proj(nope..nope + vd, &lat[j * l..(j + 1) * l]))
            .collect();
        for r in 0..t {
            let pos = start + r;
            let qr = &q[r * heads * qk + h * qk..][..qk];
            let mut sc: Vec<f32> = (0..=pos)
                .map(|j| {
                    let a: f32 = qr[..nope].iter().zip(&keys[j]).map(|(x, y)| x * y).sum();
                    let b: f32 = qr[nope..]
                        .iter()
                        .zip(&kr[j * rd..(j + 1) * rd])
                        .map(|(x, y)| x * y)
                        .sum();
                    (a + b) * scale
                })
                .collect();
            strata_model::ops::softmax(&mut sc);
            for (j, p) in sc.iter().enumerate() {
                for d in 0..vd {
                    out[r * heads * vd + h * vd + d] += p * vals[j][d];
                }
            }
        }
    }
    out
}

#[test]
fn mla_attention_matches_unabsorbed_reference() {
    let Some(dev) = gpu(DeviceOptions::default()) else {
        return;
    };
    let mut rng = Rng::new(8);
    // (new rows, start, heads, latent, nope, rope, v)
    for &(t, start, heads, l, nope, rd, vd) in &[
        (1, 0, 1, 1, 1, 2, 1),
        (9, 0, 4, 22, 12, 10, 14),
        (1, 100, 3, 70, 5, 6, 9),
        (3, 4, 2, 512, 16, 64, 8),
        (2, 260, 2, 64, 8, 16, 8),
    ] {
        for ct in [WeightType::F32, WeightType::F16] {
            let ctx = start + t;
            let q = rng.vec(t * heads * (nope + rd));
            let (lb, lat) = cache(&*dev, &rng.vec(ctx * l), ct);
            let (kb, kr) = cache(&*dev, &rng.vec(ctx * rd), ct);
            let wkvb: Vec<f32> = rng
                .vec(heads * (nope + vd) * l)
                .iter()
                .map(|v| v * 0.3)
                .collect();
            let scale = 1.0 / ((nope + rd) as f32).sqrt();
            let want = mla_ref(
                &q,
                &lat,
                &kr,
                &wkvb,
                t,
                start,
                heads,
                (l, nope, rd, vd),
                scale,
            );
            let (qb, wb) = (up(&*dev, &q), up(&*dev, &wkvb));
            let out = dev.alloc((want.len() * 4) as u64, 0, "out").unwrap();
            dev.enqueue(&Op::MlaAttention {
                q: &qb,
                latent: &lb,
                k_rope: &kb,
                cache: ct,
                kv_b: &wb,
                out: &out,
                n_tokens: t as u32,
                start_pos: start as u32,
                n_heads: heads as u32,
                kv_lora: l as u32,
                nope: nope as u32,
                rope: rd as u32,
                v_dim: vd as u32,
                scale,
            })
            .unwrap();
            let e = max_err(&down(&*dev, &out, want.len()), &want);
            assert!(e < 1e-4, "mla t={t} start={start} l={l} {}: {e}", ct.name());
        }
    }
}
