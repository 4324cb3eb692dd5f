struct P { rows: u32, dim: u32, r0: u32, r1: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> table: array<u32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

// out[t, :] = table[ids[t], :] for the ids held by this chunk of the table (rows r0..r1).
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    if (i >= p.rows * p.dim) {
        return;
    }
    let t = i / p.dim;
    let c = i % p.dim;
    let id = ids[t];
    if (id < p.r0 || id >= p.r1) {
        return;
    }
    let e = (id - p.r0) * p.dim + c;
    out[i] = load_word(table[word_index(e)], e);
}
