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

// Output dim d's accumulator `a` rescaled by `alpha` plus this chunk's `cnt` weighted values
// from position j0 (rows of `stride` values, the head's at `base`); unchanged past hd. The
// four accumulators are a vec4's components, not an array: GPU compilers may place arrays
// in slow local memory.
fn weighted(a: f32, alpha: f32, d: u32, j0: u32, cnt: u32, stride: u32, base: u32) -> f32 {
    if (d >= p.hd) {
        return a;
    }
    var r = a * alpha;
    for (var jj = 0u; jj < cnt; jj++) {
        r += sc[jj] * v_at((j0 + jj) * stride + base + d);
    }
    return r;
}

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
    var acc = vec4<f32>(0.0);
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
        let vb = kvh * hd;
        acc = vec4<f32>(
            weighted(acc.x, alpha, tid, j0, cnt, kv_w, vb),
            weighted(acc.y, alpha, tid + 64u, j0, cnt, kv_w, vb),
            weighted(acc.z, alpha, tid + 128u, j0, cnt, kv_w, vb),
            weighted(acc.w, alpha, tid + 192u, j0, cnt, kv_w, vb),
        );
        m = new_m;
        workgroupBarrier();
    }
    let o = acc / den;
    if (tid < hd) {
        out[qbase + tid] = o.x;
    }
    if (tid + 64u < hd) {
        out[qbase + tid + 64u] = o.y;
    }
    if (tid + 128u < hd) {
        out[qbase + tid + 128u] = o.z;
    }
    if (tid + 192u < hd) {
        out[qbase + tid + 192u] = o.w;
    }
}
