//! Expandable segments on real GPU memory: Vulkan sparse buffers. A reserved range is a
//! `VkBuffer` created with `SPARSE_BINDING | SPARSE_RESIDENCY` and no memory; a page is a
//! `VkDeviceMemory` bound into it with `vkQueueBindSparse` (PyTorch's `cuMemCreate` +
//! `cuMemMap`), unbound and freed on unmap. wgpu adopts the buffer (`Buffer::from_raw` +
//! `Device::create_buffer_from_hal`), so tensors bind their sub-ranges as in any segment.
//!
//! Ordering with kiln's submissions, on the one queue: every bind runs under the stream's lock
//! (no submission can interleave) and signals a timeline semaphore. A map returns once its bind
//! is queued, and the host waits for the value before the stream's next submission, so work
//! submitted after it sees the page while the bind runs as the host records that work. An
//! unmap first submits what is recorded, waits for the device to go idle and for every bind so
//! far, so a page is never unbound while a queued kernel may still read it; the page's memory
//! is freed once the unbind has signalled. A range given back with nothing bound is kept for
//! the next reservation of its size (`release`).
//!
//! wgpu creates the Vulkan device itself and enables no sparse features, so on adapters that
//! have them kiln creates the device through wgpu-hal (`device_from_raw`) with wgpu's own
//! extensions and features plus `sparseBinding` and `sparseResidencyBuffer`.

#![cfg(any(windows, all(unix, not(target_vendor = "apple"))))]

use super::stream::Stream;
use ash::vk;
use std::collections::HashMap;
use std::sync::Mutex;
use wgpu::hal::api::Vulkan;

/// `KILN_SPARSE_PROFILE=1`: each map and unmap prints where its time went (stderr).
pub(crate) fn profiling() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("KILN_SPARSE_PROFILE").is_ok_and(|v| v == "1"))
}

/// Whether the adapter's Vulkan device can back sparse, partially resident buffers on the
/// queue family wgpu uses (family 0).
pub(crate) fn supported(adapter: &wgpu::Adapter) -> bool {
    if adapter.get_info().backend != wgpu::Backend::Vulkan
        || std::env::var("KILN_DISABLE_SPARSE").is_ok()
    {
        return false;
    }
    // SAFETY: only properties of the physical device are read.
    let Some(hal) = (unsafe { adapter.as_hal::<Vulkan>() }) else {
        return false;
    };
    let instance = hal.shared_instance().raw_instance();
    let physical = hal.raw_physical_device();
    // SAFETY: valid handles owned by wgpu-hal.
    let (features, families) = unsafe {
        (
            instance.get_physical_device_features(physical),
            instance.get_physical_device_queue_family_properties(physical),
        )
    };
    features.sparse_binding == vk::TRUE
        && features.sparse_residency_buffer == vk::TRUE
        && families
            .first()
            .is_some_and(|f| f.queue_flags.contains(vk::QueueFlags::SPARSE_BINDING))
}

/// A device and queue opened by kiln, and its side queue's family and first index if any.
pub(crate) type OpenedDevice = (wgpu::Device, wgpu::Queue, Option<(u32, u32)>);

/// Opens the device as `Adapter::request_device` would, with the sparse features on, and with
/// two more queues for copies where the adapter has them (`side_queue::choose`): their family
/// and first index come back with the device.
pub(crate) fn open_device(
    adapter: &wgpu::Adapter,
    desc: &wgpu::DeviceDescriptor<'_>,
) -> Result<OpenedDevice, String> {
    let mut side = None;
    let open = {
        // SAFETY: the hal adapter is used only to create the device below.
        let hal = unsafe { adapter.as_hal::<Vulkan>() }.ok_or("not a Vulkan adapter")?;
        let features = desc.required_features;
        let mut extensions = hal.required_device_extensions(features);
        let mut phd = hal.physical_device_features(&extensions, features);
        let instance = hal.shared_instance().raw_instance();
        // Memory and semaphores CUDA can import, for NCCL (Note [Exported memory]).
        #[cfg(unix)]
        {
            // SAFETY: a valid physical device of this instance.
            let available = unsafe {
                instance.enumerate_device_extension_properties(hal.raw_physical_device())
            }
            .unwrap_or_default();
            let has = |name: &std::ffi::CStr| {
                available
                    .iter()
                    .any(|e| e.extension_name_as_c_str().ok() == Some(name))
            };
            if super::external::EXTENSIONS.iter().all(|e| has(e)) {
                extensions.extend(super::external::EXTENSIONS);
            }
        }
        // SAFETY: a valid physical device of this instance.
        let families = unsafe {
            instance.get_physical_device_queue_family_properties(hal.raw_physical_device())
        };
        let priorities = [1.0f32; 3];
        let mut queues = vec![(0u32, 1u32)];
        // The side queue's two lanes: queues `first` and `first + 1` of `family`.
        if let Some((family, first)) = super::side_queue::choose(&families) {
            match queues.iter_mut().find(|(f, _)| *f == family) {
                Some((_, count)) => *count = first + 2,
                None => queues.push((family, first + 2)),
            }
            side = Some((family, first));
        }
        let family: Vec<vk::DeviceQueueCreateInfo> = queues
            .iter()
            .map(|&(f, n)| {
                vk::DeviceQueueCreateInfo::default()
                    .queue_family_index(f)
                    .queue_priorities(&priorities[..n as usize])
            })
            .collect();
        let names: Vec<*const std::ffi::c_char> = extensions.iter().map(|e| e.as_ptr()).collect();
        let info = vk::DeviceCreateInfo::default()
            .queue_create_infos(&family)
            .enabled_extension_names(&names);
        let mut info = phd.add_to_device_create(info);
        // wgpu's core features, plus the two sparse ones.
        // SAFETY: `add_to_device_create` points `p_enabled_features` at `phd`'s core features,
        // which live until the end of this block.
        let mut core = unsafe { *info.p_enabled_features };
        core.sparse_binding = vk::TRUE;
        core.sparse_residency_buffer = vk::TRUE;
        info.p_enabled_features = &core;
        // SAFETY: the create info is wgpu-hal's own (extensions, features, queue family 0) with
        // two features the adapter reports (`supported`).
        let raw = unsafe { instance.create_device(hal.raw_physical_device(), &info, None) }
            .map_err(|e| format!("vkCreateDevice with sparse binding: {e}"))?;
        // SAFETY: `raw` was created from this adapter with wgpu-hal's extensions; wgpu-hal owns
        // and destroys it (no drop callback).
        unsafe {
            hal.device_from_raw(
                raw,
                None,
                &extensions,
                features,
                &desc.required_limits,
                &desc.memory_hints,
                0,
                0,
            )
        }
        .map_err(|e| format!("{e}"))?
    };
    // SAFETY: `open` comes from this adapter, with exactly the requested features.
    let (device, queue) =
        unsafe { adapter.create_device_from_hal(open, desc) }.map_err(|e| e.to_string())?;
    Ok((device, queue, side))
}

/// The Vulkan side of a device's expandable segments.
pub(crate) struct SparseMemory {
    device: ash::Device,
    queue: vk::Queue,
    /// Counts binds: bind n signals value n.
    timeline: vk::Semaphore,
    binds: u64,
    /// Device-local memory types the sparse buffers accept, per range.
    memory_type: HashMap<vk::Buffer, u32>,
    /// Memory bound at (range, offset), one page each.
    pages: HashMap<(vk::Buffer, u64), vk::DeviceMemory>,
    memory_properties: vk::PhysicalDeviceMemoryProperties,
    /// Ranges given back with nothing bound, kept for reuse (see `release`).
    spare: Vec<wgpu::Buffer>,
}

// SAFETY: the Vulkan handles are plain identifiers; every use is behind the allocator's mutex
// and, for the queue, the stream's.
unsafe impl Send for SparseMemory {}

/// The first device-local memory type among `allowed` (a buffer's `memory_type_bits`).
pub(crate) fn device_local_type(
    props: &vk::PhysicalDeviceMemoryProperties,
    allowed: u32,
) -> Option<u32> {
    (0..props.memory_type_count).find(|&i| {
        allowed & (1 << i) != 0
            && props.memory_types[i as usize]
                .property_flags
                .contains(vk::MemoryPropertyFlags::DEVICE_LOCAL)
    })
}

fn raw_buffer(buffer: &wgpu::Buffer) -> Option<vk::Buffer> {
    // SAFETY: only the handle is read.
    unsafe { buffer.as_hal::<Vulkan>() }.map(|b| unsafe { b.raw_handle() })
}

impl SparseMemory {
    pub(crate) fn new(device: &wgpu::Device, adapter: &wgpu::Adapter) -> Option<SparseMemory> {
        // SAFETY: the device's raw handles are cloned for calls kiln makes itself; they stay
        // valid while the wgpu device lives, which the source holding this outlives.
        let hal = unsafe { device.as_hal::<Vulkan>() }?;
        let raw = hal.raw_device().clone();
        let raw_queue = hal.raw_queue();
        let hal_adapter = unsafe { adapter.as_hal::<Vulkan>() }?;
        let instance = hal_adapter.shared_instance().raw_instance();
        // SAFETY: valid handles owned by wgpu-hal.
        let memory_properties = unsafe {
            instance.get_physical_device_memory_properties(hal_adapter.raw_physical_device())
        };
        let mut kind = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk::SemaphoreType::TIMELINE)
            .initial_value(0);
        // SAFETY: a timeline semaphore on this device (wgpu-hal enables timeline semaphores
        // where the device has them; without them, no expandable segments), destroyed in Drop.
        let timeline = unsafe {
            raw.create_semaphore(
                &vk::SemaphoreCreateInfo::default().push_next(&mut kind),
                None,
            )
        }
        .ok()?;
        Some(SparseMemory {
            device: raw,
            queue: raw_queue,
            timeline,
            binds: 0,
            memory_type: HashMap::new(),
            pages: HashMap::new(),
            memory_properties,
            spare: Vec::new(),
        })
    }

    /// A sparse buffer of `size` bytes with nothing bound, adopted by wgpu.
    pub(crate) fn reserve(
        &mut self,
        device: &wgpu::Device,
        size: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<wgpu::Buffer, String> {
        if let Some(at) = self
            .spare
            .iter()
            .position(|b| b.size() == size && b.usage() == usage)
        {
            return Ok(self.spare.swap_remove(at));
        }
        let info = vk::BufferCreateInfo::default()
            .size(size)
            .flags(vk::BufferCreateFlags::SPARSE_BINDING | vk::BufferCreateFlags::SPARSE_RESIDENCY)
            .usage(
                vk::BufferUsageFlags::STORAGE_BUFFER
                    | vk::BufferUsageFlags::TRANSFER_SRC
                    | vk::BufferUsageFlags::TRANSFER_DST,
            )
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: the device enabled sparseBinding and sparseResidencyBuffer (`open_device`).
        let raw = unsafe { self.device.create_buffer(&info, None) }
            .map_err(|e| format!("creating a {size}-byte sparse buffer: {e}"))?;
        // SAFETY: `raw` was just created on this device.
        let req = unsafe { self.device.get_buffer_memory_requirements(raw) };
        let Some(index) = device_local_type(&self.memory_properties, req.memory_type_bits) else {
            // SAFETY: nothing uses the buffer yet.
            unsafe { self.device.destroy_buffer(raw, None) };
            return Err("no device-local memory type for sparse buffers".into());
        };
        self.memory_type.insert(raw, index);
        // SAFETY: created on this device with the usage below; wgpu-hal destroys it when the
        // wgpu buffer goes (`from_raw`), after every page was unbound and freed here.
        let hal = unsafe { wgpu::hal::vulkan::Buffer::from_raw(raw) };
        Ok(unsafe {
            device.create_buffer_from_hal::<Vulkan>(
                hal,
                &wgpu::BufferDescriptor {
                    label: Some("kiln expandable segment"),
                    size,
                    usage,
                    mapped_at_creation: false,
                },
            )
        })
    }

    /// Queues the bind of `memory` (or nothing) at `offset..offset + len` of `buffer`; it
    /// signals the returned timeline value when done.
    fn bind(
        &mut self,
        stream: &Mutex<Stream>,
        buffer: vk::Buffer,
        offset: u64,
        len: u64,
        memory: vk::DeviceMemory,
    ) -> Result<u64, vk::Result> {
        // Under the stream's lock: no submission interleaves with the bind on the queue.
        let _stream = super::lock(stream);
        let binds = [vk::SparseMemoryBind::default()
            .resource_offset(offset)
            .size(len)
            .memory(memory)
            .memory_offset(0)];
        let buffers = [vk::SparseBufferMemoryBindInfo::default()
            .buffer(buffer)
            .binds(&binds)];
        let value = self.binds + 1;
        let (sems, values) = ([self.timeline], [value]);
        let mut timeline =
            vk::TimelineSemaphoreSubmitInfo::default().signal_semaphore_values(&values);
        let info = [vk::BindSparseInfo::default()
            .buffer_binds(&buffers)
            .signal_semaphores(&sems)
            .push_next(&mut timeline)];
        // SAFETY: the queue is not used by anyone else while the stream's lock is held; the
        // semaphore is ours.
        unsafe {
            self.device
                .queue_bind_sparse(self.queue, &info, vk::Fence::null())?
        };
        self.binds = value;
        Ok(value)
    }

    /// Waits on the host until bind `value` has run.
    fn wait_for(&self, value: u64) -> Result<(), vk::Result> {
        wait_timeline(&self.device, self.timeline, value)
    }

    /// Allocates one page of device memory and binds it at `offset`, waiting for the bind.
    pub(crate) fn map(
        &mut self,
        stream: &Mutex<Stream>,
        buffer: &wgpu::Buffer,
        offset: u64,
        len: u64,
    ) -> Result<(), crate::alloc::SourceError> {
        use crate::alloc::SourceError;
        let raw = raw_buffer(buffer).ok_or(SourceError::Other("not a Vulkan buffer".into()))?;
        let index = *self
            .memory_type
            .get(&raw)
            .ok_or(SourceError::Other("not a reserved range".into()))?;
        let info = vk::MemoryAllocateInfo::default()
            .allocation_size(len)
            .memory_type_index(index);
        let started = std::time::Instant::now();
        let allocate = || {
            // SAFETY: a plain allocation on this device, freed after its unbind or in `Drop`.
            unsafe { self.device.allocate_memory(&info, None) }
        };
        let out_of_memory = |e: vk::Result| {
            matches!(
                e,
                vk::Result::ERROR_OUT_OF_DEVICE_MEMORY | vk::Result::ERROR_OUT_OF_HOST_MEMORY
            )
        };
        let memory = match allocate() {
            Ok(m) => m,
            Err(e) if out_of_memory(e) => return Err(SourceError::OutOfMemory),
            Err(e) => return Err(SourceError::Other(format!("vkAllocateMemory: {e}"))),
        };
        let allocated = started.elapsed();
        let value = match self.bind(stream, raw, offset, len, memory) {
            Ok(v) => v,
            Err(e) => {
                // SAFETY: the memory was never bound.
                unsafe { self.device.free_memory(memory, None) };
                return Err(SourceError::Other(format!("vkQueueBindSparse: {e}")));
            }
        };
        // The host waits for the bind before the next submission, not here: Vulkan does not
        // order a sparse bind before later submissions, and the bind (about 0.2 ms on the H100,
        // longer behind queued work) runs while the host records the kernels that use the page.
        // (Making wgpu's next submission wait on the GPU instead, with wgpu-hal's
        // `Queue::add_wait_semaphore`, lost the device on the H100 after a few dozen maps with
        // no work submitted between them.)
        let (device, timeline) = (self.device.clone(), self.timeline);
        super::lock(stream).before_next_submit(Box::new(move || {
            // A failed wait means device loss, which the next sync point reports.
            let _ = wait_timeline(&device, timeline, value);
        }));
        if profiling() {
            eprintln!(
                "kiln sparse: map {len} bytes at {offset}: vkAllocateMemory {:.1} us, \
                 vkQueueBindSparse {:.1} us",
                allocated.as_secs_f64() * 1e6,
                (started.elapsed() - allocated).as_secs_f64() * 1e6
            );
        }
        self.pages.insert((raw, offset), memory);
        Ok(())
    }

    /// Unbinds the page at `offset` (the caller has waited for the device) and frees it once
    /// the unbind has run.
    pub(crate) fn unmap(
        &mut self,
        stream: &Mutex<Stream>,
        buffer: &wgpu::Buffer,
        offset: u64,
        len: u64,
    ) {
        let Some(raw) = raw_buffer(buffer) else {
            return;
        };
        let Some(memory) = self.pages.remove(&(raw, offset)) else {
            return;
        };
        let started = std::time::Instant::now();
        // Every earlier bind first (a map's wait may still be pending on the stream).
        let _ = self.wait_for(self.binds);
        match self.bind(stream, raw, offset, len, vk::DeviceMemory::null()) {
            Ok(value) => {
                // Once `value` is signalled the page is unbound, and no submitted work uses it
                // (the caller waited for idle). Freed here, on this thread: freeing on another
                // thread while binds went on lost the device on the H100 within a few dozen
                // maps.
                if self.wait_for(value).is_ok() {
                    // SAFETY: unbound and unused, as above.
                    unsafe { self.device.free_memory(memory, None) };
                }
                if profiling() {
                    eprintln!(
                        "kiln sparse: unmap {len} bytes at {offset}: vkQueueBindSparse, wait and \
                         vkFreeMemory {:.1} us",
                        started.elapsed().as_secs_f64() * 1e6
                    );
                }
            }
            // Still bound: keep it alive rather than free memory the buffer may touch.
            Err(_) => {
                self.pages.insert((raw, offset), memory);
            }
        }
    }

    /// Forgets a range with nothing bound.
    /// Takes back a range with nothing bound. Address space costs nothing, so the sparse
    /// buffer is kept for the next `reserve` of its size (creating one takes about a
    /// millisecond on the H100) rather than destroyed; returns what is not kept.
    pub(crate) fn release(&mut self, buffer: wgpu::Buffer) -> Option<wgpu::Buffer> {
        if self.spare.len() < SPARE_RANGES {
            self.spare.push(buffer);
            return None;
        }
        if let Some(raw) = raw_buffer(&buffer) {
            self.memory_type.remove(&raw);
        }
        Some(buffer)
    }
}

/// Waits on the host until `timeline` reaches `value` (a bind's signal).
fn wait_timeline(
    device: &ash::Device,
    timeline: vk::Semaphore,
    value: u64,
) -> Result<(), vk::Result> {
    let (sems, values) = ([timeline], [value]);
    let wait = vk::SemaphoreWaitInfo::default()
        .semaphores(&sems)
        .values(&values);
    // SAFETY: `timeline` is a `SparseMemory`'s, alive until its `Drop`, which waits for the
    // device first; `value` was submitted for signalling by `bind`.
    unsafe { device.wait_semaphores(&wait, u64::MAX) }
}

/// Ranges kept for reuse: one per pool covers the usual case (a pool's range given back by
/// `empty_cache` and reserved again at the next allocation).
const SPARE_RANGES: usize = 2;

impl Drop for SparseMemory {
    fn drop(&mut self) {
        // SAFETY: the device is idle or being torn down with its source; nothing is queued
        // that uses these pages any more.
        unsafe {
            let _ = self.device.device_wait_idle();
            for (_, memory) in self.pages.drain() {
                self.device.free_memory(memory, None);
            }
            self.device.destroy_semaphore(self.timeline, None);
        }
    }
}
