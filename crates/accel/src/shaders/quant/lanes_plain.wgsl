// Lane sums on an adapter without subgroup operations: every invocation is its own lane.
fn lane_sum(v: f32) -> f32 {
    return v;
}

fn lane_leader(tid: u32) -> bool {
    return true;
}
