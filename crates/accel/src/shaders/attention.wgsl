// `span` > 0 splits the cached positions into `splits` ranges of `span` (flash decoding):
// with `merge` = 0 each workgroup attends over one range of one row and head and writes
// its partial softmax state to `part`; with `merge` = 1 one workgroup per row and head
// combines those into `out`. A decoded token then keeps the device busy with
// heads x splits workgroups instead of one per head walking the whole context.
// attention_io.wgsl (the uniform words, bindings 0-4) comes first.

// Partial states, hd + 2 values each (max score, denominator, weighted values), by row,
// head and range.
@group(0) @binding(5) var<storage, read_write> part: array<f32>;

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
    // Four positions a step with independent loads (their latency, not bandwidth, bounds
    // a decoded token's few workgroups), then the rest.
    let at = j0 * stride + base + d;
    var r4 = vec4<f32>(0.0);
    var jj = 0u;
    for (; jj + 4u <= cnt; jj += 4u) {
        let v = vec4<f32>(
            v_at(at + jj * stride),
            v_at(at + (jj + 1u) * stride),
            v_at(at + (jj + 2u) * stride),
            v_at(at + (jj + 3u) * stride),
        );
        r4 += vec4<f32>(sc[jj], sc[jj + 1u], sc[jj + 2u], sc[jj + 3u]) * v;
    }
    var r = a * alpha + (r4.x + r4.y + r4.z + r4.w);
    for (; jj < cnt; jj++) {
        r += sc[jj] * v_at(at + jj * stride);
    }
    return r;
}

// Query row (in `qs`) . key row at `kb`: four dims a step with independent loads.
fn q_dot_k(kb: u32) -> f32 {
    var d4 = vec4<f32>(0.0);
    var d = 0u;
    for (; d + 4u <= p.hd; d += 4u) {
        let k = vec4<f32>(k_at(kb + d), k_at(kb + d + 1u), k_at(kb + d + 2u), k_at(kb + d + 3u));
        d4 += vec4<f32>(qs[d], qs[d + 1u], qs[d + 2u], qs[d + 3u]) * k;
    }
    var dot = d4.x + d4.y + d4.z + d4.w;
    for (; d < p.hd; d++) {
        dot += qs[d] * k_at(kb + d);
    }
    return dot;
}

fn put1(v: f32, d: u32, base: u32, to_part: bool) {
    if (d < p.hd) {
        if (to_part) {
            part[base + d] = v;
        } else {
            out[base + d] = v;
        }
    }
}

// Writes the vec4's components, dims tid + 64 i below hd, to `part` or `out` from `base`.
fn put4(o: vec4<f32>, base: u32, tid: u32, to_part: bool) {
    put1(o.x, tid, base, to_part);
    put1(o.y, tid + 64u, base, to_part);
    put1(o.z, tid + 128u, base, to_part);
    put1(o.w, tid + 192u, base, to_part);
}

// Combines the ranges' partial states of one row and head into its output.
fn merge(row: u32, tid: u32, obase: u32) {
    let stride = p.hd + 2u;
    let first = row * p.splits * stride;
    var mx = NEG_BIG;
    for (var s = 0u; s < p.splits; s++) {
        mx = max(mx, part[first + s * stride]);
    }
    var den = 0.0;
    for (var s = 0u; s < p.splits; s++) {
        den += part[first + s * stride + 1u] * exp(part[first + s * stride] - mx);
    }
    for (var d = tid; d < p.hd; d += 64u) {
        var a = 0.0;
        for (var s = 0u; s < p.splits; s++) {
            let b = first + s * stride;
            a += part[b + 2u + d] * exp(part[b] - mx);
        }
        out[obase + d] = a / den;
    }
}

// Causal attention of one query row and head over the device KV cache (GQA: kv head =
// head / group), 64 cached positions at a time with an online softmax, so prefill and
// decode share one kernel and the context length is unbounded.
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>) {
    let head = wg.x % p.n_heads;
    let split = wg.x / p.n_heads;
    let t = wg.y;
    let tid = l.x;
    let hd = p.hd;
    let kvh = head / (p.n_heads / p.n_kv_heads);
    let kv_w = p.n_kv_heads * hd;
    let qbase = t * p.n_heads * hd + head * hd;
    let row = t * p.n_heads + head;
    if (p.merge != 0u) {
        merge(row, tid, qbase);
        return;
    }
    for (var d = tid; d < hd; d += 64u) {
        qs[d] = q[qbase + d];
    }
    workgroupBarrier();
    let pos = p.start_pos + t;
    var lo = 0u;
    if (p.window > 0u && pos + 1u > p.window) {
        lo = pos + 1u - p.window;
    }
    // This workgroup's positions: lo..=last, all of them unless split into ranges.
    var last = pos;
    if (p.span > 0u) {
        lo = max(lo, split * p.span);
        last = min(pos, (split + 1u) * p.span - 1u);
    }
    var m = NEG_BIG;
    var den = 0.0;
    var acc = vec4<f32>(0.0);
    for (var j0 = lo; j0 <= last; j0 += 64u) {
        let j = j0 + tid;
        var s = NEG_BIG;
        if (j <= last) {
            let kb = j * kv_w + kvh * hd;
            s = q_dot_k(kb) * p.scale;
        }
        let new_m = max(m, reduce_max(s, tid));
        let alpha = exp(m - new_m);
        var pr = 0.0;
        if (j <= last) {
            pr = exp(s - new_m);
        }
        sc[tid] = pr;
        den = den * alpha + reduce_sum(pr, tid);
        let cnt = min(64u, last + 1u - j0);
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
    if (p.span == 0u) {
        put4(acc / den, qbase, tid, false);
        return;
    }
    let pbase = (row * p.splits + split) * (hd + 2u);
    if (tid == 0u) {
        part[pbase] = m;
        part[pbase + 1u] = den;
    }
    put4(acc, pbase + 2u, tid, true);
}
