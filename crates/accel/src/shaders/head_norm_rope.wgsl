struct P { rows: u32, n_heads: u32, head_stride: u32, offset: u32, half: u32, interleaved: u32, eps: f32, _a: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> pos: array<u32>;
// [max_pos, 2 * half]: cos of every frequency, then sin (as in `rope.wgsl`).
@group(0) @binding(3) var<storage, read> cs: array<f32>;
// The norm's gain, one per value of a head.
@group(0) @binding(4) var<storage, read> w: array<f32>;

// `rope.wgsl` after an RMSNorm of every head (Qwen3's q_norm and k_norm) in one pass: one
// workgroup per (row, head). The norm reads the whole head before any value is written
// (`reduce_sum` ends on a barrier); then each invocation writes only the values it reads.
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) l: vec3<u32>) {
    let id = wg.y * nwg.x + wg.x;
    // Uniform across the workgroup, so the barriers below are reached by all or none.
    if (id >= p.rows * p.n_heads) {
        return;
    }
    let row = id / p.n_heads;
    let base = id * p.head_stride;
    var s = 0.0;
    for (var j = l.x; j < p.head_stride; j += 64u) {
        let v = x[base + j];
        s += v * v;
    }
    let inv = rms_factor(s, l.x, 64u, p.head_stride, p.eps);
    // Values outside the rotated span: only normalised.
    for (var j = l.x; j < p.head_stride; j += 64u) {
        if (j < p.offset || j >= p.offset + 2u * p.half) {
            x[base + j] = x[base + j] * inv * w[j];
        }
    }
    let t = pos[row] * 2u * p.half;
    for (var i = l.x; i < p.half; i += 64u) {
        var ja = p.offset + i;
        var jb = ja + p.half;
        if (p.interleaved != 0u) {
            ja = p.offset + 2u * i;
            jb = ja + 1u;
        }
        let a = x[base + ja] * inv * w[ja];
        let b = x[base + jb] * inv * w[jb];
        let c = cs[t + i];
        let sn = cs[t + p.half + i];
        x[base + ja] = a * c - b * sn;
        x[base + jb] = b * c + a * sn;
    }
}
