//! Activations converted once per matrix call for the micro-kernels: BF16 rows, or int8
//! rows with a scale per token (or per [`XSUM_UNIT`] or 256 values of a token) and per-unit
//! sums (the zero-point correction).

use super::micro::{self, Kernel};
use super::{Kind, M_ALIGN, PackedMatrix, XSUM_UNIT, bf16_bits_to_f32};
use crate::buf::{AlignedBuf, SharedMut};

/// Activations converted for one packed matrix: BF16, or int8 with a scale per token, per 32
/// or per 256 values.
pub(crate) struct Activations {
    pub(crate) k_pad: usize,
    /// Bytes per value: 2 (BF16) or 1 (int8).
    elem: usize,
    /// Bytes per row of `data`: the row's values, plus a line where rows a multiple of 1 KiB
    /// apart would put the rows of an AMX tile load into a few L1 sets.
    pub(crate) lda: usize,
    /// Rows of `data` ([`padded_rows`]).
    pub(crate) m_pad: usize,
    /// `[m_pad, k_pad]` bf16 or i8, rows beyond `m` zero.
    pub(crate) data: AlignedBuf,
    /// Dequantization scales (integer formats): `[m_pad, k_pad / scale_group]`.
    pub(crate) scale: Vec<f32>,
    /// `k` per scale: `k_pad` (one per token), [`XSUM_UNIT`] or 256. Integer kernels flush at
    /// least this often when it is smaller than a row (see [`Activations::scale_at`]).
    pub(crate) scale_group: usize,
    /// `k` per sum of `xsum`: [`XSUM_UNIT`], or 16 for the INT8 tiles of the types with a
    /// scale per 16 (Q6_K, Q3_K), whose flushes subtract the offset of half a unit.
    pub(crate) xsum_unit: usize,
    /// `[m_pad, k_pad / xsum_unit]` sums of the int8 values (integer formats).
    pub(crate) xsum: Vec<i32>,
    /// `[m_pad, k_pad / xsum_unit]` each unit's scale times its sum (int8 with a scale per
    /// [`XSUM_UNIT`], else empty): what a k-quant tile's bias per group is multiplied by,
    /// computed once here rather than again for every 64 output columns.
    pub(crate) scaled_sum: Vec<f32>,
}

/// How [`Activations::int8_grouped`] converts: sums per `xsum_unit`, scales per `scale_group`.
#[derive(Clone, Copy)]
struct Grouped {
    xsum_unit: usize,
    scale_group: usize,
}

impl Activations {
    /// Converts `m` rows (row `r` given by `row(r)`, `k` values each) for `w`'s format, padded
    /// for `kernel`.
    pub(crate) fn quantize<'x>(
        w: &PackedMatrix,
        m: usize,
        kernel: Kernel,
        row: impl Fn(usize) -> &'x [f32] + Sync,
    ) -> Self {
        Self::convert(w.kind, w.k_pad, m, kernel, None, row)
    }

    /// Converts `m` rows to BF16 for matrices of `k_pad` columns (a multiple of 32), padded
    /// for `kernel`: the activations of weights dequantized into BF16 tiles on the fly.
    pub(crate) fn bf16<'x>(
        k_pad: usize,
        m: usize,
        kernel: Kernel,
        row: impl Fn(usize) -> &'x [f32] + Sync,
    ) -> Self {
        Self::convert(Kind::Bf16, k_pad, m, kernel, None, row)
    }

    /// Converts `m` rows to int8 with a scale per `scale_group` values (32 or 256) and sums
    /// per `xsum_unit` (32 or 16) for matrices of `k_pad` columns (a multiple of 64, and of
    /// `scale_group`) with weight scales per `xsum_unit`, padded for `kernel`: the activations
    /// of weights decoded into INT8 tiles on the fly. A scale per 32 keeps an outlier channel
    /// from coarsening its neighbours; per 256 is what llama.cpp's `Q8_K` gives the k-quants,
    /// and saves the kernels a multiply per flush.
    pub(crate) fn int8_grouped<'x>(
        k_pad: usize,
        m: usize,
        kernel: Kernel,
        xsum_unit: usize,
        scale_group: usize,
        row: impl Fn(usize) -> &'x [f32] + Sync,
    ) -> Self {
        assert!(
            matches!(xsum_unit, 16 | 32) && matches!(scale_group, XSUM_UNIT | 256),
            "activation sums per {xsum_unit}, scales per {scale_group}"
        );
        assert!(
            k_pad.is_multiple_of(scale_group),
            "{k_pad} k in scales of {scale_group}"
        );
        let grouped = Grouped {
            xsum_unit,
            scale_group,
        };
        Self::convert(Kind::Int8, k_pad, m, kernel, Some(grouped), row)
    }

    /// The scale of row `r` at `k = f0`.
    #[inline(always)]
    pub(crate) fn scale_at(&self, r: usize, f0: usize) -> f32 {
        let (stride, col) = self.scale_column(f0);
        self.scale[r * stride + col]
    }

    /// Flush spans of `span` values under one activation scale (at least one): more than one
    /// lets the integer kernels multiply by the scale once for several spans.
    #[inline(always)]
    pub(crate) fn spans_per_scale(&self, span: usize) -> usize {
        (self.scale_group / span).max(1)
    }

    /// Where the scales at `k = f0` lie: row `r`'s is `scale[r * stride + col]`, as
    /// `(stride, col)` (for loops over rows: two divisions once).
    #[inline(always)]
    pub(crate) fn scale_column(&self, f0: usize) -> (usize, usize) {
        (self.k_pad / self.scale_group, f0 / self.scale_group)
    }

    /// `grouped`: scales and sums as it says, else one scale per token and sums per
    /// [`XSUM_UNIT`].
    fn convert<'x>(
        kind: Kind,
        k_pad: usize,
        m: usize,
        kernel: Kernel,
        grouped: Option<Grouped>,
        row: impl Fn(usize) -> &'x [f32] + Sync,
    ) -> Self {
        let m_pad = padded_rows(m, kernel);
        let elem = kind.activation_bytes();
        // Rows 4 KiB apart (BF16 at `k = 2048`) put an A tile's 16 rows in one L1 set: on the
        // AMX Xeon a tile load of them took 15.6 ns against 10.8 with a line more per row (4.4
        // contiguous), and the BF16 tile program ran 5-15% faster (2026-11-29).
        let lda = if (k_pad * elem).is_multiple_of(1024) {
            k_pad * elem + 64
        } else {
            k_pad * elem
        };
        let mut data = AlignedBuf::zeroed(m_pad * lda);
        let xsum_unit = grouped.map_or(XSUM_UNIT, |g| g.xsum_unit);
        let units = k_pad / xsum_unit;
        let scale_group = grouped.map_or(k_pad, |g| g.scale_group);
        let scales = k_pad / scale_group;
        let mut scale = vec![0.0f32; m_pad * scales];
        let mut xsum = vec![0i32; m_pad * units];
        let mut scaled_sum = vec![0.0f32; if grouped.is_some() { m_pad * units } else { 0 }];
        // Rows in parallel tasks: a prompt's 512 rows converted on the calling thread alone
        // left the other cores waiting (2026-12-01).
        let (bytes, scale_w, xsum_w) = (
            SharedMut::new(data.as_mut_slice()),
            SharedMut::new(&mut scale),
            SharedMut::new(&mut xsum),
        );
        let scaled_w = SharedMut::new(&mut scaled_sum);
        crate::parallel_for(m.div_ceil(ROWS_PER_TASK), |task| {
            for r in task * ROWS_PER_TASK..((task + 1) * ROWS_PER_TASK).min(m) {
                let x = row(r);
                // SAFETY: row `r` is this task's alone, and each array's part for it lies
                // within the array (`m_pad >= m` rows of `lda` bytes, `scales`, `units`).
                let (dst, sc, sums) = unsafe {
                    (
                        &mut bytes.part(r * lda, lda)[..k_pad * elem],
                        scale_w.part(r * scales, scales),
                        xsum_w.part(r * units, units),
                    )
                };
                if kind == Kind::Bf16 {
                    // SAFETY: any two bytes are a valid u16; the row starts 64-byte aligned
                    // (aligned buffer, `lda` a multiple of 64), so the whole row is the aligned
                    // middle part.
                    let (head, dst16, _) = unsafe { dst.align_to_mut::<u16>() };
                    assert!(
                        head.is_empty() && dst16.len() >= x.len(),
                        "bf16 row not aligned"
                    );
                    micro::to_bf16(x, dst16);
                } else if grouped.is_some() {
                    if scale_group == XSUM_UNIT {
                        micro::quantize_i8_groups(x, &mut dst[..x.len()], sc, sums, xsum_unit);
                    } else {
                        let runs = x.chunks(scale_group).zip(dst.chunks_mut(scale_group));
                        let sums = sums.chunks_mut(scale_group / xsum_unit);
                        for ((sc, (x, dst)), sums) in sc.iter_mut().zip(runs).zip(sums) {
                            *sc = micro::quantize_i8(x, &mut dst[..x.len()], sums, xsum_unit);
                        }
                    }
                    // Each unit's scale times its sum, for the tiles' group biases.
                    let per_scale = scale_group / xsum_unit;
                    // SAFETY: as above.
                    let scaled = unsafe { scaled_w.part(r * units, units) };
                    for (u, (o, &s)) in scaled.iter_mut().zip(sums.iter()).enumerate() {
                        *o = sc[u / per_scale] * s as f32;
                    }
                } else {
                    sc[0] = micro::quantize_i8(x, &mut dst[..x.len()], sums, xsum_unit);
                }
            }
        });
        Self {
            k_pad,
            elem,
            lda,
            m_pad,
            data,
            scale,
            scale_group,
            xsum_unit,
            xsum,
            scaled_sum,
        }
    }

    /// `m` rows copied from rows converted before, padded for `kernel`: row `r` is row `i` of
    /// `sources[c]` for `(c, i) = row(r)`. Each row is converted on its own, so the copy is
    /// what converting it here would give: a token routed to several experts is converted
    /// once. Every source must be converted alike (one format, width and sum unit).
    ///
    /// # Panics
    /// If `sources` is empty or its members differ in format or width.
    pub(crate) fn gather(
        sources: &[Activations],
        m: usize,
        kernel: Kernel,
        row: impl Fn(usize) -> (usize, usize),
    ) -> Self {
        let first = &sources[0];
        let shape = |a: &Activations| (a.k_pad, a.elem, a.lda, a.scale_group, a.xsum_unit);
        assert!(
            sources.iter().all(|a| shape(a) == shape(first)
                && a.scaled_sum.is_empty() == first.scaled_sum.is_empty()),
            "activations gathered from differently converted rows"
        );
        let (lda, m_pad) = (first.lda, padded_rows(m, kernel));
        let scales = first.k_pad / first.scale_group;
        let units = first.k_pad / first.xsum_unit;
        let mut data = AlignedBuf::zeroed(m_pad * lda);
        let mut scale = vec![0.0f32; m_pad * scales];
        let mut xsum = vec![0i32; m_pad * units];
        let mut scaled_sum = vec![
            0.0f32;
            if first.scaled_sum.is_empty() {
                0
            } else {
                m_pad * units
            }
        ];
        let bytes = data.as_mut_slice();
        for r in 0..m {
            let (c, i) = row(r);
            let src = &sources[c];
            bytes[r * lda..][..lda].copy_from_slice(&src.data.as_slice()[i * lda..][..lda]);
            scale[r * scales..][..scales].copy_from_slice(&src.scale[i * scales..][..scales]);
            xsum[r * units..][..units].copy_from_slice(&src.xsum[i * units..][..units]);
            if !scaled_sum.is_empty() {
                scaled_sum[r * units..][..units]
                    .copy_from_slice(&src.scaled_sum[i * units..][..units]);
            }
        }
        Self {
            data,
            m_pad,
            scale,
            xsum,
            scaled_sum,
            ..*first
        }
    }

    /// The value the kernels multiply at `(row, p)`, as f32.
    pub(crate) fn value(&self, r: usize, p: usize) -> f32 {
        let b = &self.data.as_slice()[r * self.lda..];
        if self.elem == 2 {
            bf16_bits_to_f32(u16::from_le_bytes([b[2 * p], b[2 * p + 1]]))
        } else {
            f32::from(b[p] as i8) * self.scale_at(r, p)
        }
    }
}

/// Rows one task of [`Activations::convert`] converts.
const ROWS_PER_TASK: usize = 16;

/// Rows of the converted data for `m` rows on `kernel`: whole 32-row blocks for AMX tile
/// programs (they read them whole), else `m` (at least 1): decode converts one row per
/// expert, and zeroing 31 unused rows cost more than converting the one.
fn padded_rows(m: usize, kernel: Kernel) -> usize {
    if kernel.uses_tiles() {
        m.div_ceil(M_ALIGN).max(1) * M_ALIGN
    } else {
        m.max(1)
    }
}
