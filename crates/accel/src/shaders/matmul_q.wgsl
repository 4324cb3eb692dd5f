struct P { m: u32, k: u32, n0: u32, n_rows: u32, ldo: u32, has_bias: u32, _a: u32, _b: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

// out[t, n0 + r] = x[t, :] . w[r, :] (+ bias) for row r of this chunk of a quantized
// weight: one workgroup per row, whose 64 invocations take the row's groups of 32 in turn
// (adjacent invocations read adjacent bytes), decode each group once per TM tokens and
// dot it with them.
@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let r = wg.y * nwg.x + wg.x;
    if (r >= p.n_rows) {
        return;
    }
    let row = r * row_bytes(p.k);
    let groups = p.k / 32u;
    for (var t0 = 0u; t0 < p.m; t0 += TM) {
        var acc: array<f32, TM>;
        for (var s = tid; s < groups; s += 64u) {
            var v: array<f32, 32>;
            decode32(row, s, &v);
            for (var t = 0u; t < TM; t++) {
                if (t0 + t < p.m) {
                    acc[t] += dot32(&v, (t0 + t) * p.k + 32u * s);
                }
            }
        }
        let total = sum_tm(acc, tid);
        if (tid < TM && t0 + tid < p.m) {
            var y = total;
            if (p.has_bias != 0u) {
                y += bias[p.n0 + r];
            }
            out[(t0 + tid) * p.ldo + p.n0 + r] = y;
        }
    }
}
