// Shared by every kernel: weight loads by type, the 2D -> linear invocation index and the
// workgroup reductions.

// Element `i` of a weight stored as 32-bit words: f32 (one per word), bf16 or f16 (two per
// word, element 0 in the low half). `WTYPE` is replaced per pipeline: 0 f32, 1 bf16, 2 f16.
const WTYPE: u32 = __WTYPE__u;

fn load_word(w: u32, i: u32) -> f32 {
    if (WTYPE == 0u) {
        return bitcast<f32>(w);
    } else if (WTYPE == 1u) {
        if ((i & 1u) == 0u) {
            return bitcast<f32>(w << 16u);
        }
        return bitcast<f32>(w & 0xffff0000u);
    }
    return unpack2x16float(w)[i & 1u];
}

fn word_index(i: u32) -> u32 {
    if (WTYPE == 0u) {
        return i;
    }
    return i >> 1u;
}

// Dispatches of more than 65535 workgroups are folded into y.
fn linear_id(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.y * nwg.x * 64u + gid.x;
}

const NEG_BIG: f32 = -3.0e38;

// Sum and maximum over a workgroup of 64 by halving (sums: also of 256, `reduce_sum_of`):
// every invocation calls them with its value and gets the result; `red` is free again when
// they return. The fixed tree makes the result independent of timing.
var<workgroup> red: array<f32, 256>;

// The sum of the values of the workgroup's `n` invocations (a power of two, at most 256).
fn reduce_sum_of(v: f32, tid: u32, n: u32) -> f32 {
    red[tid] = v;
    workgroupBarrier();
    for (var off = n / 2u; off > 0u; off >>= 1u) {
        if (tid < off) {
            red[tid] += red[tid + off];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn reduce_sum(v: f32, tid: u32) -> f32 {
    return reduce_sum_of(v, tid, 64u);
}

// RMSNorm's factor for a row of `dim` values whose squares this invocation summed into
// `sum_sq` (the workgroup's `n` sums together cover the row): 1 / sqrt(mean(x^2) + eps).
fn rms_factor(sum_sq: f32, tid: u32, n: u32, dim: u32, eps: f32) -> f32 {
    return 1.0 / sqrt(reduce_sum_of(sum_sq, tid, n) / f32(dim) + eps);
}

fn reduce_max(v: f32, tid: u32) -> f32 {
    red[tid] = v;
    workgroupBarrier();
    for (var off = 32u; off > 0u; off >>= 1u) {
        if (tid < off) {
            red[tid] = max(red[tid], red[tid + off]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}
