//! INT8 tiles: a tile of ggml rows written as packed `Int8 { group: Some(32) }` (values
//! `q + 128`, lines of 16 rows x 4 `k`, a scale per row and 32 `k`; per 16 `k` for Q6_K and
//! Q3_K, see [`group`]); the [`biased`] types' values, never negative, as they are (`q`: the
//! matrix is `unsigned`, and its sums need no offset correction).
//!
//! Types whose values are `d · q + m` per group with one `d`, one `m` and `q` in int8 (Q4_0,
//! Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, IQ4_NL, IQ4_XS per 32; Q6_K, Q3_K per 16 with no `m`,
//! Q2_K per 16 with one: [`exact`], every type with a block decoder) are stored as they are,
//! with `d` as the group scale and `m` as the group's bias (`bias`), which multiplies the
//! group's activation sum outside the micro-kernels ([`add_bias`]): the tile holds the
//! weights exactly, and decoding it is a copy and a transpose. The others (F16, BF16, the grid
//! i-quants, when INT8 tiles are forced) are decoded to f32 and requantized per 32
//! symmetrically (`amax / 127`, round to nearest even), an error of at most `amax / 254` per
//! weight, under the 2- to 6-bit formats' own steps but a second rounding. Q4_K requantized
//! per 32 took 64 us per 64x2048 tile on a Xeon core, 70% of the tile's time at 32 tokens
//! (2026-11-27); stored exactly and decoded in registers (`q4_k`), 6-7 us (2026-11-28,
//! docs/benchmarks.md). Q6_K requantized per 32 cost a fixture its top-1 agreement with
//! llama.cpp (Q2_K was requantized so until 2026-11-30); stored exactly with a scale per 16
//! its tile flushes twice as often (about 0.7x Q4_K's rate on an Ice Lake core, 2026-11-30)
//! and still runs 2x the BF16 tiles there.
//!
//! The activations get a scale per 32 too (`Activations::int8_grouped`): with one per token,
//! four outlier channels at 64x the rest gave 6.6e-2 relative RMS error on Q4_K against 2.0e-3
//! for BF16 tiles; with one per 32, 1.05e-2 (the row-dot kernels' scale per 256: 3.0e-2).
//! The kernels flush per weight group of 32 (or 16) anyway, so the extra scales cost a load
//! per flush. Their sums are kept per group, for the offset correction of each flush.

use std::ops::Range;

use super::super::unpack::{UNIT, decoder};
#[cfg(target_arch = "x86_64")]
use super::direct;
use super::with_scratch;
use super::{Activations, GgmlType, Isa, LINE, PackedLayout, Rows, STRIP, Scratch, TILE_ROWS};
use super::{dequantize_row, has_fast_kernel, unpack_rows};

/// `k` per scale of an INT8 tile: the block size of the 32-value formats, and the sub-block of
/// Q4_K / Q5_K / IQ4_XS.
pub(crate) const GROUP: usize = 32;

/// `k` per scale of the INT8 tiles of the types with a scale per 16 (Q6_K, Q3_K, and Q2_K
/// with a min per 16 too): stored exactly, flushed twice as often.
const GROUP_16: usize = 16;

/// `k` per scale of `ty`'s INT8 tiles.
pub(crate) fn group(ty: GgmlType) -> usize {
    if matches!(ty, GgmlType::Q6_K | GgmlType::Q3_K | GgmlType::Q2_K) {
        GROUP_16
    } else {
        GROUP
    }
}

/// Whether `ty`'s decoded values are `d · q + m` with one `d` and one `m` per [`group`], so
/// that the tile stores them exactly (`m` as the group's bias).
pub(crate) fn exact(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4_K | Q5_K | IQ4_NL | IQ4_XS | Q6_K | Q3_K | Q2_K
    )
}

/// Whether a tile of `ty` has group biases (an [`exact`] type with mins).
pub(crate) fn biased(ty: GgmlType) -> bool {
    exact(ty) && decoder(ty) == Some(true)
}

/// `out[t][r] += Σ_g bias[g][r] · s[t][g]` for each token `t` of `tokens` (row `j` of `out`,
/// `ldo` apart), where `s[t][g]` is the dequantized sum of the token's activations over
/// group `g` (scale times int8 sum, the values the micro-kernels multiplied): the mins of an
/// [`exact`] tile. `bias` is `[groups][n_pad]`, `n_pad` at most [`TILE_ROWS`].
pub(super) fn add_bias(
    out: &mut [f32],
    ldo: usize,
    bias: &[f32],
    n_pad: usize,
    a: &Activations,
    tokens: Range<usize>,
) {
    #[cfg(target_arch = "x86_64")]
    if Isa::selected() >= Isa::Avx512 && n_pad.is_multiple_of(2 * STRIP) {
        // SAFETY: `Isa::Avx512` or better is only selected when the CPU has AVX-512 F.
        return unsafe { x86::add_bias(out, ldo, bias, n_pad, a, tokens) };
    }
    #[cfg(target_arch = "x86_64")]
    if Isa::selected() >= Isa::Avx2 {
        // SAFETY: `Isa::Avx2` or better is only selected when the CPU has AVX2 and FMA.
        return unsafe { add_bias_avx2(out, ldo, bias, n_pad, a, tokens) };
    }
    add_bias_body(out, ldo, bias, n_pad, a, tokens);
}

/// [`add_bias_body`] compiled for AVX2 (the same operations in the same order: the bits of
/// the portable loop).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn add_bias_avx2(
    out: &mut [f32],
    ldo: usize,
    bias: &[f32],
    n_pad: usize,
    a: &Activations,
    tokens: Range<usize>,
) {
    add_bias_body(out, ldo, bias, n_pad, a, tokens);
}

#[inline(always)]
fn add_bias_body(
    out: &mut [f32],
    ldo: usize,
    bias: &[f32],
    n_pad: usize,
    a: &Activations,
    tokens: Range<usize>,
) {
    // The bias groups are the activations' sum units (`group` of the tile's type).
    let groups = a.k_pad / a.xsum_unit;
    assert!(matches!(a.xsum_unit, 16 | 32) && n_pad <= TILE_ROWS && !a.scaled_sum.is_empty());
    let bias = &bias[..groups * n_pad];
    for (j, t) in tokens.enumerate() {
        let sums = &a.scaled_sum[t * groups..(t + 1) * groups];
        // A whole tile's width at a fixed size, so the loop below unrolls into registers.
        let mut acc = [0.0f32; TILE_ROWS];
        for (b, &s) in bias.chunks_exact(n_pad).zip(sums) {
            for (acc, &b) in acc.iter_mut().zip(b) {
                *acc += s * b;
            }
        }
        for (o, acc) in out[j * ldo..j * ldo + n_pad].iter_mut().zip(acc) {
            *o += acc;
        }
    }
}

/// The scale (`amax / 127`) and its inverse for a group's absolute maximum, as two
/// independent divisions: the fill's inner loop waits on them.
#[inline(always)]
fn scales(amax: f32) -> (f32, f32) {
    if amax > 0.0 {
        (amax / 127.0, 127.0 / amax)
    } else {
        (1.0, 1.0)
    }
}

/// Requantizes one group of 32 values: returns the scale and writes the stored bytes
/// (`q + 128`). Shared with the tests' twin, which must round exactly alike.
#[inline(always)]
pub(crate) fn requantize(v: &[f32; GROUP], out: &mut [u8; GROUP]) -> f32 {
    // |v| ordered as its bits without the sign (NaN as zero): an integer maximum, which
    // vectorises, where a chain of `f32::max` would not; in eight lanes, since one running
    // maximum stayed scalar on AVX2.
    let mut lanes = [0u32; 8];
    for chunk in v.chunks_exact(8) {
        for (l, x) in lanes.iter_mut().zip(chunk) {
            let b = x.to_bits() & 0x7fff_ffff;
            *l = (*l).max(if b > 0x7f80_0000 { 0 } else { b });
        }
    }
    let amax = f32::from_bits(lanes.into_iter().max().unwrap_or(0));
    let (scale, inv) = scales(amax);
    for (o, &x) in out.iter_mut().zip(v) {
        // Clamped in f32 (|x| / scale may round just past 127), NaN to 0, so that the
        // conversion needs no saturation and the loop vectorises.
        let y = x * inv;
        let y = if y.is_nan() { 0.0 } else { y };
        let y = y.clamp(-127.0, 127.0).round_ties_even();
        // SAFETY: `y` is an integer in [-127, 127], representable in i32.
        let q = unsafe { y.to_int_unchecked::<i32>() };
        *o = (q + 128) as u8;
    }
    scale
}

/// Writes `w` as a packed INT8 tile: values into `bytes`, scales (`[strip][group][16]`) into
/// `scales` and, for a [`biased`] type, the group biases (`[group][n_pad]`) into `bias`.
/// Padding rows and columns are zero (stored 128, or 0 for a [`biased`] type) with scale and
/// bias zero.
pub(super) fn fill(
    w: Rows<'_>,
    bytes: &mut [u8],
    scales: &mut [f32],
    bias: &mut [f32],
    layout: &PackedLayout,
) {
    with_scratch(|s| {
        #[cfg(target_arch = "x86_64")]
        {
            if Isa::selected() >= Isa::Avx512 {
                // SAFETY: `Isa::Avx512` or better is only selected when the CPU has AVX-512
                // F/BW.
                return unsafe { fill_avx512(s, w, bytes, scales, bias, layout) };
            }
            if Isa::selected() >= Isa::Avx2 {
                // SAFETY: `Isa::Avx2` or better is only selected when the CPU has AVX2 and FMA.
                return unsafe { fill_avx2(s, w, bytes, scales, bias, layout) };
            }
        }
        fill_body::<false, false>(s, w, bytes, scales, bias, layout);
    });
}

/// [`fill_body`] with the AVX-512 group and transpose routines (`x86`).
///
/// # Safety
/// The CPU must support AVX-512 F, BW and VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn fill_avx512(
    s: &mut Scratch,
    w: Rows<'_>,
    bytes: &mut [u8],
    scales: &mut [f32],
    bias: &mut [f32],
    layout: &PackedLayout,
) {
    fill_body::<true, true>(s, w, bytes, scales, bias, layout);
}

/// [`fill_body`] compiled with AVX2 enabled.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fill_avx2(
    s: &mut Scratch,
    w: Rows<'_>,
    bytes: &mut [u8],
    scales: &mut [f32],
    bias: &mut [f32],
    layout: &PackedLayout,
) {
    fill_body::<false, true>(s, w, bytes, scales, bias, layout);
}

/// The fill; `AVX512` only where the CPU has AVX-512 F, BW and VL (from [`fill_avx512`]),
/// `AVX2` only where it has AVX2 (from it or [`fill_avx2`]).
#[inline(always)]
pub(super) fn fill_body<const AVX512: bool, const AVX2: bool>(
    s: &mut Scratch,
    w: Rows<'_>,
    bytes: &mut [u8],
    scales: &mut [f32],
    bias: &mut [f32],
    layout: &PackedLayout,
) {
    let (k, k_pad, nr, n_pad) = (w.k, layout.k_pad, w.n, layout.n_pad);
    let group = group(w.ty);
    let groups = k_pad / group;
    let decoded = has_fast_kernel(w.ty);
    let (exact, biased) = (exact(w.ty), biased(w.ty));
    // What turns a decoded `q` into its stored byte: `q + 128`, or `q` itself for the
    // unsigned tiles of biased types.
    let flip = if biased { 0 } else { 0x80 };
    #[cfg(target_arch = "x86_64")]
    if AVX512 && matches!(w.ty, GgmlType::Q4_K | GgmlType::Q5_K) && k == k_pad {
        // The commonest expert types of MoE releases, decoded straight from their blocks.
        let (blocks, block, strips) = direct::strips(w, bytes, layout.strip_bytes);
        let strip = match w.ty {
            GgmlType::Q4_K => direct::q4_k_strip,
            _ => direct::q5_k_strip,
        };
        for (st, sc) in strips.zip(scales.chunks_exact_mut(groups * STRIP)) {
            let (src, rows) = (st.src, st.rows);
            // SAFETY: `AVX512` is only set by `fill_avx512`, whose caller checked the
            // features (F16C comes with AVX-512 on every CPU that has it).
            unsafe {
                strip(src, rows, blocks, block, st.dst);
                direct::q4_k_strip_scales(src, rows, blocks, block, sc, bias, st.r0, n_pad);
            }
        }
        return;
    }
    // The types with one scale per group of 32 and no mins, whose strips write their scales.
    #[cfg(target_arch = "x86_64")]
    let per_32: Option<direct::ScaledStripFn> = match w.ty {
        GgmlType::IQ4_XS => Some(direct::iq4_xs_strip),
        GgmlType::Q8_0 => Some(direct::q8_0_strip),
        GgmlType::Q4_0 => Some(direct::q4_0_like_strip::<false>),
        GgmlType::Q5_0 => Some(direct::q4_0_like_strip::<true>),
        _ => None,
    };
    #[cfg(target_arch = "x86_64")]
    if let Some(strip) = per_32.filter(|_| AVX512 && k == k_pad) {
        let (blocks, _, strips) = direct::strips(w, bytes, layout.strip_bytes);
        for (st, sc) in strips.zip(scales.chunks_exact_mut(groups * STRIP)) {
            // SAFETY: as for Q4_K above.
            unsafe { strip(st.src, st.rows, blocks, st.dst, sc) };
        }
        return;
    }
    // The types with a scale per 16 and no mins: Q6_K (the down projections of the Q4_K_M
    // files' every other layer) and Q3_K (the experts of the Q3_K_M files).
    #[cfg(target_arch = "x86_64")]
    let per_16: Option<(direct::StripFn, direct::StripScalesFn)> = match w.ty {
        GgmlType::Q6_K => Some((direct::q6_k_strip, direct::q6_k_strip_scales)),
        GgmlType::Q3_K => Some((direct::q3_k_strip, direct::q3_k_strip_scales)),
        _ => None,
    };
    #[cfg(target_arch = "x86_64")]
    if let Some((strip, strip_scales)) = per_16.filter(|_| AVX512 && k == k_pad) {
        let (blocks, block, strips) = direct::strips(w, bytes, layout.strip_bytes);
        for (st, sc) in strips.zip(scales.chunks_exact_mut(groups * STRIP)) {
            // SAFETY: as for Q4_K above.
            unsafe {
                strip(st.src, st.rows, blocks, block, st.dst);
                strip_scales(st.src, st.rows, blocks, block, sc);
            }
        }
        return;
    }
    // An exact type whose rows fill whole lines is transposed straight from its decoded
    // values (`q ^ 0x80` is the stored byte, `q` for a biased type): no copy of the tile in
    // between.
    let direct = decoded && exact && k == k_pad;
    if decoded {
        let rows = if direct { n_pad } else { nr };
        s.q.resize(rows * k, 0);
        s.q[nr * k..].fill(0);
        s.d.resize(nr * k / UNIT, 0.0);
        s.m.resize(nr * k / UNIT, 0.0);
        let q = &mut s.q[..nr * k];
        unpack_rows(Isa::selected(), w.ty, w.bytes, q, &mut s.d, &mut s.m);
    } else {
        s.f.resize(nr * k, 0.0);
        dequantize_row(w.ty, w.bytes, &mut s.f).expect("validated at construction");
    }
    // 1. The scales and biases (padding zero) and, unless `direct`, every row as stored
    // bytes, `k_pad` apart (padding the stored zero).
    scales.fill(0.0);
    if biased {
        bias[..groups * n_pad].fill(0.0);
    }
    if direct {
        // The units of a group share `d` and `m`: the first unit's.
        let (units, per_group) = (k / UNIT, group / UNIT);
        let rows = s.d.chunks_exact(units).zip(s.m.chunks_exact(units));
        for (r, (d, m)) in rows.enumerate().take(nr) {
            let (strip, c) = (r / STRIP, r % STRIP);
            let sc = &mut scales[strip * groups * STRIP..][..groups * STRIP];
            for (sc, d) in sc.chunks_exact_mut(STRIP).zip(d.chunks_exact(per_group)) {
                sc[c] = d[0];
            }
            if biased {
                for (b, m) in bias.chunks_exact_mut(n_pad).zip(m.chunks_exact(per_group)) {
                    b[r] = m[0];
                }
            }
        }
    } else {
        s.b.clear();
        s.b.resize(n_pad * k_pad, flip);
    }
    for r in (0..nr).filter(|_| !direct) {
        let row = &mut s.b[r * k_pad..(r + 1) * k_pad];
        let (strip, c) = (r / STRIP, r % STRIP);
        let sc = &mut scales[strip * groups * STRIP..][..groups * STRIP];
        // `k` is a whole number of blocks of 32 or 256 (or of 1 for the float types): a
        // group lies within `k` or within the padding, except a float type's last.
        for (g, qb) in row[..k.next_multiple_of(group)]
            .chunks_exact_mut(group)
            .enumerate()
        {
            let (p0, at) = (g * group, r * k + g * group);
            sc[g * STRIP + c] = if decoded && exact {
                let q = &s.q[at..at + group];
                for (b, &q) in qb.iter_mut().zip(q) {
                    *b = (q as u8) ^ flip;
                }
                if biased {
                    bias[g * n_pad + r] = s.m[at / UNIT];
                }
                s.d[at / UNIT]
            } else {
                // Requantized types (every decoded type is exact) have groups of [`GROUP`].
                debug_assert!(!decoded);
                let qb: &mut [u8; GROUP] = qb.try_into().expect("whole groups");
                let mut v = [0.0f32; GROUP];
                let len = GROUP.min(k - p0);
                v[..len].copy_from_slice(&s.f[at..at + len]);
                requantize(&v, qb)
            };
        }
    }
    // 2. Each strip is the transpose of its 16 rows' quads: line `l` holds `k = 4l .. 4l + 4`
    // of every row. Transposed 16 quads at a time, so each row is read 64 bytes at a time.
    let (src, flip): (&[u8], u8) = if direct {
        // SAFETY: i8 and u8 have the same size and alignment, and every bit pattern is valid.
        (
            unsafe { std::slice::from_raw_parts(s.q.as_ptr().cast(), s.q.len()) },
            flip,
        )
    } else {
        (&s.b, 0)
    };
    let lines = k_pad / 4;
    // The vector transposes take 16 whole lines at a time (`k_pad` is a multiple of 64).
    #[cfg(target_arch = "x86_64")]
    let transpose: Option<x86::Transpose> = if AVX512 {
        Some(x86::transpose16)
    } else if AVX2 {
        Some(x86::transpose16_avx2)
    } else {
        None
    };
    for (strip, dst) in bytes.chunks_exact_mut(layout.strip_bytes).enumerate() {
        let b = &src[strip * STRIP * k_pad..(strip + 1) * STRIP * k_pad];
        #[cfg(target_arch = "x86_64")]
        if let Some(transpose) = transpose {
            for l0 in (0..lines).step_by(STRIP) {
                let dst = &mut dst[l0 * LINE..][..STRIP * LINE];
                // SAFETY: `AVX512` and `AVX2` are only set by `fill_avx512` and `fill_avx2`,
                // whose callers checked the features; 16 whole lines remain.
                unsafe { transpose(&b[4 * l0..], k_pad, flip, dst) };
            }
            continue;
        }
        for l0 in (0..lines).step_by(STRIP) {
            let n = STRIP.min(lines - l0);
            for c in 0..STRIP {
                let row = &b[c * k_pad + 4 * l0..c * k_pad + 4 * (l0 + n)];
                for (i, quad) in row.chunks_exact(4).enumerate() {
                    let at = (l0 + i) * LINE + c * 4;
                    for (d, &v) in dst[at..at + 4].iter_mut().zip(quad) {
                        *d = v ^ flip;
                    }
                }
            }
        }
    }
}

/// AVX-512 forms of the fill's inner loops, bit for bit the scalar ones (finite weights).
#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::Activations;

    /// [`transpose16`] or [`transpose16_avx2`]: `(src, stride, flip, dst)`.
    pub(super) type Transpose = unsafe fn(&[u8], usize, u8, &mut [u8]);

    /// [`super::add_bias`] as a register-tiled product: 4 tokens x `n_pad` rows of sums in
    /// registers, each group's biases loaded once for the 4 tokens.
    ///
    /// # Safety
    /// AVX-512 F must be available; `n_pad` must be 32 or 64.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn add_bias(
        out: &mut [f32],
        ldo: usize,
        bias: &[f32],
        n_pad: usize,
        a: &Activations,
        tokens: Range<usize>,
    ) {
        let groups = a.k_pad / a.xsum_unit;
        let n = tokens.len();
        assert!(matches!(a.xsum_unit, 16 | 32) && !a.scaled_sum.is_empty());
        assert!(bias.len() >= groups * n_pad);
        assert!(matches!(n_pad, 32 | 64) && (n == 0 || out.len() >= (n - 1) * ldo + n_pad));
        assert!(a.scaled_sum.len() >= tokens.end * groups);
        let mut j = 0;
        while j < n {
            let mr = (n - j).min(4);
            let t0 = tokens.start + j;
            // SAFETY: the caller checked the features; rows `j .. j + mr` of `out` and
            // tokens `t0 .. t0 + mr` lie within the slices (checked above).
            unsafe {
                match (mr, n_pad) {
                    (1, 32) => bias_tile::<1, 2>(out, ldo, bias, a, t0, j),
                    (2, 32) => bias_tile::<2, 2>(out, ldo, bias, a, t0, j),
                    (3, 32) => bias_tile::<3, 2>(out, ldo, bias, a, t0, j),
                    (_, 32) => bias_tile::<4, 2>(out, ldo, bias, a, t0, j),
                    (1, _) => bias_tile::<1, 4>(out, ldo, bias, a, t0, j),
                    (2, _) => bias_tile::<2, 4>(out, ldo, bias, a, t0, j),
                    (3, _) => bias_tile::<3, 4>(out, ldo, bias, a, t0, j),
                    _ => bias_tile::<4, 4>(out, ldo, bias, a, t0, j),
                }
            }
            j += mr;
        }
    }

    /// `MR` tokens from `t0` (output rows from `j`) by `NS` strips of [`add_bias`].
    ///
    /// # Safety
    /// As [`add_bias`], whose checks cover the tile.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn bias_tile<const MR: usize, const NS: usize>(
        out: &mut [f32],
        ldo: usize,
        bias: &[f32],
        a: &Activations,
        t0: usize,
        j: usize,
    ) {
        let groups = a.k_pad / a.xsum_unit;
        let n_pad = NS * 16;
        let mut acc = [[_mm512_setzero_ps(); NS]; MR];
        for g in 0..groups {
            // SAFETY: group `g`'s `n_pad` biases lie within `bias` (checked by the caller).
            let b: [__m512; NS] = std::array::from_fn(|s| unsafe {
                _mm512_loadu_ps(bias.as_ptr().add(g * n_pad + 16 * s))
            });
            for (i, acc) in acc.iter_mut().enumerate() {
                // SAFETY: token `t0 + i`'s group `g` lies within `scaled_sum` (checked by
                // the caller).
                let sum =
                    _mm512_set1_ps(unsafe { *a.scaled_sum.as_ptr().add((t0 + i) * groups + g) });
                for s in 0..NS {
                    acc[s] = _mm512_fmadd_ps(b[s], sum, acc[s]);
                }
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            for (s, acc) in acc.iter().enumerate() {
                // SAFETY: row `j + i`, columns `16 s .. + 16` lie within `out` (caller).
                unsafe {
                    let o = out.as_mut_ptr().add((j + i) * ldo + 16 * s);
                    _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), *acc));
                }
            }
        }
    }

    /// Transposes 16 rows (`stride` bytes apart, 64 bytes each from the start of `src`) of 16
    /// quads (4 bytes: an INT8 quad or a BF16 pair) into 16 lines of `dst`: line `n` holds
    /// quad `n` of every row, each byte XORed with `flip`.
    ///
    /// # Safety
    /// AVX-512 F must be available.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    #[inline]
    pub(crate) unsafe fn transpose16(src: &[u8], stride: usize, flip: u8, dst: &mut [u8]) {
        assert!(src.len() >= 15 * stride + 64);
        // SAFETY: row `i` is read at `i * stride .. + 64`, within `src` (checked above).
        let r = unsafe {
            let flip = _mm512_set1_epi8(flip as i8);
            std::array::from_fn(|i| {
                _mm512_xor_si512(
                    _mm512_loadu_si512(src.as_ptr().add(i * stride).cast()),
                    flip,
                )
            })
        };
        // SAFETY: the caller checked the features.
        unsafe { transpose16_regs(r, dst) }
    }

    /// [`transpose16`] on AVX2: the 16x16 quads as four 8x8 transposes of ymm dwords.
    ///
    /// # Safety
    /// AVX2 must be available.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(crate) unsafe fn transpose16_avx2(src: &[u8], stride: usize, flip: u8, dst: &mut [u8]) {
        assert!(src.len() >= 15 * stride + 64 && dst.len() >= 16 * 64);
        // SAFETY: row `i` is read at `i * stride .. + 64` and line `n` written at `64 n ..
        // + 64`, within `src` and `dst` (checked above).
        unsafe {
            let flip = _mm256_set1_epi8(flip as i8);
            // `half[h][i]`: quads `8 h .. 8 h + 8` of row `i`.
            let half: [[__m256i; 16]; 2] = std::array::from_fn(|h| {
                std::array::from_fn(|i| {
                    let p = src.as_ptr().add(i * stride + 32 * h);
                    _mm256_xor_si256(_mm256_loadu_si256(p.cast()), flip)
                })
            });
            for (h, rows) in half.iter().enumerate() {
                for (g, rows) in rows.chunks_exact(8).enumerate() {
                    let t = transpose8(rows.try_into().expect("8 rows"));
                    // Quad `8 h + n` of rows `8 g .. 8 g + 8` is the `g`-th half of line
                    // `8 h + n`.
                    for (n, v) in t.into_iter().enumerate() {
                        let at = (8 * h + n) * 64 + 32 * g;
                        _mm256_storeu_si256(dst.as_mut_ptr().add(at).cast(), v);
                    }
                }
            }
        }
    }

    /// An 8x8 transpose of dwords: lane `n` of `r[i]` to lane `i` of the result's `n`.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn transpose8(r: [__m256i; 8]) -> [__m256i; 8] {
        // Pairs of rows interleaved by dword, then fours by qword: `u[c]` and `u[4 + c]` hold
        // quads `c` (low lane) and `c + 4` (high lane) of rows 0-3 and 4-7.
        let t: [__m256i; 8] = std::array::from_fn(|i| {
            let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
            if i % 2 == 0 {
                _mm256_unpacklo_epi32(a, b)
            } else {
                _mm256_unpackhi_epi32(a, b)
            }
        });
        let u: [__m256i; 8] = std::array::from_fn(|i| {
            let (q, c) = (i / 4, i % 4);
            let (a, b) = (t[4 * q + c / 2], t[4 * q + c / 2 + 2]);
            if c % 2 == 0 {
                _mm256_unpacklo_epi64(a, b)
            } else {
                _mm256_unpackhi_epi64(a, b)
            }
        });
        std::array::from_fn(|n| {
            let (a, b) = (u[n % 4], u[4 + n % 4]);
            if n < 4 {
                _mm256_permute2x128_si256::<0x20>(a, b)
            } else {
                _mm256_permute2x128_si256::<0x31>(a, b)
            }
        })
    }

    /// [`transpose16`] of rows already in registers: line `n` of `dst` gets quad `n` of
    /// every `r[i]`.
    ///
    /// # Safety
    /// AVX-512 F must be available.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    #[inline]
    pub(crate) unsafe fn transpose16_regs(r: [__m512i; 16], dst: &mut [u8]) {
        assert!(dst.len() >= 16 * 64);
        for (n, line) in crate::transpose::dwords16(r).into_iter().enumerate() {
            // SAFETY: line `n` is written at `64 n .. + 64`, within `dst` (checked above).
            unsafe { _mm512_storeu_si512(dst.as_mut_ptr().add(64 * n).cast(), line) };
        }
    }
}
