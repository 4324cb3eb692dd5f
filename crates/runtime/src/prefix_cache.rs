//! Shared prefix cache: the KV rows of prompt prefixes seen before, reused by new sequences
//! (vLLM's automatic prefix caching, llama-server's prompt cache).
//!
//! Prompts are cut into blocks of [`BLOCK`] tokens. A block is named by a hash chained over
//! its tokens and its parent's hash, so a block is found only after the identical prefix.
//! [`PrefixCache`] keeps, per block, the KV rows of every layer (keys and values for GQA,
//! latents and rotary keys for MLA: whatever [`KvCache`] holds), under a byte budget; the
//! least recently used block without cached children is evicted first, so a chain always
//! loses its tail before its head. The scheduler owns the pool on its own thread: sequences
//! put their full prompt blocks in as their prefill advances (so a hit can come from a
//! sequence still running), and a new sequence starts from the longest cached prefix,
//! leaving at least one prompt token to prefill so that its first logits are computed. A
//! sequence still prefilling looks again at each block boundary, so requests that arrive
//! together with one new prompt prefill it once (see the scheduler's step).
//!
//! A key design decision made here is to *copy* cached rows into the new sequence's own
//! [`KvCache`] rather than share the blocks between sequences (vLLM's paged attention).
//! Attention reads each layer's cache as one contiguous slice (`KvCache::rows` of the whole
//! sequence), for every attention kind and in the hybrid executor alike; sharing blocks
//! would mean rewriting those paths over block tables. Copying costs a memcpy of the prefix
//! (microseconds against the milliseconds per token a prefill costs) and the duplicate
//! memory of running sequences, which the per-sequence admission already counts; the pool
//! itself is bounded by its budget. The rows copied are bit-identical to what the prefill
//! would compute, so a cache hit changes no logits.

use std::collections::{BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

pub use strata_model::KV_BLOCK as BLOCK;
use strata_model::KvCache;

/// Hash of the empty prefix, the parent of every first block.
const ROOT: u64 = 0x5354_5241_5441_5046;

/// The chained hashes of the full [`BLOCK`]-token blocks of `tokens`.
pub fn block_hashes(tokens: &[u32]) -> Vec<u64> {
    let mut parent = ROOT;
    tokens
        .chunks_exact(BLOCK)
        .map(|block| {
            // `DefaultHasher::new()` has fixed keys: the same tokens always hash alike.
            let mut h = DefaultHasher::new();
            parent.hash(&mut h);
            block.hash(&mut h);
            parent = h.finish();
            parent
        })
        .collect()
}

/// One cached block: its tokens (checked on every hit, so a hash collision is a miss) and
/// its rows, `(a, b)` per layer.
#[derive(Debug)]
struct Block {
    parent: u64,
    tokens: Box<[u32]>,
    rows: Vec<(Vec<f32>, Vec<f32>)>,
    /// Last use, for LRU order.
    used: u64,
    /// Cached blocks whose parent this is; only blocks without any are evicted.
    children: usize,
}

/// The pool of cached prefix blocks, LRU under a byte budget.
#[derive(Debug)]
pub struct PrefixCache {
    budget: usize,
    bytes: usize,
    blocks: HashMap<u64, Block>,
    /// `(used, hash)` of blocks without children: the eviction candidates, oldest first.
    leaves: BTreeSet<(u64, u64)>,
    clock: u64,
}

impl PrefixCache {
    /// An empty pool holding at most `budget` bytes of rows (0 disables it).
    pub fn new(budget: usize) -> PrefixCache {
        PrefixCache {
            budget,
            bytes: 0,
            blocks: HashMap::new(),
            leaves: BTreeSet::new(),
            clock: 0,
        }
    }

    /// Bytes of rows held.
    pub fn bytes(&self) -> usize {
        self.bytes
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

    fn touch(&mut self, hash: u64) {
        self.clock += 1;
        let clock = self.clock;
        if let Some(b) = self.blocks.get_mut(&hash) {
            if b.children == 0 {
                self.leaves.remove(&(b.used, hash));
                self.leaves.insert((clock, hash));
            }
            b.used = clock;
        }
    }

    /// Extends `cache`, which holds the first `cache.len()` tokens of `prompt` (whole
    /// blocks; `hashes` from [`block_hashes`]), with the cached blocks that follow, as far as
    /// they leave at least one token to prefill; returns how many tokens it added. An empty
    /// cache gets the longest cached prefix; a prefilling one catches up with blocks other
    /// sequences finished since.
    pub fn lookup(&mut self, prompt: &[u32], hashes: &[u64], cache: &mut KvCache) -> usize {
        let have = cache.len();
        if !have.is_multiple_of(BLOCK) {
            return 0;
        }
        let first = have / BLOCK;
        let most = (prompt.len().saturating_sub(1) / BLOCK).min(hashes.len());
        let mut parent = match first {
            0 => ROOT,
            _ => match hashes.get(first - 1) {
                Some(&h) => h,
                None => return 0,
            },
        };
        let mut hit = 0;
        for i in first..most {
            if !self.holds(hashes[i], parent, &prompt[i * BLOCK..(i + 1) * BLOCK]) {
                break;
            }
            parent = hashes[i];
            hit += 1;
        }
        for &hash in &hashes[first..first + hit] {
            let block = &self.blocks[&hash];
            let rows = block.rows.iter().map(|(a, b)| (a.as_slice(), b.as_slice()));
            if cache.extend(BLOCK, rows).is_err() {
                // Rows of another shape (cannot happen with one model): keep what it had.
                cache.truncate(have);
                return 0;
            }
            self.touch(hash);
        }
        hit * BLOCK
    }

    /// Puts the full blocks among the first `upto` positions of `prompt` that `cache` holds
    /// into the pool (those already there are marked used), evicting least recently used
    /// blocks to stay within the budget.
    pub fn insert(&mut self, prompt: &[u32], hashes: &[u64], cache: &KvCache, upto: usize) {
        let full = upto.min(cache.len()).min(prompt.len()) / BLOCK;
        let mut parent = ROOT;
        for (i, &hash) in hashes.iter().take(full).enumerate() {
            let tokens = &prompt[i * BLOCK..(i + 1) * BLOCK];
            if self.blocks.contains_key(&hash) {
                if !self.holds(hash, parent, tokens) {
                    // A hash collision: keep the block there, cache nothing after it.
                    return;
                }
                self.touch(hash);
                parent = hash;
                continue;
            }
            let Some(rows) = (0..cache.widths().len())
                .map(|l| {
                    let (a, b) = cache.rows(l, i * BLOCK, (i + 1) * BLOCK)?;
                    Some((a.to_vec(), b.to_vec()))
                })
                .collect::<Option<Vec<_>>>()
            else {
                return;
            };
            let size = rows.iter().map(|(a, b)| (a.len() + b.len()) * 4).sum();
            if !self.make_room(size, parent) {
                return;
            }
            if let Some(p) = self.blocks.get_mut(&parent) {
                if p.children == 0 {
                    self.leaves.remove(&(p.used, parent));
                }
                p.children += 1;
            }
            self.clock += 1;
            self.blocks.insert(
                hash,
                Block {
                    parent,
                    tokens: tokens.into(),
                    rows,
                    used: self.clock,
                    children: 0,
                },
            );
            self.leaves.insert((self.clock, hash));
            self.bytes += size;
            parent = hash;
        }
    }

    /// Evicts least recently used leaves (never `keep`) until `size` more bytes fit;
    /// returns whether they do.
    fn make_room(&mut self, size: usize, keep: u64) -> bool {
        while self.bytes + size > self.budget {
            let Some(&(used, hash)) = self.leaves.iter().find(|&&(_, h)| h != keep) else {
                return false;
            };
            self.leaves.remove(&(used, hash));
            let Some(block) = self.blocks.remove(&hash) else {
                continue;
            };
            self.bytes -= block
                .rows
                .iter()
                .map(|(a, b)| (a.len() + b.len()) * 4)
                .sum::<usize>();
            if let Some(p) = self.blocks.get_mut(&block.parent) {
                p.children -= 1;
                if p.children == 0 {
                    self.leaves.insert((p.used, block.parent));
                }
            }
        }
        true
    }
}
