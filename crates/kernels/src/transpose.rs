//! The 16 x 16 transpose of 32-bit elements in AVX-512 registers: the INT8 tiles' lines
//! (quads of bytes, one per row) and attention's keys side by side (f32).

use std::arch::x86_64::*;

/// `out[n]` holds element `n` of every `r[i]` (in lane `i`).
// `c` names both the source registers' groups and the output registers.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn dwords16(r: [__m512i; 16]) -> [__m512i; 16] {
    // Pairs of rows interleaved by dword, then groups of four rows by qword: `v[g][c]` holds,
    // in 128-bit lane `j`, element `4 j + c` of rows `4 g .. 4 g + 4`.
    let mut v = [[_mm512_setzero_si512(); 4]; 4];
    for (g, v) in v.iter_mut().enumerate() {
        let [a, b, c, d] = [r[4 * g], r[4 * g + 1], r[4 * g + 2], r[4 * g + 3]];
        let (lo01, hi01) = (_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
        let (lo23, hi23) = (_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
        v[0] = _mm512_unpacklo_epi64(lo01, lo23);
        v[1] = _mm512_unpackhi_epi64(lo01, lo23);
        v[2] = _mm512_unpacklo_epi64(hi01, hi23);
        v[3] = _mm512_unpackhi_epi64(hi01, hi23);
    }
    // A 4x4 transpose of 128-bit lanes per `c`: output `4 j + c` is lane `j` of
    // `v[0][c] .. v[3][c]`.
    let mut out = [_mm512_setzero_si512(); 16];
    for c in 0..4 {
        let x0 = _mm512_shuffle_i32x4::<0x44>(v[0][c], v[1][c]);
        let x1 = _mm512_shuffle_i32x4::<0xee>(v[0][c], v[1][c]);
        let x2 = _mm512_shuffle_i32x4::<0x44>(v[2][c], v[3][c]);
        let x3 = _mm512_shuffle_i32x4::<0xee>(v[2][c], v[3][c]);
        out[c] = _mm512_shuffle_i32x4::<0x88>(x0, x2);
        out[4 + c] = _mm512_shuffle_i32x4::<0xdd>(x0, x2);
        out[8 + c] = _mm512_shuffle_i32x4::<0x88>(x1, x3);
        out[12 + c] = _mm512_shuffle_i32x4::<0xdd>(x1, x3);
    }
    out
}
