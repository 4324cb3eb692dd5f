//! Shared prefix cache: the KV rows of prompt prefixes seen before, reused by new sequences
//! (vLLM's automatic prefix caching, llama-server's prompt cache).
//!
//! Prompts are cut into blocks of [`BLOCK`] tokens. A block is named by a hash chained over
//! its tokens and its parent's hash, so a block is found only after the identical prefix.
//! [`PrefixCache`] keeps, per block, the KV rows of every layer (keys and values for GQA,
//! latents and rotary keys for MLA: whatever a [`SeqCache`] holds), in host memory under a
//! byte budget whatever the backend; the least recently used block without cached
//! children is evicted first, so a chain always loses its tail before its head. The scheduler owns the pool on its own thread: sequences
//! put their full prompt blocks in as their prefill advances (so a hit can come from a
//! sequence still running), then the prompt's last partial block, and when they end their
//! whole history, prompt and answer (the next turn of a chat sends it back). A new sequence
//! starts from the longest cached prefix: whole blocks by hash, then as many leading tokens
//! as it shares with one of the cached blocks that follow (so a prompt seen before is
//! served up to its last token, as llama-server's prompt cache does), always leaving at
//! least one prompt token to prefill so that its first logits are computed. A sequence
//! still prefilling looks again at each block boundary, so requests that arrive together
//! with one new prompt prefill it once (see the scheduler's step).
//!
//! A key design decision made here is to *copy* cached rows into the new sequence's own
//! cache rather than share the blocks between sequences (vLLM's paged attention).
//! Attention reads each layer's cache as one contiguous slice (`KvCache::rows` of the whole
//! sequence), for every attention kind and in the hybrid executor alike; sharing blocks
//! would mean rewriting those paths over block tables. Copying costs a memcpy of the prefix
//! (microseconds against the milliseconds per token a prefill costs) and the duplicate
//! memory of running sequences, which the per-sequence admission already counts; the pool
//! itself is bounded by its budget. The rows copied are bit-identical to what the prefill
//! would compute, so a cache hit changes no logits. On an accelerator the pool stays in
//! host memory, a second tier behind the device caches: a hit uploads the rows, a finished
//! block is downloaded once.
//!
//! The rows live in fixed slots of one block each ([`Slots`]), allocated once when the first
//! block shows their size: what the pool holds in resident memory is what it reports,
//! however blocks come and go. (One vector per block and layer fragmented the heap: a
//! server after hostile churn held twice the bytes the pool reported.)

use std::collections::{BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

pub use strata_model::KV_BLOCK as BLOCK;
use strata_model::backend::SeqCache;

/// Hash of the empty prefix, the parent of every first block.
const ROOT: u64 = 0x5354_5241_5441_5046;

/// The hash of `tokens` following the prefix hashed `parent`.
fn chain(parent: u64, tokens: &[u32]) -> u64 {
    // `DefaultHasher::new()` has fixed keys: the same tokens always hash alike.
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

/// The chained hashes of the full [`BLOCK`]-token blocks of `tokens`.
pub fn block_hashes(tokens: &[u32]) -> Vec<u64> {
    let mut parent = ROOT;
    tokens
        .chunks_exact(BLOCK)
        .map(|block| {
            parent = chain(parent, block);
            parent
        })
        .collect()
}

/// One cached block: its tokens (checked on every hit, so a hash collision is a miss; fewer
/// than [`BLOCK`] for the tail of a sequence) and the slot holding its rows.
#[derive(Debug)]
struct Block {
    parent: u64,
    tokens: Box<[u32]>,
    slot: usize,
    /// Last use, for LRU order.
    used: u64,
}

/// Equal slots of one block's rows: per token, each layer's `(a, b)` values.
#[derive(Debug)]
struct Slots {
    /// Values per token of each layer's two buffers.
    widths: Vec<(usize, usize)>,
    /// Values per token, all layers.
    per_token: usize,
    data: Vec<f32>,
    free: Vec<usize>,
}

impl Slots {
    /// As many slots of [`BLOCK`] tokens of `widths` as `budget` bytes hold (zeroed, so the
    /// allocator maps untouched pages lazily).
    fn new(widths: Vec<(usize, usize)>, budget: usize) -> Slots {
        let per_token: usize = widths.iter().map(|(a, b)| a + b).sum();
        let n = budget / (per_token * BLOCK * 4).max(1);
        Slots {
            widths,
            per_token,
            data: vec![0.0; n * per_token * BLOCK],
            // Popped from the end: the lowest slots first, freed ones again first.
            free: (0..n).rev().collect(),
        }
    }

    fn bytes_per_slot(&self) -> usize {
        self.per_token * BLOCK * 4
    }

    fn used(&self) -> usize {
        self.data.len() / (self.per_token * BLOCK).max(1) - self.free.len()
    }

    /// Slot `slot`'s first `n` tokens, per layer: the `a` rows then the `b` rows.
    fn rows(&self, slot: usize, n: usize) -> Vec<(&[f32], &[f32])> {
        let mut at = slot * self.per_token * BLOCK;
        self.widths
            .iter()
            .map(|&(wa, wb)| {
                let a = &self.data[at..at + n * wa];
                let b = &self.data[at + BLOCK * wa..at + BLOCK * wa + n * wb];
                at += BLOCK * (wa + wb);
                (a, b)
            })
            .collect()
    }

    /// Copies `rows` (`n` tokens per layer, shaped as the slots are) into slot `slot`.
    fn write(&mut self, slot: usize, n: usize, rows: &[(Vec<f32>, Vec<f32>)]) {
        let mut at = slot * self.per_token * BLOCK;
        for (&(wa, wb), (a, b)) in self.widths.iter().zip(rows) {
            self.data[at..at + n * wa].copy_from_slice(a);
            self.data[at + BLOCK * wa..at + BLOCK * wa + n * wb].copy_from_slice(b);
            at += BLOCK * (wa + wb);
        }
    }
}

/// The pool of cached prefix blocks, LRU under a byte budget.
#[derive(Debug)]
pub struct PrefixCache {
    budget: usize,
    /// `None` until the first block shows the rows' shape.
    slots: Option<Slots>,
    blocks: HashMap<u64, Block>,
    /// The cached blocks that follow each prefix (by its hash; [`ROOT`] for the first):
    /// where a prompt that leaves the chain of full blocks looks for a partial match. Only
    /// blocks without any are evicted.
    children: HashMap<u64, Vec<u64>>,
    /// `(used, hash)` of blocks without children: the eviction candidates, oldest first.
    leaves: BTreeSet<(u64, u64)>,
    clock: u64,
}

impl PrefixCache {
    /// An empty pool holding at most `budget` bytes of rows (0 disables it).
    pub fn new(budget: usize) -> PrefixCache {
        PrefixCache {
            budget,
            slots: None,
            blocks: HashMap::new(),
            children: HashMap::new(),
            leaves: BTreeSet::new(),
            clock: 0,
        }
    }

    /// Bytes of the slots holding blocks (a sequence's partial tail takes a whole one).
    pub fn bytes(&self) -> usize {
        self.slots
            .as_ref()
            .map_or(0, |s| s.used() * s.bytes_per_slot())
    }

    /// Blocks held.
    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Whether block `hash` holds `tokens` after `parent`.
    fn holds(&self, hash: u64, parent: u64, tokens: &[u32]) -> bool {
        self.blocks
            .get(&hash)
            .is_some_and(|b| b.parent == parent && *b.tokens == *tokens)
    }

    fn is_leaf(&self, hash: u64) -> bool {
        self.children.get(&hash).is_none_or(Vec::is_empty)
    }

    fn touch(&mut self, hash: u64) {
        self.clock += 1;
        let clock = self.clock;
        let leaf = self.is_leaf(hash);
        if let Some(b) = self.blocks.get_mut(&hash) {
            if leaf {
                self.leaves.remove(&(b.used, hash));
                self.leaves.insert((clock, hash));
            }
            b.used = clock;
        }
    }

    /// Extends `cache`, which holds the first `cache.len()` tokens of `prompt` (whole
    /// blocks; `hashes` from [`block_hashes`]), with the cached rows that follow, as far as
    /// they leave at least one token to prefill; returns how many tokens it added. Whole
    /// blocks are matched by hash; after the last one, the cached block (whole, or the tail
    /// of an earlier sequence) that shares the most leading tokens with the rest of the
    /// prompt gives those rows, so a prompt seen before is served up to its last token, as
    /// llama-server's prompt cache does. An empty cache gets the longest cached prefix; a
    /// prefilling one catches up with blocks other sequences finished since.
    pub fn lookup(&mut self, prompt: &[u32], hashes: &[u64], cache: &mut dyn SeqCache) -> usize {
        let have = cache.len();
        if !have.is_multiple_of(BLOCK) || have >= prompt.len() {
            return 0;
        }
        let first = have / BLOCK;
        let most = (prompt.len() - 1) / BLOCK;
        let mut parent = match first {
            0 => ROOT,
            _ => match hashes.get(first - 1) {
                Some(&h) => h,
                None => return 0,
            },
        };
        let mut chain = Vec::new();
        for i in first..most.min(hashes.len()) {
            if !self.holds(hashes[i], parent, &prompt[i * BLOCK..(i + 1) * BLOCK]) {
                break;
            }
            parent = hashes[i];
            chain.push((hashes[i], BLOCK));
        }
        let at = have + chain.len() * BLOCK;
        if let Some(partial) = self.best_child(parent, &prompt[at..prompt.len() - 1]) {
            chain.push(partial);
        }
        let Some(slots) = &self.slots else {
            return 0;
        };
        let mut added = 0;
        for &(hash, n) in &chain {
            // The first `n` of the block's rows.
            let rows = slots.rows(self.blocks[&hash].slot, n);
            if cache.extend(n, &rows).is_err() {
                // Rows of another shape (cannot happen with one model): keep what it had.
                cache.truncate(have);
                return 0;
            }
            added += n;
        }
        for (hash, _) in chain {
            self.touch(hash);
        }
        added
    }

    /// The child of `parent` whose tokens share the longest start with `rest`, and that
    /// length (at least one token).
    fn best_child(&self, parent: u64, rest: &[u32]) -> Option<(u64, usize)> {
        let common = |b: &Block| {
            b.tokens
                .iter()
                .zip(rest)
                .take_while(|(a, b)| a == b)
                .count()
        };
        self.children
            .get(&parent)?
            .iter()
            .map(|&h| (h, common(&self.blocks[&h])))
            .filter(|&(_, n)| n > 0)
            .max_by_key(|&(_, n)| n)
    }

    /// Puts the blocks among the first `upto` positions of `tokens` that `cache` holds into
    /// the pool (those already there are marked used), evicting least recently used blocks
    /// to stay within the budget. Full blocks always; when `upto` is all of `tokens`, its
    /// last partial block too, so the same tokens again find every row but the last.
    pub fn insert(&mut self, tokens: &[u32], hashes: &[u64], cache: &dyn SeqCache, upto: usize) {
        let upto = upto.min(cache.len()).min(tokens.len());
        let full = upto / BLOCK;
        let mut parent = ROOT;
        for (i, &hash) in hashes.iter().take(full).enumerate() {
            let block = &tokens[i * BLOCK..(i + 1) * BLOCK];
            if !self.add(hash, parent, block, cache, i * BLOCK) {
                return;
            }
            parent = hash;
        }
        if upto == tokens.len() && upto > full * BLOCK && hashes.len() >= full {
            let tail = &tokens[full * BLOCK..upto];
            self.add(chain(parent, tail), parent, tail, cache, full * BLOCK);
        }
    }

    /// Adds block `hash` (`block`, cache positions from `start`) after `parent`, or marks it
    /// used when it is there; returns whether the chain may go on after it.
    fn add(
        &mut self,
        hash: u64,
        parent: u64,
        block: &[u32],
        cache: &dyn SeqCache,
        start: usize,
    ) -> bool {
        if self.blocks.contains_key(&hash) {
            if !self.holds(hash, parent, block) {
                // A hash collision: keep the block there, cache nothing after it.
                return false;
            }
            self.touch(hash);
            return true;
        }
        let Some(rows) = (0..cache.layers())
            .map(|l| cache.read_rows(l, start, start + block.len()))
            .collect::<Option<Vec<_>>>()
        else {
            return false;
        };
        let n = block.len();
        let widths: Vec<(usize, usize)> = rows
            .iter()
            .map(|(a, b)| (a.len() / n, b.len() / n))
            .collect();
        let slots = self
            .slots
            .get_or_insert_with(|| Slots::new(widths.clone(), self.budget));
        if slots.widths != widths {
            // Rows of another shape (cannot happen with one model): not cached.
            return false;
        }
        let Some(slot) = self.make_room(parent) else {
            return false;
        };
        if let Some(slots) = &mut self.slots {
            slots.write(slot, n, &rows);
        }
        if self.blocks.contains_key(&parent) && self.is_leaf(parent) {
            self.leaves.remove(&(self.blocks[&parent].used, parent));
        }
        self.children.entry(parent).or_default().push(hash);
        self.clock += 1;
        self.blocks.insert(
            hash,
            Block {
                parent,
                tokens: block.into(),
                slot,
                used: self.clock,
            },
        );
        self.leaves.insert((self.clock, hash));
        true
    }

    /// A free slot, evicting least recently used leaves (never `keep`) for one; `None` when
    /// none can be had.
    fn make_room(&mut self, keep: u64) -> Option<usize> {
        loop {
            if let Some(slot) = self.slots.as_mut()?.free.pop() {
                return Some(slot);
            }
            let &(used, hash) = self.leaves.iter().find(|&&(_, h)| h != keep)?;
            self.leaves.remove(&(used, hash));
            let Some(block) = self.blocks.remove(&hash) else {
                continue;
            };
            self.children.remove(&hash);
            if let Some(slots) = &mut self.slots {
                slots.free.push(block.slot);
            }
            if let Some(siblings) = self.children.get_mut(&block.parent) {
                siblings.retain(|&h| h != hash);
                if siblings.is_empty() {
                    self.children.remove(&block.parent);
                    if let Some(p) = self.blocks.get(&block.parent) {
                        self.leaves.insert((p.used, block.parent));
                    }
                }
            }
        }
    }
}
