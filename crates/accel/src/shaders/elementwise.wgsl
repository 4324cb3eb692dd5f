struct P { n: u32, dim: u32, op: u32, has_gate: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> y: array<f32>;
@group(0) @binding(3) var<storage, read> gate: array<f32>;

// op 0: x = silu(x) * y (SwiGLU); op 1: x += y, times sigmoid(gate[row]) when has_gate
// (Qwen2-MoE's gated shared expert; rows are `dim` wide).
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    if (i >= p.n) {
        return;
    }
    if (p.op == 0u) {
        let g = x[i];
        x[i] = g / (1.0 + exp(-g)) * y[i];
    } else {
        var s = 1.0;
        if (p.has_gate != 0u) {
            s = 1.0 / (1.0 + exp(-gate[i / p.dim]));
        }
        x[i] = x[i] + s * y[i];
    }
}
