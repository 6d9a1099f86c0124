//! Device memory capacity and free memory, where the backend can tell: Vulkan's memory heaps
//! and `VK_EXT_memory_budget`. Other backends report "unknown".

use crate::alloc::MemInfo;

/// Total device-local memory (the largest device-local heap) and, with the budget extension,
/// what is still free of it.
pub(crate) fn device_memory(adapter: &wgpu::Adapter) -> Option<MemInfo> {
    #[cfg(any(windows, all(unix, not(target_vendor = "apple"))))]
    {
        if adapter.get_info().backend == wgpu::Backend::Vulkan {
            return vulkan_memory(adapter);
        }
    }
    let _ = adapter;
    None
}

#[cfg(any(windows, all(unix, not(target_vendor = "apple"))))]
fn vulkan_memory(adapter: &wgpu::Adapter) -> Option<MemInfo> {
    use ash::vk;
    // SAFETY: we only read properties of the physical device; nothing is created or destroyed.
    let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }?;
    let instance = hal.shared_instance().raw_instance();
    let physical = hal.raw_physical_device();
    let mut budget = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
    // SAFETY: valid instance and physical device handles owned by wgpu-hal.
    let has_budget = unsafe { instance.enumerate_device_extension_properties(physical) }
        .map(|exts| {
            exts.iter()
                .any(|e| e.extension_name_as_c_str().ok() == Some(ash::ext::memory_budget::NAME))
        })
        .unwrap_or(false);
    let mut props2 = vk::PhysicalDeviceMemoryProperties2::default();
    if has_budget {
        props2 = props2.push_next(&mut budget);
    }
    // SAFETY: as above; Vulkan 1.1 is required by wgpu-hal's Vulkan backend.
    unsafe { instance.get_physical_device_memory_properties2(physical, &mut props2) };
    let props = props2.memory_properties;
    let heaps = &props.memory_heaps[..props.memory_heap_count as usize];
    let (index, heap) = heaps
        .iter()
        .enumerate()
        .filter(|(_, h)| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
        .max_by_key(|(_, h)| h.size)?;
    let free =
        has_budget.then(|| budget.heap_budget[index].saturating_sub(budget.heap_usage[index]));
    Some(MemInfo {
        total: Some(heap.size),
        free,
    })
}
