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

// Below every score and below the masked value of excluded groups.
const TAKEN: f32 = -3.4e38;

// One token's scores, choices (scores + bias, masked where groups are excluded), group
// scores and kept groups: experts are spread over the workgroup, e = invocation + 64 i.
var<workgroup> sw: array<f32, 256>;
var<workgroup> cw: array<f32, 256>;
var<workgroup> gsc: array<f32, 256>;
var<workgroup> keep: array<u32, 256>;
// The chosen experts and their scores, in rank order.
var<workgroup> chosen_i: array<u32, 256>;
var<workgroup> chosen_w: array<f32, 256>;

// Expert e's choice, NaN taken as the lowest value: ranks then order every expert.
fn choice(e: u32) -> f32 {
    let c = cw[e];
    return select(TAKEN, c, c == c);
}

// One workgroup per token: scores (softmax or sigmoid), bias-corrected choice, optional
// group-limited selection (max or top-2 sum per group), top-k with ties to the lower index,
// renormalisation and scaling; the CPU router's steps (the softmax's sums reduced in a
// tree rather than in expert order).
@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_id) li: vec3<u32>,
) {
    let t = wg.y * nwg.x + wg.x;
    if (t >= p.tokens) {
        return;
    }
    let tid = li.x;
    let n = p.n_experts;
    let base = t * n;
    if (p.sigmoid != 0u) {
        for (var e = tid; e < n; e += 64u) {
            sw[e] = 1.0 / (1.0 + exp(-logits[base + e]));
        }
    } else {
        var mx = NEG_BIG;
        for (var e = tid; e < n; e += 64u) {
            mx = max(mx, logits[base + e]);
        }
        mx = reduce_max(mx, tid);
        var sum = 0.0;
        for (var e = tid; e < n; e += 64u) {
            let v = exp(logits[base + e] - mx);
            sw[e] = v;
            sum += v;
        }
        sum = reduce_sum(sum, tid);
        for (var e = tid; e < n; e += 64u) {
            sw[e] /= sum;
        }
    }
    for (var e = tid; e < n; e += 64u) {
        var c = sw[e];
        if (p.has_bias != 0u) {
            c += bias[e];
        }
        cw[e] = c;
    }
    workgroupBarrier();
    if (p.n_group > 1u) {
        let size = n / p.n_group;
        for (var g = tid; g < p.n_group; g += 64u) {
            var a = NEG_BIG;
            var b = NEG_BIG;
            for (var e = g * size; e < (g + 1u) * size; e++) {
                let v = cw[e];
                if (v > a) {
                    b = a;
                    a = v;
                } else if (v > b) {
                    b = v;
                }
            }
            if (p.top2 != 0u && size > 1u) {
                gsc[g] = a + b;
            } else {
                gsc[g] = a;
            }
            keep[g] = 0u;
        }
        workgroupBarrier();
        if (tid == 0u) {
            for (var r = 0u; r < p.topk_group; r++) {
                var best = 0u;
                var bv = TAKEN;
                for (var g = 0u; g < p.n_group; g++) {
                    if (keep[g] == 0u && gsc[g] > bv) {
                        bv = gsc[g];
                        best = g;
                    }
                }
                keep[best] = 1u;
            }
        }
        workgroupBarrier();
        for (var e = tid; e < n; e += 64u) {
            if (keep[e / size] == 0u) {
                cw[e] = NEG_BIG;
            }
        }
        workgroupBarrier();
    }
    // Each expert's rank among the choices (larger first, ties to the lower index, as the
    // CPU router's scan takes them): the k best in order, in one pass over the workgroup's
    // copy (k rounds of an argmax over the workgroup took 16 us a token on an H200).
    for (var e = tid; e < n; e += 64u) {
        let c = choice(e);
        var rank = 0u;
        for (var j = 0u; j < n; j++) {
            let o = choice(j);
            rank += select(0u, 1u, o > c || (o == c && j < e));
        }
        if (rank < p.k) {
            chosen_i[rank] = e;
            chosen_w[rank] = sw[e];
        }
    }
    workgroupBarrier();
    if (tid != 0u) {
        return;
    }
    var sum = 0.0;
    for (var r = 0u; r < p.k; r++) {
        sum += chosen_w[r];
    }
    if (p.sigmoid != 0u) {
        sum += 1e-20;
    }
    for (var r = 0u; r < p.k; r++) {
        var w = chosen_w[r];
        if (p.norm != 0u) {
            w /= sum;
        }
        ids[t * p.k + r] = chosen_i[r];
        weights[t * p.k + r] = w * p.scaling;
    }
}
