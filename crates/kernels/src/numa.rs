//! Splitting experts across NUMA nodes without duplicating weights.
//!
//! Each expert's intermediate dimension is cut into one contiguous range per node: node `i`
//! holds gate and up rows `range_i` and down columns `range_i`, computes a full-width partial
//! output for every token routed to the expert, and the partials of all nodes are summed
//! (SiLU(gate) * up is elementwise in the intermediate dimension, so the split is exact up to
//! the activation rounding each node applies to its own slice). This is KTransformers' scheme;
//! duplicating experts per node instead doubles memory, the top complaint of its users.
//!
//! The functions here are pure; the runtime packs each node's slices into an [`MoeExperts`]
//! on that node and runs [`crate::moe::fused_moe_with`] with `accumulate` on all but the first.
//!
//! [`MoeExperts`]: crate::moe::MoeExperts

use std::ops::Range;

/// Splits `inter` into `nodes` contiguous ranges, each a multiple of `align` (except the
/// last, which takes the remainder), as equal as `align` allows. Empty ranges appear only when
/// there are more nodes than aligned blocks.
pub fn split_intermediate(inter: usize, nodes: usize, align: usize) -> Vec<Range<usize>> {
    let nodes = nodes.max(1);
    let align = align.max(1);
    let blocks = inter.div_ceil(align);
    let mut v = Vec::with_capacity(nodes);
    let mut start_block = 0;
    for i in 0..nodes {
        let end_block = blocks * (i + 1) / nodes;
        let start = (start_block * align).min(inter);
        let end = (end_block * align).min(inter);
        v.push(start..end);
        start_block = end_block;
    }
    v
}

/// One node's slice of an expert: `gate` and `up` `[len, hidden]`, `down` `[hidden, len]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertSlice<T> {
    /// Gate rows of the slice.
    pub gate: Vec<T>,
    /// Up rows of the slice.
    pub up: Vec<T>,
    /// Down columns of the slice, row-major `[hidden, len]`.
    pub down: Vec<T>,
    /// Intermediate size of the slice.
    pub inter: usize,
}

/// Cuts row-major `gate`/`up` `[inter, hidden]` and `down` `[hidden, inter]` along `ranges`.
pub fn split_expert<T: Copy>(
    gate: &[T],
    up: &[T],
    down: &[T],
    hidden: usize,
    inter: usize,
    ranges: &[Range<usize>],
) -> Vec<ExpertSlice<T>> {
    ranges
        .iter()
        .map(|r| ExpertSlice {
            gate: gate[r.start * hidden..r.end * hidden].to_vec(),
            up: up[r.start * hidden..r.end * hidden].to_vec(),
            down: (0..hidden)
                .flat_map(|row| {
                    down[row * inter + r.start..row * inter + r.end]
                        .iter()
                        .copied()
                })
                .collect(),
            inter: r.len(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::moe::{Expert, MoeExperts, MoeOptions, fused_moe, fused_moe_with};
    use crate::packed::PackedFormat;
    use crate::packed::tests::rand_vec;

    #[test]
    fn ranges_cover_the_dimension_aligned() {
        for (inter, nodes, align) in [
            (768, 2, 16),
            (100, 3, 16),
            (10, 4, 16),
            (0, 2, 16),
            (64, 1, 32),
        ] {
            let r = split_intermediate(inter, nodes, align);
            assert_eq!(r.len(), nodes);
            assert_eq!(r[0].start, 0);
            assert_eq!(r[nodes - 1].end, inter);
            for w in r.windows(2) {
                assert_eq!(w[0].end, w[1].start);
                assert!(w[0].end.is_multiple_of(align) || w[0].end == inter);
            }
        }
        assert_eq!(split_intermediate(768, 2, 16), vec![0..384, 384..768]);
    }

    #[test]
    fn two_fake_nodes_sum_to_the_whole_layer() {
        let mut seed = 77;
        let (h, inter, n_exp, t, k) = (64, 80, 3, 7, 2);
        let mut whole = Vec::new();
        let mut nodes: [Vec<Expert>; 2] = [Vec::new(), Vec::new()];
        let ranges = split_intermediate(inter, 2, 16);
        for _ in 0..n_exp {
            let g = rand_vec(inter * h, &mut seed);
            let u = rand_vec(inter * h, &mut seed);
            let d = rand_vec(h * inter, &mut seed);
            whole.push(Expert::pack(&g, &u, &d, h, inter, PackedFormat::Bf16).expect("packs"));
            for (node, s) in split_expert(&g, &u, &d, h, inter, &ranges)
                .into_iter()
                .enumerate()
            {
                let e = Expert::pack(&s.gate, &s.up, &s.down, h, s.inter, PackedFormat::Bf16);
                nodes[node].push(e.expect("packs"));
            }
        }
        let whole = MoeExperts::new(h, inter, whole).expect("shape");
        let [n0, n1] = nodes;
        let n0 = MoeExperts::new(h, ranges[0].len(), n0).expect("shape");
        let n1 = MoeExperts::new(h, ranges[1].len(), n1).expect("shape");
        let x = rand_vec(t * h, &mut seed);
        let ids: Vec<u32> = (0..t * k).map(|i| (i % n_exp) as u32).collect();
        let wts: Vec<f32> = (0..t * k).map(|i| 0.3 + 0.1 * (i % 4) as f32).collect();
        let mut want = vec![0.0; t * h];
        fused_moe(&whole, &x, &ids, &wts, &mut want).expect("valid");
        let mut got = vec![0.0; t * h];
        fused_moe(&n0, &x, &ids, &wts, &mut got).expect("valid");
        let acc = MoeOptions {
            accumulate: true,
            ..MoeOptions::default()
        };
        fused_moe_with(&n1, &x, &ids, &wts, &mut got, &acc).expect("valid");
        let scale = want.iter().fold(1e-3f32, |a, v| a.max(v.abs()));
        for (a, b) in want.iter().zip(&got) {
            // BF16 rounds each node's intermediate slice the same way as the whole: only f32
            // summation order differs.
            assert!((a - b).abs() <= 1e-4 * scale, "{a} vs {b}");
        }
    }
}
