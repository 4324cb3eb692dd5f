struct P { tokens: u32, hidden: u32, k: u32, _a: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> y: array<f32>;
@group(0) @binding(3) var<storage, read> weights: array<f32>;
@group(0) @binding(4) var<storage, read> pair_of: array<u32>;

// out[t, c] += sum_j weights[t, j] * y[pair_of[t, j], c]: each token sums its own experts'
// outputs in routing order, so the result does not depend on scheduling.
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    if (i >= p.tokens * p.hidden) {
        return;
    }
    let t = i / p.hidden;
    let c = i % p.hidden;
    var s = 0.0;
    for (var j = 0u; j < p.k; j++) {
        s += weights[t * p.k + j] * y[pair_of[t * p.k + j] * p.hidden + c];
    }
    out[i] += s;
}
