//! The software unit against the CPU, operation by operation; every VNNI kernel on the
//! software unit against the general integer path, and on the CPU bit for bit against the
//! software unit.

use super::super::{IN_REGISTER_TYPES as TYPES, RowDot, activation_block};
use crate::Isa;
use crate::ggml::dot::Q8Rows;
use crate::ggml::test_util::{dot_tolerances, random_blocks};
use crate::ggml::{GgmlMatrix, GgmlType};
use crate::vnni_unit::{Soft, Vnni};

fn next(seed: &mut u64) -> u64 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *seed >> 11
}

/// Every operation of `u` on the inputs, each result as bytes, named.
///
/// # Safety
/// `U` runs on this CPU, compiled into a function with its features.
#[inline(always)]
unsafe fn all_ops<U: Vnni>(
    u: U,
    a: &[u8; 64],
    b: &[u8; 64],
    f: &[f32; 16],
) -> Vec<(&'static str, Vec<u8>)> {
    let (x, y) = (u.bytes(*a), u.bytes(*b));
    // Shift counts 0-31 per u16 lane: half of them past 15.
    let counts = u.and(
        y,
        u.bytes(std::array::from_fn(|i| if i % 2 == 0 { 31 } else { 0 })),
    );
    // Varied f32 lanes: integers scaled by two of `f`'s values.
    let fv = u.mulf(u.f2x8(f[0], f[7]), u.cvt(y));
    let fl = |v: U::F| {
        u.to_f32s(v)
            .iter()
            .flat_map(|x| x.to_bits().to_le_bytes())
            .collect::<Vec<u8>>()
    };
    let by = |v: U::I| u.to_bytes(v).to_vec();
    let wa = u64::from_le_bytes(a[..8].try_into().expect("8 bytes"));
    let wb = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
    // SAFETY: every load reads within `a` or `b` (64 bytes each) or `f` (16 f32).
    let loads = unsafe {
        [
            ("load", by(u.load(a.as_ptr()))),
            ("load_dup32", by(u.load_dup32(a.as_ptr().add(7)))),
            (
                "load_2x32",
                by(u.load_2x32(a.as_ptr().add(3), b.as_ptr().add(32))),
            ),
            (
                "load_dup16x2",
                by(u.load_dup16x2(a.as_ptr().add(5), b.as_ptr().add(48))),
            ),
            ("load_low32", by(u.load_low32(b.as_ptr().add(1)))),
            ("load16", by(u.load16(a.as_ptr().add(9)))),
            (
                "load_2x16",
                by(u.load_2x16(a.as_ptr().add(5), b.as_ptr().add(40))),
            ),
            ("load_f2x8", fl(u.load_f2x8(f.as_ptr().add(3)))),
            ("loadf", fl(u.loadf(f.as_ptr()))),
        ]
    };
    let mut stored = [0.0f32; 17];
    // SAFETY: 16 writable f32 from `stored[1]`.
    unsafe { u.storef(stored.as_mut_ptr().add(1), fv) };
    let mut ops = loads.to_vec();
    ops.push((
        "storef",
        stored
            .iter()
            .flat_map(|x| x.to_bits().to_le_bytes())
            .collect(),
    ));
    ops.extend([
        ("splat8", by(u.splat8(a[0]))),
        ("splat32", by(u.splat32(wa as u32 ^ (wb as u32)))),
        ("bytes_where", by(u.bytes_where(wa))),
        ("and", by(u.and(x, y))),
        ("or", by(u.or(x, y))),
        ("and_or", by(u.and_or(x, y, u.bytes(*b)))),
        ("srlv16", by(u.srlv16(x, counts))),
        ("slli16", by(u.slli16::<4>(x))),
        ("srli16_halves", by(u.srli16_halves::<3, 17>(x))),
        ("slli16_halves", by(u.slli16_halves::<16, 5>(x))),
        ("srli16", by(u.srli16::<4>(x))),
        ("slli32", by(u.slli32::<5>(x))),
        ("sub32", by(u.sub32(x, y))),
        ("sub8", by(u.sub8(x, y))),
        ("abs8", by(u.abs8(x))),
        (
            "negative8",
            u.mask_bits(u.negative8(x)).to_le_bytes().to_vec(),
        ),
        ("neg8_where", by(u.neg8_where(x, u.negative8(y)))),
        ("shufb", by(u.shufb(x, y))),
        ("permw", by(u.permw(y, x))),
        ("zext8to16", by(u.zext8to16(x))),
        ("sext8to16", by(u.sext8to16(x))),
        ("zext8to32", by(u.zext8to32(x))),
        ("sext8to32", by(u.sext8to32(x))),
        ("maddubs", by(u.maddubs(x, y))),
        ("madd16", by(u.madd16(x, y))),
        ("dpwssd", by(u.dpwssd(y, x, y))),
        ("packs32", by(u.packs32(x, y))),
        ("dpbusd", by(u.dpbusd(y, x, y))),
        (
            "f16",
            u.f16(u16::from_le_bytes([a[6], b[9]]))
                .to_bits()
                .to_le_bytes()
                .to_vec(),
        ),
        ("cvt", fl(u.cvt(x))),
        ("cvtph", fl(u.cvtph(x))),
        ("lane", fl(u.lane::<11>(fv))),
        ("lanes2", fl(u.lanes2::<3, 12>(fv))),
        ("splatf", fl(u.splatf(f[1]))),
        ("f2x8", fl(u.f2x8(f[2], f[5]))),
        ("addf", fl(u.addf(fv, u.cvt(x)))),
        ("mulf", fl(u.mulf(fv, u.cvt(x)))),
        ("fmadd", fl(u.fmadd(fv, u.cvt(x), u.cvt(y)))),
        ("hsum", u.hsum(u.cvt(x)).to_bits().to_le_bytes().to_vec()),
        (
            "hsum_f",
            u.hsum(u.fmadd(fv, u.cvt(x), fv))
                .to_bits()
                .to_le_bytes()
                .to_vec(),
        ),
    ]);
    ops
}

/// 500 trials of every operation on random and extreme inputs: `cpu` (through `on_cpu`, which
/// enables its features) against the software unit.
fn ops_agree<U: Vnni>(
    unit: &str,
    cpu: U,
    on_cpu: impl Fn(U, &[u8; 64], &[u8; 64], &[f32; 16]) -> Vec<(&'static str, Vec<u8>)>,
) {
    let mut seed = 11;
    for trial in 0..500 {
        let mut a: [u8; 64] = std::array::from_fn(|_| next(&mut seed) as u8);
        let b: [u8; 64] = std::array::from_fn(|_| next(&mut seed) as u8);
        if trial % 5 == 0 {
            // Extremes: saturating pair sums, -128, all bits.
            for (i, v) in a.iter_mut().enumerate() {
                *v = [0xff, 0x80, 0x7f, 0x00][i % 4];
            }
        }
        let f: [f32; 16] = std::array::from_fn(|_| (next(&mut seed) % 20001) as f32 / 97.0 - 103.0);
        // SAFETY: `all_ops` on the software unit needs nothing of the CPU.
        let soft = unsafe { all_ops(Soft, &a, &b, &f) };
        let hard = on_cpu(cpu, &a, &b, &f);
        for ((name, s), (_, h)) in soft.iter().zip(&hard) {
            assert_eq!(
                s, h,
                "{name}: software unit and {unit} differ (trial {trial})"
            );
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_software_unit_computes_what_the_cpu_does() {
    let Some(cpu) = crate::vnni_unit::Avx512Vnni::detect() else {
        eprintln!("NOT CHECKED: this CPU has no AVX-512 VNNI; the software unit is unchecked");
        return;
    };
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    fn on_cpu(
        cpu: crate::vnni_unit::Avx512Vnni,
        a: &[u8; 64],
        b: &[u8; 64],
        f: &[f32; 16],
    ) -> Vec<(&'static str, Vec<u8>)> {
        // SAFETY: the unit exists, so the CPU has these features, enabled here.
        unsafe { all_ops(cpu, a, b, f) }
    }
    // SAFETY: called only with a detected unit (the CPU has the features).
    ops_agree("AVX-512", cpu, |u, a, b, f| unsafe { on_cpu(u, a, b, f) });
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_avx_vnni_unit_computes_what_the_software_unit_does() {
    let Some(cpu) = crate::vnni_unit::AvxVnni::detect() else {
        eprintln!("NOT CHECKED: this CPU has no AVX-VNNI; its unit is unchecked");
        return;
    };
    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    fn on_cpu(
        cpu: crate::vnni_unit::AvxVnni,
        a: &[u8; 64],
        b: &[u8; 64],
        f: &[f32; 16],
    ) -> Vec<(&'static str, Vec<u8>)> {
        // SAFETY: the unit exists, so the CPU has these features, enabled here.
        unsafe { all_ops(cpu, a, b, f) }
    }
    // SAFETY: called only with a detected unit (the CPU has the features).
    ops_agree("AVX-VNNI", cpu, |u, a, b, f| unsafe { on_cpu(u, a, b, f) });
}

/// `n` rows of `k` values of `ty`: random blocks, or every byte but the f16 scales at the
/// extremes (`fill`), where sub-scales, mins and values are largest or most negative.
fn weights(ty: GgmlType, n: usize, k: usize, fill: Option<u8>, seed: &mut u64) -> GgmlMatrix {
    let mut bytes = random_blocks(ty, n * k / ty.block_size(), seed);
    if let Some(v) = fill {
        let scales: &[usize] = match ty {
            GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
            GgmlType::Q2_K => &[80, 82],
            GgmlType::Q4_1 | GgmlType::Q5_1 => &[0, 2],
            GgmlType::Q3_K => &[108],
            GgmlType::Q6_K => &[208],
            _ => &[0],
        };
        for block in bytes.chunks_exact_mut(ty.block_bytes()) {
            for (i, b) in block.iter_mut().enumerate() {
                if !scales.iter().any(|&s| i == s || i == s + 1) {
                    *b = v;
                }
            }
        }
    }
    GgmlMatrix::from_vec(ty, n, k, bytes).expect("valid matrix")
}

/// `dot` against the general integer path (the portable matmul) on `m` tokens.
fn check_against_unpacked(w: &GgmlMatrix, x: &[f32], m: usize, dot: RowDot, label: &str) {
    let (n, k, ty) = (w.n(), w.k(), w.ty());
    let mut want = vec![0.0f32; m * n];
    w.matmul_with(Isa::Portable, x, m, &mut want)
        .expect("shapes");
    let a = Q8Rows::quantize(k, activation_block(ty), dot.layout, m, |r| {
        &x[r * k..(r + 1) * k]
    });
    let mut got = vec![f32::NAN; m * n];
    (dot.dot)(w.bytes(), n, &a, 0..m, &mut got);
    let tols = dot_tolerances(w, x, m, &want);
    for (i, (g, wv)) in got.iter().zip(&want).enumerate() {
        let tol = tols[i];
        assert!(
            (g - wv).abs() <= tol,
            "{ty} {label} m {m} k {k} at {i}: {g} vs {wv}"
        );
    }
}

/// Activations of `m` tokens: varied, or at +-127 after quantization (`extreme`).
fn activations(m: usize, k: usize, extreme: bool) -> Vec<f32> {
    (0..m * k)
        .map(|i| {
            if extreme {
                if (i * 7 + m).is_multiple_of(3) {
                    -1.0
                } else {
                    1.0
                }
            } else {
                ((i * 7919 + m) % 2001) as f32 / 1000.0 - 1.0
            }
        })
        .collect()
}

#[test]
fn kernels_on_the_software_unit_match_the_unpacked_path() {
    let mut seed = 5;
    for ty in TYPES {
        let soft = vnni_kernel!(ty, on_soft).expect("a VNNI kernel");
        // 224 values: seven groups of 32, so the last group runs alone.
        let ks: &[usize] = if ty.block_size() == 32 {
            &[224, 512]
        } else {
            &[512]
        };
        for &k in ks {
            for fill in [None, Some(0xff), Some(0x80), Some(0x00)] {
                let w = weights(ty, 3, k, fill, &mut seed);
                for m in 1..=6 {
                    let extreme = fill.is_some();
                    check_against_unpacked(&w, &activations(m, k, extreme), m, soft, "soft");
                }
            }
        }
    }
}

/// Every VNNI kernel on a CPU unit (`cpu` picks its kernel for a type) against the general
/// integer path and bit for bit against the software unit.
fn kernels_agree(unit: &str, cpu: impl Fn(GgmlType) -> Option<RowDot>) {
    let mut seed = 9;
    for ty in TYPES {
        let soft = vnni_kernel!(ty, on_soft).expect("a VNNI kernel");
        let cpu = cpu(ty).expect("a VNNI kernel");
        let k = if ty.block_size() == 32 { 224 } else { 768 };
        for fill in [None, Some(0xff), Some(0x80)] {
            let (n, m) = (5, 7);
            let w = weights(ty, n, k, fill, &mut seed);
            let x = activations(m, k, fill.is_some());
            check_against_unpacked(&w, &x, m, cpu, unit);
            assert_eq!(cpu.layout, soft.layout, "{ty}");
            let a = Q8Rows::quantize(k, activation_block(ty), soft.layout, m, |r| {
                &x[r * k..(r + 1) * k]
            });
            let (mut on_cpu, mut on_soft) = (vec![0.0f32; m * n], vec![0.0f32; m * n]);
            (cpu.dot)(w.bytes(), n, &a, 0..m, &mut on_cpu);
            (soft.dot)(w.bytes(), n, &a, 0..m, &mut on_soft);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&on_cpu),
                bits(&on_soft),
                "{ty}: {unit} and software unit differ"
            );
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn kernels_on_the_cpu_equal_the_software_unit_bit_for_bit() {
    if crate::vnni_unit::Avx512Vnni::detect().is_none() {
        eprintln!("NOT CHECKED: this CPU has no AVX-512 VNNI, so the VNNI kernels cannot run");
        return;
    }
    kernels_agree("AVX-512", |ty| vnni_kernel!(ty, on_cpu));
}

#[cfg(target_arch = "x86_64")]
#[test]
fn kernels_on_avx_vnni_equal_the_software_unit_bit_for_bit() {
    if crate::vnni_unit::AvxVnni::detect().is_none() {
        eprintln!("NOT CHECKED: this CPU has no AVX-VNNI, so its VNNI kernels cannot run");
        return;
    }
    kernels_agree("AVX-VNNI", |ty| vnni_kernel!(ty, on_avx_vnni));
}

/// One thread's Q4_K and Q6_K decode rates (one token) from L2 and from DRAM, in tasks of
/// 128 rows as `GgmlMatrix::matmul` splits them: `cargo test --release -p strata-kernels
/// --lib -- --ignored q4_k_row_dot_timing --nocapture`.
#[test]
#[ignore = "timing, run by hand"]
fn q4_k_row_dot_timing() {
    let mut out = vec![0.0f32; 128];
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
        let Some(RowDot { dot, layout }) = super::super::kernel(Isa::selected(), ty) else {
            eprintln!("NOT MEASURED: no in-register {ty} kernel on this CPU");
            return;
        };
        let (n, k, task) = (768usize, 2048usize, 128usize);
        let mut seed = 3;
        let mats: Vec<Vec<u8>> = (0..96)
            .map(|_| random_blocks(ty, n * k / 256, &mut seed))
            .collect();
        let rb = mats[0].len() / n;
        let x: Vec<f32> = (0..k)
            .map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0)
            .collect();
        let a = Q8Rows::quantize(k, activation_block(ty), layout, 1, |_| &x[..]);
        for (name, count) in [("L2 (one matrix)", 1usize), ("DRAM (96 matrices)", 96)] {
            for _ in 0..3 {
                let reps = 400;
                let t = std::time::Instant::now();
                for r in 0..reps {
                    for rows in mats[r % count].chunks(task * rb) {
                        dot(rows, task, &a, 0..1, &mut out);
                    }
                }
                let s = t.elapsed().as_secs_f64();
                let gb = (reps * mats[0].len()) as f64 / s / 1e9;
                println!("{ty} {name}: {gb:.1} GB/s");
            }
        }
    }
    assert!(out.iter().all(|v| v.is_finite()));
}
