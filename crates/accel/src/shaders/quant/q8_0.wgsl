// Q8_0: { f16 d; i8 qs[32] }.
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 34u;
const ROW_HEAD: u32 = 0u;

struct Group { qs: u32, d: f32 }

fn group(row: u32, s: u32) -> Group {
    let b = row + s * BLOCK_BYTES;
    return Group(b + 2u, f16_at(b));
}

fn values4(g: Group, i: u32) -> vec4<f32> {
    return i8x4(word_at(g.qs + 4u * i)) * g.d;
}
