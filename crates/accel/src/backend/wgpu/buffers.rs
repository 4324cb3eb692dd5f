//! Buffers: the budgeted pool of wgpu buffers, one logical [`Buffer`] as chunks cut at
//! row or slot boundaries when it exceeds the binding limit, and the transfers between
//! host and device (upload, download, copy).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use super::{DOWNLOAD_SLOT_MAX, DOWNLOAD_SLOTS, STAGED_MAX, WgpuDevice, lock};
use crate::device::{Buffer, Event, RawBuffer, Readback};
use crate::{Error, Result};

/// Freed buffers kept for reuse, by size, and the bytes counted against the budget.
#[derive(Debug, Default)]
pub(super) struct Pool {
    pub(super) budget: u64,
    pub(super) live: u64,
    pub(super) pooled: u64,
    /// Pooled buffers destroyed to make room, so far (bind groups holding them are stale).
    pub(super) evictions: u64,
    free: HashMap<u64, Vec<wgpu::Buffer>>,
}

impl Pool {
    /// An empty pool under `budget` bytes.
    pub(super) fn new(budget: u64) -> Pool {
        Pool {
            budget,
            ..Pool::default()
        }
    }

    /// A buffer of exactly `size` bytes: a pooled one, or room for a new one (evicting
    /// pooled buffers first). `None` when the budget does not allow it.
    fn take(&mut self, size: u64) -> Option<Option<wgpu::Buffer>> {
        if let Some(b) = self.free.get_mut(&size).and_then(Vec::pop) {
            self.pooled -= size;
            self.live += size;
            return Some(Some(b));
        }
        while self.live + self.pooled + size > self.budget && self.pooled > 0 {
            let key = *self.free.iter().find(|(_, v)| !v.is_empty())?.0;
            if let Some(b) = self.free.get_mut(&key).and_then(Vec::pop) {
                b.destroy();
                self.pooled -= key;
                self.evictions += 1;
            }
        }
        if self.live + size > self.budget {
            return None;
        }
        self.live += size;
        Some(None)
    }

    fn give_back(&mut self, b: wgpu::Buffer) {
        let size = b.size();
        self.live -= size;
        self.pooled += size;
        self.free.entry(size).or_default().push(b);
    }
}

/// One logical buffer: wgpu buffers of `chunk_bytes` each (the last may be shorter).
#[derive(Debug)]
pub(super) struct WgpuBuffer {
    pub(super) chunks: Vec<wgpu::Buffer>,
    pub(super) chunk_bytes: u64,
    pool: Arc<Mutex<Pool>>,
}

impl RawBuffer for WgpuBuffer {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Drop for WgpuBuffer {
    fn drop(&mut self) {
        let mut pool = lock(&self.pool);
        for b in self.chunks.drain(..) {
            pool.give_back(b);
        }
    }
}

/// The least multiple of 4 bytes that is a multiple of the granule `g` (0 counts as 1).
fn lcm4(g: u64) -> u64 {
    let g = g.max(1);
    match g % 4 {
        0 => g,
        2 => g * 2,
        _ => g * 4,
    }
}

impl WgpuDevice {
    pub(super) fn raw<'a>(&self, b: &'a Buffer) -> Result<&'a WgpuBuffer> {
        b.raw()
            .as_any()
            .downcast_ref::<WgpuBuffer>()
            .ok_or_else(|| Error::Device("buffer belongs to another backend".into()))
    }

    /// The single binding of an activation buffer.
    pub(super) fn single<'a>(&self, b: &'a Buffer, what: &str) -> Result<&'a wgpu::Buffer> {
        let r = self.raw(b)?;
        match r.chunks.as_slice() {
            [one] => Ok(one),
            _ => Err(Error::Limit {
                what: format!("{what} buffer ({} bytes in one binding)", b.bytes()),
                got: b.bytes(),
                limit: self.device_binding,
            }),
        }
    }

    /// The binding of an optional input (a bias, a gate): its single binding, or the
    /// dummy buffer when absent, which the kernel never reads (the op passes it a flag).
    pub(super) fn single_or_dummy<'a>(
        &'a self,
        b: Option<&'a Buffer>,
        what: &str,
    ) -> Result<&'a wgpu::Buffer> {
        match b {
            Some(b) => self.single(b, what),
            None => Ok(&self.dummy),
        }
    }

    /// Pieces `(chunk, offset in chunk, length)` of `len` bytes from `offset`.
    fn pieces(&self, b: &Buffer, offset: u64, len: u64) -> Result<Vec<(usize, u64, u64)>> {
        if offset + len > b.bytes() {
            return Err(Error::Shape {
                op: "buffer access",
                message: format!(
                    "bytes {offset}..{} out of a {}-byte buffer",
                    offset + len,
                    b.bytes()
                ),
            });
        }
        let r = self.raw(b)?;
        let mut out = Vec::new();
        let (mut off, mut left) = (offset, len);
        while left > 0 {
            let c = (off / r.chunk_bytes) as usize;
            let within = off % r.chunk_bytes;
            let n = left.min(r.chunk_bytes - within);
            out.push((c, within, n));
            off += n;
            left -= n;
        }
        Ok(out)
    }

    /// [`crate::Device::alloc`].
    pub(super) fn alloc_buffer(&self, bytes: u64, granule: u64, label: &str) -> Result<Buffer> {
        let limit = if granule == 0 {
            self.device_binding
        } else {
            self.max_binding
        };
        let granule = lcm4(granule);
        let chunk_bytes = if bytes <= limit {
            bytes.next_multiple_of(4).max(16)
        } else {
            (limit / granule) * granule
        };
        if chunk_bytes == 0 {
            return Err(Error::Limit {
                what: format!("{label}: one row or slot"),
                got: granule,
                limit,
            });
        }
        let n_chunks = bytes.div_ceil(chunk_bytes).max(1);
        let sizes: Vec<u64> = (0..n_chunks)
            .map(|i| {
                (bytes - i * chunk_bytes.min(bytes))
                    .min(chunk_bytes)
                    .next_multiple_of(4)
                    .max(16)
            })
            .collect();
        let mut chunks = Vec::with_capacity(sizes.len());
        let pool = self.pool.clone();
        for &size in &sizes {
            let taken = lock(&pool).take(size);
            match taken {
                Some(Some(b)) => chunks.push(b),
                Some(None) => chunks.push(self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(label),
                    size,
                    usage: wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_DST
                        | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                })),
                None => {
                    let mut p = lock(&pool);
                    for b in chunks.drain(..) {
                        p.give_back(b);
                    }
                    return Err(Error::OutOfBudget {
                        label: label.to_string(),
                        requested: bytes,
                        used: p.live + p.pooled,
                        budget: p.budget,
                    });
                }
            }
        }
        self.check()?;
        Ok(Buffer::new(
            bytes,
            Box::new(WgpuBuffer {
                chunks,
                chunk_bytes,
                pool,
            }),
        ))
    }

    /// [`crate::Device::upload`]: up to [`STAGED_MAX`] bytes are copied into the staging
    /// belt and recorded in the pending encoder, in order with the work around them, and
    /// land with its submission (a cache miss's expert or a token's inputs cost no
    /// submission of their own); larger writes (weights at load) submit the pending work,
    /// then themselves, so their staging memory is released as they land.
    pub(super) fn write(&self, buf: &Buffer, offset: u64, data: &[u8]) -> Result<Event> {
        if !offset.is_multiple_of(4) {
            return Err(Error::Shape {
                op: "upload",
                message: format!("offset {offset} is not a multiple of 4"),
            });
        }
        let r = self.raw(buf)?;
        let pieces = self.pieces(buf, offset, data.len() as u64)?;
        lock(&self.traffic).uploaded += data.len() as u64;
        // Only the tail of a buffer can be ragged; its chunk has padding room.
        let padded = |part: &[u8]| {
            let mut v = part.to_vec();
            v.resize(part.len().next_multiple_of(4), 0);
            v
        };
        let (event, flag) = Event::new();
        if data.len() as u64 <= STAGED_MAX {
            let mut pending = self.pending();
            let enc = pending.as_mut().expect("pending() creates it").encoder();
            let mut belt = lock(&self.staging);
            let mut done = 0usize;
            for (c, off, n) in pieces {
                let part = &data[done..done + n as usize];
                let size =
                    wgpu::BufferSize::new(n.next_multiple_of(4)).expect("pieces are not empty");
                let mut view = belt.write_buffer(enc, &r.chunks[c], off, size);
                match n % 4 {
                    0 => view.copy_from_slice(part),
                    _ => view.copy_from_slice(&padded(part)),
                }
                done += n as usize;
            }
            lock(&self.landing).push(flag);
            return Ok(event);
        }
        // Work recorded before this upload must not see its bytes: send it first.
        self.submit_pending(false);
        let mut done = 0usize;
        for (c, off, n) in pieces {
            let part = &data[done..done + n as usize];
            match n % 4 {
                0 => self.queue.write_buffer(&r.chunks[c], off, part),
                _ => self.queue.write_buffer(&r.chunks[c], off, &padded(part)),
            }
            done += n as usize;
        }
        lock(&self.landing).push(flag);
        self.submit_pending(true);
        Ok(event)
    }

    /// [`crate::Device::download_async`].
    pub(super) fn read_back(&self, buf: &Buffer, offset: u64, len: u64) -> Result<Readback> {
        let r = self.raw(buf)?;
        let pieces = self.pieces(buf, offset, len)?;
        if !offset.is_multiple_of(4) {
            return Err(Error::Shape {
                op: "download",
                message: format!("offset {offset} is not a multiple of 4"),
            });
        }
        let staging = self.download_slot(len);
        {
            let mut pending = self.pending();
            let enc = pending.as_mut().expect("pending() creates it").encoder();
            let mut dst = 0;
            for (c, off, n) in pieces {
                let n4 = n.next_multiple_of(4).min(r.chunks[c].size() - off);
                enc.copy_buffer_to_buffer(&r.chunks[c], off, &staging, dst, n4);
                dst += n;
            }
        }
        self.submit_pending(false);
        let mut traffic = lock(&self.traffic);
        traffic.downloads += 1;
        traffic.downloaded += len;
        drop(traffic);
        let (event, flag) = Event::new();
        let result = Arc::new(Mutex::new(None));
        let sink = result.clone();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            *lock(&sink) = Some(r);
            flag.store(true, Ordering::Release);
        });
        self.check()?;
        let (device, errors, spin) = (self.device.clone(), self.error.clone(), self.spin);
        let (waited, slots) = (self.waited.clone(), self.download_slots.clone());
        let read = move || -> Result<Vec<u8>> {
            super::poll_until(&device, spin, &waited, || lock(&result).is_some())?;
            if let Some(e) = lock(&errors).take() {
                return Err(Error::Device(e));
            }
            match lock(&result).take() {
                Some(Ok(())) => {}
                Some(Err(e)) => return Err(Error::Device(format!("mapping a download: {e}"))),
                None => return Err(Error::Device("a download never completed".into())),
            }
            let view = staging
                .get_mapped_range(..)
                .map_err(|e| Error::Device(e.to_string()))?;
            let out = view[..len as usize].to_vec();
            drop(view);
            staging.unmap();
            let mut free = lock(&slots);
            if free.len() < DOWNLOAD_SLOTS && staging.size() <= DOWNLOAD_SLOT_MAX {
                free.push(staging);
            }
            Ok(out)
        };
        Ok(Readback::new(event, Box::new(read)))
    }

    /// A mappable buffer of at least `len` bytes for a download: a free one of its size
    /// class (a power of two from 4 KiB) kept by an earlier download, else a new one. A
    /// host round trip then costs no allocation of host-visible memory (a driver call each,
    /// with its release, when every download made its own buffer: 13 a decoded token in
    /// the hybrid layout).
    fn download_slot(&self, len: u64) -> wgpu::Buffer {
        // A download too large to be kept takes what it needs, not the next power of two.
        let size = match len.next_power_of_two().max(4096) {
            kept if kept <= DOWNLOAD_SLOT_MAX => kept,
            _ => len.next_multiple_of(4),
        };
        let mut free = lock(&self.download_slots);
        if let Some(i) = free.iter().position(|b| b.size() == size) {
            return free.swap_remove(i);
        }
        drop(free);
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("download"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// [`crate::Device::copy`].
    pub(super) fn copy_bytes(
        &self,
        src: &Buffer,
        src_offset: u64,
        dst: &Buffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        if !src_offset.is_multiple_of(4) || !dst_offset.is_multiple_of(4) || !len.is_multiple_of(4)
        {
            return Err(Error::Shape {
                op: "copy",
                message: format!(
                    "offsets {src_offset}, {dst_offset} and length {len} must be multiples of 4"
                ),
            });
        }
        let (rs, rd) = (self.raw(src)?, self.raw(dst)?);
        let mut pending = self.pending();
        let enc = pending.as_mut().expect("pending() creates it").encoder();
        let mut pos = 0;
        for (c, off, n) in self.pieces(src, src_offset, len)? {
            let mut left = n;
            let mut soff = off;
            while left > 0 {
                let (dc, doff, dn) = self.pieces(dst, dst_offset + pos, left)?[0];
                enc.copy_buffer_to_buffer(&rs.chunks[c], soff, &rd.chunks[dc], doff, dn);
                left -= dn;
                soff += dn;
                pos += dn;
            }
        }
        Ok(())
    }
}
