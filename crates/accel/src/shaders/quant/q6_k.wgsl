// Q6_K: { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }: two halves of 128 values; in
// half n, group q (0..4) takes nibbles of ql[64n + 32(q & 1) + l] (low for q < 2) and bits
// 2q of qh[32n + l], minus 32, with scale 8n + l / 16 + 2q.
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 210u;

fn decode32(row: u32, s: u32, v: ptr<function, array<f32, 32>>) {
    let b = row + (s / 8u) * BLOCK_BYTES;
    let n = (s % 8u) / 4u;
    let q = s % 4u;
    let d = f16_at(b + 208u);
    let sc = word_at(b + 192u + 8u * n + 2u * q);
    let d0 = d * i8_of(sc, 0u);
    let d1 = d * i8_of(sc, 1u);
    let ql = b + 64u * n + 32u * (q & 1u);
    let lo_shift = 4u * (q / 2u);
    for (var i = 0u; i < 8u; i++) {
        let l4 = word_at(ql + 4u * i) >> lo_shift;
        let h4 = word_at(b + 128u + 32u * n + 4u * i) >> (2u * q);
        var dl = d0;
        if (i >= 4u) {
            dl = d1;
        }
        for (var t = 0u; t < 4u; t++) {
            let x = ((l4 >> (8u * t)) & 15u) | (((h4 >> (8u * t)) & 3u) << 4u);
            (*v)[4u * i + t] = dl * (f32(x) - 32.0);
        }
    }
}
