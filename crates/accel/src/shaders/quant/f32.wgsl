// F32 weights read as groups of 32 values, so the kernels over blocks serve them too.
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 128u;
const ROW_HEAD: u32 = 0u;

struct Group { word: u32 }

fn group(row: u32, s: u32) -> Group {
    return Group((row + s * BLOCK_BYTES) / 4u);
}

fn values4(g: Group, i: u32) -> vec4<f32> {
    let o = g.word + 4u * i;
    return bitcast<vec4<f32>>(vec4<u32>(w[o], w[o + 1u], w[o + 2u], w[o + 3u]));
}
