// BF16 weights read as groups of 32 values: two per word, the first in the low half (a
// bf16 is the high half of an f32).
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 64u;
const ROW_HEAD: u32 = 0u;

struct Group { word: u32 }

fn group(row: u32, s: u32) -> Group {
    return Group((row + s * BLOCK_BYTES) / 4u);
}

fn values4(g: Group, i: u32) -> vec4<f32> {
    let a = w[g.word + 2u * i];
    let b = w[g.word + 2u * i + 1u];
    return bitcast<vec4<f32>>(vec4<u32>(a << 16u, a & 0xffff0000u, b << 16u, b & 0xffff0000u));
}
