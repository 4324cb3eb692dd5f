// A converted model's packed INT8 by rows (`WeightType::Int8`): { f32 d; i8 q[k] } per row,
// groups of 32 at bytes 4 + 32 s. Rows are whole words (k is a multiple of 32).
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 32u;
const ROW_HEAD: u32 = 4u;

struct Group { qs: u32, d: f32 }

fn group(row: u32, s: u32) -> Group {
    return Group(row + ROW_HEAD + s * BLOCK_BYTES, bitcast<f32>(w[row >> 2u]));
}

fn values4(g: Group, i: u32) -> vec4<f32> {
    return i8x4(w[(g.qs >> 2u) + i]) * g.d;
}
