struct P {
    n_pairs: u32, hidden: u32, inter: u32, slot_bytes: u32,
    s0: u32, s1: u32, stage: u32, a_at: u32, b_at: u32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
// (row of x, slot) per routed (token, expert) pair, sorted by slot.
@group(0) @binding(3) var<storage, read> pairs: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

// Quantized experts in slots s0..s1 of this chunk of the slot buffer (each slot: gate,
// up, down back to back, at bytes 0, b_at and a_at of stage 1). One workgroup per output
// row j and TM consecutive pairs, four at a time: the 64 invocations take the row's groups
// of 32 (or pieces of them, `rows.wgsl`) in turn; when the four pairs are on one expert
// (pairs are sorted by slot, so an expert's tokens are consecutive) each piece is decoded
// once for the four.
// Stage 0 (a_at = gate, b_at = up): out[pair, j] = silu(x_row . gate_j) * (x_row . up_j).
// Stage 1 (a_at = down): out[pair, c] = x[pair] . down_c, x the stage-0 output.

fn in_chunk(slot: u32) -> bool {
    return slot >= p.s0 && slot < p.s1;
}

// This invocation's part of one pair's dot products with row j of its expert: (gate, up)
// in stage 0, (down, 0) in stage 1; zero for a slot of another chunk.
fn pair_dots(slot: u32, xo: u32, row: u32, tid: u32, up: bool, groups: u32, per: u32) -> vec2<f32> {
    var d = vec2<f32>(0.0);
    if (!in_chunk(slot)) {
        return d;
    }
    let base = (slot - p.s0) * p.slot_bytes + row;
    for (var pc = tid; pc < groups * per; pc += 64u) {
        let at = piece(pc, per);
        d.x += dot_group(group(base + p.a_at, at.x), xo + 8u * at.x, at.y, 8u / per);
        if (up) {
            d.y += dot_group(group(base + p.b_at, at.x), xo + 8u * at.x, at.y, 8u / per);
        }
    }
    return d;
}

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
    lanes: Lanes,
) {
    let j = wg.x;
    let p0 = wg.y * TM;
    let up = p.stage == 0u;
    var k = p.hidden;
    var width = p.inter;
    if (!up) {
        k = p.inter;
        width = p.hidden;
    }
    if (j >= width || p0 >= p.n_pairs) {
        return;
    }
    let row = j * row_bytes(k);
    let groups = k / 32u;
    let per = pieces_per_group(groups);
    let cols = min(TM, p.n_pairs - p0);
    for (var q = 0u; q < cols; q += 4u) {
        // Pairs past the last repeat it; their sums are not written.
        let pi = min(vec4<u32>(p0 + q) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.n_pairs - 1u));
        let slot = vec4<u32>(pairs[2u * pi.x + 1u], pairs[2u * pi.y + 1u], pairs[2u * pi.z + 1u], pairs[2u * pi.w + 1u]);
        var xr = pi;
        if (up) {
            xr = vec4<u32>(pairs[2u * pi.x], pairs[2u * pi.y], pairs[2u * pi.z], pairs[2u * pi.w]);
        }
        let xo = xr * (k / 4u);
        var ga = vec4<f32>(0.0);
        var ua = vec4<f32>(0.0);
        if (all(slot == vec4<u32>(slot.x))) {
            if (in_chunk(slot.x)) {
                let base = (slot.x - p.s0) * p.slot_bytes + row;
                for (var pc = tid; pc < groups * per; pc += 64u) {
                    let at = piece(pc, per);
                    let xs = xo + 8u * at.x;
                    ga += dot_group4(group(base + p.a_at, at.x), xs, at.y, 8u / per);
                    if (up) {
                        ua += dot_group4(group(base + p.b_at, at.x), xs, at.y, 8u / per);
                    }
                }
            }
        } else {
            let dx = pair_dots(slot.x, xo.x, row, tid, up, groups, per);
            let dy = pair_dots(slot.y, xo.y, row, tid, up, groups, per);
            let dz = pair_dots(slot.z, xo.z, row, tid, up, groups, per);
            let dw = pair_dots(slot.w, xo.w, row, tid, up, groups, per);
            ga = vec4<f32>(dx.x, dy.x, dz.x, dw.x);
            ua = vec4<f32>(dx.y, dy.y, dz.y, dw.y);
        }
        put_part(ga.x, q, tid, lanes);
        put_part(ga.y, q + 1u, tid, lanes);
        put_part(ga.z, q + 2u, tid, lanes);
        put_part(ga.w, q + 3u, tid, lanes);
        if (up) {
            put_part(ua.x, TM + q, tid, lanes);
            put_part(ua.y, TM + q + 1u, tid, lanes);
            put_part(ua.z, TM + q + 2u, tid, lanes);
            put_part(ua.w, TM + q + 3u, tid, lanes);
        }
    }
    column_sums(tid, lanes);
    let pi = p0 + tid;
    if (tid < cols && in_chunk(pairs[2u * pi + 1u])) {
        let g = part[0][tid];
        if (up) {
            out[pi * width + j] = g / (1.0 + exp(-g)) * part[0][TM + tid];
        } else {
            out[pi * width + j] = g;
        }
    }
}
