// Lane sums on an adapter without subgroup operations: every invocation is its own lane
// group. (`Lanes` holds a builtin the kernels do not otherwise use, as an entry point's
// struct needs one.)
struct Lanes {
    @builtin(local_invocation_id) unused: vec3<u32>,
}

fn lane_sum(v: f32) -> f32 {
    return v;
}

fn lane_first(l: Lanes) -> bool {
    return true;
}

fn lane_count(l: Lanes) -> u32 {
    return 1u;
}
