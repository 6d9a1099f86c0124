//! The out-of-memory report: the facts of PyTorch's `torch.OutOfMemoryError` message.

use super::format::format_size;

/// What was asked and what the allocator held when it failed.
#[derive(Debug, Clone, PartialEq)]
pub struct OutOfMemory {
    /// The device as the source names it, e.g. `GPU 0 (NVIDIA H100 80GB HBM3, Vulkan)`.
    pub device: String,
    /// The caller's request in bytes.
    pub requested: u64,
    /// The segment that could not be created (what PyTorch's "Tried to allocate" reports).
    pub alloc_size: u64,
    /// Device capacity and free memory, where the backend reports them.
    pub total: Option<u64>,
    /// Free device memory, where the backend reports it.
    pub free: Option<u64>,
    /// The cap on reserved memory, when one is set.
    pub allowed: Option<u64>,
    /// Bytes the allocator has handed out.
    pub allocated: u64,
    /// Bytes the allocator has reserved.
    pub reserved: u64,
    /// Whether the request exceeds an exabyte (PyTorch words that case differently).
    pub more_than_1eb: bool,
    /// kiln's, beyond PyTorch's message (its issue #29554): the largest free block the cache
    /// holds, so that fragmentation shows (reserved but unallocated memory is free, but no
    /// single block of it fits the request).
    pub largest_free_block: u64,
    /// Whether `expandable_segments:True` would have made the request fit: its pages can be
    /// unmapped from free blocks and mapped again contiguously. `None` where it is already on
    /// or where the device's free memory is unknown.
    pub expandable_would_fit: Option<bool>,
}

impl OutOfMemory {
    pub(crate) fn more_than_1eb(device: String) -> Self {
        OutOfMemory {
            device,
            requested: 1 << 60,
            alloc_size: 1 << 60,
            total: None,
            free: None,
            allowed: None,
            allocated: 0,
            reserved: 0,
            more_than_1eb: true,
            largest_free_block: 0,
            expandable_would_fit: None,
        }
    }
}

fn size_or_unknown(n: Option<u64>) -> String {
    n.map_or_else(|| "unknown".to_string(), format_size)
}

impl std::fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.more_than_1eb {
            return write!(
                f,
                "kiln out of memory. Tried to allocate more than 1EB memory."
            );
        }
        write!(
            f,
            "kiln out of memory. Tried to allocate {} (a segment for a request of {} bytes). \
             {} has a total capacity of {} of which {} is free. ",
            format_size(self.alloc_size),
            self.requested,
            self.device,
            size_or_unknown(self.total),
            size_or_unknown(self.free),
        )?;
        if let Some(allowed) = self.allowed {
            write!(f, "{} allowed; ", format_size(allowed))?;
        }
        write!(
            f,
            "Of the allocated memory {} is allocated by kiln, and {} is reserved by kiln but \
             unallocated. If reserved but unallocated memory is large try setting \
             KILN_ALLOC_CONF=max_split_size_mb:N to avoid fragmentation.  See documentation for \
             Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)",
            format_size(self.allocated),
            format_size(self.reserved.saturating_sub(self.allocated)),
        )?;
        let cached_free = self.reserved.saturating_sub(self.allocated);
        if cached_free > 0 {
            write!(
                f,
                " kiln: the largest free cached block is {}, so the {} reserved but unallocated \
                 is free but unusable for this request (fragmentation).",
                format_size(self.largest_free_block),
                format_size(cached_free),
            )?;
        }
        match self.expandable_would_fit {
            Some(true) => write!(
                f,
                " With KILN_ALLOC_CONF=expandable_segments:True this request would have fit."
            ),
            Some(false) => write!(
                f,
                " Even with KILN_ALLOC_CONF=expandable_segments:True this request would not fit."
            ),
            None => Ok(()),
        }
    }
}
