// A converted model's packed INT4 by rows (`WeightType::Int4`): blocks of 32 as
// { f32 d; u8 qs[16] }, value i in the low nibble of byte i, value i + 16 in the high one,
// each stored plus 8. Blocks are whole words.
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 20u;
const ROW_HEAD: u32 = 0u;

struct Group { qs: u32, d: f32 }

fn group(row: u32, s: u32) -> Group {
    let b = row + s * BLOCK_BYTES;
    return Group(b + 4u, bitcast<f32>(w[b >> 2u]));
}

fn values4(g: Group, i: u32) -> vec4<f32> {
    let q = w[(g.qs >> 2u) + (i & 3u)] >> (4u * (i >> 2u));
    return (masked4(q, 15u) - vec4<f32>(8.0)) * g.d;
}
