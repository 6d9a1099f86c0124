//! The seam between the allocator's policy and real memory: a `SegmentSource` creates and
//! releases segments (PyTorch's cudaMalloc/cudaFree) and answers event queries. The policy core
//! never sees wgpu; the GPU device plugs in a wgpu source, the CPU device a host source, and the
//! tests a capped in-memory source.

/// The allocator's stream for memory that another driver imports (NCCL's buffers, through
/// CUDA's external memory): its blocks live in segments of their own, made by
/// `SegmentSource::allocate_on`, and are never expandable (an imported allocation cannot grow).
/// Counted in every statistic as any stream's blocks are.
pub const EXTERNAL_STREAM: u64 = 1;

/// Why a segment could not be created.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceError {
    /// The backend is out of memory: the allocator releases its cache and retries.
    OutOfMemory,
    /// Anything else; surfaces unchanged as an error of the allocation.
    Other(String),
}

/// What the backend can say about device memory. `None` where it cannot tell.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemInfo {
    /// Free device memory, in bytes.
    pub free: Option<u64>,
    /// Total device memory, in bytes.
    pub total: Option<u64>,
}

/// A provider of segments. Implementations hold no policy: they allocate exactly what they are
/// asked, and report out-of-memory instead of panicking.
pub trait SegmentSource: Send {
    /// What a tensor needs to reach its block: a buffer (GPU) or a host region (CPU).
    type Handle: Clone + Send + Sync;

    /// Creates one segment of exactly `size_bytes`.
    fn allocate(&mut self, size_bytes: u64) -> Result<Self::Handle, SourceError>;
    /// Creates one segment of exactly `size_bytes` for blocks of `stream`. Segments of
    /// `EXTERNAL_STREAM` are memory another driver can import (Vulkan's exportable memory,
    /// for NCCL); a source without such memory, or one whose memory is not real (a planning
    /// device), makes them as any other.
    fn allocate_on(&mut self, stream: u64, size_bytes: u64) -> Result<Self::Handle, SourceError> {
        let _ = stream;
        self.allocate(size_bytes)
    }
    /// Returns a segment to the backend. The allocator calls it only for wholly free segments.
    fn release(&mut self, handle: Self::Handle);
    /// Free and total memory, where the backend reports them (PyTorch's `cudaMemGetInfo`).
    fn mem_info(&self) -> MemInfo {
        MemInfo::default()
    }
    /// Total memory alone, where the backend reports it: what sizes an expandable range, asked
    /// at every reservation, so a backend whose `mem_info` is costly keeps it.
    fn mem_total(&self) -> Option<u64> {
        self.mem_info().total
    }
    /// The largest segment the backend can create (wgpu's `max_buffer_size`).
    fn max_segment_size(&self) -> u64 {
        u64::MAX
    }
    /// Whether the work behind `event` (a submission index) has completed. Never blocks.
    fn event_completed(&mut self, _event: u64) -> bool {
        true
    }
    /// Blocks until every event handed out so far has completed.
    fn synchronize(&mut self) {}
    /// How the OOM message names the device, e.g. `GPU 0 (NVIDIA H100, Vulkan)`.
    fn describe(&self) -> String {
        "device 0".to_string()
    }

    /// Why this source cannot back expandable segments (`None`: it can). PyTorch's
    /// `expandable_segments:True` needs a reserved range with pages mapped on demand.
    fn expandable_unsupported(&self) -> Option<String> {
        Some(format!("{} has no virtual memory", self.describe()))
    }
    /// Reserves `size_bytes` of address space with no memory behind it (`cuMemAddressReserve`).
    fn reserve(&mut self, size_bytes: u64) -> Result<Self::Handle, SourceError> {
        let _ = size_bytes;
        Err(SourceError::Other(
            "this source cannot reserve address space".into(),
        ))
    }
    /// Backs one page, `len` bytes at `offset` of a reservation, with memory (`cuMemCreate` +
    /// `cuMemMap`); the allocator maps and unmaps whole pages, one call each.
    fn map(&mut self, handle: &Self::Handle, offset: u64, len: u64) -> Result<(), SourceError> {
        let _ = (handle, offset, len);
        Err(SourceError::OutOfMemory)
    }
    /// Gives the memory behind `len` bytes at `offset` back (`cuMemUnmap` + `cuMemRelease`).
    fn unmap(&mut self, handle: &Self::Handle, offset: u64, len: u64) {
        let _ = (handle, offset, len);
    }
    /// Gives a reservation with nothing mapped back (`cuMemAddressFree`).
    fn release_reservation(&mut self, handle: Self::Handle) {
        let _ = handle;
    }
}

/// A source of host memory with an optional capacity: the CPU device's memory.
pub struct HostSource {
    capacity: Option<u64>,
    in_use: u64,
    name: String,
}

/// A host segment: zeroed, 8-byte aligned memory shared by the tensors carved from it.
pub type HostSegment = std::sync::Arc<HostMemory>;

/// Host memory behind a CPU segment. Interior mutability: tensors of one segment write
/// disjoint ranges, ordered by kiln's own synchronisation.
pub struct HostMemory {
    words: Box<[std::cell::UnsafeCell<u64>]>,
    size_bytes: u64,
}

// SAFETY: every access goes through `bytes_mut`/`bytes`, whose callers own disjoint ranges.
unsafe impl Sync for HostMemory {}

impl HostMemory {
    /// Zeroed memory, or `None` where the system refuses it: a huge request is an OOM the
    /// allocator reports, never an abort of the process (as `vec![0; n]` would be).
    fn new(size_bytes: u64) -> Option<Self> {
        let n = usize::try_from(size_bytes.div_ceil(8)).ok()?;
        let words: Box<[std::cell::UnsafeCell<u64>]> = if n == 0 {
            Box::new([])
        } else {
            let layout = std::alloc::Layout::array::<u64>(n).ok()?;
            // SAFETY: the layout has a non-zero size. calloc'd zero pages: untouched memory
            // costs nothing until a tensor writes it.
            let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
            if ptr.is_null() {
                return None;
            }
            // SAFETY: `ptr` holds `n` zeroed u64 allocated with the layout of `[u64; n]`, which
            // is the layout `Box<[UnsafeCell<u64>]>` frees with (UnsafeCell is transparent).
            unsafe {
                Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                    ptr as *mut std::cell::UnsafeCell<u64>,
                    n,
                ))
            }
        };
        Some(HostMemory { words, size_bytes })
    }
    /// Bytes the segment holds.
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    /// A raw pointer to the first byte; callers keep to the range of their own block.
    pub fn as_ptr(&self) -> *mut u8 {
        self.words.as_ptr() as *mut u8
    }
}

impl HostSource {
    /// `capacity`: refuse segments past this many bytes in use (None = only the OS limits).
    pub fn new(capacity: Option<u64>, name: impl Into<String>) -> Self {
        HostSource {
            capacity,
            in_use: 0,
            name: name.into(),
        }
    }
}

impl SegmentSource for HostSource {
    type Handle = HostSegment;

    fn allocate(&mut self, size_bytes: u64) -> Result<HostSegment, SourceError> {
        if let Some(cap) = self.capacity {
            if self.in_use.saturating_add(size_bytes) > cap {
                return Err(SourceError::OutOfMemory);
            }
        }
        let memory = HostMemory::new(size_bytes).ok_or(SourceError::OutOfMemory)?;
        self.in_use += size_bytes;
        Ok(std::sync::Arc::new(memory))
    }

    fn release(&mut self, handle: HostSegment) {
        self.in_use -= handle.size_bytes;
    }

    fn mem_info(&self) -> MemInfo {
        MemInfo {
            total: self.capacity,
            free: self.capacity.map(|c| c - self.in_use),
        }
    }

    fn describe(&self) -> String {
        self.name.clone()
    }
}

/// A source that lends sizes, not memory, with an optional capacity: it stands in for a device
/// in trace replays and property tests, where PyTorch's recorded figures depend only on sizes.
pub struct SimulatedSource {
    /// The most the source lends at once; `None`: unlimited.
    pub capacity: Option<u64>,
    in_use: u64,
}

impl SimulatedSource {
    /// A source with `capacity` bytes (or none).
    pub fn new(capacity: Option<u64>) -> Self {
        SimulatedSource {
            capacity,
            in_use: 0,
        }
    }
}

impl SegmentSource for SimulatedSource {
    type Handle = u64;

    fn allocate(&mut self, size_bytes: u64) -> Result<u64, SourceError> {
        if self
            .capacity
            .is_some_and(|cap| self.in_use + size_bytes > cap)
        {
            return Err(SourceError::OutOfMemory);
        }
        self.in_use += size_bytes;
        Ok(size_bytes)
    }

    fn release(&mut self, size_bytes: u64) {
        self.in_use -= size_bytes;
    }

    fn mem_info(&self) -> MemInfo {
        MemInfo {
            total: self.capacity,
            free: self.capacity.map(|c| c - self.in_use),
        }
    }

    fn describe(&self) -> String {
        "simulated device 0".to_string()
    }

    fn expandable_unsupported(&self) -> Option<String> {
        None
    }

    /// Address space costs nothing; only mapped pages count against the capacity.
    fn reserve(&mut self, size_bytes: u64) -> Result<u64, SourceError> {
        Ok(size_bytes)
    }

    fn map(&mut self, _: &u64, _: u64, len: u64) -> Result<(), SourceError> {
        if self.capacity.is_some_and(|cap| self.in_use + len > cap) {
            return Err(SourceError::OutOfMemory);
        }
        self.in_use += len;
        Ok(())
    }

    fn unmap(&mut self, _: &u64, _: u64, len: u64) {
        self.in_use -= len;
    }

    fn release_reservation(&mut self, _: u64) {}
}
