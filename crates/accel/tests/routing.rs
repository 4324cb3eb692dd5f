//! The routing kernels against the CPU: top-k (every router variant, up to 256 experts) and
//! the grouping of routed entries by expert.

mod common;

use common::{Rng, down, down_u32, gpu, max_err, up, up_u32};
use strata_accel::{DeviceOptions, Op, TopKParams};

#[test]
fn topk_matches_cpu_router() {
    use strata_model::config::{GroupLimit, GroupScore, RouterConfig, Scoring};
    let Some(dev) = gpu(DeviceOptions::default()) else {
        return;
    };
    let mut rng = Rng::new(6);
    let base = RouterConfig {
        n_experts: 8,
        top_k: 3,
        scoring: Scoring::Softmax,
        correction_bias: false,
        groups: None,
        norm_topk_prob: false,
        scaling_factor: 1.0,
    };
    let mut cases = vec![base.clone()];
    cases.push(RouterConfig {
        norm_topk_prob: true,
        n_experts: 1,
        top_k: 1,
        ..base.clone()
    });
    cases.push(RouterConfig {
        scoring: Scoring::Sigmoid,
        correction_bias: true,
        groups: Some(GroupLimit {
            n_group: 2,
            topk_group: 1,
            group_score: GroupScore::Top2Sum,
        }),
        norm_topk_prob: true,
        scaling_factor: 1.8,
        ..base.clone()
    });
    // Qwen3-MoE's and DeepSeek-V3's routers: several experts per invocation.
    let qwen3 = RouterConfig {
        n_experts: 128,
        top_k: 8,
        norm_topk_prob: true,
        ..base.clone()
    };
    let groups = Some(GroupLimit {
        n_group: 8,
        topk_group: 4,
        group_score: GroupScore::Top2Sum,
    });
    let v3 = RouterConfig {
        n_experts: 256,
        scoring: Scoring::Sigmoid,
        correction_bias: true,
        groups,
        scaling_factor: 2.5,
        ..qwen3.clone()
    };
    cases.extend([qwen3, v3]);
    cases.push(RouterConfig {
        n_experts: 60,
        top_k: 4,
        groups: Some(GroupLimit {
            n_group: 4,
            topk_group: 2,
            group_score: GroupScore::Max,
        }),
        ..base
    });
    // Each router on spread logits and on logits of a few values (ties everywhere: the
    // lower index goes first, as on the CPU).
    let cases = cases
        .into_iter()
        .flat_map(|c| [(c.clone(), false), (c, true)]);
    for (cfg, tied) in cases {
        let (t, n, k) = (13usize, cfg.n_experts, cfg.top_k);
        let logits: Vec<f32> = rng.vec(t * n).iter().map(|v| v * 4.0).collect();
        let logits = match tied {
            true => logits.iter().map(|v| v.round() / 2.0).collect(),
            false => logits,
        };
        let bias = rng.vec(n);
        let want = strata_model::routing::route(&cfg, &logits, Some(&bias));
        let (lb, bb) = (up(&*dev, &logits), up(&*dev, &bias));
        let ids = dev.alloc((t * k * 4) as u64, 0, "ids").unwrap();
        let w = dev.alloc((t * k * 4) as u64, 0, "weights").unwrap();
        dev.enqueue(&Op::TopK {
            logits: &lb,
            bias: cfg.correction_bias.then_some(&bb),
            ids: &ids,
            weights: &w,
            tokens: t as u32,
            params: TopKParams {
                n_experts: n as u32,
                k: k as u32,
                sigmoid: cfg.scoring == Scoring::Sigmoid,
                groups: cfg.groups.map(|g| {
                    (
                        g.n_group as u32,
                        g.topk_group as u32,
                        g.group_score == GroupScore::Top2Sum,
                    )
                }),
                norm: cfg.norm_topk_prob,
                scaling: cfg.scaling_factor,
            },
        })
        .unwrap();
        assert_eq!(
            down_u32(&*dev, &ids, t * k),
            want.ids,
            "{cfg:?}, tied {tied}"
        );
        assert!(
            max_err(&down(&*dev, &w, t * k), &want.weights) < 1e-5,
            "{cfg:?}, tied {tied}"
        );
    }
}

/// Routed entries grouped by expert on the device equal a stable sort by expert on the
/// host, also with more experts than the kernel's 256 invocations; past the limit, an error.
#[test]
fn moe_group_is_a_stable_sort_by_expert() {
    let Some(dev) = gpu(DeviceOptions::default()) else {
        return;
    };
    let mut seed = 5u64;
    for (tokens, k, n_experts) in [
        (1usize, 8usize, 128u32),
        (7, 2, 8),
        (300, 8, 300),
        (64, 6, 1024),
    ] {
        let ids: Vec<u32> = (0..tokens * k)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                // Few distinct experts in the small case, so runs are long.
                ((seed >> 33) as u32) % n_experts.min(if tokens == 7 { 3 } else { n_experts })
            })
            .collect();
        let n = ids.len();
        let (ib, pairs, pair_of) = (
            up_u32(&*dev, &ids),
            dev.alloc((8 * n) as u64, 0, "pairs").unwrap(),
            dev.alloc((4 * n) as u64, 0, "pair_of").unwrap(),
        );
        dev.enqueue(&Op::MoeGroup {
            ids: &ib,
            pairs: &pairs,
            pair_of: &pair_of,
            tokens: tokens as u32,
            k: k as u32,
            n_experts,
        })
        .unwrap();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&p| ids[p]);
        let want_pairs: Vec<u32> = order
            .iter()
            .flat_map(|&p| [(p / k) as u32, ids[p]])
            .collect();
        let mut want_of = vec![0u32; n];
        for (pos, &p) in order.iter().enumerate() {
            want_of[p] = pos as u32;
        }
        assert_eq!(
            down_u32(&*dev, &pairs, 2 * n),
            want_pairs,
            "{tokens}x{k} over {n_experts}"
        );
        assert_eq!(
            down_u32(&*dev, &pair_of, n),
            want_of,
            "{tokens}x{k} over {n_experts}"
        );
    }
    let b = dev.alloc(64, 0, "ids").unwrap();
    let err = dev
        .enqueue(&Op::MoeGroup {
            ids: &b,
            pairs: &b,
            pair_of: &b,
            tokens: 1,
            k: 1,
            n_experts: strata_accel::MOE_GROUP_MAX_EXPERTS + 1,
        })
        .unwrap_err();
    assert!(err.to_string().contains("experts grouped"), "{err}");
}
