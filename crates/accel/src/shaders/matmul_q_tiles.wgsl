struct P { m: u32, k: u32, n0: u32, n_rows: u32, ldo: u32, has_bias: u32, _a: u32, _b: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

// out[t, n0 + r] = x[t, :] . w[r, :] (+ bias) for a tile of 32 rows r of this chunk of a
// quantized weight (workgroup x) and 32 tokens t (workgroup y), through `quant/tile.wgsl`.
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let row0 = wg.x * TILE;
    let t0 = wg.y * TILE;
    var xo = vec4<u32>(0u);
    var live = vec4<bool>(false);
    for (var j = 0u; j < 4u; j++) {
        let t = t0 + tid / 8u + 8u * j;
        live[j] = t < p.m;
        xo[j] = t * (p.k / 4u);
    }
    tile_clear();
    let rb = row_bytes(p.k);
    for (var g = 0u; g < p.k / 32u; g++) {
        tile_stage_x(xo, live, g, tid);
        tile_stage_w(0u, rb, row0, p.n_rows, g, tid, false);
        workgroupBarrier();
        tile_fma(tid, false);
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let r = row0 + tid % 8u + 8u * i;
        if (r >= p.n_rows) {
            continue;
        }
        var y = sums_a(i);
        if (p.has_bias != 0u) {
            y += bias[p.n0 + r];
        }
        for (var j = 0u; j < 4u; j++) {
            if (live[j]) {
                out[(t0 + tid / 8u + 8u * j) * p.ldo + p.n0 + r] = y[j];
            }
        }
    }
}
