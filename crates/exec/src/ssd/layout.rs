//! Where each routed expert lies in the file and where its bytes land in a cache slot.
//!
//! An expert is three row ranges of a GGUF's stacked `ffn_{gate,up,down}_exps` tensors (or
//! of a converted file's ggml tensors), far apart in the file. Direct I/O reads whole pages
//! into page-aligned memory, so each range is widened to pages and placed at a page
//! boundary of the slot; the matrix then starts at its offset inside its first page.

use std::ops::Range;

use strata_kernels::ggml::GgmlExperts;

/// Direct I/O's unit: reads start, end and land on multiples of it.
pub(crate) const PAGE: usize = 4096;

/// One matrix of an expert: the pages read and where they land.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Extent {
    /// First byte read (page-aligned file offset).
    pub file_start: u64,
    /// Bytes read (whole pages; the last may pass the end of the file).
    pub len: usize,
    /// Where the read lands in the slot (page-aligned).
    pub slot_at: usize,
    /// The matrix's bytes in the file.
    pub data: Range<u64>,
}

impl Extent {
    /// Where the matrix starts in the slot.
    pub fn slot_data_start(&self) -> usize {
        self.slot_at + (self.data.start - self.file_start) as usize
    }

    /// Bytes that must arrive for the matrix to be whole (a read may stop at the file's end).
    pub fn needed(&self) -> usize {
        (self.data.end - self.file_start) as usize
    }
}

/// Expert `e`'s gate, up and down matrices of `experts` (viewed in their file) as reads into
/// one slot, in that order.
pub(crate) fn extents(experts: &GgmlExperts, e: usize) -> [Extent; 3] {
    let (g, u, d) = experts.expert(e);
    let mut at = 0;
    [g, u, d].map(|m| {
        let r = m.stored_range();
        let file_start = (r.start / PAGE * PAGE) as u64;
        let len = r.end.next_multiple_of(PAGE) - file_start as usize;
        let ext = Extent {
            file_start,
            len,
            slot_at: at,
            data: r.start as u64..r.end as u64,
        };
        at += len;
        ext
    })
}

/// Bytes of the slot that holds expert `e` of `experts`.
pub(crate) fn slot_bytes(experts: &GgmlExperts, e: usize) -> usize {
    extents(experts, e).iter().map(|x| x.len).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_kernels::ggml::{GgmlMatrix, GgmlType};

    #[test]
    fn reads_cover_each_matrix_in_whole_pages_and_land_on_page_boundaries() {
        // Q8_0 rows of 64 values are 68 bytes: expert boundaries fall inside pages.
        let (n, h, inter) = (5, 64, 96);
        let ty = GgmlType::Q8_0;
        let rb = |k: usize| k / 32 * 34;
        let stacked = |rows: usize, k: usize| {
            GgmlMatrix::from_vec(ty, rows, k, vec![0u8; rows * rb(k)]).expect("valid")
        };
        let (gate, up) = (stacked(n * inter, h), stacked(n * inter, h));
        let down = stacked(n * h, inter);
        let experts = GgmlExperts::from_stacked(&gate, &up, &down, n, h, inter).expect("valid");
        for e in 0..n {
            let ex = extents(&experts, e);
            let mut at = 0;
            for x in &ex {
                assert_eq!(x.file_start % PAGE as u64, 0);
                assert_eq!(x.len % PAGE, 0);
                assert_eq!(x.slot_at, at);
                assert!(x.file_start <= x.data.start && x.data.end <= x.file_start + x.len as u64);
                assert!(x.len < (x.data.end - x.data.start) as usize + 2 * PAGE);
                assert_eq!(
                    x.slot_data_start() - x.slot_at,
                    (x.data.start - x.file_start) as usize
                );
                at += x.len;
            }
            assert_eq!(slot_bytes(&experts, e), at);
            assert_eq!(
                ex[0].data,
                (e * inter * rb(h)) as u64..((e + 1) * inter * rb(h)) as u64
            );
            assert_eq!(ex[2].data.start, (e * h * rb(inter)) as u64);
        }
    }
}
