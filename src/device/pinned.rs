//! Staging buffers as kiln's pinned memory: a mappable wgpu buffer whose mapping is the host
//! memory of a pinned tensor, and the source that makes them for the host caching allocator.
//! See Note [Pinned host memory] in ARCHITECTURE.md.

use super::lock;
use super::stream::Stream;
use crate::host::{PinnedKind, PinnedSource};
use crate::{Error, Result};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

const MAP_PENDING: u8 = 0;
const MAP_DONE: u8 = 1;
const MAP_FAILED: u8 = 2;

/// Where the host may touch the buffer.
enum MapState {
    /// Mapped: the host reads and writes through `ptr` (valid until the next unmap).
    Mapped(*mut u8),
    /// Unmapped for a copy in the submission `event`; a map is requested right after that
    /// submit and `PinnedBuffer::mapped` turns `MAP_DONE` when it lands.
    InFlight(u64),
}

// SAFETY: the pointer is only a handle to the mapping, which any thread may use; the state is
// always behind the buffer's mutex.
unsafe impl Send for MapState {}

pub(crate) struct PinnedBuffer {
    pub buffer: wgpu::Buffer,
    pub kind: PinnedKind,
    state: Mutex<MapState>,
    mapped: Arc<AtomicU8>,
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

fn wgpu_err(op: &'static str) -> impl Fn(&dyn std::fmt::Display) -> Error {
    move |e| Error::Wgpu {
        op,
        msg: e.to_string(),
    }
}

impl PinnedBuffer {
    fn mode(&self) -> wgpu::MapMode {
        match self.kind {
            PinnedKind::Upload => wgpu::MapMode::Write,
            PinnedKind::Download => wgpu::MapMode::Read,
        }
    }

    /// The map request to run after the submit that carries this buffer's copy.
    fn request_map(&self) -> impl FnOnce() + Send + 'static {
        let (buffer, flag, mode) = (self.buffer.clone(), self.mapped.clone(), self.mode());
        flag.store(MAP_PENDING, Ordering::Release);
        move || {
            buffer.slice(..).map_async(mode, move |r| {
                flag.store(
                    if r.is_ok() { MAP_DONE } else { MAP_FAILED },
                    Ordering::Release,
                )
            })
        }
    }

    /// The start of the mapping, which must be complete.
    fn mapped_ptr(&self) -> Result<*mut u8> {
        let err = wgpu_err("pinned map");
        let slice = self.buffer.slice(..);
        // Views only guard against overlapping views; the mapping itself stays until `unmap`,
        // so the pointer outlives the view.
        Ok(match self.kind {
            PinnedKind::Upload => {
                let mut view = slice.get_mapped_range_mut().map_err(|e| err(&e))?;
                view.slice(..).as_raw_element_ptr().as_ptr()
            }
            PinnedKind::Download => {
                let view = slice.get_mapped_range().map_err(|e| err(&e))?;
                view.as_ptr() as *mut u8
            }
        })
    }

    /// Blocks until the copy of `event` has completed and the buffer is mapped again.
    fn wait_mapped(&self, g: &super::gpu::GpuDevice, event: u64) -> Result<()> {
        lock(&g.stream)
            .wait(&g.device, &g.queue, event)
            .map_err(|e| wgpu_err("pinned wait")(&e))?;
        let mut spins = 0;
        loop {
            match self.mapped.load(Ordering::Acquire) {
                MAP_DONE => return Ok(()),
                MAP_FAILED => {
                    g.check("pinned map")?;
                    return Err(Error::Wgpu {
                        op: "pinned map",
                        msg: "mapping a staging buffer failed".into(),
                    });
                }
                _ => {}
            }
            // The submission is complete, so the map callback fires at the next poll.
            let poll = if spins < 64 {
                wgpu::PollType::Poll
            } else {
                wgpu::PollType::wait_indefinitely()
            };
            g.device
                .poll(poll)
                .map_err(|e| wgpu_err("pinned wait")(&e))?;
            spins += 1;
        }
    }

    /// The host address of the first byte, waiting for a copy in flight to finish (so the host
    /// never sees stale or torn data).
    pub fn host_ptr(&self, g: &super::gpu::GpuDevice) -> Result<*mut u8> {
        let mut state = lock(&self.state);
        match *state {
            MapState::Mapped(p) => Ok(p),
            MapState::InFlight(event) => {
                self.wait_mapped(g, event)?;
                let p = self.mapped_ptr()?;
                *state = MapState::Mapped(p);
                Ok(p)
            }
        }
    }

    /// Whether the host may touch the buffer now without waiting. Never blocks.
    pub fn is_ready(&self, g: &super::gpu::GpuDevice) -> bool {
        let state = lock(&self.state);
        match *state {
            MapState::Mapped(_) => true,
            MapState::InFlight(event) => {
                if !lock(&g.stream).query(&g.device, event) {
                    return false;
                }
                let _ = g.device.poll(wgpu::PollType::Poll);
                self.mapped.load(Ordering::Acquire) != MAP_PENDING
            }
        }
    }

    /// Unmaps the buffer, records a copy that uses it with `record`, and asks for the map back
    /// after that submission. Waits first if an earlier copy is still in flight. Returns the
    /// copy's event. With `submit`, the stream submits at once (a non-blocking copy starts now).
    pub fn record_copy(
        &self,
        g: &super::gpu::GpuDevice,
        submit: bool,
        record: impl FnOnce(&mut wgpu::CommandEncoder, &wgpu::Buffer),
    ) -> Result<u64> {
        let mut state = lock(&self.state);
        if let MapState::InFlight(event) = *state {
            self.wait_mapped(g, event)?;
        }
        self.buffer.unmap();
        let mut stream = lock(&g.stream);
        record(stream.copy_encoder(&g.device), &self.buffer);
        let event = stream.pending_event();
        stream.after_submit(Box::new(self.request_map()));
        *state = MapState::InFlight(event);
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
}

impl PinnedSource for WgpuPinnedSource {
    type Segment = Arc<PinnedBuffer>;

    fn allocate(&mut self, size_bytes: u64, kind: PinnedKind) -> Result<Arc<PinnedBuffer>> {
        if size_bytes > self.max_buffer_size {
            return Err(Error::TooLarge {
                op: "pin_memory",
                size_bytes,
                limit_bytes: self.max_buffer_size,
                what: "a pinned block larger than one wgpu buffer",
            });
        }
        let usage = match kind {
            PinnedKind::Upload => wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
            PinnedKind::Download => wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        };
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        // An upload buffer maps at creation without an extra copy; a download buffer asks for
        // its map (mapping at creation would stage it through another buffer).
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("kiln pinned"),
            // wgpu maps whole 4-byte words.
            size: size_bytes.max(4),
            usage,
            mapped_at_creation: kind == PinnedKind::Upload,
        });
        let validation = pollster::block_on(validation.pop());
        let oom = pollster::block_on(oom.pop());
        if let Some(e) = oom.or(validation) {
            return Err(Error::Wgpu {
                op: "pin_memory",
                msg: format!("creating a {size_bytes}-byte staging buffer: {e}"),
            });
        }
        let pinned = PinnedBuffer {
            buffer,
            kind,
            state: Mutex::new(MapState::InFlight(0)),
            mapped: Arc::new(AtomicU8::new(MAP_DONE)),
        };
        if kind == PinnedKind::Download {
            (pinned.request_map())();
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
