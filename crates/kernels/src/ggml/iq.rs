//! Reference dequantization of ggml's low-bit i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
//! IQ3_S, IQ1_S, IQ1_M), the ternary TQ1_0 / TQ2_0 and MXFP4, one `block_*` function per type.
//!
//! The i-quants code groups of 4 or 8 weights as an index into a lattice grid (`iq2xxs_grid`,
//! `iq3s_grid`, ...) plus sign bits and a per-32 sub-block scale. Each function below decodes
//! one block laid out as in ggml-common.h with the arithmetic of ggml's `dequantize_row_*`,
//! in the same order (`db * grid[j] * sign`, `dl * (grid[j] + delta)`, all f32), so the result
//! matches ggml and gguf-py bit for bit; `tests/ggml_dequant.rs` holds gguf-py's answers.
//!
//! A key design decision is that the grids are data, not code: `iq_grids.bin` holds every
//! entry's bytes (one byte per weight, in the byte order of ggml's little-endian u64/u32
//! tables), written by `make_iq_grids.py` next to this file from the `gguf` PyPI package, and
//! is used in place through `include_bytes!` (its length is checked by the compiler), so there
//! is nothing to decode at start-up and no hand-copied table to get wrong. Regenerate with
//! `/work/venv-gguf/bin/python crates/kernels/src/ggml/make_iq_grids.py` (the output must not
//! change). The small tables (`ksigns_iq2xs`, `kmask_iq2xs`, `kvalues_mxfp4`) are computed
//! or written out here.

use half::f16;

/// Every grid, concatenated; see `make_iq_grids.py` for the layout.
static GRIDS: &[u8; 33792] = include_bytes!("iq_grids.bin");

/// A grid inside [`GRIDS`]: byte offset and weights per entry.
#[derive(Clone, Copy)]
struct Grid(usize, usize);

/// `iq2xxs_grid`: 256 entries of 8 weights from {8, 25, 43}.
const IQ2XXS: Grid = Grid(0, 8);
/// `iq2xs_grid`: 512 entries of 8.
const IQ2XS: Grid = Grid(2048, 8);
/// `iq2s_grid`: 1024 entries of 8.
const IQ2S: Grid = Grid(6144, 8);
/// `iq3xxs_grid`: 256 entries of 4 weights from {4, 12, ..., 62}.
const IQ3XXS: Grid = Grid(14336, 4);
/// `iq3s_grid`: 512 entries of 4 odd weights 1..15.
const IQ3S: Grid = Grid(15360, 4);
/// `iq1s_grid`: 2048 entries of 8 weights from {-1, 0, 1} (stored as i8).
const IQ1S: Grid = Grid(17408, 8);

impl Grid {
    /// The weights of entry `i` (callers mask `i` to the grid's size).
    #[inline]
    fn entry(self, i: usize) -> &'static [u8] {
        let start = self.0 + i * self.1;
        &GRIDS[start..start + self.1]
    }
}

/// `ksigns_iq2xs`: 7 sign bits and an eighth that makes the number of minus signs even.
const KSIGNS_IQ2XS: [u8; 128] = {
    let mut t = [0u8; 128];
    let mut i = 0;
    while i < 128 {
        t[i] = i as u8 | (((i as u32).count_ones() as u8 & 1) << 7);
        i += 1;
    }
    t
};

/// The shift of every IQ1_S / IQ1_M grid value (`IQ1S_DELTA`, `IQ1M_DELTA`).
const IQ1S_DELTA: f32 = 0.125;

/// E2M1 values doubled (`kvalues_mxfp4`); the scale is halved to match.
const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

#[inline]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

#[inline]
fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

#[inline]
fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// `signs & kmask_iq2xs[j] ? -1.f : 1.f`.
#[inline]
fn sign(signs: u8, j: usize) -> f32 {
    if signs & (1 << j) != 0 { -1.0 } else { 1.0 }
}

/// Eight weights `db * grid[j] * sign(j)` from one 8-wide grid entry.
#[inline]
fn signed8(y: &mut [f32], db: f32, grid: &[u8], signs: u8) {
    for j in 0..8 {
        y[j] = db * grid[j] as f32 * sign(signs, j);
    }
}

/// `{ f16 d; u16 qs[32] }`: per 32 weights, 4 grid indices (bytes) then a u32 holding four
/// 7-bit sign indices and a 4-bit scale on top.
pub(super) fn block_iq2_xxs(x: &[u8], y: &mut [f32]) {
    let d = f16_at(x, 0);
    for ib32 in 0..8 {
        let q = &x[2 + 8 * ib32..2 + 8 * ib32 + 8];
        let aux = u32_at(q, 4);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.25;
        for l in 0..4 {
            let grid = IQ2XXS.entry(q[l] as usize);
            let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
            let o = 32 * ib32 + 8 * l;
            signed8(&mut y[o..o + 8], db, grid, signs);
        }
    }
}

/// `{ f16 d; u16 qs[32]; u8 scales[8] }`: each u16 is a 9-bit grid index and a 7-bit sign
/// index; two 4-bit scales per 32 weights.
pub(super) fn block_iq2_xs(x: &[u8], y: &mut [f32]) {
    let d = f16_at(x, 0);
    for (ib32, &sc) in x[66..74].iter().enumerate() {
        let db = [
            d * (0.5 + (sc & 0x0f) as f32) * 0.25,
            d * (0.5 + (sc >> 4) as f32) * 0.25,
        ];
        for l in 0..4 {
            let q = u16_at(x, 2 + 2 * (4 * ib32 + l));
            let grid = IQ2XS.entry((q & 511) as usize);
            let signs = KSIGNS_IQ2XS[(q >> 9) as usize];
            let o = 32 * ib32 + 8 * l;
            signed8(&mut y[o..o + 8], db[l / 2], grid, signs);
        }
    }
}

/// `{ f16 d; u8 qs[32]; u8 signs[32]; u8 qh[8]; u8 scales[8] }`: 10-bit grid indices (low
/// byte in `qs`, 2 high bits in `qh`), explicit sign bytes, two 4-bit scales per 32 weights.
pub(super) fn block_iq2_s(x: &[u8], y: &mut [f32]) {
    let d = f16_at(x, 0);
    let (qs, signs) = (&x[2..34], &x[34..66]);
    let (qh, scales) = (&x[66..74], &x[74..82]);
    for ib32 in 0..8 {
        let db = [
            d * (0.5 + (scales[ib32] & 0x0f) as f32) * 0.25,
            d * (0.5 + (scales[ib32] >> 4) as f32) * 0.25,
        ];
        for l in 0..4 {
            let hi = ((qh[ib32] as usize) << (8 - 2 * l)) & 0x300;
            let grid = IQ2S.entry(qs[4 * ib32 + l] as usize | hi);
            let o = 32 * ib32 + 8 * l;
            signed8(&mut y[o..o + 8], db[l / 2], grid, signs[4 * ib32 + l]);
        }
    }
}

/// `{ f16 d; u8 qs[64]; u32 scales_and_signs[8] }`: 4-wide grid indices, and per 32 weights a
/// u32 of four 7-bit sign indices and a 4-bit scale.
pub(super) fn block_iq3_xxs(x: &[u8], y: &mut [f32]) {
    let d = f16_at(x, 0);
    for ib32 in 0..8 {
        let qs = &x[2 + 8 * ib32..2 + 8 * ib32 + 8];
        let aux = u32_at(x, 66 + 4 * ib32);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
        for l in 0..4 {
            let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
            let g1 = IQ3XXS.entry(qs[2 * l] as usize);
            let g2 = IQ3XXS.entry(qs[2 * l + 1] as usize);
            let y = &mut y[32 * ib32 + 8 * l..32 * ib32 + 8 * l + 8];
            for j in 0..4 {
                y[j] = db * g1[j] as f32 * sign(signs, j);
                y[j + 4] = db * g2[j] as f32 * sign(signs, j + 4);
            }
        }
    }
}

/// `{ f16 d; u8 qs[64]; u8 qh[8]; u8 signs[32]; u8 scales[4] }`: 9-bit 4-wide grid indices
/// (ninth bit in `qh`), explicit sign bytes, one 4-bit odd scale per 32 weights.
pub(super) fn block_iq3_s(x: &[u8], y: &mut [f32]) {
    let d = f16_at(x, 0);
    let (qs, qh) = (&x[2..66], &x[66..74]);
    let (signs, scales) = (&x[74..106], &x[106..110]);
    for ib32 in 0..8 {
        let sc = (scales[ib32 / 2] >> (4 * (ib32 % 2))) & 0x0f;
        let db = d * (1 + 2 * sc as i32) as f32;
        let h = qh[ib32] as usize;
        for l in 0..4 {
            let g1 = IQ3S.entry(qs[8 * ib32 + 2 * l] as usize | ((h << (8 - 2 * l)) & 256));
            let g2 = IQ3S.entry(qs[8 * ib32 + 2 * l + 1] as usize | ((h << (7 - 2 * l)) & 256));
            let s = signs[4 * ib32 + l];
            let y = &mut y[32 * ib32 + 8 * l..32 * ib32 + 8 * l + 8];
            for j in 0..4 {
                y[j] = db * g1[j] as f32 * sign(s, j);
                y[j + 4] = db * g2[j] as f32 * sign(s, j + 4);
            }
        }
    }
}

/// Eight weights `dl * (grid[j] + delta)` from one `iq1s_grid` entry.
#[inline]
fn shifted8(y: &mut [f32], dl: f32, idx: usize, delta: f32) {
    let grid = IQ1S.entry(idx);
    for j in 0..8 {
        y[j] = dl * ((grid[j] as i8) as f32 + delta);
    }
}

/// `{ f16 d; u8 qs[32]; u16 qh[8] }`: 11-bit grid indices (3 high bits each in `qh`), and
/// per 32 weights a 3-bit odd scale and the sign of the shift in the top bits of `qh`.
pub(super) fn block_iq1_s(x: &[u8], y: &mut [f32]) {
    let d = f16_at(x, 0);
    for ib in 0..8 {
        let qh = u16_at(x, 34 + 2 * ib);
        let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
        let delta = if qh & 0x8000 != 0 {
            -IQ1S_DELTA
        } else {
            IQ1S_DELTA
        };
        for l in 0..4 {
            let idx = x[2 + 4 * ib + l] as usize | ((((qh >> (3 * l)) & 7) as usize) << 8);
            let o = 32 * ib + 8 * l;
            shifted8(&mut y[o..o + 8], dl, idx, delta);
        }
    }
}

/// `{ u8 qs[32]; u8 qh[16]; u16 scales[4] }`: 11-bit grid indices, a shift sign per 8
/// weights (bit 3 of each `qh` nibble), 3-bit odd scales per 16 weights, and the f16 block
/// scale spread over the top nibbles of the four `scales` words.
pub(super) fn block_iq1_m(x: &[u8], y: &mut [f32]) {
    let sc = [0, 1, 2, 3].map(|k| u16_at(x, 48 + 2 * k));
    let bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
    let d = f16::from_bits(bits).to_f32();
    for ib in 0..8 {
        let s = sc[ib / 2] >> (6 * (ib % 2));
        let dl1 = d * (2 * (s & 7) + 1) as f32;
        let dl2 = d * (2 * ((s >> 3) & 7) + 1) as f32;
        let qs = &x[4 * ib..4 * ib + 4];
        let (h0, h1) = (x[32 + 2 * ib] as usize, x[33 + 2 * ib] as usize);
        let idx = [
            qs[0] as usize | ((h0 << 8) & 0x700),
            qs[1] as usize | ((h0 << 4) & 0x700),
            qs[2] as usize | ((h1 << 8) & 0x700),
            qs[3] as usize | ((h1 << 4) & 0x700),
        ];
        let delta = |h: usize, bit: usize| {
            if h & bit != 0 {
                -IQ1S_DELTA
            } else {
                IQ1S_DELTA
            }
        };
        let deltas = [
            delta(h0, 0x08),
            delta(h0, 0x80),
            delta(h1, 0x08),
            delta(h1, 0x80),
        ];
        for l in 0..4 {
            let dl = if l < 2 { dl1 } else { dl2 };
            let o = 32 * ib + 8 * l;
            shifted8(&mut y[o..o + 8], dl, idx[l], deltas[l]);
        }
    }
}

/// One base-3 digit of a TQ1_0 byte: `q = b * 3^n` (wrapping), digit `(q * 3) >> 8`, minus 1.
#[inline]
fn trit(b: u8, pow3: u8) -> f32 {
    let q = b.wrapping_mul(pow3);
    ((((q as u16) * 3) >> 8) as i16 - 1) as f32
}

/// `{ u8 qs[48]; u8 qh[4]; f16 d }`: five ternary digits per `qs` byte and four per `qh`
/// byte, stored as fixed-point fractions of 243.
pub(super) fn block_tq1_0(x: &[u8], y: &mut [f32]) {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    let d = f16_at(x, 52);
    let mut out = 0;
    // 32 bytes give 160 weights, the next 16 give 80: digit-major within each run.
    for run in [&x[0..32], &x[32..48]] {
        for p in POW3 {
            for &b in run {
                y[out] = trit(b, p) * d;
                out += 1;
            }
        }
    }
    for p in &POW3[..4] {
        for &b in &x[48..52] {
            y[out] = trit(b, *p) * d;
            out += 1;
        }
    }
}

/// `{ u8 qs[64]; f16 d }`: 2-bit values minus 1, four per byte, in two runs of 32 bytes.
pub(super) fn block_tq2_0(x: &[u8], y: &mut [f32]) {
    let d = f16_at(x, 64);
    let mut out = 0;
    for run in [&x[0..32], &x[32..64]] {
        for shift in [0, 2, 4, 6] {
            for &b in run {
                y[out] = (((b >> shift) & 3) as i8 - 1) as f32 * d;
                out += 1;
            }
        }
    }
}

/// Half of the E8M0 scale `e` (`ggml_e8m0_to_fp32_half`): 2^(e - 128), denormal below e = 2.
#[inline]
fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

/// `{ u8 e; u8 qs[16] }`: E2M1 nibbles (low nibbles are weights 0..16, high 16..32) times
/// an E8M0 power of two.
pub(super) fn block_mxfp4(x: &[u8], y: &mut [f32]) {
    let d = e8m0_half(x[0]);
    for (j, &q) in x[1..17].iter().enumerate() {
        y[j] = KVALUES_MXFP4[(q & 0x0f) as usize] as f32 * d;
        y[j + 16] = KVALUES_MXFP4[(q >> 4) as usize] as f32 * d;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_tables_match_ggml() {
        // The first and last rows of ggml's ksigns_iq2xs.
        assert_eq!(
            KSIGNS_IQ2XS[..16],
            [
                0, 129, 130, 3, 132, 5, 6, 135, 136, 9, 10, 139, 12, 141, 142, 15
            ]
        );
        assert_eq!(
            KSIGNS_IQ2XS[112..],
            [
                240, 113, 114, 243, 116, 245, 246, 119, 120, 249, 250, 123, 252, 125, 126, 255
            ]
        );
        assert_eq!(e8m0_half(0), 2f32.powi(-128));
        assert_eq!(e8m0_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_half(128), 1.0);
        assert_eq!(e8m0_half(255), 2f32.powi(127));
    }

    #[test]
    fn grids_hold_their_value_sets() {
        // Spot checks against ggml-common.h (entry 1 of each table, as little-endian bytes).
        assert_eq!(IQ2XXS.entry(1), 0x080808080808082b_u64.to_le_bytes());
        assert_eq!(IQ2S.entry(1023), 0x2b2b2b2b2b2b2b2b_u64.to_le_bytes());
        assert_eq!(IQ3XXS.entry(1), 0x04040414_u32.to_le_bytes());
        assert_eq!(IQ3S.entry(3), 0x0101010b_u32.to_le_bytes());
        let sets: [(Grid, usize, &[u8]); 6] = [
            (IQ2XXS, 256, &[0x08, 0x19, 0x2b]),
            (IQ2XS, 512, &[0x08, 0x19, 0x2b]),
            (IQ2S, 1024, &[0x08, 0x19, 0x2b]),
            (
                IQ3XXS,
                256,
                &[0x04, 0x0c, 0x14, 0x1c, 0x24, 0x2c, 0x34, 0x3e],
            ),
            (IQ3S, 512, &[1, 3, 5, 7, 9, 11, 13, 15]),
            (IQ1S, 2048, &[0xff, 0, 1]),
        ];
        let mut end = 0;
        for (g, n, values) in sets {
            assert_eq!(g.0, end);
            end = g.0 + n * g.1;
            assert!(GRIDS[g.0..end].iter().all(|b| values.contains(b)));
        }
        assert_eq!(end, GRIDS.len());
    }
}
