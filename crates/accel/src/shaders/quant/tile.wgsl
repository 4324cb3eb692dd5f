// For the kernels that multiply 32 weight rows by 32 tokens (or expert pairs) at a time
// through workgroup memory, one group of 32 values of k per step: each group is decoded
// once per workgroup and serves 32 tokens, where the row kernels (`rows.wgsl`) decode it
// for every 8 (prefill's many tokens per weight then cost arithmetic, not decoding and
// reads). Invocation tid (64 per workgroup) stages a quarter of the tokens' values and half
// of one weight row's group, then computes rows tid % 8 + 8i and columns tid / 8 + 8j
// (i, j < 4): neighbouring invocations read neighbouring rows.

// Rows and columns of a tile.
const TILE: u32 = 32u;

// vec4s per staged row: a group's 8 and one of padding, so the rows that neighbouring
// invocations read at once fall in different memory banks.
const TILE_STRIDE: u32 = 9u;

// The staged group of the tile's columns (x) and of its weight rows (a; b: the second
// matrix of a pair, the expert kernel's up next to gate).
var<workgroup> tile_x: array<vec4<f32>, 288>;
var<workgroup> tile_a: array<vec4<f32>, 288>;
var<workgroup> tile_b: array<vec4<f32>, 288>;

// This invocation's sums: a_i (b_i) holds row tid % 8 + 8i against its 4 columns.
var<private> a0: vec4<f32>;
var<private> a1: vec4<f32>;
var<private> a2: vec4<f32>;
var<private> a3: vec4<f32>;
var<private> b0: vec4<f32>;
var<private> b1: vec4<f32>;
var<private> b2: vec4<f32>;
var<private> b3: vec4<f32>;

fn tile_clear() {
    a0 = vec4<f32>(0.0);
    a1 = a0;
    a2 = a0;
    a3 = a0;
    b0 = a0;
    b1 = a0;
    b2 = a0;
    b3 = a0;
}

// Stages group `g` of this invocation's four columns tid / 8 + 8j: `xo[j]` is the vec4
// offset in `x` of column j's row; a column not `live` (past the tile's end) stages zeros.
fn tile_stage_x(xo: vec4<u32>, live: vec4<bool>, g: u32, tid: u32) {
    let i = tid % 8u;
    for (var j = 0u; j < 4u; j++) {
        var v = vec4<f32>(0.0);
        if (live[j]) {
            v = x[xo[j] + 8u * g + i];
        }
        tile_x[(tid / 8u + 8u * j) * TILE_STRIDE + i] = v;
    }
}

// Stages half of group `g` of weight row `row0 + tid / 2` (rows of `rb` bytes from byte
// `base`; a row at or past `rows` stages zeros) into tile_a, or tile_b when `second`.
fn tile_stage_w(base: u32, rb: u32, row0: u32, rows: u32, g: u32, tid: u32, second: bool) {
    let r = tid / 2u;
    let h = 4u * (tid % 2u);
    var v0 = vec4<f32>(0.0);
    var v1 = v0;
    var v2 = v0;
    var v3 = v0;
    if (row0 + r < rows) {
        let gr = group(base + (row0 + r) * rb, g);
        v0 = values4(gr, h);
        v1 = values4(gr, h + 1u);
        v2 = values4(gr, h + 2u);
        v3 = values4(gr, h + 3u);
    }
    let o = r * TILE_STRIDE + h;
    if (second) {
        tile_b[o] = v0;
        tile_b[o + 1u] = v1;
        tile_b[o + 2u] = v2;
        tile_b[o + 3u] = v3;
    } else {
        tile_a[o] = v0;
        tile_a[o + 1u] = v1;
        tile_a[o + 2u] = v2;
        tile_a[o + 3u] = v3;
    }
}

// A weight row's staged vec4 `i` against this invocation's four columns' vec4 `i`.
fn dots(w: vec4<f32>, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(dot(w, x0), dot(w, x1), dot(w, x2), dot(w, x3));
}

// Adds the staged group's products to this invocation's sums (b_i too when `second`).
fn tile_fma(tid: u32, second: bool) {
    let r = tid % 8u;
    let c = tid / 8u;
    for (var i = 0u; i < 8u; i++) {
        let x0 = tile_x[c * TILE_STRIDE + i];
        let x1 = tile_x[(c + 8u) * TILE_STRIDE + i];
        let x2 = tile_x[(c + 16u) * TILE_STRIDE + i];
        let x3 = tile_x[(c + 24u) * TILE_STRIDE + i];
        a0 += dots(tile_a[r * TILE_STRIDE + i], x0, x1, x2, x3);
        a1 += dots(tile_a[(r + 8u) * TILE_STRIDE + i], x0, x1, x2, x3);
        a2 += dots(tile_a[(r + 16u) * TILE_STRIDE + i], x0, x1, x2, x3);
        a3 += dots(tile_a[(r + 24u) * TILE_STRIDE + i], x0, x1, x2, x3);
        if (second) {
            b0 += dots(tile_b[r * TILE_STRIDE + i], x0, x1, x2, x3);
            b1 += dots(tile_b[(r + 8u) * TILE_STRIDE + i], x0, x1, x2, x3);
            b2 += dots(tile_b[(r + 16u) * TILE_STRIDE + i], x0, x1, x2, x3);
            b3 += dots(tile_b[(r + 24u) * TILE_STRIDE + i], x0, x1, x2, x3);
        }
    }
}

// Row i (< 4) of this invocation's sums.
fn sums_a(i: u32) -> vec4<f32> {
    switch (i) {
        case 0u: { return a0; }
        case 1u: { return a1; }
        case 2u: { return a2; }
        default: { return a3; }
    }
}

fn sums_b(i: u32) -> vec4<f32> {
    switch (i) {
        case 0u: { return b0; }
        case 1u: { return b1; }
        case 2u: { return b2; }
        default: { return b3; }
    }
}
