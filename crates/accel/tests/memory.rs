//! Memory budget, pooled reuse, expert slot refills and upload/compute ordering.

mod common;

use common::{Rng, default_gpu, down, gpu, max_err, up, up_u32};
use strata_accel::{Device, DeviceOptions, Error, ExpertFormat, ExpertSlots, Op, WeightType};

#[test]
fn allocation_past_budget_fails_clearly_and_frees_return() {
    let Some(dev) = gpu(DeviceOptions {
        vram_budget: Some(1 << 20),
        ..DeviceOptions::default()
    }) else {
        return;
    };
    let a = dev.alloc(512 << 10, 0, "first").unwrap();
    let err = dev.alloc(600 << 10, 0, "second").unwrap_err();
    assert!(matches!(err, Error::OutOfBudget { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("second") && msg.contains("budget"), "{msg}");
    assert_eq!(
        dev.memory().live,
        512 << 10,
        "a failed allocation holds nothing"
    );
    drop(a);
    // The freed buffer is pooled; a different size evicts it to fit.
    let b = dev.alloc(600 << 10, 0, "second").unwrap();
    assert_eq!(dev.memory().live, 600 << 10);
    assert!(dev.memory().live + dev.memory().pooled <= 1 << 20);
    drop(b);
    // Same-size allocations reuse the pooled buffer: nothing grows over many rounds.
    for _ in 0..1000 {
        let c = dev.alloc(600 << 10, 0, "again").unwrap();
        drop(c);
    }
    let m = dev.memory();
    assert_eq!((m.live, m.pooled), (0, 600 << 10));
}

#[test]
fn dispatches_reuse_bind_groups_and_bind_the_buffers_they_name() {
    let Some(dev) = gpu(DeviceOptions {
        vram_budget: Some(700 << 10),
        ..DeviceOptions::default()
    }) else {
        return;
    };
    // The same dispatch on the same buffers, one submission each: one bind group.
    let n = 1000;
    let v: Vec<f32> = (0..n).map(|i| i as f32 * 0.01 - 3.0).collect();
    let (x, y) = (up(&*dev, &v), up(&*dev, &v));
    let before = dev.traffic();
    for _ in 0..50 {
        dev.enqueue(&Op::SiluMul {
            x: &x,
            y: &y,
            n: n as u32,
        })
        .unwrap();
        dev.synchronize().unwrap();
    }
    let t = dev.traffic().since(before);
    assert_eq!((t.dispatches, t.bind_groups), (50, 1));
    // New buffers every round, of two sizes under a budget that makes the pool destroy one of
    // the other size's pooled buffers: each dispatch must read and write the buffers it names.
    drop((x, y));
    for round in 0..40usize {
        let n = if round % 2 == 0 { 60_000 } else { 50_000 };
        let a: Vec<f32> = (0..n).map(|i| ((i + round) % 13) as f32 * 0.1).collect();
        let (x, y) = (up(&*dev, &a), up(&*dev, &a));
        dev.enqueue(&Op::SiluMul {
            x: &x,
            y: &y,
            n: n as u32,
        })
        .unwrap();
        let got = down(&*dev, &x, n);
        let want: Vec<f32> = a.iter().map(|&v| v / (1.0 + (-v).exp()) * v).collect();
        assert!(max_err(&got, &want) < 1e-5, "round {round}");
    }
}

#[test]
fn slots_refill_in_place_thousands_of_times() {
    let Some(dev) = default_gpu() else { return };
    let (h, inter) = (8u32, 6u32);
    let slots = ExpertSlots::new(
        &*dev,
        4,
        h,
        inter,
        &[ExpertFormat::uniform(WeightType::Bf16)],
    )
    .unwrap();
    let held = dev.memory();
    let n = (h * inter) as usize;
    let mut last = Vec::new();
    for i in 0..3000u32 {
        let v: Vec<f32> = (0..3 * n).map(|j| (i * 7 + j as u32) as f32).collect();
        let ev = slots
            .refill(
                &*dev,
                i % 4,
                WeightType::Bf16,
                [&v[..n], &v[n..2 * n], &v[2 * n..]],
            )
            .unwrap();
        if i % 500 == 0 {
            dev.wait(&ev).unwrap();
        }
        last = v;
    }
    dev.synchronize().unwrap();
    assert_eq!(dev.memory(), held, "refills allocate nothing");
    // Slot 3 holds the last refill, rounded to bf16.
    let bytes = dev
        .download(&slots.buffer, 3 * slots.slot_bytes, slots.slot_bytes)
        .unwrap();
    assert_eq!(bytes, WeightType::Bf16.encode(&last).unwrap());
    // Out-of-range slot or wrong size: an error, not a panic.
    assert!(
        slots
            .refill(
                &*dev,
                4,
                WeightType::Bf16,
                [&last[..n], &last[..n], &last[..n]]
            )
            .is_err()
    );
    assert!(
        slots
            .refill(
                &*dev,
                0,
                WeightType::Bf16,
                [&last[..1], &last[..n], &last[..n]]
            )
            .is_err()
    );
}

/// Runs one token through slot 0 and returns the expert's output `[h]`.
fn run_slot(
    dev: &dyn Device,
    slots: &ExpertSlots,
    x: &strata_accel::Buffer,
) -> strata_accel::Buffer {
    let pairs = up_u32(dev, &[0, 0]);
    let act = dev.alloc(slots.inter as u64 * 4, 0, "act").unwrap();
    let y = dev.alloc(slots.hidden as u64 * 4, 0, "y").unwrap();
    for (stage, input, out) in [(0, x, &act), (1, &act, &y)] {
        dev.enqueue(&Op::ExpertFfn {
            x: input,
            slots,
            format: ExpertFormat::uniform(WeightType::F32),
            pairs: &pairs,
            out,
            n_pairs: 1,
            experts: 1,
            stage,
        })
        .unwrap();
    }
    y
}

#[test]
fn upload_during_compute_is_ordered_with_kernels() {
    let Some(dev) = default_gpu() else { return };
    let mut rng = Rng::new(11);
    let (h, inter) = (128usize, 256usize);
    let slots = ExpertSlots::new(
        &*dev,
        1,
        h as u32,
        inter as u32,
        &[ExpertFormat::uniform(WeightType::F32)],
    )
    .unwrap();
    let a: Vec<Vec<f32>> = (0..3).map(|_| rng.vec(h * inter)).collect();
    let b: Vec<Vec<f32>> = (0..3).map(|_| rng.vec(h * inter)).collect();
    dev.wait(
        &slots
            .refill(&*dev, 0, WeightType::F32, [&a[0], &a[1], &a[2]])
            .unwrap(),
    )
    .unwrap();
    let x = rng.vec(h);
    let xb = up(&*dev, &x);

    // A long kernel in flight: attention of 64 rows over 1024 cached positions.
    let (t, ctx, hd) = (64usize, 1024usize, 64usize);
    let q = up(&*dev, &rng.vec(t * 4 * hd));
    let kv = up(&*dev, &rng.vec(ctx * hd));
    let out = dev.alloc((t * 4 * hd * 4) as u64, 0, "out").unwrap();
    dev.enqueue(&Op::Attention {
        cache: WeightType::F32,
        q: &q,
        k: &kv,
        v: &kv,
        out: &out,
        n_tokens: t as u32,
        start_pos: (ctx - t) as u32,
        n_heads: 4,
        n_kv_heads: 1,
        head_dim: hd as u32,
        window: 0,
        scale: 0.125,
    })
    .unwrap();
    let running = dev.submit().unwrap();
    // Issued before the refill: must read expert A.
    let ya = run_slot(&*dev, &slots, &xb);
    // The refill is issued while the attention kernel may still run.
    let refill = slots
        .refill(&*dev, 0, WeightType::F32, [&b[0], &b[1], &b[2]])
        .unwrap();
    // Issued after: must wait for the refill and read expert B, never a mix.
    let yb = run_slot(&*dev, &slots, &xb);
    dev.wait(&refill).unwrap();
    assert!(
        refill.is_done() && running.is_done(),
        "events complete in order"
    );
    let want_a = expert(&x, &a, h, inter);
    let want_b = expert(&x, &b, h, inter);
    assert!(
        max_err(&down(&*dev, &ya, h), &want_a) < 1e-4,
        "kernel before the refill saw the new expert"
    );
    assert!(
        max_err(&down(&*dev, &yb, h), &want_b) < 1e-4,
        "kernel after the refill did not see it"
    );
}

fn expert(x: &[f32], w: &[Vec<f32>], h: usize, inter: usize) -> Vec<f32> {
    let mut g = vec![0.0; inter];
    let mut u = vec![0.0; inter];
    strata_kernels::gemm::matmul_f32_ref(x, &w[0], &mut g, 1, inter, h);
    strata_kernels::gemm::matmul_f32_ref(x, &w[1], &mut u, 1, inter, h);
    strata_model::ops::silu_mul(&mut g, &u);
    let mut y = vec![0.0; h];
    strata_kernels::gemm::matmul_f32_ref(&g, &w[2], &mut y, 1, h, inter);
    y
}

#[test]
fn errors_not_panics() {
    let Some(dev) = default_gpu() else { return };
    let b = dev.alloc(64, 0, "small").unwrap();
    assert!(dev.download(&b, 32, 64).is_err());
    assert!(dev.upload(&b, 2, &[0; 4]).is_err());
    let err = dev
        .enqueue(&Op::Attention {
            cache: WeightType::F32,
            q: &b,
            k: &b,
            v: &b,
            out: &b,
            n_tokens: 1,
            start_pos: 0,
            n_heads: 1,
            n_kv_heads: 1,
            head_dim: 300,
            window: 0,
            scale: 1.0,
        })
        .unwrap_err();
    assert!(err.to_string().contains("256"), "{err}");
    assert!(strata_accel::parse_bytes("8G").unwrap() == 8 << 30);
    assert!(strata_accel::parse_bytes("1.5M").unwrap() == 3 << 19);
    assert!(strata_accel::parse_bytes("12 parsecs").is_err());
}

#[test]
fn download_is_async_and_ordered_with_later_kernels() {
    let Some(dev) = default_gpu() else { return };
    let v: Vec<f32> = (0..1000).map(|i| i as f32 * 0.01).collect();
    let b = up(&*dev, &v);
    let pending = dev.download_async(&b, 0, 4000).unwrap();
    let event = pending.event().clone();
    // Issued after the download: overwrites b, must not change what the download reads.
    let y = up(&*dev, &v);
    dev.enqueue(&Op::SiluMul {
        x: &b,
        y: &y,
        n: 1000,
    })
    .unwrap();
    let after = dev.submit().unwrap();
    let bytes = pending.wait().unwrap();
    assert!(event.is_done());
    let got: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(got, v);
    dev.wait(&after).unwrap();
    assert_ne!(down(&*dev, &b, 1000), v, "the later kernel ran");
}

/// Uploads between kernels are recorded with them: they cost no submission of their own,
/// the work before an upload does not see its bytes and the work after does; waiting on an
/// upload's event sends it. An upload past the staging belt's size (weights at load) is
/// submitted at once, still after the work recorded before it.
#[test]
fn uploads_go_with_the_next_submission_in_order() {
    let Some(dev) = default_gpu() else { return };
    let n = 1000usize;
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let first: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let second: Vec<f32> = (0..n).map(|i| -(i as f32)).collect();
    let x = up(&*dev, &first);
    dev.wait(&dev.submit().unwrap()).unwrap();
    let (a, b) = (up(&*dev, &first), up(&*dev, &first));
    let before = dev.traffic();
    dev.copy(&x, 0, &a, 0, 4 * n as u64).unwrap();
    let landed = dev.upload(&x, 0, &bytes(&second)).unwrap();
    dev.copy(&x, 0, &b, 0, 4 * n as u64).unwrap();
    // A buffer of a ragged length, written whole.
    let ragged = dev.alloc(7, 0, "ragged").unwrap();
    dev.upload(&ragged, 0, &[1, 2, 3, 4, 5, 6, 7]).unwrap();
    assert_eq!(dev.traffic().since(before).submissions, 0);
    dev.wait(&landed).unwrap();
    assert_eq!(dev.traffic().since(before).submissions, 1);
    assert_eq!(down(&*dev, &a, n), first, "the copy before the upload");
    assert_eq!(down(&*dev, &b, n), second, "the copy after the upload");
    assert_eq!(dev.download(&ragged, 0, 7).unwrap(), [1, 2, 3, 4, 5, 6, 7]);

    let big = 40usize << 20;
    let weights = dev.alloc(big as u64, 4, "big upload").unwrap();
    let pattern: Vec<u8> = (0..big).map(|i| (i % 251) as u8).collect();
    dev.copy(&x, 0, &a, 0, 4 * n as u64).unwrap();
    let before = dev.traffic();
    dev.upload(&weights, 0, &pattern).unwrap();
    assert_eq!(dev.traffic().since(before).submissions, 2);
    let got = dev.download(&weights, big as u64 - 4096, 4096).unwrap();
    assert_eq!(got, pattern[big - 4096..]);
}

/// Attention's partial states when a decoded token splits the context come from the pool:
/// within the device budget, refused by name past it.
#[test]
fn attention_scratch_counts_against_the_budget() {
    let Some((ok, scratch)) = split_attention_within(1 << 20) else {
        return;
    };
    ok.unwrap();
    assert!(
        scratch > 0,
        "the partial states were not taken from the pool"
    );
    let (refused, _) = split_attention_within(300 << 10).unwrap();
    let msg = refused.unwrap_err().to_string();
    assert!(msg.contains("attention partial states"), "{msg}");
}

/// One decoded token's attention over 1,024 positions (split into ranges) on a device of
/// `budget` bytes: its result and the bytes it took from the pool.
fn split_attention_within(budget: u64) -> Option<(Result<(), Error>, u64)> {
    let dev = gpu(DeviceOptions {
        vram_budget: Some(budget),
        ..DeviceOptions::default()
    })?;
    let mut rng = Rng::new(5);
    let (ctx, heads, hd) = (1024usize, 8usize, 64usize);
    let q = up(&*dev, &rng.vec(heads * hd));
    let kv = up(&*dev, &rng.vec(ctx * hd));
    let out = dev.alloc((heads * hd * 4) as u64, 0, "out").unwrap();
    let before = dev.memory().live;
    let r = dev.enqueue(&Op::Attention {
        cache: WeightType::F32,
        q: &q,
        k: &kv,
        v: &kv,
        out: &out,
        n_tokens: 1,
        start_pos: (ctx - 1) as u32,
        n_heads: heads as u32,
        n_kv_heads: 1,
        head_dim: hd as u32,
        window: 0,
        scale: 0.125,
    });
    Some((r, dev.memory().live - before))
}
