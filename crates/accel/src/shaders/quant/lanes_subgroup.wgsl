// Lane sums through the adapter's subgroup operations: each subgroup's first invocation
// holds the subgroup's sum.
struct Lanes {
    @builtin(subgroup_size) size: u32,
    @builtin(subgroup_invocation_id) id: u32,
}

fn lane_sum(v: f32) -> f32 {
    return subgroupAdd(v);
}

fn lane_first(l: Lanes) -> bool {
    return l.id == 0u;
}

fn lane_count(l: Lanes) -> u32 {
    return min(l.size, 64u);
}
