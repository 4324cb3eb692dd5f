// For the kernels that dot decoded weight rows with activations `x` (read as vec4s): TM
// tokens (or expert pairs) per pass over a weight row, and the workgroup sums.

// Tokens (or expert pairs) a workgroup computes per pass over a weight row.
const TM: u32 = 8u;

// A row of `groups` groups of 32 is dotted in pieces of 8 / pieces_per_group(groups)
// vec4s, one piece per invocation: whole groups when the row has at least 32 (64
// invocations, at most one pass each), else halves, quarters or eighths, so that a short
// row still keeps most of the workgroup reading (a row of 768 values has 24 groups: 48
// invocations at work instead of 24).
fn pieces_per_group(groups: u32) -> u32 {
    var n = 1u;
    while (n < 8u && 2u * n * groups <= 64u) {
        n *= 2u;
    }
    return n;
}

// Group and first vec4 of piece `q` of a row, `per` pieces per group.
fn piece(q: u32, per: u32) -> vec2<u32> {
    return vec2<u32>(q / per, (q % per) * (8u / per));
}

// Dot product of vec4s i0 .. i0 + n of group `g` with the activations from vec4 `xo` on
// (the group's first).
fn dot_group(g: Group, xo: u32, i0: u32, n: u32) -> f32 {
    var d = 0.0;
    for (var i = i0; i < i0 + n; i++) {
        d += dot(values4(g, i), x[xo + i]);
    }
    return d;
}

// The same for four tokens' activations, from vec4s `xo` on (one offset per token): the
// values are decoded once for the four.
fn dot_group4(g: Group, xo: vec4<u32>, i0: u32, n: u32) -> vec4<f32> {
    var d = vec4<f32>(0.0);
    for (var i = i0; i < i0 + n; i++) {
        let v = values4(g, i);
        d += vec4<f32>(dot(v, x[xo.x + i]), dot(v, x[xo.y + i]), dot(v, x[xo.z + i]), dot(v, x[xo.w + i]));
    }
    return d;
}

// Per-invocation partial sums of up to 2 TM columns (stage 0 of the expert kernel keeps
// gate and up), by row: one row per lane group (`lanes_*.wgsl`).
var<workgroup> part: array<array<f32, 16>, 64>;

// Enters invocation `tid`'s value for column `c`: its lane group's sum, kept by the group's
// first invocation.
fn put_part(v: f32, c: u32, tid: u32, lanes: Lanes) {
    let s = lane_sum(v);
    if (lane_first(lanes)) {
        part[tid / lane_count(lanes)][c] = s;
    }
}

// After every invocation has entered its columns: sums all 16 columns over the lane groups
// in place, in a fixed tree (the result does not depend on timing); column c's total is
// then part[0][c], until the caller's next barrier.
fn column_sums(tid: u32, lanes: Lanes) {
    workgroupBarrier();
    let c = tid % 16u;
    let r = tid / 16u;
    for (var off = 32u / lane_count(lanes); off > 0u; off >>= 1u) {
        for (var rr = r; rr < off; rr += 4u) {
            part[rr][c] += part[rr + off][c];
        }
        workgroupBarrier();
    }
}
