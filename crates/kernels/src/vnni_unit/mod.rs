//! The instructions of the VNNI kernels (the GGUF row-dot kernels, the packed INT8/INT4
//! register tiles), as a trait ([`Vnni`]) with three units: the CPU's AVX-512 F/BW/VNNI
//! ([`hw::Avx512Vnni`]), the CPU's AVX2 with AVX-VNNI, each value in two 256-bit halves
//! ([`avx_vnni::AvxVnni`]), and [`Soft`], a scalar model with the same semantics lane for
//! lane, so every kernel runs (and is tested) on every machine and only the instruction
//! encoding is left to the hardware.
//!
//! Semantics are the instructions' own: `maddubs` saturates its i16 pair sums, `dpbusd` and
//! `dpwssd` wrap in i32, shifts of 16-bit lanes by 16 or more give zero, `shufb` looks up
//! within each 128-bit lane and gives zero where the index byte's top bit is set. Float
//! operations are single IEEE operations (`fmadd` rounds once), and [`Vnni::hsum`] adds in
//! one fixed tree, so a kernel's result is the same bits on both units.

#[cfg(target_arch = "x86_64")]
mod avx_vnni;
#[cfg(target_arch = "x86_64")]
mod hw;

#[cfg(target_arch = "x86_64")]
pub(crate) use avx_vnni::AvxVnni;
#[cfg(target_arch = "x86_64")]
pub(crate) use hw::Avx512Vnni;

/// The 512-bit operations the kernels use. Loads take raw pointers (the kernels address
/// blocks by offset); every other operation is safe on a unit that exists.
pub(crate) trait Vnni: Copy {
    /// 512 bits of integers: 64 bytes, 32 i16 or 16 i32 lanes, as the operation reads them.
    type I: Copy;
    /// 16 f32 lanes.
    type F: Copy;
    /// One bit per byte lane.
    type M: Copy;

    /// The 64 bytes at `p`.
    ///
    /// # Safety
    /// `p .. p + 64` must be readable.
    unsafe fn load(self, p: *const u8) -> Self::I;
    /// The 32 bytes at `p` in both halves.
    ///
    /// # Safety
    /// `p .. p + 32` must be readable.
    unsafe fn load_dup32(self, p: *const u8) -> Self::I;
    /// The 32 bytes at `lo` in the low half, those at `hi` in the high half.
    ///
    /// # Safety
    /// Both ranges of 32 bytes must be readable.
    unsafe fn load_2x32(self, lo: *const u8, hi: *const u8) -> Self::I;
    /// The 16 bytes at `a` in 128-bit lanes 0 and 1, those at `b` in lanes 2 and 3.
    ///
    /// # Safety
    /// Both ranges of 16 bytes must be readable.
    unsafe fn load_dup16x2(self, a: *const u8, b: *const u8) -> Self::I;
    /// The 16 bytes at `a` in bytes 0-15, those at `b` in bytes 16-31, zeros above.
    ///
    /// # Safety
    /// Both ranges of 16 bytes must be readable.
    unsafe fn load_2x16(self, a: *const u8, b: *const u8) -> Self::I;
    /// The 32 bytes at `p` in the low half, zeros above.
    ///
    /// # Safety
    /// `p .. p + 32` must be readable.
    unsafe fn load_low32(self, p: *const u8) -> Self::I;
    /// The 16 bytes at `p` in bytes 0-15, zeros above.
    ///
    /// # Safety
    /// `p .. p + 16` must be readable.
    unsafe fn load16(self, p: *const u8) -> Self::I;
    /// The 16 f32 at `p`.
    ///
    /// # Safety
    /// `p .. p + 16` must be readable.
    unsafe fn loadf(self, p: *const f32) -> Self::F;
    /// `p[0]` in lanes 0-7 and `p[1]` in lanes 8-15.
    ///
    /// # Safety
    /// `p[0]` and `p[1]` must be readable.
    unsafe fn load_f2x8(self, p: *const f32) -> Self::F;

    /// Writes the 16 f32 of `v` to `p`.
    ///
    /// # Safety
    /// `p .. p + 16` must be writable.
    unsafe fn storef(self, p: *mut f32, v: Self::F);

    /// Asks for the cache line at `p` ahead of its use (`prefetcht0`; no architectural
    /// effect, so any address is allowed; the software unit does nothing).
    fn prefetch(self, p: *const u8);

    /// The 64 bytes `b`.
    fn bytes(self, b: [u8; 64]) -> Self::I;
    /// Every byte `v`.
    fn splat8(self, v: u8) -> Self::I;
    /// Every i32 lane `v` (`vpbroadcastd`).
    fn splat32(self, v: u32) -> Self::I;
    /// All zero bits.
    fn zero(self) -> Self::I;
    /// 0xff in the byte lanes whose bit of `bits` is set, zero elsewhere (`vpmovm2b`).
    fn bytes_where(self, bits: u64) -> Self::I;

    /// Bitwise and.
    fn and(self, a: Self::I, b: Self::I) -> Self::I;
    /// Bitwise or.
    fn or(self, a: Self::I, b: Self::I) -> Self::I;
    /// `(a & mask) | b`, bitwise (one `vpternlogd`).
    fn and_or(self, a: Self::I, mask: Self::I, b: Self::I) -> Self::I;
    /// Each u16 lane of `a` shifted right (logical) by the u16 lane of `counts` (`vpsrlvw`).
    fn srlv16(self, a: Self::I, counts: Self::I) -> Self::I;
    /// Each u16 lane of `a` shifted left by `S` (`vpsllw`).
    fn slli16<const S: u32>(self, a: Self::I) -> Self::I;
    /// Each u16 lane of `a` shifted right (logical) by `S` (`vpsrlw`).
    fn srli16<const S: u32>(self, a: Self::I) -> Self::I;
    /// The u16 lanes of the low 256 bits shifted right by `LO`, those of the high 256 bits by
    /// `HI` (`vpsrlvw` by a constant; on 256-bit halves one `vpsrlw` each, where a `srlv16`
    /// takes six instructions).
    fn srli16_halves<const LO: u32, const HI: u32>(self, a: Self::I) -> Self::I;
    /// The u16 lanes of the low 256 bits shifted left by `LO`, those of the high 256 bits by
    /// `HI` (`vpsllvw` by a constant).
    fn slli16_halves<const LO: u32, const HI: u32>(self, a: Self::I) -> Self::I;
    /// Each i32 lane of `a` shifted left by `S` (`vpslld`).
    fn slli32<const S: u32>(self, a: Self::I) -> Self::I;
    /// i32 lanes subtracted, wrapping.
    fn sub32(self, a: Self::I, b: Self::I) -> Self::I;
    /// Byte lanes subtracted, wrapping (`vpsubb`).
    fn sub8(self, a: Self::I, b: Self::I) -> Self::I;
    /// |a| per i8 lane (`vpabsb`: -128 stays 0x80, read as 128 unsigned).
    fn abs8(self, a: Self::I) -> Self::I;
    /// The sign bits of `a`'s byte lanes (`vpmovb2m`).
    fn negative8(self, a: Self::I) -> Self::M;
    /// `0 - a` in the byte lanes where `m` is set, `a` elsewhere (`vpsubb` under a mask).
    fn neg8_where(self, a: Self::I, m: Self::M) -> Self::I;
    /// Each byte `idx` picks byte `idx & 15` of `table`'s same 128-bit lane, or zero where
    /// `idx`'s top bit is set (`vpshufb`).
    fn shufb(self, table: Self::I, idx: Self::I) -> Self::I;
    /// i16 lane `i` takes lane `idx[i] & 31` of `v` (`vpermw`).
    fn permw(self, idx: Self::I, v: Self::I) -> Self::I;
    /// Bytes 0-31 zero-extended to 32 u16 lanes (`vpmovzxbw`).
    fn zext8to16(self, a: Self::I) -> Self::I;
    /// Bytes 0-31 sign-extended to 32 i16 lanes (`vpmovsxbw`).
    fn sext8to16(self, a: Self::I) -> Self::I;
    /// Bytes 0-15 zero-extended to 16 i32 lanes (`vpmovzxbd`).
    fn zext8to32(self, a: Self::I) -> Self::I;
    /// Bytes 0-15 sign-extended to 16 i32 lanes (`vpmovsxbd`).
    fn sext8to32(self, a: Self::I) -> Self::I;
    /// u8 of `u` times i8 of `s`, adjacent pairs summed into saturated i16 lanes
    /// (`vpmaddubsw`).
    fn maddubs(self, u: Self::I, s: Self::I) -> Self::I;
    /// Per i32 lane, the sum of the two i16 products of `a` and `b` there, wrapping
    /// (`vpmaddwd`; `dpwssd` into zero, which the compiler emits as this and an add).
    fn madd16(self, a: Self::I, b: Self::I) -> Self::I;
    /// `acc` plus, per i32 lane, the sum of the two i16 products of `a` and `b` there,
    /// wrapping (`vpdpwssd`).
    fn dpwssd(self, acc: Self::I, a: Self::I, b: Self::I) -> Self::I;
    /// The i32 lanes of `a` and `b` narrowed to saturated i16, per 128-bit lane four of `a`
    /// then four of `b` (`vpackssdw`).
    fn packs32(self, a: Self::I, b: Self::I) -> Self::I;
    /// `acc` plus, per i32 lane, the sum of the four u8-of-`u` times i8-of-`s` products
    /// there, wrapping (`vpdpbusd`).
    fn dpbusd(self, acc: Self::I, u: Self::I, s: Self::I) -> Self::I;

    /// The f16 with bits `bits`, as f32 (`vcvtph2ps`; exact).
    fn f16(self, bits: u16) -> f32;
    /// i32 lanes converted to f32, rounding to nearest even.
    fn cvt(self, a: Self::I) -> Self::F;
    /// The 16 f16 in bytes 0-31 as f32 lanes (`vcvtph2ps`; exact).
    fn cvtph(self, a: Self::I) -> Self::F;
    /// Every lane takes lane `L` of `a` (`vpermps`).
    fn lane<const L: usize>(self, a: Self::F) -> Self::F;
    /// Lanes 0-7 take lane `A` of `a`, lanes 8-15 lane `B` (`vpermps`).
    fn lanes2<const A: usize, const B: usize>(self, a: Self::F) -> Self::F;
    /// Every lane `v`.
    fn splatf(self, v: f32) -> Self::F;
    /// `a` in lanes 0-7, `b` in lanes 8-15.
    fn f2x8(self, a: f32, b: f32) -> Self::F;
    /// Lanes added.
    fn addf(self, a: Self::F, b: Self::F) -> Self::F;
    /// Lanes multiplied.
    fn mulf(self, a: Self::F, b: Self::F) -> Self::F;
    /// `a · b + c` per lane, rounded once.
    fn fmadd(self, a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// The sum of the lanes in a fixed order: lanes `i` and `i + 8`, then `i` and `i + 4`,
    /// then `i` and `i + 2`, then lanes 0 and 1.
    fn hsum(self, a: Self::F) -> f32;

    /// The bytes of `a` (tests compare units through it).
    #[cfg(test)]
    fn to_bytes(self, a: Self::I) -> [u8; 64];
    /// The lanes of `a`.
    #[cfg(test)]
    fn to_f32s(self, a: Self::F) -> [f32; 16];
    /// The bits of `m`.
    #[cfg(test)]
    fn mask_bits(self, m: Self::M) -> u64;
}

/// 16 bytes repeated in each 128-bit lane (a constant operand of `shufb` or a mask).
pub(crate) const fn lanes128(b: [u8; 16]) -> [u8; 64] {
    let mut o = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        o[i] = b[i % 16];
        i += 1;
    }
    o
}

/// 64 bytes of 32 u16 lanes, lane `l` holding `start + l / run` (a constant operand).
pub(crate) const fn runs16(start: u16, run: usize) -> [u8; 64] {
    let mut b = [0u8; 64];
    let mut l = 0;
    while l < 32 {
        let v = start + (l / run) as u16;
        b[2 * l] = v as u8;
        b[2 * l + 1] = (v >> 8) as u8;
        l += 1;
    }
    b
}

/// The software unit: each operation as a loop over lanes. Slow (a model, not a kernel);
/// tests run every kernel on it beside the hardware.
#[cfg(test)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Soft;

/// 64 bytes, aligned like a register.
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, align(64))]
pub(crate) struct Bytes(pub(crate) [u8; 64]);

#[cfg(test)]
impl Bytes {
    fn i16(&self, l: usize) -> i16 {
        i16::from_le_bytes([self.0[2 * l], self.0[2 * l + 1]])
    }
    fn set_i16(&mut self, l: usize, v: i16) {
        self.0[2 * l..2 * l + 2].copy_from_slice(&v.to_le_bytes());
    }
    fn i32(&self, l: usize) -> i32 {
        i32::from_le_bytes(self.0[4 * l..4 * l + 4].try_into().expect("4 bytes"))
    }
    fn set_i32(&mut self, l: usize, v: i32) {
        self.0[4 * l..4 * l + 4].copy_from_slice(&v.to_le_bytes());
    }
    fn map8(self, f: impl Fn(usize, u8) -> u8) -> Bytes {
        Bytes(std::array::from_fn(|i| f(i, self.0[i])))
    }
    fn map16(self, f: impl Fn(usize, i16) -> i16) -> Bytes {
        let mut o = Bytes([0; 64]);
        for l in 0..32 {
            o.set_i16(l, f(l, self.i16(l)));
        }
        o
    }
    fn map32(self, f: impl Fn(usize, i32) -> i32) -> Bytes {
        let mut o = Bytes([0; 64]);
        for l in 0..16 {
            o.set_i32(l, f(l, self.i32(l)));
        }
        o
    }
}

/// `N` bytes at `p`.
///
/// # Safety
/// `p .. p + n` must be readable.
#[cfg(test)]
unsafe fn read<const N: usize>(p: *const u8) -> [u8; N] {
    // SAFETY: the caller guarantees N readable bytes; an unaligned read of a byte array.
    unsafe { p.cast::<[u8; N]>().read_unaligned() }
}

#[cfg(test)]
impl Vnni for Soft {
    type I = Bytes;
    type F = [f32; 16];
    type M = u64;

    unsafe fn load(self, p: *const u8) -> Bytes {
        // SAFETY: the caller's guarantee.
        Bytes(unsafe { read::<64>(p) })
    }
    unsafe fn load_dup32(self, p: *const u8) -> Bytes {
        // SAFETY: the caller's guarantee.
        unsafe { self.load_2x32(p, p) }
    }
    unsafe fn load_2x32(self, lo: *const u8, hi: *const u8) -> Bytes {
        // SAFETY: the caller's guarantee.
        let (lo, hi) = unsafe { (read::<32>(lo), read::<32>(hi)) };
        Bytes(std::array::from_fn(
            |i| if i < 32 { lo[i] } else { hi[i - 32] },
        ))
    }
    unsafe fn load_dup16x2(self, a: *const u8, b: *const u8) -> Bytes {
        // SAFETY: the caller's guarantee.
        let l = unsafe { [read::<16>(a), read::<16>(b)] };
        Bytes(std::array::from_fn(|i| l[i / 32][i % 16]))
    }
    unsafe fn load_2x16(self, a: *const u8, b: *const u8) -> Bytes {
        let mut o = [0u8; 64];
        // SAFETY: 16 readable bytes at each (caller).
        unsafe {
            o[..16].copy_from_slice(&read::<16>(a));
            o[16..32].copy_from_slice(&read::<16>(b));
        }
        Bytes(o)
    }
    unsafe fn load_low32(self, p: *const u8) -> Bytes {
        // SAFETY: the caller's guarantee.
        let lo = unsafe { read::<32>(p) };
        Bytes(std::array::from_fn(|i| if i < 32 { lo[i] } else { 0 }))
    }
    unsafe fn load16(self, p: *const u8) -> Bytes {
        // SAFETY: the caller's guarantee.
        let lo = unsafe { read::<16>(p) };
        Bytes(std::array::from_fn(|i| if i < 16 { lo[i] } else { 0 }))
    }
    unsafe fn loadf(self, p: *const f32) -> [f32; 16] {
        // SAFETY: the caller's guarantee.
        std::array::from_fn(|l| unsafe { p.add(l).read_unaligned() })
    }
    unsafe fn load_f2x8(self, p: *const f32) -> [f32; 16] {
        // SAFETY: the caller's guarantee.
        let (a, b) = unsafe { (p.read_unaligned(), p.add(1).read_unaligned()) };
        self.f2x8(a, b)
    }

    unsafe fn storef(self, p: *mut f32, v: [f32; 16]) {
        for (l, v) in v.into_iter().enumerate() {
            // SAFETY: the caller's guarantee.
            unsafe { p.add(l).write_unaligned(v) };
        }
    }

    fn prefetch(self, _: *const u8) {}
    fn bytes(self, b: [u8; 64]) -> Bytes {
        Bytes(b)
    }
    fn splat8(self, v: u8) -> Bytes {
        Bytes([v; 64])
    }
    fn splat32(self, v: u32) -> Bytes {
        Bytes(std::array::from_fn(|i| v.to_le_bytes()[i % 4]))
    }
    fn zero(self) -> Bytes {
        Bytes([0; 64])
    }
    fn bytes_where(self, bits: u64) -> Bytes {
        Bytes(std::array::from_fn(|i| {
            if (bits >> i) & 1 == 1 { 0xff } else { 0 }
        }))
    }

    fn and(self, a: Bytes, b: Bytes) -> Bytes {
        a.map8(|i, x| x & b.0[i])
    }
    fn or(self, a: Bytes, b: Bytes) -> Bytes {
        a.map8(|i, x| x | b.0[i])
    }
    fn and_or(self, a: Bytes, mask: Bytes, b: Bytes) -> Bytes {
        a.map8(|i, x| (x & mask.0[i]) | b.0[i])
    }
    fn srlv16(self, a: Bytes, counts: Bytes) -> Bytes {
        a.map16(|l, x| {
            let c = counts.i16(l) as u16;
            if c > 15 { 0 } else { ((x as u16) >> c) as i16 }
        })
    }
    fn slli16<const S: u32>(self, a: Bytes) -> Bytes {
        a.map16(|_, x| if S > 15 { 0 } else { ((x as u16) << S) as i16 })
    }
    fn srli16<const S: u32>(self, a: Bytes) -> Bytes {
        a.map16(|_, x| if S > 15 { 0 } else { ((x as u16) >> S) as i16 })
    }
    fn srli16_halves<const LO: u32, const HI: u32>(self, a: Bytes) -> Bytes {
        a.map16(|l, x| {
            let c = if l < 16 { LO } else { HI };
            if c > 15 { 0 } else { ((x as u16) >> c) as i16 }
        })
    }
    fn slli16_halves<const LO: u32, const HI: u32>(self, a: Bytes) -> Bytes {
        a.map16(|l, x| {
            let c = if l < 16 { LO } else { HI };
            if c > 15 { 0 } else { ((x as u16) << c) as i16 }
        })
    }
    fn slli32<const S: u32>(self, a: Bytes) -> Bytes {
        a.map32(|_, x| if S > 31 { 0 } else { ((x as u32) << S) as i32 })
    }
    fn sub32(self, a: Bytes, b: Bytes) -> Bytes {
        a.map32(|l, x| x.wrapping_sub(b.i32(l)))
    }
    fn sub8(self, a: Bytes, b: Bytes) -> Bytes {
        a.map8(|i, x| x.wrapping_sub(b.0[i]))
    }
    fn abs8(self, a: Bytes) -> Bytes {
        a.map8(|_, x| (x as i8).unsigned_abs())
    }
    fn negative8(self, a: Bytes) -> u64 {
        (0..64).fold(0, |m, i| m | (u64::from(a.0[i] >> 7) << i))
    }
    fn neg8_where(self, a: Bytes, m: u64) -> Bytes {
        a.map8(|i, x| {
            if (m >> i) & 1 == 1 {
                0u8.wrapping_sub(x)
            } else {
                x
            }
        })
    }
    fn shufb(self, table: Bytes, idx: Bytes) -> Bytes {
        idx.map8(|i, x| {
            if x & 0x80 != 0 {
                0
            } else {
                table.0[(i & !15) + usize::from(x & 15)]
            }
        })
    }
    fn permw(self, idx: Bytes, v: Bytes) -> Bytes {
        idx.map16(|_, x| v.i16((x & 31) as usize))
    }
    fn zext8to16(self, a: Bytes) -> Bytes {
        a.map16(|l, _| i16::from(a.0[l]))
    }
    fn sext8to16(self, a: Bytes) -> Bytes {
        a.map16(|l, _| i16::from(a.0[l] as i8))
    }
    fn zext8to32(self, a: Bytes) -> Bytes {
        a.map32(|l, _| i32::from(a.0[l]))
    }
    fn sext8to32(self, a: Bytes) -> Bytes {
        a.map32(|l, _| i32::from(a.0[l] as i8))
    }
    fn maddubs(self, u: Bytes, s: Bytes) -> Bytes {
        u.map16(|l, _| {
            let p = |i: usize| i32::from(u.0[i]) * i32::from(s.0[i] as i8);
            (p(2 * l) + p(2 * l + 1)).clamp(i16::MIN.into(), i16::MAX.into()) as i16
        })
    }
    fn madd16(self, a: Bytes, b: Bytes) -> Bytes {
        self.dpwssd(self.zero(), a, b)
    }
    fn packs32(self, a: Bytes, b: Bytes) -> Bytes {
        a.map16(|l, _| {
            let (lane, i) = (l / 8, l % 8);
            let src = if i < 4 { a } else { b };
            src.i32(4 * lane + i % 4)
                .clamp(i16::MIN.into(), i16::MAX.into()) as i16
        })
    }
    fn dpwssd(self, acc: Bytes, a: Bytes, b: Bytes) -> Bytes {
        acc.map32(|l, x| {
            let p = |i: usize| i32::from(a.i16(i)) * i32::from(b.i16(i));
            x.wrapping_add(p(2 * l)).wrapping_add(p(2 * l + 1))
        })
    }
    fn dpbusd(self, acc: Bytes, u: Bytes, s: Bytes) -> Bytes {
        acc.map32(|l, x| {
            (4 * l..4 * l + 4).fold(x, |x, i| {
                x.wrapping_add(i32::from(u.0[i]) * i32::from(s.0[i] as i8))
            })
        })
    }

    fn f16(self, bits: u16) -> f32 {
        half::f16::from_bits(bits).to_f32()
    }
    fn cvt(self, a: Bytes) -> [f32; 16] {
        std::array::from_fn(|l| a.i32(l) as f32)
    }
    fn cvtph(self, a: Bytes) -> [f32; 16] {
        std::array::from_fn(|l| half::f16::from_bits(a.i16(l) as u16).to_f32())
    }
    fn lane<const L: usize>(self, a: [f32; 16]) -> [f32; 16] {
        [a[L % 16]; 16]
    }
    fn lanes2<const A: usize, const B: usize>(self, a: [f32; 16]) -> [f32; 16] {
        std::array::from_fn(|l| if l < 8 { a[A % 16] } else { a[B % 16] })
    }
    fn splatf(self, v: f32) -> [f32; 16] {
        [v; 16]
    }
    fn f2x8(self, a: f32, b: f32) -> [f32; 16] {
        std::array::from_fn(|l| if l < 8 { a } else { b })
    }
    fn addf(self, a: [f32; 16], b: [f32; 16]) -> [f32; 16] {
        std::array::from_fn(|l| a[l] + b[l])
    }
    fn mulf(self, a: [f32; 16], b: [f32; 16]) -> [f32; 16] {
        std::array::from_fn(|l| a[l] * b[l])
    }
    fn fmadd(self, a: [f32; 16], b: [f32; 16], c: [f32; 16]) -> [f32; 16] {
        std::array::from_fn(|l| a[l].mul_add(b[l], c[l]))
    }
    fn hsum(self, a: [f32; 16]) -> f32 {
        let s8: [f32; 8] = std::array::from_fn(|i| a[i] + a[i + 8]);
        let s4: [f32; 4] = std::array::from_fn(|i| s8[i] + s8[i + 4]);
        let s2: [f32; 2] = std::array::from_fn(|i| s4[i] + s4[i + 2]);
        s2[0] + s2[1]
    }

    #[cfg(test)]
    fn to_bytes(self, a: Bytes) -> [u8; 64] {
        a.0
    }
    #[cfg(test)]
    fn to_f32s(self, a: [f32; 16]) -> [f32; 16] {
        a
    }
    #[cfg(test)]
    fn mask_bits(self, m: u64) -> u64 {
        m
    }
}
