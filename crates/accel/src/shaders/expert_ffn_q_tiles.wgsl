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

// Quantized experts in slots s0..s1 of this chunk of the slot buffer, as
// `expert_ffn_q.wgsl` computes them, for many pairs per expert (prefill): tiles of 32
// output rows (workgroup x) by up to 32 pairs of one expert, through `quant/tile.wgsl`.
// Stage 0 stages gate and up rows beside each other.
//
// Each expert's run of pairs is cut into tiles of 32 from the run's first pair; the tile
// starting at pair i belongs to workgroup y = i / 32, so each workgroup takes at most one
// tile per run that starts among its 32 pairs, and one more for the run that enters them:
// the grouping needs no table from the host, and a workgroup's work stays bounded.

// Where this workgroup's next tile is: (first pair, end, slot, where to look next).
var<workgroup> next_tile: vec4<u32>;

// The first pair whose slot is at least `slot` (pairs are sorted by slot).
fn first_pair_from(slot: u32) -> u32 {
    var lo = 0u;
    var hi = p.n_pairs;
    while (lo < hi) {
        let mid = (lo + hi) / 2u;
        if (pairs[2u * mid + 1u] < slot) {
            lo = mid + 1u;
        } else {
            hi = mid;
        }
    }
    return lo;
}

// The first tile that starts in [at, end): its pairs, its slot, and where the search
// goes on; an empty range when there is none.
fn find_tile(at: u32, end: u32) -> vec4<u32> {
    var q = at;
    while (q < end) {
        let slot = pairs[2u * q + 1u];
        let run = first_pair_from(slot);
        let run_end = first_pair_from(slot + 1u);
        let start = run + (q - run + TILE - 1u) / TILE * TILE;
        if (start < min(run_end, end)) {
            return vec4<u32>(start, min(start + TILE, run_end), slot, run_end);
        }
        q = run_end;
    }
    return vec4<u32>(0u, 0u, 0u, end);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let up = p.stage == 0u;
    var k = p.hidden;
    var width = p.inter;
    if (!up) {
        k = p.inter;
        width = p.hidden;
    }
    let row0 = wg.x * TILE;
    let home = wg.y * TILE;
    if (row0 >= width || home >= p.n_pairs) {
        return;
    }
    let home_end = min(home + TILE, p.n_pairs);
    let rb = row_bytes(k);
    var at = home;
    loop {
        if (tid == 0u) {
            next_tile = find_tile(at, home_end);
        }
        let t = workgroupUniformLoad(&next_tile);
        if (t.x >= t.y) {
            break;
        }
        at = t.w;
        if (t.z >= p.s0 && t.z < p.s1) {
            let base = (t.z - p.s0) * p.slot_bytes;
            var xo = vec4<u32>(0u);
            var live = vec4<bool>(false);
            for (var j = 0u; j < 4u; j++) {
                let pi = t.x + tid / 8u + 8u * j;
                live[j] = pi < t.y;
                var row = pi;
                if (up && live[j]) {
                    row = pairs[2u * pi];
                }
                xo[j] = row * (k / 4u);
            }
            tile_clear();
            for (var g = 0u; g < k / 32u; g++) {
                tile_stage_x(xo, live, g, tid);
                tile_stage_w(base + p.a_at, rb, row0, width, g, tid, false);
                if (up) {
                    tile_stage_w(base + p.b_at, rb, row0, width, g, tid, true);
                }
                workgroupBarrier();
                tile_fma(tid, up);
                workgroupBarrier();
            }
            for (var i = 0u; i < 4u; i++) {
                let j_out = row0 + tid % 8u + 8u * i;
                if (j_out >= width) {
                    continue;
                }
                let g = sums_a(i);
                let u = sums_b(i);
                for (var j = 0u; j < 4u; j++) {
                    if (live[j]) {
                        let pi = t.x + tid / 8u + 8u * j;
                        if (up) {
                            out[pi * width + j_out] = g[j] / (1.0 + exp(-g[j])) * u[j];
                        } else {
                            out[pi * width + j_out] = g[j];
                        }
                    }
                }
            }
        }
        // Every invocation has read next_tile before it is written again.
        workgroupBarrier();
    }
}
