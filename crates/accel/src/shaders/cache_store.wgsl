struct P { pairs: u32, at: u32, src_at: u32, _a: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;

// dst's f16 pairs at..at + pairs = src's f32 values from src_at on, rounded to f16, two
// per word (element 0 in the low half, as the kernels' load_word reads them).
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    if (i >= p.pairs) {
        return;
    }
    dst[p.at + i] = pack2x16float(vec2<f32>(src[p.src_at + 2u * i], src[p.src_at + 2u * i + 1u]));
}
