//! Positioned reads through io_uring: up to `depth` reads in flight, started in the order
//! they were queued, submitted and reaped by one thread, where a thread pool needs a thread
//! per read in flight. The SSD tier reads its experts this way where the kernel allows io_uring.
//!
//! A key design decision: the ring owns each buffer (an `Arc<AlignedBuf>` held by nobody
//! else) from submission until every read into it has completed, and only then hands it
//! back, so the kernel never writes into memory that safe code can reach; dropping the ring
//! waits for the reads in flight. Each read continues after a short count until its
//! `needed` bytes are in or the file ends, as `pread` loops do.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, TryRecvError, channel};
use std::thread::JoinHandle;
use std::time::Instant;

use io_uring::{IoUring, opcode, types};
use strata_kernels::AlignedBuf;

/// One read into a buffer: `len` bytes from the file's `offset` to the buffer's `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Read {
    /// File offset.
    pub offset: u64,
    /// Where the bytes land in the buffer.
    pub at: usize,
    /// Bytes asked for.
    pub len: usize,
    /// Bytes that must arrive unless the file ends first (at most `len`).
    pub needed: usize,
}

/// A finished buffer: it comes back whatever happened to its reads.
pub struct Done<T> {
    /// What the caller gave with it.
    pub tag: T,
    /// The buffer.
    pub buf: Arc<AlignedBuf>,
    /// Per read, the bytes in (fewer than `needed` only where the file ended), or its error.
    pub got: Vec<io::Result<usize>>,
    /// Seconds from submission to the last read's completion.
    pub seconds: f64,
}

/// A ring and the thread that drives it.
pub struct Ring<T: Send + 'static> {
    jobs: Option<Sender<Job<T>>>,
    done: Receiver<Done<T>>,
    wake: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

impl<T: Send + 'static> std::fmt::Debug for Ring<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring").finish_non_exhaustive()
    }
}

struct Job<T> {
    tag: T,
    file: Arc<File>,
    buf: Arc<AlignedBuf>,
    reads: Vec<Read>,
}

impl<T: Send + 'static> Ring<T> {
    /// A ring of `depth` reads in flight at most; an error where the kernel refuses io_uring
    /// (too old, disabled by `kernel.io_uring_disabled` or a seccomp filter).
    pub fn new(depth: u32) -> io::Result<Ring<T>> {
        let ring = IoUring::new(depth.max(2))?;
        // SAFETY: `eventfd` takes no pointers; a non-negative result is a new descriptor
        // that nothing else owns.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let wake = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
        let (jobs, job_rx) = channel();
        let (done_tx, done) = channel();
        let driver = Driver {
            ring,
            depth: depth.max(2) as usize,
            wake: wake.clone(),
            jobs: job_rx,
            done: done_tx,
            slots: Vec::new(),
            queue: VecDeque::new(),
            in_flight: 0,
            wake_buf: Box::new(0),
            wake_armed: false,
        };
        let thread = std::thread::Builder::new()
            .name("strata-uring".into())
            .spawn(move || driver.run())?;
        Ok(Ring {
            jobs: Some(jobs),
            done,
            wake,
            thread: Some(thread),
        })
    }

    /// Queues `reads` of `file` into `buf`, which comes back with `tag` in a [`Done`]. A
    /// buffer shared with anyone else, or a read past its end, comes back with an error for
    /// that read (nothing is read into it).
    pub fn submit(&self, tag: T, file: Arc<File>, buf: Arc<AlignedBuf>, reads: Vec<Read>) {
        if let Some(tx) = &self.jobs {
            // The driver lives as long as the ring: a send cannot fail while it does.
            let _ = tx.send(Job {
                tag,
                file,
                buf,
                reads,
            });
            wake(&self.wake);
        }
    }

    /// The next finished buffer, waiting for one.
    pub fn wait(&self) -> Option<Done<T>> {
        self.done.recv().ok()
    }

    /// A finished buffer, if one is there.
    pub fn try_next(&self) -> Option<Done<T>> {
        self.done.try_recv().ok()
    }
}

impl<T: Send + 'static> Drop for Ring<T> {
    fn drop(&mut self) {
        self.jobs = None;
        wake(&self.wake);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Adds one to the event counter, completing the driver's pending read of it.
fn wake(fd: &OwnedFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writes 8 bytes from a live local array to a descriptor this ring owns.
    unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
}

/// `user_data` of the event counter's read.
const WAKE: u64 = u64::MAX;

/// A submitted buffer while its reads are in flight.
struct Slot<T> {
    job: Job<T>,
    /// The buffer's first byte, taken once through the unique `Arc`.
    base: *mut u8,
    got: Vec<io::Result<usize>>,
    /// Reads not finished.
    pending: usize,
    started: Instant,
}

struct Driver<T> {
    ring: IoUring,
    depth: usize,
    wake: Arc<OwnedFd>,
    jobs: Receiver<Job<T>>,
    done: Sender<Done<T>>,
    slots: Vec<Option<Slot<T>>>,
    /// Reads (slot, read) waiting for room in the ring.
    queue: VecDeque<(usize, usize)>,
    in_flight: usize,
    wake_buf: Box<u64>,
    wake_armed: bool,
}

// SAFETY: `Slot::base` points into the slot's own buffer, which the driver alone reaches
// while the slot lives; the rest is `Send` as `T` is.
unsafe impl<T: Send> Send for Driver<T> {}

impl<T: Send + 'static> Driver<T> {
    fn run(mut self) {
        let mut open = true;
        loop {
            loop {
                match self.jobs.try_recv() {
                    Ok(job) => self.accept(job),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            }
            // Armed after the channel is drained, so that a ring being dropped is seen
            // before another read of the counter would wait for a wake that never comes.
            if open && !self.wake_armed {
                self.arm_wake();
            }
            self.push_queued();
            if !open && self.in_flight == 0 && !self.wake_armed {
                return;
            }
            if let Err(e) = self.ring.submit_and_wait(1)
                && e.kind() != io::ErrorKind::Interrupted
            {
                self.fail_all(&e);
                return;
            }
            self.reap();
        }
    }

    fn arm_wake(&mut self) {
        let entry = opcode::Read::new(
            types::Fd(self.wake.as_raw_fd()),
            (&mut *self.wake_buf as *mut u64).cast(),
            8,
        )
        .build()
        .user_data(WAKE);
        // SAFETY: the 8-byte buffer is boxed in the driver, which outlives the read: the
        // driver returns only once this read has completed (`wake_armed` false).
        if unsafe { self.ring.submission().push(&entry) }.is_ok() {
            self.wake_armed = true;
            self.in_flight += 1;
        }
    }

    fn accept(&mut self, mut job: Job<T>) {
        let n = job.reads.len();
        let mut got: Vec<io::Result<usize>> = (0..n).map(|_| Ok(0)).collect();
        let base = match Arc::get_mut(&mut job.buf) {
            Some(b) => b.as_mut_slice().as_mut_ptr(),
            None => {
                let e = || io::Error::other("the buffer is shared: not read into");
                got.iter_mut().for_each(|g| *g = Err(e()));
                std::ptr::null_mut()
            }
        };
        let len = job.buf.len();
        let mut pending = 0;
        let i = self.free_slot();
        for (r, read) in job.reads.iter().enumerate() {
            if base.is_null() {
                continue;
            }
            if read.needed > read.len || read.at.checked_add(read.len).is_none_or(|e| e > len) {
                got[r] = Err(io::Error::other(format!(
                    "a read of {} bytes at {} does not fit a buffer of {len}",
                    read.len, read.at
                )));
                continue;
            }
            pending += 1;
            self.queue.push_back((i, r));
        }
        self.slots[i] = Some(Slot {
            job,
            base,
            got,
            pending,
            started: Instant::now(),
        });
        if pending == 0 {
            self.finish(i);
        }
    }

    fn free_slot(&mut self) -> usize {
        match self.slots.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        }
    }

    /// Moves queued reads into the ring while it has room.
    fn push_queued(&mut self) {
        while self.in_flight < self.depth
            && let Some(&(i, r)) = self.queue.front()
        {
            let slot = self.slots[i].as_ref().expect("a queued read's slot lives");
            let read = slot.job.reads[r];
            let done = *slot.got[r].as_ref().expect("a queued read has not failed");
            let entry = opcode::Read::new(
                types::Fd(slot.job.file.as_raw_fd()),
                // SAFETY: `at + len` was checked against the buffer's length at `accept`,
                // and `done < len`.
                unsafe { slot.base.add(read.at + done) },
                (read.len - done) as u32,
            )
            .offset(read.offset + done as u64)
            .build()
            .user_data(((i as u64) << 16) | r as u64);
            // SAFETY: the destination lies in the slot's buffer (checked at `accept`), which
            // only the driver reaches and which is handed back only after this read's
            // completion; the file stays open as the slot holds it.
            if unsafe { self.ring.submission().push(&entry) }.is_err() {
                return;
            }
            self.queue.pop_front();
            self.in_flight += 1;
        }
    }

    fn reap(&mut self) {
        let completed: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (data, res) in completed {
            self.in_flight -= 1;
            if data == WAKE {
                self.wake_armed = false;
                continue;
            }
            let (i, r) = ((data >> 16) as usize, (data & 0xffff) as usize);
            let slot = self.slots[i].as_mut().expect("a completion's slot lives");
            let read = slot.job.reads[r];
            let got = &mut slot.got[r];
            let finished = match res {
                n if n > 0 => {
                    let total = got.as_ref().map_or(0, |d| *d) + n as usize;
                    *got = Ok(total);
                    total >= read.needed || total >= read.len
                }
                0 => true,
                e if e == -libc::EINTR || e == -libc::EAGAIN => false,
                e => {
                    *got = Err(io::Error::from_raw_os_error(-e));
                    true
                }
            };
            if !finished {
                self.queue.push_back((i, r));
                continue;
            }
            slot.pending -= 1;
            if slot.pending == 0 {
                self.finish(i);
            }
        }
    }

    fn finish(&mut self, i: usize) {
        let slot = self.slots[i].take().expect("a finished slot lives");
        let _ = self.done.send(Done {
            tag: slot.job.tag,
            buf: slot.job.buf,
            got: slot.got,
            seconds: slot.started.elapsed().as_secs_f64(),
        });
    }

    /// The ring itself failed: waits out what the kernel still holds, then hands every
    /// buffer back with the error.
    fn fail_all(&mut self, e: &io::Error) {
        while self.in_flight > 0 {
            if self.ring.submit_and_wait(1).is_err() {
                // Nothing more can be learnt: keep the buffers (leaked) rather than hand
                // back memory the kernel may still write.
                self.slots.drain(..).for_each(std::mem::forget);
                std::mem::forget(std::mem::take(&mut self.wake_buf));
                return;
            }
            let n = self.ring.completion().count();
            self.in_flight -= n;
        }
        self.queue.clear();
        for i in 0..self.slots.len() {
            if let Some(slot) = self.slots[i].as_mut() {
                for g in &mut slot.got {
                    *g = Err(io::Error::new(e.kind(), format!("io_uring: {e}")));
                }
                self.finish(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = 4096;

    fn ring_or_skip() -> Option<Ring<u32>> {
        match Ring::new(8) {
            Ok(r) => Some(r),
            Err(e) => {
                eprintln!("NOT CHECKED: this kernel refuses io_uring ({e})");
                None
            }
        }
    }

    #[test]
    fn reads_land_where_asked_stop_at_the_end_and_give_the_buffer_back() {
        let Some(ring) = ring_or_skip() else { return };
        let dir = std::env::temp_dir().join(format!("strata-uring-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("file.bin");
        let bytes: Vec<u8> = (0..5 * PAGE + 123).map(|i| (i * 31 % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let file = Arc::new(File::open(&path).unwrap());
        // More buffers than the ring's depth, each of three reads, the last past the end.
        for round in 0..20u32 {
            let buf = Arc::new(AlignedBuf::zeroed_aligned(4 * PAGE, PAGE));
            let reads = vec![
                Read {
                    offset: PAGE as u64,
                    at: 0,
                    len: 2 * PAGE,
                    needed: 2 * PAGE,
                },
                Read {
                    offset: 0,
                    at: 2 * PAGE,
                    len: PAGE,
                    needed: 100,
                },
                Read {
                    offset: 5 * PAGE as u64,
                    at: 3 * PAGE,
                    len: PAGE,
                    needed: PAGE,
                },
            ];
            ring.submit(round, file.clone(), buf, reads);
        }
        let mut seen = Vec::new();
        for _ in 0..20 {
            let d = ring.wait().expect("the ring answers");
            let got: Vec<usize> = d.got.iter().map(|g| *g.as_ref().unwrap()).collect();
            assert_eq!(
                got,
                [2 * PAGE, PAGE, 123],
                "the file ends inside the last read"
            );
            let b = d.buf.as_slice();
            assert_eq!(&b[..2 * PAGE], &bytes[PAGE..3 * PAGE]);
            assert_eq!(&b[2 * PAGE..3 * PAGE], &bytes[..PAGE]);
            assert_eq!(&b[3 * PAGE..3 * PAGE + 123], &bytes[5 * PAGE..]);
            assert!(
                Arc::strong_count(&d.buf) == 1,
                "the ring keeps no reference"
            );
            seen.push(d.tag);
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..20).collect::<Vec<_>>());
        // A shared buffer and a read past the buffer come back with errors, unread.
        let shared = Arc::new(AlignedBuf::zeroed_aligned(PAGE, PAGE));
        let read = |at, len| Read {
            offset: 0,
            at,
            len,
            needed: len,
        };
        ring.submit(7, file.clone(), shared.clone(), vec![read(0, PAGE)]);
        let d = ring.wait().unwrap();
        assert!(
            d.got[0]
                .as_ref()
                .unwrap_err()
                .to_string()
                .contains("shared")
        );
        let alone = Arc::new(AlignedBuf::zeroed_aligned(PAGE, PAGE));
        ring.submit(8, file, alone, vec![read(PAGE / 2, PAGE), read(0, 10)]);
        let d = ring.wait().unwrap();
        assert!(
            d.got[0]
                .as_ref()
                .unwrap_err()
                .to_string()
                .contains("does not fit")
        );
        assert_eq!(*d.got[1].as_ref().unwrap(), 10);
        drop(ring);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_read_error_comes_back_with_its_buffer() {
        let Some(ring) = ring_or_skip() else { return };
        // A directory opened for reading: `read` fails with EISDIR.
        let file = Arc::new(File::open(std::env::temp_dir()).unwrap());
        let buf = Arc::new(AlignedBuf::zeroed_aligned(PAGE, PAGE));
        let read = Read {
            offset: 0,
            at: 0,
            len: PAGE,
            needed: PAGE,
        };
        ring.submit(1, file, buf, vec![read]);
        let d = ring.wait().unwrap();
        let e = d.got[0].as_ref().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EISDIR), "{e}");
        assert_eq!(d.buf.len(), PAGE);
    }
}
