//! The hardware unit: each [`Vnni`] operation is one or two AVX-512 F/BW/VNNI instructions.
//!
//! The operations are `#[inline(always)]` without target features of their own: they are
//! only ever called from the kernels' entry points, which enable AVX-512 F/BW/VNNI, and
//! compile there (a `target_feature` function is inlined only at the compiler's
//! discretion, and a call per instruction would cost more than the instruction).

use std::arch::x86_64::*;

use super::Vnni;
use crate::isa::Isa;

/// AVX-512 F/BW/VNNI of this CPU. A value exists only where they were detected.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx512Vnni(());

impl Avx512Vnni {
    /// The unit, where the CPU has the instructions.
    pub(crate) fn detect() -> Option<Self> {
        Isa::Avx512.is_available().then_some(Avx512Vnni(()))
    }
}

/// Shift counts of 16-bit lanes: `lo` in the low 256 bits, `hi` in the high 256 bits.
#[inline(always)]
fn halves_counts(lo: u32, hi: u32) -> __m512i {
    // SAFETY: only called from the unit's operations, compiled where AVX-512 F is enabled.
    unsafe {
        _mm512_inserti64x4::<1>(
            _mm512_set1_epi16(lo.min(16) as i16),
            _mm256_set1_epi16(hi.min(16) as i16),
        )
    }
}

// SAFETY (for every block below): an `Avx512Vnni` exists only when `Isa::Avx512` is
// available, which requires AVX-512 F, BW, BF16 and VNNI (`crate::isa::detect`); loads read
// only the bytes their callers guarantee readable.
impl Vnni for Avx512Vnni {
    type I = __m512i;
    type F = __m512;
    type M = __mmask64;

    #[inline(always)]
    unsafe fn load(self, p: *const u8) -> __m512i {
        // SAFETY: see the impl; 64 readable bytes (caller), unaligned load.
        unsafe { _mm512_loadu_si512(p.cast()) }
    }
    #[inline(always)]
    unsafe fn load_dup32(self, p: *const u8) -> __m512i {
        // SAFETY: see the impl; 32 readable bytes (caller).
        unsafe { _mm512_broadcast_i64x4(_mm256_loadu_si256(p.cast())) }
    }
    #[inline(always)]
    unsafe fn load_2x32(self, lo: *const u8, hi: *const u8) -> __m512i {
        // SAFETY: see the impl; 32 readable bytes at each (caller).
        unsafe {
            let lo = _mm512_castsi256_si512(_mm256_loadu_si256(lo.cast()));
            _mm512_inserti64x4::<1>(lo, _mm256_loadu_si256(hi.cast()))
        }
    }
    #[inline(always)]
    unsafe fn load_dup16x2(self, a: *const u8, b: *const u8) -> __m512i {
        // SAFETY: see the impl; 16 readable bytes at each (caller).
        unsafe {
            let ab = _mm256_inserti128_si256::<1>(
                _mm256_castsi128_si256(_mm_loadu_si128(a.cast())),
                _mm_loadu_si128(b.cast()),
            );
            let ab = _mm512_castsi256_si512(ab);
            // 128-bit lanes 0, 0, 1, 1 of `ab`.
            _mm512_shuffle_i64x2::<0b01_01_00_00>(ab, ab)
        }
    }
    #[inline(always)]
    unsafe fn load_low32(self, p: *const u8) -> __m512i {
        // SAFETY: see the impl; 32 readable bytes (caller); the upper half is zeroed.
        unsafe { _mm512_zextsi256_si512(_mm256_loadu_si256(p.cast())) }
    }
    #[inline(always)]
    unsafe fn load_2x16(self, a: *const u8, b: *const u8) -> __m512i {
        // SAFETY: see the impl; 16 readable bytes at each (caller).
        unsafe {
            _mm512_zextsi256_si512(_mm256_inserti128_si256::<1>(
                _mm256_castsi128_si256(_mm_loadu_si128(a.cast())),
                _mm_loadu_si128(b.cast()),
            ))
        }
    }
    #[inline(always)]
    unsafe fn load16(self, p: *const u8) -> __m512i {
        // SAFETY: see the impl; 16 readable bytes (caller); the rest is zeroed.
        unsafe { _mm512_zextsi128_si512(_mm_loadu_si128(p.cast())) }
    }
    #[inline(always)]
    unsafe fn loadf(self, p: *const f32) -> __m512 {
        // SAFETY: see the impl; 16 readable f32 (caller), unaligned load.
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn storef(self, p: *mut f32, v: __m512) {
        // SAFETY: see the impl; 16 writable f32 (caller), unaligned store.
        unsafe { _mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn load_f2x8(self, p: *const f32) -> __m512 {
        // SAFETY: see the impl; two readable f32 (caller).
        unsafe {
            let two = _mm_castsi128_ps(_mm_loadl_epi64(p.cast()));
            let idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
            _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(two))
        }
    }

    #[inline(always)]
    fn prefetch(self, p: *const u8) {
        // SAFETY: see the impl; a prefetch reads nothing architecturally and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) }
    }
    #[inline(always)]
    fn bytes(self, b: [u8; 64]) -> __m512i {
        // SAFETY: see the impl; `b` is 64 readable bytes.
        unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
    }
    #[inline(always)]
    fn splat8(self, v: u8) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_set1_epi8(v as i8) }
    }
    #[inline(always)]
    fn zero(self) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_setzero_si512() }
    }

    #[inline(always)]
    fn bytes_where(self, bits: u64) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_movm_epi8(bits) }
    }

    #[inline(always)]
    fn and(self, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_and_si512(a, b) }
    }
    #[inline(always)]
    fn or(self, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_or_si512(a, b) }
    }
    #[inline(always)]
    fn and_or(self, a: __m512i, mask: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see the impl. 0xea: the truth table of `(a & mask) | b`.
        unsafe { _mm512_ternarylogic_epi32::<0xea>(a, mask, b) }
    }
    #[inline(always)]
    fn srlv16(self, a: __m512i, counts: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_srlv_epi16(a, counts) }
    }
    #[inline(always)]
    fn srli16_halves<const LO: u32, const HI: u32>(self, a: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_srlv_epi16(a, halves_counts(LO, HI)) }
    }
    #[inline(always)]
    fn slli16_halves<const LO: u32, const HI: u32>(self, a: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_sllv_epi16(a, halves_counts(LO, HI)) }
    }
    #[inline(always)]
    fn slli16<const S: u32>(self, a: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_slli_epi16::<S>(a) }
    }
    #[inline(always)]
    fn srli16<const S: u32>(self, a: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_srli_epi16::<S>(a) }
    }
    #[inline(always)]
    fn slli32<const S: u32>(self, a: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_slli_epi32::<S>(a) }
    }
    #[inline(always)]
    fn sub32(self, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_sub_epi32(a, b) }
    }
    #[inline(always)]
    fn sub8(self, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_sub_epi8(a, b) }
    }
    #[inline(always)]
    fn abs8(self, a: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_abs_epi8(a) }
    }
    #[inline(always)]
    fn negative8(self, a: __m512i) -> __mmask64 {
        // SAFETY: see the impl.
        unsafe { _mm512_movepi8_mask(a) }
    }
    #[inline(always)]
    fn neg8_where(self, a: __m512i, m: __mmask64) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_mask_sub_epi8(a, m, _mm512_setzero_si512(), a) }
    }
    #[inline(always)]
    fn shufb(self, table: __m512i, idx: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_shuffle_epi8(table, idx) }
    }
    #[inline(always)]
    fn permw(self, idx: __m512i, v: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_permutexvar_epi16(idx, v) }
    }
    #[inline(always)]
    fn zext8to16(self, a: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_cvtepu8_epi16(_mm512_castsi512_si256(a)) }
    }
    #[inline(always)]
    fn sext8to16(self, a: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_cvtepi8_epi16(_mm512_castsi512_si256(a)) }
    }
    #[inline(always)]
    fn zext8to32(self, a: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_cvtepu8_epi32(_mm512_castsi512_si128(a)) }
    }
    #[inline(always)]
    fn sext8to32(self, a: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_cvtepi8_epi32(_mm512_castsi512_si128(a)) }
    }
    #[inline(always)]
    fn maddubs(self, u: __m512i, s: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_maddubs_epi16(u, s) }
    }
    #[inline(always)]
    fn madd16(self, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_madd_epi16(a, b) }
    }
    #[inline(always)]
    fn packs32(self, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_packs_epi32(a, b) }
    }
    #[inline(always)]
    fn dpwssd(self, acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_dpwssd_epi32(acc, a, b) }
    }
    #[inline(always)]
    fn dpbusd(self, acc: __m512i, u: __m512i, s: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_dpbusd_epi32(acc, u, s) }
    }

    #[inline(always)]
    fn f16(self, bits: u16) -> f32 {
        // SAFETY: see the impl (AVX-512 F implies F16C).
        unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits)))) }
    }
    #[inline(always)]
    fn cvt(self, a: __m512i) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_cvtepi32_ps(a) }
    }
    #[inline(always)]
    fn cvtph(self, a: __m512i) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_cvtph_ps(_mm512_castsi512_si256(a)) }
    }
    #[inline(always)]
    fn lane<const L: usize>(self, a: __m512) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_permutexvar_ps(_mm512_set1_epi32((L % 16) as i32), a) }
    }
    #[inline(always)]
    fn lanes2<const A: usize, const B: usize>(self, a: __m512) -> __m512 {
        let (a_, b_) = ((A % 16) as i32, (B % 16) as i32);
        // SAFETY: see the impl.
        unsafe {
            let idx = _mm512_setr_epi32(
                a_, a_, a_, a_, a_, a_, a_, a_, b_, b_, b_, b_, b_, b_, b_, b_,
            );
            _mm512_permutexvar_ps(idx, a)
        }
    }
    #[inline(always)]
    fn splat32(self, v: u32) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_set1_epi32(v as i32) }
    }
    #[inline(always)]
    fn addf(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    fn splatf(self, v: f32) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_set1_ps(v) }
    }
    #[inline(always)]
    fn f2x8(self, a: f32, b: f32) -> __m512 {
        // SAFETY: see the impl.
        unsafe {
            // Through the f64 view: the 256-bit insert of AVX-512 F (the f32 one needs DQ).
            let lo = _mm512_castps_pd(_mm512_set1_ps(a));
            _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                lo,
                _mm256_castps_pd(_mm256_set1_ps(b)),
            ))
        }
    }
    #[inline(always)]
    fn mulf(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    fn fmadd(self, a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn hsum(self, a: __m512) -> f32 {
        // SAFETY: see the impl. The tree of `Vnni::hsum`: halves, then quarters, pairs, lanes.
        unsafe {
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a)));
            let s8 = _mm256_add_ps(_mm512_castps512_ps256(a), hi);
            let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
            let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
            _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps::<1>(s2, s2)))
        }
    }

    #[cfg(test)]
    fn to_bytes(self, a: __m512i) -> [u8; 64] {
        let mut b = [0u8; 64];
        // SAFETY: see the impl; `b` is 64 writable bytes.
        unsafe { _mm512_storeu_si512(b.as_mut_ptr().cast(), a) };
        b
    }
    #[cfg(test)]
    fn to_f32s(self, a: __m512) -> [f32; 16] {
        let mut v = [0.0f32; 16];
        // SAFETY: see the impl; `v` is 16 writable f32.
        unsafe { _mm512_storeu_ps(v.as_mut_ptr(), a) };
        v
    }
    #[cfg(test)]
    fn mask_bits(self, m: __mmask64) -> u64 {
        m
    }
}
