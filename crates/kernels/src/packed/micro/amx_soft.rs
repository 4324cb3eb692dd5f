//! The software tile unit: AMX's eight tile registers and the instructions the kernel uses,
//! in plain Rust, so the AMX tile program ([`super::amx`]) runs and is checked on any CPU.
//! Test builds only; [`super::Kernel::AmxSoft`] selects it.
//!
//! Modelled after the Intel SDM's pseudocode (vol. 2, `LDTILECFG`, `TILELOADD`, `TILESTORED`,
//! `TILEZERO`, `TDPBF16PS`, `TDPBSUD`, `TILERELEASE`):
//! - palette 1: 8 tiles of up to 16 rows x 64 bytes, shapes from the configuration;
//! - a load writes the configured rows x bytes per row and zeroes the rest of the register
//!   (`write_row_and_zero`, `zero_upper_rows`); a store writes only rows x bytes per row;
//! - `tdpbf16ps`: per output element two f32 chains over `k`, even and odd BF16 of each pair,
//!   each step a fused multiply-add rounded to nearest even; then the two chains are added and
//!   the sum added to the accumulator. Denormal inputs (BF16 operands and the accumulator)
//!   count as zero and denormal results are flushed to zero, as the SDM states;
//! - `tdpbsud`: signed bytes of the first source times unsigned bytes of the second, groups
//!   of four summed into the i32 accumulator, wrapping.
//!
//! It refuses, with a panic that names the instruction and the tiles, what would fault on the
//! hardware (#GP from `ldtilecfg`, #UD from the exception class AMX-E4 shape checks: a tile
//! named twice, an unconfigured tile, bytes per row not a multiple of 4, M, K or N that do not
//! match) and, stricter than the hardware, a load or store whose span leaves its operand slice
//! and a dot product or store that reads a tile nothing wrote since the configuration.
//!
//! Not verified here: the instruction encodings (the assembler produces them; only an AMX
//! machine runs them), whether the hardware's f32 summation order and NaN payloads match the
//! pseudocode (the kernel tests compare with tolerances, so either passes), and anything about
//! speed.

use super::amx::{MAX_COLSB, MAX_ROWS, Shape, TILES, TileCfg, TileUnit};

/// One tile register.
type Reg = [[u8; MAX_COLSB]; MAX_ROWS];

/// The software tile unit of one tile program.
pub(super) struct SoftTiles {
    shape: Shape,
    /// Tiles zeroed, loaded or accumulated into since the configuration.
    written: [bool; TILES],
    regs: Box<[Reg; TILES]>,
}

impl SoftTiles {
    /// A unit in the init state (no configuration, tiles zero).
    pub(super) fn new() -> Self {
        Self {
            shape: Shape::NONE,
            written: [false; TILES],
            regs: Box::new([[[0; MAX_COLSB]; MAX_ROWS]; TILES]),
        }
    }

    fn rows(&self, t: usize) -> usize {
        usize::from(self.shape.rows[t])
    }

    fn colsb(&self, t: usize) -> usize {
        usize::from(self.shape.colsb[t])
    }

    /// Checks a dot product `op tmmC, tmmA, tmmB` like AMX-E4, and that its sources and
    /// accumulator were written; returns M, K (in 4-byte groups) and N (in dwords).
    fn check_dp(&self, op: &str, c: usize, a: usize, b: usize) -> (usize, usize, usize) {
        let fail = |why: String| -> ! { panic!("tile program: {op} tmm{c}, tmm{a}, tmm{b} {why}") };
        if c == a || c == b || a == b {
            fail("names a tile twice".into());
        }
        for t in [c, a, b] {
            if self.rows(t) == 0 {
                fail(format!("uses tmm{t}, which is not configured"));
            }
            if !self.colsb(t).is_multiple_of(4) {
                fail(format!(
                    "uses tmm{t} with {} bytes per row, not a multiple of 4",
                    self.colsb(t)
                ));
            }
            if !self.written[t] {
                fail(format!("reads tmm{t} before anything wrote it"));
            }
        }
        let (m, k, n) = (self.rows(c), self.colsb(a) / 4, self.colsb(c) / 4);
        if self.rows(a) != m {
            fail(format!(
                "has M {m} in tmm{c} and {} in tmm{a}",
                self.rows(a)
            ));
        }
        if self.rows(b) != k {
            fail(format!(
                "has K {k} in tmm{a} (4-byte groups) and {} in tmm{b} (rows)",
                self.rows(b)
            ));
        }
        if self.colsb(b) != 4 * n {
            fail(format!(
                "has N {n} in tmm{c} and {} in tmm{b} (dwords)",
                self.colsb(b) / 4
            ));
        }
        (m, k, n)
    }

    /// Writes `rows` computed rows (`row(m)`, a full 64-byte row already zero past the
    /// configured bytes) to tile `c` and zeroes the rows above.
    fn write_rows(&mut self, c: usize, rows: usize, row: impl Fn(&Self, usize) -> [u8; 64]) {
        let new: Vec<[u8; 64]> = (0..rows).map(|m| row(self, m)).collect();
        let reg = &mut self.regs[c];
        reg.fill([0; MAX_COLSB]);
        reg[..rows].copy_from_slice(&new);
        self.written[c] = true;
    }

    #[cfg(test)]
    fn reg(&self, t: usize) -> &Reg {
        &self.regs[t]
    }
}

/// A denormal `x` as zero (DAZ, FTZ).
fn flush(x: f32) -> f32 {
    if x.is_subnormal() {
        0.0f32.copysign(x)
    } else {
        x
    }
}

fn bf16_at(row: &[u8; 64], i: usize) -> f32 {
    flush(f32::from_bits(
        u32::from(u16::from_le_bytes([row[2 * i], row[2 * i + 1]])) << 16,
    ))
}

fn dword_at(row: &[u8; 64], i: usize) -> u32 {
    u32::from_le_bytes([row[4 * i], row[4 * i + 1], row[4 * i + 2], row[4 * i + 3]])
}

impl TileUnit for SoftTiles {
    fn configure(&mut self, cfg: &TileCfg) {
        self.shape = Shape::of(cfg);
        self.written = [false; TILES];
        self.regs.fill([[0; MAX_COLSB]; MAX_ROWS]);
    }

    fn zero<const T: u8>(&mut self) {
        let t = usize::from(T);
        assert!(
            self.rows(t) > 0,
            "tile program: tilezero tmm{t}, which is not configured"
        );
        self.regs[t].fill([0; MAX_COLSB]);
        self.written[t] = true;
    }

    fn load<const T: u8>(&mut self, src: &[u8], stride: usize) {
        let t = usize::from(T);
        self.shape.check_span("tileloadd", t, stride, src.len());
        let (rows, colsb) = (self.rows(t), self.colsb(t));
        let reg = &mut self.regs[t];
        reg.fill([0; MAX_COLSB]);
        for (r, row) in reg[..rows].iter_mut().enumerate() {
            row[..colsb].copy_from_slice(&src[r * stride..][..colsb]);
        }
        self.written[t] = true;
    }

    fn dpbf16ps<const C: u8, const A: u8, const B: u8>(&mut self) {
        let (c, a, b) = (usize::from(C), usize::from(A), usize::from(B));
        let (rows, k, n) = self.check_dp("tdpbf16ps", c, a, b);
        self.write_rows(c, rows, |u, m| {
            let (ra, rc) = (&u.regs[a][m], &u.regs[c][m]);
            let mut out = [0u8; 64];
            for j in 0..n {
                let (mut even, mut odd) = (0.0f32, 0.0f32);
                for p in 0..k {
                    let rb = &u.regs[b][p];
                    even = flush(bf16_at(ra, 2 * p).mul_add(bf16_at(rb, 2 * j), even));
                    odd = flush(bf16_at(ra, 2 * p + 1).mul_add(bf16_at(rb, 2 * j + 1), odd));
                }
                let acc = flush(f32::from_bits(dword_at(rc, j)));
                let v = flush(acc + flush(even + odd));
                out[4 * j..4 * j + 4].copy_from_slice(&v.to_bits().to_le_bytes());
            }
            out
        });
    }

    fn dpbsud<const C: u8, const A: u8, const B: u8>(&mut self) {
        let (c, a, b) = (usize::from(C), usize::from(A), usize::from(B));
        let (rows, k, n) = self.check_dp("tdpbsud", c, a, b);
        self.write_rows(c, rows, |u, m| {
            let (ra, rc) = (&u.regs[a][m], &u.regs[c][m]);
            let mut out = [0u8; 64];
            for j in 0..n {
                let mut acc = dword_at(rc, j) as i32;
                for p in 0..k {
                    let rb = &u.regs[b][p];
                    let dot: i32 = (0..4)
                        .map(|i| i32::from(ra[4 * p + i] as i8) * i32::from(rb[4 * j + i]))
                        .sum();
                    acc = acc.wrapping_add(dot);
                }
                out[4 * j..4 * j + 4].copy_from_slice(&acc.to_le_bytes());
            }
            out
        });
    }

    fn store<const T: u8>(&mut self, dst: &mut [u8], stride: usize) {
        let t = usize::from(T);
        self.shape.check_span("tilestored", t, stride, dst.len());
        assert!(
            self.written[t],
            "tile program: tilestored tmm{t} before anything wrote it"
        );
        let colsb = self.colsb(t);
        for (r, row) in self.regs[t][..self.rows(t)].iter().enumerate() {
            dst[r * stride..][..colsb].copy_from_slice(&row[..colsb]);
        }
    }

    fn release(&mut self) {
        *self = Self::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A configuration with `(rows, colsb)` for tiles 0, 1, 2 ...
    fn cfg(shapes: &[(u8, u16)]) -> TileCfg {
        let mut c = TileCfg {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        for (t, &(r, b)) in shapes.iter().enumerate() {
            c.rows[t] = r;
            c.colsb[t] = b;
        }
        c
    }

    fn bf16_bytes(v: &[f32]) -> Vec<u8> {
        v.iter()
            .flat_map(|x| half::bf16::from_f32(*x).to_bits().to_le_bytes())
            .collect()
    }

    #[test]
    fn loads_zero_what_the_shape_leaves_out() {
        let mut u = SoftTiles::new();
        u.configure(&cfg(&[(3, 8)]));
        let src = [0xffu8; 64 * 16];
        u.load::<0>(&src, 64);
        for (r, row) in u.reg(0).iter().enumerate() {
            for (b, &v) in row.iter().enumerate() {
                assert_eq!(v, if r < 3 && b < 8 { 0xff } else { 0 }, "row {r} byte {b}");
            }
        }
        // A store writes rows x colsb at the stride and nothing else.
        let mut dst = [7u8; 40];
        u.store::<0>(&mut dst, 16);
        for (i, &v) in dst.iter().enumerate() {
            let inside = i < 40 && i % 16 < 8;
            assert_eq!(v, if inside { 0xff } else { 7 }, "byte {i}");
        }
    }

    #[test]
    fn dpbf16ps_accumulates_pairs_like_the_sdm() {
        // C 2x2 f32, A 2 rows x 2 pairs, B 2 rows (pairs) x 2 columns.
        let mut u = SoftTiles::new();
        u.configure(&cfg(&[(2, 8), (2, 8), (2, 8)]));
        let a = bf16_bytes(&[1.0, 2.0, 3.0, 4.0, -1.0, 0.5, 0.25, 8.0]);
        // B row p holds (even, odd) of pair p for columns 0 and 1.
        let b = bf16_bytes(&[1.0, 1.0, 2.0, 0.0, 1.0, -1.0, 0.5, 4.0]);
        u.zero::<0>();
        u.load::<1>(&a, 8);
        u.load::<2>(&b, 8);
        u.dpbf16ps::<0, 1, 2>();
        u.dpbf16ps::<0, 1, 2>();
        let got: Vec<f32> = (0..2)
            .flat_map(|m| (0..2).map(move |j| (m, j)))
            .map(|(m, j)| f32::from_bits(dword_at(&u.reg(0)[m], j)))
            .collect();
        // Row 0: col 0 = 1*1 + 2*1 + 3*1 + 4*-1 = 2, col 1 = 1*2 + 2*0 + 3*0.5 + 4*4 = 19.5.
        // Row 1: col 0 = -1 + 0.5 + 0.25 - 8 = -8.25, col 1 = -2 + 0 + 0.125 + 32 = 30.125.
        assert_eq!(got, [4.0, 39.0, -16.5, 60.25]);
        // The rest of the accumulator register is zero.
        assert!(u.reg(0)[0][8..].iter().all(|&b| b == 0));
        assert!(u.reg(0)[2..].iter().all(|r| r.iter().all(|&b| b == 0)));
    }

    #[test]
    fn dpbf16ps_rounding_and_denormals_follow_the_sdm() {
        let mut u = SoftTiles::new();
        u.configure(&cfg(&[(1, 4), (1, 4), (1, 4)]));
        let tiny = 2f32.powi(-24);
        // The even and odd products are summed before the accumulator: 1 + (2^-24 + 2^-24)
        // is 1 + 2^-23, where adding them one at a time would round to 1 twice.
        u.load::<0>(&1.0f32.to_le_bytes(), 4);
        u.load::<1>(&bf16_bytes(&[tiny, tiny]), 4);
        u.load::<2>(&bf16_bytes(&[1.0, 1.0]), 4);
        u.dpbf16ps::<0, 1, 2>();
        assert_eq!(f32::from_bits(dword_at(&u.reg(0)[0], 0)), 1.0 + 2.0 * tiny);
        // A denormal BF16 input counts as zero, however large its partner.
        u.zero::<0>();
        u.load::<1>(&[1, 0, 0, 0], 4);
        u.load::<2>(&bf16_bytes(&[2f32.powi(100), 0.0]), 4);
        u.dpbf16ps::<0, 1, 2>();
        assert_eq!(dword_at(&u.reg(0)[0], 0), 0);
        // A denormal result is flushed to zero (2^-70 * 2^-70 = 2^-140).
        u.load::<1>(&bf16_bytes(&[2f32.powi(-70), 0.0]), 4);
        u.load::<2>(&bf16_bytes(&[2f32.powi(-70), 0.0]), 4);
        u.dpbf16ps::<0, 1, 2>();
        assert_eq!(dword_at(&u.reg(0)[0], 0), 0);
    }

    #[test]
    fn dpbsud_is_signed_times_unsigned() {
        let mut u = SoftTiles::new();
        u.configure(&cfg(&[(1, 4), (1, 8), (2, 4)]));
        u.load::<0>(&5i32.to_le_bytes(), 4);
        u.load::<1>(&[0x80, 0xff, 1, 2, 3, 0, 0, 0x7f], 8);
        u.load::<2>(&[255, 255, 255, 1, 1, 2, 3, 200], 4);
        u.dpbsud::<0, 1, 2>();
        // 5 + (-128*255 - 1*255 + 1*255 + 2*1) + (3*1 + 0 + 0 + 127*200).
        let want = 5 + (-128 * 255 - 255 + 255 + 2) + (3 + 127 * 200);
        assert_eq!(dword_at(&u.reg(0)[0], 0) as i32, want);
    }

    #[test]
    #[should_panic(
        expected = "tileloadd tmm1 (16 rows of 64 bytes, stride 64) spans 1024 bytes, the operand has 1023"
    )]
    fn load_past_its_operand_is_refused() {
        let mut u = SoftTiles::new();
        u.configure(&cfg(&[(16, 64), (16, 64)]));
        u.load::<1>(&[0; 1023], 64);
    }

    #[test]
    #[should_panic(expected = "tileloadd tmm0, which is not configured")]
    fn load_without_configuration_is_refused() {
        SoftTiles::new().load::<0>(&[0; 64], 64);
    }

    #[test]
    #[should_panic(
        expected = "tdpbsud tmm0, tmm1, tmm2 has K 16 in tmm1 (4-byte groups) and 8 in tmm2"
    )]
    fn dot_product_with_mismatched_k_is_refused() {
        let mut u = SoftTiles::new();
        u.configure(&cfg(&[(16, 64), (16, 64), (8, 64)]));
        u.zero::<0>();
        u.zero::<1>();
        u.zero::<2>();
        u.dpbsud::<0, 1, 2>();
    }

    #[test]
    #[should_panic(expected = "tdpbf16ps tmm0, tmm1, tmm2 reads tmm2 before anything wrote it")]
    fn dot_product_of_an_unwritten_tile_is_refused() {
        let mut u = SoftTiles::new();
        u.configure(&cfg(&[(16, 64), (16, 64), (16, 64)]));
        u.zero::<0>();
        u.zero::<1>();
        u.dpbf16ps::<0, 1, 2>();
    }

    #[test]
    #[should_panic(expected = "names a tile twice")]
    fn dot_product_naming_a_tile_twice_is_refused() {
        let mut u = SoftTiles::new();
        u.configure(&cfg(&[(16, 64), (16, 64)]));
        u.zero::<0>();
        u.zero::<1>();
        u.dpbf16ps::<0, 1, 1>();
    }

    #[test]
    #[should_panic(expected = "ldtilecfg gives tmm2 17 rows of 64 bytes")]
    fn oversized_configuration_is_refused() {
        SoftTiles::new().configure(&cfg(&[(16, 64), (16, 64), (17, 64)]));
    }
}
