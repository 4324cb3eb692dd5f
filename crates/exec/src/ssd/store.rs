//! The cache's slots: which expert each holds, which are being read, and which gives up its
//! slot next. A fixed number of slots, allocated once, so the budget holds in resident memory
//! whatever is routed: nothing is allocated per expert afterwards.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use strata_kernels::AlignedBuf;
use strata_policy::replacement::{Replacement, Usage, victim};

use super::layout::PAGE;

/// An expert: (MoE layer, expert).
pub(crate) type Key = (u32, u32);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Free,
    Loading(Key),
    Ready(Key),
}

/// Slots and their bookkeeping.
pub(crate) struct Store {
    /// Each slot's buffer; `None` while a read holds it.
    bufs: Vec<Option<Arc<AlignedBuf>>>,
    slots: Vec<Slot>,
    at: HashMap<Key, usize>,
    usage: HashMap<Key, Usage>,
    pinned: HashSet<Key>,
    rule: Replacement,
}

/// Where an expert is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// In a slot, ready.
    Ready,
    /// Being read.
    Loading,
    /// Not in the cache.
    Absent,
}

impl Store {
    /// `n` slots of `bytes` each, page-aligned for direct I/O.
    pub fn new(n: usize, bytes: usize, rule: Replacement) -> Store {
        Store {
            bufs: (0..n)
                .map(|_| Some(Arc::new(AlignedBuf::zeroed_aligned(bytes, PAGE))))
                .collect(),
            slots: vec![Slot::Free; n],
            at: HashMap::new(),
            usage: HashMap::new(),
            pinned: HashSet::new(),
            rule,
        }
    }

    /// Slots.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Experts that are never evicted once read (a profile's hottest).
    pub fn pin(&mut self, keys: impl IntoIterator<Item = Key>) {
        self.pinned.extend(keys);
    }

    /// Records a use of `key` at `step`.
    pub fn touch(&mut self, key: Key, step: u64) {
        self.usage.entry(key).or_default().touch(step, self.rule);
    }

    /// Where `key` is.
    pub fn lookup(&self, key: Key) -> Lookup {
        match self.at.get(&key).map(|&s| self.slots[s]) {
            Some(Slot::Ready(_)) => Lookup::Ready,
            Some(Slot::Loading(_)) => Lookup::Loading,
            _ => Lookup::Absent,
        }
    }

    /// A slot for `key`, taken from a free one or from the expert the rule ranks lowest among
    /// those not in `keep` and not pinned; `None` when every slot is busy. The slot's buffer
    /// goes to the read that fills it.
    pub fn start_load(
        &mut self,
        key: Key,
        step: u64,
        keep: &HashSet<Key>,
    ) -> Option<(usize, Arc<AlignedBuf>)> {
        let slot = match self.slots.iter().position(|s| *s == Slot::Free) {
            Some(s) => s,
            None => {
                let candidates = self
                    .slots
                    .iter()
                    .enumerate()
                    .filter_map(|(s, slot)| match slot {
                        Slot::Ready(k) if !keep.contains(k) && !self.pinned.contains(k) => {
                            Some((s, self.usage.get(k).copied().unwrap_or_default()))
                        }
                        _ => None,
                    });
                let s = victim(self.rule, step, candidates)?;
                if let Slot::Ready(old) = self.slots[s] {
                    self.at.remove(&old);
                }
                s
            }
        };
        let buf = self.bufs[slot].take()?;
        self.slots[slot] = Slot::Loading(key);
        self.at.insert(key, slot);
        Some((slot, buf))
    }

    /// A read into `slot` came back: its expert is ready (`ok`), or the slot is free again.
    pub fn finish_load(&mut self, slot: usize, buf: Arc<AlignedBuf>, ok: bool) {
        self.bufs[slot] = Some(buf);
        if let Slot::Loading(key) = self.slots[slot] {
            if ok {
                self.slots[slot] = Slot::Ready(key);
            } else {
                self.slots[slot] = Slot::Free;
                self.at.remove(&key);
            }
        }
    }

    /// The buffer holding `key`, when it is ready.
    pub fn buffer(&self, key: Key) -> Option<&Arc<AlignedBuf>> {
        let &s = self.at.get(&key)?;
        match self.slots[s] {
            Slot::Ready(_) => self.bufs[s].as_ref(),
            _ => None,
        }
    }

    /// Slots being read into.
    pub fn loading(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| matches!(s, Slot::Loading(_)))
            .count()
    }

    /// Slots holding or reading an expert.
    pub fn used(&self) -> usize {
        self.slots.iter().filter(|s| **s != Slot::Free).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_by_the_rule_never_taking_kept_pinned_or_loading_experts() {
        let mut st = Store::new(3, PAGE, Replacement::Lru);
        let none = HashSet::new();
        let load = |st: &mut Store, key: Key, step: u64, keep: &HashSet<Key>| {
            st.touch(key, step);
            let (slot, buf) = st.start_load(key, step, keep)?;
            Some(slot).inspect(|_| st.finish_load(slot, buf, true))
        };
        assert_eq!(load(&mut st, (0, 1), 1, &none), Some(0));
        assert_eq!(load(&mut st, (0, 2), 2, &none), Some(1));
        st.pin([(0, 3)]);
        assert_eq!(load(&mut st, (0, 3), 3, &none), Some(2));
        // Full: the least recent unpinned expert (0, 1) goes, unless kept.
        let keep: HashSet<Key> = [(0, 1)].into();
        assert_eq!(load(&mut st, (1, 0), 4, &keep), Some(1));
        assert_eq!(st.lookup((0, 2)), Lookup::Absent);
        assert_eq!(st.lookup((1, 0)), Lookup::Ready);
        // A slot being read is never taken; with everything kept, pinned or loading: none.
        let (slot, buf) = st
            .start_load((2, 0), 5, &none)
            .expect("(0, 1) is free to go");
        assert_eq!((slot, st.lookup((2, 0))), (0, Lookup::Loading));
        let keep: HashSet<Key> = [(1, 0)].into();
        assert!(st.start_load((2, 1), 6, &keep).is_none());
        // A failed read frees its slot.
        st.finish_load(slot, buf, false);
        assert_eq!(st.lookup((2, 0)), Lookup::Absent);
        assert_eq!((st.used(), st.loading()), (2, 0));
        assert!(st.buffer((1, 0)).is_some());
    }
}
