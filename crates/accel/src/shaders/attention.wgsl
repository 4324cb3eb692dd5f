struct P { n_tokens: u32, start_pos: u32, n_heads: u32, n_kv_heads: u32, hd: u32, window: u32, scale: f32, _a: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> q: array<f32>;
// The caches, f32 or f16 (WTYPE): element i through load_word.
@group(0) @binding(2) var<storage, read> kc: array<u32>;
@group(0) @binding(3) var<storage, read> vc: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

fn k_at(i: u32) -> f32 {
    return load_word(kc[word_index(i)], i);
}

fn v_at(i: u32) -> f32 {
    return load_word(vc[word_index(i)], i);
}

var<workgroup> qs: array<f32, 256>;
var<workgroup> sc: array<f32, 64>;

// Causal attention of one query row and head over the device KV cache (GQA: kv head =
// head / group), 64 cached positions at a time with an online softmax, so prefill and
// decode share one kernel and the context length is unbounded.
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>) {
    let head = wg.x;
    let t = wg.y;
    let tid = l.x;
    let hd = p.hd;
    let kvh = head / (p.n_heads / p.n_kv_heads);
    let kv_w = p.n_kv_heads * hd;
    let qbase = t * p.n_heads * hd + head * hd;
    for (var d = tid; d < hd; d += 64u) {
        qs[d] = q[qbase + d];
    }
    workgroupBarrier();
    let pos = p.start_pos + t;
    var lo = 0u;
    if (p.window > 0u && pos + 1u > p.window) {
        lo = pos + 1u - p.window;
    }
    var m = NEG_BIG;
    var den = 0.0;
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    for (var j0 = lo; j0 <= pos; j0 += 64u) {
        let j = j0 + tid;
        var s = NEG_BIG;
        if (j <= pos) {
            let kb = j * kv_w + kvh * hd;
            var dot = 0.0;
            for (var d = 0u; d < hd; d++) {
                dot += qs[d] * k_at(kb + d);
            }
            s = dot * p.scale;
        }
        let new_m = max(m, reduce_max(s, tid));
        let alpha = exp(m - new_m);
        var pr = 0.0;
        if (j <= pos) {
            pr = exp(s - new_m);
        }
        sc[tid] = pr;
        den = den * alpha + reduce_sum(pr, tid);
        let cnt = min(64u, pos + 1u - j0);
        for (var r = 0u; r < 4u; r++) {
            let d = tid + r * 64u;
            if (d < hd) {
                var a = acc[r] * alpha;
                for (var jj = 0u; jj < cnt; jj++) {
                    a += sc[jj] * v_at((j0 + jj) * kv_w + kvh * hd + d);
                }
                acc[r] = a;
            }
        }
        m = new_m;
        workgroupBarrier();
    }
    for (var r = 0u; r < 4u; r++) {
        let d = tid + r * 64u;
        if (d < hd) {
            out[qbase + d] = acc[r] / den;
        }
    }
}
