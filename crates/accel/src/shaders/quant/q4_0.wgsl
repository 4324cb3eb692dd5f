// Q4_0: { f16 d; u8 qs[16] }: low nibbles are values 0..16, high nibbles 16..32, minus 8.
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 18u;

fn decode32(row: u32, s: u32, v: ptr<function, array<f32, 32>>) {
    let b = row + s * BLOCK_BYTES;
    let d = f16_at(b);
    for (var i = 0u; i < 4u; i++) {
        let q = word_at(b + 2u + 4u * i);
        for (var j = 0u; j < 4u; j++) {
            let x = (q >> (8u * j)) & 0xffu;
            (*v)[4u * i + j] = (f32(x & 15u) - 8.0) * d;
            (*v)[16u + 4u * i + j] = (f32(x >> 4u) - 8.0) * d;
        }
    }
}
