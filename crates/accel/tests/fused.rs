//! Kernels that do in one dispatch what took several, against the CPU or the unfused
//! kernels: KV cache stores (two writes per dispatch), column ranges of rows (one dispatch
//! for every row), the MoE combine with the next layer's norm.

mod common;

use common::{Rng, down, gpu, max_err, up, up_u32};
use strata_accel::{CacheWrite, DeviceOptions, Op, WeightType};

/// Keys and values of different widths stored at an offset in one dispatch (f16) or a copy
/// each (f32), as stored: the f16 halves rounded to nearest.
#[test]
fn cache_store_writes_keys_and_values_in_one_dispatch() {
    let Some(dev) = gpu(DeviceOptions::default()) else {
        return;
    };
    let mut rng = Rng::new(8);
    let (ka, va) = (rng.vec(3 * 8), rng.vec(3 * 6));
    for cache in [WeightType::F16, WeightType::F32] {
        let bytes = |n: usize| (n * if cache == WeightType::F16 { 2 } else { 4 }) as u64;
        let (kb, vb) = (up(&*dev, &ka), up(&*dev, &va));
        let kc = dev.alloc(bytes(40), 0, "k cache").unwrap();
        let vc = dev.alloc(bytes(30), 0, "v cache").unwrap();
        // Rows 1 and 2 of each (row 0 is another sequence's) at position 2 of the caches.
        let writes = [
            CacheWrite {
                src: &kb,
                from: 8,
                dst: &kc,
                at: 16,
                n: 16,
            },
            CacheWrite {
                src: &vb,
                from: 6,
                dst: &vc,
                at: 12,
                n: 12,
            },
        ];
        let before = dev.traffic();
        dev.enqueue(&Op::CacheStore {
            writes: &writes,
            cache,
        })
        .unwrap();
        if cache == WeightType::F16 {
            assert_eq!(dev.traffic().since(before).dispatches, 1);
        }
        for (c, src, w) in [(&kc, &ka, 8), (&vc, &va, 6)] {
            let raw = dev.download(c, 0, c.bytes()).unwrap();
            let got: Vec<f32> = match cache {
                WeightType::F16 => raw
                    .chunks_exact(2)
                    .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
                _ => raw
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            };
            let stored = |v: f32| match cache {
                WeightType::F16 => half::f16::from_f32(v).to_f32(),
                _ => v,
            };
            let want: Vec<f32> = src[w..].iter().map(|&v| stored(v)).collect();
            assert_eq!(&got[2 * w..4 * w], &want[..], "{cache:?} width {w}");
        }
    }
}

/// Column ranges of rows (MLA's split of its `kv_a` output), and a range past the rows
/// refused.
#[test]
fn copy_columns_packs_a_range_of_every_row() {
    let Some(dev) = gpu(DeviceOptions::default()) else {
        return;
    };
    let mut rng = Rng::new(6);
    let (rows, src_width) = (37usize, 11usize);
    let x = rng.vec(rows * src_width);
    let xb = up(&*dev, &x);
    for (first, width) in [(0usize, 8usize), (8, 3), (0, 11), (5, 1)] {
        let dst = dev.alloc((rows * width * 4) as u64, 0, "dst").unwrap();
        let op = |width: usize| Op::CopyColumns {
            src: &xb,
            src_width: src_width as u32,
            first: first as u32,
            dst: &dst,
            width: width as u32,
            rows: rows as u32,
        };
        dev.enqueue(&op(width)).unwrap();
        let want: Vec<f32> = x
            .chunks_exact(src_width)
            .flat_map(|r| r[first..first + width].to_vec())
            .collect();
        assert_eq!(down(&*dev, &dst, rows * width), want, "{first}..+{width}");
        let err = dev.enqueue(&op(src_width - first + 1)).unwrap_err();
        assert!(err.to_string().contains("copy_columns"), "{err}");
    }
}

/// The MoE combine followed by the next layer's norm in one dispatch: the residual rows bit
/// for bit as the combine alone writes them, the normalised rows as the norm kernel's.
#[test]
fn moe_combine_with_the_next_norm_equals_the_two_kernels() {
    let Some(dev) = gpu(DeviceOptions::default()) else {
        return;
    };
    let mut rng = Rng::new(12);
    for (t, h, k) in [(1usize, 2048usize, 8usize), (5, 130, 2), (2, 2051, 4)] {
        let (x, y) = (rng.vec(t * h), rng.vec(t * k * h));
        let weights = rng.vec(t * k);
        let gain = rng.vec(h);
        // Each (token, choice) reads a pair of another token's rows.
        let pair_of: Vec<u32> = (0..t * k).map(|i| ((i * 7 + 3) % (t * k)) as u32).collect();
        let (yb, wb, pb, gb) = (
            up(&*dev, &y),
            up(&*dev, &weights),
            up_u32(&*dev, &pair_of),
            up(&*dev, &gain),
        );
        let mut outs = Vec::new();
        for fused in [false, true] {
            let xb = up(&*dev, &x);
            let normed = dev.alloc((t * h * 4) as u64, 0, "normed").unwrap();
            dev.enqueue(&Op::MoeCombine {
                out: &xb,
                y: &yb,
                weights: &wb,
                pair_of: &pb,
                tokens: t as u32,
                hidden: h as u32,
                k: k as u32,
                norm: fused.then_some((&gb, &normed, 1e-6)),
            })
            .unwrap();
            if !fused {
                dev.enqueue(&Op::RmsNorm {
                    x: &xb,
                    residual: None,
                    w: &gb,
                    out: &normed,
                    rows: t as u32,
                    dim: h as u32,
                    eps: 1e-6,
                })
                .unwrap();
            }
            outs.push((down(&*dev, &xb, t * h), down(&*dev, &normed, t * h)));
        }
        assert_eq!(outs[0].0, outs[1].0, "residual rows, {t} x {h}");
        let e = max_err(&outs[1].1, &outs[0].1);
        assert!(e < 1e-6, "normalised rows, {t} x {h}: {e}");
    }
}
