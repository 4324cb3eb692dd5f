// Q4_K: { f16 d; f16 dmin; u8 scales[12]; u8 qs[128] }: 8 groups of 32 with 6-bit scale
// and min; each 32 bytes of qs hold two groups (low nibbles, then high).
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 144u;
const ROW_HEAD: u32 = 0u;

struct Group { qs: u32, shift: u32, d: f32, m: f32 }

fn group(row: u32, s: u32) -> Group {
    let b = row + (s / 8u) * BLOCK_BYTES;
    let j = s % 8u;
    let sm = scale_min_k4(b + 4u, j);
    return Group(b + 16u + 32u * (j / 2u), 4u * (j % 2u), f16_at(b) * sm.x, f16_at(b + 2u) * sm.y);
}

fn values4(g: Group, i: u32) -> vec4<f32> {
    return g.d * masked4(word_at(g.qs + 4u * i) >> g.shift, 15u) - g.m;
}
