struct P { rows: u32, src_width: u32, first: u32, width: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

// dst[r, c] = src[r, first + c] for c < width: a column range of every row, packed.
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    if (i >= p.rows * p.width) {
        return;
    }
    let r = i / p.width;
    dst[i] = src[r * p.src_width + p.first + i % p.width];
}
