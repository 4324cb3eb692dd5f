//! Which expert each slot of the device's expert buffer holds: the bookkeeping of the GPU
//! expert cache, without the device.
//!
//! [`SlotCache`] splits a fixed number of slots into *cache* slots, which keep an expert of
//! any MoE layer until the policy evicts it, and up to two *staging* slots, the ping-pong
//! buffers that stream a layer's experts through the device without keeping them
//! (`TransferKind::Staged`). A key design decision: the slot count is fixed when the cache
//! is built from the byte budget, so the budget can never be exceeded whatever a policy
//! asks; a request the free slots cannot hold is refused and counted, never allocated.

use std::collections::HashMap;

/// The slot map of the device's expert buffer.
#[derive(Debug, Clone)]
pub struct SlotCache {
    n_cache: u32,
    n_staging: u32,
    /// `(moe_layer, expert)` -> cache slot.
    held: HashMap<(usize, u32), u32>,
    /// Free cache slots, lowest last (so the lowest is used first).
    free: Vec<u32>,
}

impl SlotCache {
    /// A cache of `n_slots` slots, `min(2, n_slots)` of them for staging.
    pub fn new(n_slots: u32) -> SlotCache {
        let n_staging = n_slots.min(2);
        let n_cache = n_slots - n_staging;
        SlotCache {
            n_cache,
            n_staging,
            held: HashMap::new(),
            free: (0..n_cache).rev().collect(),
        }
    }

    /// Slots that keep experts.
    pub fn cache_slots(&self) -> u32 {
        self.n_cache
    }

    /// Ping-pong staging slots (the two after the cache slots).
    pub fn staging_slots(&self) -> Vec<u32> {
        (self.n_cache..self.n_cache + self.n_staging).collect()
    }

    /// The slot holding `expert` of `layer`, if resident.
    pub fn slot_of(&self, layer: usize, expert: u32) -> Option<u32> {
        self.held.get(&(layer, expert)).copied()
    }

    /// `resident[e]` for the `n_experts` experts of `layer`.
    pub fn resident(&self, layer: usize, n_experts: usize) -> Vec<bool> {
        (0..n_experts as u32)
            .map(|e| self.held.contains_key(&(layer, e)))
            .collect()
    }

    /// Experts held, all layers.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether no expert is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Free cache slots.
    pub fn free_slots(&self) -> u32 {
        self.free.len() as u32
    }

    /// Assigns a free slot to `expert` of `layer` (the caller uploads into it); `None` when
    /// it is already resident or no slot is free.
    pub fn insert(&mut self, layer: usize, expert: u32) -> Option<u32> {
        if self.held.contains_key(&(layer, expert)) {
            return None;
        }
        let slot = self.free.pop()?;
        self.held.insert((layer, expert), slot);
        Some(slot)
    }

    /// Drops `expert` of `layer`; whether it was resident.
    pub fn evict(&mut self, layer: usize, expert: u32) -> bool {
        match self.held.remove(&(layer, expert)) {
            Some(slot) => {
                self.free.push(slot);
                // Keep the lowest free slot on top so reuse is deterministic.
                self.free.sort_unstable_by(|a, b| b.cmp(a));
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_and_never_over_allocated() {
        let mut c = SlotCache::new(5);
        assert_eq!((c.cache_slots(), c.staging_slots()), (3, vec![3, 4]));
        assert_eq!(c.insert(0, 7), Some(0));
        assert_eq!(c.insert(0, 7), None, "already resident");
        assert_eq!(c.insert(1, 7), Some(1));
        assert_eq!(c.insert(2, 1), Some(2));
        assert_eq!(c.insert(2, 2), None, "full");
        assert!(c.evict(0, 7));
        assert!(!c.evict(0, 7));
        assert_eq!(c.insert(2, 2), Some(0));
        assert_eq!(c.resident(2, 3), vec![false, true, true]);
        assert_eq!(c.slot_of(1, 7), Some(1));
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn tiny_budgets_keep_staging_first() {
        for (n, cache, staging) in [(0, 0, 0), (1, 0, 1), (2, 0, 2), (3, 1, 2)] {
            let c = SlotCache::new(n);
            assert_eq!(c.cache_slots(), cache);
            assert_eq!(c.staging_slots().len(), staging);
        }
    }
}
