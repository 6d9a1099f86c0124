//! Devices: the CPU reference device and wgpu GPUs, each with its own caching allocator, and
//! PyTorch's memory API (`memory_allocated`, `memory_summary`, `empty_cache`, ...) on top.
//!
//! # What is here
//!
//! - `mod.rs`: `Device`, with PyTorch's memory API; `adapters.rs`: adapter discovery;
//!   `memory.rs`: Vulkan heaps and budget (the capacity in OOM reports).
//! - `gpu.rs`: the wgpu device and its error and loss handlers; `stream.rs`: the one stream
//!   (Note [One stream, batched submits]); `kernel_timer.rs` and `timer.rs`: timestamp queries.
//! - `wgpu_source.rs`: the allocator's segment source over wgpu buffers; `sparse.rs`: expandable
//!   segments' pages on Vulkan sparse buffers (the device opened through wgpu-hal with
//!   `sparseBinding` and `sparseResidencyBuffer` where the adapter has them; Note [Expandable
//!   segments]); `side_queue.rs`: the opt-in side queue for staging copies (two queues of a
//!   transfer-only family that `sparse.rs` opens with the device, gated on wgpu's queue through a
//!   timeline semaphore; Note [Side queue]).
//! - `plan.rs`: planning devices for dry runs (`PlanTarget`, the source that lends sizes,
//!   `max_batch_size`; Note [Dry runs]).
//! - `pinned.rs`: pinned staging buffers and their source; `transfer.rs`: staged pageable copies,
//!   events and `Transfer`; `block.rs`: `DeviceBlock` and its raw operations (write, read, host
//!   fills; the GPU fill is a kernel).
//! - `serial.rs`: the lock every wgpu call on a GL device takes, so threads queue instead of
//!   tripping wgpu's 6-second context-lock panic; `bind_cache.rs`: bind groups cached by layout
//!   and bound ranges.
//! - The launch path's per-device state (compiled pipelines) sits in a slot only `kernels` reads
//!   (`GpuDevice::launch_state`), so the arrow between the layers stays one way.

mod adapters;
mod bind_cache;
mod block;
#[cfg(all(unix, not(target_vendor = "apple")))]
pub(crate) mod external;
pub(crate) mod gpu;
pub(crate) mod kernel_timer;
mod memory;
pub(crate) mod pinned;
mod plan;
mod pressure;
pub(crate) mod serial;
#[cfg(any(windows, all(unix, not(target_vendor = "apple"))))]
pub(crate) mod side_queue;
#[cfg(any(windows, all(unix, not(target_vendor = "apple"))))]
mod sparse;
pub(crate) mod stream;
mod timer;
pub(crate) mod transfer;
mod wgpu_source;

pub use adapters::{adapters, AdapterInfo, KilnFeatures, KilnLimits};
pub use block::DeviceBlock;
pub use kernel_timer::KernelEntry;
pub use plan::{max_batch_size, BatchFit, PlanTarget};
pub(crate) use plan::{planned_pin, planned_staging, PlannedPin};
pub(crate) use pressure::{speculatively, Reliever, RelieverGuard};
pub use timer::gpu_time;
pub use transfer::{Event, Transfer};

use crate::alloc::{
    memory_summary, AllocatorConfig, CachingAllocator, HistoryContext, HistoryEnabled,
    HistoryStacks, HostSource, Snapshot,
};
use crate::base::DType;
use crate::{Error, Result};
use gpu::GpuDevice;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// A wgpu error, or a failed wait or map, as `Error::Wgpu` naming `op`.
pub(crate) fn wgpu_err<E: std::fmt::Display>(op: &'static str) -> impl Fn(E) -> Error {
    move |e| Error::Wgpu {
        op,
        msg: e.to_string(),
    }
}

pub(crate) use crate::base::lock;

/// A device generator's state: the seed and the counter offset of the next draw (kiln's
/// generator is counter-based, as CUDA's Philox is, so this pair is all of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RngState {
    /// The generator's seed (`manual_seed`).
    pub seed: u64,
    /// How many values were drawn since seeding.
    pub offset: u64,
}

/// What `Device::launch_slot` gives the launch path: its slot, the adapter, the tuning file.
pub(crate) type LaunchSlot<'a> = (
    &'a std::sync::OnceLock<Box<dyn std::any::Any + Send + Sync>>,
    &'a AdapterInfo,
    Option<&'a std::path::Path>,
);

/// A device: cheap to clone, shared by the tensors on it.
#[derive(Clone)]
pub struct Device(Arc<Inner>);

struct Inner {
    spec: String,
    backend: Backend,
    /// The generator: (seed, offset of the next draw).
    rng: Mutex<(u64, u64)>,
    /// Memory held ahead of need and how to free it (Note [Memory pressure]).
    relievers: pressure::Relievers,
}

/// PyTorch's default seed (c10's `default_rng_seed_val`).
const DEFAULT_SEED: u64 = 67_280_421_310_721;

enum Backend {
    Cpu(Box<Mutex<CachingAllocator<HostSource>>>),
    /// Dropped by hand, under the GL lock where the device is a GL one (`Drop for Inner`).
    Gpu(std::mem::ManuallyDrop<Box<GpuDevice>>),
    /// A planning device: a GPU's allocator with no memory and no kernels (Note [Dry runs]).
    Plan(Box<plan::PlanDevice>),
}

impl Drop for Inner {
    /// A GPU device's teardown (its pipelines, segments, buffers) makes wgpu calls too: on GL
    /// they hold the GL lock like every other (`serial.rs`).
    fn drop(&mut self) {
        if let Backend::Gpu(g) = &mut self.backend {
            let _gl = g.gl.guard();
            // SAFETY: dropped once, here; nothing touches the backend after.
            unsafe { std::mem::ManuallyDrop::drop(g) };
        }
    }
}

/// Runs `$body` with `$a` bound to the locked allocator of either device kind.
macro_rules! with_alloc {
    ($dev:expr, $a:ident => $body:expr) => {
        match &$dev.0.backend {
            Backend::Cpu(m) => {
                #[allow(unused_mut)]
                let mut $a = lock(m);
                $body
            }
            Backend::Gpu(g) => {
                #[allow(unused_mut)]
                let mut $a = lock(&g.alloc);
                $body
            }
            Backend::Plan(p) => {
                #[allow(unused_mut)]
                let mut $a = lock(&p.alloc);
                $body
            }
        }
    };
}
pub(crate) use with_alloc;

/// Runs `$body` with `$h` bound to the locked pinned pool of a GPU or of a planning device's
/// model of one; `$none` on the CPU device, which has none.
macro_rules! with_host {
    ($dev:expr, $h:ident => $body:expr, else $none:expr) => {
        match &$dev.0.backend {
            Backend::Gpu(g) => {
                #[allow(unused_mut)]
                let mut $h = lock(&g.host);
                $body
            }
            Backend::Plan(p) => {
                #[allow(unused_mut)]
                let mut $h = lock(&p.host);
                $body
            }
            Backend::Cpu(_) => $none,
        }
    };
}

/// Whether `KILN_COPY_QUEUE=transfer` asks for the side queue (Note [Side queue]).
pub(crate) fn copy_queue_requested() -> bool {
    cfg!(any(windows, all(unix, not(target_vendor = "apple"))))
        && std::env::var("KILN_COPY_QUEUE").is_ok_and(|v| v == "transfer")
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({})", self.name())
    }
}

/// GPUs are equal only to themselves. Every CPU device is the one host (as PyTorch has one
/// `cpu`): CPU devices differ only in whose allocator counts their tensors, and pinned tensors
/// live on a GPU's own CPU device.
impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || (self.is_cpu() && other.is_cpu())
    }
}

impl Device {
    /// Whether this device can hold `dtype`: f64 lives on the CPU device only (WGSL has no
    /// f64), and f16 needs the adapter's shader-f16 on a GPU.
    pub(crate) fn check_dtype(&self, op: &'static str, dtype: DType) -> Result<()> {
        if dtype == DType::F64 && !self.is_cpu() {
            return Err(Error::UnsupportedDType {
                op,
                dtype,
                why: format!(
                    "on {}: WGSL has no f64 (f64 lives on the CPU device)",
                    self.name()
                ),
            });
        }
        if dtype == DType::F16 && self.adapter_info().is_some_and(|i| !i.features.shader_f16) {
            return Err(Error::UnsupportedDType {
                op,
                dtype,
                why: format!("on {}: the adapter has no shader-f16", self.name()),
            });
        }
        Ok(())
    }

    /// The CPU device: the reference for tests and the fallback where there is no GPU.
    /// Its memory goes through the same caching allocator, so its statistics read the same.
    pub fn cpu() -> Result<Device> {
        let config = AllocatorConfig::from_env()?;
        Ok(Device(Arc::new(Inner {
            spec: "cpu".into(),
            rng: Mutex::new((DEFAULT_SEED, 0)),
            relievers: pressure::Relievers::default(),
            backend: Backend::Cpu(Box::new(Mutex::new(CachingAllocator::new(
                HostSource::new(None, "CPU"),
                config,
            )))),
        })))
    }

    /// The best adapter: `KILN_DEVICE` if set, else a discrete GPU over an integrated one over
    /// a software one (an adapter that fails to open is skipped with a warning); with no GPU
    /// adapter, the CPU device and a one-line warning.
    pub fn best() -> Result<Device> {
        if let Ok(spec) = std::env::var("KILN_DEVICE") {
            return Self::from_spec(&spec);
        }
        let mut all = adapters::enumerate();
        all.sort_by_key(|(info, _)| info.rank());
        for (info, adapter) in all {
            match Self::open(info.clone(), adapter) {
                Ok(d) => return Ok(d),
                Err(e) => eprintln!("kiln: skipping adapter {} ({}): {e}", info.spec, info.name),
            }
        }
        eprintln!("kiln: no GPU adapter found (install a Vulkan driver, e.g. mesa-vulkan-drivers); using the CPU device");
        Self::cpu()
    }

    /// A device by spec: `cpu`, or `BACKEND:INDEX` as `kiln::adapters()` lists them
    /// (`vulkan:0`, `gl:0`, `metal:0`, `dx12:0`).
    pub fn from_spec(spec: &str) -> Result<Device> {
        let spec = spec.trim().to_ascii_lowercase();
        if spec == "cpu" {
            return Self::cpu();
        }
        let all = adapters::enumerate();
        let known: Vec<String> = all.iter().map(|(i, _)| i.spec.clone()).collect();
        let (info, adapter) = all
            .into_iter()
            .find(|(i, _)| i.spec == spec)
            .ok_or_else(|| Error::NoSuchDevice {
                spec: spec.clone(),
                msg: format!("no such adapter; available: cpu, {}", known.join(", ")),
            })?;
        Self::open(info, adapter)
    }

    /// One device per GPU: every adapter that opens, except a GL adapter of a GPU that a
    /// Vulkan, Metal or DX12 adapter already drives (GL is the slower path to the same chip,
    /// and on a headless H100 NVIDIA's GL adapter fails to open at all: "Parent device is
    /// lost"). `KILN_ADAPTERS=all` keeps those too; `all_adapters` always does. An adapter that
    /// fails to open is skipped with one warning per process.
    pub fn all_gpus() -> Vec<Device> {
        let every = std::env::var("KILN_ADAPTERS").is_ok_and(|v| v.eq_ignore_ascii_case("all"));
        let all = adapters::enumerate();
        let native: Vec<String> = all
            .iter()
            .filter(|(i, _)| i.backend != wgpu::Backend::Gl)
            .map(|(i, _)| adapters::gpu_name(&i.name).to_string())
            .collect();
        let wanted = all.into_iter().filter(|(i, _)| {
            every
                || i.backend != wgpu::Backend::Gl
                || !native.iter().any(|n| n == adapters::gpu_name(&i.name))
        });
        Self::open_all(wanted.collect())
    }

    /// Every GPU adapter that opens, GL duplicates of a GPU included: what the tests iterate
    /// over, so that the GL path stays covered where a software Vulkan adapter also exists.
    pub fn all_adapters() -> Vec<Device> {
        Self::open_all(adapters::enumerate())
    }

    fn open_all(adapters: Vec<(AdapterInfo, wgpu::Adapter)>) -> Vec<Device> {
        adapters
            .into_iter()
            .filter_map(|(info, adapter)| match Self::open(info.clone(), adapter) {
                Ok(d) => Some(d),
                Err(e) => {
                    static WARNED: Mutex<Vec<String>> = Mutex::new(Vec::new());
                    let mut warned = lock(&WARNED);
                    if !warned.contains(&info.spec) {
                        warned.push(info.spec.clone());
                        eprintln!(
                            "kiln: skipping adapter {} ({}): it fails to open: {e}",
                            info.spec, info.name
                        );
                    }
                    None
                }
            })
            .collect()
    }

    fn open(info: AdapterInfo, adapter: wgpu::Adapter) -> Result<Device> {
        let spec = info.spec.clone();
        let gpu = GpuDevice::new(info, adapter, AllocatorConfig::from_env()?)?;
        Ok(Device(Arc::new(Inner {
            spec,
            backend: Backend::Gpu(std::mem::ManuallyDrop::new(Box::new(gpu))),
            rng: Mutex::new((DEFAULT_SEED, 0)),
            relievers: pressure::Relievers::default(),
        })))
    }

    /// `cpu`, `vulkan:0`, ...
    pub fn spec(&self) -> &str {
        &self.0.spec
    }

    /// `cpu`, or `vulkan:0 (llvmpipe (LLVM 15.0.6, 256 bits))`.
    pub fn name(&self) -> String {
        match &self.0.backend {
            Backend::Cpu(_) => "cpu".into(),
            Backend::Gpu(g) => format!("{} ({})", self.0.spec, g.info.name),
            Backend::Plan(p) => format!("{} ({}, dry run)", self.0.spec, p.info.name),
        }
    }

    /// Whether this is the CPU device.
    pub fn is_cpu(&self) -> bool {
        matches!(self.0.backend, Backend::Cpu(_))
    }

    /// The adapter behind a GPU device; `None` for the CPU.
    pub fn adapter_info(&self) -> Option<&AdapterInfo> {
        match &self.0.backend {
            Backend::Cpu(_) => None,
            Backend::Gpu(g) => Some(&g.info),
            Backend::Plan(p) => Some(&p.info),
        }
    }

    /// A planning device for `target` (Note [Dry runs]): the program runs on it as on the
    /// target, through the same caching allocator with the target's settings, while no memory
    /// is allocated and no kernel runs. Every memory tool (`memory_stats`, `memory_summary`,
    /// snapshots, the profiler's timeline) reads it as a real device; reading a tensor's values
    /// is `Error::DryRun`.
    ///
    /// ```
    /// use kiln::{DType, Device, PlanTarget, Tensor};
    /// # fn main() -> kiln::Result<()> {
    /// let plan = Device::planning(PlanTarget::named("H100")?)?;
    /// let x = Tensor::zeros(&[8192, 50257], DType::F32, &plan)?; // 1.5 GiB, never allocated
    /// assert_eq!(plan.memory_allocated(), 1_646_821_376);
    /// assert!(matches!(x.to_vec::<f32>(), Err(kiln::Error::DryRun { .. })));
    /// # Ok(())
    /// # }
    /// ```
    pub fn planning(target: PlanTarget) -> Result<Device> {
        Ok(Device(Arc::new(Inner {
            spec: format!("plan:{}", target.info.spec),
            backend: Backend::Plan(Box::new(plan::PlanDevice::new(target)?)),
            rng: Mutex::new((DEFAULT_SEED, 0)),
            relievers: pressure::Relievers::default(),
        })))
    }

    /// A planning device for this GPU as it is now (`PlanTarget::like`): its adapter, memory,
    /// allocator settings and memory limit.
    pub fn planning_twin(&self) -> Result<Device> {
        Self::planning(PlanTarget::like(self)?)
    }

    /// Whether copies between this GPU and its pinned memory run beside its kernels, on a side
    /// queue (`KILN_COPY_QUEUE=transfer`, Note [Side queue]); for a planning device, whether
    /// its target's do (`PlanTarget::copy_queue`).
    pub fn copies_beside(&self) -> bool {
        match &self.0.backend {
            #[cfg(any(windows, all(unix, not(target_vendor = "apple"))))]
            Backend::Gpu(g) => g.side.is_some(),
            Backend::Plan(p) => p.copy_queue,
            _ => false,
        }
    }

    /// Whether this is a planning device: a dry run, where nothing is allocated or computed.
    pub fn is_dry_run(&self) -> bool {
        matches!(self.0.backend, Backend::Plan(_))
    }

    /// Whether f16 products may take the adapter's tensor cores (a GPU that opened them, or a
    /// planning device whose target has them), with the adapter's info.
    pub(crate) fn coop_f16_target(&self) -> Option<&AdapterInfo> {
        match &self.0.backend {
            Backend::Gpu(g) if g.coop_f16 => Some(&g.info),
            Backend::Plan(p) if p.coop_f16 => Some(&p.info),
            _ => None,
        }
    }

    /// The slot a GPU or planning device keeps for the launch path's state (`kernels` reads
    /// it), with the adapter whose kernels it holds and the tuning cache file its tuner reads
    /// (`None`: the user's).
    pub(crate) fn launch_slot(&self) -> Option<LaunchSlot<'_>> {
        match &self.0.backend {
            Backend::Cpu(_) => None,
            Backend::Gpu(g) => Some((&g.launch_state, &g.info, None)),
            Backend::Plan(p) => Some((&p.launch_state, &p.info, p.tuning.as_deref())),
        }
    }

    /// Replays a trace recorded from PyTorch through a fresh allocator on this device's real
    /// memory (GPU devices; expandable segments through Vulkan sparse binding where the device
    /// has it), comparing what `AllocTrace::replay` compares. The CPU device replays on the
    /// simulated source.
    pub fn replay_trace(
        &self,
        trace: &crate::alloc::replay::AllocTrace,
    ) -> Result<std::result::Result<usize, crate::alloc::replay::Mismatch>> {
        match self.gpu() {
            Some(g) => {
                let out = trace.replay_on(g.fresh_source());
                g.check("replay_trace")?;
                out
            }
            None => trace.replay(),
        }
    }

    pub(crate) fn gpu(&self) -> Option<&GpuDevice> {
        match &self.0.backend {
            Backend::Gpu(g) => Some(&***g),
            Backend::Cpu(_) | Backend::Plan(_) => None,
        }
    }

    /// Waits for all queued work (a sync point) and reports any wgpu error or device loss
    /// since the last sync point.
    pub fn synchronize(&self) -> Result<()> {
        match self.gpu() {
            Some(g) => g.synchronize(),
            None => Ok(()),
        }
    }

    /// Seeds this device's generator (`torch.manual_seed`); the next draws restart from it.
    pub fn manual_seed(&self, seed: u64) {
        *lock(&self.0.rng) = (seed, 0);
    }

    /// The seed of this device's generator.
    pub fn initial_seed(&self) -> u64 {
        lock(&self.0.rng).0
    }

    /// The generator's state (`torch.cuda.get_rng_state()`, whose Philox state is the same
    /// pair): a checkpoint saves it so that a resumed run draws what the interrupted one would.
    pub fn get_rng_state(&self) -> RngState {
        let (seed, offset) = *lock(&self.0.rng);
        RngState { seed, offset }
    }

    /// Restores `get_rng_state`'s value (`torch.cuda.set_rng_state`).
    pub fn set_rng_state(&self, state: RngState) {
        *lock(&self.0.rng) = (state.seed, state.offset);
    }

    /// (seed, offset) for a draw of `counters` counters, advancing the offset.
    pub(crate) fn advance_rng(&self, counters: u64) -> (u64, u64) {
        let mut rng = lock(&self.0.rng);
        let at = *rng;
        rng.1 = rng.1.wrapping_add(counters);
        at
    }

    // ---- memory: PyTorch's API, PyTorch's names ----

    /// Allocates `size_bytes` through the caching allocator. Zero bytes give an empty block that
    /// holds no memory, as PyTorch hands out a null pointer.
    pub fn allocate(&self, size_bytes: u64) -> Result<DeviceBlock> {
        DeviceBlock::allocate(self, size_bytes)
    }

    // ---- pinned host memory: PyTorch's host allocator API ----

    /// `torch.cuda.host_memory_stats()`: this GPU's pinned pool (empty for the CPU device). A
    /// planning device counts the blocks the target's pool would hand out: `save_on_cpu`'s
    /// pinned copies and the staging chunks of copies (Note [Dry runs]).
    pub fn host_memory_stats(&self) -> crate::host::HostStats {
        with_host!(self, h => h.stats(), else Default::default())
    }

    /// `torch.cuda.reset_peak_host_memory_stats()`.
    pub fn reset_peak_host_memory_stats(&self) {
        with_host!(self, h => h.reset_peak_stats(), else ())
    }

    /// `torch.cuda.reset_accumulated_host_memory_stats()`.
    pub fn reset_accumulated_host_memory_stats(&self) {
        with_host!(self, h => h.reset_accumulated_stats(), else ())
    }

    /// Frees every cached pinned block (`torch._C._host_emptyCache()`); blocks in use, or
    /// waiting for a copy that uses them, stay.
    pub fn empty_host_cache(&self) {
        with_host!(self, h => h.empty_cache(), else ())
    }

    /// The size of the chunks pageable copies are staged in (32 MiB by default; rounded up to
    /// 4 bytes). Smaller chunks let tests cover the chunked path with small tensors.
    pub fn set_staging_chunk_bytes(&self, bytes: u64) {
        if let Some(g) = self.gpu() {
            g.set_staging_chunk_bytes(bytes);
        }
    }

    /// The largest free block the cache holds (kiln's, beyond PyTorch's API): with
    /// `memory_reserved() - memory_allocated()`, how fragmented the cache is. The OOM error
    /// reports it too.
    pub fn largest_free_block(&self) -> u64 {
        with_alloc!(self, a => a.largest_free_block())
    }

    /// Bytes in blocks handed out to tensors (`allocated_bytes.all.current`).
    pub fn memory_allocated(&self) -> u64 {
        with_alloc!(self, a => a.stats().allocated_bytes.all().current as u64)
    }

    /// `torch.cuda.max_memory_allocated()`: the peak of `memory_allocated` since the last reset.
    pub fn max_memory_allocated(&self) -> u64 {
        with_alloc!(self, a => a.stats().allocated_bytes.all().peak as u64)
    }

    /// Bytes in segments the allocator holds, cached ones included (`reserved_bytes.all.current`).
    pub fn memory_reserved(&self) -> u64 {
        with_alloc!(self, a => a.stats().reserved_bytes.all().current as u64)
    }

    /// `torch.cuda.max_memory_reserved()`: the peak of `memory_reserved` since the last reset.
    pub fn max_memory_reserved(&self) -> u64 {
        with_alloc!(self, a => a.stats().reserved_bytes.all().peak as u64)
    }

    /// The 122 statistics of `torch.cuda.memory_stats()`, sorted by key.
    ///
    /// ```
    /// use kiln::{DType, Device, Tensor};
    /// # fn main() -> kiln::Result<()> {
    /// let dev = Device::cpu()?;
    /// let t = Tensor::zeros(&[256], DType::F32, &dev)?; // 1 KiB: a small-pool block
    /// let stats = dev.memory_stats();
    /// assert_eq!(stats.len(), 122);
    /// assert_eq!(stats["allocated_bytes.small_pool.current"], 1024);
    /// assert_eq!(stats["segment.small_pool.current"], 1); // one 2 MiB segment
    /// drop(t);
    /// assert_eq!(dev.memory_stats()["allocated_bytes.all.current"], 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn memory_stats(&self) -> BTreeMap<String, i64> {
        with_alloc!(self, a => a.stats().to_map())
    }

    /// `torch.cuda.reset_peak_memory_stats()`.
    pub fn reset_peak_memory_stats(&self) {
        with_alloc!(self, a => a.reset_peak_stats())
    }

    /// `torch.cuda.reset_accumulated_memory_stats()`.
    pub fn reset_accumulated_memory_stats(&self) {
        with_alloc!(self, a => a.reset_accumulated_stats())
    }

    /// Returns every wholly free cached segment to the device (after waiting for queued work).
    /// Live tensors are untouched; partly used segments stay.
    pub fn empty_cache(&self) {
        with_alloc!(self, a => a.empty_cache())
    }

    /// Caps reserved memory at `limit_bytes` (`None` removes the cap).
    pub fn set_memory_limit(&self, limit_bytes: Option<u64>) {
        with_alloc!(self, a => a.set_memory_limit(limit_bytes))
    }

    /// Caps reserved memory at floor(fraction × device capacity); an error where the backend
    /// cannot report capacity (use `set_memory_limit`).
    pub fn set_per_process_memory_fraction(&self, fraction: f64) -> Result<()> {
        with_alloc!(self, a => a.set_memory_fraction(fraction))
    }

    /// Replaces the allocator settings at run time (`_set_allocator_settings`).
    pub fn set_allocator_settings(&self, conf: &str) -> Result<()> {
        let config = AllocatorConfig::parse(conf)?;
        with_alloc!(self, a => a.set_config(config));
        Ok(())
    }

    /// PyTorch's `memory_summary` table, titled with kiln and the adapter.
    ///
    /// ```
    /// # fn main() -> kiln::Result<()> {
    /// let dev = kiln::Device::cpu()?;
    /// let t = kiln::Tensor::zeros(&[1 << 20], kiln::DType::F32, &dev)?;
    /// let summary = dev.memory_summary(false);
    /// assert!(summary.contains("Allocated memory"));
    /// assert!(summary.contains("4096 KiB")); // the 4 MiB tensor, as PyTorch prints it
    /// # drop(t);
    /// # Ok(())
    /// # }
    /// ```
    /// After PyTorch's table, one line of kiln's: the largest free cached block beside the
    /// reserved but unallocated bytes, so that fragmentation shows (PyTorch issue #29554).
    pub fn memory_summary(&self, abbreviated: bool) -> String {
        let title = format!("kiln memory summary, device {}", self.name());
        with_alloc!(self, a => {
            let mut out = memory_summary(a.stats(), &title, abbreviated);
            let s = a.stats();
            let cached = (s.reserved_bytes.all().current - s.allocated_bytes.all().current) as u64;
            let largest = a.largest_free_block();
            out.push_str(&format!(
                "kiln: largest free cached block {} of {} reserved but unallocated{}\n",
                crate::alloc::format_size(largest),
                crate::alloc::format_size(cached),
                if cached > largest {
                    " (fragmented: larger requests need new memory; see expandable_segments)"
                } else {
                    ""
                }
            ));
            out
        })
    }

    /// Segments, blocks, the trace ring and the settings (`torch.cuda.memory._snapshot()`).
    pub fn memory_snapshot(&self) -> Snapshot {
        with_alloc!(self, a => a.snapshot(0))
    }

    /// `torch.cuda.memory._dump_snapshot(path)`: the snapshot as a pickle PyTorch's viewers
    /// open, or as JSON when `path` ends in `.json` (the same dict).
    pub fn dump_snapshot(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        let path = path.as_ref();
        let snapshot = self.memory_snapshot();
        let bytes = if path.extension().is_some_and(|e| e == "json") {
            snapshot.to_json().into_bytes()
        } else {
            snapshot.to_pickle()
        };
        crate::base::write_atomic("dump_snapshot", path, &bytes)
    }

    /// Whether this device records an alloc/free trace now.
    pub fn is_recording_memory_history(&self) -> bool {
        with_alloc!(self, a => a.history_enabled() == Some(HistoryEnabled::All))
    }

    /// `torch.cuda.memory._record_memory_history`: `enabled = None` stops and clears.
    pub fn record_memory_history(
        &self,
        enabled: Option<HistoryEnabled>,
        context: HistoryContext,
        stacks: HistoryStacks,
        max_entries: usize,
    ) {
        with_alloc!(self, a => a.record_memory_history(enabled, context, stacks, max_entries))
    }

    /// `(free, total)` device memory where the backend reports it (`torch.cuda.mem_get_info`).
    pub fn mem_get_info(&self) -> (Option<u64>, Option<u64>) {
        let info = with_alloc!(self, a => {
            use crate::alloc::SegmentSource;
            a.source().mem_info()
        });
        (info.free, info.total)
    }
}

/// The wgpu device behind a GPU device, for benchmarks that compare kiln with raw wgpu.
pub fn raw_wgpu_device(device: &Device) -> Option<wgpu::Device> {
    device.gpu().map(|g| g.device.clone())
}

/// The wgpu queue behind a GPU device (for benchmarks against raw wgpu).
pub fn raw_wgpu_queue(device: &Device) -> Option<wgpu::Queue> {
    device.gpu().map(|g| g.queue.clone())
}

/// Whether `KILN_REQUIRE_GPU=1` asks that a GPU adapter exist.
pub fn gpu_required() -> bool {
    std::env::var("KILN_REQUIRE_GPU").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

/// The devices tests run on: every GPU adapter (GL duplicates included), then the CPU. Fails with `GpuRequired` when
/// `KILN_REQUIRE_GPU=1` and wgpu found no adapter.
pub fn test_devices() -> Result<Vec<Device>> {
    let mut devices = Device::all_adapters();
    if devices.is_empty() && gpu_required() {
        return Err(Error::GpuRequired);
    }
    devices.push(Device::cpu()?);
    Ok(devices)
}
