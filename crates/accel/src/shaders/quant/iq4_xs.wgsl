// IQ4_XS: { f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128] }: 8 groups of 32 with 6-bit
// scales minus 32 (low nibble in scales_l, high pair in scales_h); nibbles index the
// IQ4_NL grid, low nibbles first.
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 136u;

fn decode32(row: u32, s: u32, v: ptr<function, array<f32, 32>>) {
    let b = row + (s / 8u) * BLOCK_BYTES;
    let j = s % 8u;
    let head = word_at(b);
    let lo = (byte_at(b + 4u + j / 2u) >> (4u * (j % 2u))) & 15u;
    let hi = (head >> (16u + 2u * j)) & 3u;
    let dl = unpack2x16float(head & 0xffffu).x * (f32(lo | (hi << 4u)) - 32.0);
    for (var i = 0u; i < 4u; i++) {
        let q = word_at(b + 8u + 16u * j + 4u * i);
        for (var t = 0u; t < 4u; t++) {
            let x = (q >> (8u * t)) & 0xffu;
            (*v)[4u * i + t] = dl * IQ4NL[x & 15u];
            (*v)[16u + 4u * i + t] = dl * IQ4NL[x >> 4u];
        }
    }
}
