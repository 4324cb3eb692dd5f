struct P { pairs_a: u32, at_a: u32, from_a: u32, pairs_b: u32, at_b: u32, from_b: u32, _a: u32, _b: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> src_a: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst_a: array<u32>;
@group(0) @binding(3) var<storage, read> src_b: array<f32>;
@group(0) @binding(4) var<storage, read_write> dst_b: array<u32>;

// Two writes in one dispatch (a layer's keys and values): dst's f16 pairs at..at + pairs =
// src's f32 values from `from` on, rounded to f16, two per word (element 0 in the low
// half, as the kernels' load_word reads them). Invocations below pairs_a do write a, the
// next pairs_b write b.
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    if (i < p.pairs_a) {
        let s = p.from_a + 2u * i;
        dst_a[p.at_a + i] = pack2x16float(vec2<f32>(src_a[s], src_a[s + 1u]));
    } else if (i < p.pairs_a + p.pairs_b) {
        let j = i - p.pairs_a;
        let s = p.from_b + 2u * j;
        dst_b[p.at_b + j] = pack2x16float(vec2<f32>(src_b[s], src_b[s + 1u]));
    }
}
