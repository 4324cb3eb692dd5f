// Q5_0: { f16 d; u8 qh[4]; u8 qs[16] }: Q4_0's nibbles with a 5th bit (bit j of qh for
// value j), minus 16.
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 22u;

fn decode32(row: u32, s: u32, v: ptr<function, array<f32, 32>>) {
    let b = row + s * BLOCK_BYTES;
    let d = f16_at(b);
    let qh = word_at(b + 2u);
    for (var i = 0u; i < 4u; i++) {
        let q = word_at(b + 6u + 4u * i);
        for (var j = 0u; j < 4u; j++) {
            let l = 4u * i + j;
            let x = (q >> (8u * j)) & 0xffu;
            let h0 = ((qh >> l) & 1u) << 4u;
            let h1 = ((qh >> (l + 16u)) & 1u) << 4u;
            (*v)[l] = (f32((x & 15u) | h0) - 16.0) * d;
            (*v)[16u + l] = (f32((x >> 4u) | h1) - 16.0) * d;
        }
    }
}
