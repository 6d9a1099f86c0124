//! The GPU's segment source: each segment is one storage buffer. Out-of-memory is caught with
//! an error scope, so the allocator can release its cache and retry as PyTorch does after a
//! failed `cudaMalloc`.

use super::bind_cache::BindGroupCache;
use super::serial::GlSerial;
use super::stream::Stream;
use crate::alloc::{MemInfo, SegmentSource, SourceError};
use std::sync::{Arc, Mutex};

pub(crate) struct WgpuSource {
    /// Expandable segments' pages (Vulkan sparse binding), where the device has it. First, so
    /// that it is dropped (its memory freed) before the device handle below.
    #[cfg(any(windows, all(unix, not(target_vendor = "apple"))))]
    pub sparse: Option<super::sparse::SparseMemory>,
    /// Exportable segments for `EXTERNAL_STREAM` (NCCL's buffers), where the device has the
    /// extensions (Note [Exported memory]). Before the device handle, as `sparse`.
    #[cfg(all(unix, not(target_vendor = "apple")))]
    pub external: Option<super::external::External>,
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub adapter: wgpu::Adapter,
    pub stream: Arc<Mutex<Stream>>,
    pub bind_groups: Arc<Mutex<BindGroupCache>>,
    pub name: String,
    pub max_buffer_size: u64,
    /// The device-local heap's size, read once: a heap's size never changes, and asking the
    /// driver for the memory budget costs a system call.
    pub total: Option<u64>,
    pub gl: GlSerial,
}

pub(crate) const SEGMENT_USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

impl SegmentSource for WgpuSource {
    type Handle = wgpu::Buffer;

    fn allocate(&mut self, size_bytes: u64) -> Result<wgpu::Buffer, SourceError> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let buffer = {
            let _gl = self.gl.guard();
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("kiln segment"),
                size: size_bytes,
                usage: SEGMENT_USAGE,
                mapped_at_creation: false,
            })
        };
        let validation = pollster::block_on(validation.pop());
        let oom = pollster::block_on(oom.pop());
        match (oom, validation) {
            (Some(_), _) => Err(SourceError::OutOfMemory),
            (None, Some(e)) => Err(SourceError::Other(e.to_string())),
            (None, None) => Ok(buffer),
        }
    }

    fn allocate_on(&mut self, stream: u64, size_bytes: u64) -> Result<wgpu::Buffer, SourceError> {
        #[cfg(all(unix, not(target_vendor = "apple")))]
        if stream == crate::alloc::EXTERNAL_STREAM {
            if let Some(external) = self.external.as_mut() {
                return external.allocate(&self.device, size_bytes, SEGMENT_USAGE);
            }
        }
        let _ = stream;
        self.allocate(size_bytes)
    }

    /// Dropping the handle lets wgpu free the buffer once the GPU no longer uses it; the
    /// allocator synchronises first where it needs the memory back (`release_cached_blocks`).
    /// The segment's handle is its last one (its blocks are all free), so wgpu frees it here
    /// or inside a later submit or poll: on GL, each under the GL lock.
    fn release(&mut self, handle: wgpu::Buffer) {
        super::lock(&self.bind_groups).evict(&handle);
        #[cfg(all(unix, not(target_vendor = "apple")))]
        if self.external.as_ref().is_some_and(|e| e.owns(&handle)) {
            // kiln frees an exportable segment's memory itself: after the device is done.
            self.synchronize();
            if let Some(external) = self.external.as_mut() {
                external.release(handle);
            }
            return;
        }
        let _gl = self.gl.guard();
        drop(handle);
    }

    fn mem_info(&self) -> MemInfo {
        super::memory::device_memory(&self.adapter).unwrap_or_default()
    }

    fn mem_total(&self) -> Option<u64> {
        self.total
    }

    fn max_segment_size(&self) -> u64 {
        self.max_buffer_size
    }

    fn event_completed(&mut self, event: u64) -> bool {
        let mut stream = super::lock(&self.stream);
        stream.query(&self.device, event)
    }

    /// Submits what is recorded and waits for the device to go idle, so that released segments
    /// are really returned before a retry.
    fn synchronize(&mut self) {
        let mut stream = super::lock(&self.stream);
        let event = stream.submit(&self.queue);
        // A wait can only fail on device loss, which the device reports at its next sync point.
        let _ = stream.wait(&self.device, &self.queue, event);
    }

    fn describe(&self) -> String {
        self.name.clone()
    }

    fn expandable_unsupported(&self) -> Option<String> {
        #[cfg(any(windows, all(unix, not(target_vendor = "apple"))))]
        if self.sparse.is_some() {
            return None;
        }
        Some(format!(
            "{} has no Vulkan sparse buffer binding (sparseBinding and sparseResidencyBuffer \
             on its first queue family), which kiln maps pages with",
            self.name
        ))
    }

    #[cfg(any(windows, all(unix, not(target_vendor = "apple"))))]
    fn reserve(&mut self, size_bytes: u64) -> Result<wgpu::Buffer, SourceError> {
        let sparse = self
            .sparse
            .as_mut()
            .ok_or_else(|| SourceError::Other("no sparse binding".into()))?;
        let started = std::time::Instant::now();
        let range = sparse
            .reserve(&self.device, size_bytes, SEGMENT_USAGE)
            .map_err(SourceError::Other);
        if super::sparse::profiling() {
            eprintln!(
                "kiln sparse: reserve {size_bytes} bytes: {:.1} us",
                started.elapsed().as_secs_f64() * 1e6
            );
        }
        range
    }

    #[cfg(any(windows, all(unix, not(target_vendor = "apple"))))]
    fn map(&mut self, handle: &wgpu::Buffer, offset: u64, len: u64) -> Result<(), SourceError> {
        let sparse = self
            .sparse
            .as_mut()
            .ok_or_else(|| SourceError::Other("no sparse binding".into()))?;
        sparse.map(&self.stream, handle, offset, len)
    }

    /// Waits for the device first: a page is never unbound while queued work may read it.
    #[cfg(any(windows, all(unix, not(target_vendor = "apple"))))]
    fn unmap(&mut self, handle: &wgpu::Buffer, offset: u64, len: u64) {
        let started = std::time::Instant::now();
        self.synchronize();
        if super::sparse::profiling() {
            eprintln!(
                "kiln sparse: unmap waits for the device: {:.1} us",
                started.elapsed().as_secs_f64() * 1e6
            );
        }
        if let Some(sparse) = self.sparse.as_mut() {
            sparse.unmap(&self.stream, handle, offset, len);
        }
    }

    #[cfg(any(windows, all(unix, not(target_vendor = "apple"))))]
    fn release_reservation(&mut self, handle: wgpu::Buffer) {
        super::lock(&self.bind_groups).evict(&handle);
        let handle = match self.sparse.as_mut() {
            Some(sparse) => sparse.release(handle),
            None => Some(handle),
        };
        if let Some(h) = handle {
            self.release(h);
        }
    }
}
