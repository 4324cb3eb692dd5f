struct P {
    tokens: u32, n_experts: u32, k: u32, sigmoid: u32,
    has_bias: u32, n_group: u32, topk_group: u32, top2: u32,
    norm: u32, scaling: f32, _a: u32, _b: u32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> ids: array<u32>;
@group(0) @binding(4) var<storage, read_write> weights: array<f32>;

const MAX_E: u32 = 256u;
// Below every score and below the masked value of excluded groups.
const TAKEN: f32 = -3.4e38;

// One invocation per token: scores (softmax or sigmoid), bias-corrected choice, optional
// group-limited selection (max or top-2 sum per group), top-k with ties to the lower index,
// renormalisation and scaling; the same steps as the CPU router, in the same order.
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = linear_id(gid, nwg);
    if (t >= p.tokens) {
        return;
    }
    let n = p.n_experts;
    let base = t * n;
    var scores: array<f32, MAX_E>;
    var choice: array<f32, MAX_E>;
    if (p.sigmoid != 0u) {
        for (var e = 0u; e < n; e++) {
            scores[e] = 1.0 / (1.0 + exp(-logits[base + e]));
        }
    } else {
        var mx = NEG_BIG;
        for (var e = 0u; e < n; e++) {
            mx = max(mx, logits[base + e]);
        }
        var sum = 0.0;
        for (var e = 0u; e < n; e++) {
            scores[e] = exp(logits[base + e] - mx);
            sum += scores[e];
        }
        for (var e = 0u; e < n; e++) {
            scores[e] /= sum;
        }
    }
    for (var e = 0u; e < n; e++) {
        choice[e] = scores[e];
        if (p.has_bias != 0u) {
            choice[e] += bias[e];
        }
    }
    if (p.n_group > 1u) {
        let size = n / p.n_group;
        var gscore: array<f32, MAX_E>;
        for (var g = 0u; g < p.n_group; g++) {
            var a = NEG_BIG;
            var b = NEG_BIG;
            for (var e = g * size; e < (g + 1u) * size; e++) {
                let v = choice[e];
                if (v > a) {
                    b = a;
                    a = v;
                } else if (v > b) {
                    b = v;
                }
            }
            if (p.top2 != 0u && size > 1u) {
                gscore[g] = a + b;
            } else {
                gscore[g] = a;
            }
        }
        var keep: array<u32, MAX_E>;
        for (var g = 0u; g < p.n_group; g++) {
            keep[g] = 0u;
        }
        for (var r = 0u; r < p.topk_group; r++) {
            var best = 0u;
            var bv = TAKEN;
            for (var g = 0u; g < p.n_group; g++) {
                if (keep[g] == 0u && gscore[g] > bv) {
                    bv = gscore[g];
                    best = g;
                }
            }
            keep[best] = 1u;
        }
        for (var e = 0u; e < n; e++) {
            if (keep[e / size] == 0u) {
                choice[e] = NEG_BIG;
            }
        }
    }
    var sum = 0.0;
    for (var r = 0u; r < p.k; r++) {
        var best = 0u;
        var bv = TAKEN;
        for (var e = 0u; e < n; e++) {
            if (choice[e] > bv) {
                bv = choice[e];
                best = e;
            }
        }
        choice[best] = TAKEN;
        ids[t * p.k + r] = best;
        weights[t * p.k + r] = scores[best];
        sum += scores[best];
    }
    if (p.sigmoid != 0u) {
        sum += 1e-20;
    }
    for (var r = 0u; r < p.k; r++) {
        var w = weights[t * p.k + r];
        if (p.norm != 0u) {
            w /= sum;
        }
        weights[t * p.k + r] = w * p.scaling;
    }
}
