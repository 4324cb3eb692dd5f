// Q4_0: { f16 d; u8 qs[16] }: low nibbles are values 0..16, high nibbles 16..32, minus 8.
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 18u;
const ROW_HEAD: u32 = 0u;

struct Group { qs: u32, d: f32 }

fn group(row: u32, s: u32) -> Group {
    let b = row + s * BLOCK_BYTES;
    return Group(b + 2u, f16_at(b));
}

fn values4(g: Group, i: u32) -> vec4<f32> {
    let q = word_at(g.qs + 4u * (i % 4u)) >> (4u * (i / 4u));
    return (masked4(q, 15u) - 8.0) * g.d;
}
