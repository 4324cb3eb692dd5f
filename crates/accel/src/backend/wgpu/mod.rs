//! The wgpu backend: Vulkan on Linux (Metal and DX12 through the `metal` and `dx12`
//! features), kernels in WGSL compiled once per weight type and cached.
//!
//! Key types: [`WgpuDevice`] (one adapter's device and queue, the pending command encoder,
//! the buffer pool) and `WgpuBuffer` (one logical buffer as one or more wgpu buffers, split
//! at row or slot boundaries when it exceeds the binding limit).
//!
//! Its parts: `adapter` finds adapters and what they can do, `buffers` holds the pool and
//! the transfers, `pipeline` compiles kernels and records dispatches, `ops` encodes each
//! [`Op`] as dispatches of its kernel.
//!
//! A key design decision made here is that the backend is chosen explicitly (no GL
//! adapter, never the silent fallback wgpu otherwise takes) and that every wgpu error is
//! captured by the device's error handler and returned from the next call, rather than
//! wgpu's default of panicking.

mod adapter;
mod attention;
mod buffers;
mod clock;
mod ops;
mod pipeline;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use adapter::enumerate;
use buffers::Pool;

use crate::device::{
    Buffer, Device, DeviceInfo, DeviceOptions, Event, MemoryUse, Op, Readback, WeightType,
};
use crate::{Error, Result, Traffic};

/// Locks `m`, recovering the data of a poisoned lock (every critical section leaves it
/// consistent).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The largest upload recorded through the staging belt (bigger ones, weights at load,
/// are written and submitted at once); also the belt's chunk size, so a DeepSeek-V3
/// expert in Q4_K (25 MB) is one staged copy.
const STAGED_MAX: u64 = 32 << 20;

/// Download buffers kept for reuse ([`WgpuDevice::download_slot`]), and the largest kept:
/// a decoded token's round trips (routing, logits) reuse them; a rare large download gets
/// its own.
const DOWNLOAD_SLOTS: usize = 8;
const DOWNLOAD_SLOT_MAX: u64 = 16 << 20;

/// How long a wait for submitted work polls before it is given up as never completing.
const POLL_LIMIT: Duration = Duration::from_secs(60);

/// Polls `device` until `done()`, first without blocking for `spin` (a blocking wait
/// sleeps until the driver wakes it: `STRATA_GPU_SPIN_US` trades a busy core for that
/// wake-up, for the hybrid layout's round trips), then blocking. A poll returns once the
/// work submitted before it has finished, but the callback saying so may still be running
/// on another thread that polled at the same time (the hybrid executor's threads all
/// poll), so one poll is not enough. The time it takes is added to `waited` (nanoseconds).
fn poll_until(
    device: &wgpu::Device,
    spin: Duration,
    waited: &AtomicU64,
    done: impl Fn() -> bool,
) -> Result<()> {
    let start = Instant::now();
    let result = poll_loop(device, spin, start, done);
    waited.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
    result
}

fn poll_loop(
    device: &wgpu::Device,
    spin: Duration,
    start: Instant,
    done: impl Fn() -> bool,
) -> Result<()> {
    while !done() && start.elapsed() < spin {
        device
            .poll(wgpu::PollType::Poll)
            .map_err(|e| Error::Device(e.to_string()))?;
        std::hint::spin_loop();
    }
    while !done() {
        if start.elapsed() > POLL_LIMIT {
            return Err(Error::Device(format!(
                "submitted work did not complete within {} s",
                POLL_LIMIT.as_secs()
            )));
        }
        device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Device(e.to_string()))?;
        if !done() {
            std::thread::yield_now();
        }
    }
    Ok(())
}

/// One wgpu device and its queue.
#[derive(Debug)]
pub struct WgpuDevice {
    info: DeviceInfo,
    device: wgpu::Device,
    queue: wgpu::Queue,
    max_binding: u64,
    device_binding: u64,
    /// Whether kernels reduce through subgroup operations.
    subgroups: bool,
    /// Whether quantized weights at many tokens take the tiled kernels.
    tiles: bool,
    pipelines: Mutex<HashMap<(&'static str, WeightType), wgpu::ComputePipeline>>,
    pending: Mutex<Option<pipeline::Pending>>,
    /// Host-visible memory the pending encoder copies uploads from.
    staging: Mutex<wgpu::util::StagingBelt>,
    /// The events of uploads that land with the next submission.
    landing: Mutex<Vec<Arc<AtomicBool>>>,
    binds: Mutex<pipeline::BindCache>,
    /// The uniform words of the pending encoder's dispatches.
    params: Mutex<pipeline::ParamArena>,
    /// Submissions and transfers so far.
    traffic: Mutex<Traffic>,
    /// [`Traffic::wait_ns`], added to by waits on any thread (a download's own).
    waited: Arc<AtomicU64>,
    /// Mappable buffers of finished downloads, free for the next ones.
    download_slots: Arc<Mutex<Vec<wgpu::Buffer>>>,
    /// Each kernel's device time, when profiling (`STRATA_GPU_PROFILE=1`).
    clock: Option<Mutex<clock::KernelClock>>,
    pool: Arc<Mutex<Pool>>,
    error: Arc<Mutex<Option<String>>>,
    dummy: wgpu::Buffer,
    /// Attention's partial states when it splits the context (`attention`).
    partials: Mutex<Option<Buffer>>,
    /// How long a wait polls without blocking first (`STRATA_GPU_SPIN_US`, default 0).
    spin: Duration,
}

impl WgpuDevice {
    /// Opens device `opts.index` of [`enumerate`].
    pub fn open(opts: &DeviceOptions) -> Result<WgpuDevice> {
        let found = adapter::adapters()?;
        let count = found.len();
        let adapter = found
            .into_iter()
            .nth(opts.index)
            .ok_or(Error::NoSuchDevice {
                index: opts.index,
                count,
            })?;
        let info = adapter::info_of(opts.index, &adapter);
        let limits = adapter.limits();
        let subgroups = info.subgroups && !opts.no_subgroups;
        let profile = std::env::var_os("STRATA_GPU_PROFILE").is_some_and(|v| v == "1");
        let spin = match std::env::var("STRATA_GPU_SPIN_US") {
            Ok(us) => Duration::from_micros(us.parse().map_err(|_| {
                Error::Device(format!(
                    "STRATA_GPU_SPIN_US={us}: not a number of microseconds"
                ))
            })?),
            Err(_) => Duration::ZERO,
        };
        if profile && !adapter.features().contains(wgpu::Features::TIMESTAMP_QUERY) {
            return Err(Error::Device(format!(
                "STRATA_GPU_PROFILE=1: {} cannot time kernels (no timestamp queries)",
                info.name
            )));
        }
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("strata"),
            required_features: (adapter.features() & wgpu::Features::SHADER_F16)
                | if subgroups {
                    wgpu::Features::SUBGROUP
                } else {
                    wgpu::Features::empty()
                }
                | if profile {
                    wgpu::Features::TIMESTAMP_QUERY
                } else {
                    wgpu::Features::empty()
                },
            required_limits: limits.clone(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| Error::Device(format!("cannot open {}: {e}", info.name)))?;
        let error = Arc::new(Mutex::new(None::<String>));
        let sink = error.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            let mut slot = lock(&sink);
            if slot.is_none() {
                *slot = Some(e.to_string());
            }
        }));
        let device_binding = limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size);
        let max_binding = opts.max_binding.unwrap_or(u64::MAX).min(device_binding);
        let dummy = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("unused binding"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let staging = Mutex::new(wgpu::util::StagingBelt::new(device.clone(), STAGED_MAX));
        let clock = profile.then(|| Mutex::new(clock::KernelClock::new(&device, &queue)));
        Ok(WgpuDevice {
            info,
            device,
            queue,
            max_binding,
            device_binding,
            subgroups,
            tiles: !opts.no_tiles,
            pipelines: Mutex::new(HashMap::new()),
            pending: Mutex::new(None),
            staging,
            landing: Mutex::default(),
            binds: Mutex::default(),
            params: Mutex::default(),
            traffic: Mutex::default(),
            waited: Arc::default(),
            download_slots: Arc::default(),
            clock,
            pool: Arc::new(Mutex::new(Pool::new(opts.vram_budget.unwrap_or(u64::MAX)))),
            error,
            dummy,
            partials: Mutex::new(None),
            spin,
        })
    }

    /// The first error wgpu reported since the last check, if any.
    fn check(&self) -> Result<()> {
        match lock(&self.error).take() {
            Some(e) => Err(Error::Device(e)),
            None => Ok(()),
        }
    }
}

impl Device for WgpuDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn memory(&self) -> MemoryUse {
        let p = lock(&self.pool);
        MemoryUse {
            live: p.live,
            pooled: p.pooled,
            budget: p.budget,
        }
    }

    fn traffic(&self) -> Traffic {
        Traffic {
            wait_ns: self.waited.load(Ordering::Relaxed),
            ..*lock(&self.traffic)
        }
    }

    fn prepare_kernels(&self, weights: &[WeightType]) {
        self.prepare(weights);
    }

    fn kernel_times(&self) -> Option<crate::KernelTimes> {
        self.clock.as_ref().map(|c| lock(c).totals())
    }

    fn alloc(&self, bytes: u64, granule: u64, label: &str) -> Result<Buffer> {
        self.alloc_buffer(bytes, granule, label)
    }

    fn upload(&self, buf: &Buffer, offset: u64, data: &[u8]) -> Result<Event> {
        let event = self.write(buf, offset, data)?;
        self.check()?;
        Ok(event)
    }

    fn download_async(&self, buf: &Buffer, offset: u64, len: u64) -> Result<Readback> {
        self.read_back(buf, offset, len)
    }

    fn copy(
        &self,
        src: &Buffer,
        src_offset: u64,
        dst: &Buffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        self.copy_bytes(src, src_offset, dst, dst_offset, len)
    }

    fn enqueue(&self, op: &Op<'_>) -> Result<()> {
        self.encode(op)?;
        self.check()
    }

    fn submit(&self) -> Result<Event> {
        self.submit_pending(false);
        let (event, flag) = Event::new();
        self.queue
            .on_submitted_work_done(move || flag.store(true, Ordering::Release));
        self.check()?;
        Ok(event)
    }

    fn wait(&self, event: &Event) -> Result<()> {
        // An upload's event lands with the submission after it: send that first.
        if !event.is_done() && !lock(&self.landing).is_empty() {
            self.submit_pending(false);
        }
        poll_until(&self.device, self.spin, &self.waited, || event.is_done())?;
        self.check()
    }

    fn poll(&self) -> Result<()> {
        self.device
            .poll(wgpu::PollType::Poll)
            .map_err(|e| Error::Device(e.to_string()))?;
        self.check()
    }
}
