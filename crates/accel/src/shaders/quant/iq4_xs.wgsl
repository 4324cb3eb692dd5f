// IQ4_XS: { f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128] }: 8 groups of 32 with 6-bit
// scales minus 32 (low nibble in scales_l, high pair in scales_h); nibbles index the
// IQ4_NL grid, low nibbles first.
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 136u;
const ROW_HEAD: u32 = 0u;

struct Group { qs: u32, d: f32 }

fn group(row: u32, s: u32) -> Group {
    let b = row + (s / 8u) * BLOCK_BYTES;
    let j = s % 8u;
    let head = word_at(b);
    let lo = (byte_at(b + 4u + j / 2u) >> (4u * (j % 2u))) & 15u;
    let hi = (head >> (16u + 2u * j)) & 3u;
    return Group(b + 8u + 16u * j, unpack2x16float(head & 0xffffu).x * (f32(lo | (hi << 4u)) - 32.0));
}

// ggml's kvalues_iq4nl as signed bytes, four per word: selected by bits rather than
// indexed as an array, which GPU compilers may place in local memory.
fn iq4nl(n: u32) -> f32 {
    let lo = select(0xbfad9881u, 0xf6eaddcfu, (n & 4u) != 0u);
    let hi = select(0x26190d01u, 0x71594535u, (n & 4u) != 0u);
    return i8_of(select(lo, hi, (n & 8u) != 0u), n & 3u);
}

fn values4(g: Group, i: u32) -> vec4<f32> {
    let q = word_at(g.qs + 4u * (i % 4u)) >> (4u * (i / 4u));
    return g.d * vec4<f32>(iq4nl(q & 15u), iq4nl((q >> 8u) & 15u), iq4nl((q >> 16u) & 15u), iq4nl((q >> 24u) & 15u));
}
