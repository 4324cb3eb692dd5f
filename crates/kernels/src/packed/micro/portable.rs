//! Portable micro-kernel: plain Rust over the packed layout, correct on any CPU.
//!
//! It follows the same loop structure as the SIMD paths (16 columns of a strip at a time, i32
//! accumulation and per-group flush for integers) so its results differ from theirs only by
//! f32 summation order.

use std::ops::Range;

use super::{correction, flush_span};
use crate::packed::{Activations, Kind, LINE, PackedMatrix, STRIP, bf16_bits_to_f32};

fn bf(b: &[u8]) -> f32 {
    bf16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]))
}

pub(super) fn block(
    w: &PackedMatrix,
    a: &Activations,
    rows: Range<usize>,
    strips: Range<usize>,
    ks: Range<usize>,
    out: &mut [f32],
    ldo: usize,
) {
    let data = w.data.as_slice();
    let act = a.data.as_slice();
    for (i, r) in rows.enumerate() {
        let x = &act[r * a.lda..(r + 1) * a.lda];
        for (si, s) in strips.clone().enumerate() {
            let strip = &data[s * w.strip_bytes..(s + 1) * w.strip_bytes];
            let o = &mut out[i * ldo + si * STRIP..i * ldo + (si + 1) * STRIP];
            if w.kind == Kind::Bf16 {
                let mut acc = [0.0f32; STRIP];
                for p in ks.start / 2..ks.end / 2 {
                    let (x0, x1) = (bf(&x[4 * p..]), bf(&x[4 * p + 2..]));
                    let line = &strip[p * LINE..(p + 1) * LINE];
                    for (c, acc) in acc.iter_mut().enumerate() {
                        *acc += bf(&line[4 * c..]) * x0 + bf(&line[4 * c + 2..]) * x1;
                    }
                }
                o.iter_mut().zip(acc).for_each(|(o, v)| *o += v);
                continue;
            }
            let fs = flush_span(w, &ks);
            for f0 in ks.clone().step_by(fs) {
                let mut acc = [0i32; STRIP];
                for quad in f0 / 4..(f0 + fs) / 4 {
                    let xq = &x[4 * quad..4 * quad + 4];
                    let line = match w.kind {
                        Kind::Int8 => &strip[quad * LINE..(quad + 1) * LINE],
                        _ => &strip[(quad / 2) * LINE..(quad / 2 + 1) * LINE],
                    };
                    let shift = if w.kind == Kind::Int4 {
                        4 * (quad % 2)
                    } else {
                        0
                    };
                    let mask = if w.kind == Kind::Int4 { 0xf } else { 0xff };
                    for (c, acc) in acc.iter_mut().enumerate() {
                        for t in 0..4 {
                            let wq = i32::from((line[4 * c + t] >> shift) & mask);
                            *acc += wq * i32::from(xq[t] as i8);
                        }
                    }
                }
                let corr = correction(w, a, r, f0, fs);
                let g = f0 / w.group;
                let sc = &w.scales[(s * w.groups + g) * STRIP..(s * w.groups + g + 1) * STRIP];
                for c in 0..STRIP {
                    o[c] += (acc[c] - corr) as f32 * sc[c] * a.scale_at(r, f0);
                }
            }
        }
    }
}
