//! Dequantization: known answers from gguf-py's numpy dequantizers (tests/data/ggml, made by
//! make_kat.py there) and round trips through simple quantizers written here.

use half::{bf16, f16};
use strata_kernels::ggml::{GgmlType, QuantError, dequantize_row, dequantize_row_bf16};

const KAT_TYPES: [GgmlType; 26] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
    GgmlType::MXFP4,
];

/// The i-quant, ternary and MXFP4 types (the grid-based decoders in `ggml/iq.rs`).
const IQ_TYPES: [GgmlType; 10] = [
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
    GgmlType::MXFP4,
];

fn kat(ty: GgmlType) -> (Vec<u8>, Vec<f32>) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/ggml/");
    let blocks = std::fs::read(format!("{dir}{ty}.bin")).unwrap();
    let want = std::fs::read(format!("{dir}{ty}.f32"))
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (blocks, want)
}

#[test]
fn known_answers_match_gguf_py_bit_for_bit() {
    for ty in KAT_TYPES {
        assert!(ty.can_dequantize(), "{ty}");
        let (blocks, want) = kat(ty);
        assert_eq!(
            blocks.len() / ty.block_bytes() * ty.block_size(),
            want.len()
        );
        let mut got = vec![f32::NAN; want.len()];
        dequantize_row(ty, &blocks, &mut got).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{ty} value {i}: got {g}, want {w}"
            );
        }
        // Block by block gives the same as all at once.
        let mut one = vec![0f32; ty.block_size()];
        let last = blocks.len() / ty.block_bytes() - 1;
        dequantize_row(ty, &blocks[last * ty.block_bytes()..], &mut one).unwrap();
        assert_eq!(one, want[last * ty.block_size()..]);
        // The bf16 variant rounds the same values.
        let mut b = vec![bf16::ZERO; want.len()];
        dequantize_row_bf16(ty, &blocks, &mut b).unwrap();
        for (x, w) in b.iter().zip(&want) {
            assert_eq!(x.to_bits(), bf16::from_f32(*w).to_bits(), "{ty}");
        }
    }
}

#[test]
fn rejects_bad_lengths_and_unsupported_types() {
    let mut out = [0f32; 32];
    assert_eq!(
        dequantize_row(GgmlType::Q8_0, &[0; 33], &mut out),
        Err(QuantError::Length {
            ty: GgmlType::Q8_0,
            n: 32,
            want: 34,
            got: 33
        })
    );
    let e = dequantize_row(GgmlType::Q4_K, &[0; 144], &mut out).unwrap_err();
    assert_eq!(
        e.to_string(),
        "32 values is not a multiple of the Q4_K block size 256"
    );
    for ty in GgmlType::ALL.into_iter().filter(|t| !t.can_dequantize()) {
        assert_eq!(
            dequantize_row(ty, &[], &mut []),
            Err(QuantError::Unsupported(ty))
        );
    }
    let mut b = [bf16::ZERO; 31];
    assert!(dequantize_row_bf16(GgmlType::Q4_0, &[0; 18], &mut b).is_err());
    // Zero values is a valid (empty) row.
    dequantize_row(GgmlType::Q6_K, &[], &mut []).unwrap();
}

#[test]
fn iq_types_reject_truncated_and_overlong_rows() {
    for ty in IQ_TYPES {
        let (bs, bb) = (ty.block_size(), ty.block_bytes());
        let mut out = vec![0f32; 2 * bs];
        for got in [0, bb, 2 * bb - 1, 2 * bb + 1] {
            assert_eq!(
                dequantize_row(ty, &vec![0; got], &mut out),
                Err(QuantError::Length {
                    ty,
                    n: 2 * bs,
                    want: 2 * bb,
                    got
                }),
                "{ty}"
            );
        }
        let mut b = vec![bf16::ZERO; 2 * bs];
        assert!(dequantize_row_bf16(ty, &vec![0; 2 * bb - 1], &mut b).is_err());
        let mut part = vec![0f32; bs + 1];
        assert_eq!(
            dequantize_row(ty, &vec![0; bb + 1], &mut part),
            Err(QuantError::PartialBlock {
                ty,
                n: bs + 1,
                block: bs
            })
        );
    }
}

#[test]
fn iq_types_decode_any_bytes_without_panicking() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for ty in IQ_TYPES {
        let (bs, bb) = (ty.block_size(), ty.block_bytes());
        for fill in [Some(0x00u8), Some(0xff), None] {
            let src: Vec<u8> = (0..5 * bb)
                .map(|_| fill.unwrap_or(rng.next() as u8))
                .collect();
            let mut out = vec![0f32; 5 * bs];
            dequantize_row(ty, &src, &mut out).unwrap();
            let mut b = vec![bf16::ZERO; 5 * bs];
            dequantize_row_bf16(ty, &src, &mut b).unwrap();
        }
    }
}

/// Deterministic xorshift values in [-amp, amp).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn f32(&mut self, amp: f32) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * amp
    }
}

fn f16_round(x: f32) -> ([u8; 2], f32) {
    let h = f16::from_f32(x);
    (h.to_le_bytes(), h.to_f32())
}

fn amax(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |m, v| m.max(v.abs()))
}

/// Symmetric `bits`-bit block of 32: `{ f16 d; [qh]; nibbles }` with values `q - 2^(bits-1)`.
fn quant_sym(x: &[f32], bits: u32) -> (Vec<u8>, f32) {
    let half = 1i32 << (bits - 1);
    let (db, d) = f16_round(amax(x) / (half - 1) as f32);
    let q: Vec<u8> = x
        .iter()
        .map(|&v| {
            let q = if d == 0.0 { 0 } else { (v / d).round() as i32 };
            (q + half).clamp(0, 2 * half - 1) as u8
        })
        .collect();
    let mut out = db.to_vec();
    match bits {
        8 => out.extend(q.iter().map(|&v| (v as i32 - 128) as i8 as u8)),
        4 => out.extend((0..16).map(|j| q[j] | (q[j + 16] << 4))),
        5 => {
            let qh = (0..32).fold(0u32, |h, j| h | (((q[j] >> 4) as u32) << j));
            out.extend(qh.to_le_bytes());
            out.extend((0..16).map(|j| (q[j] & 15) | ((q[j + 16] & 15) << 4)));
        }
        _ => unreachable!(),
    }
    (out, d)
}

/// Asymmetric `bits`-bit block of 32: `{ f16 d; f16 m; [qh]; nibbles }`, values `q * d + m`.
fn quant_asym(x: &[f32], bits: u32) -> (Vec<u8>, f32) {
    let lo = x.iter().copied().fold(f32::INFINITY, f32::min);
    let hi = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let top = (1 << bits) - 1;
    let (db, d) = f16_round((hi - lo) / top as f32);
    let (mb, m) = f16_round(lo);
    let q: Vec<u8> = x
        .iter()
        .map(|&v| {
            let q = if d == 0.0 {
                0
            } else {
                ((v - m) / d).round() as i32
            };
            q.clamp(0, top) as u8
        })
        .collect();
    let mut out = db.to_vec();
    out.extend(mb);
    if bits == 5 {
        let qh = (0..32).fold(0u32, |h, j| h | (((q[j] >> 4) as u32) << j));
        out.extend(qh.to_le_bytes());
    }
    out.extend((0..16).map(|j| (q[j] & 15) | ((q[j + 16] & 15) << 4)));
    (out, d)
}

const IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

fn quant_iq4_nl(x: &[f32]) -> (Vec<u8>, f32) {
    let (db, d) = f16_round(amax(x) / 127.0);
    let q: Vec<u8> = x
        .iter()
        .map(|&v| {
            (0..16)
                .min_by(|&a, &b| {
                    let ea = (IQ4NL[a] as f32 * d - v).abs();
                    let eb = (IQ4NL[b] as f32 * d - v).abs();
                    ea.total_cmp(&eb)
                })
                .unwrap() as u8
        })
        .collect();
    let mut out = db.to_vec();
    out.extend((0..16).map(|j| q[j] | (q[j + 16] << 4)));
    // Grid gaps are at most 24 steps of d, and 113 d may have to stand for 127 d.
    (out, d * 30.0)
}

fn quant_q8_k(x: &[f32]) -> (Vec<u8>, f32) {
    let d = amax(x) / 127.0;
    let mut out = d.to_le_bytes().to_vec();
    let q: Vec<i8> = x
        .iter()
        .map(|&v| if d == 0.0 { 0 } else { (v / d).round() as i8 })
        .collect();
    out.extend(q.iter().map(|&v| v as u8));
    for g in q.chunks(16) {
        out.extend(g.iter().map(|&v| v as i16).sum::<i16>().to_le_bytes());
    }
    (out, d)
}

/// Quantizes random rows of 0, 1, 3 and 7 blocks and checks every value comes back within half
/// a quantization step (`step` is what the quantizer reports per block).
fn round_trip(ty: GgmlType, quant: fn(&[f32]) -> (Vec<u8>, f32)) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ty.id() as u64);
    let bs = ty.block_size();
    for n_blocks in [0usize, 1, 3, 7] {
        let x: Vec<f32> = (0..n_blocks * bs).map(|_| rng.f32(3.0)).collect();
        let mut bytes = Vec::new();
        let mut steps = Vec::new();
        for b in x.chunks(bs) {
            let (q, step) = quant(b);
            assert_eq!(q.len(), ty.block_bytes(), "{ty} quantizer block size");
            bytes.extend(q);
            steps.push(step);
        }
        let mut y = vec![0f32; x.len()];
        dequantize_row(ty, &bytes, &mut y).unwrap();
        for (i, (a, b)) in x.iter().zip(&y).enumerate() {
            let tol = steps[i / bs] * 0.5 * 1.001 + 1e-6;
            assert!(
                (a - b).abs() <= tol,
                "{ty} value {i}: {a} came back as {b} (tolerance {tol})"
            );
        }
    }
}

#[test]
fn round_trips_through_simple_quantizers() {
    round_trip(GgmlType::Q8_0, |x| quant_sym(x, 8));
    round_trip(GgmlType::Q4_0, |x| quant_sym(x, 4));
    round_trip(GgmlType::Q5_0, |x| quant_sym(x, 5));
    round_trip(GgmlType::Q4_1, |x| quant_asym(x, 4));
    round_trip(GgmlType::Q5_1, |x| quant_asym(x, 5));
    round_trip(GgmlType::IQ4_NL, quant_iq4_nl);
    round_trip(GgmlType::Q8_K, quant_q8_k);
    round_trip(GgmlType::F16, |x| {
        (
            f16::from_f32(x[0]).to_le_bytes().to_vec(),
            x[0].abs() / 1024.0,
        )
    });
    round_trip(GgmlType::BF16, |x| {
        (
            bf16::from_f32(x[0]).to_le_bytes().to_vec(),
            x[0].abs() / 128.0,
        )
    });
    round_trip(GgmlType::F32, |x| (x[0].to_le_bytes().to_vec(), 0.0));
}
