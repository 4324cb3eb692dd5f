//! Reads experts from the model file into cache slots on a pool of threads: positioned reads
//! of whole pages, many in flight, with direct I/O where the file system takes it so the page
//! cache keeps no second copy of what the cache holds.
//!
//! A key design decision: a pool of threads doing `pread` rather than io_uring. It needs no
//! new dependency or kernel feature, keeps as many reads in flight as there are threads, and
//! at one expert per job (three reads of about a megabyte) the per-call cost of a system call
//! is small against the transfer. io_uring would save the threads, not disk time.

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
    direct: Option<File>,
    buffered: File,
    /// Cleared (with a note) the first time direct I/O is refused.
    use_direct: AtomicBool,
    note: Mutex<Option<String>>,
}

/// The read pool.
pub(crate) struct Reader {
    jobs: Option<Sender<ReadJob>>,
    done: Receiver<ReadDone>,
    threads: Vec<JoinHandle<()>>,
    files: Arc<Files>,
}

impl Reader {
    /// Opens `path` and starts `threads` readers.
    pub fn open(path: &Path, threads: usize) -> io::Result<Reader> {
        let buffered = File::open(path)?;
        let direct = open_direct(path);
        let note = match &direct {
            Ok(_) => None,
            Err(e) => Some(format!(
                "{}: direct I/O refused ({e}); buffered reads",
                path.display()
            )),
        };
        let files = Arc::new(Files {
            path: path.to_owned(),
            use_direct: AtomicBool::new(direct.is_ok()),
            direct: direct.ok(),
            buffered,
            note: Mutex::new(note),
        });
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
        Ok(Reader {
            jobs: Some(jobs),
            done,
            threads,
            files,
        })
    }

    /// Queues a read (reads start in the order they are queued).
    pub fn submit(&self, job: ReadJob) {
        if let Some(tx) = &self.jobs {
            // The workers live as long as the reader: a send cannot fail while it does.
            let _ = tx.send(job);
        }
    }

    /// The next finished read, waiting for one.
    pub fn wait(&self) -> Option<ReadDone> {
        self.done.recv().ok()
    }

    /// A finished read, if one is there.
    pub fn try_next(&self) -> Option<ReadDone> {
        self.done.try_recv().ok()
    }

    /// The file, for reads outside the pool ([`read_extents`]).
    pub fn files(&self) -> Arc<Files> {
        self.files.clone()
    }

    /// Whether reads bypass the page cache.
    pub fn direct(&self) -> bool {
        self.files.use_direct.load(Ordering::Relaxed)
    }

    /// Why reads are buffered, once (`None` after the first call, or when they are direct).
    pub fn take_note(&self) -> Option<String> {
        self.files.note.lock().ok()?.take()
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.jobs = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
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
        let direct = files.use_direct.load(Ordering::Relaxed);
        let file = match (&files.direct, direct) {
            (Some(f), true) => f,
            _ => &files.buffered,
        };
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

    #[test]
    fn reads_land_where_asked_and_a_short_file_is_an_error_naming_it() {
        let dir = std::env::temp_dir().join(format!("strata-reader-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.bin");
        let bytes: Vec<u8> = (0..3 * PAGE + 100).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let reader = Reader::open(&path, 2).unwrap();
        let ex = [
            extent(10, 500, 0),
            extent(PAGE as u64 + 3, 2 * PAGE as u64 + 9, PAGE),
            extent(3 * PAGE as u64, 3 * PAGE as u64 + 100, 3 * PAGE),
        ];
        let (buf, got) = read(&reader, ex.clone());
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
        let (_, got) = read(&reader, short);
        let e = got.expect_err("the file ends first");
        assert!(
            e.contains("model.bin") && e.contains("expert 2 of moe layer 1"),
            "{e}"
        );
        assert!(e.contains(&format!("at byte {}", 3 * PAGE + 50)), "{e}");
        drop(reader);
        std::fs::remove_dir_all(&dir).unwrap();
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
        let reader = Reader::open(&path, 1).unwrap();
        let mut off_grid = extent(0, 10, 0);
        off_grid.file_start = 100;
        off_grid.data = 100..120;
        let ex = [
            off_grid,
            extent(20, 30, PAGE),
            extent(PAGE as u64, 2 * PAGE as u64, 2 * PAGE),
        ];
        let (buf, got) = read(&reader, ex);
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
        drop(reader);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
