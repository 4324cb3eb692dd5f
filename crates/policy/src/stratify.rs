//! Expert-aware stratification (CoX-MoE, seed 001, section 4.3): cluster the prompts'
//! embeddings into strata with k-means, pick prototypes from each stratum in proportion
//! to its size, and pin the experts the prototypes' prefill activates most.
//!
//! Key functions: [`kmeans`] (k-means++ seeding, Lloyd iterations), [`prototypes`]
//! (proportional allocation by largest remainder, members nearest their centroid first),
//! [`pin_order`] / [`hit_ratio`] (the pinning and its evaluation) and [`random_pins`]
//! (the paper's random-selection baseline). The engine-driven part (embedding and
//! probing with the real model) lives in the command line (`strata stratify`).
//!
//! A key design decision: everything is deterministic for a given seed ([`SplitMix`],
//! ties broken by index), so a pinning computed offline is
//! reproducible and the tests can assert exact picks.

/// The generator of k-means seeding and random pinning.
pub use crate::rng::SplitMix;

fn dist2(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let d = (*x - *y) as f64;
            d * d
        })
        .sum()
}

/// A clustering of points.
#[derive(Debug, Clone, PartialEq)]
pub struct Clusters {
    /// `[k][dim]` centroids.
    pub centroids: Vec<Vec<f32>>,
    /// Cluster of each point.
    pub assign: Vec<usize>,
    /// Sum of squared distances of points to their centroids.
    pub inertia: f64,
}

fn nearest(p: &[f32], centroids: &[Vec<f32>]) -> (usize, f64) {
    let mut best = (0, f64::INFINITY);
    for (c, m) in centroids.iter().enumerate() {
        let d = dist2(p, m);
        if d < best.1 {
            best = (c, d);
        }
    }
    best
}

/// k-means with k-means++ seeding and at most `max_iter` Lloyd iterations; `k` is capped
/// at the number of points. Points must share one dimension.
pub fn kmeans(points: &[Vec<f32>], k: usize, max_iter: usize, seed: u64) -> Clusters {
    let n = points.len();
    let k = k.min(n);
    if k == 0 {
        return Clusters {
            centroids: Vec::new(),
            assign: vec![0; n],
            inertia: 0.0,
        };
    }
    let mut rng = SplitMix::new(seed);
    let mut centroids = vec![points[rng.below(n)].clone()];
    let mut d2: Vec<f64> = points.iter().map(|p| dist2(p, &centroids[0])).collect();
    while centroids.len() < k {
        let total: f64 = d2.iter().sum();
        let pick = if total > 0.0 {
            let mut u = rng.uniform() * total;
            let mut i = 0;
            while i + 1 < n && u >= d2[i] {
                u -= d2[i];
                i += 1;
            }
            i
        } else {
            rng.below(n)
        };
        centroids.push(points[pick].clone());
        for (d, p) in d2.iter_mut().zip(points) {
            *d = d.min(dist2(p, &centroids[centroids.len() - 1]));
        }
    }
    let dim = points[0].len();
    let mut assign = vec![usize::MAX; n];
    for _ in 0..max_iter.max(1) {
        let mut changed = false;
        for (a, p) in assign.iter_mut().zip(points) {
            let c = nearest(p, &centroids).0;
            if *a != c {
                *a = c;
                changed = true;
            }
        }
        if !changed {
            break;
        }
        let mut sums = vec![vec![0.0f64; dim]; k];
        let mut counts = vec![0usize; k];
        for (&a, p) in assign.iter().zip(points) {
            counts[a] += 1;
            for (s, x) in sums[a].iter_mut().zip(p) {
                *s += *x as f64;
            }
        }
        for c in 0..k {
            // An emptied cluster keeps its centroid.
            if counts[c] > 0 {
                centroids[c] = sums[c]
                    .iter()
                    .map(|s| (s / counts[c] as f64) as f32)
                    .collect();
            }
        }
    }
    let inertia = assign
        .iter()
        .zip(points)
        .map(|(&a, p)| dist2(p, &centroids[a]))
        .sum();
    Clusters {
        centroids,
        assign,
        inertia,
    }
}

/// Picks `n` prototypes, each cluster's share proportional to its size (largest
/// remainder; every non-empty cluster gets one when `n` allows), members nearest their
/// centroid first. Returns point indices, grouped by cluster.
pub fn prototypes(points: &[Vec<f32>], clusters: &Clusters, n: usize) -> Vec<usize> {
    let k = clusters.centroids.len();
    let total = points.len();
    let n = n.min(total);
    if k == 0 || n == 0 {
        return Vec::new();
    }
    let mut members = vec![Vec::new(); k];
    for (i, &a) in clusters.assign.iter().enumerate() {
        members[a].push(i);
    }
    let exact: Vec<f64> = members
        .iter()
        .map(|m| n as f64 * m.len() as f64 / total as f64)
        .collect();
    let mut quota: Vec<usize> = exact.iter().map(|x| x.floor() as usize).collect();
    let non_empty = members.iter().filter(|m| !m.is_empty()).count();
    if n >= non_empty {
        for (q, m) in quota.iter_mut().zip(&members) {
            if !m.is_empty() && *q == 0 {
                *q = 1;
            }
        }
    }
    let mut given: usize = quota.iter().sum();
    // Largest remainders first, then trim the smallest-remainder clusters if the minimum
    // of one overshot.
    let mut by_rem: Vec<usize> = (0..k).collect();
    by_rem.sort_by(|&a, &b| {
        (exact[b] - exact[b].floor())
            .total_cmp(&(exact[a] - exact[a].floor()))
            .then(a.cmp(&b))
    });
    for &c in by_rem.iter().cycle().take(k * (n + 1)) {
        if given >= n {
            break;
        }
        if quota[c] < members[c].len() {
            quota[c] += 1;
            given += 1;
        }
    }
    for &c in by_rem.iter().rev().cycle().take(k * (n + 1)) {
        if given <= n {
            break;
        }
        if quota[c] > 1 {
            quota[c] -= 1;
            given -= 1;
        }
    }
    let mut out = Vec::with_capacity(n);
    for (c, m) in members.iter_mut().enumerate() {
        let centroid = &clusters.centroids[c];
        m.sort_by(|&a, &b| {
            dist2(&points[a], centroid)
                .total_cmp(&dist2(&points[b], centroid))
                .then(a.cmp(&b))
        });
        out.extend(m.iter().take(quota[c]));
    }
    out
}

/// All `(layer, expert)` pairs by descending activation count, ties by layer then
/// expert: pinning the first `n` pins the `n` most activated experts.
pub fn pin_order(counts: &[Vec<u64>]) -> Vec<(usize, u32)> {
    let mut v: Vec<(usize, u32)> = counts
        .iter()
        .enumerate()
        .flat_map(|(l, c)| (0..c.len()).map(move |e| (l, e as u32)))
        .collect();
    v.sort_by(|a, b| {
        counts[b.0][b.1 as usize]
            .cmp(&counts[a.0][a.1 as usize])
            .then(a.cmp(b))
    });
    v
}

/// All `(layer, expert)` pairs layer by layer in turns: every layer's most activated
/// expert, then every layer's second, and so on (ties by count, then layer). Pinning a
/// prefix spreads the budget evenly over the layers, which suits a schedule whose layers
/// run one after another: the slowest layer's unpinned experts set the pace, not the
/// total hit count.
pub fn pin_order_balanced(counts: &[Vec<u64>]) -> Vec<(usize, u32)> {
    let mut rank = vec![0usize; counts.len()];
    let mut ranked: Vec<(usize, usize, u32)> = pin_per_layer(counts, usize::MAX)
        .into_iter()
        .map(|(l, e)| {
            rank[l] += 1;
            (rank[l] - 1, l, e)
        })
        .collect();
    ranked.sort_by(|a, b| {
        a.0.cmp(&b.0)
            .then(counts[b.1][b.2 as usize].cmp(&counts[a.1][a.2 as usize]))
            .then(a.1.cmp(&b.1))
    });
    ranked.into_iter().map(|(_, l, e)| (l, e)).collect()
}

/// The `n` most activated experts of every layer (a per-layer VRAM budget), ties by
/// expert id.
pub fn pin_per_layer(counts: &[Vec<u64>], n: usize) -> Vec<(usize, u32)> {
    counts
        .iter()
        .enumerate()
        .flat_map(|(l, c)| {
            let mut e: Vec<u32> = (0..c.len() as u32).collect();
            e.sort_by(|a, b| c[*b as usize].cmp(&c[*a as usize]).then(a.cmp(b)));
            e.into_iter().take(n).map(move |e| (l, e))
        })
        .collect()
}

/// `n` distinct experts drawn uniformly in every layer.
pub fn random_per_layer(
    n_layers: usize,
    n_experts: usize,
    n: usize,
    seed: u64,
) -> Vec<(usize, u32)> {
    (0..n_layers)
        .flat_map(|l| {
            random_pins(1, n_experts, n, seed.wrapping_add(l as u64))
                .into_iter()
                .map(move |(_, e)| (l, e))
        })
        .collect()
}

/// Share of all activations in `counts` whose expert is in `pinned`.
pub fn hit_ratio(counts: &[Vec<u64>], pinned: &[(usize, u32)]) -> f64 {
    let total: u64 = counts.iter().flatten().sum();
    if total == 0 {
        return 0.0;
    }
    let hits: u64 = pinned
        .iter()
        .filter_map(|&(l, e)| counts.get(l).and_then(|c| c.get(e as usize)))
        .sum();
    hits as f64 / total as f64
}

/// `n` distinct `(layer, expert)` pairs drawn uniformly (the paper's random selection).
pub fn random_pins(n_layers: usize, n_experts: usize, n: usize, seed: u64) -> Vec<(usize, u32)> {
    let mut all: Vec<(usize, u32)> = (0..n_layers)
        .flat_map(|l| (0..n_experts).map(move |e| (l, e as u32)))
        .collect();
    let mut rng = SplitMix::new(seed);
    let n = n.min(all.len());
    for i in 0..n {
        let j = i + rng.below(all.len() - i);
        all.swap(i, j);
    }
    all.truncate(n);
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blobs() -> Vec<Vec<f32>> {
        // Three well-separated blobs of 10, 20 and 30 points.
        let mut rng = SplitMix::new(3);
        let mut v = Vec::new();
        for (c, n) in [(0.0f32, 10), (100.0, 20), (-100.0, 30)] {
            for _ in 0..n {
                v.push(vec![
                    c + rng.uniform() as f32,
                    -c + rng.uniform() as f32,
                    rng.uniform() as f32,
                ]);
            }
        }
        v
    }

    #[test]
    fn kmeans_separates_blobs() {
        let p = blobs();
        for seed in 0..5 {
            let c = kmeans(&p, 3, 50, seed);
            // Every blob in exactly one cluster, all clusters distinct.
            let ids = [c.assign[0], c.assign[10], c.assign[30]];
            assert!(c.assign[..10].iter().all(|&a| a == ids[0]));
            assert!(c.assign[10..30].iter().all(|&a| a == ids[1]));
            assert!(c.assign[30..].iter().all(|&a| a == ids[2]));
            assert!(ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2]);
            assert!(c.inertia < 60.0 * 3.0, "inertia {}", c.inertia);
        }
    }

    #[test]
    fn kmeans_edge_cases() {
        assert!(kmeans(&[], 3, 10, 1).centroids.is_empty());
        let one = vec![vec![1.0f32, 2.0]];
        let c = kmeans(&one, 4, 10, 1);
        assert_eq!((c.centroids.len(), c.assign.clone()), (1, vec![0]));
        // Identical points: k capped, no NaN.
        let same = vec![vec![0.5f32; 2]; 5];
        let c = kmeans(&same, 3, 10, 1);
        assert_eq!(c.inertia, 0.0);
    }

    #[test]
    fn prototypes_are_proportional() {
        let p = blobs();
        let c = kmeans(&p, 3, 50, 1);
        let picks = prototypes(&p, &c, 12);
        assert_eq!(picks.len(), 12);
        let per = |lo: usize, hi: usize| picks.iter().filter(|&&i| i >= lo && i < hi).count();
        // 10/20/30 of 60 points -> 2/4/6 of 12.
        assert_eq!((per(0, 10), per(10, 30), per(30, 60)), (2, 4, 6));
        // Distinct picks.
        let mut s = picks.clone();
        s.sort();
        s.dedup();
        assert_eq!(s.len(), 12);
        // Small n still covers every stratum; n beyond the points is capped.
        let picks = prototypes(&p, &c, 3);
        assert_eq!(
            (
                per2(&picks, 0, 10),
                per2(&picks, 10, 30),
                per2(&picks, 30, 60)
            ),
            (1, 1, 1)
        );
        assert_eq!(prototypes(&p, &c, 100).len(), 60);
        // Fewer prototypes than clusters: exactly n.
        assert_eq!(prototypes(&p, &c, 2).len(), 2);
    }

    fn per2(picks: &[usize], lo: usize, hi: usize) -> usize {
        picks.iter().filter(|&&i| i >= lo && i < hi).count()
    }

    #[test]
    fn prototype_is_nearest_centroid() {
        let p = vec![vec![0.0f32], vec![1.0], vec![2.0], vec![10.0]];
        let c = Clusters {
            centroids: vec![vec![1.1]],
            assign: vec![0; 4],
            inertia: 0.0,
        };
        assert_eq!(prototypes(&p, &c, 1), vec![1]);
    }

    #[test]
    fn pinning_and_hit_ratio() {
        let counts = vec![vec![5u64, 0, 1], vec![2, 9, 3]];
        let order = pin_order(&counts);
        assert_eq!(&order[..3], &[(1, 1), (0, 0), (1, 2)]);
        assert!((hit_ratio(&counts, &order[..2]) - 14.0 / 20.0).abs() < 1e-12);
        assert_eq!(hit_ratio(&counts, &order), 1.0);
        assert_eq!(hit_ratio(&counts, &[]), 0.0);
        // Random pins: distinct, in range, reproducible.
        let r = random_pins(2, 3, 4, 9);
        assert_eq!(r, random_pins(2, 3, 4, 9));
        let mut s = r.clone();
        s.sort();
        s.dedup();
        assert_eq!(s.len(), 4);
        assert!(r.iter().all(|&(l, e)| l < 2 && e < 3));
        assert_eq!(random_pins(2, 3, 99, 1).len(), 6);
        // Per layer: the top n of each layer.
        assert_eq!(pin_per_layer(&counts, 1), vec![(0, 0), (1, 1)]);
        assert_eq!(
            pin_per_layer(&counts, 2),
            vec![(0, 0), (0, 2), (1, 1), (1, 2)]
        );
        // Balanced: each layer's first, then each layer's second.
        assert_eq!(
            &pin_order_balanced(&counts)[..4],
            &[(1, 1), (0, 0), (1, 2), (0, 2)]
        );
        let r = random_per_layer(2, 3, 2, 4);
        assert_eq!(r.len(), 4);
        assert_eq!(r.iter().filter(|p| p.0 == 0).count(), 2);
    }
}
