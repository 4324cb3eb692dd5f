//! The packed formats against their plain reference on random shapes; shared helpers for
//! the micro-kernel and MoE tests.

use super::*;

pub(crate) fn rand_vec(len: usize, seed: &mut u64) -> Vec<f32> {
    (0..len)
        .map(|_| {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

pub(crate) const FORMATS: [PackedFormat; 7] = [
    PackedFormat::Bf16,
    PackedFormat::Int8 { group: None },
    PackedFormat::Int8 { group: Some(32) },
    PackedFormat::Int8 { group: Some(128) },
    PackedFormat::Int4 { group: 32 },
    PackedFormat::Int4 { group: 64 },
    PackedFormat::Int4 { group: 128 },
];

/// Every kernel the sweeps run: the CPU's instruction-set paths, the AMX tile program on
/// the software tile unit and the AVX-512 integer tiles on the software VNNI unit.
pub(crate) fn kernels() -> Vec<Kernel> {
    if !Isa::available().contains(&Isa::Avx2) {
        eprintln!("NOT CHECKED: this CPU has no AVX2, so the packed AVX2 kernels cannot run");
    }
    let mut v: Vec<Kernel> = Isa::available().into_iter().map(Kernel::Isa).collect();
    v.push(Kernel::AmxSoft);
    #[cfg(target_arch = "x86_64")]
    v.push(Kernel::VnniSoft);
    if Isa::Avx512.is_available() {
        v.push(Kernel::Avx512Fma);
    }
    if Kernel::Avx512Dpbf16.is_available() {
        v.push(Kernel::Avx512Dpbf16);
    }
    v
}

/// The AVX-512 INT8/INT4 register tiles on the software VNNI unit against the reference
/// (as every kernel in the sweeps) and bit for bit against the CPU's VNNI units where it has
/// them (AVX-512, AVX-VNNI): ragged shapes, every integer format, `k` over several panels, activations and
/// weights at their extremes. (The portable kernel scales each flush into the output
/// directly, so it differs in the last bits.)
#[cfg(target_arch = "x86_64")]
#[test]
fn vnni_integer_tiles_on_the_software_unit_equal_the_cpu_bit_for_bit() {
    let mut seed = 31;
    let cpus: Vec<Isa> = [Isa::Avx512, Isa::AvxVnni]
        .into_iter()
        .filter(|i| i.is_available())
        .collect();
    if cpus.len() < 2 {
        eprintln!("NOT CHECKED: this CPU runs only {cpus:?} of AVX-512 VNNI and AVX-VNNI");
    }
    let shapes = [
        (1, 16, 64),
        (3, 17, 129),
        (5, 48, 64),
        (37, 70, 200),
        (4, 64, 2048),
    ];
    for fmt in FORMATS.into_iter().filter(|f| *f != PackedFormat::Bf16) {
        for (i, &(m, n, k)) in shapes.iter().enumerate() {
            let mut x = rand_vec(m * k, &mut seed);
            let mut w = rand_vec(n * k, &mut seed);
            if i % 2 == 1 {
                // Extremes: every weight at its group's largest magnitude, activations at
                // +-127 after quantization.
                w.iter_mut().for_each(|v| *v = v.signum());
                x.iter_mut()
                    .for_each(|v| *v = if *v < 0.0 { -1.0 } else { 1.0 });
            }
            let p = PackedMatrix::pack(&w, n, k, fmt).expect("valid format");
            let what = format!("{} {m}x{n}x{k}", fmt.name());
            let run = |kernel| {
                let mut out = vec![f32::NAN; m * n];
                p.matmul_on(kernel, &x, m, &mut out);
                out
            };
            let soft = run(Kernel::VnniSoft);
            let mut want = vec![0.0; m * n];
            p.matmul_ref(&x, m, &mut want).expect("shapes agree");
            assert_close(&want, &soft, &format!("{what} VnniSoft"));
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for &isa in &cpus {
                assert_eq!(
                    bits(&soft),
                    bits(&run(Kernel::Isa(isa))),
                    "{what}: software VNNI unit and the CPU's {isa:?} differ"
                );
            }
        }
    }
}

/// Asserts `got` matches `want` within f32 rounding of a `k`-term dot product.
pub(crate) fn assert_close(want: &[f32], got: &[f32], what: &str) {
    assert_eq!(want.len(), got.len(), "{what}: lengths");
    let scale = want.iter().fold(1.0f32, |a, v| a.max(v.abs()));
    for (i, (a, b)) in want.iter().zip(got).enumerate() {
        assert!(
            (a - b).abs() <= 2e-5 * scale + 1e-6 * a.abs().max(b.abs()) * 10.0,
            "{what}: element {i}: want {a}, got {b}"
        );
    }
}

#[test]
fn every_path_matches_reference_on_ragged_shapes() {
    let mut seed = 11;
    let shapes = [
        (0, 5, 7),
        (1, 1, 1),
        (1, 33, 70),
        (3, 17, 129),
        (5, 48, 64),
        (37, 70, 200),
        (70, 40, 96),
    ];
    for fmt in FORMATS {
        for &(m, n, k) in &shapes {
            let x = rand_vec(m * k, &mut seed);
            let w = rand_vec(n * k, &mut seed);
            let p = PackedMatrix::pack(&w, n, k, fmt).expect("valid format");
            let mut want = vec![0.0; m * n];
            p.matmul_ref(&x, m, &mut want).expect("shapes agree");
            for kernel in kernels() {
                let mut got = vec![f32::NAN; m * n];
                p.matmul_on(kernel, &x, m, &mut got);
                let what = format!("{} {kernel:?} {m}x{n}x{k}", fmt.name());
                assert_close(&want, &got, &what);
            }
        }
    }
}

#[test]
fn bf16_source_packs_like_f32() {
    let mut seed = 3;
    let w = rand_vec(40 * 50, &mut seed);
    let wb: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
    let a = PackedMatrix::pack(&w, 40, 50, PackedFormat::Bf16).expect("packs");
    let b = PackedMatrix::pack(&wb, 40, 50, PackedFormat::Bf16).expect("packs");
    assert_eq!(a.data.as_slice(), b.data.as_slice());
}

/// Bytes in an aligned buffer at a 64-byte offset, as a file map would hold them.
struct Stored(AlignedBuf);

// SAFETY: the buffer is never modified nor moved while shared.
unsafe impl StableBytes for Stored {
    fn stable_bytes(&self) -> &[u8] {
        self.0.as_slice()
    }
}

#[test]
fn stored_bytes_compute_like_the_packed_matrix() {
    let mut seed = 9;
    let (m, n, k) = (3, 37, 70);
    let x = rand_vec(m * k, &mut seed);
    let w = rand_vec(n * k, &mut seed);
    for fmt in FORMATS {
        let p = PackedMatrix::pack(&w, n, k, fmt).expect("packs");
        let (d, sc) = (p.data_bytes(), p.scale_bytes());
        let s0 = (64 + d.len()).next_multiple_of(64);
        let mut buf = AlignedBuf::zeroed(s0 + sc.len());
        buf.as_mut_slice()[64..64 + d.len()].copy_from_slice(d);
        buf.as_mut_slice()[s0..].copy_from_slice(&sc);
        let owner: Arc<dyn StableBytes> = Arc::new(Stored(buf));
        let data = 64..64 + d.len();
        let scales = s0..s0 + sc.len();
        let q = PackedMatrix::from_stored(owner.clone(), fmt, n, k, data.clone(), scales.clone())
            .expect("valid stored matrix");
        assert!(q.is_mapped() && !p.is_mapped());
        assert_eq!(q.dequantize(), p.dequantize(), "{}", fmt.name());
        let (mut a, mut b) = (vec![0.0; m * n], vec![1.0; m * n]);
        p.matmul(&x, m, &mut a).expect("shapes agree");
        q.matmul(&x, m, &mut b).expect("shapes agree");
        assert_eq!(a, b, "{}", fmt.name());
        // Misaligned, short and out-of-bounds ranges are refused.
        let bad = [
            (1..1 + d.len(), scales.clone()),
            (64..63 + d.len(), scales.clone()),
            (data.clone(), s0..s0 + sc.len() + 4),
        ];
        for (dr, sr) in bad {
            assert!(PackedMatrix::from_stored(owner.clone(), fmt, n, k, dr, sr).is_err());
        }
    }
}

#[test]
fn quantization_error_is_within_the_step() {
    let mut seed = 5;
    let (n, k) = (20, 300);
    let w = rand_vec(n * k, &mut seed);
    for fmt in FORMATS {
        let p = PackedMatrix::pack(&w, n, k, fmt).expect("packs");
        let d = p.dequantize();
        // |w| <= 0.5: BF16 keeps 8 bits, INT8 half a step of 0.5/127, INT4 of 0.5/7.
        let tol = match p.kind {
            Kind::Bf16 => 0.5 / 256.0,
            Kind::Int8 => 0.5 / 127.0 / 2.0 + 1e-6,
            Kind::Int4 => 0.5 / 7.0 / 2.0 + 1e-6,
        };
        for (a, b) in w.iter().zip(&d) {
            assert!((a - b).abs() <= tol, "{}: {a} vs {b}", fmt.name());
        }
    }
}

#[test]
fn bad_arguments_are_errors() {
    let w = vec![0.0f32; 6];
    assert_eq!(
        PackedMatrix::pack(&w, 2, 3, PackedFormat::Int4 { group: 48 }).unwrap_err(),
        KernelError::Group {
            op: "pack",
            got: 48
        }
    );
    assert!(PackedMatrix::pack(&w, 2, 4, PackedFormat::Bf16).is_err());
    let p = PackedMatrix::pack(&w, 2, 3, PackedFormat::Bf16).expect("packs");
    let mut out = vec![0.0; 3];
    assert!(p.matmul(&[0.0; 3], 1, &mut out).is_err());
}

/// A matrix over hand-made packed bytes (every byte `byte(i)`) with all scales 1.
fn stored_matrix(
    fmt: PackedFormat,
    n: usize,
    k: usize,
    byte: impl Fn(usize) -> u8,
) -> PackedMatrix {
    let l = PackedLayout::new(fmt, n, k).expect("valid format");
    let s0 = l.data_bytes.next_multiple_of(64);
    let mut buf = AlignedBuf::zeroed(s0 + 4 * l.scales);
    let bytes = buf.as_mut_slice();
    (0..l.data_bytes).for_each(|i| bytes[i] = byte(i));
    for v in bytes[s0..].chunks_mut(4) {
        v.copy_from_slice(&1.0f32.to_le_bytes());
    }
    let data = 0..l.data_bytes;
    let scales = s0..s0 + 4 * l.scales;
    PackedMatrix::from_stored(Arc::new(Stored(buf)), fmt, n, k, data, scales).expect("stored")
}

/// Integer paths at the extremes of their operands: every weight at the bottom (`q = -128`,
/// `-8`) or top (`127`, `7`) of its range or random, against activations of `±127` (the
/// extremes `quantize_i8` produces: it never gives `-128`). With unit scales and integer
/// activations of amplitude 127 (activation scale exactly 1), every sum is an integer below
/// 2^24, so every kernel must match the i64 reference exactly: a saturated i16 pair (AVX2
/// `vpmaddubsw`) or a wrong offset shows as a difference.
#[test]
fn integer_paths_sum_extreme_values_exactly() {
    let (n, k) = (64, 256);
    let mut seed = 21;
    let noise = rand_vec(n * k, &mut seed);
    let fill: [(&str, &dyn Fn(usize) -> u8); 4] = [
        ("bottom", &|_| 0x00),
        ("top", &|_| 0xff),
        ("alternating", &|i| if i % 3 == 0 { 0x00 } else { 0xff }),
        ("random", &|i| (noise[i % noise.len()] * 511.0) as i32 as u8),
    ];
    let acts: [(&str, &dyn Fn(usize) -> f32); 4] = [
        ("+127", &|_| 127.0),
        ("-127", &|_| -127.0),
        ("+-127", &|p| if p % 5 < 2 { 127.0 } else { -127.0 }),
        ("mixed", &|p| {
            if p == 0 {
                -127.0
            } else {
                (p * 37 % 255) as f32 - 127.0
            }
        }),
    ];
    let fmts = [
        PackedFormat::Int8 { group: None },
        PackedFormat::Int8 { group: Some(32) },
        PackedFormat::Int4 { group: 32 },
        PackedFormat::Int4 { group: 128 },
    ];
    for fmt in fmts {
        for (wname, byte) in &fill {
            let p = stored_matrix(fmt, n, k, byte);
            let wq = p.dequantize();
            for (xname, act) in &acts {
                for m in [1, 3] {
                    let x: Vec<f32> = (0..m * k).map(|i| act(i % k + i / k)).collect();
                    let want: Vec<f32> = (0..m * n)
                        .map(|o| {
                            let (i, j) = (o / n, o % n);
                            let dot: i64 = (0..k)
                                .map(|q| wq[j * k + q] as i64 * x[i * k + q] as i64)
                                .sum();
                            dot as f32
                        })
                        .collect();
                    for kernel in kernels() {
                        let mut got = vec![f32::NAN; m * n];
                        p.matmul_on(kernel, &x, m, &mut got);
                        let what =
                            format!("{} {kernel:?} weights {wname} x {xname} m {m}", fmt.name());
                        assert_eq!(want, got, "{what}");
                    }
                }
            }
        }
    }
}

#[test]
fn gathered_rows_equal_rows_converted_where_they_stand() {
    // Tokens converted once in chunks, then gathered for an expert's rows (some twice, out
    // of order), are what converting the expert's rows directly gives: int8 with sums per 32
    // and per 16, BF16, and padding for the tile programs.
    let (k, tokens) = (128, 10);
    let x = rand_vec(tokens * k, &mut 23);
    let convert = |sums: Option<usize>, rows: &[usize], kernel: Kernel| {
        let row = |r: usize| &x[rows[r] * k..(rows[r] + 1) * k];
        match sums {
            Some(unit) => Activations::int8_grouped(k, rows.len(), kernel, unit, 32, row),
            None => Activations::bf16(k, rows.len(), kernel, row),
        }
    };
    let picks = [7usize, 0, 3, 3, 9, 2];
    for sums in [Some(32), Some(16), None] {
        let chunks: Vec<Activations> = [vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]
            .iter()
            .map(|rows| convert(sums, rows, Kernel::Isa(Isa::Portable)))
            .collect();
        for kernel in [Kernel::Isa(Isa::Portable), Kernel::AmxSoft] {
            let want = convert(sums, &picks, kernel);
            let got = Activations::gather(&chunks, picks.len(), kernel, |r| {
                (picks[r] / 4, picks[r] % 4)
            });
            let what = format!("sums {sums:?} {kernel:?}");
            assert_eq!(got.data.as_slice(), want.data.as_slice(), "{what}");
            assert_eq!((got.m_pad, got.lda), (want.m_pad, want.lda), "{what}");
            assert_eq!(got.scale, want.scale, "{what}");
            assert_eq!(got.xsum, want.xsum, "{what}");
            assert_eq!(got.scaled_sum, want.scaled_sum, "{what}");
        }
    }
}
