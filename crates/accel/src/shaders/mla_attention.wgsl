// `span` > 0 splits the cached positions into `splits` ranges as attention.wgsl does: first
// `merge` = 2 absorbs each row and head's query into latent space (q_lat, after the partial
// states in `part`; a workgroup per 64 latent dims), then with `merge` = 0 each workgroup
// writes one range's partial state (max score, denominator, weighted latents) to `part`,
// and with `merge` = 1 one per row and head combines them and projects the latent output.
struct P {
    n_tokens: u32, start_pos: u32, n_heads: u32, l: u32,
    nope: u32, rd: u32, vd: u32, scale: f32,
    span: u32, splits: u32, merge: u32, _a: u32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> q: array<f32>;
// The caches, f32 or f16 (WTYPE): element i through load_word.
@group(0) @binding(2) var<storage, read> lat: array<u32>;
@group(0) @binding(3) var<storage, read> kr: array<u32>;
// kv_b_proj [n_heads * (nope + vd), l]: per head W_UK [nope, l] then W_UV [vd, l].
@group(0) @binding(4) var<storage, read> wkvb: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(6) var<storage, read_write> part: array<f32>;

fn lat_at(i: u32) -> f32 {
    return load_word(lat[word_index(i)], i);
}

fn kr_at(i: u32) -> f32 {
    return load_word(kr[word_index(i)], i);
}

// Latent dim c's accumulator `a` rescaled by `alpha` plus this chunk's `cnt` weighted
// latents from position j0; unchanged past l. The eight accumulators are two vec4s'
// components, not an array: GPU compilers may place arrays in slow local memory.
fn weighted(a: f32, alpha: f32, c: u32, j0: u32, cnt: u32) -> f32 {
    if (c >= p.l) {
        return a;
    }
    // Four positions a step with independent loads, then the rest (as attention.wgsl).
    let at = j0 * p.l + c;
    var r4 = vec4<f32>(0.0);
    var jj = 0u;
    for (; jj + 4u <= cnt; jj += 4u) {
        let v = vec4<f32>(
            lat_at(at + jj * p.l),
            lat_at(at + (jj + 1u) * p.l),
            lat_at(at + (jj + 2u) * p.l),
            lat_at(at + (jj + 3u) * p.l),
        );
        r4 += vec4<f32>(sc[jj], sc[jj + 1u], sc[jj + 2u], sc[jj + 3u]) * v;
    }
    var r = a * alpha + (r4.x + r4.y + r4.z + r4.w);
    for (; jj < cnt; jj++) {
        r += sc[jj] * lat_at(at + jj * p.l);
    }
    return r;
}

// q_lat (in `ql`) . latent j plus q_rope (in `qr`) . rotary key j: four dims a step with
// independent loads.
fn score(j: u32) -> f32 {
    let lb = j * p.l;
    var d4 = vec4<f32>(0.0);
    var c = 0u;
    for (; c + 4u <= p.l; c += 4u) {
        let v = vec4<f32>(lat_at(lb + c), lat_at(lb + c + 1u), lat_at(lb + c + 2u), lat_at(lb + c + 3u));
        d4 += vec4<f32>(ql[c], ql[c + 1u], ql[c + 2u], ql[c + 3u]) * v;
    }
    var dot = d4.x + d4.y + d4.z + d4.w;
    for (; c < p.l; c++) {
        dot += ql[c] * lat_at(lb + c);
    }
    for (var d = 0u; d < p.rd; d++) {
        dot += qr[d] * kr_at(j * p.rd + d);
    }
    return dot;
}

fn put1(v: f32, c: u32, base: u32, to_part: bool) {
    if (c < p.l) {
        if (to_part) {
            part[base + c] = v;
        } else {
            ql[c] = v;
        }
    }
}

// Writes latents o (dims c0 + 64 i) over q_lat in workgroup memory, or to `part` from base.
fn put_latent(o: vec4<f32>, c0: u32, base: u32, to_part: bool) {
    put1(o.x, c0, base, to_part);
    put1(o.y, c0 + 64u, base, to_part);
    put1(o.z, c0 + 128u, base, to_part);
    put1(o.w, c0 + 192u, base, to_part);
}

// Combines the ranges' partial states of one row and head into the latent output, over
// q_lat in workgroup memory.
fn merge(row: u32, tid: u32) {
    let stride = p.l + 2u;
    let first = row * p.splits * stride;
    var mx = NEG_BIG;
    for (var s = 0u; s < p.splits; s++) {
        mx = max(mx, part[first + s * stride]);
    }
    var den = 0.0;
    for (var s = 0u; s < p.splits; s++) {
        den += part[first + s * stride + 1u] * exp(part[first + s * stride] - mx);
    }
    for (var c = tid; c < p.l; c += 64u) {
        var a = 0.0;
        for (var s = 0u; s < p.splits; s++) {
            let b = first + s * stride;
            a += part[b + 2u + c] * exp(part[b] - mx);
        }
        ql[c] = a / den;
    }
}

var<workgroup> ql: array<f32, 512>;
var<workgroup> qr: array<f32, 64>;
var<workgroup> sc: array<f32, 64>;

// Multi-head latent attention of one query row and head in latent space (DeepSeek's
// weight absorption): q_lat = W_UKᵀ q_nope, scores q_lat . c_j + q_rope . k_rope_j over the
// cached latents c_j, online softmax, out = W_UV (Σ p_j c_j).
// Where row `row`'s q_lat starts in `part` when split: after every partial state.
fn q_lat_at(row: u32) -> u32 {
    return p.n_tokens * p.n_heads * p.splits * (p.l + 2u) + row * p.l;
}

// q_lat = W_UKᵀ q_nope for latent dim c of query row t and `head` (weights from `wbase`).
fn absorbed(t: u32, head: u32, c: u32, wbase: u32) -> f32 {
    let qbase = t * p.n_heads * (p.nope + p.rd) + head * (p.nope + p.rd);
    var s4 = vec4<f32>(0.0);
    var d = 0u;
    for (; d + 4u <= p.nope; d += 4u) {
        let w = vec4<f32>(
            wkvb[wbase + d * p.l + c],
            wkvb[wbase + (d + 1u) * p.l + c],
            wkvb[wbase + (d + 2u) * p.l + c],
            wkvb[wbase + (d + 3u) * p.l + c],
        );
        s4 += vec4<f32>(q[qbase + d], q[qbase + d + 1u], q[qbase + d + 2u], q[qbase + d + 3u]) * w;
    }
    var s = s4.x + s4.y + s4.z + s4.w;
    for (; d < p.nope; d++) {
        s += q[qbase + d] * wkvb[wbase + d * p.l + c];
    }
    return s;
}

// W_UV row at `wrow` . the latent output (over q_lat in `ql`): four dims a step.
fn project(wrow: u32) -> f32 {
    var s4 = vec4<f32>(0.0);
    var c = 0u;
    for (; c + 4u <= p.l; c += 4u) {
        let w = vec4<f32>(wkvb[wrow + c], wkvb[wrow + c + 1u], wkvb[wrow + c + 2u], wkvb[wrow + c + 3u]);
        s4 += w * vec4<f32>(ql[c], ql[c + 1u], ql[c + 2u], ql[c + 3u]);
    }
    var s = s4.x + s4.y + s4.z + s4.w;
    for (; c < p.l; c++) {
        s += wkvb[wrow + c] * ql[c];
    }
    return s;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) li: vec3<u32>) {
    let head = wg.x % p.n_heads;
    let split = wg.x / p.n_heads;
    let t = wg.y;
    let tid = li.x;
    let l = p.l;
    let wbase = head * (p.nope + p.vd) * l;
    let row = t * p.n_heads + head;
    if (p.merge == 2u) {
        // wg.x / n_heads is the block of 64 latent dims here.
        let c = split * 64u + tid;
        if (c < l) {
            part[q_lat_at(row) + c] = absorbed(t, head, c, wbase);
        }
        return;
    }
    if (p.merge != 0u) {
        merge(row, tid);
    } else {
        attend(t, head, row, split, tid, wbase);
        if (p.span > 0u) {
            return;
        }
    }
    workgroupBarrier();
    let obase = t * p.n_heads * p.vd + head * p.vd;
    for (var vi = tid; vi < p.vd; vi += 64u) {
        out[obase + vi] = project(wbase + (p.nope + vi) * l);
    }
}

// Attention of query row t and `head` (partial-state row `row`) over its cached positions (those of range `split` when
// split): the latent output over q_lat, or the range's partial state into `part`.
fn attend(t: u32, head: u32, row: u32, split: u32, tid: u32, wbase: u32) {
    let l = p.l;
    let qk = p.nope + p.rd;
    let qbase = t * p.n_heads * qk + head * qk;
    for (var c = tid; c < l; c += 64u) {
        if (p.span > 0u) {
            ql[c] = part[q_lat_at(row) + c];
        } else {
            ql[c] = absorbed(t, head, c, wbase);
        }
    }
    for (var d = tid; d < p.rd; d += 64u) {
        qr[d] = q[qbase + p.nope + d];
    }
    workgroupBarrier();
    let pos = p.start_pos + t;
    // This workgroup's positions: first..=last, all of them unless split into ranges.
    var first = 0u;
    var last = pos;
    if (p.span > 0u) {
        first = split * p.span;
        last = min(pos, (split + 1u) * p.span - 1u);
    }
    var m = NEG_BIG;
    var den = 0.0;
    var lo = vec4<f32>(0.0);
    var hi = vec4<f32>(0.0);
    for (var j0 = first; j0 <= last; j0 += 64u) {
        let j = j0 + tid;
        var s = NEG_BIG;
        if (j <= last) {
            s = score(j) * p.scale;
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
        lo = vec4<f32>(
            weighted(lo.x, alpha, tid, j0, cnt),
            weighted(lo.y, alpha, tid + 64u, j0, cnt),
            weighted(lo.z, alpha, tid + 128u, j0, cnt),
            weighted(lo.w, alpha, tid + 192u, j0, cnt),
        );
        hi = vec4<f32>(
            weighted(hi.x, alpha, tid + 256u, j0, cnt),
            weighted(hi.y, alpha, tid + 320u, j0, cnt),
            weighted(hi.z, alpha, tid + 384u, j0, cnt),
            weighted(hi.w, alpha, tid + 448u, j0, cnt),
        );
        m = new_m;
        workgroupBarrier();
    }
    if (p.span == 0u) {
        // The latent output replaces q_lat in workgroup memory.
        put_latent(lo / den, tid, 0u, false);
        put_latent(hi / den, tid + 256u, 0u, false);
        return;
    }
    let pbase = (row * p.splits + split) * (l + 2u);
    if (tid == 0u) {
        part[pbase] = m;
        part[pbase + 1u] = den;
    }
    put_latent(lo, tid, pbase + 2u, true);
    put_latent(hi, tid + 256u, pbase + 2u, true);
}
