struct P { tokens: u32, hidden: u32, k: u32, eps: f32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> y: array<f32>;
@group(0) @binding(3) var<storage, read> weights: array<f32>;
@group(0) @binding(4) var<storage, read> pair_of: array<u32>;
@group(0) @binding(5) var<storage, read> gain: array<f32>;
@group(0) @binding(6) var<storage, read_write> normed: array<f32>;

// The token's expert weights and rows of `y`, read once into workgroup memory: the column
// loop then issues its k loads of `y` back to back (a decoded token is one workgroup, so
// its loads' latency is the kernel's time).
var<workgroup> wk: array<f32, 64>;
var<workgroup> rowk: array<u32, 64>;

// `moe_combine.wgsl` (the same sums in the same order), then the next layer's RMSNorm of
// each updated row into `normed`, in one pass: one workgroup per token (k at most 64).
// Each invocation reads back only the values it wrote.
@compute @workgroup_size(64)
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
    var sq = 0.0;
    for (var c = l.x; c < p.hidden; c += 64u) {
        var s = 0.0;
        for (var j = 0u; j < p.k; j++) {
            s += wk[j] * y[rowk[j] + c];
        }
        let v = out[base + c] + s;
        out[base + c] = v;
        sq += v * v;
    }
    let inv = rms_factor(sq, l.x, p.hidden, p.eps);
    for (var c = l.x; c < p.hidden; c += 64u) {
        normed[base + c] = out[base + c] * inv * gain[c];
    }
}
