//! The persistent thread pool that every parallel kernel runs on.
//!
//! [`parallel_for`] runs `f(i)` for every task index `i < n_tasks` and returns when all are done.
//! Workers are created once (on first use), pinned one per core, and claim tasks from a shared
//! atomic counter, so skewed work (one expert with many tokens) does not leave a core idle; the
//! calling thread claims tasks too. Idle workers spin briefly, then park on a condition variable.
//!
//! A key design decision made here is the join protocol: a worker *joins* a job by incrementing a
//! reference count packed into the same atomic word as the job's epoch and a `closed` bit, with a
//! compare-and-swap that fails once the caller closed the job. The caller therefore never waits
//! for parked workers to wake up (small jobs finish on the caller alone if need be), yet can
//! prove that no worker still holds a reference to the job's closure when it returns.
//!
//! Nested calls (a task that itself calls [`parallel_for`]) run inline on the calling thread.
//! Calls from several threads at once are serialised by a lock: each gets the whole pool.

use std::any::Any;
use std::cell::{Cell, UnsafeCell};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Number of threads kernels run on (the calling thread's available parallelism, or
/// `STRATA_THREADS`).
pub fn num_threads() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("STRATA_THREADS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    })
}

/// Runs `f(i)` for every `i` in `0..n_tasks` across the pool's threads and waits for all.
///
/// Tasks are claimed dynamically, in increasing index order. If a task panics, the remaining
/// unclaimed tasks are skipped and the first panic is resumed on the caller once every thread
/// has left the job.
pub fn parallel_for(n_tasks: usize, f: impl Fn(usize) + Sync) {
    if n_tasks == 0 {
        return;
    }
    if n_tasks == 1 || num_threads() <= 1 || IN_POOL.get() {
        (0..n_tasks).for_each(f);
        return;
    }
    pool().run(n_tasks, &f);
}

/// Runs `f(i, chunk)` for every `chunk`-long piece of `data` (the last may be shorter), piece
/// `i` at `i * chunk`, across the pool's threads: a prompt's row-wise steps (norms, rotary
/// embeddings) in place.
pub fn parallel_chunks_mut<T: Send>(
    data: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    let chunk = chunk.max(1);
    let len = data.len();
    let shared = crate::buf::SharedMut::new(data);
    parallel_for(len.div_ceil(chunk), |i| {
        let start = i * chunk;
        // SAFETY: task `i` alone takes `start .. start + chunk` (within `data`).
        let piece = unsafe { shared.part(start, chunk.min(len - start)) };
        f(i, piece);
    });
}

thread_local! {
    /// True on pool workers and on a caller while it takes part in a job: nested calls run inline.
    static IN_POOL: Cell<bool> = const { Cell::new(false) };
}

/// How long an idle worker polls for the next job before parking (decode issues one job per
/// layer, well within this window, so back-to-back jobs never pay a wake-up).
const SPIN: Duration = Duration::from_micros(300);

/// Bits of [`Shared::state`]: epoch in the high 32 bits, then `closed`, then the join count.
const CLOSED: u64 = 1 << 31;
const COUNT_MASK: u64 = CLOSED - 1;

fn epoch_of(state: u64) -> u64 {
    state >> 32
}

/// Placeholder job before the first call.
fn noop(_: usize) {}
static NOOP: fn(usize) = noop;

/// A job's closure with its lifetime erased; see [`Pool::run`] for why that is sound.
type ErasedFn = *const (dyn Fn(usize) + Sync + 'static);

struct Job {
    f: ErasedFn,
    n: usize,
}

struct Shared {
    /// `epoch << 32 | closed << 31 | joined workers`.
    state: AtomicU64,
    /// The current job; written only while no worker can join (see [`Pool::run`]).
    job: UnsafeCell<Job>,
    /// Next unclaimed task index of the current job.
    next: AtomicUsize,
    /// First panic payload of the current job.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// Number of parked workers, guarded by the mutex the condition variable uses.
    sleepers: Mutex<usize>,
    wake: Condvar,
}

// SAFETY: `job` is the only non-Sync field. It is written by the caller only while the job is
// closed and no worker has joined (so nobody reads it), and read by workers only between a
// successful join and their leave; the acquire/release pairs on `state` order those accesses.
// The erased closure it points to is `Sync`, so calling it from several threads is allowed.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw pointer is only dereferenced under the join protocol.
unsafe impl Send for Shared {}

struct Pool {
    shared: &'static Shared,
    /// Serialises concurrent callers: one job at a time.
    submit: Mutex<()>,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            state: AtomicU64::new(CLOSED),
            job: UnsafeCell::new(Job {
                f: &NOOP as &(dyn Fn(usize) + Sync),
                n: 0,
            }),
            next: AtomicUsize::new(0),
            panic: Mutex::new(None),
            sleepers: Mutex::new(0),
            wake: Condvar::new(),
        }));
        let cpus = allowed_cpus();
        for w in 1..num_threads() {
            // Worker w takes the w-th allowed core; the caller keeps core 0 free to run on.
            let cpu = cpus.get(w % cpus.len().max(1)).copied();
            std::thread::Builder::new()
                .name(format!("strata-kernel-{w}"))
                .spawn(move || worker(shared, cpu))
                .expect("spawning a kernel worker thread");
        }
        Pool {
            shared,
            submit: Mutex::new(()),
        }
    })
}

impl Pool {
    fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        let _submit = self.submit.lock().unwrap_or_else(|e| e.into_inner());
        let s = self.shared;
        // SAFETY: only the lifetime is erased. The pointer is published to workers below and
        // this function does not return (nor unwind: `work` catches panics) before the job is
        // closed and the join count is back to zero, i.e. before every worker that could call
        // `f` has stopped using it. So `f` outlives every use of the erased pointer.
        let f_static: ErasedFn = unsafe {
            std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), ErasedFn>(
                f as *const (dyn Fn(usize) + Sync),
            )
        };
        let prev = s.state.load(Ordering::Acquire);
        debug_assert!(prev & CLOSED != 0 && prev & COUNT_MASK == 0);
        // SAFETY: the previous job is closed and nobody has joined it (we waited for the join
        // count to drop to zero before returning from the previous call, and joins fail while
        // closed), so no other thread reads `job` now; we hold `submit`, so no other writer.
        unsafe {
            *s.job.get() = Job { f: f_static, n };
        }
        s.next.store(0, Ordering::Relaxed);
        // Open the new epoch: the release publishes `job` and `next` to joining workers.
        s.state.store(
            ((epoch_of(prev) + 1) & 0xffff_ffff) << 32,
            Ordering::Release,
        );
        {
            let sleepers = s.sleepers.lock().unwrap_or_else(|e| e.into_inner());
            if *sleepers > 0 {
                s.wake.notify_all();
            }
        }
        IN_POOL.set(true);
        work(s, f, n);
        IN_POOL.set(false);
        // Close the job so no late worker joins, then wait for those that did to leave.
        s.state.fetch_or(CLOSED, Ordering::AcqRel);
        let mut spins = 0u32;
        while s.state.load(Ordering::Acquire) & COUNT_MASK != 0 {
            spins += 1;
            if spins < 1 << 12 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        let payload = s.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(p) = payload {
            resume_unwind(p);
        }
    }
}

/// Claims and runs tasks until none is left; a panic stops further claims and is recorded.
fn work(s: &Shared, f: &(dyn Fn(usize) + Sync), n: usize) {
    loop {
        let i = s.next.fetch_add(1, Ordering::Relaxed);
        if i >= n {
            return;
        }
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(i))) {
            s.next.fetch_max(n, Ordering::Relaxed);
            let mut slot = s.panic.lock().unwrap_or_else(|e| e.into_inner());
            if slot.is_none() {
                *slot = Some(p);
            }
            return;
        }
    }
}

fn worker(s: &'static Shared, cpu: Option<usize>) {
    if let Some(cpu) = cpu {
        pin_to_cpu(cpu);
    }
    IN_POOL.set(true);
    let mut seen = epoch_of(s.state.load(Ordering::Acquire));
    let mut deadline = Instant::now() + SPIN;
    let mut polls = 0u32;
    loop {
        let st = s.state.load(Ordering::Acquire);
        if epoch_of(st) == seen {
            polls = polls.wrapping_add(1);
            if polls.is_multiple_of(64) && Instant::now() > deadline {
                park(s, seen);
                deadline = Instant::now() + SPIN;
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        if st & CLOSED != 0 {
            // Finished before we looked: nothing to join.
            seen = epoch_of(st);
            continue;
        }
        if s.state
            .compare_exchange_weak(st, st + 1, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // Another worker joined or the caller closed meanwhile: look again.
            continue;
        }
        seen = epoch_of(st);
        // SAFETY: the join succeeded while the job was open, so the caller has published `job`
        // (acquire above) and will neither return nor overwrite it until we leave by
        // decrementing the count below.
        let (f, n) = unsafe {
            let job = &*s.job.get();
            (&*job.f, job.n)
        };
        work(s, f, n);
        s.state.fetch_sub(1, Ordering::Release);
        deadline = Instant::now() + SPIN;
    }
}

/// Sleeps until the epoch differs from `seen`.
fn park(s: &Shared, seen: u64) {
    let mut sleepers = s.sleepers.lock().unwrap_or_else(|e| e.into_inner());
    *sleepers += 1;
    // The caller stores the new epoch before taking this mutex to notify, so checking under the
    // mutex cannot miss a wake-up.
    while epoch_of(s.state.load(Ordering::Acquire)) == seen {
        sleepers = s.wake.wait(sleepers).unwrap_or_else(|e| e.into_inner());
    }
    *sleepers -= 1;
}

/// The CPUs the workers are pinned to, in order: `STRATA_CPUS` (`0-3,8`) where set, else
/// those the creating thread may run on. A host engine may pin that thread to one core of
/// several it gives the process (vLLM binds its main thread to the first of its OpenMP
/// cores); the list names the others.
fn allowed_cpus() -> Vec<usize> {
    match std::env::var("STRATA_CPUS")
        .ok()
        .map(|v| parse_cpu_list(&v))
    {
        Some(Some(cpus)) if !cpus.is_empty() => cpus,
        _ => thread_cpus(),
    }
}

/// `0-3,8` as `[0, 1, 2, 3, 8]`; `None` when malformed (the creating thread's CPUs then).
fn parse_cpu_list(list: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b) = (
            a.trim().parse::<usize>().ok()?,
            b.trim().parse::<usize>().ok()?,
        );
        if a > b || b >= 1 << 16 {
            return None;
        }
        cpus.extend(a..=b);
    }
    Some(cpus)
}

/// The CPUs the calling thread may run on, in increasing order.
fn thread_cpus() -> Vec<usize> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `cpu_set_t` is plain data; zeroed is a valid empty set, and
        // `sched_getaffinity` writes at most `size_of::<cpu_set_t>()` bytes into it.
        let set = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
                return Vec::new();
            }
            set
        };
        (0..libc::CPU_SETSIZE as usize)
            // SAFETY: `cpu` is below CPU_SETSIZE, the set's capacity.
            .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
            .collect()
    }
    #[cfg(not(target_os = "linux"))]
    {
        Vec::new()
    }
}

/// Pins the calling thread to `cpu`; failure (e.g. a restricted container) only costs locality.
fn pin_to_cpu(cpu: usize) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: as in `allowed_cpus`; `cpu` comes from the allowed set, below CPU_SETSIZE.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = cpu;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chunk_is_visited_once_with_its_index() {
        for (len, chunk) in [(0usize, 4usize), (10, 4), (12, 4), (5, 16), (7, 0)] {
            let mut v: Vec<usize> = vec![0; len];
            parallel_chunks_mut(&mut v, chunk, |i, piece| {
                for (j, x) in piece.iter_mut().enumerate() {
                    *x += i * chunk.max(1) + j + 1;
                }
            });
            let want: Vec<usize> = (1..=len).collect();
            assert_eq!(v, want, "len {len} chunk {chunk}");
        }
    }

    #[test]
    fn zeroed_vectors_are_zero_at_every_size() {
        for n in [0usize, 10, 1 << 16, (1 << 16) + 5, 300_001] {
            let v = crate::zeroed_f32(n);
            assert_eq!(v.len(), n);
            assert!(v.iter().all(|x| x.to_bits() == 0), "n {n}");
        }
    }

    #[test]
    fn cpu_lists_parse() {
        assert_eq!(parse_cpu_list("0-3,8"), Some(vec![0, 1, 2, 3, 8]));
        assert_eq!(parse_cpu_list(" 5 "), Some(vec![5]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("a"), None);
    }

    #[test]
    fn every_task_runs_exactly_once_over_many_small_calls() {
        for round in 0..2000 {
            let n = round % 37;
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            parallel_for(n, |i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            for (i, h) in hits.iter().enumerate() {
                assert_eq!(
                    h.load(Ordering::Relaxed),
                    1,
                    "task {i} of {n} in round {round}"
                );
            }
        }
    }

    #[test]
    fn concurrent_callers_and_nested_calls_complete() {
        let total = AtomicUsize::new(0);
        std::thread::scope(|sc| {
            for _ in 0..2 {
                sc.spawn(|| {
                    for _ in 0..300 {
                        parallel_for(8, |_| {
                            parallel_for(3, |_| {
                                total.fetch_add(1, Ordering::Relaxed);
                            });
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 2 * 300 * 8 * 3);
    }

    #[test]
    fn panic_propagates_after_all_tasks_stopped() {
        let ran = AtomicUsize::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            parallel_for(64, |i| {
                ran.fetch_add(1, Ordering::Relaxed);
                if i == 5 {
                    panic!("task five");
                }
            })
        }));
        let msg = r.expect_err("the panic must reach the caller");
        assert_eq!(msg.downcast_ref::<&str>(), Some(&"task five"));
        assert!(ran.load(Ordering::Relaxed) <= 64);
        // The pool still works afterwards.
        let count = AtomicUsize::new(0);
        parallel_for(100, |_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 100);
    }
}
