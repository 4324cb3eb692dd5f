struct P { rows: u32, n_heads: u32, head_stride: u32, offset: u32, half: u32, interleaved: u32, _a: u32, _b: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> pos: array<u32>;
// [max_pos, 2 * half]: cos of every frequency, then sin (precomputed on the host, so every
// scaling variant (linear, Llama 3, YaRN with its attention factor) is one table).
@group(0) @binding(3) var<storage, read> cs: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = linear_id(gid, nwg);
    if (idx >= p.rows * p.n_heads * p.half) {
        return;
    }
    let i = idx % p.half;
    let head = (idx / p.half) % p.n_heads;
    let row = idx / (p.half * p.n_heads);
    let base = row * p.n_heads * p.head_stride + head * p.head_stride + p.offset;
    let t = pos[row] * 2u * p.half;
    let c = cs[t + i];
    let s = cs[t + p.half + i];
    var ia = base + i;
    var ib = base + i + p.half;
    if (p.interleaved != 0u) {
        ia = base + 2u * i;
        ib = ia + 1u;
    }
    let a = x[ia];
    let b = x[ib];
    x[ia] = a * c - b * s;
    x[ib] = b * c + a * s;
}
