// Reading ggml blocks stored as in the file from the kernel's weight words `w`: a row may
// start at any byte, so loads take bytes and unaligned words. Every block is an even
// number of bytes, so the f16 fields sit at even offsets and never straddle a word.
//
// Each type's file defines QK (values per block), BLOCK_BYTES, ROW_HEAD, a `Group` (what a group of
// 32 values needs: its scales and where its bits are), `group(row, s)` for group `s` of the
// row starting at byte `row`, and `values4(g, i)`: its values 4i..4i+4 (i < 8). Kernels
// keep decoded values in registers (vec4s), never in arrays, which GPU compilers may place
// in slow local memory.

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

// The four bytes of `q` as signed values.
fn i8x4(q: u32) -> vec4<f32> {
    let v = bitcast<i32>(q);
    return vec4<f32>(
        f32(extractBits(v, 0u, 8u)),
        f32(extractBits(v, 8u, 8u)),
        f32(extractBits(v, 16u, 8u)),
        f32(extractBits(v, 24u, 8u)),
    );
}

// Bits `mask` of each byte of `q` (after the caller's shift) as values.
fn masked4(q: u32, mask: u32) -> vec4<f32> {
    return vec4<f32>(
        f32(q & mask),
        f32((q >> 8u) & mask),
        f32((q >> 16u) & mask),
        f32((q >> 24u) & mask),
    );
}

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

// Bytes of a row of `k` values (ROW_HEAD: bytes before its blocks).
fn row_bytes(k: u32) -> u32 {
    return ROW_HEAD + (k / QK) * BLOCK_BYTES;
}

// The 32 values of group `s` of the row starting at byte `row` (the embedding gather,
// which stores them all).
fn decode32(row: u32, s: u32, v: ptr<function, array<f32, 32>>) {
    let g = group(row, s);
    for (var i = 0u; i < 8u; i++) {
        let q = values4(g, i);
        (*v)[4u * i] = q.x;
        (*v)[4u * i + 1u] = q.y;
        (*v)[4u * i + 2u] = q.z;
        (*v)[4u * i + 3u] = q.w;
    }
}
