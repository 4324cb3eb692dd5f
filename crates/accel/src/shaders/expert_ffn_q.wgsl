struct P {
    n_pairs: u32, hidden: u32, inter: u32, slot_bytes: u32,
    s0: u32, s1: u32, stage: u32, a_at: u32, b_at: u32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
// (row of x, slot) per routed (token, expert) pair, sorted by slot.
@group(0) @binding(3) var<storage, read> pairs: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

// Quantized experts in slots s0..s1 of this chunk of the slot buffer (each slot: gate,
// up, down back to back, at bytes 0, b_at and a_at of stage 1). One workgroup per output
// row j and TM consecutive pairs: the 64 invocations take the row's groups of 32 in turn,
// and a group is decoded once per run of pairs on one expert (pairs are sorted by slot,
// so in prefill an expert's tokens share each decoded group).
// Stage 0 (a_at = gate, b_at = up): out[pair, j] = silu(x_row . gate_j) * (x_row . up_j).
// Stage 1 (a_at = down): out[pair, c] = x[pair] . down_c, x the stage-0 output.
@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
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
    if (j >= width) {
        return;
    }
    let rb = row_bytes(k);
    let groups = k / 32u;
    var ga: array<f32, TM>;
    var ua: array<f32, TM>;
    for (var s = tid; s < groups; s += 64u) {
        var vg: array<f32, 32>;
        var vu: array<f32, 32>;
        var cur = 0xffffffffu;
        for (var t = 0u; t < TM; t++) {
            let pi = p0 + t;
            if (pi >= p.n_pairs) {
                break;
            }
            let slot = pairs[2u * pi + 1u];
            if (slot < p.s0 || slot >= p.s1) {
                continue;
            }
            let base = (slot - p.s0) * p.slot_bytes + j * rb;
            if (slot != cur) {
                cur = slot;
                decode32(base + p.a_at, s, &vg);
                if (up) {
                    decode32(base + p.b_at, s, &vu);
                }
            }
            var xo = pi * k + 32u * s;
            if (up) {
                xo = pairs[2u * pi] * k + 32u * s;
                ua[t] += dot32(&vu, xo);
            }
            ga[t] += dot32(&vg, xo);
        }
    }
    let g = sum_tm(ga, tid);
    var u = 1.0;
    if (up) {
        u = sum_tm(ua, tid);
    }
    let pi = p0 + tid;
    if (tid < TM && pi < p.n_pairs) {
        let slot = pairs[2u * pi + 1u];
        if (slot >= p.s0 && slot < p.s1) {
            if (up) {
                out[pi * width + j] = g / (1.0 + exp(-g)) * u;
            } else {
                out[pi * width + j] = g;
            }
        }
    }
}
