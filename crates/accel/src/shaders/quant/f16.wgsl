// F16 weights read as groups of 32 values: two per word, the first in the low half.
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 64u;
const ROW_HEAD: u32 = 0u;

struct Group { word: u32 }

fn group(row: u32, s: u32) -> Group {
    return Group((row + s * BLOCK_BYTES) / 4u);
}

fn values4(g: Group, i: u32) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(w[g.word + 2u * i]), unpack2x16float(w[g.word + 2u * i + 1u]));
}
