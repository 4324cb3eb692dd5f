//! The SSD tier: DRAM as the expert cache of a model whose routed experts do not fit in memory.
//!
//! [`SsdTier`] is an [`ExpertExecutor`]: each MoE layer hands it its routing, and it computes
//! the routed experts from cache slots instead of the mapped file. What the router chose and
//! the cache lacks is read at once, every missing expert of the layer in flight together on
//! the read pool ([`reader`]), into fixed slots ([`store`]) that a replacement rule from
//! `strata_policy::replacement` frees; the experts already there are computed while the rest
//! arrive, and each missing one as soon as it lands. Meanwhile the next MoE layer's router,
//! applied early to this layer's hidden states, names the experts to fetch ahead: a wrong
//! guess costs disk time, never correctness. Non-expert weights stay mapped.
//!
//! A key design decision: the layer is computed in the pieces `fused_moe_ggml` cuts it into
//! ([`moe_waves`]) and combined in its order ([`combine_wave`]), so whatever arrives when,
//! the output is the same bits as the model run from memory.

mod choice;
mod layout;
mod metrics;
mod pins;
mod reader;
mod store;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use strata_kernels::AlignedBuf;
use strata_kernels::ggml::{GgmlExperts, combine_wave, ggml_piece_rows, moe_waves};
use strata_kernels::moe::{ExpertBatch, group_by_expert};
use strata_kernels::packed::StableBytes;
use strata_model::experts::ExpertSet;
use strata_model::moe::MoeBlock;
use strata_model::{ExpertCall, ExpertExecutor, Model, Router};
use strata_policy::replacement::Replacement;
use strata_policy::slots::top30_share;

use crate::{Error, Result};
pub use choice::{CacheChoice, ExpertCache};
use layout::{PAGE, extents, slot_bytes};
pub use metrics::write_metric;
pub use pins::{PinnedRead, pin_profile_from_trace};
use reader::{Files, ReadDone, ReadJob, Reader, read_extents};
use store::{Key, Lookup, Store};

/// How the SSD tier runs.
#[derive(Debug, Clone)]
pub struct SsdOptions {
    /// Bytes of cache slots (allocated up front).
    pub budget: u64,
    /// Which cached expert gives up its slot.
    pub replacement: Replacement,
    /// Fetch the next layer's predicted experts while this one computes.
    pub prefetch: bool,
    /// Reads in flight at most: threads of the read pool, or experts in flight through
    /// io_uring (three reads each).
    pub readers: usize,
    /// Read through io_uring where the kernel allows it (else on `readers` threads, said
    /// once). Default: on, unless `STRATA_EXPERT_READS=threads` (benchmarks).
    pub io_uring: bool,
    /// Experts read at start and never evicted: `(moe layer, expert)`.
    pub pinned: Vec<(usize, u32)>,
    /// Expert activation counts, `[moe layer][expert]` (a routing trace's,
    /// [`pin_profile_from_trace`]): their most used experts are pinned as well, up to half the
    /// cache's slots.
    pub pin_profile: Option<Vec<Vec<u64>>>,
}

impl Default for SsdOptions {
    fn default() -> Self {
        SsdOptions {
            budget: 0,
            replacement: Replacement::Lfu,
            prefetch: true,
            readers: 16,
            io_uring: std::env::var("STRATA_EXPERT_READS").map_or(true, |v| v != "threads"),
            pinned: Vec::new(),
            pin_profile: None,
        }
    }
}

/// What the tier did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SsdStats {
    /// Routed experts looked up (one per expert per layer call).
    pub lookups: u64,
    /// Found ready in a slot.
    pub hits: u64,
    /// Found being read (fetched ahead, not yet there).
    pub in_flight: u64,
    /// Read because a layer needed them.
    pub misses: u64,
    /// Read ahead on a guess.
    pub prefetched: u64,
    /// Lookups in layers the layer before guessed for (every MoE layer but the first, with
    /// prefetch on).
    pub guess_lookups: u64,
    /// Of those, the experts the guess named: the prediction's recall.
    pub guessed: u64,
    /// Bytes read from the file.
    pub bytes_read: u64,
    /// Experts the accelerator's cache took from this tier (three tiers: the hybrid
    /// executor's uploads).
    pub device_reads: u64,
    /// Of those, found ready in a slot (the rest were read from the file for the device,
    /// not kept here).
    pub device_hits: u64,
    /// Bytes read from the file for the accelerator.
    pub device_bytes_read: u64,
    /// Seconds the reads took, summed over the pool (each read's own time).
    pub read_seconds: f64,
    /// Seconds the forward pass waited for reads.
    pub wait_seconds: f64,
    /// Whether reads bypass the page cache.
    pub direct_io: bool,
    /// Whether reads go through io_uring (else a pool of threads).
    pub io_uring: bool,
    /// Slots.
    pub slots: usize,
    /// Slots holding or reading an expert.
    pub slots_used: usize,
    /// Bytes per slot.
    pub slot_bytes: usize,
    /// The pinned experts read at start (none without pins).
    pub pinned: PinnedRead,
    /// Routing skew: the share of lookups that went to the most used 30% of each layer's
    /// experts (0.3 when routing is uniform; 0.69-0.81 in the trained strata-tiny-moe).
    pub top30_share: f64,
}

impl SsdStats {
    /// Share of lookups found ready.
    pub fn hit_rate(&self) -> f64 {
        self.hits as f64 / self.lookups.max(1) as f64
    }

    /// Share of the experts a layer used that the layer before had guessed.
    pub fn guess_recall(&self) -> f64 {
        self.guessed as f64 / self.guess_lookups.max(1) as f64
    }

    /// What happened between `earlier` and `self` (counters only; the settings stay).
    pub fn since(&self, earlier: &SsdStats) -> SsdStats {
        SsdStats {
            lookups: self.lookups - earlier.lookups,
            hits: self.hits - earlier.hits,
            in_flight: self.in_flight - earlier.in_flight,
            misses: self.misses - earlier.misses,
            prefetched: self.prefetched - earlier.prefetched,
            guess_lookups: self.guess_lookups - earlier.guess_lookups,
            guessed: self.guessed - earlier.guessed,
            bytes_read: self.bytes_read - earlier.bytes_read,
            device_reads: self.device_reads - earlier.device_reads,
            device_hits: self.device_hits - earlier.device_hits,
            device_bytes_read: self.device_bytes_read - earlier.device_bytes_read,
            read_seconds: self.read_seconds - earlier.read_seconds,
            wait_seconds: self.wait_seconds - earlier.wait_seconds,
            ..*self
        }
    }
}

impl std::fmt::Display for SsdStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: f64| b / (1u64 << 20) as f64;
        write!(
            f,
            "{} slots of {:.2} MiB ({:.0} MiB), {:.1}% hits, {:.1}% in flight, {} misses, {} \
             fetched ahead ({:.1}% of the experts used guessed), {:.1} MiB read ({}, {}), waited {:.2} s, each layer's most used 30% of \
             experts took {:.1}% of lookups",
            self.slots,
            mib(self.slot_bytes as f64),
            mib((self.slots * self.slot_bytes) as f64),
            100.0 * self.hit_rate(),
            100.0 * self.in_flight as f64 / self.lookups.max(1) as f64,
            self.misses,
            self.prefetched,
            100.0 * self.guess_recall(),
            mib(self.bytes_read as f64),
            if self.direct_io { "direct" } else { "buffered" },
            if self.io_uring { "io_uring" } else { "threads" },
            self.wait_seconds,
            100.0 * self.top30_share,
        )?;
        if self.pinned.experts > 0 {
            write!(f, "; {} at start", self.pinned)?;
        }
        if self.device_reads > 0 {
            write!(
                f,
                "; {} experts copied to the accelerator, {:.1}% of them from the cache, {:.1} MiB \
                 read for it",
                self.device_reads,
                100.0 * self.device_hits as f64 / self.device_reads as f64,
                mib(self.device_bytes_read as f64),
            )?;
        }
        Ok(())
    }
}

/// The SSD tier of one model (see the module documentation).
pub struct SsdTier {
    path: PathBuf,
    /// Each MoE layer's experts as mapped (their shapes and file offsets).
    layers: Vec<GgmlExperts>,
    routers: Vec<Router>,
    prefetch: bool,
    /// Bytes of one slot.
    slot: usize,
    state: Mutex<State>,
    /// The read pool, used by the thread computing a layer alone; waiting on it leaves
    /// `state` free for the accelerator's uploads ([`SsdTier::expert_for_device`]).
    reader: Mutex<Reader>,
    /// The file, for reads outside the pool.
    files: Arc<Files>,
}

struct State {
    store: Store,
    step: u64,
    stats: SsdStats,
    /// Lookups per (layer, expert), `[layer][expert]`.
    uses: Vec<Vec<u64>>,
    /// What the layer before guessed for each MoE layer's call, `[layer][expert]`; empty
    /// when it made no guess.
    guesses: Vec<Vec<bool>>,
}

impl std::fmt::Debug for SsdTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SsdTier")
            .field("path", &self.path)
            .field("moe_layers", &self.layers.len())
            .finish()
    }
}

/// The bytes one slot needs for `model`'s largest routed expert as the file stores it, and the
/// most experts a token routes to in one layer. Errors unless every MoE layer's experts are
/// ggml blocks mapped from one file of `file_len` bytes (a GGUF, or a converted model that
/// keeps them so).
fn expert_sets(blocks: &[&MoeBlock], file_len: u64) -> Result<(Vec<GgmlExperts>, usize, usize)> {
    let mut sets = Vec::new();
    let mut slot = 0;
    for (i, block) in blocks.iter().enumerate() {
        let ExpertSet::Ggml(g) = &block.experts else {
            return Err(Error::Config(format!(
                "MoE layer {i}: the SSD tier reads experts stored as ggml blocks (a GGUF); \
                 this model's experts are in memory already"
            )));
        };
        for e in 0..g.len() {
            let (gate, ..) = g.expert(e);
            if gate.owner_len() as u64 != file_len {
                return Err(Error::Config(format!(
                    "MoE layer {i}: experts are not mapped from the model file ({} bytes, the file {file_len})",
                    gate.owner_len()
                )));
            }
            slot = slot.max(slot_bytes(g, e));
        }
        sets.push(g.clone());
    }
    if sets.is_empty() {
        return Err(Error::Config(
            "the model has no MoE layer: no experts to cache".into(),
        ));
    }
    let top_k = blocks.iter().map(|b| b.router().top_k()).max().unwrap_or(1);
    Ok((sets, slot, top_k))
}

/// Bytes the SSD tier needs at least for `model`: one slot per expert a token routes to in a
/// layer.
pub fn ssd_min_budget(model: &Model, path: &Path) -> Result<u64> {
    let (_, slot, top_k) = expert_sets(&model.moe_blocks(), file_len(path)?)?;
    Ok((slot * top_k) as u64)
}

fn io_error(path: &Path, e: std::io::Error) -> Error {
    Error::Config(format!("{}: {e}", path.display()))
}

/// The length of the file the experts are read from.
fn file_len(path: &Path) -> Result<u64> {
    let meta = std::fs::metadata(path).map_err(|e| {
        Error::Config(format!(
            "the SSD tier reads the routed experts from the one file a model maps (a GGUF, or a \
             converted model that keeps them as ggml blocks): {e}"
        ))
    })?;
    Ok(meta.len())
}

/// A byte count for a message: KiB below a MiB, MiB below a GiB, else GiB.
fn size(b: u64) -> String {
    let b = b as f64;
    match b {
        b if b < (1u64 << 20) as f64 => format!("{:.1} KiB", b / 1024.0),
        b if b < (1u64 << 30) as f64 => format!("{:.1} MiB", b / (1u64 << 20) as f64),
        b => format!("{:.2} GiB", b / (1u64 << 30) as f64),
    }
}

impl SsdTier {
    /// The tier over the routed experts of a model's MoE `blocks` (in MoE layer order: the
    /// CPU's [`Model::moe_blocks`], or the host experts of the accelerator's hybrid layout),
    /// read from `path` (the file the model maps) into `opts.budget` bytes of slots. Refused,
    /// naming the minimum, when the budget holds fewer experts than a token routes to in one
    /// layer.
    pub fn new(blocks: &[&MoeBlock], path: &Path, opts: &SsdOptions) -> Result<SsdTier> {
        let (layers, slot, top_k) = expert_sets(blocks, file_len(path)?)?;
        let n = (opts.budget / slot as u64) as usize;
        if n < top_k {
            return Err(Error::Config(format!(
                "an expert cache of {} holds {n} experts of {}; a token routes to {top_k} per \
                 layer, so it needs at least {} (--expert-cache)",
                size(opts.budget),
                size(slot as u64),
                size((slot * top_k) as u64)
            )));
        }
        if opts.pinned.len() + top_k > n {
            return Err(Error::Config(format!(
                "{} pinned experts leave fewer than the {top_k} slots a token needs in an expert \
                 cache of {n}",
                opts.pinned.len()
            )));
        }
        if let Some(profile) = &opts.pin_profile {
            pins::check_profile(
                profile,
                &layers.iter().map(GgmlExperts::len).collect::<Vec<_>>(),
            )?;
        }
        let pinned =
            strata_policy::slots::pins(&opts.pinned, opts.pin_profile.as_deref(), n, top_k);
        let reader =
            Reader::open(path, opts.readers, opts.io_uring).map_err(|e| io_error(path, e))?;
        let mut store = Store::new(n, slot, opts.replacement);
        store.pin(pinned.iter().map(|&(l, e)| (l as u32, e)));
        let files = reader.files();
        let stats = SsdStats {
            direct_io: reader.direct(),
            io_uring: reader.ring(),
            slots: n,
            slot_bytes: slot,
            ..SsdStats::default()
        };
        let uses = layers.iter().map(|g| vec![0; g.len()]).collect();
        let tier = SsdTier {
            path: path.to_owned(),
            layers,
            routers: blocks.iter().map(|b| b.router().clone()).collect(),
            prefetch: opts.prefetch,
            slot,
            state: Mutex::new(State {
                store,
                step: 0,
                stats,
                uses,
                guesses: vec![Vec::new(); blocks.len()],
            }),
            reader: Mutex::new(reader),
            files,
        };
        if !pinned.is_empty() {
            let read = tier.read_pinned(&pinned)?;
            tier.lock().stats.pinned = read;
        }
        Ok(tier)
    }

    /// What the tier did so far.
    pub fn stats(&self) -> SsdStats {
        let direct_io = self.lock_reader().direct();
        let st = self.lock();
        SsdStats {
            direct_io,
            slots_used: st.store.used(),
            top30_share: top30_share(&st.uses),
            ..st.stats
        }
    }

    /// Why reads go through the page cache, once.
    pub fn take_note(&self) -> Option<String> {
        self.lock_reader().take_note()
    }

    /// What a front end says once, at start: [`SsdTier::take_note`], then the pinned
    /// experts read.
    pub fn start_notes(&self) -> Vec<String> {
        let pinned = self.stats().pinned;
        let pinned = (pinned.experts > 0).then(|| pinned.to_string());
        self.take_note().into_iter().chain(pinned).collect()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_reader(&self) -> MutexGuard<'_, Reader> {
        self.reader.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a read of expert `e` of MoE layer `l` when a slot can be had without evicting
    /// `keep`; false when none can.
    fn read(&self, st: &mut State, key: Key, keep: &HashSet<Key>) -> bool {
        let Some((slot, buf)) = st.store.start_load(key, st.step, keep) else {
            return false;
        };
        let extents = extents(&self.layers[key.0 as usize], key.1 as usize);
        self.lock_reader().submit(ReadJob {
            key,
            slot,
            buf,
            extents,
        });
        true
    }

    /// Takes a finished read into the store; a failed one is the error it names.
    fn land(st: &mut State, done: ReadDone) -> Result<()> {
        st.stats.read_seconds += done.seconds;
        let ok = done.result.is_ok();
        st.store.finish_load(done.slot, done.buf, ok);
        let bytes = done.result.map_err(Error::Config)?;
        st.stats.bytes_read += bytes;
        Ok(())
    }

    /// Reads ahead the experts the next MoE layer's router picks for `x`, into slots that
    /// neither this layer's experts nor the guess itself need; none that `skip` marks (the
    /// experts the accelerator holds, under three tiers).
    fn prefetch(
        &self,
        st: &mut State,
        next: usize,
        (x, t): (&[f32], usize),
        skip: &[bool],
        keep: &mut HashSet<Key>,
    ) {
        let Some(router) = self.routers.get(next) else {
            return;
        };
        let guess = router.route(x, t, 0);
        let mut count = vec![0u32; router.n_experts()];
        for &e in &guess.ids {
            count[e as usize] += 1;
        }
        st.guesses[next] = count.iter().map(|&c| c > 0).collect();
        let mut order: Vec<u32> = (0..count.len() as u32)
            .filter(|&e| count[e as usize] > 0 && skip.get(e as usize) != Some(&true))
            .collect();
        order.sort_by_key(|&e| std::cmp::Reverse(count[e as usize]));
        // Never more than a quarter of the slots on a guess.
        let mut room = st.store.len() / 4;
        for e in order {
            let key = (next as u32, e);
            keep.insert(key);
            if room == 0 {
                break;
            }
            if st.store.lookup(key) == Lookup::Absent && self.read(st, key, keep) {
                st.stats.prefetched += 1;
                room -= 1;
            }
        }
    }

    fn run(&self, call: ExpertCall<'_>, out: &mut [f32]) -> Result<()> {
        let l = call.moe_layer;
        let n = self.layers.get(l).map_or(0, GgmlExperts::len);
        let r = call.routing;
        let batches = group_by_expert(n, &r.ids, &r.weights, r.top_k)
            .map_err(|e| Error::Config(e.to_string()))?;
        let guess = self.prefetch.then_some(&[][..]);
        self.run_batches(l, call.x, &batches, out, guess)
    }

    /// Adds the weighted outputs of `batches` (experts of MoE layer `l` on the rows of `x`,
    /// `[T, hidden]`) into `out`, reading what the cache lacks; the same bits as
    /// [`ExpertSet::run_batches`] on the mapped experts. With `guess` (and read-ahead on),
    /// reads ahead what the next MoE layer's router picks for `x`, but the experts `guess`
    /// marks. The tier's state is locked for its bookkeeping only: the experts are computed,
    /// and reads waited for, with it free.
    pub fn run_batches(
        &self,
        l: usize,
        x: &[f32],
        batches: &[ExpertBatch],
        out: &mut [f32],
        guess: Option<&[bool]>,
    ) -> Result<()> {
        let mapped = self.layers.get(l).ok_or_else(|| {
            Error::Config(format!("moe layer {l} of {} cached", self.layers.len()))
        })?;
        let h = mapped.hidden();
        let waves = moe_waves(batches);
        // This layer's experts: kept in their slots until their pieces are computed.
        let mut keep: HashSet<Key> = batches
            .iter()
            .map(|b| (l as u32, b.expert as u32))
            .collect();
        let mut missing = Vec::new();
        {
            let mut st = self.lock();
            let st = &mut *st;
            st.step += 1;
            self.land_finished(st)?;
            let guessed = match batches.is_empty() {
                true => Vec::new(),
                false => std::mem::take(&mut st.guesses[l]),
            };
            for b in batches {
                let key = (l as u32, b.expert as u32);
                st.store.touch(key, st.step);
                st.stats.lookups += 1;
                st.uses[l][b.expert] += 1;
                if !guessed.is_empty() {
                    st.stats.guess_lookups += 1;
                    st.stats.guessed += u64::from(guessed[b.expert]);
                }
                match st.store.lookup(key) {
                    Lookup::Ready => st.stats.hits += 1,
                    Lookup::Filling => st.stats.in_flight += 1,
                    Lookup::Absent => {
                        st.stats.misses += 1;
                        missing.push(key);
                    }
                }
            }
            missing.retain(|&key| !self.read(st, key, &keep));
            if let Some(skip) = guess.filter(|_| self.prefetch) {
                let mut guard = keep.clone();
                self.prefetch(st, l + 1, (x, x.len() / h.max(1)), skip, &mut guard);
            }
        }

        // Compute what is there, wait for the rest, combine waves in order.
        let mut ys: Vec<Vec<Option<Vec<f32>>>> =
            waves.iter().map(|w| vec![None; w.len()]).collect();
        let mut combined = 0;
        while combined < waves.len() {
            // The slots of this layer's experts are never claimed while they are kept, so
            // their buffers are read with the state free.
            let (ready, buffers) = {
                let st = self.lock();
                let ready: Vec<(usize, usize)> = (combined..waves.len())
                    .flat_map(|w| (0..waves[w].len()).map(move |p| (w, p)))
                    .filter(|&(w, p)| ys[w][p].is_none())
                    .filter(|&(w, p)| {
                        st.store
                            .buffer((l as u32, waves[w][p].expert as u32))
                            .is_some()
                    })
                    .collect();
                let mut buffers: Vec<(usize, Arc<AlignedBuf>)> = Vec::new();
                for &(w, p) in &ready {
                    let e = waves[w][p].expert;
                    if !buffers.iter().any(|b| b.0 == e) {
                        let buf = st.store.buffer((l as u32, e as u32)).cloned();
                        buffers.extend(buf.map(|b| (e, b)));
                    }
                }
                (ready, buffers)
            };
            if !ready.is_empty() {
                let pieces: Vec<&ExpertBatch> = ready.iter().map(|&(w, p)| &waves[w][p]).collect();
                let rows = self.compute(mapped, x, &pieces, buffers)?;
                for ((w, p), y) in ready.into_iter().zip(rows) {
                    ys[w][p] = Some(y);
                }
            }
            while combined < waves.len() && ys[combined].iter().all(Option::is_some) {
                let rows: Vec<&[f32]> = ys[combined].iter().flatten().map(Vec::as_slice).collect();
                combine_wave(&waves[combined], &rows, h, out)
                    .map_err(|e| Error::Config(e.to_string()))?;
                ys[combined].clear();
                combined += 1;
            }
            if combined == waves.len() {
                break;
            }
            // Experts whose pieces are all computed may give up their slots.
            keep.retain(|&(_, e)| {
                (combined..waves.len()).any(|w| {
                    waves[w]
                        .iter()
                        .zip(&ys[w])
                        .any(|(p, y)| p.expert as u32 == e && y.is_none())
                })
            });
            {
                let mut st = self.lock();
                let st = &mut *st;
                missing.retain(|&key| !self.read(st, key, &keep));
                if st.store.loading() == 0 {
                    // Nothing in flight and nothing computable: every slot holds a pinned
                    // expert or one this layer still needs. Waiting would never end.
                    return Err(Error::Config(format!(
                        "moe layer {l}: the expert cache's {} slots are all pinned or in use; \
                         give it more memory (--expert-cache) or pin fewer experts",
                        st.store.len()
                    )));
                }
            }
            let start = Instant::now();
            let done = self.lock_reader().wait().ok_or_else(|| {
                Error::Config(format!("{}: the read pool stopped", self.path.display()))
            })?;
            let mut st = self.lock();
            st.stats.wait_seconds += start.elapsed().as_secs_f64();
            Self::land(&mut st, done)?;
        }
        Ok(())
    }

    /// Takes every read that has finished into the store.
    fn land_finished(&self, st: &mut State) -> Result<()> {
        loop {
            let Some(done) = self.lock_reader().try_next() else {
                return Ok(());
            };
            Self::land(st, done)?;
        }
    }

    /// The unweighted rows of `pieces` (all of one MoE layer, `mapped`), their experts'
    /// slot buffers in `buffers`.
    fn compute(
        &self,
        mapped: &GgmlExperts,
        x: &[f32],
        pieces: &[&ExpertBatch],
        mut buffers: Vec<(usize, Arc<AlignedBuf>)>,
    ) -> Result<Vec<Vec<f32>>> {
        let h = mapped.hidden();
        buffers.sort_unstable_by_key(|b| b.0);
        let local: Vec<usize> = buffers.iter().map(|b| b.0).collect();
        let (mut gate, mut up, mut down) = (Vec::new(), Vec::new(), Vec::new());
        for (e, buf) in buffers {
            let owner: Arc<dyn StableBytes> = buf;
            let ex = extents(mapped, e);
            let (g, u, d) = mapped.expert(e);
            let kernel = |e: strata_kernels::KernelError| Error::Config(e.to_string());
            gate.push(
                g.in_owner(owner.clone(), ex[0].slot_data_start())
                    .map_err(kernel)?,
            );
            up.push(
                u.in_owner(owner.clone(), ex[1].slot_data_start())
                    .map_err(kernel)?,
            );
            down.push(d.in_owner(owner, ex[2].slot_data_start()).map_err(kernel)?);
        }
        let experts = GgmlExperts::new(gate, up, down, h, mapped.inter())
            .map_err(|e| Error::Config(e.to_string()))?;
        let renamed = pieces
            .iter()
            .map(|p| {
                let expert = local.binary_search(&p.expert).map_err(|_| {
                    Error::Config(format!("expert {} is not in its slot", p.expert))
                })?;
                Ok(ExpertBatch {
                    expert,
                    tokens: p.tokens.clone(),
                    weights: p.weights.clone(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&ExpertBatch> = renamed.iter().collect();
        let rows: usize = pieces.iter().map(|p| p.tokens.len()).sum();
        let mut y = vec![0.0f32; rows * h];
        ggml_piece_rows(&experts, x, &refs, &mut y).map_err(|e| Error::Config(e.to_string()))?;
        let mut at = 0;
        Ok(pieces
            .iter()
            .map(|p| {
                let n = p.tokens.len() * h;
                at += n;
                y[at - n..at].to_vec()
            })
            .collect())
    }

    /// Expert `expert` of MoE layer `l` as the file stores it, its gate, up and down blocks
    /// back to back, for the accelerator's expert cache (three tiers): copied from its slot
    /// when ready, which then goes first when a slot is needed (the accelerator holds the
    /// expert: the two caches hold more experts together than if both kept it), else read
    /// from the file and not kept here. Takes the tier's state only to look and count, so
    /// it runs beside a layer.
    pub fn expert_for_device(&self, l: usize, expert: u32) -> Result<Vec<u8>> {
        let mapped = self.layers.get(l).ok_or_else(|| {
            Error::Config(format!("moe layer {l} of {} cached", self.layers.len()))
        })?;
        if expert as usize >= mapped.len() {
            return Err(Error::Config(format!(
                "expert {expert} of moe layer {l}, expected below {}",
                mapped.len()
            )));
        }
        let ex = extents(mapped, expert as usize);
        let gather = |bytes: &[u8]| {
            let mut out = Vec::with_capacity(
                ex.iter().map(|x| x.data.end - x.data.start).sum::<u64>() as usize,
            );
            for x in &ex {
                let start = x.slot_data_start();
                out.extend_from_slice(&bytes[start..start + (x.data.end - x.data.start) as usize]);
            }
            out
        };
        {
            let mut st = self.lock();
            st.stats.device_reads += 1;
            if let Some(buf) = st.store.buffer((l as u32, expert)) {
                let out = gather(buf.as_slice());
                st.stats.device_hits += 1;
                st.store.demote((l as u32, expert));
                return Ok(out);
            }
        }
        let mut buf = AlignedBuf::zeroed_aligned(self.slot, PAGE);
        let read = read_extents(&self.files, (l as u32, expert), &ex, buf.as_mut_slice())
            .map_err(Error::Config)?;
        self.lock().stats.device_bytes_read += read;
        Ok(gather(buf.as_slice()))
    }
}

impl ExpertExecutor for SsdTier {
    fn run(&self, call: ExpertCall<'_>, out: &mut [f32]) -> strata_model::Result<()> {
        SsdTier::run(self, call, out).map_err(|e| strata_model::Error::Executor(Box::new(e)))
    }
}

/// Puts `model`'s routed experts behind an SSD tier reading `path` (the file the model was
/// loaded from).
pub fn attach_ssd_tier(model: &mut Model, path: &Path, opts: &SsdOptions) -> Result<Arc<SsdTier>> {
    let tier = Arc::new(SsdTier::new(&model.moe_blocks(), path, opts)?);
    model.set_executor(Some(tier.clone() as Arc<dyn ExpertExecutor>));
    Ok(tier)
}
