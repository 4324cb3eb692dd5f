//! Device time per kernel (`STRATA_GPU_PROFILE=1`): each dispatch runs in a compute pass of
//! its own whose start and end write timestamps; a submission resolves them and the host
//! waits for it and adds each dispatch's time to its kernel's total. The waits and the pass
//! per dispatch slow a step down, so the totals say where device time goes, not how fast a
//! step runs unprofiled.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::{Error, KernelTimes, Result};

/// Timestamps a submission can hold: two per timed dispatch.
const QUERIES: u32 = wgpu::QUERY_SET_MAX_QUERIES;

#[derive(Debug)]
pub(super) struct KernelClock {
    set: wgpu::QuerySet,
    /// Where the queries resolve (device-only), then copied to `read`.
    resolve: wgpu::Buffer,
    read: wgpu::Buffer,
    /// Nanoseconds per timestamp tick.
    period_ns: f64,
    /// The kernels of the pending submission's timed dispatches, in query order.
    kernels: Vec<String>,
    totals: KernelTimes,
}

impl KernelClock {
    pub(super) fn new(device: &wgpu::Device, queue: &wgpu::Queue) -> KernelClock {
        let bytes = u64::from(QUERIES) * 8;
        let buffer = |label, usage| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes,
                usage,
                mapped_at_creation: false,
            })
        };
        KernelClock {
            set: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("kernel timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: QUERIES,
            }),
            resolve: buffer(
                "kernel timestamps resolved",
                wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            ),
            read: buffer(
                "kernel timestamps read",
                wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            ),
            period_ns: f64::from(queue.get_timestamp_period()),
            kernels: Vec::new(),
            totals: KernelTimes::default(),
        }
    }

    /// The timestamp writes of the pass for the next dispatch of `kernel`; `None` (and the
    /// dispatch counted as untimed) when this submission's queries are all taken.
    pub(super) fn next(&mut self, kernel: String) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        let first = 2 * self.kernels.len() as u32;
        if first + 2 > QUERIES {
            self.totals.untimed += 1;
            return None;
        }
        self.kernels.push(kernel);
        Some(wgpu::ComputePassTimestampWrites {
            query_set: &self.set,
            beginning_of_pass_write_index: Some(first),
            end_of_pass_write_index: Some(first + 1),
        })
    }

    /// Records the resolution of the pending submission's timestamps into `encoder`, the
    /// last commands before it is finished; returns their kernels for [`KernelClock::collect`].
    pub(super) fn resolve(&mut self, encoder: &mut wgpu::CommandEncoder) -> Vec<String> {
        let queries = 2 * self.kernels.len() as u32;
        if queries > 0 {
            encoder.resolve_query_set(&self.set, 0..queries, &self.resolve, 0);
            encoder.copy_buffer_to_buffer(&self.resolve, 0, &self.read, 0, u64::from(queries) * 8);
        }
        std::mem::take(&mut self.kernels)
    }

    /// After the submission that resolved `kernels`: waits for it and adds each dispatch's
    /// time to its kernel's total.
    pub(super) fn collect(&mut self, device: &wgpu::Device, kernels: &[String]) -> Result<()> {
        if kernels.is_empty() {
            return Ok(());
        }
        let bytes = kernels.len() as u64 * 16;
        let slice = self.read.slice(..bytes);
        let mapped = Arc::new(AtomicBool::new(false));
        let flag = mapped.clone();
        slice.map_async(wgpu::MapMode::Read, move |_| {
            flag.store(true, Ordering::Release)
        });
        // Not a wait of the step's: profiling's own, left out of `Traffic::wait_ns`.
        let uncounted = AtomicU64::new(0);
        let ready = || mapped.load(Ordering::Acquire);
        super::poll_until(device, Duration::ZERO, &uncounted, ready)?;
        let view = slice
            .get_mapped_range()
            .map_err(|e| Error::Device(format!("reading kernel timestamps: {e}")))?;
        for (kernel, pair) in kernels.iter().zip(view.chunks_exact(16)) {
            let tick = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
            let ticks = tick(&pair[8..]).saturating_sub(tick(&pair[..8]));
            self.totals
                .add(kernel, (ticks as f64 * self.period_ns) as u64);
        }
        drop(view);
        self.read.unmap();
        Ok(())
    }

    pub(super) fn totals(&self) -> KernelTimes {
        self.totals.clone()
    }
}
