// Lane sums through the adapter's subgroup operations: one invocation of each subgroup
// (its first active one) holds the subgroup's sum.
fn lane_sum(v: f32) -> f32 {
    return subgroupAdd(v);
}

fn lane_leader(tid: u32) -> bool {
    return subgroupBroadcastFirst(tid) == tid;
}
