//! Which cached expert gives up its slot when another must come in: the replacement rules of
//! an expert cache (the DRAM cache of a model read from SSD), as pure functions of each
//! expert's usage, so the executor and the simulator rank alike.
//!
//! Rules: LRU; LFU (uses since the run began, kept across evictions, ties to the least
//! recent); EMA, TriMoE's exponential moving average of use per step (seed 000 eq. 8, with
//! its `alpha`); and any of them with experts pinned from a routing profile (Fiddler's and
//! KTransformers' hot experts), which are never evicted.

/// How a cache ranks its experts for eviction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Replacement {
    /// Least recently used goes first.
    Lru,
    /// Least often used since the run began goes first (the least recent among equals).
    Lfu,
    /// Lowest exponential moving average of use per step goes first (`alpha`: weight of the
    /// latest step).
    Ema {
        /// Weight of the latest step, in (0, 1].
        alpha: f32,
    },
}

impl Replacement {
    /// The names [`Replacement::parse`] reads, for error messages.
    pub const NAMES: &'static str = "lfu, lru, ema or ema:ALPHA (0 < ALPHA <= 1)";

    /// The rule named `name` (`lru`, `lfu`, `ema` with TriMoE's alpha 0.3, or `ema:ALPHA`).
    pub fn parse(name: &str) -> Option<Replacement> {
        match name {
            "lru" => Some(Replacement::Lru),
            "lfu" => Some(Replacement::Lfu),
            "ema" => Some(Replacement::Ema { alpha: 0.3 }),
            _ => {
                let alpha: f32 = name.strip_prefix("ema:")?.parse().ok()?;
                (alpha > 0.0 && alpha <= 1.0).then_some(Replacement::Ema { alpha })
            }
        }
    }
}

/// One expert's use so far, in steps (a step: one MoE layer call of a forward pass).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    /// Step of the last use (0: never).
    pub last: u64,
    /// Uses since the run began.
    pub count: u64,
    /// Moving average of use per step, as of step `last`.
    pub ema: f32,
}

impl Usage {
    /// Records a use at `step` (steps increase; several uses in one step count once for the
    /// average).
    pub fn touch(&mut self, step: u64, rule: Replacement) {
        if let Replacement::Ema { alpha } = rule
            && step != self.last
        {
            self.ema = self.ema_at(step, alpha) + alpha;
        }
        self.last = step;
        self.count += 1;
    }

    /// The moving average at `step` before any use then: decayed once per step since `last`.
    fn ema_at(&self, step: u64, alpha: f32) -> f32 {
        let idle = step.saturating_sub(self.last).min(i32::MAX as u64) as i32;
        self.ema * (1.0 - alpha).powi(idle)
    }

    /// Eviction rank at `step` under `rule`: the lowest goes first.
    fn rank(&self, step: u64, rule: Replacement) -> (f32, u64) {
        match rule {
            Replacement::Lru => (0.0, self.last),
            Replacement::Lfu => (self.count as f32, self.last),
            Replacement::Ema { alpha } => (self.ema_at(step, alpha), self.last),
        }
    }
}

/// The candidate to evict at `step`: the lowest ranked of `candidates` (`(id, usage)`;
/// pinned or in-use experts are left out by the caller); the first listed among equals.
pub fn victim<I: Copy>(
    rule: Replacement,
    step: u64,
    candidates: impl IntoIterator<Item = (I, Usage)>,
) -> Option<I> {
    let mut best: Option<(I, (f32, u64))> = None;
    for (id, u) in candidates {
        let r = u.rank(step, rule);
        if best.is_none_or(|(_, b)| r.0 < b.0 || (r.0 == b.0 && r.1 < b.1)) {
            best = Some((id, r));
        }
    }
    best.map(|(id, _)| id)
}

/// The hottest `(layer, expert)` pairs of a routing profile (`counts[layer][expert]`, tokens
/// routed), at most `n`, most used first (ties to the lower layer and expert): what a cache
/// pins. Experts never routed are never pinned.
pub fn hot_experts(counts: &[Vec<u64>], n: usize) -> Vec<(usize, u32)> {
    let mut all: Vec<(u64, usize, u32)> = counts
        .iter()
        .enumerate()
        .flat_map(|(l, c)| c.iter().enumerate().map(move |(e, &n)| (n, l, e as u32)))
        .filter(|&(n, ..)| n > 0)
        .collect();
    all.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    all.into_iter().take(n).map(|(_, l, e)| (l, e)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn used(steps: &[u64], rule: Replacement) -> Usage {
        let mut u = Usage::default();
        for &s in steps {
            u.touch(s, rule);
        }
        u
    }

    #[test]
    fn each_rule_evicts_what_it_should() {
        // a: used often long ago; b: used once, just now; c: used at a middle step.
        let cands = |rule| {
            [
                ("a", used(&[1, 2, 3, 4, 5], rule)),
                ("b", used(&[40], rule)),
                ("c", used(&[20], rule)),
            ]
        };
        assert_eq!(
            victim(Replacement::Lru, 41, cands(Replacement::Lru)),
            Some("a")
        );
        assert_eq!(
            victim(Replacement::Lfu, 41, cands(Replacement::Lfu)),
            Some("c")
        );
        let ema = Replacement::Ema { alpha: 0.3 };
        // a's average has decayed over 36 idle steps below c's single use 21 steps ago.
        assert_eq!(victim(ema, 41, cands(ema)), Some("a"));
        // Soon after its run of uses, a outranks a single older use.
        let soon = [("a", used(&[1, 2, 3, 4, 5], ema)), ("c", used(&[4], ema))];
        assert_eq!(victim(ema, 6, soon), Some("c"));
        assert_eq!(victim::<u8>(Replacement::Lru, 1, []), None);
    }

    #[test]
    fn uses_within_one_step_count_once_for_the_average() {
        let ema = Replacement::Ema { alpha: 0.5 };
        let once = used(&[3], ema);
        let twice = used(&[3, 3], ema);
        assert_eq!(once.ema, twice.ema);
        assert_eq!(twice.count, 2);
    }

    #[test]
    fn rules_parse_by_name() {
        assert_eq!(Replacement::parse("lfu"), Some(Replacement::Lfu));
        assert_eq!(
            Replacement::parse("ema:0.5"),
            Some(Replacement::Ema { alpha: 0.5 })
        );
        assert_eq!(Replacement::parse("ema:0"), None);
        assert_eq!(Replacement::parse("mru"), None);
    }

    #[test]
    fn a_profile_pins_its_most_used_experts() {
        let counts = vec![vec![5, 0, 9], vec![9, 1, 0]];
        assert_eq!(hot_experts(&counts, 3), vec![(0, 2), (1, 0), (0, 0)]);
        assert_eq!(
            hot_experts(&counts, 10).len(),
            4,
            "unrouted experts are not pinned"
        );
    }
}
