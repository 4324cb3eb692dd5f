// Q8_0: { f16 d; i8 qs[32] }.
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 34u;

fn decode32(row: u32, s: u32, v: ptr<function, array<f32, 32>>) {
    let b = row + s * BLOCK_BYTES;
    let d = f16_at(b);
    for (var i = 0u; i < 8u; i++) {
        let q = word_at(b + 2u + 4u * i);
        for (var j = 0u; j < 4u; j++) {
            (*v)[4u * i + j] = i8_of(q, j) * d;
        }
    }
}
