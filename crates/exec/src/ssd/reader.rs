//! Reads experts from the model file into cache slots: positioned reads of whole pages, many
//! in flight, with direct I/O where the file system takes it so the page cache keeps no
//! second copy of what the cache holds.
//!
//! Two ways to keep reads in flight: io_uring (`strata_formats::uring`), where the kernel
//! allows it, keeps as many extents in flight as the pool has threads, in the order queued,
//! from one thread; otherwise a pool of threads doing `pread` keeps one expert in flight per
//! thread. Both hand back the
//! same [`ReadDone`]; a read the ring could not finish (a refused direct read, a short file)
//! is done again with `pread` by [`read_extents`], so the fallbacks and error messages are
//! written once.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use strata_kernels::AlignedBuf;

use super::layout::Extent;
use super::store::Key;

/// One expert to read into a slot.
pub(crate) struct ReadJob {
    /// The expert.
    pub key: Key,
    /// The slot.
    pub slot: usize,
    /// The slot's buffer, held by this job alone until it comes back.
    pub buf: Arc<AlignedBuf>,
    /// Its gate, up and down matrices.
    pub extents: [Extent; 3],
}

/// A finished read: the buffer comes back whatever happened.
pub(crate) struct ReadDone {
    /// The slot.
    pub slot: usize,
    /// The slot's buffer.
    pub buf: Arc<AlignedBuf>,
    /// Bytes read, or what went wrong (naming the file and offset).
    pub result: Result<u64, String>,
    /// Seconds the read took.
    pub seconds: f64,
}

/// The file, opened for direct I/O where the file system allows it and for buffered reads.
pub(crate) struct Files {
    path: PathBuf,
    direct: Option<Arc<File>>,
    buffered: Arc<File>,
    /// Cleared (with a note) the first time direct I/O is refused.
    use_direct: AtomicBool,
    note: Mutex<Option<String>>,
}

impl Files {
    /// The file reads go to now: the direct one until direct reads are refused.
    fn current(&self) -> (&Arc<File>, bool) {
        let direct = self.use_direct.load(Ordering::Relaxed);
        match (&self.direct, direct) {
            (Some(f), true) => (f, true),
            _ => (&self.buffered, false),
        }
    }
}

/// What an expert's read carries through the ring.
type RingTag = (Key, usize, [Extent; 3]);

/// How reads are kept in flight.
enum Backend {
    /// io_uring: queued experts' extents, a fixed number in flight.
    #[cfg(target_os = "linux")]
    Ring(strata_formats::uring::Ring<RingTag>),
    /// A pool of threads, one expert each.
    Threads {
        jobs: Option<Sender<ReadJob>>,
        done: Receiver<ReadDone>,
        threads: Vec<JoinHandle<()>>,
    },
}

/// The reads of the SSD tier.
pub(crate) struct Reader {
    backend: Backend,
    files: Arc<Files>,
}

impl Reader {
    /// Opens `path` and starts reading through io_uring when `ring` asks for it and the
    /// kernel allows it (`depth` reads in flight), else on `threads` threads.
    pub fn open(path: &Path, threads: usize, ring: bool) -> io::Result<Reader> {
        let buffered = File::open(path)?;
        let direct = open_direct(path);
        let mut note = match &direct {
            Ok(_) => None,
            Err(e) => Some(format!(
                "{}: direct I/O refused ({e}); buffered reads",
                path.display()
            )),
        };
        let files = Arc::new(Files {
            path: path.to_owned(),
            use_direct: AtomicBool::new(direct.is_ok()),
            direct: direct.ok().map(Arc::new),
            buffered: Arc::new(buffered),
            note: Mutex::new(None),
        });
        // As many reads in flight as the pool has threads, started in the order queued: a
        // deeper ring spreads the drive over more experts, so each lands later (measured:
        // three reads per thread decoded 8-10% slower than the pool, docs/benchmarks.md).
        let depth = threads.max(1) as u32;
        let backend = match ring.then(|| open_ring(depth)) {
            Some(Ok(b)) => b,
            refused => {
                if let Some(Err(e)) = refused {
                    let why = format!("io_uring refused ({e}); reads on {threads} threads");
                    note = Some(note.map_or(why.clone(), |n| format!("{n}; {why}")));
                }
                start_threads(threads, &files)?
            }
        };
        if let Ok(mut n) = files.note.lock() {
            *n = note;
        }
        Ok(Reader { backend, files })
    }

    /// Queues a read (reads start in the order they are queued).
    pub fn submit(&self, job: ReadJob) {
        match &self.backend {
            #[cfg(target_os = "linux")]
            Backend::Ring(ring) => {
                let (file, _) = self.files.current();
                let reads = job.extents.iter().map(|x| strata_formats::uring::Read {
                    offset: x.file_start,
                    at: x.slot_at,
                    len: x.len,
                    needed: x.needed(),
                });
                let tag = (job.key, job.slot, job.extents.clone());
                ring.submit(tag, file.clone(), job.buf, reads.collect());
            }
            Backend::Threads { jobs, .. } => {
                if let Some(tx) = jobs {
                    // The workers live as long as the reader: a send cannot fail while it
                    // does.
                    let _ = tx.send(job);
                }
            }
        }
    }

    /// The next finished read, waiting for one.
    pub fn wait(&self) -> Option<ReadDone> {
        match &self.backend {
            #[cfg(target_os = "linux")]
            Backend::Ring(ring) => ring.wait().map(|d| self.ring_done(d)),
            Backend::Threads { done, .. } => done.recv().ok(),
        }
    }

    /// A finished read, if one is there.
    pub fn try_next(&self) -> Option<ReadDone> {
        match &self.backend {
            #[cfg(target_os = "linux")]
            Backend::Ring(ring) => ring.try_next().map(|d| self.ring_done(d)),
            Backend::Threads { done, .. } => done.try_recv().ok(),
        }
    }

    /// An expert the ring read: whole, or read again with `pread` where any of its reads
    /// failed or came back short (which then says why, or falls back to buffered reads).
    #[cfg(target_os = "linux")]
    fn ring_done(&self, d: strata_formats::uring::Done<RingTag>) -> ReadDone {
        let ((key, slot, extents), mut buf) = (d.tag, d.buf);
        let whole = d
            .got
            .iter()
            .zip(&extents)
            .all(|(g, x)| g.as_ref().is_ok_and(|&n| n >= x.needed()));
        let result = if whole {
            Ok(d.got.iter().map(|g| *g.as_ref().unwrap_or(&0) as u64).sum())
        } else {
            let mut job = ReadJob {
                key,
                slot,
                buf,
                extents,
            };
            let r = read_job(&self.files, &mut job);
            buf = job.buf;
            r
        };
        ReadDone {
            slot,
            buf,
            result,
            seconds: d.seconds,
        }
    }

    /// The file, for reads outside the pool ([`read_extents`]).
    pub fn files(&self) -> Arc<Files> {
        self.files.clone()
    }

    /// Whether reads bypass the page cache.
    pub fn direct(&self) -> bool {
        self.files.use_direct.load(Ordering::Relaxed)
    }

    /// Whether reads go through io_uring.
    pub fn ring(&self) -> bool {
        match self.backend {
            #[cfg(target_os = "linux")]
            Backend::Ring(_) => true,
            Backend::Threads { .. } => false,
        }
    }

    /// Why reads are buffered or on threads, once (`None` after the first call, or when they
    /// are direct through io_uring).
    pub fn take_note(&self) -> Option<String> {
        self.files.note.lock().ok()?.take()
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        if let Backend::Threads { jobs, threads, .. } = &mut self.backend {
            *jobs = None;
            for t in threads.drain(..) {
                let _ = t.join();
            }
        }
    }
}

#[cfg(target_os = "linux")]
fn open_ring(depth: u32) -> io::Result<Backend> {
    strata_formats::uring::Ring::new(depth).map(Backend::Ring)
}

#[cfg(not(target_os = "linux"))]
fn open_ring(_: u32) -> io::Result<Backend> {
    Err(io::Error::other("io_uring is Linux only"))
}

fn start_threads(threads: usize, files: &Arc<Files>) -> io::Result<Backend> {
    let (jobs, job_rx) = channel::<ReadJob>();
    let (done_tx, done) = channel();
    let job_rx = Arc::new(Mutex::new(job_rx));
    let threads = (0..threads.max(1))
        .map(|i| {
            let (rx, tx, files) = (job_rx.clone(), done_tx.clone(), files.clone());
            std::thread::Builder::new()
                .name(format!("strata-read-{i}"))
                .spawn(move || worker(&rx, &tx, &files))
        })
        .collect::<io::Result<Vec<_>>>()?;
    Ok(Backend::Threads {
        jobs: Some(jobs),
        done,
        threads,
    })
}

#[cfg(target_os = "linux")]
fn open_direct(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}

#[cfg(not(target_os = "linux"))]
fn open_direct(_: &Path) -> io::Result<File> {
    Err(io::Error::other("direct I/O is implemented for Linux only"))
}

fn worker(jobs: &Mutex<Receiver<ReadJob>>, done: &Sender<ReadDone>, files: &Files) {
    loop {
        let job = match jobs.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok(mut job) = job else { return };
        let start = Instant::now();
        let result = read_job(files, &mut job);
        let finished = ReadDone {
            slot: job.slot,
            buf: job.buf,
            result,
            seconds: start.elapsed().as_secs_f64(),
        };
        if done.send(finished).is_err() {
            return;
        }
    }
}

fn read_job(files: &Files, job: &mut ReadJob) -> Result<u64, String> {
    let bytes = Arc::get_mut(&mut job.buf)
        .ok_or_else(|| format!("slot {} is still in use: not refilled", job.slot))?
        .as_mut_slice();
    read_extents(files, job.key, &job.extents, bytes)
}

/// Reads expert `key`'s `extents` into `bytes` (a slot's buffer, page-aligned); the bytes
/// read, or what went wrong, naming the file and offset.
pub(crate) fn read_extents(
    files: &Files,
    (layer, expert): Key,
    extents: &[Extent; 3],
    bytes: &mut [u8],
) -> Result<u64, String> {
    let size = bytes.len();
    let mut total = 0u64;
    for x in extents {
        let dst = bytes.get_mut(x.slot_at..x.slot_at + x.len).ok_or_else(|| {
            format!(
                "a buffer of {size} bytes cannot hold a read of {} at {}",
                x.len, x.slot_at
            )
        })?;
        let got = read_pages(files, x.file_start, dst, x.needed()).map_err(|e| {
            format!(
                "{}: reading expert {expert} of moe layer {layer} at byte {}: {e}",
                files.path.display(),
                x.data.start
            )
        })?;
        if got < x.needed() {
            return Err(format!(
                "{}: expert {expert} of moe layer {layer}: {} bytes at byte {} expected, the file \
                 ends after {} (truncated or changed while running?)",
                files.path.display(),
                x.data.end - x.data.start,
                x.data.start,
                x.file_start + got as u64
            ));
        }
        total += got as u64;
    }
    Ok(total)
}

/// Reads from `offset` into `dst` until `needed` bytes are in or the file ends; direct I/O
/// first, buffered from the first refusal on.
fn read_pages(files: &Files, offset: u64, dst: &mut [u8], needed: usize) -> io::Result<usize> {
    let mut done = 0;
    while done < needed {
        let (file, direct) = files.current();
        match file.read_at(&mut dst[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
                files.use_direct.store(false, Ordering::Relaxed);
                if let Ok(mut note) = files.note.lock() {
                    *note = Some(format!(
                        "{}: direct reads refused ({e}); buffered reads",
                        files.path.display()
                    ));
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ssd::layout::PAGE;

    fn extent(start: u64, end: u64, slot_at: usize) -> Extent {
        let file_start = start / PAGE as u64 * PAGE as u64;
        Extent {
            file_start,
            len: (end as usize).next_multiple_of(PAGE) - file_start as usize,
            slot_at,
            data: start..end,
        }
    }

    fn read(reader: &Reader, extents: [Extent; 3]) -> (Arc<AlignedBuf>, Result<u64, String>) {
        let buf = Arc::new(AlignedBuf::zeroed_aligned(4 * PAGE, PAGE));
        reader.submit(ReadJob {
            key: (1, 2),
            slot: 0,
            buf,
            extents,
        });
        let done = reader.wait().expect("the pool answers");
        (done.buf, done.result)
    }

    /// The reader on each backend: the pool, then io_uring (said loudly where the kernel
    /// refuses it, whose reader then runs on threads).
    fn backends(path: &Path, threads: usize) -> Vec<Reader> {
        [false, true]
            .map(|ring| {
                let r = Reader::open(path, threads, ring).unwrap();
                if ring && !r.ring() {
                    eprintln!("NOT CHECKED: io_uring refused here: {:?}", r.take_note());
                }
                r
            })
            .into()
    }

    #[test]
    fn reads_land_where_asked_and_a_short_file_is_an_error_naming_it() {
        let dir = std::env::temp_dir().join(format!("strata-reader-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.bin");
        let bytes: Vec<u8> = (0..3 * PAGE + 100).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        for reader in backends(&path, 2) {
            reads_and_a_short_file(&reader, &bytes);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn reads_and_a_short_file(reader: &Reader, bytes: &[u8]) {
        let ex = [
            extent(10, 500, 0),
            extent(PAGE as u64 + 3, 2 * PAGE as u64 + 9, PAGE),
            extent(3 * PAGE as u64, 3 * PAGE as u64 + 100, 3 * PAGE),
        ];
        let (buf, got) = read(reader, ex.clone());
        got.expect("whole file");
        for x in &ex {
            let at = x.slot_data_start();
            let n = (x.data.end - x.data.start) as usize;
            assert_eq!(
                &buf.as_slice()[at..at + n],
                &bytes[x.data.start as usize..x.data.end as usize]
            );
        }
        // Past the end: an error that names the file, the expert and the offset.
        let mut short = ex;
        short[2] = extent(3 * PAGE as u64 + 50, 3 * PAGE as u64 + 200, 3 * PAGE);
        let (_, got) = read(reader, short);
        let e = got.expect_err("the file ends first");
        assert!(
            e.contains("model.bin") && e.contains("expert 2 of moe layer 1"),
            "{e}"
        );
        assert!(e.contains(&format!("at byte {}", 3 * PAGE + 50)), "{e}");
    }

    #[test]
    fn a_refused_direct_read_falls_back_to_buffered_reads_and_says_so_once() {
        // Disk file systems refuse a direct read at an offset off the page grid (EINVAL), as
        // network and FUSE file systems refuse direct reads altogether.
        let dir = std::env::temp_dir().join(format!("strata-reader-fb-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.bin");
        let bytes: Vec<u8> = (0..2 * PAGE).map(|i| (i % 13) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        for reader in backends(&path, 1) {
            if !reader.direct() {
                eprintln!("NOT CHECKED: {} refuses direct I/O at open", path.display());
                continue;
            }
            reader.take_note();
            falls_back_once(&reader, &bytes);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn falls_back_once(reader: &Reader, bytes: &[u8]) {
        let mut off_grid = extent(0, 10, 0);
        off_grid.file_start = 100;
        off_grid.data = 100..120;
        let ex = [
            off_grid,
            extent(20, 30, PAGE),
            extent(PAGE as u64, 2 * PAGE as u64, 2 * PAGE),
        ];
        let (buf, got) = read(reader, ex);
        got.expect("read, buffered");
        assert_eq!(&buf.as_slice()[..20], &bytes[100..120]);
        assert_eq!(&buf.as_slice()[2 * PAGE..3 * PAGE], &bytes[PAGE..]);
        assert!(!reader.direct(), "direct reads refused from then on");
        let note = reader.take_note().expect("the fallback is said");
        assert!(
            note.contains("buffered") && note.contains("model.bin"),
            "{note}"
        );
        assert_eq!(reader.take_note(), None, "and said once");
    }
}
