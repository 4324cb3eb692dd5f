//! The thread pool that every parallel kernel runs on.
//!
//! [`parallel_for`] runs `f(i)` for every task index `i < n_tasks` and returns when all are done.
//! Tasks are claimed dynamically from a shared atomic counter, so skewed work (one expert with
//! many tokens) does not leave a core idle; the calling thread takes part.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Number of threads kernels run on (the machine's available parallelism, or `STRATA_THREADS`).
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
pub fn parallel_for(n_tasks: usize, f: impl Fn(usize) + Sync) {
    let threads = num_threads().min(n_tasks);
    if threads <= 1 {
        (0..n_tasks).for_each(f);
        return;
    }
    let next = AtomicUsize::new(0);
    let work = || {
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= n_tasks {
                break;
            }
            f(i);
        }
    };
    std::thread::scope(|s| {
        for _ in 1..threads {
            s.spawn(work);
        }
        work();
    });
}
