struct P { rows: u32, dim: u32, r0: u32, r1: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

// out[t, 32 s .. 32 s + 32] = group s of row ids[t] of a quantized table, for the ids
// held by this chunk (rows r0..r1).
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    let groups = p.dim / 32u;
    if (i >= p.rows * groups) {
        return;
    }
    let t = i / groups;
    let s = i % groups;
    let id = ids[t];
    if (id < p.r0 || id >= p.r1) {
        return;
    }
    var v: array<f32, 32>;
    decode32((id - p.r0) * row_bytes(p.dim), s, &v);
    for (var j = 0u; j < 32u; j++) {
        out[t * p.dim + 32u * s + j] = v[j];
    }
}
