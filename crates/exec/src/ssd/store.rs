//! The cache's slots: a buffer per slot, allocated once, up front, so the budget holds in
//! resident memory whatever is routed (nothing is allocated per expert afterwards), beside the
//! bookkeeping of which expert each holds and which gives up its slot next
//! ([`SlotCache`], shared with the simulator).

use std::collections::HashSet;
use std::sync::Arc;

use strata_kernels::AlignedBuf;
use strata_policy::replacement::Replacement;
use strata_policy::slots::SlotCache;
pub(crate) use strata_policy::slots::{ExpertKey as Key, Lookup};

use super::layout::PAGE;

/// Slots and their buffers.
pub(crate) struct Store {
    /// Each slot's buffer; `None` while a read holds it.
    bufs: Vec<Option<Arc<AlignedBuf>>>,
    cache: SlotCache,
}

impl Store {
    /// `n` slots of `bytes` each, page-aligned for direct I/O.
    pub fn new(n: usize, bytes: usize, rule: Replacement) -> Store {
        Store {
            bufs: (0..n)
                .map(|_| Some(Arc::new(AlignedBuf::zeroed_aligned(bytes, PAGE))))
                .collect(),
            cache: SlotCache::new(n, rule),
        }
    }

    /// Slots.
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    /// Experts that are never evicted once read (a profile's hottest).
    pub fn pin(&mut self, keys: impl IntoIterator<Item = Key>) {
        self.cache.pin(keys);
    }

    /// Records a use of `key` at `step`.
    pub fn touch(&mut self, key: Key, step: u64) {
        self.cache.touch(key, step);
    }

    /// Makes `key`'s slot the first to be reused ([`SlotCache::demote`]).
    pub fn demote(&mut self, key: Key) {
        self.cache.demote(key);
    }

    /// Where `key` is.
    pub fn lookup(&self, key: Key) -> Lookup {
        self.cache.lookup(key)
    }

    /// A slot for `key` ([`SlotCache::claim`]) and its buffer, which goes to the read that
    /// fills it; `None` when every slot is busy.
    pub fn start_load(
        &mut self,
        key: Key,
        step: u64,
        keep: &HashSet<Key>,
    ) -> Option<(usize, Arc<AlignedBuf>)> {
        let slot = self.cache.claim(key, step, keep)?;
        let buf = self.bufs[slot]
            .take()
            .expect("a claimed slot is not being read");
        Some((slot, buf))
    }

    /// A read into `slot` came back: its expert is ready (`ok`), or the slot is free again.
    pub fn finish_load(&mut self, slot: usize, buf: Arc<AlignedBuf>, ok: bool) {
        self.bufs[slot] = Some(buf);
        self.cache.filled(slot, ok);
    }

    /// The buffer holding `key`, when it is ready.
    pub fn buffer(&self, key: Key) -> Option<&Arc<AlignedBuf>> {
        self.bufs[self.cache.ready_slot(key)?].as_ref()
    }

    /// Slots being read into.
    pub fn loading(&self) -> usize {
        self.cache.filling()
    }

    /// Slots holding or reading an expert.
    pub fn used(&self) -> usize {
        self.cache.used()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slots_buffer_goes_to_its_read_and_comes_back_with_it() {
        let mut st = Store::new(2, PAGE, Replacement::Lru);
        let none = HashSet::new();
        let (slot, buf) = st.start_load((0, 1), 1, &none).unwrap();
        assert_eq!((st.lookup((0, 1)), st.loading()), (Lookup::Filling, 1));
        assert!(st.buffer((0, 1)).is_none());
        assert_eq!(buf.len(), PAGE);
        st.finish_load(slot, buf, true);
        assert!(st.buffer((0, 1)).is_some_and(|b| b.len() == PAGE));
        // A failed read frees the slot and keeps its buffer.
        let (slot, buf) = st.start_load((0, 2), 2, &none).unwrap();
        st.finish_load(slot, buf, false);
        assert_eq!(
            (st.lookup((0, 2)), st.used(), st.loading()),
            (Lookup::Absent, 1, 0)
        );
        assert!(st.start_load((0, 3), 3, &none).is_some());
    }
}
