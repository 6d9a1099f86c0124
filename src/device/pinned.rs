//! Staging buffers as kiln's pinned memory: a mappable wgpu buffer whose mapping is the host
//! memory of a pinned tensor, and the source that makes them for the host caching allocator.
//! See Note [Pinned host memory] in ARCHITECTURE.md.

use super::serial::GlSerial;
use super::stream::Stream;
use super::{lock, wgpu_err};
use crate::host::{PinnedKind, PinnedSource};
use crate::{Error, Result};
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

const MAP_PENDING: u8 = 0;
const MAP_DONE: u8 = 1;
const MAP_FAILED: u8 = 2;

/// Where the host may touch the buffer.
enum MapState {
    /// Mapped: the host reads and writes through the pointer (valid until the next unmap).
    Mapped(*mut u8),
    /// Unmapped; the last copy that uses it is in the submission `event` (0: none). Maps are
    /// requested only when the host wants the memory, so back-to-back copies need no waits.
    Unmapped(u64),
    /// A map was requested; `PinnedBuffer::mapped` turns `MAP_DONE` when it lands.
    Mapping,
}

// SAFETY: the pointer is only a handle to the mapping, which any thread may use; the state is
// always behind the buffer's mutex.
unsafe impl Send for MapState {}

pub(crate) struct PinnedBuffer {
    /// Dropped by hand, under the GL lock (`Drop` below).
    pub buffer: ManuallyDrop<wgpu::Buffer>,
    pub kind: PinnedKind,
    /// Host-cached coherent memory the GPU copies both ways (the unified Vulkan form); else
    /// only the way `kind` says.
    pub both_ways: bool,
    state: Mutex<MapState>,
    mapped: Arc<AtomicU8>,
    gl: GlSerial,
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        // The last handle of a pinned block may go in any thread (a tensor's drop).
        let _gl = self.gl.guard();
        // SAFETY: dropped once, here; nothing uses the field after.
        unsafe { ManuallyDrop::drop(&mut self.buffer) };
    }
}

impl std::fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PinnedBuffer({:?}, {} bytes)",
            self.kind,
            self.buffer.size()
        )
    }
}

impl PinnedBuffer {
    /// Write mappings only for split upload memory; unified memory maps for reading and the
    /// host writes through that mapping too.
    fn writes_mapping(&self) -> bool {
        self.kind == PinnedKind::Upload && !self.both_ways
    }

    /// Whether the GPU may copy out of it (host to device).
    pub fn can_upload(&self) -> bool {
        self.both_ways || self.kind == PinnedKind::Upload
    }

    /// Whether the GPU may copy into it (device to host).
    pub fn can_download(&self) -> bool {
        self.both_ways || self.kind == PinnedKind::Download
    }

    fn request_map(&self) {
        let mode = if self.writes_mapping() {
            wgpu::MapMode::Write
        } else {
            wgpu::MapMode::Read
        };
        let flag = self.mapped.clone();
        flag.store(MAP_PENDING, Ordering::Release);
        let _gl = self.gl.guard();
        self.buffer.slice(..).map_async(mode, move |r| {
            flag.store(
                if r.is_ok() { MAP_DONE } else { MAP_FAILED },
                Ordering::Release,
            )
        });
    }

    /// The start of the mapping, which must be complete.
    fn mapped_ptr(&self) -> Result<*mut u8> {
        let _gl = self.gl.guard();
        let slice = self.buffer.slice(..);
        // Views only guard against overlapping views; the mapping itself stays until `unmap`,
        // so the pointer outlives the view.
        Ok(if self.writes_mapping() {
            let mut view = slice
                .get_mapped_range_mut()
                .map_err(wgpu_err("pinned map"))?;
            view.slice(..).as_raw_element_ptr().as_ptr()
        } else {
            // Unified memory is written through this read mapping: on Vulkan, gpu-allocator
            // gives mappable buffers only HOST_COHERENT memory, so host writes reach the GPU at
            // the next submit, and wgpu's unmap of a read mapping leaves the contents alone.
            let view = slice.get_mapped_range().map_err(wgpu_err("pinned map"))?;
            view.as_ptr() as *mut u8
        })
    }

    /// Polls until a requested map has landed.
    fn finish_map(&self, g: &super::gpu::GpuDevice) -> Result<*mut u8> {
        let mut spins = 0;
        loop {
            match self.mapped.load(Ordering::Acquire) {
                MAP_DONE => return self.mapped_ptr(),
                MAP_FAILED => {
                    g.check("pinned map")?;
                    return Err(Error::Wgpu {
                        op: "pinned map",
                        msg: "mapping a staging buffer failed".into(),
                    });
                }
                _ => {}
            }
            // The buffer's copies are complete, so the map lands at the next poll or so; no
            // blocking wait here (it would wait for all queued work, not this buffer).
            let polled = {
                let _gl = self.gl.guard();
                g.device.poll(wgpu::PollType::Poll)
            };
            polled.map_err(wgpu_err("pinned wait"))?;
            if spins > 64 {
                std::thread::yield_now();
            }
            spins += 1;
        }
    }

    /// Maps the buffer for the host, waiting for its copies first. Returns the pointer.
    fn map_now(&self, g: &super::gpu::GpuDevice, state: &mut MapState) -> Result<*mut u8> {
        let p = match *state {
            MapState::Mapped(p) => return Ok(p),
            MapState::Unmapped(event) => {
                super::stream::wait_unlocked(&g.stream, &g.device, &g.queue, event)
                    .map_err(wgpu_err("pinned wait"))?;
                self.request_map();
                *state = MapState::Mapping;
                self.finish_map(g)?
            }
            MapState::Mapping => self.finish_map(g)?,
        };
        *state = MapState::Mapped(p);
        Ok(p)
    }

    /// The host address of the first byte, waiting for a copy in flight to finish (so the host
    /// never sees stale or torn data).
    pub fn host_ptr(&self, g: &super::gpu::GpuDevice) -> Result<*mut u8> {
        let mut state = lock(&self.state);
        self.map_now(g, &mut state)
    }

    /// Whether the host may touch the buffer now without waiting for a copy. Never blocks.
    pub fn is_ready(&self, g: &super::gpu::GpuDevice) -> bool {
        let mut state = lock(&self.state);
        match *state {
            MapState::Mapped(_) => true,
            MapState::Unmapped(event) => {
                if !lock(&g.stream).query(&g.device, event) {
                    return false;
                }
                self.request_map();
                *state = MapState::Mapping;
                let _gl = self.gl.guard();
                let _ = g.device.poll(wgpu::PollType::Poll);
                self.mapped.load(Ordering::Acquire) != MAP_PENDING
            }
            MapState::Mapping => {
                let _gl = self.gl.guard();
                let _ = g.device.poll(wgpu::PollType::Poll);
                self.mapped.load(Ordering::Acquire) != MAP_PENDING
            }
        }
    }

    /// Records a copy that uses the buffer (with `record`), unmapping it first if the host has
    /// it. Returns the copy's event. With `submit`, the stream submits at once (a non-blocking
    /// copy starts now).
    pub fn record_copy(
        &self,
        g: &super::gpu::GpuDevice,
        submit: bool,
        (what, bytes): (&'static str, u64),
        record: impl FnOnce(&mut wgpu::CommandEncoder, &wgpu::Buffer),
    ) -> Result<u64> {
        let mut state = lock(&self.state);
        match *state {
            MapState::Mapped(_) => {
                let _gl = self.gl.guard();
                self.buffer.unmap()
            }
            MapState::Unmapped(_) => {}
            MapState::Mapping => {
                // wgpu refuses a submit that uses a buffer with a map pending: let it land.
                self.finish_map(g)?;
                let _gl = self.gl.guard();
                self.buffer.unmap();
            }
        }
        let mut timer = g.kernel_timer();
        let mut stream = lock(&g.stream);
        let enc = stream.copy_encoder(&g.device);
        match timer.as_mut().and_then(|t| t.as_mut()) {
            Some(t) => t.copy(&g.device, enc, what, bytes, |e| record(e, &self.buffer)),
            None => record(enc, &self.buffer),
        }
        drop(timer);
        let event = stream.pending_event();
        *state = MapState::Unmapped(event);
        if submit {
            stream.submit(&g.queue);
        } else {
            stream.recorded(&g.queue);
        }
        Ok(event)
    }
}

/// Creates staging buffers on one wgpu device and answers event queries from its stream.
pub(crate) struct WgpuPinnedSource {
    pub device: wgpu::Device,
    pub stream: Arc<Mutex<Stream>>,
    pub max_buffer_size: u64,
    /// Both kinds are `MAP_READ | COPY_SRC | COPY_DST` (Vulkan with MAPPABLE_PRIMARY_BUFFERS).
    pub unified: bool,
    pub gl: GlSerial,
}

impl PinnedSource for WgpuPinnedSource {
    type Segment = Arc<PinnedBuffer>;

    fn allocate(&mut self, size_bytes: u64, kind: PinnedKind) -> Result<Arc<PinnedBuffer>> {
        if size_bytes > self.max_buffer_size {
            return Err(Error::TooLarge {
                op: "pin_memory",
                size_bytes,
                limit_bytes: self.max_buffer_size,
                what: "bytes of a pinned block (one wgpu buffer)",
            });
        }
        use wgpu::BufferUsages as U;
        let usage = match (self.unified, kind) {
            (true, _) => U::MAP_READ | U::COPY_SRC | U::COPY_DST,
            (false, PinnedKind::Upload) => U::MAP_WRITE | U::COPY_SRC,
            (false, PinnedKind::Download) => U::MAP_READ | U::COPY_DST,
        };
        let map_at_creation = kind == PinnedKind::Upload && !self.unified;
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        // A write-mapped buffer maps at creation without an extra copy; a read-mapped one asks
        // for its map (mapping at creation would stage it through another buffer).
        let buffer = {
            let _gl = self.gl.guard();
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("kiln pinned"),
                // wgpu maps whole 4-byte words.
                size: size_bytes.max(4),
                usage,
                mapped_at_creation: map_at_creation,
            })
        };
        let validation = pollster::block_on(validation.pop());
        let oom = pollster::block_on(oom.pop());
        if let Some(e) = oom.or(validation) {
            return Err(Error::Wgpu {
                op: "pin_memory",
                msg: format!("creating a {size_bytes}-byte staging buffer: {e}"),
            });
        }
        let pinned = PinnedBuffer {
            buffer: ManuallyDrop::new(buffer),
            gl: self.gl,
            kind,
            both_ways: self.unified,
            state: Mutex::new(MapState::Unmapped(0)),
            mapped: Arc::new(AtomicU8::new(MAP_DONE)),
        };
        if map_at_creation {
            let p = pinned.mapped_ptr()?;
            *lock(&pinned.state) = MapState::Mapped(p);
        }
        Ok(Arc::new(pinned))
    }

    fn free(&mut self, segment: Arc<PinnedBuffer>) {
        drop(segment);
    }

    fn event_completed(&mut self, event: u64) -> bool {
        lock(&self.stream).query(&self.device, event)
    }
}
