struct P { rows: u32, dim: u32, eps: f32, has_residual: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
// The residual added into x first, when `has_residual` (else a dummy, never read).
@group(0) @binding(4) var<storage, read> y: array<f32>;

// The square of element i of the row at `base` after the residual is added (written back);
// 0 past the row.
fn summed(base: u32, i: u32) -> f32 {
    if (i >= p.dim) {
        return 0.0;
    }
    var v = x[base + i];
    if (p.has_residual != 0u) {
        v += y[base + i];
        x[base + i] = v;
    }
    return v * v;
}

// One workgroup of 256 per row: x += y when there is a residual (written back), then
// out = x * w / sqrt(mean(x^2) + eps). Each invocation reads back only the sums it wrote.
// A decoded token's row is a single workgroup, whose loads' latency is the kernel's time:
// each invocation has four values 256 apart in flight at a time, and a row of 2,048 takes
// two such rounds (a workgroup of 64 took eight, 27 us a call on an H200).
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) l: vec3<u32>) {
    let row = wg.y * nwg.x + wg.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.dim;
    var s = vec4<f32>(0.0);
    for (var i = l.x; i < p.dim; i += 1024u) {
        s += vec4<f32>(summed(base, i), summed(base, i + 256u), summed(base, i + 512u),
                       summed(base, i + 768u));
    }
    let inv = rms_factor(s.x + s.y + s.z + s.w, l.x, 256u, p.dim, p.eps);
    for (var i = l.x; i < p.dim; i += 1024u) {
        // The four loads first, then the stores (past the row: the last value, not stored).
        let i4 = vec4<u32>(i, i + 256u, i + 512u, i + 768u);
        let at = min(i4, vec4<u32>(p.dim - 1u));
        let xv = vec4<f32>(x[base + at.x], x[base + at.y], x[base + at.z], x[base + at.w]);
        let o = xv * inv * vec4<f32>(w[at.x], w[at.y], w[at.z], w[at.w]);
        put(base, i4.x, o.x);
        put(base, i4.y, o.y);
        put(base, i4.z, o.z);
        put(base, i4.w, o.w);
    }
}

fn put(base: u32, i: u32, v: f32) {
    if (i < p.dim) {
        out[base + i] = v;
    }
}
