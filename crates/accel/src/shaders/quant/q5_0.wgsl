// Q5_0: { f16 d; u8 qh[4]; u8 qs[16] }: Q4_0's nibbles with a 5th bit (bit j of qh for
// value j), minus 16.
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 22u;
const ROW_HEAD: u32 = 0u;

struct Group { qs: u32, qh: u32, d: f32 }

fn group(row: u32, s: u32) -> Group {
    let b = row + s * BLOCK_BYTES;
    return Group(b + 6u, word_at(b + 2u), f16_at(b));
}

fn values4(g: Group, i: u32) -> vec4<f32> {
    let q = word_at(g.qs + 4u * (i % 4u)) >> (4u * (i / 4u));
    let h = g.qh >> (4u * i);
    let hi = vec4<f32>(f32(h & 1u), f32((h >> 1u) & 1u), f32((h >> 2u) & 1u), f32((h >> 3u) & 1u));
    return (masked4(q, 15u) + 16.0 * hi - 16.0) * g.d;
}
