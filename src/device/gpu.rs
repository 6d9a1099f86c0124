//! A wgpu device: the adapter's own limits, the features kiln uses, error and device-loss
//! handlers that turn wgpu's panicking defaults into `kiln::Error`s, the stream and the caches.

use super::adapters::{AdapterInfo, KilnFeatures};
use super::bind_cache::BindGroupCache;
use super::lock;
use super::pinned::WgpuPinnedSource;
use super::serial::GlSerial;
use super::stream::Stream;
use super::wgpu_source::WgpuSource;
use crate::alloc::{AllocatorConfig, CachingAllocator};
use crate::host::CachingHostAllocator;
use crate::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub(crate) struct GpuDevice {
    pub info: AdapterInfo,
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub stream: Arc<Mutex<Stream>>,
    pub alloc: Mutex<CachingAllocator<WgpuSource>>,
    /// Pinned (staging) memory: PyTorch's CachingHostAllocator over mapped wgpu buffers.
    /// Lock order: allocator, host allocator, a pinned buffer's state, stream.
    pub host: Mutex<CachingHostAllocator<WgpuPinnedSource>>,
    /// The CPU device pinned tensors of this GPU live on.
    pub host_device: super::Device,
    /// Bytes per chunk of a pageable copy.
    staging_chunk: AtomicU64,
    /// Kernel and copy timing while a profile runs. Lock order: before the stream.
    pub timer: Mutex<Option<super::kernel_timer::KernelTimer>>,
    /// Whether `timer` is set: lets every dispatch skip its lock when no profile runs.
    pub timing: AtomicBool,
    /// The launch path's per-device state (its compiled pipelines), which only `kernels` reads:
    /// the device sits below the kernels and keeps this slot for them as it keeps memory.
    pub launch_state: std::sync::OnceLock<Box<dyn std::any::Any + Send + Sync>>,
    /// Tensor-core f16 matmul (cooperative matrices 16x16x16, f16 inputs, f32 accumulator).
    pub coop_f16: bool,
    /// Shared with the segment source, which evicts a segment's groups when releasing it.
    pub bind_groups: Arc<Mutex<BindGroupCache>>,
    /// wgpu errors no scope caught, reported at the next sync point.
    errors: Arc<Mutex<Vec<String>>>,
    lost: Arc<Mutex<Option<(String, String)>>>,
    /// Device-side assert flag (one u32, 0 = fine), raised by kernels that check their input
    /// (see `kernels::Kernel::checks_input`), and the ops launched since it was last read.
    pub assert_flag: wgpu::Buffer,
    pub pending_asserts: Mutex<Vec<&'static str>>,
    /// Set by both handlers: lets `check` skip the locks on the hot path.
    troubled: Arc<AtomicBool>,
    /// On GL, every wgpu call goes through the process's GL lock (`serial.rs`).
    pub gl: GlSerial,
    /// Two more queues for copies to and from pinned memory, where kiln opened the device
    /// itself and `KILN_COPY_QUEUE=transfer` asks for them (see Note [Side queue]).
    #[cfg(any(windows, all(unix, not(target_vendor = "apple"))))]
    pub side: Option<super::side_queue::SideQueue>,
}

/// Pageable copies move through the pinned pool in chunks of this size: large enough that a
/// submit per chunk costs nothing, small enough that DMA and host copies overlap.
pub(crate) const DEFAULT_STAGING_CHUNK: u64 = 32 << 20;

impl GpuDevice {
    pub fn staging_chunk_bytes(&self) -> u64 {
        self.staging_chunk.load(Ordering::Relaxed)
    }
    pub fn set_staging_chunk_bytes(&self, bytes: u64) {
        self.staging_chunk
            .store(bytes.next_multiple_of(4).max(4), Ordering::Relaxed);
    }

    pub fn new(info: AdapterInfo, adapter: wgpu::Adapter, config: AllocatorConfig) -> Result<Self> {
        // The adapter's own limits: the defaults cap offsets at 256 bytes, immediates at 0 and
        // storage buffers at 8.
        let limits = adapter.limits();
        let mut features = KilnFeatures::requested(adapter.features());
        // Cooperative matrices are experimental in wgpu 30: requested only where the adapter
        // lists the one configuration kiln uses, and only with f16 and subgroups (the kernel's
        // `subgroup_id`).
        let coop_f16 = adapter
            .features()
            .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
            && features.contains(wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP)
            && adapter.cooperative_matrix_properties().iter().any(|c| {
                (c.m_size, c.n_size, c.k_size) == (16, 16, 16)
                    && c.ab_type == wgpu::CooperativeScalarType::F16
                    && c.cr_type == wgpu::CooperativeScalarType::F32
            })
            && std::env::var("KILN_DISABLE_COOPERATIVE_MATRIX").is_err();
        // The kernel splits its workgroup into subgroups of 32 (NVIDIA's warps; AMD's wave32).
        let adapter_info = adapter.get_info();
        let coop_f16 = coop_f16
            && adapter_info.subgroup_min_size == 32
            && adapter_info.subgroup_max_size == 32;
        // (Whether the kernel's tile fits the workgroup memory is the kernels' question:
        // `kernels::coop_f16`.)
        if coop_f16 {
            features |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
        }
        // One kind of pinned memory in host-cached system memory, as CUDA's, where Vulkan lets a
        // mappable buffer be both a copy source and destination (see Note [Pinned host memory]).
        let unified_pinned = info.backend == wgpu::Backend::Vulkan
            && adapter
                .features()
                .contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS)
            && std::env::var("KILN_PINNED_SPLIT").is_err();
        if unified_pinned {
            features |= wgpu::Features::MAPPABLE_PRIMARY_BUFFERS;
        }
        let experimental_features = if coop_f16 {
            // SAFETY: wgpu's experimental cooperative-matrix support; kiln uses one validated
            // shader (tests/kernels.rs) on configurations the adapter reports.
            unsafe { wgpu::ExperimentalFeatures::enabled() }
        } else {
            wgpu::ExperimentalFeatures::disabled()
        };
        let gl = GlSerial::for_backend(info.backend);
        let opening = gl.guard();
        let desc = wgpu::DeviceDescriptor {
            label: Some("kiln"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features,
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        };
        let (device, queue, side_queue, sparse_opened) = open_device(&adapter, &desc, &info)?;
        #[cfg(any(windows, all(unix, not(target_vendor = "apple"))))]
        let side = side_queue.and_then(|at| super::side_queue::SideQueue::new(&device, at));
        #[cfg(not(any(windows, all(unix, not(target_vendor = "apple")))))]
        let _ = side_queue;
        let troubled = Arc::new(AtomicBool::new(false));
        let errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let (sink, flag) = (errors.clone(), troubled.clone());
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            lock(&sink).push(e.to_string());
            flag.store(true, Ordering::Release);
        }));
        let lost: Arc<Mutex<Option<(String, String)>>> = Arc::default();
        let (sink, flag) = (lost.clone(), troubled.clone());
        device.set_device_lost_callback(move |reason, msg| {
            *lock(&sink) = Some((format!("{reason:?}"), msg));
            flag.store(true, Ordering::Release);
        });
        drop(opening);
        let assert_flag = {
            let _gl = gl.guard();
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("kiln assert flag"),
                size: 16,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        };
        let stream = Arc::new(Mutex::new(Stream::new(
            gl,
            super::stream::spin_before_wait(info.device_type),
        )));
        let bind_groups: Arc<Mutex<BindGroupCache>> = Arc::default();
        let total = super::memory::device_memory(&adapter).and_then(|m| m.total);
        let source = WgpuSource {
            #[cfg(any(windows, all(unix, not(target_vendor = "apple"))))]
            sparse: sparse_opened
                .then(|| super::sparse::SparseMemory::new(&device, &adapter))
                .flatten(),
            #[cfg(all(unix, not(target_vendor = "apple")))]
            external: sparse_opened
                .then(|| super::external::External::new(&device, &adapter))
                .flatten(),
            device: device.clone(),
            queue: queue.clone(),
            adapter,
            stream: stream.clone(),
            bind_groups: bind_groups.clone(),
            name: format!("GPU {} ({}, {:?})", info.spec, info.name, info.backend),
            max_buffer_size: limits.max_buffer_size,
            total,
            gl,
        };
        let pinned_source = WgpuPinnedSource {
            device: device.clone(),
            stream: stream.clone(),
            max_buffer_size: limits.max_buffer_size,
            unified: unified_pinned,
            gl,
        };
        let host_device = super::Device::cpu()?;
        Ok(GpuDevice {
            info,
            device,
            queue,
            stream,
            alloc: Mutex::new(CachingAllocator::new(source, config)),
            host: Mutex::new(CachingHostAllocator::new(pinned_source)),
            host_device,
            staging_chunk: AtomicU64::new(DEFAULT_STAGING_CHUNK.min(limits.max_buffer_size)),
            timer: Mutex::new(None),
            timing: AtomicBool::new(false),
            launch_state: std::sync::OnceLock::new(),
            coop_f16,
            bind_groups,
            errors,
            lost,
            assert_flag,
            pending_asserts: Mutex::default(),
            troubled,
            gl,
            #[cfg(any(windows, all(unix, not(target_vendor = "apple"))))]
            side,
        })
    }

    /// A new segment source on this device's memory (with its own sparse-binding state), for
    /// an allocator beside the device's own: trace replays on real memory.
    pub(crate) fn fresh_source(&self) -> WgpuSource {
        let alloc = lock(&self.alloc);
        let s = alloc.source();
        WgpuSource {
            #[cfg(any(windows, all(unix, not(target_vendor = "apple"))))]
            sparse: s
                .sparse
                .as_ref()
                .and_then(|_| super::sparse::SparseMemory::new(&s.device, &s.adapter)),
            // A replay's allocator makes no exportable segments.
            #[cfg(all(unix, not(target_vendor = "apple")))]
            external: None,
            device: s.device.clone(),
            queue: s.queue.clone(),
            adapter: s.adapter.clone(),
            stream: s.stream.clone(),
            bind_groups: s.bind_groups.clone(),
            name: s.name.clone(),
            max_buffer_size: s.max_buffer_size,
            total: s.total,
            gl: s.gl,
        }
    }

    /// Device loss or a wgpu error since the last check, as a `kiln::Error`.
    pub fn check(&self, op: &'static str) -> Result<()> {
        if !self.troubled.load(Ordering::Acquire) {
            return Ok(());
        }
        if let Some((reason, msg)) = lock(&self.lost).clone() {
            return Err(Error::DeviceLost { reason, msg });
        }
        let mut errors = lock(&self.errors);
        if errors.is_empty() {
            return Ok(());
        }
        let msg = errors.drain(..).collect::<Vec<_>>().join("; ");
        self.troubled.store(false, Ordering::Release);
        Err(Error::Wgpu { op, msg })
    }

    /// Reads and clears the assert flag if a checking kernel ran since the last read: an
    /// `Error::DeviceAssert` naming those ops if one found bad input. A sync point.
    /// Records `record` (which copies into a fresh `bytes`-byte `MAP_READ` buffer) after the
    /// queued work, waits for it and returns the buffer's bytes: the readback of small results
    /// the device computes (assert flags, timestamps). A sync point.
    pub fn read_back(
        &self,
        op: &'static str,
        bytes: u64,
        record: impl FnOnce(&mut wgpu::CommandEncoder, &wgpu::Buffer),
    ) -> Result<Vec<u8>> {
        let readback = {
            let _gl = self.gl.guard();
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("kiln readback"),
                size: bytes.next_multiple_of(4).max(4),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        };
        let mut stream = lock(&self.stream);
        record(stream.copy_encoder(&self.device), &readback);
        let event = stream.submit(&self.queue);
        {
            let _gl = self.gl.guard();
            readback.slice(..).map_async(wgpu::MapMode::Read, |_| {});
        }
        stream
            .wait(&self.device, &self.queue, event)
            .map_err(super::wgpu_err(op))?;
        drop(stream);
        // The map callback runs inside poll; wait once more for it to have run. The buffer
        // is dropped (unmapped, freed) under the GL lock too.
        let _gl = self.gl.guard();
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(super::wgpu_err(op))?;
        let bytes = readback
            .slice(..)
            .get_mapped_range()
            .map_err(super::wgpu_err(op))?[..bytes as usize]
            .to_vec();
        drop(readback);
        Ok(bytes)
    }

    pub fn check_asserts(&self) -> Result<()> {
        let ops = std::mem::take(&mut *lock(&self.pending_asserts));
        if ops.is_empty() {
            return Ok(());
        }
        let view = self.read_back("check_asserts", 16, |enc, readback| {
            enc.copy_buffer_to_buffer(&self.assert_flag, 0, readback, 0, 16);
            enc.clear_buffer(&self.assert_flag, 0, None);
        })?;
        let raised = u32::from_le_bytes([view[0], view[1], view[2], view[3]]);
        if raised != 0 {
            let mut names: Vec<&str> = ops.clone();
            names.dedup();
            return Err(Error::DeviceAssert {
                ops: names.join(", "),
                msg: "index out of range".into(),
            });
        }
        Ok(())
    }

    pub fn synchronize(&self) -> Result<()> {
        self.check("synchronize")?;
        let mut stream = lock(&self.stream);
        let event = stream.submit(&self.queue);
        stream
            .wait(&self.device, &self.queue, event)
            .map_err(super::wgpu_err("synchronize"))?;
        drop(stream);
        self.check("synchronize")?;
        self.check_asserts()
    }
}

/// A device and queue, the side queue's family and first index, and whether kiln opened the
/// device itself.
type Opened = (wgpu::Device, wgpu::Queue, Option<(u32, u32)>, bool);

/// Opens the device: by kiln itself with sparse binding (and the export extensions) where the
/// adapter has it, for expandable segments (`sparse.rs`) and NCCL (`external.rs`), else as
/// wgpu opens it. Returns the side queue's family and first index, and whether kiln opened it.
fn open_device(
    adapter: &wgpu::Adapter,
    desc: &wgpu::DeviceDescriptor<'_>,
    info: &AdapterInfo,
) -> Result<Opened> {
    // If kiln's own opening fails, as wgpu opens it.
    #[cfg(any(windows, all(unix, not(target_vendor = "apple"))))]
    let sparse_device = super::sparse::supported(adapter)
        .then(|| super::sparse::open_device(adapter, desc))
        .and_then(|r| {
            r.map_err(|e| {
                eprintln!(
                    "kiln: {}: opening with sparse binding failed ({e}); opening without",
                    info.name
                )
            })
            .ok()
        });
    #[cfg(not(any(windows, all(unix, not(target_vendor = "apple")))))]
    let sparse_device: Option<(wgpu::Device, wgpu::Queue, Option<(u32, u32)>)> = None;
    let sparse_opened = sparse_device.is_some();
    let (device, queue, side_queue) = match sparse_device {
        Some(dqs) => dqs,
        None => {
            let (d, q) = pollster::block_on(adapter.request_device(desc)).map_err(|e| {
                Error::RequestDevice {
                    adapter: info.name.clone(),
                    msg: e.to_string(),
                }
            })?;
            (d, q, None)
        }
    };
    Ok((device, queue, side_queue, sparse_opened))
}
