struct P { m: u32, k: u32, n0: u32, n_rows: u32, ldo: u32, has_bias: u32, _a: u32, _b: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

// out[t, n0 + r] = x[t, :] . w[r, :] (+ bias) for row r of this chunk of a quantized
// weight: one workgroup per row, whose 64 invocations take the row's groups of 32 (or
// pieces of them, `rows.wgsl`) in turn (adjacent invocations read adjacent bytes), TM
// tokens per pass; each decoded piece serves four tokens at once (one, for a single
// token), then the workgroup sums.
@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
    lanes: Lanes,
) {
    let r = wg.y * nwg.x + wg.x;
    if (r >= p.n_rows) {
        return;
    }
    let row = r * row_bytes(p.k);
    let groups = p.k / 32u;
    let per = pieces_per_group(groups);
    let n = 8u / per;
    let k4 = p.k / 4u;
    for (var t0 = 0u; t0 < p.m; t0 += TM) {
        let cols = min(TM, p.m - t0);
        if (cols == 1u) {
            var acc = 0.0;
            for (var pc = tid; pc < groups * per; pc += 64u) {
                let at = piece(pc, per);
                acc += dot_group(group(row, at.x), t0 * k4 + 8u * at.x, at.y, n);
            }
            put_part(acc, 0u, tid, lanes);
        } else {
            for (var q = 0u; q < cols; q += 4u) {
                // Tokens past the last repeat it; their sums are not written.
                let tok = min(vec4<u32>(t0 + q) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.m - 1u));
                var acc = vec4<f32>(0.0);
                for (var pc = tid; pc < groups * per; pc += 64u) {
                    let at = piece(pc, per);
                    acc += dot_group4(group(row, at.x), tok * k4 + 8u * at.x, at.y, n);
                }
                put_part(acc.x, q, tid, lanes);
                put_part(acc.y, q + 1u, tid, lanes);
                put_part(acc.z, q + 2u, tid, lanes);
                put_part(acc.w, q + 3u, tid, lanes);
            }
        }
        column_sums(tid, lanes);
        if (tid < cols) {
            var y = part[0][tid];
            if (p.has_bias != 0u) {
                y += bias[p.n0 + r];
            }
            out[(t0 + tid) * p.ldo + p.n0 + r] = y;
        }
        workgroupBarrier();
    }
}
