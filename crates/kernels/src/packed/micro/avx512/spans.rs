//! The integer register tiles' flush spans: where each span's weight and activation scales
//! lie ([`SpanPlan`], [`SpanScales`]), the offset correction a span starts from
//! ([`start_span`]), and the conversion of its i32 sums into f32 ([`flush`]).

use std::ops::Range;

use super::IntTile;
use crate::packed::{Activations, PackedMatrix, STRIP};
use crate::vnni_unit::Vnni;

/// What every register tile of one block shares about its flush spans' scales, found once
/// per block: the divisions here, done per tile, took 1.1% of a 512-token prefill.
#[derive(Clone, Copy)]
pub(super) struct SpanPlan {
    /// Activation scales per row, and the column of the block's first span.
    xs_row: usize,
    xs_col: usize,
    /// Spans per activation scale, and spans left on the first one (a block may start
    /// inside an activation scale's `k`).
    xs_spans: usize,
    xs_left: usize,
    /// Spans per tile, and the weight scale group of the first.
    spans: usize,
    group: usize,
    /// Floats between two strips' weight scales, and between two spans' (16, or 0 for one
    /// span).
    ws_strip: usize,
    ws_step: usize,
    /// Activation sums per row, the block's first span's first, and sums per span.
    xsum_row: usize,
    xsum_col: usize,
    xsum_span: usize,
}

impl SpanPlan {
    /// Whether an activation scale covers several spans (see [`flush`]'s `SHARED`).
    pub(super) fn shared_scales(&self) -> bool {
        self.xs_spans > 1
    }

    pub(super) fn new(w: &PackedMatrix, a: &Activations, ks: &Range<usize>, fs: usize) -> Self {
        let (xs_row, xs_col) = a.scale_column(ks.start);
        let spans = ks.len().div_ceil(fs);
        let xs_spans = a.spans_per_scale(fs);
        assert!(fs.is_multiple_of(a.xsum_unit) && ks.start.is_multiple_of(a.xsum_unit));
        Self {
            xs_row,
            xs_col,
            xs_spans,
            xs_left: xs_spans - (ks.start % a.scale_group / fs).min(xs_spans - 1),
            spans,
            group: ks.start / w.group,
            ws_strip: w.groups * STRIP,
            ws_step: if spans > 1 { STRIP } else { 0 },
            xsum_row: a.k_pad / a.xsum_unit,
            xsum_col: ks.start / a.xsum_unit,
            xsum_span: fs / a.xsum_unit,
        }
    }
}

/// Where a register tile's scales lie, found once per tile and stepped span by span: an index
/// computed per span (two divisions and a bounds-checked slice per scale) made the flush
/// about twice its arithmetic.
pub(super) struct SpanScales {
    /// Activation scale of the tile's first row for the current span; row `i`'s is `i *
    /// plan.xs_row` further.
    xs: *const f32,
    /// Spans left before the next activation scale.
    xs_left: usize,
    /// The 16 weight scales of the tile's first strip for the current span; strip `s`'s are
    /// `s * plan.ws_strip` further, the next span's `plan.ws_step` further.
    ws: *const f32,
    /// The first row's activation sums of the current span; row `i`'s are `i *
    /// plan.xsum_row` further.
    xsum: *const i32,
    plan: SpanPlan,
}

impl SpanScales {
    /// The scales of a tile of `mr` rows and `ns` strips, every one checked to lie within the
    /// scale arrays.
    #[inline(always)]
    pub(super) fn new(it: &IntTile, mr: usize, ns: usize) -> Self {
        let (a, w, p) = (it.act, it.pm, it.plan);
        let last_col = p.xs_col + (p.spans - 1 + p.xs_spans - p.xs_left) / p.xs_spans;
        assert!((it.row0 + mr - 1) * p.xs_row + last_col < a.scale.len());
        let ws_first = (it.strip0 * w.groups + p.group) * STRIP;
        let ws_last = ws_first + (ns - 1) * p.ws_strip + (p.spans - 1) * p.ws_step;
        assert!(ws_last + STRIP <= w.scales.len());
        let xsum_first = it.row0 * p.xsum_row + p.xsum_col;
        let xsum_end = xsum_first + (mr - 1) * p.xsum_row + p.spans * p.xsum_span;
        assert!(xsum_end <= a.xsum.len());
        Self {
            // SAFETY: within the slices (asserted above).
            xs: unsafe { a.scale.as_ptr().add(it.row0 * p.xs_row + p.xs_col) },
            xs_left: p.xs_left,
            // SAFETY: as above.
            ws: unsafe { w.scales.as_ptr().add(ws_first) },
            // SAFETY: as above.
            xsum: unsafe { a.xsum.as_ptr().add(xsum_first) },
            plan: p,
        }
    }

    /// Moves on to the next span's scales; past the last span the pointers may point past
    /// their arrays (never read).
    #[inline(always)]
    fn step(&mut self) {
        self.ws = self.ws.wrapping_add(self.plan.ws_step);
        self.xsum = self.xsum.wrapping_add(self.plan.xsum_span);
        self.xs_left -= 1;
        if self.xs_left == 0 {
            self.xs_left = self.plan.xs_spans;
            self.xs = self.xs.wrapping_add(1);
        }
    }
}

/// A flush span's accumulators at its start: minus each row's offset correction, so the span's
/// sums come out corrected (wrapping i32 adds: the same bits as subtracting after), one
/// instruction per accumulator fewer in the flush. Values stored without an offset start from
/// zero.
///
/// Plain loops: an `array::from_fn` here was compiled as a call without the unit's features
/// (10% of a Q4_K prefill's samples on an Ice Lake).
#[inline(always)]
pub(super) fn start_span<U: Vnni, const MR: usize, const NS: usize>(
    u: U,
    it: &IntTile,
    sc: &SpanScales,
) -> [[U::I; NS]; MR] {
    let mut acc = [[u.zero(); NS]; MR];
    if it.pm.offset == 0 {
        return acc;
    }
    for (i, acc) in acc.iter_mut().enumerate() {
        let mut sum = 0i32;
        for j in 0..sc.plan.xsum_span {
            // SAFETY: row `i`'s sums of this span lie within the activation sums
            // (`SpanScales::new` checked every span's).
            sum += unsafe { *sc.xsum.add(i * sc.plan.xsum_row + j) };
        }
        acc.fill(u.splat32((it.pm.offset * sum).wrapping_neg() as u32));
    }
    acc
}

/// A register tile's f32 sums: `part` under the current activation scales, `total` with them
/// applied.
pub(super) struct Sums<F, const MR: usize, const NS: usize> {
    part: [[F; NS]; MR],
    total: [[F; NS]; MR],
}

impl<F: Copy, const MR: usize, const NS: usize> Sums<F, MR, NS> {
    pub(super) fn new<U: Vnni<F = F>>(u: U) -> Self {
        let zero = [[u.splatf(0.0); NS]; MR];
        Self {
            part: zero,
            total: zero,
        }
    }

    /// The sums with every scale applied.
    pub(super) fn total(&self) -> &[[F; NS]; MR] {
        &self.total
    }
}

/// Converts the corrected i32 sums of one flush span to f32 and adds them, times the span's
/// weight scales, into `sums.part`; after the last span under the current activation scales
/// (or the tile's last, `last`), `part` times those scales joins `sums.total`. Then steps
/// `sc` to the next span. With activation scales per 256 (the k-quants' tiles) one multiply
/// by them serves eight spans: a product of the two scales per span and accumulator took a
/// quarter of the flush's arithmetic, on the ports the multiplies use.
///
/// `SHARED`: an activation scale covers several spans; else the span's two scales multiply
/// into `total` directly and `part`, unused, costs no registers (with it in use, Q8_0's
/// tiles, whose activation scales are per span, ran 10% slower).
#[inline(always)]
pub(super) fn flush<U: Vnni, const MR: usize, const NS: usize, const SHARED: bool>(
    u: U,
    acc: &[[U::I; NS]; MR],
    sc: &mut SpanScales,
    sums: &mut Sums<U::F, MR, NS>,
    last: bool,
) {
    let mut ws = [u.splatf(0.0); NS];
    for (s, ws) in ws.iter_mut().enumerate() {
        // SAFETY: strip `s`'s 16 scales of this span lie within the weight scales
        // (`SpanScales::new` checked every span's).
        *ws = unsafe { u.loadf(sc.ws.add(s * sc.plan.ws_strip)) };
    }
    if !SHARED {
        for (i, total) in sums.total.iter_mut().enumerate() {
            // SAFETY: row `i`'s scale of this span lies within the activation scales (as
            // above).
            let xs = u.splatf(unsafe { *sc.xs.add(i * sc.plan.xs_row) });
            for s in 0..NS {
                total[s] = u.fmadd(u.cvt(acc[i][s]), u.mulf(ws[s], xs), total[s]);
            }
        }
        sc.step();
        return;
    }
    for (part, acc) in sums.part.iter_mut().zip(acc) {
        for s in 0..NS {
            part[s] = u.fmadd(u.cvt(acc[s]), ws[s], part[s]);
        }
    }
    if last || sc.xs_left == 1 {
        for (i, (part, total)) in sums.part.iter_mut().zip(&mut sums.total).enumerate() {
            // SAFETY: row `i`'s scale of this span lies within the activation scales (as
            // above).
            let xs = u.splatf(unsafe { *sc.xs.add(i * sc.plan.xs_row) });
            for s in 0..NS {
                total[s] = u.fmadd(part[s], xs, total[s]);
                part[s] = u.splatf(0.0);
            }
        }
    }
    sc.step();
}
