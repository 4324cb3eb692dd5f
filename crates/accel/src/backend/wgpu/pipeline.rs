//! Kernels and their dispatch: WGSL sources compiled once per weight type and cached, the
//! pending command encoder, and one recorded dispatch with its uniform and bindings.

use std::collections::HashMap;
use std::sync::MutexGuard;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use super::{WgpuDevice, lock};
use crate::device::WeightType;
use crate::{Error, Result};

const PRELUDE: &str = include_str!("../../shaders/prelude.wgsl");

/// Kernels by name: WGSL source.
const KERNELS: &[(&str, &str)] = &[
    ("embed", include_str!("../../shaders/embed.wgsl")),
    ("matmul", include_str!("../../shaders/matmul.wgsl")),
    ("rms_norm", include_str!("../../shaders/rms_norm.wgsl")),
    ("rope", include_str!("../../shaders/rope.wgsl")),
    (
        "head_norm_rope",
        include_str!("../../shaders/head_norm_rope.wgsl"),
    ),
    (
        "attention",
        concat!(
            include_str!("../../shaders/attention_io.wgsl"),
            include_str!("../../shaders/attention.wgsl"),
        ),
    ),
    (
        "attention_tiles",
        concat!(
            include_str!("../../shaders/attention_io.wgsl"),
            include_str!("../../shaders/attention_tiles.wgsl"),
        ),
    ),
    (
        "mla_attention",
        include_str!("../../shaders/mla_attention.wgsl"),
    ),
    (
        "elementwise",
        include_str!("../../shaders/elementwise.wgsl"),
    ),
    ("topk", include_str!("../../shaders/topk.wgsl")),
    ("expert_ffn", include_str!("../../shaders/expert_ffn.wgsl")),
    (
        "moe_combine",
        include_str!("../../shaders/moe_combine.wgsl"),
    ),
    (
        "moe_combine_norm",
        include_str!("../../shaders/moe_combine_norm.wgsl"),
    ),
    ("moe_group", include_str!("../../shaders/moe_group.wgsl")),
    (
        "cache_store",
        include_str!("../../shaders/cache_store.wgsl"),
    ),
    (
        "copy_columns",
        include_str!("../../shaders/copy_columns.wgsl"),
    ),
];

/// Linear dispatch of `n` invocations in workgroups of 64, folded into y past 65535.
pub(super) fn linear_groups(n: u64) -> (u32, u32) {
    let groups = n.div_ceil(64);
    let x = groups.min(65535);
    (x as u32, groups.div_ceil(x.max(1)) as u32)
}

/// One workgroup per row, folded into y past 65535.
pub(super) fn rows_groups(rows: u32) -> (u32, u32) {
    let x = rows.min(65535);
    (x, rows.div_ceil(x.max(1)))
}

/// What a kernel over blocks includes besides its block decoder.
#[derive(Clone, Copy)]
enum Helpers {
    /// Nothing more (the embedding gather).
    None,
    /// Dot products of weight rows with activations, and the workgroup's lane sums
    /// (`quant/rows.wgsl`).
    Rows,
    /// Tiles of 32 rows by 32 tokens through workgroup memory (`quant/tile.wgsl`).
    Tiles,
}

/// Kernels that read weights through a block decoder (`quant/*.wgsl`: ggml's blocks, the
/// packed integers, and floats as groups of 32): WGSL source and what it includes.
const BLOCK_KERNELS: &[(&str, &str, Helpers)] = &[
    (
        "embed_blocks",
        include_str!("../../shaders/embed_q.wgsl"),
        Helpers::None,
    ),
    (
        "matmul_rows",
        include_str!("../../shaders/matmul_q.wgsl"),
        Helpers::Rows,
    ),
    (
        "matmul_tiles",
        include_str!("../../shaders/matmul_q_tiles.wgsl"),
        Helpers::Tiles,
    ),
    (
        "expert_rows",
        include_str!("../../shaders/expert_ffn_q.wgsl"),
        Helpers::Rows,
    ),
    (
        "expert_tiles",
        include_str!("../../shaders/expert_ffn_q_tiles.wgsl"),
        Helpers::Tiles,
    ),
];

const QUANT_COMMON: &str = include_str!("../../shaders/quant/common.wgsl");
const QUANT_ROWS: &str = include_str!("../../shaders/quant/rows.wgsl");
const QUANT_TILE: &str = include_str!("../../shaders/quant/tile.wgsl");

/// Lane sums through subgroup operations, or one invocation per lane.
const LANES: [&str; 2] = [
    include_str!("../../shaders/quant/lanes_plain.wgsl"),
    include_str!("../../shaders/quant/lanes_subgroup.wgsl"),
];

/// The block decoder of a weight type (one file per block layout).
fn decoder(wtype: WeightType) -> &'static str {
    match wtype {
        WeightType::F32 => include_str!("../../shaders/quant/f32.wgsl"),
        WeightType::Bf16 => include_str!("../../shaders/quant/bf16.wgsl"),
        WeightType::F16 => include_str!("../../shaders/quant/f16.wgsl"),
        WeightType::Q4_0 => include_str!("../../shaders/quant/q4_0.wgsl"),
        WeightType::Q5_0 => include_str!("../../shaders/quant/q5_0.wgsl"),
        WeightType::Q8_0 => include_str!("../../shaders/quant/q8_0.wgsl"),
        WeightType::Q4_K => include_str!("../../shaders/quant/q4_k.wgsl"),
        WeightType::Q5_K => include_str!("../../shaders/quant/q5_k.wgsl"),
        WeightType::Q6_K => include_str!("../../shaders/quant/q6_k.wgsl"),
        WeightType::IQ4_XS => include_str!("../../shaders/quant/iq4_xs.wgsl"),
        WeightType::Int8 => include_str!("../../shaders/quant/int8.wgsl"),
        WeightType::Int4 => include_str!("../../shaders/quant/int4.wgsl"),
    }
}

/// The WGSL of kernel `name` for weights of `wtype`: a kernel over blocks gets the type's
/// block decoder (reducing through subgroups when `subgroups`); the others, the prelude
/// with the float type's code.
fn source(name: &str, wtype: WeightType, subgroups: bool) -> Result<String> {
    if name == "fma_peak" {
        let peak = include_str!("../../shaders/fma_peak.wgsl");
        return Ok(match wtype {
            WeightType::F16 => format!("enable f16;\n{}", peak.replace("SCALAR", "f16")),
            _ => peak.replace("SCALAR", "f32"),
        });
    }
    if let Some(&(_, body, helpers)) = BLOCK_KERNELS.iter().find(|(n, ..)| *n == name) {
        let helpers = match helpers {
            Helpers::None => String::new(),
            Helpers::Rows => format!("{QUANT_ROWS}\n{}", LANES[subgroups as usize]),
            Helpers::Tiles => QUANT_TILE.to_string(),
        };
        let prelude = PRELUDE.replace("__WTYPE__", "0");
        let decode = decoder(wtype);
        return Ok(format!(
            "{prelude}\n{QUANT_COMMON}\n{decode}\n{helpers}\n{body}"
        ));
    }
    let unsupported = || Error::Unsupported(format!("{name} over {} weights", wtype.name()));
    if wtype.is_quantized() {
        return Err(unsupported());
    }
    let body = KERNELS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, s)| *s)
        .ok_or_else(unsupported)?;
    let code = match wtype {
        WeightType::Bf16 => "1",
        WeightType::F16 => "2",
        _ => "0",
    };
    Ok(format!("{}\n{body}", PRELUDE.replace("__WTYPE__", code)))
}

/// Bytes of one dispatch's uniform words: Vulkan's largest uniform offset alignment, and
/// room for 64 words.
const PARAM_SLOT: u64 = 256;

/// Slots per uniform buffer of the arena.
const PARAM_SLOTS_PER_BUFFER: u64 = 256;

/// The uniform words of the dispatches recorded since the last submission, one slot each,
/// in 64 KiB buffers kept across submissions (more when a submission records more
/// dispatches) and written with one `write_buffer` each just before the submission, which
/// wgpu orders before its commands (and after the reads of earlier submissions). A buffer
/// created per dispatch cost more host time than the dispatch's recording.
#[derive(Debug, Default)]
pub(super) struct ParamArena {
    buffers: Vec<wgpu::Buffer>,
    staged: Vec<u8>,
}

impl ParamArena {
    /// Stages `bytes` in the next slot: its buffer and offset.
    fn stage(&mut self, device: &wgpu::Device, bytes: &[u8]) -> Result<(wgpu::Buffer, u64)> {
        if bytes.len() as u64 > PARAM_SLOT {
            return Err(Error::Device(format!(
                "{} bytes of uniform words exceed a slot of {PARAM_SLOT}",
                bytes.len()
            )));
        }
        let slot = self.staged.len() as u64 / PARAM_SLOT;
        let index = (slot / PARAM_SLOTS_PER_BUFFER) as usize;
        if index == self.buffers.len() {
            self.buffers
                .push(device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("uniform words"),
                    size: PARAM_SLOT * PARAM_SLOTS_PER_BUFFER,
                    usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }));
        }
        self.staged.extend_from_slice(bytes);
        self.staged.resize(((slot + 1) * PARAM_SLOT) as usize, 0);
        let offset = (slot % PARAM_SLOTS_PER_BUFFER) * PARAM_SLOT;
        Ok((self.buffers[index].clone(), offset))
    }

    /// Queues the staged words for the next submission and empties the stage.
    fn write(&mut self, queue: &wgpu::Queue) {
        let per_buffer = (PARAM_SLOT * PARAM_SLOTS_PER_BUFFER) as usize;
        for (buffer, words) in self.buffers.iter().zip(self.staged.chunks(per_buffer)) {
            queue.write_buffer(buffer, 0, words);
        }
        self.staged.clear();
    }
}

/// Commands recorded since the last submission: consecutive dispatches share one compute
/// pass (wgpu still orders each dispatch after the writes it reads), which costs the host
/// less per dispatch than a pass each; copies end it.
#[derive(Debug)]
pub(super) struct Pending {
    encoder: wgpu::CommandEncoder,
    pass: Option<wgpu::ComputePass<'static>>,
}

impl Pending {
    /// The encoder, for commands outside a compute pass (the open pass ends first).
    pub(super) fn encoder(&mut self) -> &mut wgpu::CommandEncoder {
        self.pass = None;
        &mut self.encoder
    }

    /// The open compute pass, begun if none is.
    fn pass(&mut self) -> &mut wgpu::ComputePass<'static> {
        let encoder = &mut self.encoder;
        self.pass.get_or_insert_with(|| {
            encoder
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes: None,
                })
                .forget_lifetime()
        })
    }

    /// A pass of its own for one dispatch, writing `timestamps` at its start and end (the
    /// caller ends it after the dispatch).
    fn timed_pass(
        &mut self,
        timestamps: Option<wgpu::ComputePassTimestampWrites<'_>>,
    ) -> &mut wgpu::ComputePass<'static> {
        self.pass = None;
        let pass = self
            .encoder
            .begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: None,
                timestamp_writes: timestamps,
            })
            .forget_lifetime();
        self.pass.insert(pass)
    }

    fn finish(mut self) -> wgpu::CommandBuffer {
        self.pass = None;
        self.encoder.finish()
    }
}

/// Bind groups of earlier dispatches, by kernel, uniform slot and buffers. A decode step
/// records the same dispatches on the same wgpu buffers every step (the pool hands freed
/// buffers back by size, the uniform arena fills its slots in order), and creating a bind
/// group cost the host more than recording its dispatch.
#[derive(Debug, Default)]
pub(super) struct BindCache {
    groups: HashMap<BindKey, wgpu::BindGroup>,
    /// The pool's evictions when the cache was last cleared: a destroyed buffer is never
    /// bound again, so its bind groups only hold its handle.
    evictions: u64,
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct BindKey {
    kernel: (&'static str, WeightType),
    uniform: wgpu::Buffer,
    offset: u64,
    buffers: Vec<wgpu::Buffer>,
}

/// Bind groups the cache holds before it starts over: a decode step of a large model records
/// a few thousand dispatches, a step of the tiny model a few hundred.
const BIND_CACHE_MAX: usize = 16_384;

impl WgpuDevice {
    fn pipeline(&self, name: &'static str, wtype: WeightType) -> Result<wgpu::ComputePipeline> {
        if let Some(p) = lock(&self.pipelines).get(&(name, wtype)) {
            return Ok(p.clone());
        }
        // Compiled outside the cache's lock, so kernels compile in parallel (`prepare`).
        let p = self.compile(name, wtype)?;
        self.check()?;
        Ok(lock(&self.pipelines)
            .entry((name, wtype))
            .or_insert(p)
            .clone())
    }

    fn compile(&self, name: &'static str, wtype: WeightType) -> Result<wgpu::ComputePipeline> {
        let src = source(name, wtype, self.subgroups)?;
        lock(&self.traffic).compiled += 1;
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(name),
                source: wgpu::ShaderSource::Wgsl(src.into()),
            });
        Ok(self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(name),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            }))
    }

    /// [`crate::Device::prepare_kernels`]: every block kernel for each weight type (and f32
    /// and f16), the other kernels for f32 and f16 (the KV cache's type), compiled on every
    /// core. Each compiles inside an error scope of its thread: a failure stays there, for
    /// the kernel's first use to report.
    pub(super) fn prepare(&self, weights: &[WeightType]) {
        let floats = [WeightType::F32, WeightType::F16];
        let mut types = floats.to_vec();
        for &t in weights {
            if !types.contains(&t) {
                types.push(t);
            }
        }
        let mut wanted: Vec<(&'static str, WeightType)> = BLOCK_KERNELS
            .iter()
            .flat_map(|&(name, ..)| types.iter().map(move |&t| (name, t)))
            .chain(
                KERNELS
                    .iter()
                    .flat_map(|&(name, _)| floats.iter().map(move |&t| (name, t))),
            )
            .collect();
        wanted.retain(|k| !lock(&self.pipelines).contains_key(k));
        let next = AtomicUsize::new(0);
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(wanted.len());
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    while let Some(&(name, wtype)) =
                        wanted.get(next.fetch_add(1, Ordering::Relaxed))
                    {
                        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
                        let compiled = self.compile(name, wtype);
                        let failed = pollster::block_on(scope.pop()).is_some();
                        if let (Ok(p), false) = (compiled, failed) {
                            lock(&self.pipelines).entry((name, wtype)).or_insert(p);
                        }
                    }
                });
            }
        });
    }

    /// The pending commands, created on first use.
    pub(super) fn pending(&self) -> MutexGuard<'_, Option<Pending>> {
        let mut g = lock(&self.pending);
        if g.is_none() {
            *g = Some(Pending {
                encoder: self
                    .device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None }),
                pass: None,
            });
        }
        g
    }

    /// Submits the pending encoder, after writing the uniform words its dispatches read;
    /// with `always`, also when there is none (that submission sends queued uploads).
    pub(super) fn submit_pending(&self, always: bool) {
        let mut pending = lock(&self.pending);
        let enc = pending.take();
        if enc.is_none() && !always {
            return;
        }
        let start = Instant::now();
        let mut enc = enc;
        // The clock's lock is held until its timestamps are read, so no later submission
        // resolves into its read buffer while that is mapped.
        let mut clock = self.clock.as_ref().map(lock);
        let timed = match (&mut clock, &mut enc) {
            (Some(clock), Some(enc)) => clock.resolve(enc.encoder()),
            _ => Vec::new(),
        };
        if let Some(enc) = &mut enc {
            // The belt's chunks return for reuse once this submission has copied from them.
            lock(&self.staging).finish_and_recall_on_submit(enc.encoder());
        }
        lock(&self.params).write(&self.queue);
        self.queue.submit(enc.map(Pending::finish));
        let landed = std::mem::take(&mut *lock(&self.landing));
        if !landed.is_empty() {
            self.queue.on_submitted_work_done(move || {
                for flag in &landed {
                    flag.store(true, Ordering::Release);
                }
            });
        }
        drop(pending);
        let mut traffic = lock(&self.traffic);
        traffic.submissions += 1;
        traffic.submit_ns += start.elapsed().as_nanos() as u64;
        drop(traffic);
        if let Some(Err(e)) = clock.map(|mut c| c.collect(&self.device, &timed)) {
            lock(&self.error).get_or_insert(e.to_string());
        }
    }

    /// Records one dispatch of `name` with a uniform of `params` words and `buffers` at
    /// bindings 1...
    pub(super) fn dispatch(
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
        let start = Instant::now();
        let pipeline = self.pipeline(name, wtype)?;
        let bytes: Vec<u8> = params.iter().flat_map(|w| w.to_le_bytes()).collect();
        // The encoder's lock is held from staging the words to recording the dispatch, so a
        // submission from another thread cannot come between them.
        let mut pending = self.pending();
        let (uniform, offset) = lock(&self.params).stage(&self.device, &bytes)?;
        let key = BindKey {
            kernel: (name, wtype),
            uniform,
            offset,
            buffers: buffers.iter().map(|&b| b.clone()).collect(),
        };
        let evictions = lock(&self.pool).evictions;
        let mut binds = lock(&self.binds);
        if binds.evictions != evictions || binds.groups.len() >= BIND_CACHE_MAX {
            binds.groups.clear();
            binds.evictions = evictions;
        }
        let (bind, created) = match binds.groups.get(&key) {
            Some(bind) => (bind.clone(), false),
            None => {
                let bind = self.bind_group(name, &pipeline, &key);
                binds.groups.insert(key, bind.clone());
                (bind, true)
            }
        };
        drop(binds);
        let pending = pending.as_mut().expect("pending() creates it");
        let mut clock = self.clock.as_ref().map(lock);
        let pass = match &mut clock {
            Some(clock) => pending.timed_pass(clock.next(format!("{name} {}", wtype.name()))),
            None => pending.pass(),
        };
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(groups.0, groups.1, 1);
        if clock.is_some() {
            pending.pass = None;
        }
        let mut traffic = lock(&self.traffic);
        traffic.dispatches += 1;
        traffic.bind_groups += u64::from(created);
        traffic.record_ns += start.elapsed().as_nanos() as u64;
        Ok(())
    }

    /// A new bind group for `key`: the uniform slot at binding 0, the buffers from 1.
    fn bind_group(
        &self,
        name: &'static str,
        pipeline: &wgpu::ComputePipeline,
        key: &BindKey,
    ) -> wgpu::BindGroup {
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &key.uniform,
                offset: key.offset,
                size: std::num::NonZeroU64::new(PARAM_SLOT),
            }),
        }];
        for (i, b) in key.buffers.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: b.as_entire_binding(),
            });
        }
        self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(name),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        })
    }
}
