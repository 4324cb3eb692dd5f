//! The AVX-VNNI unit: each 512-bit [`Vnni`] value as two 256-bit halves (bytes 0-31 and
//! 32-63), for CPUs with AVX2 and the VEX-encoded `vpdpbusd`/`vpdpwssd` but not AVX-512.
//!
//! Most operations are one AVX2 or AVX-VNNI instruction per half. Three have no AVX2
//! instruction and are built from several: `permw` (a word permute across all 64 bytes:
//! four byte shuffles and blends per half), `srlv16` (variable 16-bit shifts: two 32-bit
//! ones) and the byte masks (`M` is a vector of 0x00/0xff bytes, not a mask register).
//! Kernels that lean on them pay for it, which is why each kernel runs here only where it
//! measured faster than its AVX2 twin (`ggml::vecdot::kernel`).
//!
//! As in `hw`, the operations are `#[inline(always)]` without target features of their own
//! and compile inside the kernels' entry points, which enable AVX2, FMA, F16C and AVX-VNNI.

use std::arch::x86_64::*;

use super::Vnni;

/// AVX2, FMA, F16C and AVX-VNNI of this CPU. A value exists only where they were detected.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AvxVnni(());

impl AvxVnni {
    /// The unit, where the CPU has the instructions.
    pub(crate) fn detect() -> Option<Self> {
        crate::isa::has_avx_vnni().then_some(AvxVnni(()))
    }
}

/// `$f` applied to each half of the operands.
macro_rules! halves {
    ($f:ident, $a:expr) => {
        [$f($a[0]), $f($a[1])]
    };
    ($f:ident, $a:expr, $b:expr) => {
        [$f($a[0], $b[0]), $f($a[1], $b[1])]
    };
    ($f:ident, $a:expr, $b:expr, $c:expr) => {
        [$f($a[0], $b[0], $c[0]), $f($a[1], $b[1], $c[1])]
    };
}

/// `count` as the shift-count operand of `vpsllw`/`vpsrlw`/`vpslld` (counts past the lane
/// width give zero, as the trait's shifts do).
#[inline(always)]
fn count(c: u32) -> __m128i {
    // SAFETY: see the impl below (SSE2 is part of x86-64).
    unsafe { _mm_cvtsi32_si128(c as i32) }
}

/// One half of [`Vnni::bytes_where`]: byte `i` is 0xff where bit `i` of `bits` is set.
#[inline(always)]
fn bytes_where_half(bits: u32) -> __m256i {
    // SAFETY: compiled inside functions that enable AVX2 (see the impl below).
    unsafe {
        // Byte `i` takes the byte of `bits` that holds bit `i` (every 32-bit lane holds all
        // four), then tests its own bit there.
        let pick = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let v = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), pick);
        _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit)
    }
}

/// One half of [`Vnni::srlv16`].
#[inline(always)]
fn srlv16_half(a: __m256i, counts: __m256i) -> __m256i {
    // SAFETY: compiled inside functions that enable AVX2 (see the impl below).
    unsafe {
        // The even u16 lanes shift as the low halves of 32-bit lanes, the odd ones as the
        // high halves brought down; a count of 16 or more empties either (the value has 16
        // bits), as `vpsrlvw` does.
        let low16 = _mm256_set1_epi32(0xffff);
        let even = _mm256_srlv_epi32(_mm256_and_si256(a, low16), _mm256_and_si256(counts, low16));
        let odd = _mm256_srlv_epi32(_mm256_srli_epi32::<16>(a), _mm256_srli_epi32::<16>(counts));
        _mm256_or_si256(even, _mm256_slli_epi32::<16>(odd))
    }
}

/// One half of [`Vnni::permw`]: each u16 lane takes lane `idx & 31` of the 512-bit value
/// whose four 128-bit lanes `lanes` holds, each in both lanes of a register.
#[inline(always)]
fn permw_half(idx: __m256i, lanes: &[__m256i; 4]) -> __m256i {
    // SAFETY: compiled inside functions that enable AVX2 (see the impl below).
    unsafe {
        let word = _mm256_and_si256(idx, _mm256_set1_epi16(7));
        // Bytes 2w and 2w + 1 of the lane.
        let lo = _mm256_slli_epi16::<1>(word);
        let pair = _mm256_add_epi16(
            _mm256_or_si256(lo, _mm256_slli_epi16::<8>(lo)),
            _mm256_set1_epi16(0x0100),
        );
        let lane = _mm256_and_si256(_mm256_srli_epi16::<3>(idx), _mm256_set1_epi16(3));
        let mut out = _mm256_setzero_si256();
        for (l, src) in lanes.iter().enumerate() {
            let here = _mm256_cmpeq_epi16(lane, _mm256_set1_epi16(l as i16));
            out = _mm256_blendv_epi8(out, _mm256_shuffle_epi8(*src, pair), here);
        }
        out
    }
}

// SAFETY (for every block below): an `AvxVnni` exists only when the CPU has AVX2, FMA, F16C
// and AVX-VNNI (`crate::isa::has_avx_vnni`), and its operations compile only inside functions
// that enable them; loads read only the bytes their callers guarantee readable.
impl Vnni for AvxVnni {
    type I = [__m256i; 2];
    type F = [__m256; 2];
    type M = [__m256i; 2];

    #[inline(always)]
    unsafe fn load(self, p: *const u8) -> Self::I {
        // SAFETY: see the impl; 64 readable bytes (caller).
        unsafe {
            [
                _mm256_loadu_si256(p.cast()),
                _mm256_loadu_si256(p.add(32).cast()),
            ]
        }
    }
    #[inline(always)]
    unsafe fn load_dup32(self, p: *const u8) -> Self::I {
        // SAFETY: see the impl; 32 readable bytes (caller).
        let v = unsafe { _mm256_loadu_si256(p.cast()) };
        [v, v]
    }
    #[inline(always)]
    unsafe fn load_2x32(self, lo: *const u8, hi: *const u8) -> Self::I {
        // SAFETY: see the impl; 32 readable bytes at each (caller).
        unsafe { [_mm256_loadu_si256(lo.cast()), _mm256_loadu_si256(hi.cast())] }
    }
    #[inline(always)]
    unsafe fn load_dup16x2(self, a: *const u8, b: *const u8) -> Self::I {
        // SAFETY: see the impl; 16 readable bytes at each (caller).
        unsafe {
            [
                _mm256_broadcastsi128_si256(_mm_loadu_si128(a.cast())),
                _mm256_broadcastsi128_si256(_mm_loadu_si128(b.cast())),
            ]
        }
    }
    #[inline(always)]
    unsafe fn load_low32(self, p: *const u8) -> Self::I {
        // SAFETY: see the impl; 32 readable bytes (caller).
        unsafe { [_mm256_loadu_si256(p.cast()), _mm256_setzero_si256()] }
    }
    #[inline(always)]
    unsafe fn load_2x16(self, a: *const u8, b: *const u8) -> Self::I {
        // SAFETY: see the impl; 16 readable bytes at each (caller).
        unsafe {
            [
                _mm256_inserti128_si256::<1>(
                    _mm256_castsi128_si256(_mm_loadu_si128(a.cast())),
                    _mm_loadu_si128(b.cast()),
                ),
                _mm256_setzero_si256(),
            ]
        }
    }
    #[inline(always)]
    unsafe fn load16(self, p: *const u8) -> Self::I {
        // SAFETY: see the impl; 16 readable bytes (caller).
        unsafe {
            [
                _mm256_zextsi128_si256(_mm_loadu_si128(p.cast())),
                _mm256_setzero_si256(),
            ]
        }
    }
    #[inline(always)]
    unsafe fn loadf(self, p: *const f32) -> Self::F {
        // SAFETY: see the impl; 16 readable f32 (caller).
        unsafe { [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))] }
    }
    #[inline(always)]
    unsafe fn load_f2x8(self, p: *const f32) -> Self::F {
        // SAFETY: see the impl; two readable f32 (caller).
        unsafe { [_mm256_set1_ps(p.read()), _mm256_set1_ps(p.add(1).read())] }
    }
    #[inline(always)]
    unsafe fn storef(self, p: *mut f32, v: Self::F) {
        // SAFETY: see the impl; 16 writable f32 (caller).
        unsafe {
            _mm256_storeu_ps(p, v[0]);
            _mm256_storeu_ps(p.add(8), v[1]);
        }
    }

    #[inline(always)]
    fn prefetch(self, p: *const u8) {
        // SAFETY: a prefetch reads nothing architecturally and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) }
    }
    #[inline(always)]
    fn bytes(self, b: [u8; 64]) -> Self::I {
        // SAFETY: see the impl; `b` is 64 readable bytes.
        unsafe { self.load(b.as_ptr()) }
    }
    #[inline(always)]
    fn splat8(self, v: u8) -> Self::I {
        // SAFETY: see the impl.
        let v = unsafe { _mm256_set1_epi8(v as i8) };
        [v, v]
    }
    #[inline(always)]
    fn splat32(self, v: u32) -> Self::I {
        // SAFETY: see the impl.
        let v = unsafe { _mm256_set1_epi32(v as i32) };
        [v, v]
    }
    #[inline(always)]
    fn zero(self) -> Self::I {
        // SAFETY: see the impl.
        let z = unsafe { _mm256_setzero_si256() };
        [z, z]
    }
    #[inline(always)]
    fn bytes_where(self, bits: u64) -> Self::I {
        [
            bytes_where_half(bits as u32),
            bytes_where_half((bits >> 32) as u32),
        ]
    }

    #[inline(always)]
    fn and(self, a: Self::I, b: Self::I) -> Self::I {
        // SAFETY: see the impl.
        unsafe { halves!(_mm256_and_si256, a, b) }
    }
    #[inline(always)]
    fn or(self, a: Self::I, b: Self::I) -> Self::I {
        // SAFETY: see the impl.
        unsafe { halves!(_mm256_or_si256, a, b) }
    }
    #[inline(always)]
    fn and_or(self, a: Self::I, mask: Self::I, b: Self::I) -> Self::I {
        self.or(self.and(a, mask), b)
    }
    #[inline(always)]
    fn srlv16(self, a: Self::I, counts: Self::I) -> Self::I {
        [srlv16_half(a[0], counts[0]), srlv16_half(a[1], counts[1])]
    }
    #[inline(always)]
    fn srli16_halves<const LO: u32, const HI: u32>(self, a: Self::I) -> Self::I {
        // SAFETY: see the impl.
        unsafe {
            [
                _mm256_srl_epi16(a[0], count(LO)),
                _mm256_srl_epi16(a[1], count(HI)),
            ]
        }
    }
    #[inline(always)]
    fn slli16_halves<const LO: u32, const HI: u32>(self, a: Self::I) -> Self::I {
        // SAFETY: see the impl.
        unsafe {
            [
                _mm256_sll_epi16(a[0], count(LO)),
                _mm256_sll_epi16(a[1], count(HI)),
            ]
        }
    }
    #[inline(always)]
    fn slli16<const S: u32>(self, a: Self::I) -> Self::I {
        // SAFETY: see the impl.
        unsafe {
            [
                _mm256_sll_epi16(a[0], count(S)),
                _mm256_sll_epi16(a[1], count(S)),
            ]
        }
    }
    #[inline(always)]
    fn srli16<const S: u32>(self, a: Self::I) -> Self::I {
        // SAFETY: see the impl.
        unsafe {
            [
                _mm256_srl_epi16(a[0], count(S)),
                _mm256_srl_epi16(a[1], count(S)),
            ]
        }
    }
    #[inline(always)]
    fn slli32<const S: u32>(self, a: Self::I) -> Self::I {
        // SAFETY: see the impl.
        unsafe {
            [
                _mm256_sll_epi32(a[0], count(S)),
                _mm256_sll_epi32(a[1], count(S)),
            ]
        }
    }
    #[inline(always)]
    fn sub32(self, a: Self::I, b: Self::I) -> Self::I {
        // SAFETY: see the impl.
        unsafe { halves!(_mm256_sub_epi32, a, b) }
    }
    #[inline(always)]
    fn sub8(self, a: Self::I, b: Self::I) -> Self::I {
        // SAFETY: see the impl.
        unsafe { halves!(_mm256_sub_epi8, a, b) }
    }
    #[inline(always)]
    fn abs8(self, a: Self::I) -> Self::I {
        // SAFETY: see the impl.
        unsafe { halves!(_mm256_abs_epi8, a) }
    }
    #[inline(always)]
    fn negative8(self, a: Self::I) -> Self::M {
        // SAFETY: see the impl.
        unsafe {
            let z = _mm256_setzero_si256();
            [_mm256_cmpgt_epi8(z, a[0]), _mm256_cmpgt_epi8(z, a[1])]
        }
    }
    #[inline(always)]
    fn neg8_where(self, a: Self::I, m: Self::M) -> Self::I {
        // SAFETY: see the impl. `(a ^ m) - m` is `-a` where `m` is all ones, `a` where zero.
        unsafe {
            [
                _mm256_sub_epi8(_mm256_xor_si256(a[0], m[0]), m[0]),
                _mm256_sub_epi8(_mm256_xor_si256(a[1], m[1]), m[1]),
            ]
        }
    }
    #[inline(always)]
    fn shufb(self, table: Self::I, idx: Self::I) -> Self::I {
        // SAFETY: see the impl; `vpshufb` looks up within 128-bit lanes, as the trait says.
        unsafe { halves!(_mm256_shuffle_epi8, table, idx) }
    }
    #[inline(always)]
    fn permw(self, idx: Self::I, v: Self::I) -> Self::I {
        // SAFETY: see the impl.
        unsafe {
            // Each of the four 128-bit lanes of `v` in both lanes of a register, so a byte
            // shuffle can reach it from either.
            let lanes = [
                _mm256_permute2x128_si256::<0x00>(v[0], v[0]),
                _mm256_permute2x128_si256::<0x11>(v[0], v[0]),
                _mm256_permute2x128_si256::<0x00>(v[1], v[1]),
                _mm256_permute2x128_si256::<0x11>(v[1], v[1]),
            ];
            [permw_half(idx[0], &lanes), permw_half(idx[1], &lanes)]
        }
    }
    #[inline(always)]
    fn zext8to16(self, a: Self::I) -> Self::I {
        // SAFETY: see the impl.
        unsafe {
            [
                _mm256_cvtepu8_epi16(_mm256_castsi256_si128(a[0])),
                _mm256_cvtepu8_epi16(_mm256_extracti128_si256::<1>(a[0])),
            ]
        }
    }
    #[inline(always)]
    fn sext8to16(self, a: Self::I) -> Self::I {
        // SAFETY: see the impl.
        unsafe {
            [
                _mm256_cvtepi8_epi16(_mm256_castsi256_si128(a[0])),
                _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(a[0])),
            ]
        }
    }
    #[inline(always)]
    fn zext8to32(self, a: Self::I) -> Self::I {
        // SAFETY: see the impl.
        unsafe {
            let lo = _mm256_castsi256_si128(a[0]);
            [
                _mm256_cvtepu8_epi32(lo),
                _mm256_cvtepu8_epi32(_mm_srli_si128::<8>(lo)),
            ]
        }
    }
    #[inline(always)]
    fn sext8to32(self, a: Self::I) -> Self::I {
        // SAFETY: see the impl.
        unsafe {
            let lo = _mm256_castsi256_si128(a[0]);
            [
                _mm256_cvtepi8_epi32(lo),
                _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(lo)),
            ]
        }
    }
    #[inline(always)]
    fn maddubs(self, u: Self::I, s: Self::I) -> Self::I {
        // SAFETY: see the impl.
        unsafe { halves!(_mm256_maddubs_epi16, u, s) }
    }
    #[inline(always)]
    fn madd16(self, a: Self::I, b: Self::I) -> Self::I {
        // SAFETY: see the impl.
        unsafe { halves!(_mm256_madd_epi16, a, b) }
    }
    #[inline(always)]
    fn packs32(self, a: Self::I, b: Self::I) -> Self::I {
        // SAFETY: see the impl; `vpackssdw` works per 128-bit lane, as on 512 bits.
        unsafe { halves!(_mm256_packs_epi32, a, b) }
    }
    #[inline(always)]
    fn dpwssd(self, acc: Self::I, a: Self::I, b: Self::I) -> Self::I {
        // SAFETY: see the impl.
        unsafe { halves!(_mm256_dpwssd_avx_epi32, acc, a, b) }
    }
    #[inline(always)]
    fn dpbusd(self, acc: Self::I, u: Self::I, s: Self::I) -> Self::I {
        // SAFETY: see the impl.
        unsafe { halves!(_mm256_dpbusd_avx_epi32, acc, u, s) }
    }

    #[inline(always)]
    fn f16(self, bits: u16) -> f32 {
        // SAFETY: see the impl (F16C).
        unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits)))) }
    }
    #[inline(always)]
    fn cvt(self, a: Self::I) -> Self::F {
        // SAFETY: see the impl.
        unsafe { halves!(_mm256_cvtepi32_ps, a) }
    }
    #[inline(always)]
    fn cvtph(self, a: Self::I) -> Self::F {
        // SAFETY: see the impl (F16C).
        unsafe {
            [
                _mm256_cvtph_ps(_mm256_castsi256_si128(a[0])),
                _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(a[0])),
            ]
        }
    }
    #[inline(always)]
    fn lane<const L: usize>(self, a: Self::F) -> Self::F {
        // SAFETY: see the impl.
        let v =
            unsafe { _mm256_permutevar8x32_ps(a[(L % 16) / 8], _mm256_set1_epi32((L % 8) as i32)) };
        [v, v]
    }
    #[inline(always)]
    fn lanes2<const A: usize, const B: usize>(self, a: Self::F) -> Self::F {
        // SAFETY: see the impl.
        unsafe {
            [
                _mm256_permutevar8x32_ps(a[(A % 16) / 8], _mm256_set1_epi32((A % 8) as i32)),
                _mm256_permutevar8x32_ps(a[(B % 16) / 8], _mm256_set1_epi32((B % 8) as i32)),
            ]
        }
    }
    #[inline(always)]
    fn splatf(self, v: f32) -> Self::F {
        // SAFETY: see the impl.
        let v = unsafe { _mm256_set1_ps(v) };
        [v, v]
    }
    #[inline(always)]
    fn f2x8(self, a: f32, b: f32) -> Self::F {
        // SAFETY: see the impl.
        unsafe { [_mm256_set1_ps(a), _mm256_set1_ps(b)] }
    }
    #[inline(always)]
    fn addf(self, a: Self::F, b: Self::F) -> Self::F {
        // SAFETY: see the impl.
        unsafe { halves!(_mm256_add_ps, a, b) }
    }
    #[inline(always)]
    fn mulf(self, a: Self::F, b: Self::F) -> Self::F {
        // SAFETY: see the impl.
        unsafe { halves!(_mm256_mul_ps, a, b) }
    }
    #[inline(always)]
    fn fmadd(self, a: Self::F, b: Self::F, c: Self::F) -> Self::F {
        // SAFETY: see the impl (FMA).
        unsafe { halves!(_mm256_fmadd_ps, a, b, c) }
    }
    #[inline(always)]
    fn hsum(self, a: Self::F) -> f32 {
        // SAFETY: see the impl. The tree of `Vnni::hsum`: halves, then quarters, pairs, lanes.
        unsafe {
            let s8 = _mm256_add_ps(a[0], a[1]);
            let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
            let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
            _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps::<1>(s2, s2)))
        }
    }

    #[cfg(test)]
    fn to_bytes(self, a: Self::I) -> [u8; 64] {
        let mut b = [0u8; 64];
        // SAFETY: see the impl; `b` is 64 writable bytes.
        unsafe {
            _mm256_storeu_si256(b.as_mut_ptr().cast(), a[0]);
            _mm256_storeu_si256(b.as_mut_ptr().add(32).cast(), a[1]);
        }
        b
    }
    #[cfg(test)]
    fn to_f32s(self, a: Self::F) -> [f32; 16] {
        let mut v = [0.0f32; 16];
        // SAFETY: see the impl; `v` is 16 writable f32.
        unsafe { self.storef(v.as_mut_ptr(), a) };
        v
    }
    #[cfg(test)]
    fn mask_bits(self, m: Self::M) -> u64 {
        // SAFETY: see the impl.
        let (lo, hi) = unsafe { (_mm256_movemask_epi8(m[0]), _mm256_movemask_epi8(m[1])) };
        u64::from(lo as u32) | (u64::from(hi as u32) << 32)
    }
}
