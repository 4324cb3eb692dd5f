// Reading ggml blocks stored as in the file from the kernel's weight words `w`: a row may
// start at any byte, so loads take bytes and unaligned words. Every block is an even
// number of bytes, so the f16 fields sit at even offsets and never straddle a word.
// Each type's file defines QK (values per block), BLOCK_BYTES and
// `decode32(row, s, v)`: the 32 values of group `s` of the row starting at byte `row`.

fn byte_at(o: u32) -> u32 {
    return (w[o >> 2u] >> ((o & 3u) * 8u)) & 0xffu;
}

// Four bytes from byte `o`, little-endian.
fn word_at(o: u32) -> u32 {
    let sh = (o & 3u) * 8u;
    let lo = w[o >> 2u];
    if (sh == 0u) {
        return lo;
    }
    return (lo >> sh) | (w[(o >> 2u) + 1u] << (32u - sh));
}

fn f16_at(o: u32) -> f32 {
    return unpack2x16float((w[o >> 2u] >> ((o & 2u) * 8u)) & 0xffffu).x;
}

// Byte `j` (0..4) of `q` as a signed value.
fn i8_of(q: u32, j: u32) -> f32 {
    return f32(extractBits(bitcast<i32>(q), 8u * j, 8u));
}

// The non-linear grid of IQ4_NL and IQ4_XS (ggml's kvalues_iq4nl).
var<private> IQ4NL: array<f32, 16> = array<f32, 16>(
    -127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
    1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0
);

// Scale and min `j` (0..8) of a Q4_K/Q5_K block's 12 packed 6-bit pairs at byte `sc`.
fn scale_min_k4(sc: u32, j: u32) -> vec2<f32> {
    if (j < 4u) {
        return vec2<f32>(f32(byte_at(sc + j) & 63u), f32(byte_at(sc + j + 4u) & 63u));
    }
    let q = byte_at(sc + j + 4u);
    let s = (q & 15u) | ((byte_at(sc + j - 4u) >> 6u) << 4u);
    let m = (q >> 4u) | ((byte_at(sc + j) >> 6u) << 4u);
    return vec2<f32>(f32(s), f32(m));
}


// Bytes of a row of `k` values.
fn row_bytes(k: u32) -> u32 {
    return (k / QK) * BLOCK_BYTES;
}
