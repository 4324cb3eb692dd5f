struct P { m: u32, k: u32, n0: u32, n_rows: u32, ldo: u32, has_bias: u32, _a: u32, _b: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

const TILE: u32 = 16u;
var<workgroup> xs: array<array<f32, 16>, 16>;
var<workgroup> ws: array<array<f32, 16>, 16>;

// out[r, n0 + c] = x[r, :] . w[c, :] (+ bias[n0 + c]) for the rows c of this weight chunk,
// 16x16 output tiles with both operands staged through workgroup memory.
@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>) {
    let row = wg.y * TILE + l.y;
    let col = wg.x * TILE + l.x;
    let wrow = wg.x * TILE + l.y;
    var acc = 0.0;
    for (var k0 = 0u; k0 < p.k; k0 += TILE) {
        let kk = k0 + l.x;
        var xv = 0.0;
        if (row < p.m && kk < p.k) {
            xv = x[row * p.k + kk];
        }
        xs[l.y][l.x] = xv;
        var wv = 0.0;
        if (wrow < p.n_rows && kk < p.k) {
            let e = wrow * p.k + kk;
            wv = load_word(w[word_index(e)], e);
        }
        ws[l.y][l.x] = wv;
        workgroupBarrier();
        for (var t = 0u; t < TILE; t++) {
            acc += xs[l.y][t] * ws[l.x][t];
        }
        workgroupBarrier();
    }
    if (row < p.m && col < p.n_rows) {
        if (p.has_bias != 0u) {
            acc += bias[p.n0 + col];
        }
        out[row * p.ldo + p.n0 + col] = acc;
    }
}
