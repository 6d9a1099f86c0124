//! Planning devices: a GPU's caching allocator with no memory behind it and no kernel run, for
//! dry runs that tell, before a job starts, what it will allocate. Note [Dry runs].
//!
//! A planning device stands for a target: a real device of this machine (`PlanTarget::like`)
//! or a GPU named in kiln's table of known adapters (`PlanTarget::named`). Ops take the path
//! they would take on the target (its limits, its f16 and tensor-core kernels, the tuner's
//! remembered choices for its adapter), allocate through the same allocator code with the
//! target's settings, and record nothing: writes are dropped and reads are `Error::DryRun`.

use super::adapters::{AdapterInfo, KilnFeatures, KilnLimits};
use super::{lock, with_alloc, Backend, Device};
use crate::alloc::{AllocatorConfig, CachingAllocator, MemInfo, SegmentSource, SourceError};
use crate::host::{CachingHostAllocator, PinnedKind, SimulatedPinnedSource};
use crate::{Error, Result};
use std::sync::Mutex;

/// What a dry run plans for: the adapter its ops choose kernels for, the memory its allocator
/// may reserve, and the allocator's settings.
#[derive(Clone, Debug)]
pub struct PlanTarget {
    /// The adapter whose kernels the ops choose (limits, features, the tuner's records).
    pub info: AdapterInfo,
    /// Whether f16 products take tensor cores (cooperative matrices) there.
    pub coop_f16: bool,
    /// Device memory the source lends before it reports out-of-memory (the capacity of the
    /// GPU; `None`: unlimited).
    pub capacity: Option<u64>,
    /// Of the capacity, what the driver keeps for itself and other processes hold: the source
    /// never lends it, as a real GPU's driver does not (a live GPU's as its memory budget
    /// reports it now; a known GPU's as measured under kiln's Vulkan device).
    pub driver_held: u64,
    /// The largest segment one buffer may be (`max_buffer_size`).
    pub max_segment: u64,
    /// Why expandable segments cannot be mapped there (`None`: they can).
    pub expandable_unsupported: Option<String>,
    /// How out-of-memory reports name the device.
    pub describe: String,
    /// The allocator's settings (`KILN_ALLOC_CONF` of the target run).
    pub config: AllocatorConfig,
    /// `set_memory_limit`'s cap on reserved memory.
    pub memory_limit: Option<u64>,
    /// The tuning cache file whose choices the ops follow (an `autotune.json` copied from the
    /// target machine, whose kernels kiln tuned there); `None`: this machine's
    /// (`kernels::tune::cache_path`). A tuned choice can allocate (a transposed copy of an
    /// operand), so a plan for another machine is exact with that machine's file.
    pub tuning: Option<std::path::PathBuf>,
    /// Whether copies between the GPU and pinned memory run beside its kernels there, on a side
    /// queue (Note [Side queue]): `save_on_cpu` then lets them run ahead (Note [Offload
    /// ahead]), which the dry run allocates for as the real run does.
    pub copy_queue: bool,
}

impl PlanTarget {
    /// The target `device` is: its adapter and tensor-core switch, its memory and what of it
    /// the driver holds now (where the driver reports a budget), its allocator's settings and
    /// memory limit as they are now (a planning device's: its own target's). For the CPU
    /// device, an error.
    pub fn like(device: &Device) -> Result<PlanTarget> {
        let copy_queue = device.copies_beside();
        let (info, coop_f16, tuning) = match &device.0.backend {
            Backend::Gpu(g) => (g.info.clone(), g.coop_f16, None),
            Backend::Plan(p) => (p.info.clone(), p.coop_f16, p.tuning.clone()),
            Backend::Cpu(_) => {
                return Err(Error::InvalidArgument {
                    op: "PlanTarget::like",
                    msg: format!("{} is not a GPU device", device.name()),
                })
            }
        };
        let (
            config,
            memory_limit,
            capacity,
            driver_held,
            max_segment,
            expandable_unsupported,
            describe,
        ) = with_alloc!(device, a => {
            let s = a.source();
            // What the driver would not lend: the whole heap less what it would still lend
            // and what kiln holds (a plan of the whole heap found GPT-2 batches that then
            // failed on the H200).
            let reserved = a.stats().reserved_bytes.all().current as u64;
            let held = match (s.mem_info().free, s.mem_total()) {
                (Some(free), Some(total)) => total.saturating_sub(free + reserved),
                _ => 0,
            };
            (
                a.config().clone(),
                a.memory_limit(),
                s.mem_total(),
                held,
                s.max_segment_size(),
                s.expandable_unsupported(),
                s.describe(),
            )
        });
        Ok(PlanTarget {
            info,
            coop_f16,
            capacity,
            driver_held,
            max_segment,
            expandable_unsupported,
            describe,
            config,
            memory_limit,
            tuning,
            copy_queue,
        })
    }

    /// A GPU from kiln's table of adapters it has run on (`known_targets`), matched by a
    /// case-insensitive part of its name (`"H100"`, `"h200"`); the allocator settings are
    /// `KILN_ALLOC_CONF`'s. An error lists the known names when none or several match.
    pub fn named(name: &str) -> Result<PlanTarget> {
        let want = name.trim().to_ascii_lowercase();
        let known = known_targets();
        let found: Vec<&KnownTarget> = known
            .iter()
            .filter(|k| k.name.to_ascii_lowercase().contains(&want))
            .collect();
        let names = || known.iter().map(|k| k.name).collect::<Vec<_>>().join(", ");
        match found.as_slice() {
            [one] => Ok(one.target(AllocatorConfig::from_env()?)),
            [] => Err(Error::NoSuchDevice {
                spec: name.into(),
                msg: format!("no known GPU matches; known: {}", names()),
            }),
            _ => Err(Error::NoSuchDevice {
                spec: name.into(),
                msg: format!(
                    "several known GPUs match: {}",
                    found.iter().map(|k| k.name).collect::<Vec<_>>().join(", ")
                ),
            }),
        }
    }

    /// The same target with `config` as its allocator's settings.
    pub fn with_config(mut self, config: AllocatorConfig) -> Self {
        self.config = config;
        self
    }

    /// The same target with its ops following the tuned choices in `path` (an `autotune.json`
    /// from the target machine).
    pub fn with_tuning_cache(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.tuning = Some(path.into());
        self
    }

    /// The same target with its copies to and from pinned memory beside the kernels (a side
    /// queue) or on its stream.
    pub fn with_copy_queue(mut self, copy_queue: bool) -> Self {
        self.copy_queue = copy_queue;
        self
    }

    /// The same target with reserved memory capped at `limit` bytes (`set_memory_limit`).
    pub fn with_memory_limit(mut self, limit: Option<u64>) -> Self {
        self.memory_limit = limit;
        self
    }
}

/// One GPU of kiln's table: what its Vulkan adapter reported on a machine kiln ran on.
struct KnownTarget {
    name: &'static str,
    driver_info: &'static str,
    memory_bytes: u64,
    /// What the driver holds of it once kiln's Vulkan device is open (`PlanTarget::driver_held`).
    driver_bytes: u64,
    limits: KilnLimits,
}

/// NVIDIA's Vulkan limits on the data-centre GPUs kiln runs on, as the H200's adapter reported
/// them (driver 580.159.04, 2026-11-28; `adapters --debug`). The H100's are the same driver's.
const NVIDIA_LIMITS: KilnLimits = KilnLimits {
    max_buffer_size: 4_292_870_144,
    max_storage_buffer_binding_size: 2_147_483_644,
    min_storage_buffer_offset_alignment: 32,
    max_storage_buffers_per_shader_stage: 524_288,
    max_immediate_size: 256,
    max_compute_workgroups_per_dimension: 65_535,
    max_compute_invocations_per_workgroup: 1024,
    max_compute_workgroup_storage_size: 49_152,
};

/// What NVIDIA's driver 580.159.04 held of an H200's heap with kiln's Vulkan device open
/// (its memory budget, 2026-11-30: `PlanTarget::like`'s `driver_held`, which the `plan`
/// bench prints).
const H200_DRIVER_BYTES: u64 = 1_081_670_000;

/// The GPUs `PlanTarget::named` knows.
fn known_targets() -> Vec<KnownTarget> {
    vec![
        // The device-local heap is the card's whole memory, as `nvidia-smi` gives it (the H200's
        // heap, 150,754,820,096 bytes, is its 143,771 MiB): the H100 80GB's 81,559 MiB.
        KnownTarget {
            name: "NVIDIA H100 80GB HBM3",
            driver_info: "580.159.04",
            memory_bytes: 85_520_809_984,
            // Not measured there: the H200's, under the same driver.
            driver_bytes: H200_DRIVER_BYTES,
            limits: NVIDIA_LIMITS,
        },
        KnownTarget {
            name: "NVIDIA H200",
            driver_info: "580.159.04",
            memory_bytes: 150_754_820_096,
            driver_bytes: H200_DRIVER_BYTES,
            limits: NVIDIA_LIMITS,
        },
    ]
}

impl KnownTarget {
    fn target(&self, config: AllocatorConfig) -> PlanTarget {
        let info = AdapterInfo {
            spec: "vulkan:0".into(),
            name: self.name.into(),
            backend: wgpu::Backend::Vulkan,
            device_type: wgpu::DeviceType::DiscreteGpu,
            driver: "NVIDIA".into(),
            driver_info: self.driver_info.into(),
            features: KilnFeatures {
                shader_f16: true,
                timestamp_query: true,
                timestamp_query_inside_passes: true,
                subgroups: true,
                immediates: true,
                cooperative_matrix: true,
                sparse_binding: true,
                shader_int64: true,
            },
            limits: self.limits,
            memory_bytes: Some(self.memory_bytes),
        };
        PlanTarget {
            describe: format!("GPU 0 ({}, Vulkan)", self.name),
            info,
            coop_f16: true,
            capacity: Some(self.memory_bytes),
            driver_held: self.driver_bytes,
            max_segment: self.limits.max_buffer_size,
            expandable_unsupported: None,
            config,
            memory_limit: None,
            tuning: None,
            // NVIDIA's adapters have the transfer-only queue family the side queue takes.
            copy_queue: super::copy_queue_requested(),
        }
    }
}

/// A planning device's state: the target and an allocator over a source that lends sizes.
pub(crate) struct PlanDevice {
    pub info: AdapterInfo,
    pub coop_f16: bool,
    pub alloc: Mutex<CachingAllocator<PlanSource>>,
    /// The launch path's per-device state (the tuner's records for the target's adapter), in
    /// the slot a GPU device keeps for it.
    pub launch_state: std::sync::OnceLock<Box<dyn std::any::Any + Send + Sync>>,
    /// The CPU device its pinned tensors live on (as plain host memory).
    pub host_device: Device,
    /// The pinned pool's model: the blocks the real run's pool would hand out (`save_on_cpu`'s
    /// pinned copies, the staging chunks of copies) are counted here as it counts them
    /// (`host_memory_stats`), with no memory behind them (`PlannedPin`, `planned_staging`).
    pub host: Mutex<CachingHostAllocator<SimulatedPinnedSource>>,
    /// The tuning cache file its tuner reads (`PlanTarget::tuning`).
    pub tuning: Option<std::path::PathBuf>,
    /// `PlanTarget::copy_queue`.
    pub copy_queue: bool,
}

impl PlanDevice {
    pub fn new(target: PlanTarget) -> Result<PlanDevice> {
        let source = PlanSource {
            capacity: target.capacity,
            driver_held: target.driver_held.min(target.capacity.unwrap_or(0)),
            in_use: 0,
            max_segment: target.max_segment,
            expandable_unsupported: target.expandable_unsupported,
            describe: target.describe,
        };
        let mut alloc = CachingAllocator::new(source, target.config);
        alloc.set_memory_limit(target.memory_limit);
        Ok(PlanDevice {
            info: target.info,
            coop_f16: target.coop_f16,
            alloc: Mutex::new(alloc),
            launch_state: std::sync::OnceLock::new(),
            host_device: Device::cpu()?,
            host: Mutex::new(CachingHostAllocator::new(SimulatedPinnedSource {
                completed: u64::MAX,
                live_bytes: 0,
            })),
            tuning: target.tuning,
            copy_queue: target.copy_queue,
        })
    }
}

/// On a planning device, the staging chunks a pageable copy of `bytes` takes from the pinned
/// pool on the target (`device/transfer.rs`: chunks of 32 MiB with `DEPTH` in flight, a chunk's
/// block free for reuse `DEPTH` chunks later and the last ones at the next allocation, as they
/// are where the real copies finish in time); nothing on any other device. A dry run moves no
/// data, so the copies that would run (an upload from the host, a value read, `save_on_cpu`
/// without `pin_memory`) take their chunks here.
pub(crate) fn planned_staging(device: &Device, bytes: u64, kind: PinnedKind) -> Result<()> {
    if !device.is_dry_run() {
        return Ok(());
    }
    let chunk = super::gpu::DEFAULT_STAGING_CHUNK;
    let mut in_flight = std::collections::VecDeque::new();
    let mut done = 0;
    while done < bytes {
        let piece = chunk.min(bytes - done);
        if in_flight.len() >= super::transfer::DEPTH {
            in_flight.pop_front();
        }
        in_flight.push_back(planned_pin(device, piece, kind)?);
        done += piece;
    }
    Ok(())
}

/// A block of a planning device's pinned pool (`planned_pin`): counted as the real run's block
/// of the same size, with no memory behind it; dropping it frees it.
pub(crate) struct PlannedPin {
    device: Device,
    id: usize,
}

impl Drop for PlannedPin {
    fn drop(&mut self) {
        if let Backend::Plan(p) = &self.device.0.backend {
            lock(&p.host).free(self.id);
        }
    }
}

/// On a planning device, a block of its pinned pool of `size_bytes` for `kind` copies, as
/// `Tensor::empty_pinned` takes one on the target (`None` for zero bytes, or on any other
/// device). The block is marked used by a copy, as the real run's non-blocking copy marks it,
/// so that freed it goes back to its list at the next allocation: the real run's order when
/// its copies have completed by then (a dry run has no copies running behind it).
pub(crate) fn planned_pin(
    device: &Device,
    size_bytes: u64,
    kind: PinnedKind,
) -> Result<Option<PlannedPin>> {
    let Backend::Plan(p) = &device.0.backend else {
        return Ok(None);
    };
    let mut host = lock(&p.host);
    let Some(block) = host.allocate(size_bytes, kind)? else {
        return Ok(None);
    };
    host.record_event(block.id, 0);
    Ok(Some(PlannedPin {
        device: device.clone(),
        id: block.id,
    }))
}

/// The target's memory as sizes: segments and expandable pages count against its capacity,
/// and nothing is allocated. Events complete at once: a dry run has no GPU running behind it.
pub(crate) struct PlanSource {
    capacity: Option<u64>,
    driver_held: u64,
    in_use: u64,
    max_segment: u64,
    expandable_unsupported: Option<String>,
    describe: String,
}

impl PlanSource {
    fn lend(&mut self, bytes: u64) -> std::result::Result<(), SourceError> {
        if self
            .capacity
            .is_some_and(|cap| self.in_use.saturating_add(bytes) > cap - self.driver_held)
        {
            return Err(SourceError::OutOfMemory);
        }
        self.in_use += bytes;
        Ok(())
    }
}

impl SegmentSource for PlanSource {
    /// A segment is its size: there is no memory to reach.
    type Handle = u64;

    fn allocate(&mut self, size_bytes: u64) -> std::result::Result<u64, SourceError> {
        self.lend(size_bytes)?;
        Ok(size_bytes)
    }

    fn release(&mut self, size_bytes: u64) {
        self.in_use -= size_bytes;
    }

    fn mem_info(&self) -> MemInfo {
        MemInfo {
            total: self.capacity,
            free: self
                .capacity
                .map(|c| c.saturating_sub(self.in_use + self.driver_held)),
        }
    }

    fn max_segment_size(&self) -> u64 {
        self.max_segment
    }

    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn expandable_unsupported(&self) -> Option<String> {
        self.expandable_unsupported.clone()
    }

    fn reserve(&mut self, size_bytes: u64) -> std::result::Result<u64, SourceError> {
        Ok(size_bytes)
    }

    fn map(&mut self, _: &u64, _: u64, len: u64) -> std::result::Result<(), SourceError> {
        self.lend(len)
    }

    fn unmap(&mut self, _: &u64, _: u64, len: u64) {
        self.in_use -= len;
    }

    fn release_reservation(&mut self, _: u64) {}
}

/// What `max_batch_size` found: the largest batch whose step stays within the budget, with its
/// peaks, and what the next batch would need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchFit {
    /// The largest batch that fits (0: not even one).
    pub batch: usize,
    /// `max_memory_reserved` of that batch's dry run (0 for batch 0).
    pub peak_reserved: u64,
    /// `max_memory_allocated` of that batch's dry run.
    pub peak_allocated: u64,
    /// `max_memory_reserved` of `batch + 1` run with no budget and no capacity: what it would
    /// need (0 where `batch` is the limit asked for, or where it cannot run at any size).
    pub next_peak_reserved: u64,
    /// `max_memory_allocated` of `batch + 1` run with no budget.
    pub next_peak_allocated: u64,
    /// Why `batch + 1` does not run: the out-of-memory or too-large error of its dry run
    /// within the budget (empty where `batch` is the limit asked for).
    pub next_fails_with: String,
    /// Dry runs made.
    pub runs: usize,
}

/// The largest batch for which `step(device, batch)` stays within `budget` bytes of reserved
/// memory on `target` (its capacity where `budget` is `None`), found by dry runs: each on a
/// fresh planning device with the budget as its memory limit, so a batch fits exactly when
/// the allocator, releasing its cache and retrying as on the GPU, serves every request.
/// `step` builds what it needs on the device it is given (a model, an optimizer) and runs
/// what should fit: two training steps, where the optimizer's state appears in the first.
/// Batches are tried doubling from 1, then bisected (a step's memory grows with its batch);
/// at most `limit` is returned. A batch whose step fails with out-of-memory, or with
/// `Error::TooLarge` (a tensor larger than one of the target's bindings, a dispatch with more
/// workgroups than it takes), does not fit; any other error of `step` is returned.
///
/// ```
/// use kiln::{DType, PlanTarget, Tensor};
/// # fn main() -> kiln::Result<()> {
/// let target = PlanTarget::named("H100")?;
/// // Each batch item holds its own 1 GiB tensor (one tensor of `b` GiB would outgrow a
/// // binding): 70 fit in a 70 GiB budget, and the 71st does not.
/// let fit = kiln::device::max_batch_size(&target, Some(70 << 30), 1 << 20, |dev, b| {
///     let held = (0..b)
///         .map(|_| Tensor::empty(&[1 << 28], DType::F32, dev))
///         .collect::<kiln::Result<Vec<_>>>()?;
///     drop(held);
///     Ok(())
/// })?;
/// assert_eq!(fit.batch, 70);
/// assert_eq!(fit.next_peak_reserved, 71 << 30);
/// # Ok(())
/// # }
/// ```
pub fn max_batch_size(
    target: &PlanTarget,
    budget: Option<u64>,
    limit: usize,
    mut step: impl FnMut(&Device, usize) -> Result<()>,
) -> Result<BatchFit> {
    let budget = budget.or(target.memory_limit);
    let (mut runs, mut failure) = (0, String::new());
    // `None`: no limit and no capacity, for what a batch that does not fit would need.
    let mut run = |batch: usize, budget: Option<Option<u64>>| -> Result<Option<(u64, u64)>> {
        runs += 1;
        let mut target = target.clone();
        match budget {
            Some(limit) => target.memory_limit = limit,
            None => (target.memory_limit, target.capacity) = (None, None),
        }
        let device = Device::planning(target)?;
        match step(&device, batch) {
            Ok(()) => Ok(Some((
                device.max_memory_reserved(),
                device.max_memory_allocated(),
            ))),
            // A batch the target cannot bind or dispatch does not run there either.
            Err(e @ (Error::OutOfMemory(_) | Error::TooLarge { .. })) => {
                failure = e.to_string();
                Ok(None)
            }
            Err(e) => Err(e),
        }
    };
    // Doubling finds a batch that fails (or the limit), then bisection the edge: `lo` fits
    // (0 trivially), `hi` does not.
    let (mut lo, mut lo_peaks, mut hi) = (0usize, (0, 0), None);
    let mut b = 1usize;
    while b <= limit.max(1) && hi.is_none() {
        match run(b, Some(budget))? {
            Some(peaks) => (lo, lo_peaks) = (b, peaks),
            None => hi = Some(b),
        }
        b = b.saturating_mul(2).min(limit.max(1)).max(b + 1);
    }
    if let Some(mut h) = hi {
        while h - lo > 1 {
            let mid = lo + (h - lo) / 2;
            match run(mid, Some(budget))? {
                Some(peaks) => (lo, lo_peaks) = (mid, peaks),
                None => h = mid,
            }
        }
    }
    let (next_peak_reserved, next_peak_allocated) = match lo < limit {
        true => run(lo + 1, None)?.unwrap_or_default(),
        false => (0, 0),
    };
    if lo < limit {
        // The failure on record may be a larger batch's: say the next batch's own.
        run(lo + 1, Some(budget))?;
    }
    Ok(BatchFit {
        batch: lo.min(limit),
        peak_reserved: lo_peaks.0,
        peak_allocated: lo_peaks.1,
        next_peak_reserved,
        next_peak_allocated,
        next_fails_with: failure,
        runs,
    })
}
