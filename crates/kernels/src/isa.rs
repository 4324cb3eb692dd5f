//! Which instruction-set path the kernels run: AMX, AVX-512, AVX2 (with or without AVX-VNNI)
//! or portable Rust.
//!
//! Features are detected once and cached. AMX needs three things: the CPU bits (CPUID leaf 7,
//! EDX bits 22 AMX-BF16, 24 AMX-TILE, 25 AMX-INT8), the OS enabling tile state in XCR0 (bits 17
//! and 18), and, on Linux, the per-process permission `arch_prctl(ARCH_REQ_XCOMP_PERM,
//! XFEATURE_XTILEDATA)`, requested once here. The Linux documentation (x86/xstate) states that
//! the permission is per process and valid for all its threads, so the pool's workers need no
//! request of their own.
//!
//! The row-dot kernels on ggml's block formats (`crate::ggml`) run on AVX-512 VNNI from
//! [`Isa::Avx512`] up and on AVX2 (with FMA) below; AVX2 also serves the packed
//! BF16/INT8/INT4 micro-kernels (`packed::micro::avx2`) on CPUs without AVX-512.
//! [`Isa::AvxVnni`] is AVX2 plus the VEX-encoded `vpdpbusd`/`vpdpwssd` (Intel client cores from
//! Alder Lake on, AMD Zen 5): the VNNI kernels run there on 256-bit registers
//! (`vnni_unit::AvxVnni`) where they measured faster than the AVX2 ones. It is not implied by
//! AVX-512 (Zen 4 has AVX-512 VNNI but not the VEX form), so it is available only where the
//! CPU reports it, whatever the order says.
//!
//! `STRATA_KERNEL=portable|avx2|avxvnni|avx512|amx` forces a path (for tests and benchmarks); a
//! forced path the CPU lacks falls back to the best available one below it, never to a SIGILL.

use std::sync::OnceLock;

/// An instruction-set path, ordered from the most portable to the fastest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Plain Rust, correct on any CPU.
    Portable,
    /// AVX2 with FMA and F16C (`vpmaddubsw` int8 dot products, 256-bit f32 FMA).
    Avx2,
    /// AVX2 with AVX-VNNI (`vpdpbusd` on 256-bit registers).
    AvxVnni,
    /// AVX-512 F/BW/VL with VNNI (`vpdpbusd`), and BF16 (`vdpbf16ps`) where the CPU has it
    /// and runs it faster than f32 FMA ([`bf16_dot_on_dpbf16`]: Zen 4 and 5; Intel's cores,
    /// and those without it such as Ice Lake, run packed BF16 weights on f32 FMA).
    Avx512,
    /// AMX tiles (`tdpbf16ps`, `tdpbsud`); implies [`Isa::Avx512`] with BF16.
    Amx,
}

impl Isa {
    /// Name as accepted by `STRATA_KERNEL`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avxvnni",
            Isa::Avx512 => "avx512",
            Isa::Amx => "amx",
        }
    }

    /// Parses a `STRATA_KERNEL` value.
    pub fn from_name(s: &str) -> Option<Isa> {
        match s {
            "portable" => Some(Isa::Portable),
            "avx2" => Some(Isa::Avx2),
            "avxvnni" => Some(Isa::AvxVnni),
            "avx512" => Some(Isa::Avx512),
            "amx" => Some(Isa::Amx),
            _ => None,
        }
    }

    /// True when this machine can run the path.
    pub fn is_available(self) -> bool {
        self <= detected() && (self != Isa::AvxVnni || has_avx_vnni())
    }

    /// Every path this machine can run, most portable first.
    pub fn available() -> Vec<Isa> {
        [
            Isa::Portable,
            Isa::Avx2,
            Isa::AvxVnni,
            Isa::Avx512,
            Isa::Amx,
        ]
        .into_iter()
        .filter(|i| i.is_available())
        .collect()
    }

    /// The path kernels use by default: the best detected one, or `STRATA_KERNEL` capped to it.
    pub fn selected() -> Isa {
        static SEL: OnceLock<Isa> = OnceLock::new();
        *SEL.get_or_init(|| {
            let best = detected();
            std::env::var("STRATA_KERNEL")
                .ok()
                .and_then(|v| Isa::from_name(v.trim()))
                .map_or(best, |forced| match forced.min(best) {
                    Isa::AvxVnni if !has_avx_vnni() => Isa::Avx2,
                    isa => isa,
                })
        })
    }
}

/// The best path the CPU and OS support (AMX permission already requested).
pub fn detected() -> Isa {
    static DET: OnceLock<Isa> = OnceLock::new();
    *DET.get_or_init(detect)
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Isa {
    let avx512 = std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx512vnni");
    if !avx512 {
        let avx2 = std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c");
        return match (avx2, has_avx_vnni()) {
            (true, true) => Isa::AvxVnni,
            (true, false) => Isa::Avx2,
            _ => Isa::Portable,
        };
    }
    // AMX CPUs all have AVX-512 BF16; the AMX path's fills use it.
    if has_avx512_bf16() && amx_cpu_and_os() && request_amx_permission() {
        Isa::Amx
    } else {
        Isa::Avx512
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Isa {
    Isa::Portable
}

/// Whether the CPU has AVX2, FMA, F16C and AVX-VNNI (the VEX form of `vpdpbusd`), whatever
/// the selected path.
pub(crate) fn has_avx_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| {
            std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
                && std::arch::is_x86_feature_detected!("avxvnni")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the CPU has AVX-512 F and BF16 (`vdpbf16ps`, `vcvtne2ps2bf16`), whatever the
/// selected path: the packed BF16 kernels and fills use them where it does, f32 FMA and
/// integer rounding where it does not.
pub fn has_avx512_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| {
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bf16")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the AVX-512 BF16 micro-kernels multiply on `vdpbf16ps` rather than on f32 FMA
/// (two FMAs per BF16 pair): where the CPU has it and issues it faster than FMA. AMD's cores
/// (Zen 4) run one 512-bit `vdpbf16ps` per cycle, twice their f32 FMA rate; Intel's one every
/// other cycle, half of theirs. Measured (docs/benchmarks.md, research/machine.md): on an
/// Emerald Rapids Xeon without AMX (2026-11-30) peaks of 0.162 TFLOPS against 0.333 on two
/// threads, and one 64x2048 BF16 tile at 76-82 GOPS on `vdpbf16ps` against 99-108 on FMA.
/// Decided by vendor, not by a timing at start-up, so that a run's results do not depend on
/// the host's load.
pub fn bf16_dot_on_dpbf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static FAST: OnceLock<bool> = OnceLock::new();
        *FAST.get_or_init(|| has_avx512_bf16() && is_amd())
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the CPU is AMD's (CPUID vendor "AuthenticAMD"): where its cores and Intel's
/// differ in what the kernels are tuned to (the `vdpbf16ps` rate, the order decode reads
/// weight rows in).
pub(crate) fn is_amd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AMD: OnceLock<bool> = OnceLock::new();
        *AMD.get_or_init(|| {
            let leaf0 = std::arch::x86_64::__cpuid(0);
            // "AuthenticAMD" in EBX, EDX, ECX.
            (leaf0.ebx, leaf0.edx, leaf0.ecx) == (0x6874_7541, 0x6974_6e65, 0x444d_4163)
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// What the kernels multiply on with the selected path, per kind of weight, in words (for
/// `strata devices`): `(int8, bf16)`, the units of the integer forms (GGUF blocks, packed
/// INT8/INT4) and of BF16 weights (and the GGUF types without an integer form).
pub fn units() -> (&'static str, &'static str) {
    let bf16_avx512 = if bf16_dot_on_dpbf16() {
        "AVX-512 BF16 (vdpbf16ps)"
    } else if has_avx512_bf16() {
        "AVX-512 f32 FMA (this vendor's vdpbf16ps runs at half the FMA rate)"
    } else {
        "AVX-512 f32 FMA (no AVX-512 BF16)"
    };
    match Isa::selected() {
        Isa::Amx => (
            "AMX (tdpbsud) and AVX-512 VNNI (vpdpbusd)",
            "AMX (tdpbf16ps) from 32 tokens per call",
        ),
        Isa::Avx512 => ("AVX-512 VNNI (vpdpbusd)", bf16_avx512),
        Isa::AvxVnni => ("AVX-VNNI (vpdpbusd, 256-bit)", "AVX2 f32 FMA"),
        Isa::Avx2 => ("AVX2 (vpmaddubsw)", "AVX2 f32 FMA"),
        Isa::Portable => ("portable Rust", "portable Rust"),
    }
}

/// CPUID AMX-BF16/TILE/INT8 bits and XCR0 tile-state bits.
#[cfg(target_arch = "x86_64")]
fn amx_cpu_and_os() -> bool {
    use std::arch::x86_64::__cpuid_count;
    let leaf7 = __cpuid_count(7, 0);
    let cpu =
        (leaf7.edx >> 22) & 1 == 1 && (leaf7.edx >> 24) & 1 == 1 && (leaf7.edx >> 25) & 1 == 1;
    // OSXSAVE (leaf 1 ECX bit 27) makes `xgetbv` legal.
    let osxsave = (__cpuid_count(1, 0).ecx >> 27) & 1 == 1;
    if !cpu || !osxsave {
        return false;
    }
    // SAFETY: OSXSAVE is set, so `xgetbv` with ECX = 0 is defined; it only reads XCR0.
    let xcr0 = unsafe { xgetbv0() };
    (xcr0 >> 17) & 3 == 3
}

/// Reads XCR0.
///
/// # Safety
/// The CPU must report OSXSAVE (CPUID leaf 1, ECX bit 27).
#[cfg(target_arch = "x86_64")]
unsafe fn xgetbv0() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: the caller checked OSXSAVE; `xgetbv` reads XCR0 into edx:eax and touches no memory.
    unsafe {
        core::arch::asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") hi,
            options(nomem, nostack, preserves_flags));
    }
    (u64::from(hi) << 32) | u64::from(lo)
}

/// Asks Linux for AMX tile-data permission for this process; true when granted.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_amx_permission() -> bool {
    const ARCH_GET_XCOMP_PERM: libc::c_long = 0x1022;
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with these codes only changes this process's xstate permissions;
    // the GET variant writes one u64 to the pointer we pass, which points to a live local.
    unsafe {
        if libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) != 0
        {
            return false;
        }
        let mut perm: u64 = 0;
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_GET_XCOMP_PERM,
            &mut perm as *mut u64,
        ) == 0
            && (perm >> XFEATURE_XTILEDATA) & 1 == 1
    }
}

/// Other x86-64 systems: without a known permission protocol, AMX stays off.
#[cfg(all(target_arch = "x86_64", not(target_os = "linux")))]
fn request_amx_permission() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_selection_is_available() {
        for isa in [
            Isa::Portable,
            Isa::Avx2,
            Isa::AvxVnni,
            Isa::Avx512,
            Isa::Amx,
        ] {
            assert_eq!(Isa::from_name(isa.name()), Some(isa));
        }
        assert_eq!(Isa::from_name("sse"), None);
        assert!(Isa::selected().is_available());
        assert_eq!(Isa::available()[0], Isa::Portable);
    }
}
