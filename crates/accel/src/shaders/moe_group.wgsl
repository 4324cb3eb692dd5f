struct P { n_ids: u32, k: u32, n_experts: u32, _a: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> pairs: array<u32>;
@group(0) @binding(3) var<storage, read_write> pair_of: array<u32>;

// Experts one launch can group (the host refuses more).
const MAX_EXPERTS: u32 = 1024u;
var<workgroup> start: array<u32, MAX_EXPERTS>;

// Groups the routed entries (token t, choice j) at ids[t * k + j] by expert, in one
// workgroup: pairs[2i], pairs[2i + 1] = (token, expert) of the i-th entry in expert order,
// one expert's entries in routing order (a stable sort by expert, as the host did), and
// pair_of[t * k + j] = that entry's position. Invocation e counts and then places the
// entries of experts e, e + 256, ..., each scanning the ids in order, so the result does
// not depend on scheduling; one invocation turns the counts into starts.
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) tid: u32) {
    for (var e = tid; e < p.n_experts; e += 256u) {
        var n = 0u;
        for (var i = 0u; i < p.n_ids; i++) {
            n += select(0u, 1u, ids[i] == e);
        }
        start[e] = n;
    }
    workgroupBarrier();
    if (tid == 0u) {
        var total = 0u;
        for (var e = 0u; e < p.n_experts; e++) {
            let n = start[e];
            start[e] = total;
            total += n;
        }
    }
    workgroupBarrier();
    for (var e = tid; e < p.n_experts; e += 256u) {
        var pos = start[e];
        for (var i = 0u; i < p.n_ids; i++) {
            if (ids[i] == e) {
                pairs[2u * pos] = i / p.k;
                pairs[2u * pos + 1u] = e;
                pair_of[i] = pos;
                pos++;
            }
        }
    }
}
