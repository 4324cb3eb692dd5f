struct P { n_pairs: u32, hidden: u32, inter: u32, slot_stride: u32, s0: u32, s1: u32, stage: u32, _a: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
// (row of x, slot) per routed (token, expert) pair, sorted by slot.
@group(0) @binding(3) var<storage, read> pairs: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

fn dot_w(xb: u32, wb: u32, len: u32) -> f32 {
    var s = 0.0;
    for (var i = 0u; i < len; i++) {
        let e = wb + i;
        s += x[xb + i] * load_word(w[word_index(e)], e);
    }
    return s;
}

// The experts held in slots s0..s1 of this chunk of the slot buffer (each slot: gate
// [inter, hidden], up [inter, hidden], down [hidden, inter]) over their routed rows.
// Stage 0: out[pair, j] = silu(x_row . gate_j) * (x_row . up_j) with x the activations;
// stage 1: out[pair, c] = act[pair] . down_c with x the stage-0 output. Pairs of one expert
// are adjacent, so its weights stay hot in cache across its rows.
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    var width = p.inter;
    if (p.stage == 1u) {
        width = p.hidden;
    }
    if (i >= p.n_pairs * width) {
        return;
    }
    let pair = i / width;
    let j = i % width;
    let slot = pairs[2u * pair + 1u];
    if (slot < p.s0 || slot >= p.s1) {
        return;
    }
    let base = (slot - p.s0) * p.slot_stride;
    let hi = p.hidden * p.inter;
    if (p.stage == 0u) {
        let xb = pairs[2u * pair] * p.hidden;
        let g = dot_w(xb, base + j * p.hidden, p.hidden);
        let u = dot_w(xb, base + hi + j * p.hidden, p.hidden);
        out[i] = g / (1.0 + exp(-g)) * u;
    } else {
        out[i] = dot_w(pair * p.inter, base + 2u * hi + j * p.inter, p.inter);
    }
}
