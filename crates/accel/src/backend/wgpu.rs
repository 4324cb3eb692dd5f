//! The wgpu backend: Vulkan on Linux (Metal and DX12 through the `metal` and `dx12`
//! features), kernels in WGSL compiled once per weight type and cached.
//!
//! Key types: [`WgpuDevice`] (one adapter's device and queue, the pending command encoder,
//! the buffer pool) and `WgpuBuffer` (one logical buffer as one or more wgpu buffers, split
//! at row or slot boundaries when it exceeds the binding limit).
//!
//! A key design decision made here is that the backend is chosen explicitly (no GL
//! adapter, never the silent fallback wgpu otherwise takes) and that every wgpu error is
//! captured by the device's error handler and returned from the next call, rather than
//! wgpu's default of panicking.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use wgpu::util::DeviceExt;

use crate::device::{
    Buffer, Device, DeviceInfo, DeviceOptions, Event, MemoryUse, Op, OpKind, RawBuffer, Readback,
    RopeKind, WeightType,
};
use crate::{Error, Result};

const PRELUDE: &str = include_str!("../shaders/prelude.wgsl");

/// Kernels by name: WGSL source.
const KERNELS: &[(&str, &str)] = &[
    ("embed", include_str!("../shaders/embed.wgsl")),
    ("matmul", include_str!("../shaders/matmul.wgsl")),
    ("rms_norm", include_str!("../shaders/rms_norm.wgsl")),
    ("rope", include_str!("../shaders/rope.wgsl")),
    ("attention", include_str!("../shaders/attention.wgsl")),
    (
        "mla_attention",
        include_str!("../shaders/mla_attention.wgsl"),
    ),
    ("elementwise", include_str!("../shaders/elementwise.wgsl")),
    ("topk", include_str!("../shaders/topk.wgsl")),
    ("expert_ffn", include_str!("../shaders/expert_ffn.wgsl")),
    ("moe_combine", include_str!("../shaders/moe_combine.wgsl")),
];

const ALL_WTYPES: [WeightType; 3] = [WeightType::F32, WeightType::Bf16, WeightType::F16];

/// Graphics APIs this build searches.
fn backends() -> wgpu::Backends {
    let mut b = wgpu::Backends::VULKAN;
    if cfg!(feature = "metal") {
        b |= wgpu::Backends::METAL;
    }
    if cfg!(feature = "dx12") {
        b |= wgpu::Backends::DX12;
    }
    b
}

fn api_names() -> String {
    let mut names = vec!["Vulkan"];
    if cfg!(feature = "metal") {
        names.push("Metal");
    }
    if cfg!(feature = "dx12") {
        names.push("DX12");
    }
    names.join("/")
}

fn adapters() -> Result<Vec<wgpu::Adapter>> {
    if wgpu::Instance::enabled_backend_features().is_empty() {
        return Err(Error::NoAdapter {
            apis: api_names(),
            hint: "this platform has none of the compiled-in graphics APIs (enable the `metal` or `dx12` feature)",
        });
    }
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backends();
    let instance = wgpu::Instance::new(desc);
    let mut found = pollster::block_on(instance.enumerate_adapters(backends()));
    // Real GPUs first: device 0 is the best one even when lavapipe is installed too.
    found.sort_by_key(|a| match a.get_info().device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    });
    if found.is_empty() {
        return Err(Error::NoAdapter {
            apis: api_names(),
            hint: "install a Vulkan driver (Debian/Ubuntu: `apt install mesa-vulkan-drivers` gives lavapipe, a CPU implementation)",
        });
    }
    Ok(found)
}

fn info_of(index: usize, adapter: &wgpu::Adapter) -> DeviceInfo {
    let a = adapter.get_info();
    let limits = adapter.limits();
    let features = adapter.features();
    let ops = [
        OpKind::RmsNorm,
        OpKind::Rope,
        OpKind::Attention,
        OpKind::MlaAttention,
        OpKind::SiluMul,
        OpKind::Add,
        OpKind::TopK,
        OpKind::MoeCombine,
    ]
    .into_iter()
    .chain(
        ALL_WTYPES
            .iter()
            .flat_map(|&t| [OpKind::Embed(t), OpKind::Matmul(t), OpKind::ExpertFfn(t)]),
    )
    .collect();
    DeviceInfo {
        index,
        name: a.name,
        backend: format!("wgpu/{:?}", a.backend),
        device_type: format!("{:?}", a.device_type),
        driver: format!("{} {}", a.driver, a.driver_info).trim().to_string(),
        memory: None,
        max_binding: limits.max_storage_buffer_binding_size,
        max_buffer: limits.max_buffer_size,
        shader_f16: features.contains(wgpu::Features::SHADER_F16),
        subgroups: features.contains(wgpu::Features::SUBGROUP),
        ops,
    }
}

/// Every adapter of the compiled-in APIs.
pub fn enumerate() -> Result<Vec<DeviceInfo>> {
    Ok(adapters()?
        .iter()
        .enumerate()
        .map(|(i, a)| info_of(i, a))
        .collect())
}

#[derive(Debug, Default)]
struct Pool {
    budget: u64,
    live: u64,
    pooled: u64,
    free: HashMap<u64, Vec<wgpu::Buffer>>,
}

impl Pool {
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One logical buffer: wgpu buffers of `chunk_bytes` each (the last may be shorter).
#[derive(Debug)]
struct WgpuBuffer {
    chunks: Vec<wgpu::Buffer>,
    chunk_bytes: u64,
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

/// One wgpu device and its queue.
#[derive(Debug)]
pub struct WgpuDevice {
    info: DeviceInfo,
    device: wgpu::Device,
    queue: wgpu::Queue,
    max_binding: u64,
    device_binding: u64,
    pipelines: Mutex<HashMap<(&'static str, WeightType), wgpu::ComputePipeline>>,
    pending: Mutex<Option<wgpu::CommandEncoder>>,
    pool: Arc<Mutex<Pool>>,
    error: Arc<Mutex<Option<String>>>,
    dummy: wgpu::Buffer,
}

impl WgpuDevice {
    /// Opens device `opts.index` of [`enumerate`].
    pub fn open(opts: &DeviceOptions) -> Result<WgpuDevice> {
        let found = adapters()?;
        let count = found.len();
        let adapter = found
            .into_iter()
            .nth(opts.index)
            .ok_or(Error::NoSuchDevice {
                index: opts.index,
                count,
            })?;
        let info = info_of(opts.index, &adapter);
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("strata"),
            required_features: wgpu::Features::empty(),
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
        Ok(WgpuDevice {
            info,
            device,
            queue,
            max_binding,
            device_binding,
            pipelines: Mutex::new(HashMap::new()),
            pending: Mutex::new(None),
            pool: Arc::new(Mutex::new(Pool {
                budget: opts.vram_budget.unwrap_or(u64::MAX),
                ..Pool::default()
            })),
            error,
            dummy,
        })
    }

    fn check(&self) -> Result<()> {
        match lock(&self.error).take() {
            Some(e) => Err(Error::Device(e)),
            None => Ok(()),
        }
    }

    fn raw<'a>(&self, b: &'a Buffer) -> Result<&'a WgpuBuffer> {
        b.raw()
            .as_any()
            .downcast_ref::<WgpuBuffer>()
            .ok_or_else(|| Error::Device("buffer belongs to another backend".into()))
    }

    /// The single binding of an activation buffer.
    fn single<'a>(&self, b: &'a Buffer, what: &str) -> Result<&'a wgpu::Buffer> {
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

    fn pipeline(&self, name: &'static str, wtype: WeightType) -> Result<wgpu::ComputePipeline> {
        let mut cache = lock(&self.pipelines);
        if let Some(p) = cache.get(&(name, wtype)) {
            return Ok(p.clone());
        }
        let body = KERNELS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| *s)
            .ok_or_else(|| Error::Unsupported(name.to_string()))?;
        let code = match wtype {
            WeightType::F32 => "0",
            WeightType::Bf16 => "1",
            WeightType::F16 => "2",
        };
        let src = format!("{}\n{body}", PRELUDE.replace("__WTYPE__", code));
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(name),
                source: wgpu::ShaderSource::Wgsl(src.into()),
            });
        let p = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(name),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
        self.check()?;
        cache.insert((name, wtype), p.clone());
        Ok(p)
    }

    fn encoder(&self) -> MutexGuard<'_, Option<wgpu::CommandEncoder>> {
        let mut g = lock(&self.pending);
        if g.is_none() {
            *g = Some(
                self.device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None }),
            );
        }
        g
    }

    /// Records one dispatch of `name` with a uniform of `params` words and `buffers` at
    /// bindings 1...
    fn dispatch(
        &self,
        name: &'static str,
        wtype: WeightType,
        params: &[u32],
        buffers: &[&wgpu::Buffer],
        groups: (u32, u32),
    ) -> Result<()> {
        if groups.0 == 0 || groups.1 == 0 {
            return Ok(());
        }
        let limit = self.device.limits().max_compute_workgroups_per_dimension;
        if groups.0 > limit || groups.1 > limit {
            return Err(Error::Limit {
                what: format!("{name} workgroups"),
                got: groups.0.max(groups.1) as u64,
                limit: limit as u64,
            });
        }
        let pipeline = self.pipeline(name, wtype)?;
        let mut words = params.to_vec();
        words.resize(params.len().div_ceil(4).max(1) * 4, 0);
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let uniform = self
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(name),
                contents: &bytes,
                usage: wgpu::BufferUsages::UNIFORM,
            });
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: uniform.as_entire_binding(),
        }];
        for (i, b) in buffers.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: b.as_entire_binding(),
            });
        }
        let bind = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(name),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        let mut enc = self.encoder();
        let enc = enc.as_mut().expect("encoder() creates one");
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(name),
            timestamp_writes: None,
        });
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(groups.0, groups.1, 1);
        drop(pass);
        Ok(())
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

    fn flush_pending(&self) {
        if let Some(enc) = lock(&self.pending).take() {
            self.queue.submit([enc.finish()]);
        }
    }
}

/// Linear dispatch of `n` invocations in workgroups of 64, folded into y past 65535.
fn linear_groups(n: u64) -> (u32, u32) {
    let groups = n.div_ceil(64);
    let x = groups.min(65535);
    (x as u32, groups.div_ceil(x.max(1)) as u32)
}

fn rows_groups(rows: u32) -> (u32, u32) {
    let x = rows.min(65535);
    (x, rows.div_ceil(x.max(1)))
}

fn lcm4(g: u64) -> u64 {
    let g = g.max(1);
    match g % 4 {
        0 => g,
        2 => g * 2,
        _ => g * 4,
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

    fn alloc(&self, bytes: u64, granule: u64, label: &str) -> Result<Buffer> {
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

    fn upload(&self, buf: &Buffer, offset: u64, data: &[u8]) -> Result<Event> {
        if !offset.is_multiple_of(4) {
            return Err(Error::Shape {
                op: "upload",
                message: format!("offset {offset} is not a multiple of 4"),
            });
        }
        let r = self.raw(buf)?;
        // Work recorded before this upload must not see its bytes: send it first.
        self.flush_pending();
        let mut done = 0usize;
        for (c, off, n) in self.pieces(buf, offset, data.len() as u64)? {
            let part = &data[done..done + n as usize];
            if n % 4 == 0 {
                self.queue.write_buffer(&r.chunks[c], off, part);
            } else {
                // Only the tail of a buffer can be ragged; its chunk has padding room.
                let mut padded = part.to_vec();
                padded.resize(part.len().next_multiple_of(4), 0);
                self.queue.write_buffer(&r.chunks[c], off, &padded);
            }
            done += n as usize;
        }
        self.submit()
    }

    fn download_async(&self, buf: &Buffer, offset: u64, len: u64) -> Result<Readback> {
        let r = self.raw(buf)?;
        let pieces = self.pieces(buf, offset, len)?;
        if !offset.is_multiple_of(4) {
            return Err(Error::Shape {
                op: "download",
                message: format!("offset {offset} is not a multiple of 4"),
            });
        }
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("download"),
            size: len.next_multiple_of(4).max(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        {
            let mut enc = self.encoder();
            let enc = enc.as_mut().expect("encoder() creates one");
            let mut dst = 0;
            for (c, off, n) in pieces {
                let n4 = n.next_multiple_of(4).min(r.chunks[c].size() - off);
                enc.copy_buffer_to_buffer(&r.chunks[c], off, &staging, dst, n4);
                dst += n;
            }
        }
        self.flush_pending();
        let (event, flag) = Event::new();
        let result = Arc::new(Mutex::new(None));
        let sink = result.clone();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            *lock(&sink) = Some(r);
            flag.store(true, Ordering::Release);
        });
        self.check()?;
        let (device, errors) = (self.device.clone(), self.error.clone());
        let read = move || -> Result<Vec<u8>> {
            if lock(&result).is_none() {
                device
                    .poll(wgpu::PollType::wait_indefinitely())
                    .map_err(|e| Error::Device(e.to_string()))?;
            }
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
            Ok(out)
        };
        Ok(Readback::new(event, Box::new(read)))
    }

    fn copy(
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
        let mut enc = self.encoder();
        let enc = enc.as_mut().expect("encoder() creates one");
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

    fn enqueue(&self, op: &Op<'_>) -> Result<()> {
        let f = f32::to_bits;
        match *op {
            Op::Embed {
                table,
                wtype,
                ids,
                out,
                rows,
                dim,
            } => {
                let t = self.raw(table)?;
                let row_bytes = wtype.elem_bytes() * dim.max(1) as u64;
                let (ids, out) = (self.single(ids, "ids")?, self.single(out, "embed output")?);
                for (ci, chunk) in t.chunks.iter().enumerate() {
                    let r0 = (ci as u64 * (t.chunk_bytes / row_bytes)) as u32;
                    let r1 = r0.saturating_add((chunk.size() / row_bytes) as u32);
                    self.dispatch(
                        "embed",
                        wtype,
                        &[rows, dim, r0, r1],
                        &[chunk, ids, out],
                        linear_groups(rows as u64 * dim as u64),
                    )?;
                }
            }
            Op::Matmul {
                x,
                w,
                wtype,
                bias,
                out,
                m,
                n,
                k,
            } => {
                let wr = self.raw(w)?;
                let (xb, ob) = (
                    self.single(x, "matmul input")?,
                    self.single(out, "matmul output")?,
                );
                let bb = match bias {
                    Some(b) => self.single(b, "bias")?,
                    None => &self.dummy,
                };
                // Rows per chunk: chunks are cut at whole rows (in words for 16-bit types).
                let elems_per_chunk = match wtype {
                    WeightType::F32 => wr.chunk_bytes / 4,
                    _ => wr.chunk_bytes / 2,
                };
                let rows_per_chunk = if k == 0 {
                    n as u64
                } else {
                    elems_per_chunk / k as u64
                };
                for (ci, chunk) in wr.chunks.iter().enumerate() {
                    let n0 = ci as u64 * rows_per_chunk;
                    if n0 >= n as u64 {
                        break;
                    }
                    let n_rows = rows_per_chunk.min(n as u64 - n0) as u32;
                    self.dispatch(
                        "matmul",
                        wtype,
                        &[m, k, n0 as u32, n_rows, n, bias.is_some() as u32],
                        &[xb, chunk, bb, ob],
                        (n_rows.div_ceil(16), m.div_ceil(16)),
                    )?;
                }
            }
            Op::RmsNorm {
                x,
                w,
                out,
                rows,
                dim,
                eps,
            } => self.dispatch(
                "rms_norm",
                WeightType::F32,
                &[rows, dim, f(eps)],
                &[
                    self.single(x, "rms_norm input")?,
                    self.single(w, "rms_norm weight")?,
                    self.single(out, "rms_norm output")?,
                ],
                rows_groups(rows),
            )?,
            Op::Rope {
                x,
                positions,
                table,
                rows,
                n_heads,
                head_stride,
                offset,
                half,
                kind,
            } => self.dispatch(
                "rope",
                WeightType::F32,
                &[
                    rows,
                    n_heads,
                    head_stride,
                    offset,
                    half,
                    (kind == RopeKind::Interleaved) as u32,
                ],
                &[
                    self.single(x, "rope data")?,
                    self.single(positions, "positions")?,
                    self.single(table, "rope table")?,
                ],
                linear_groups(rows as u64 * n_heads as u64 * half as u64),
            )?,
            Op::Attention {
                q,
                k,
                v,
                out,
                n_tokens,
                start_pos,
                n_heads,
                n_kv_heads,
                head_dim,
                window,
                scale,
            } => {
                if head_dim > 256 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
                    return Err(Error::Shape {
                        op: "attention",
                        message: format!(
                            "head_dim {head_dim} (at most 256), {n_heads} heads over {n_kv_heads} kv heads"
                        ),
                    });
                }
                self.dispatch(
                    "attention",
                    WeightType::F32,
                    &[
                        n_tokens,
                        start_pos,
                        n_heads,
                        n_kv_heads,
                        head_dim,
                        window,
                        f(scale),
                    ],
                    &[
                        self.single(q, "queries")?,
                        self.single(k, "key cache")?,
                        self.single(v, "value cache")?,
                        self.single(out, "attention output")?,
                    ],
                    (n_heads, n_tokens),
                )?
            }
            Op::MlaAttention {
                q,
                latent,
                k_rope,
                kv_b,
                out,
                n_tokens,
                start_pos,
                n_heads,
                kv_lora,
                nope,
                rope,
                v_dim,
                scale,
            } => {
                if kv_lora > 512 || rope > 64 {
                    return Err(Error::Shape {
                        op: "mla attention",
                        message: format!(
                            "latent rank {kv_lora} (at most 512), rotary dims {rope} (at most 64)"
                        ),
                    });
                }
                self.dispatch(
                    "mla_attention",
                    WeightType::F32,
                    &[
                        n_tokens,
                        start_pos,
                        n_heads,
                        kv_lora,
                        nope,
                        rope,
                        v_dim,
                        f(scale),
                    ],
                    &[
                        self.single(q, "queries")?,
                        self.single(latent, "latent cache")?,
                        self.single(k_rope, "rotary key cache")?,
                        self.single(kv_b, "kv_b_proj")?,
                        self.single(out, "attention output")?,
                    ],
                    (n_heads, n_tokens),
                )?
            }
            Op::SiluMul { x, y, n } => self.dispatch(
                "elementwise",
                WeightType::F32,
                &[n, 1, 0, 0],
                &[self.single(x, "gate")?, self.single(y, "up")?, &self.dummy],
                linear_groups(n as u64),
            )?,
            Op::Add { x, y, gate, n, dim } => {
                let g = match gate {
                    Some(g) => self.single(g, "gate")?,
                    None => &self.dummy,
                };
                self.dispatch(
                    "elementwise",
                    WeightType::F32,
                    &[n, dim.max(1), 1, gate.is_some() as u32],
                    &[self.single(x, "sum")?, self.single(y, "addend")?, g],
                    linear_groups(n as u64),
                )?
            }
            Op::TopK {
                logits,
                bias,
                ids,
                weights,
                tokens,
                params: p,
            } => {
                if p.n_experts > 256 || p.k == 0 || p.k > p.n_experts {
                    return Err(Error::Shape {
                        op: "topk",
                        message: format!("top-{} of {} experts (at most 256)", p.k, p.n_experts),
                    });
                }
                let (n_group, topk_group, top2) = p.groups.unwrap_or((1, 1, false));
                let b = match bias {
                    Some(b) => self.single(b, "router bias")?,
                    None => &self.dummy,
                };
                self.dispatch(
                    "topk",
                    WeightType::F32,
                    &[
                        tokens,
                        p.n_experts,
                        p.k,
                        p.sigmoid as u32,
                        bias.is_some() as u32,
                        n_group,
                        topk_group,
                        top2 as u32,
                        p.norm as u32,
                        f(p.scaling),
                    ],
                    &[
                        self.single(logits, "router logits")?,
                        b,
                        self.single(ids, "expert ids")?,
                        self.single(weights, "expert weights")?,
                    ],
                    linear_groups(tokens as u64),
                )?
            }
            Op::ExpertFfn {
                x,
                slots,
                pairs,
                out,
                n_pairs,
                stage,
            } => {
                let sr = self.raw(&slots.buffer)?;
                let slots_per_chunk = (sr.chunk_bytes / slots.slot_bytes()) as u32;
                let width = if stage == 0 {
                    slots.inter
                } else {
                    slots.hidden
                };
                let (xb, pb, ob) = (
                    self.single(x, "expert input")?,
                    self.single(pairs, "expert pairs")?,
                    self.single(out, "expert output")?,
                );
                for (ci, chunk) in sr.chunks.iter().enumerate() {
                    let s0 = ci as u32 * slots_per_chunk;
                    self.dispatch(
                        "expert_ffn",
                        slots.wtype,
                        &[
                            n_pairs,
                            slots.hidden,
                            slots.inter,
                            slots.slot_elems() as u32,
                            s0,
                            s0 + slots_per_chunk,
                            stage,
                        ],
                        &[xb, chunk, pb, ob],
                        linear_groups(n_pairs as u64 * width as u64),
                    )?;
                }
            }
            Op::MoeCombine {
                out,
                y,
                weights,
                pair_of,
                tokens,
                hidden,
                k,
            } => self.dispatch(
                "moe_combine",
                WeightType::F32,
                &[tokens, hidden, k],
                &[
                    self.single(out, "moe output")?,
                    self.single(y, "expert outputs")?,
                    self.single(weights, "expert weights")?,
                    self.single(pair_of, "pair index")?,
                ],
                linear_groups(tokens as u64 * hidden as u64),
            )?,
        }
        self.check()
    }

    fn submit(&self) -> Result<Event> {
        let cmds: Vec<wgpu::CommandBuffer> = lock(&self.pending)
            .take()
            .map(|e| e.finish())
            .into_iter()
            .collect();
        self.queue.submit(cmds);
        let (event, flag) = Event::new();
        self.queue
            .on_submitted_work_done(move || flag.store(true, Ordering::Release));
        self.check()?;
        Ok(event)
    }

    fn wait(&self, event: &Event) -> Result<()> {
        if !event.is_done() {
            self.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| Error::Device(e.to_string()))?;
        }
        self.check()?;
        if !event.is_done() {
            return Err(Error::Device(
                "waited for submitted work that never completed".into(),
            ));
        }
        Ok(())
    }

    fn poll(&self) -> Result<()> {
        self.device
            .poll(wgpu::PollType::Poll)
            .map_err(|e| Error::Device(e.to_string()))?;
        self.check()
    }
}
