struct P { tokens: u32, hidden: u32, k: u32, eps: f32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> y: array<f32>;
@group(0) @binding(3) var<storage, read> weights: array<f32>;
@group(0) @binding(4) var<storage, read> pair_of: array<u32>;
@group(0) @binding(5) var<storage, read> gain: array<f32>;
@group(0) @binding(6) var<storage, read_write> normed: array<f32>;

// The token's expert weights and rows of `y`, read once into workgroup memory.
var<workgroup> wk: array<f32, 64>;
var<workgroup> rowk: array<u32, 64>;

// Adds the experts' weighted outputs to column c of the row at `base` (`moe_combine.wgsl`'s
// sum, in routing order) and returns the new value; c past the row is left alone (0).
fn store_combined(base: u32, c: u32, s: f32) -> f32 {
    if (c >= p.hidden) {
        return 0.0;
    }
    let v = out[base + c] + s;
    out[base + c] = v;
    return v;
}

// `moe_combine.wgsl` (the same sums in the same order), then the next layer's RMSNorm of
// each updated row into `normed`, in one pass: one workgroup of 256 per token (k at most 64),
// each invocation four columns 256 apart at a time, so a decoded token's single workgroup
// has four independent sums in flight and a row of 2,048 takes two rounds (with 64
// invocations eight: 42 us a call on an H200). Each invocation reads back only the values
// it wrote.
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) l: vec3<u32>) {
    let t = wg.y * nwg.x + wg.x;
    if (t >= p.tokens) {
        return;
    }
    let base = t * p.hidden;
    if (l.x < p.k) {
        wk[l.x] = weights[t * p.k + l.x];
        rowk[l.x] = pair_of[t * p.k + l.x] * p.hidden;
    }
    workgroupBarrier();
    var sq = vec4<f32>(0.0);
    for (var c = l.x; c < p.hidden; c += 1024u) {
        let cs = vec4<u32>(c, c + 256u, c + 512u, c + 768u);
        // Columns past the row read the last one and are not stored.
        let at = min(cs, vec4<u32>(p.hidden - 1u));
        var s = vec4<f32>(0.0);
        for (var j = 0u; j < p.k; j++) {
            let r = rowk[j];
            s += wk[j] * vec4<f32>(y[r + at.x], y[r + at.y], y[r + at.z], y[r + at.w]);
        }
        let v = vec4<f32>(
            store_combined(base, cs.x, s.x),
            store_combined(base, cs.y, s.y),
            store_combined(base, cs.z, s.z),
            store_combined(base, cs.w, s.w),
        );
        sq += v * v;
    }
    let inv = rms_factor(sq.x + sq.y + sq.z + sq.w, l.x, 256u, p.hidden, p.eps);
    for (var c = l.x; c < p.hidden; c += 1024u) {
        // The four loads first, then the stores (past the row: the last value, not stored).
        let cs = vec4<u32>(c, c + 256u, c + 512u, c + 768u);
        let at = min(cs, vec4<u32>(p.hidden - 1u));
        let v = vec4<f32>(out[base + at.x], out[base + at.y], out[base + at.z], out[base + at.w]);
        let o = v * inv * vec4<f32>(gain[at.x], gain[at.y], gain[at.z], gain[at.w]);
        put_normed(base, cs.x, o.x);
        put_normed(base, cs.y, o.y);
        put_normed(base, cs.z, o.z);
        put_normed(base, cs.w, o.w);
    }
}

fn put_normed(base: u32, c: u32, v: f32) {
    if (c < p.hidden) {
        normed[base + c] = v;
    }
}
