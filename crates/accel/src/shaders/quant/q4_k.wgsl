// Q4_K: { f16 d; f16 dmin; u8 scales[12]; u8 qs[128] }: 8 groups of 32 with 6-bit scale
// and min; each 32 bytes of qs hold two groups (low nibbles, then high).
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 144u;

fn decode32(row: u32, s: u32, v: ptr<function, array<f32, 32>>) {
    let b = row + (s / 8u) * BLOCK_BYTES;
    let j = s % 8u;
    let sm = scale_min_k4(b + 4u, j);
    let d = f16_at(b) * sm.x;
    let m = f16_at(b + 2u) * sm.y;
    let qs = b + 16u + 32u * (j / 2u);
    let shift = 4u * (j % 2u);
    for (var i = 0u; i < 8u; i++) {
        let q = word_at(qs + 4u * i) >> shift;
        for (var t = 0u; t < 4u; t++) {
            (*v)[4u * i + t] = d * f32((q >> (8u * t)) & 15u) - m;
        }
    }
}
