// Q5_K: { f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128] }: Q4_K with a 5th bit
// per value, bit j of qh[l] for value l of group j.
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 176u;
const ROW_HEAD: u32 = 0u;

struct Group { qs: u32, shift: u32, qh: u32, j: u32, d: f32, m: f32 }

fn group(row: u32, s: u32) -> Group {
    let b = row + (s / 8u) * BLOCK_BYTES;
    let j = s % 8u;
    let sm = scale_min_k4(b + 4u, j);
    return Group(
        b + 48u + 32u * (j / 2u), 4u * (j % 2u), b + 16u, j,
        f16_at(b) * sm.x, f16_at(b + 2u) * sm.y,
    );
}

fn values4(g: Group, i: u32) -> vec4<f32> {
    let q = masked4(word_at(g.qs + 4u * i) >> g.shift, 15u);
    let h = masked4(word_at(g.qh + 4u * i) >> g.j, 1u);
    return g.d * (q + 16.0 * h) - g.m;
}
