//! Per-sequence KV cache.
//!
//! Each layer keeps two growing row-major buffers: keys and values for grouped-query
//! attention, or the compressed latent and the shared rotary key for MLA. Their widths come
//! from the attention layer ([`crate::attention::Attention::cache_widths`]). Buffers grow in
//! blocks of [`BLOCK`] positions and shrink when a sequence is rewound, so a sequence holds
//! memory for its own length, never for the context's maximum.

use crate::{Error, Result};

/// Positions a cache grows by at a time.
pub const BLOCK: usize = 16;

/// Reserves room for `extra` more values in whole blocks of `BLOCK` positions.
fn grow(v: &mut Vec<f32>, extra: usize, width: usize) {
    if v.len() + extra > v.capacity() && width > 0 {
        let need = (v.len() + extra).div_ceil(width).next_multiple_of(BLOCK) * width;
        v.reserve_exact(need - v.len());
    }
}

/// One layer's cache of one sequence.
#[derive(Debug, Clone, Default)]
pub struct LayerCache {
    a: Vec<f32>,
    b: Vec<f32>,
}

impl LayerCache {
    /// Appends rows to both buffers, growing them by whole blocks of [`BLOCK`] positions
    /// (`wa`, `wb` values per position) so memory follows the sequence's length instead of
    /// doubling past it.
    pub fn append(&mut self, a: &[f32], b: &[f32], wa: usize, wb: usize) {
        grow(&mut self.a, a.len(), wa);
        grow(&mut self.b, b.len(), wb);
        self.a.extend_from_slice(a);
        self.b.extend_from_slice(b);
    }
    /// Keys (GQA) or latents (MLA), `[len, width_a]`.
    pub fn a(&self) -> &[f32] {
        &self.a
    }
    /// Values (GQA) or rotary keys (MLA), `[len, width_b]`.
    pub fn b(&self) -> &[f32] {
        &self.b
    }
    fn truncate(&mut self, len: usize, wa: usize, wb: usize) {
        for (v, w) in [(&mut self.a, wa), (&mut self.b, wb)] {
            v.truncate(len * w);
            v.shrink_to(len.next_multiple_of(BLOCK) * w);
        }
    }
    fn bytes(&self) -> usize {
        (self.a.capacity() + self.b.capacity()) * 4
    }
}

/// Fails unless `rows` hold `n` positions of every layer of a cache whose layers are
/// `widths` wide: what a cache checks before it takes rows computed elsewhere.
pub fn check_rows(widths: &[(usize, usize)], n: usize, rows: &[(&[f32], &[f32])]) -> Result<()> {
    if rows.len() != widths.len() {
        return Err(Error::Input(format!(
            "kv cache extend: expected rows for {} layers, got {}",
            widths.len(),
            rows.len()
        )));
    }
    for (i, ((a, b), &(wa, wb))) in rows.iter().zip(widths).enumerate() {
        if a.len() != n * wa || b.len() != n * wb {
            return Err(Error::Input(format!(
                "kv cache extend: layer {i} expected {}+{} values for {n} positions, got {}+{}",
                n * wa,
                n * wb,
                a.len(),
                b.len()
            )));
        }
    }
    Ok(())
}

/// The KV cache of one sequence across all layers.
#[derive(Debug, Clone)]
pub struct KvCache {
    pub(crate) layers: Vec<LayerCache>,
    widths: Vec<(usize, usize)>,
    len: usize,
}

impl KvCache {
    pub(crate) fn new(widths: Vec<(usize, usize)>) -> KvCache {
        KvCache {
            layers: vec![LayerCache::default(); widths.len()],
            widths,
            len: 0,
        }
    }

    /// Widths of one position in each layer's two buffers (f32 values).
    pub fn widths(&self) -> &[(usize, usize)] {
        &self.widths
    }

    /// Positions cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }

    /// Drops every position from `len` on (to rewind a sequence).
    pub fn truncate(&mut self, len: usize) {
        if len < self.len {
            for (layer, &(wa, wb)) in self.layers.iter_mut().zip(&self.widths) {
                layer.truncate(len, wa, wb);
            }
            self.len = len;
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(LayerCache::bytes).sum()
    }

    /// Layer `layer`'s two buffers for positions `start..end` (`None` when out of range):
    /// what a prefix cache copies out.
    pub fn rows(&self, layer: usize, start: usize, end: usize) -> Option<(&[f32], &[f32])> {
        let (l, &(wa, wb)) = self.layers.get(layer).zip(self.widths.get(layer))?;
        (start <= end && end <= self.len)
            .then(|| (&l.a[start * wa..end * wa], &l.b[start * wb..end * wb]))
    }

    /// Appends `n` positions computed elsewhere (a prefix cache's copy of an identical
    /// prefix): one `(a, b)` pair of `n` rows per layer, in layer order.
    pub fn extend<'r>(
        &mut self,
        n: usize,
        rows: impl IntoIterator<Item = (&'r [f32], &'r [f32])>,
    ) -> Result<()> {
        let rows: Vec<_> = rows.into_iter().collect();
        check_rows(&self.widths, n, &rows)?;
        for ((layer, (a, b)), &(wa, wb)) in self.layers.iter_mut().zip(rows).zip(&self.widths) {
            layer.append(a, b, wa, wb);
        }
        self.len += n;
        Ok(())
    }
}
