// attention_io.wgsl's uniform words and bindings come first (the split's words are unused
// here).

// Query rows per workgroup, and cached positions per step.
const BQ: u32 = 16u;
const BK: u32 = 16u;

// One step's keys, then its values (BK rows of hd <= 128), read once for the BQ queries.
var<workgroup> kv: array<f32, 2048>;
// Each query's scores over the step's positions in four parts (one per invocation of the
// query), then its probabilities (part 0).
var<workgroup> part_s: array<f32, 1024>;
// Each query's running max, denominator and this step's rescale of its sums.
var<workgroup> m_s: array<f32, 16>;
var<workgroup> den_s: array<f32, 16>;
var<workgroup> alpha_s: array<f32, 16>;

fn kv4(at: u32) -> vec4<f32> {
    return vec4<f32>(kv[at], kv[at + 1u], kv[at + 2u], kv[at + 3u]);
}

// The step's `cnt` cached rows of kv head `kvh` from position j0, keys or values, into
// `kv` (rows past cnt as zeros).
fn stage_rows(keys: bool, tid: u32, j0: u32, cnt: u32, kvh: u32) {
    let kv_w = p.n_kv_heads * p.hd;
    for (var i = tid; i < BK * p.hd; i += 64u) {
        let jj = i / p.hd;
        var v = 0.0;
        if (jj < cnt) {
            let at = (j0 + jj) * kv_w + kvh * p.hd + i % p.hd;
            if (keys) {
                v = load_word(kc[word_index(at)], at);
            } else {
                v = load_word(vc[word_index(at)], at);
            }
        }
        kv[i] = v;
    }
}

// Dims of the i-th vec4 of invocation part `part`: part * 4 + 16 i, so the four parts of a
// query interleave over every group of 16 dims (hd is a multiple of 16).
fn dim0(part: u32, i: u32) -> u32 {
    return part * 4u + 16u * i;
}

// The partial dot of one query's dims (`qv` at dims dim0(part, i)) with cached row jj.
fn partial_dot(q0: vec4<f32>, q1: vec4<f32>, q2: vec4<f32>, q3: vec4<f32>, q4: vec4<f32>,
               q5: vec4<f32>, q6: vec4<f32>, q7: vec4<f32>, part: u32, jj: u32) -> f32 {
    let r = jj * p.hd;
    var s = dot(q0, kv4(r + dim0(part, 0u))) + dot(q1, kv4(r + dim0(part, 1u)));
    s += dot(q2, kv4(r + dim0(part, 2u))) + dot(q3, kv4(r + dim0(part, 3u)));
    if (p.hd > 64u) {
        s += dot(q4, kv4(r + dim0(part, 4u))) + dot(q5, kv4(r + dim0(part, 5u)));
        s += dot(q6, kv4(r + dim0(part, 6u))) + dot(q7, kv4(r + dim0(part, 7u)));
    }
    return s;
}

// Accumulator `acc` of dims dim0(part, i), rescaled by `alpha`, plus the step's `cnt`
// weighted values of query qi; unchanged past hd.
fn accumulate(acc: vec4<f32>, alpha: f32, part: u32, i: u32, qi: u32, cnt: u32) -> vec4<f32> {
    let d0 = dim0(part, i);
    if (d0 >= p.hd) {
        return acc;
    }
    var a = acc * alpha;
    for (var jj = 0u; jj < cnt; jj++) {
        a += part_s[qi * 4u * BK + jj] * kv4(jj * p.hd + d0);
    }
    return a;
}

// Query row `qi`'s dims dim0(part, i), 0 past hd or past the rows.
fn q4(row: u32, head: u32, part: u32, i: u32, valid: bool) -> vec4<f32> {
    let d0 = dim0(part, i);
    if (!valid || d0 >= p.hd) {
        return vec4<f32>(0.0);
    }
    let b = row * p.n_heads * p.hd + head * p.hd + d0;
    return vec4<f32>(q[b], q[b + 1u], q[b + 2u], q[b + 3u]);
}

fn put4(v: vec4<f32>, row: u32, head: u32, part: u32, i: u32) {
    let d0 = dim0(part, i);
    if (d0 < p.hd) {
        let b = row * p.n_heads * p.hd + head * p.hd + d0;
        out[b] = v.x;
        out[b + 1u] = v.y;
        out[b + 2u] = v.z;
        out[b + 3u] = v.w;
    }
}

// Causal attention of BQ consecutive query rows of one head (GQA as attention.wgsl) over
// the device KV cache: each step reads BK cached keys and values into workgroup memory
// once for all BQ queries (attention.wgsl reads them once per query), with an online
// softmax per query. Four invocations per query, each a quarter of its dims (in registers).
// Prefill's kernel: head_dim a multiple of 16, at most 128.
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>) {
    let head = wg.x;
    let t0 = wg.y * BQ;
    let tid = l.x;
    let qi = tid / 4u;
    let part = tid % 4u;
    let nq = min(BQ, p.n_tokens - t0);
    let kvh = head / (p.n_heads / p.n_kv_heads);
    let row = t0 + qi;
    let live = qi < nq;
    let q0 = q4(row, head, part, 0u, live);
    let q1 = q4(row, head, part, 1u, live);
    let q2 = q4(row, head, part, 2u, live);
    let q3 = q4(row, head, part, 3u, live);
    let q4v = q4(row, head, part, 4u, live);
    let q5 = q4(row, head, part, 5u, live);
    let q6 = q4(row, head, part, 6u, live);
    let q7 = q4(row, head, part, 7u, live);
    if (tid < BQ) {
        m_s[tid] = NEG_BIG;
        den_s[tid] = 0.0;
    }
    // Positions the block needs: from the first query's window start to the last query.
    let last = p.start_pos + t0 + nq - 1u;
    var lo = 0u;
    if (p.window > 0u && p.start_pos + t0 + 1u > p.window) {
        lo = p.start_pos + t0 + 1u - p.window;
    }
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    var a4 = vec4<f32>(0.0);
    var a5 = vec4<f32>(0.0);
    var a6 = vec4<f32>(0.0);
    var a7 = vec4<f32>(0.0);
    for (var j0 = lo; j0 <= last; j0 += BK) {
        let cnt = min(BK, last + 1u - j0);
        stage_rows(true, tid, j0, cnt, kvh);
        workgroupBarrier();
        for (var jj = 0u; jj < BK; jj++) {
            part_s[(qi * 4u + part) * BK + jj] = partial_dot(q0, q1, q2, q3, q4v, q5, q6, q7, part, jj);
        }
        workgroupBarrier();
        if (tid < BQ) {
            // Query tid's scores (its parts summed), masked: causal, window, padding rows.
            let pq = p.start_pos + t0 + tid;
            var mx = m_s[tid];
            for (var jj = 0u; jj < BK; jj++) {
                let b = tid * 4u * BK + jj;
                let s = (part_s[b] + part_s[b + BK] + part_s[b + 2u * BK] + part_s[b + 3u * BK]) * p.scale;
                let pos_k = j0 + jj;
                let seen = tid < nq && jj < cnt && pos_k <= pq
                    && (p.window == 0u || pos_k + p.window > pq);
                let v = select(NEG_BIG, s, seen);
                part_s[b] = v;
                mx = max(mx, v);
            }
            let alpha = exp(m_s[tid] - mx);
            var sum = 0.0;
            for (var jj = 0u; jj < BK; jj++) {
                let b = tid * 4u * BK + jj;
                let e = select(0.0, exp(part_s[b] - mx), part_s[b] > NEG_BIG);
                part_s[b] = e;
                sum += e;
            }
            den_s[tid] = den_s[tid] * alpha + sum;
            m_s[tid] = mx;
            alpha_s[tid] = alpha;
        }
        workgroupBarrier();
        stage_rows(false, tid, j0, cnt, kvh);
        workgroupBarrier();
        let alpha = alpha_s[qi];
        a0 = accumulate(a0, alpha, part, 0u, qi, cnt);
        a1 = accumulate(a1, alpha, part, 1u, qi, cnt);
        a2 = accumulate(a2, alpha, part, 2u, qi, cnt);
        a3 = accumulate(a3, alpha, part, 3u, qi, cnt);
        a4 = accumulate(a4, alpha, part, 4u, qi, cnt);
        a5 = accumulate(a5, alpha, part, 5u, qi, cnt);
        a6 = accumulate(a6, alpha, part, 6u, qi, cnt);
        a7 = accumulate(a7, alpha, part, 7u, qi, cnt);
        workgroupBarrier();
    }
    if (!live) {
        return;
    }
    let den = den_s[qi];
    put4(a0 / den, row, head, part, 0u);
    put4(a1 / den, row, head, part, 1u);
    put4(a2 / den, row, head, part, 2u);
    put4(a3 / den, row, head, part, 3u);
    put4(a4 / den, row, head, part, 4u);
    put4(a5 / den, row, head, part, 5u);
    put4(a6 / den, row, head, part, 6u);
    put4(a7 / den, row, head, part, 7u);
}
