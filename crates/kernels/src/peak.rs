//! Machine peaks measured in-process: AMX, AVX-512 and AVX2 dot-product throughput (and AVX2
//! and AVX-512 f32 FMA, the packed BF16 kernel's instruction without `vdpbf16ps`), DRAM read
//! bandwidth. Benchmarks report each kernel as a fraction of these, measured in the same run.
//!
//! Compute peaks keep every operand in registers (tiles or zmm) with enough independent
//! accumulators to cover the instruction latency, on every pool thread at once. The read
//! bandwidth sums a buffer much larger than the last-level cache on every pool thread, as
//! the best of several stream counts per thread.
//!
//! A key design decision: these live in the kernels crate (not the benchmark) because they
//! need the same `unsafe` instruction access as the kernels, and the same thread pool.

use std::time::Instant;

use crate::isa::{Isa, detected};
use crate::{num_threads, parallel_for};

/// Runs `body(iters)` on every pool thread at once, doubling `iters` until a run lasts about
/// `target_s` seconds; returns the per-run work rate as `work_per_iter * iters * threads / s`.
fn rate(work_per_iter: f64, target_s: f64, body: impl Fn(u64) + Sync) -> f64 {
    let threads = num_threads();
    let mut iters = 1u64 << 10;
    loop {
        let t0 = Instant::now();
        parallel_for(threads, |_| body(iters));
        let s = t0.elapsed().as_secs_f64();
        if s >= target_s || iters >= 1 << 40 {
            return work_per_iter * iters as f64 * threads as f64 / s;
        }
        iters *= if s < target_s / 8.0 { 4 } else { 2 };
    }
}

/// AVX-512 `vdpbf16ps` throughput in TFLOPS (2 FLOP per multiply-add), or `None` without it.
pub fn avx512_bf16_tflops(target_s: f64) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    if crate::isa::has_avx512_bf16() {
        // SAFETY: AVX-512 BF16 was detected.
        let f = |n| unsafe { x86::dpbf16_loop(n) };
        // 16 accumulators x 16 lanes x 2 pairs x 2 FLOP per iteration.
        return Some(rate(16.0 * 64.0, target_s, f) / 1e12);
    }
    let _ = target_s;
    None
}

/// AVX-512 VNNI `vpdpbusd` throughput in TOPS (2 ops per multiply-add), or `None` without it.
pub fn avx512_vnni_tops(target_s: f64) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    if detected() >= Isa::Avx512 {
        // SAFETY: AVX-512 VNNI was detected.
        let f = |n| unsafe { x86::dpbusd_loop(n) };
        return Some(rate(16.0 * 128.0, target_s, f) / 1e12);
    }
    let _ = target_s;
    None
}

/// AVX2 int8 throughput in TOPS (2 ops per multiply-add) of the instruction pair the ggml
/// block kernels use per 32 values (`vpmaddubsw` then `vpmaddwd`), or `None` without AVX2.
pub fn avx2_int8_tops(target_s: f64) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    if detected() >= Isa::Avx2 {
        // SAFETY: AVX2 was detected.
        let f = |n| unsafe { x86::maddubs_loop(n) };
        // 8 accumulators x 32 multiply-adds x 2 ops per iteration.
        return Some(rate(8.0 * 64.0, target_s, f) / 1e12);
    }
    let _ = target_s;
    None
}

/// AVX-VNNI `vpdpbusd` (VEX, on ymm) throughput in TOPS (2 ops per multiply-add), or `None`
/// without it.
pub fn avx_vnni_tops(target_s: f64) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    if crate::isa::has_avx_vnni() {
        // SAFETY: AVX-VNNI was detected.
        let f = |n| unsafe { x86::dpbusd_ymm_loop(n) };
        // 16 accumulators x 8 lanes x 4 multiply-adds x 2 ops per iteration.
        return Some(rate(16.0 * 64.0, target_s, f) / 1e12);
    }
    let _ = target_s;
    None
}

/// AVX2 f32 FMA (`vfmadd231ps` on ymm) throughput in TFLOPS (2 FLOP per multiply-add), the
/// instruction of the packed BF16 kernel on AVX2, or `None` without AVX2 and FMA.
pub fn avx2_fma_tflops(target_s: f64) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    if detected() >= Isa::Avx2 {
        // SAFETY: AVX2 and FMA were detected.
        let f = |n| unsafe { x86::fma_loop(n) };
        // 12 accumulators x 8 lanes x 2 FLOP per iteration.
        return Some(rate(12.0 * 16.0, target_s, f) / 1e12);
    }
    let _ = target_s;
    None
}

/// AVX-512 f32 FMA (`vfmadd231ps` on zmm) throughput in TFLOPS, the instruction of the
/// packed BF16 kernel on AVX-512 CPUs without BF16, or `None` without AVX-512.
pub fn avx512_fma_tflops(target_s: f64) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    if detected() >= Isa::Avx512 {
        // SAFETY: AVX-512 F was detected.
        let f = |n| unsafe { x86::fma_zmm_loop(n) };
        // 12 accumulators x 16 lanes x 2 FLOP per iteration.
        return Some(rate(12.0 * 32.0, target_s, f) / 1e12);
    }
    let _ = target_s;
    None
}

/// AMX `tdpbf16ps` throughput in TFLOPS, or `None` without AMX.
pub fn amx_bf16_tflops(target_s: f64) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    if detected() == Isa::Amx {
        // SAFETY: AMX was detected (permission granted).
        let f = |n| unsafe { x86::amx_loop(n, false) };
        // 4 instructions per iteration, each 16 x 16 x 32 multiply-adds.
        return Some(rate(4.0 * 16384.0, target_s, f) / 1e12);
    }
    let _ = target_s;
    None
}

/// AMX `tdpbssd` throughput in TOPS, or `None` without AMX.
pub fn amx_int8_tops(target_s: f64) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    if detected() == Isa::Amx {
        // SAFETY: AMX was detected (permission granted).
        let f = |n| unsafe { x86::amx_loop(n, true) };
        return Some(rate(4.0 * 32768.0, target_s, f) / 1e12);
    }
    let _ = target_s;
    None
}

/// Read bandwidth in GB/s: every pool thread sums its share of a `bytes` buffer, best of
/// `reps` rounds of passes with 1, 2, 4 and 8 streams per thread (the buffer is written
/// first, in parallel, so its pages exist).
pub fn read_gbs(bytes: usize, reps: usize) -> f64 {
    let words = bytes / 8;
    let mut buf = vec![0u64; words];
    let threads = num_threads();
    let chunk = words.div_ceil(threads).max(1);
    {
        let w = crate::buf::SharedMut::new(&mut buf);
        parallel_for(threads, |i| {
            let start = (i * chunk).min(words);
            let len = chunk.min(words - start);
            // SAFETY: thread `i` alone writes its chunk.
            let part = unsafe { w.part(start, len) };
            part.iter_mut().enumerate().for_each(|(j, v)| *v = j as u64);
        });
    }
    let mut best = 0.0f64;
    for _ in 0..reps.max(1) {
        for streams in READ_STREAMS {
            let t0 = Instant::now();
            let sums: Vec<std::sync::atomic::AtomicU64> = (0..threads)
                .map(|_| std::sync::atomic::AtomicU64::new(0))
                .collect();
            parallel_for(threads, |i| {
                let start = (i * chunk).min(words);
                let part = &buf[start..start + chunk.min(words - start)];
                let s = sum_words(part, streams);
                sums[i].store(s, std::sync::atomic::Ordering::Relaxed);
            });
            let s = t0.elapsed().as_secs_f64();
            std::hint::black_box(&sums);
            best = best.max(words as f64 * 8.0 / s / 1e9);
        }
    }
    best
}

/// Sequential streams per thread tried by [`read_gbs`], which keeps the best: one stream
/// under-reads some machines, and kernels read several weight strips at once (on this 2-core
/// AMD host 2 streams per thread read ~40 GB/s where 1 read ~32 and 16 read ~28).
const READ_STREAMS: [usize; 4] = [1, 2, 4, 8];

/// Wrapping sum of `words` read as `streams` interleaved sequential streams (AVX-512 where
/// available).
fn sum_words(words: &[u64], streams: usize) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if detected() >= Isa::Avx512 {
        // SAFETY: AVX-512 F was detected.
        return unsafe {
            match streams {
                1 => x86::sum_avx512::<1>(words),
                2 => x86::sum_avx512::<2>(words),
                4 => x86::sum_avx512::<4>(words),
                _ => x86::sum_avx512::<8>(words),
            }
        };
    }
    let _ = streams;
    // Eight lanes of independent sums let the compiler use wide loads.
    let mut acc = [0u64; 8];
    for c in words.chunks_exact(8) {
        for l in 0..8 {
            acc[l] = acc[l].wrapping_add(c[l]);
        }
    }
    acc.iter().fold(0u64, |a, b| a.wrapping_add(*b))
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::asm;
    use std::arch::x86_64::*;

    /// # Safety
    /// AVX-512 F and BF16 must be available.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn dpbf16_loop(n: u64) {
        let a: __m512bh = std::hint::black_box(_mm512_cvtne2ps_pbh(
            _mm512_set1_ps(1e-3),
            _mm512_set1_ps(2e-3),
        ));
        let mut acc = [_mm512_setzero_ps(); 16];
        for _ in 0..n {
            for acc in acc.iter_mut() {
                *acc = _mm512_dpbf16_ps(*acc, a, a);
            }
        }
        std::hint::black_box(acc);
    }

    /// # Safety
    /// AVX2 must be available.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn maddubs_loop(n: u64) {
        let a = std::hint::black_box(_mm256_set1_epi8(3));
        let ones = std::hint::black_box(_mm256_set1_epi16(1));
        let mut acc = [_mm256_setzero_si256(); 8];
        // Each product feeds the next one's bytes, so no step is loop-invariant (the compiler
        // would hoist `maddubs(a, a)`); eight chains cover the instruction latency.
        let mut chain = [a; 8];
        for _ in 0..n {
            for (acc, b) in acc.iter_mut().zip(chain.iter_mut()) {
                *b = _mm256_maddubs_epi16(a, *b);
                *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(*b, ones));
            }
        }
        std::hint::black_box((acc, chain));
    }

    /// # Safety
    /// AVX2 and FMA must be available.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn fma_loop(n: u64) {
        let a = std::hint::black_box(_mm256_set1_ps(0.999));
        let b = std::hint::black_box(_mm256_set1_ps(1e-3));
        // Twelve chains cover the FMA latency (4 cycles at 2 per cycle needs 8 in flight).
        let mut acc = [_mm256_setzero_ps(); 12];
        for _ in 0..n {
            for acc in acc.iter_mut() {
                *acc = _mm256_fmadd_ps(*acc, a, b);
            }
        }
        std::hint::black_box(acc);
    }

    /// # Safety
    /// AVX-512 F must be available.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn fma_zmm_loop(n: u64) {
        let a = std::hint::black_box(_mm512_set1_ps(0.999));
        let b = std::hint::black_box(_mm512_set1_ps(1e-3));
        // Twelve chains cover the FMA latency, as in `fma_loop`.
        let mut acc = [_mm512_setzero_ps(); 12];
        for _ in 0..n {
            for acc in acc.iter_mut() {
                *acc = _mm512_fmadd_ps(*acc, a, b);
            }
        }
        std::hint::black_box(acc);
    }

    /// # Safety
    /// AVX-512 F and VNNI must be available.
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub(super) unsafe fn dpbusd_loop(n: u64) {
        let a = std::hint::black_box(_mm512_set1_epi8(3));
        let mut acc = [_mm512_setzero_si512(); 16];
        for _ in 0..n {
            for acc in acc.iter_mut() {
                *acc = _mm512_dpbusd_epi32(*acc, a, a);
            }
        }
        std::hint::black_box(acc);
    }

    /// # Safety
    /// AVX2 and AVX-VNNI must be available.
    #[target_feature(enable = "avx2,avxvnni")]
    pub(super) unsafe fn dpbusd_ymm_loop(n: u64) {
        let a = std::hint::black_box(_mm256_set1_epi8(3));
        let mut acc = [_mm256_setzero_si256(); 16];
        for _ in 0..n {
            for acc in acc.iter_mut() {
                *acc = _mm256_dpbusd_avx_epi32(*acc, a, a);
            }
        }
        std::hint::black_box(acc);
    }

    /// Sums `words` as `STREAMS` interleaved sequential streams, 64 bytes from each per step
    /// (tail ignored).
    ///
    /// # Safety
    /// AVX-512 F must be available.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn sum_avx512<const STREAMS: usize>(words: &[u64]) -> u64 {
        let part = words.len() / STREAMS / 8 * 8;
        let mut acc = [_mm512_setzero_si512(); STREAMS];
        for i in (0..part).step_by(8) {
            for (s, acc) in acc.iter_mut().enumerate() {
                // SAFETY: `s * part + i + 8 <= STREAMS * part <= words.len()`.
                let v = unsafe {
                    _mm512_loadu_si512(words.as_ptr().add(s * part + i) as *const __m512i)
                };
                *acc = _mm512_add_epi64(*acc, v);
            }
        }
        let s = acc
            .iter()
            .fold(_mm512_setzero_si512(), |a, b| _mm512_add_epi64(a, *b));
        _mm512_reduce_add_epi64(s) as u64
    }

    #[repr(C, align(64))]
    struct Cfg([u8; 64]);

    /// `n` iterations of 4 independent tile dot products on register-resident tiles.
    ///
    /// # Safety
    /// AMX must be available and permitted for the process.
    pub(super) unsafe fn amx_loop(n: u64, int8: bool) {
        let mut cfg = Cfg([0; 64]);
        cfg.0[0] = 1;
        for t in 0..8 {
            cfg.0[16 + 2 * t] = 64;
            cfg.0[48 + t] = 16;
        }
        let n = n.max(1);
        // SAFETY: AMX is permitted (caller); the configuration is a valid palette 1 with eight
        // 16 x 64-byte tiles; the loop only uses tile registers and the counter.
        unsafe {
            asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly));
            asm!(
                "tilezero tmm4",
                "tilezero tmm5",
                "tilezero tmm6",
                "tilezero tmm7",
                options(nostack, nomem)
            );
            if int8 {
                asm!(
                    "2:",
                    "tdpbssd tmm0, tmm4, tmm6",
                    "tdpbssd tmm1, tmm4, tmm7",
                    "tdpbssd tmm2, tmm5, tmm6",
                    "tdpbssd tmm3, tmm5, tmm7",
                    "dec {n}",
                    "jnz 2b",
                    n = inout(reg) n => _,
                    options(nostack, nomem),
                );
            } else {
                asm!(
                    "2:",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    "dec {n}",
                    "jnz 2b",
                    n = inout(reg) n => _,
                    options(nostack, nomem),
                );
            }
            asm!("tilerelease", options(nostack, nomem));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peaks_are_positive_where_available() {
        assert!(read_gbs(1 << 22, 1) > 0.0);
        if let Some(t) = avx512_bf16_tflops(0.001) {
            assert!(t > 0.0);
        }
        assert_eq!(avx2_fma_tflops(0.001).is_some(), detected() >= Isa::Avx2);
        assert_eq!(avx_vnni_tops(0.001).is_some(), crate::isa::has_avx_vnni());
        assert_eq!(amx_bf16_tflops(0.001).is_some(), detected() == Isa::Amx);
    }
}
