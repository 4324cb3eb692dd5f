// Q6_K: { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }: two halves of 128 values; in
// half n, group q (0..4) takes nibbles of ql[64n + 32(q & 1) + l] (low for q < 2) and bits
// 2q of qh[32n + l], minus 32, with scale 8n + l / 16 + 2q.
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 210u;
const ROW_HEAD: u32 = 0u;

struct Group { ql: u32, lo_shift: u32, qh: u32, hi_shift: u32, d0: f32, d1: f32 }

fn group(row: u32, s: u32) -> Group {
    let b = row + (s / 8u) * BLOCK_BYTES;
    let n = (s % 8u) / 4u;
    let q = s % 4u;
    let d = f16_at(b + 208u);
    let sc = word_at(b + 192u + 8u * n + 2u * q);
    return Group(
        b + 64u * n + 32u * (q & 1u), 4u * (q / 2u), b + 128u + 32u * n, 2u * q,
        d * i8_of(sc, 0u), d * i8_of(sc, 1u),
    );
}

fn values4(g: Group, i: u32) -> vec4<f32> {
    let lo = masked4(word_at(g.ql + 4u * i) >> g.lo_shift, 15u);
    let hi = masked4(word_at(g.qh + 4u * i) >> g.hi_shift, 3u);
    return select(g.d0, g.d1, i >= 4u) * (lo + 16.0 * hi - 32.0);
}
