// For the kernels that dot decoded weight rows with activations `x`: several tokens per
// pass and the workgroup sum.

// Tokens (or expert pairs) a workgroup computes per pass over a weight row: each decoded
// group of 32 weights is used TM times.
const TM: u32 = 8u;

// Dot product of 32 decoded weights with x[xo..xo + 32].
fn dot32(v: ptr<function, array<f32, 32>>, xo: u32) -> f32 {
    var d = 0.0;
    for (var i = 0u; i < 32u; i++) {
        d += (*v)[i] * x[xo + i];
    }
    return d;
}

var<workgroup> part: array<array<f32, 8>, 64>;

// Sums each of the TM values over the workgroup of 64: invocation t < TM returns sum t.
// Lane sums first (`lanes_*.wgsl`), then the leaders' partial sums in a fixed order, so
// the result does not depend on timing.
fn sum_tm(acc: array<f32, TM>, tid: u32) -> f32 {
    let leader = lane_leader(tid);
    for (var t = 0u; t < TM; t++) {
        let s = lane_sum(acc[t]);
        part[tid][t] = select(0.0, s, leader);
    }
    workgroupBarrier();
    var total = 0.0;
    if (tid < TM) {
        for (var i = 0u; i < 64u; i++) {
            total += part[i][tid];
        }
    }
    workgroupBarrier();
    return total;
}
