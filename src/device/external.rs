//! Memory and timeline semaphores that another driver imports: CUDA, for NCCL's collectives
//! (`distributed::nccl`). See Note [Exported memory].

// Note [Exported memory]
// ~~~~~~~~~~~~~~~~~~~~~~
// wgpu gives no way to share a buffer with another API, so kiln makes the memory itself where
// it opened the Vulkan device (`sparse::open_device` enables `VK_KHR_external_memory_fd` and
// `VK_KHR_external_semaphore_fd` where the adapter has them):
// - a segment of the allocator's `EXTERNAL_STREAM` is a `VkBuffer` with a dedicated
//   allocation made exportable as an opaque file descriptor, adopted by wgpu
//   (`create_buffer_from_hal`), so that kernels bind its blocks as any segment's. CUDA imports
//   the descriptor (`cuImportExternalMemory`, dedicated) and maps the whole allocation once per
//   segment; a block is the mapping plus the block's offset;
// - a timeline semaphore exported the same way orders wgpu's queue and a CUDA stream both ways
//   without a host wait: wgpu's queue signals a value with a submission, the stream waits for
//   it (`cuWaitExternalSemaphoresAsync`), and the reverse.
// Importing dups nothing: the descriptor moves into CUDA, which holds the allocation until it
// destroys its import, so a segment released here stays valid for CUDA's late use and is
// freed by the driver when both let go. Each segment carries a serial, so that an import is
// never reused for a later segment that got the same `VkBuffer` handle.

// The importing side is `distributed::nccl`, behind the `nccl` feature; without it only the
// allocation side is used.
#![cfg_attr(not(feature = "nccl"), allow(dead_code))]

use crate::alloc::SourceError;
use ash::vk;
use std::collections::HashMap;
use std::os::fd::{FromRawFd, OwnedFd};
use wgpu::hal::api::Vulkan;

/// The device extensions exported memory needs, as `open_device` enables them.
pub(crate) const EXTENSIONS: [&std::ffi::CStr; 2] = [
    ash::khr::external_memory_fd::NAME,
    ash::khr::external_semaphore_fd::NAME,
];

const HANDLE: vk::ExternalMemoryHandleTypeFlags = vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD;

/// One exportable segment.
struct Segment {
    memory: vk::DeviceMemory,
    /// The allocation's size (what CUDA imports), at least the buffer's.
    bytes: u64,
    serial: u64,
}

/// What CUDA needs to import a segment.
pub(crate) struct ExportedSegment {
    pub fd: OwnedFd,
    /// The allocation's size.
    pub bytes: u64,
}

/// A device's exportable memory and semaphores (where its extensions are enabled).
pub(crate) struct External {
    device: ash::Device,
    memory_fd: ash::khr::external_memory_fd::Device,
    semaphore_fd: ash::khr::external_semaphore_fd::Device,
    memory_properties: vk::PhysicalDeviceMemoryProperties,
    segments: HashMap<vk::Buffer, Segment>,
    next_serial: u64,
    /// The physical device's UUID (`VkPhysicalDeviceIDProperties::deviceUUID`), which CUDA
    /// reports for the same GPU (`cuDeviceGetUuid`).
    pub uuid: [u8; 16],
}

// SAFETY: the Vulkan handles are plain identifiers; `External` lives in the allocator's source,
// used under its mutex.
unsafe impl Send for External {}

fn raw_buffer(buffer: &wgpu::Buffer) -> Option<vk::Buffer> {
    // SAFETY: only the handle is read.
    unsafe { buffer.as_hal::<Vulkan>() }.map(|b| unsafe { b.raw_handle() })
}

impl External {
    /// `None` where the device was not opened with both extensions (not kiln's own Vulkan
    /// device, or an adapter without them).
    pub(crate) fn new(device: &wgpu::Device, adapter: &wgpu::Adapter) -> Option<External> {
        // SAFETY: the raw handles are cloned for kiln's own calls; they stay valid while the
        // wgpu device lives, which the source holding this keeps beside it.
        let hal = unsafe { device.as_hal::<Vulkan>() }?;
        if !EXTENSIONS
            .iter()
            .all(|e| hal.enabled_device_extensions().contains(e))
        {
            return None;
        }
        let raw = hal.raw_device().clone();
        let hal_adapter = unsafe { adapter.as_hal::<Vulkan>() }?;
        let instance = hal_adapter.shared_instance().raw_instance();
        let physical = hal_adapter.raw_physical_device();
        let mut id = vk::PhysicalDeviceIDProperties::default();
        let mut props = vk::PhysicalDeviceProperties2::default().push_next(&mut id);
        // SAFETY: valid handles owned by wgpu-hal; Vulkan 1.1 (the extensions need it).
        let memory_properties = unsafe {
            instance.get_physical_device_properties2(physical, &mut props);
            instance.get_physical_device_memory_properties(physical)
        };
        let uuid = id.device_uuid;
        Some(External {
            memory_fd: ash::khr::external_memory_fd::Device::new(instance, &raw),
            semaphore_fd: ash::khr::external_semaphore_fd::Device::new(instance, &raw),
            device: raw,
            memory_properties,
            segments: HashMap::new(),
            next_serial: 1,
            uuid,
        })
    }

    /// A segment of `size` bytes whose memory can be exported, adopted by wgpu.
    pub(crate) fn allocate(
        &mut self,
        device: &wgpu::Device,
        size: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<wgpu::Buffer, SourceError> {
        let mut external = vk::ExternalMemoryBufferCreateInfo::default().handle_types(HANDLE);
        let info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(
                vk::BufferUsageFlags::STORAGE_BUFFER
                    | vk::BufferUsageFlags::TRANSFER_SRC
                    | vk::BufferUsageFlags::TRANSFER_DST,
            )
            .sharing_mode(vk::SharingMode::EXCLUSIVE)
            .push_next(&mut external);
        let d = &self.device;
        // SAFETY: the device enabled VK_KHR_external_memory_fd (`new`).
        let raw = unsafe { d.create_buffer(&info, None) }
            .map_err(|e| SourceError::Other(format!("an exportable {size}-byte buffer: {e}")))?;
        // SAFETY: `raw` was just created on this device.
        let req = unsafe { d.get_buffer_memory_requirements(raw) };
        let index = super::sparse::device_local_type(&self.memory_properties, req.memory_type_bits);
        let mut export = vk::ExportMemoryAllocateInfo::default().handle_types(HANDLE);
        let mut dedicated = vk::MemoryDedicatedAllocateInfo::default().buffer(raw);
        let memory = index.map(|index| {
            let alloc = vk::MemoryAllocateInfo::default()
                .allocation_size(req.size)
                .memory_type_index(index)
                .push_next(&mut export)
                .push_next(&mut dedicated);
            // SAFETY: an allocation of a memory type the buffer accepts, for this buffer alone.
            unsafe { d.allocate_memory(&alloc, None) }
        });
        let memory = match memory {
            Some(Ok(m)) => m,
            failed => {
                // SAFETY: nothing uses the buffer yet.
                unsafe { d.destroy_buffer(raw, None) };
                return Err(match failed {
                    Some(Err(vk::Result::ERROR_OUT_OF_DEVICE_MEMORY)) => SourceError::OutOfMemory,
                    Some(Err(e)) => SourceError::Other(format!("exportable memory: {e}")),
                    _ => SourceError::Other("no device-local memory type for the buffer".into()),
                });
            }
        };
        // SAFETY: fresh memory of the buffer's requirements, dedicated to it.
        if let Err(e) = unsafe { d.bind_buffer_memory(raw, memory, 0) } {
            // SAFETY: neither is used.
            unsafe {
                d.destroy_buffer(raw, None);
                d.free_memory(memory, None);
            }
            return Err(SourceError::Other(format!(
                "binding exportable memory: {e}"
            )));
        }
        let serial = self.next_serial;
        self.next_serial += 1;
        self.segments.insert(
            raw,
            Segment {
                memory,
                bytes: req.size,
                serial,
            },
        );
        // SAFETY: created on this device with the usages below; wgpu-hal destroys the buffer
        // when the wgpu buffer goes, and `release` frees its memory after that.
        let hal = unsafe { wgpu::hal::vulkan::Buffer::from_raw(raw) };
        Ok(unsafe {
            device.create_buffer_from_hal::<Vulkan>(
                hal,
                &wgpu::BufferDescriptor {
                    label: Some("kiln exportable segment"),
                    size,
                    usage,
                    mapped_at_creation: false,
                },
            )
        })
    }

    /// Whether `buffer` is an exportable segment of this device.
    pub(crate) fn owns(&self, buffer: &wgpu::Buffer) -> bool {
        raw_buffer(buffer).is_some_and(|b| self.segments.contains_key(&b))
    }

    /// Drops an exportable segment and frees its memory. The caller has waited for the
    /// device: nothing queued uses it.
    pub(crate) fn release(&mut self, buffer: wgpu::Buffer) {
        let seg = raw_buffer(&buffer).and_then(|b| self.segments.remove(&b));
        drop(buffer);
        if let Some(seg) = seg {
            // SAFETY: the device is idle for this buffer and its wgpu handle is gone; Vulkan
            // allows freeing memory a not yet destroyed buffer is bound to, which is then
            // never used. An import in CUDA keeps the allocation (Note [Exported memory]).
            unsafe { self.device.free_memory(seg.memory, None) };
        }
    }

    /// A new descriptor for `buffer`'s memory; `None` if it is not an exportable segment.
    pub(crate) fn export(&self, buffer: &wgpu::Buffer) -> Option<Result<ExportedSegment, String>> {
        let seg = self.segments.get(&raw_buffer(buffer)?)?;
        let info = vk::MemoryGetFdInfoKHR::default()
            .memory(seg.memory)
            .handle_type(HANDLE);
        // SAFETY: memory allocated exportable as an opaque fd on this device.
        Some(
            unsafe { self.memory_fd.get_memory_fd(&info) }
                .map(|fd| ExportedSegment {
                    // SAFETY: vkGetMemoryFdKHR hands the caller a new descriptor.
                    fd: unsafe { OwnedFd::from_raw_fd(fd) },
                    bytes: seg.bytes,
                })
                .map_err(|e| format!("vkGetMemoryFdKHR: {e}")),
        )
    }

    /// Whether segment `serial` still exists.
    pub(crate) fn is_live(&self, serial: u64) -> bool {
        self.segments.values().any(|s| s.serial == serial)
    }

    /// A timeline semaphore (at 0) exported as an opaque descriptor.
    pub(crate) fn exported_timeline(&self) -> Result<ExportedTimeline, String> {
        let mut kind = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk::SemaphoreType::TIMELINE)
            .initial_value(0);
        let mut export = vk::ExportSemaphoreCreateInfo::default()
            .handle_types(vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD);
        let info = vk::SemaphoreCreateInfo::default()
            .push_next(&mut kind)
            .push_next(&mut export);
        // SAFETY: timeline semaphores and VK_KHR_external_semaphore_fd are enabled.
        let semaphore = unsafe { self.device.create_semaphore(&info, None) }
            .map_err(|e| format!("an exportable timeline semaphore: {e}"))?;
        let get = vk::SemaphoreGetFdInfoKHR::default()
            .semaphore(semaphore)
            .handle_type(vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD);
        // SAFETY: created exportable as an opaque fd just above.
        match unsafe { self.semaphore_fd.get_semaphore_fd(&get) } {
            Ok(fd) => Ok(ExportedTimeline {
                device: self.device.clone(),
                semaphore,
                // SAFETY: vkGetSemaphoreFdKHR hands the caller a new descriptor.
                fd: Some(unsafe { OwnedFd::from_raw_fd(fd) }),
            }),
            Err(e) => {
                // SAFETY: unused.
                unsafe { self.device.destroy_semaphore(semaphore, None) };
                Err(format!("vkGetSemaphoreFdKHR: {e}"))
            }
        }
    }
}

impl Drop for External {
    fn drop(&mut self) {
        // The source drops its segments through the allocator first; any left are freed here.
        for (_, seg) in self.segments.drain() {
            // SAFETY: the device is being torn down; nothing runs.
            unsafe { self.device.free_memory(seg.memory, None) };
        }
    }
}

/// A timeline semaphore of the device that another driver imported (or will).
pub(crate) struct ExportedTimeline {
    device: ash::Device,
    pub semaphore: vk::Semaphore,
    /// The descriptor, until the importer takes it.
    pub fd: Option<OwnedFd>,
}

// SAFETY: a plain handle; Vulkan semaphores may be used from any thread with external
// synchronisation of submissions, which wgpu's queue gives.
unsafe impl Send for ExportedTimeline {}
unsafe impl Sync for ExportedTimeline {}

impl Drop for ExportedTimeline {
    fn drop(&mut self) {
        // SAFETY: the owner waits for every use first (the NCCL communicator drains its
        // stream before dropping its semaphores).
        unsafe { self.device.destroy_semaphore(self.semaphore, None) };
    }
}

impl External {
    /// The serial of `buffer`'s segment, if it is an exportable one.
    pub(crate) fn serial_of(&self, buffer: &wgpu::Buffer) -> Option<u64> {
        self.segments.get(&raw_buffer(buffer)?).map(|s| s.serial)
    }
}

impl super::gpu::GpuDevice {
    /// `f` on the device's exportable memory, under the allocator's lock; `None` where the
    /// device has none.
    pub(crate) fn with_external<R>(&self, f: impl FnOnce(&External) -> R) -> Option<R> {
        let alloc = super::lock(&self.alloc);
        alloc.source().external.as_ref().map(f)
    }

    /// Has `semaphore` reach `value` once everything recorded on the stream so far has run:
    /// submits the stream (an empty submission if nothing is recorded).
    pub(crate) fn signal_when_done(&self, semaphore: vk::Semaphore, value: u64) {
        let mut stream = super::lock(&self.stream);
        // SAFETY: only the signal list of the next submission is touched.
        if let Some(hal) = unsafe { self.queue.as_hal::<Vulkan>() } {
            hal.add_signal_semaphore(semaphore, Some(value));
        }
        // A stream submission even with nothing recorded, so that `synchronize` waits for it.
        stream.copy_encoder(&self.device);
        stream.submit(&self.queue);
    }

    /// Has everything recorded from now on run after `semaphore` reaches `value`. What is
    /// recorded already is submitted first, so that it does not wait too.
    pub(crate) fn wait_before_next(&self, semaphore: vk::Semaphore, value: u64) {
        let mut stream = super::lock(&self.stream);
        stream.submit_if_recorded(&self.queue);
        // SAFETY: only the wait list of the next submission is touched.
        if let Some(hal) = unsafe { self.queue.as_hal::<Vulkan>() } {
            hal.add_wait_semaphore(semaphore, Some(value), vk::PipelineStageFlags::ALL_COMMANDS);
        }
        // The stream's next submission carries the wait even if nothing else is recorded, so
        // that `synchronize` waits for the collective (as `torch.cuda.synchronize` waits for
        // NCCL's stream).
        stream.copy_encoder(&self.device);
    }
}
