//! The slots of an expert cache and which expert gives up its slot: the bookkeeping the SSD
//! tier's DRAM cache (`strata_exec`) keeps beside its buffers and the simulator
//! (`strata_sim`) replays, so both decide alike.

use std::collections::{HashMap, HashSet};

use crate::replacement::{Replacement, Usage, victim};

/// An expert: (MoE layer, expert).
pub type ExpertKey = (u32, u32);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Free,
    Filling(ExpertKey),
    Ready(ExpertKey),
}

/// Where an expert is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// In a slot, ready.
    Ready,
    /// Its slot is being filled.
    Filling,
    /// Not in the cache.
    Absent,
}

/// A fixed number of slots, the experts in them, each expert's use so far (kept across
/// evictions), the pinned experts, which are never evicted once in, and the demoted ones,
/// which give up their slots first.
#[derive(Debug, Clone)]
pub struct SlotCache {
    slots: Vec<Slot>,
    at: HashMap<ExpertKey, usize>,
    usage: HashMap<ExpertKey, Usage>,
    pinned: HashSet<ExpertKey>,
    demoted: HashSet<ExpertKey>,
    rule: Replacement,
}

impl SlotCache {
    /// `n` empty slots whose experts `rule` evicts.
    pub fn new(n: usize, rule: Replacement) -> SlotCache {
        SlotCache {
            slots: vec![Slot::Free; n],
            at: HashMap::new(),
            usage: HashMap::new(),
            pinned: HashSet::new(),
            demoted: HashSet::new(),
            rule,
        }
    }

    /// Slots.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether there are no slots.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Experts never evicted once in (a profile's hottest).
    pub fn pin(&mut self, keys: impl IntoIterator<Item = ExpertKey>) {
        self.pinned.extend(keys);
    }

    /// Records a use of `key` at `step` (a demoted expert used here is kept by the rule
    /// again).
    pub fn touch(&mut self, key: ExpertKey, step: u64) {
        self.demoted.remove(&key);
        self.usage.entry(key).or_default().touch(step, self.rule);
    }

    /// Makes `key`'s slot the first to be reused, until `key` is used here again: a faster
    /// tier above took a copy (three tiers keep an expert in one of them, not both).
    pub fn demote(&mut self, key: ExpertKey) {
        if self.at.contains_key(&key) {
            self.demoted.insert(key);
        }
    }

    /// Where `key` is.
    pub fn lookup(&self, key: ExpertKey) -> Lookup {
        match self.at.get(&key).map(|&s| self.slots[s]) {
            Some(Slot::Ready(_)) => Lookup::Ready,
            Some(Slot::Filling(_)) => Lookup::Filling,
            _ => Lookup::Absent,
        }
    }

    /// The slot holding `key`, when it is ready.
    pub fn ready_slot(&self, key: ExpertKey) -> Option<usize> {
        let &s = self.at.get(&key)?;
        matches!(self.slots[s], Slot::Ready(_)).then_some(s)
    }

    /// A slot for `key`, now filling: a free one, or the slot of the expert the rule ranks
    /// lowest at `step` among those not in `keep`, not pinned and not filling (demoted
    /// experts before all others); `None` when there is none.
    pub fn claim(&mut self, key: ExpertKey, step: u64, keep: &HashSet<ExpertKey>) -> Option<usize> {
        let slot = match self.slots.iter().position(|s| *s == Slot::Free) {
            Some(s) => s,
            None => {
                let (pinned, demoted, usage) = (&self.pinned, &self.demoted, &self.usage);
                let candidates = |only_demoted: bool| {
                    let slots = self.slots.iter().enumerate();
                    slots.filter_map(move |(s, slot)| match slot {
                        Slot::Ready(k)
                            if !keep.contains(k)
                                && !pinned.contains(k)
                                && (!only_demoted || demoted.contains(k)) =>
                        {
                            Some((s, usage.get(k).copied().unwrap_or_default()))
                        }
                        _ => None,
                    })
                };
                let s = victim(self.rule, step, candidates(true))
                    .or_else(|| victim(self.rule, step, candidates(false)))?;
                if let Slot::Ready(old) = self.slots[s] {
                    self.at.remove(&old);
                    self.demoted.remove(&old);
                }
                s
            }
        };
        self.slots[slot] = Slot::Filling(key);
        self.at.insert(key, slot);
        Some(slot)
    }

    /// `slot` was filled (`ok`: its expert is ready), or its read failed and it is free again.
    pub fn filled(&mut self, slot: usize, ok: bool) {
        if let Slot::Filling(key) = self.slots[slot] {
            if ok {
                self.slots[slot] = Slot::Ready(key);
            } else {
                self.slots[slot] = Slot::Free;
                self.at.remove(&key);
            }
        }
    }

    /// Slots being filled.
    pub fn filling(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| matches!(s, Slot::Filling(_)))
            .count()
    }

    /// Slots holding or filling an expert.
    pub fn used(&self) -> usize {
        self.slots.iter().filter(|s| **s != Slot::Free).count()
    }
}

/// Share of a cache's slots a usage profile's pins may take: the rest stay for the experts
/// the profile did not foresee (and for reads ahead, which may take a quarter of them).
pub const PINNED_SHARE: f64 = 0.5;

/// The experts to pin in a cache of `slots` slots whose layers route to `top_k` experts:
/// `explicit` ones, then the most used of `profile` (`[moe layer][expert]` activation counts;
/// most used first, ties in layer then expert order; never one it never saw) up to
/// [`PINNED_SHARE`] of the slots, always leaving `top_k` free. `(moe layer, expert)`.
pub fn pins(
    explicit: &[(usize, u32)],
    profile: Option<&[Vec<u64>]>,
    slots: usize,
    top_k: usize,
) -> Vec<(usize, u32)> {
    let mut pinned = explicit.to_vec();
    let Some(profile) = profile else {
        return pinned;
    };
    let room = ((slots as f64 * PINNED_SHARE) as usize).min(slots.saturating_sub(top_k));
    let mut all: Vec<(u64, usize, u32)> = profile
        .iter()
        .enumerate()
        .flat_map(|(l, c)| {
            c.iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .map(move |(e, &n)| (n, l, e as u32))
        })
        .collect();
    all.sort_by(|a, b| b.0.cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
    for (_, l, e) in all {
        if pinned.len() >= room {
            break;
        }
        if !pinned.contains(&(l, e)) {
            pinned.push((l, e));
        }
    }
    pinned
}

/// Routing skew: the share of lookups (`uses[layer][expert]`) that went to each layer's most
/// used 30% of experts (0.3 when routing is uniform; 0.69-0.81 in the trained strata-tiny-moe).
pub fn top30_share(uses: &[Vec<u64>]) -> f64 {
    let (mut top, mut total) = (0u64, 0u64);
    for layer in uses {
        let mut v = layer.clone();
        v.sort_unstable_by(|a, b| b.cmp(a));
        top += v.iter().take((v.len() * 3).div_ceil(10)).sum::<u64>();
        total += v.iter().sum::<u64>();
    }
    top as f64 / total.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_are_the_most_used_up_to_half_the_slots_never_the_unused() {
        let profile = vec![vec![5, 0, 9], vec![9, 1, 0]];
        assert_eq!(pins(&[], Some(&profile), 6, 2), [(0, 2), (1, 0), (0, 0)]);
        // Explicit pins first; a small cache leaves top_k slots free.
        assert_eq!(
            pins(&[(1, 1)], Some(&profile), 6, 2),
            [(1, 1), (0, 2), (1, 0)]
        );
        assert_eq!(pins(&[], Some(&profile), 3, 2), [(0, 2)]);
        // Unused experts are never pinned, however many slots there are.
        assert_eq!(pins(&[], Some(&profile), 100, 2).len(), 4);
        assert_eq!(pins(&[(0, 1)], None, 100, 2), [(0, 1)]);
    }

    #[test]
    fn slots_are_reused_by_the_rule_never_taking_kept_pinned_or_filling_experts() {
        let mut c = SlotCache::new(3, Replacement::Lru);
        let none = HashSet::new();
        let fill = |c: &mut SlotCache, key: ExpertKey, step: u64, keep: &HashSet<ExpertKey>| {
            c.touch(key, step);
            let slot = c.claim(key, step, keep)?;
            c.filled(slot, true);
            Some(slot)
        };
        assert_eq!(fill(&mut c, (0, 1), 1, &none), Some(0));
        assert_eq!(fill(&mut c, (0, 2), 2, &none), Some(1));
        c.pin([(0, 3)]);
        assert_eq!(fill(&mut c, (0, 3), 3, &none), Some(2));
        // Full: the least recent unpinned expert (0, 1) goes, unless kept.
        let keep: HashSet<ExpertKey> = [(0, 1)].into();
        assert_eq!(fill(&mut c, (1, 0), 4, &keep), Some(1));
        assert_eq!(c.lookup((0, 2)), Lookup::Absent);
        assert_eq!(c.lookup((1, 0)), Lookup::Ready);
        assert_eq!(c.ready_slot((1, 0)), Some(1));
        // A slot being filled is never taken; with everything kept, pinned or filling: none.
        let slot = c.claim((2, 0), 5, &none).expect("(0, 1) is free to go");
        assert_eq!((slot, c.lookup((2, 0))), (0, Lookup::Filling));
        assert_eq!(c.ready_slot((2, 0)), None);
        let keep: HashSet<ExpertKey> = [(1, 0)].into();
        assert!(c.claim((2, 1), 6, &keep).is_none());
        // A failed read frees its slot.
        c.filled(slot, false);
        assert_eq!(c.lookup((2, 0)), Lookup::Absent);
        assert_eq!((c.used(), c.filling(), c.len()), (2, 0, 3));
    }

    #[test]
    fn demoted_experts_give_up_their_slots_first_until_used_again() {
        let mut c = SlotCache::new(2, Replacement::Lfu);
        let none = HashSet::new();
        for (key, uses) in [((0, 1), 3), ((0, 2), 1)] {
            for step in 0..uses {
                c.touch(key, step);
            }
            let slot = c.claim(key, 1, &none).unwrap();
            c.filled(slot, true);
        }
        // LFU alone would evict (0, 2); demoted, the more used (0, 1) goes first.
        c.demote((0, 1));
        c.demote((5, 5)); // not here: nothing to demote
        let slot = c.claim((1, 0), 4, &none).unwrap();
        c.filled(slot, true);
        assert_eq!(c.lookup((0, 1)), Lookup::Absent);
        assert_eq!(c.lookup((0, 2)), Lookup::Ready);
        // Used again, a demoted expert is ranked by the rule again.
        c.demote((0, 2));
        c.touch((0, 2), 5);
        c.touch((0, 2), 6);
        let slot = c.claim((1, 1), 7, &none).unwrap();
        c.filled(slot, true);
        assert_eq!(c.lookup((0, 2)), Lookup::Ready);
        assert_eq!(c.lookup((1, 0)), Lookup::Absent);
    }

    #[test]
    fn top30_share_is_the_most_used_tenths_share() {
        assert_eq!(top30_share(&[vec![5; 10]]), 0.3);
        // 3 of 10 experts take 6 of 8 lookups in one layer, none in the other.
        assert_eq!(
            top30_share(&[vec![2, 2, 2, 1, 1, 0, 0, 0, 0, 0], vec![0; 4]]),
            0.75
        );
        assert_eq!(top30_share(&[]), 0.0);
    }
}
