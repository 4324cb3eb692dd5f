use super::*;

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Softmax attention of one query over `keys` of the cache, in f64.
fn plain(q: &[f32], keys: &Range<usize>, cache: &KvBlocks, d: usize) -> Vec<f64> {
    let row = |c: &[f32], j: usize| c[j * cache.stride..][..d].to_vec();
    let s: Vec<f64> = keys
        .clone()
        .map(|j| {
            let k = row(cache.keys, j);
            q.iter().zip(&k).map(|(a, b)| *a as f64 * *b as f64).sum()
        })
        .collect();
    let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
    let total: f64 = e.iter().sum();
    let mut out = vec![0.0f64; d];
    for (j, w) in keys.clone().zip(&e) {
        for (o, v) in out.iter_mut().zip(row(cache.values, j)) {
            *o += w / total * v as f64;
        }
    }
    out
}

/// `attend` over a cache of 300 positions (three key blocks, keys growing along the cache so
/// the running maximum rises block after block), causal and windowed rows, against a plain
/// softmax in f64; and every row alone the same bits as within its task.
#[test]
fn attend_matches_a_plain_softmax_across_key_blocks() {
    let (d, group, positions) = (32, 3, 300);
    // Two key heads side by side and some padding; the second head is attended.
    let stride = 2 * d + 8;
    let mut seed = 5;
    let mut keys = values(positions * stride, &mut seed);
    for (j, row) in keys.chunks_exact_mut(stride).enumerate() {
        row.iter_mut().for_each(|v| *v *= 1.0 + j as f32 / 60.0);
    }
    let vals = values(positions * stride, &mut seed);
    let cache = KvBlocks {
        keys: &keys[d..],
        values: &vals[d..],
        stride,
    };
    for window in [None, Some(200), Some(40)] {
        let rows: Vec<Range<usize>> = (250..262)
            .map(|pos: usize| window.map_or(0, |w: usize| (pos + 1).saturating_sub(w))..pos + 1)
            .chain([0..1, 5..130])
            .collect();
        let qs = values(rows.len() * group * d, &mut seed);
        let out = attend(&qs, group, &rows, &cache);
        for (r, keys) in rows.iter().enumerate() {
            for h in 0..group {
                let at = (r * group + h) * d;
                let want = plain(&qs[at..at + d], keys, &cache, d);
                for (c, (got, want)) in out[at..at + d].iter().zip(&want).enumerate() {
                    assert!(
                        (*got as f64 - want).abs() <= 1e-5,
                        "window {window:?} row {r} head {h} value {c}: {got} vs {want}"
                    );
                }
            }
            let width = group * d;
            let alone = attend(
                &qs[r * width..][..width],
                group,
                std::slice::from_ref(keys),
                &cache,
            );
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&alone),
                bits(&out[r * width..][..width]),
                "window {window:?} row {r} alone"
            );
        }
    }
}
