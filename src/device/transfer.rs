//! Host-device copies through the pinned pool: pageable uploads and readbacks staged in chunks
//! (several in flight, so the DMA of one overlaps the host copy of the next), kiln's CUDA events,
//! and the handle of a non-blocking copy. See Note [Pinned host memory] in ARCHITECTURE.md.

use super::gpu::GpuDevice;
use super::pinned::PinnedBuffer;
use super::{lock, wgpu_err, Device};
use crate::host::PinnedKind;
use crate::{Error, Result};
use std::collections::VecDeque;
use std::sync::Arc;

/// Chunks of a pageable copy allowed in flight before the next waits for the oldest.
pub(crate) const DEPTH: usize = 3;
/// Host copies at least this large are split across threads (one thread copies ~10 GB/s).
const PARALLEL_COPY_BYTES: usize = 4 << 20;

/// Threads for large host copies: `KILN_COPY_THREADS`, else the cores up to 8.
fn copy_threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| {
        std::env::var("KILN_COPY_THREADS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get().min(8)))
            .max(1)
    })
}

/// `dst.copy_from_slice(src)`, on several threads for large copies.
pub(crate) fn par_copy(dst: &mut [u8], src: &[u8]) {
    let threads = copy_threads();
    if src.len() < PARALLEL_COPY_BYTES || threads < 2 {
        dst.copy_from_slice(src);
        return;
    }
    let piece = src.len().div_ceil(threads).next_multiple_of(4096);
    std::thread::scope(|s| {
        for (d, c) in dst.chunks_mut(piece).zip(src.chunks(piece)) {
            s.spawn(move || d.copy_from_slice(c));
        }
    });
}

/// A pinned block borrowed from the pool for one chunk; returned (pending its copy's event) on
/// drop.
struct Staging<'a> {
    g: &'a GpuDevice,
    id: usize,
    buffer: Arc<PinnedBuffer>,
    event: Option<u64>,
}

impl<'a> Staging<'a> {
    fn new(g: &'a GpuDevice, bytes: u64, kind: PinnedKind) -> Result<Staging<'a>> {
        let block = lock(&g.host)
            .allocate(bytes, kind)?
            .expect("staging chunks are never empty");
        Ok(Staging {
            g,
            id: block.id,
            buffer: block.segment,
            event: None,
        })
    }

    fn record(
        &mut self,
        submit: bool,
        what: (&'static str, u64),
        record: impl FnOnce(&mut wgpu::CommandEncoder, &wgpu::Buffer),
    ) -> Result<u64> {
        let event = self.buffer.record_copy(self.g, submit, what, record)?;
        lock(&self.g.host).record_event(self.id, event);
        self.event = Some(event);
        Ok(event)
    }
}

impl Drop for Staging<'_> {
    fn drop(&mut self) {
        lock(&self.g.host).free(self.id);
    }
}

/// Copies `data` into `dst` at `offset`, staged through the pool in chunks, each copy recorded in
/// the stream after all work recorded before it. Returns once `data` may be reused (PyTorch's
/// pageable copy); the copies themselves run in order with the queued work.
pub(crate) fn upload(g: &GpuDevice, dst: &wgpu::Buffer, offset: u64, data: &[u8]) -> Result<()> {
    let chunk = g.staging_chunk_bytes() as usize;
    let many = data.len() > chunk;
    let mut in_flight: VecDeque<u64> = VecDeque::new();
    for (i, piece) in data.chunks(chunk).enumerate() {
        if in_flight.len() >= DEPTH {
            let oldest = in_flight.pop_front().expect("non-empty");
            super::stream::wait_unlocked(&g.stream, &g.device, &g.queue, oldest)
                .map_err(wgpu_err("upload"))?;
        }
        let mut staging = Staging::new(g, piece.len() as u64, PinnedKind::Upload)?;
        let ptr = staging.buffer.host_ptr(g)?;
        // SAFETY: the block holds at least `piece.len()` mapped bytes and is ours until freed.
        par_copy(
            unsafe { std::slice::from_raw_parts_mut(ptr, piece.len()) },
            piece,
        );
        let at = offset + (i * chunk) as u64;
        let len = piece.len() as u64;
        // Several chunks: submit each so the DMA runs while the next chunk is copied.
        let event = staging.record(many, ("memcpy HtoD (pageable)", len), |enc, src| {
            enc.copy_buffer_to_buffer(src, 0, dst, at, len)
        })?;
        in_flight.push_back(event);
    }
    Ok(())
}

/// Copies `dst.len()` bytes of `src` from `offset` into `dst`: a sync point. Chunks go through
/// the pool with up to `DEPTH` DMAs in flight while earlier chunks are copied out. A buffer
/// copy moves whole words from a word-aligned offset, so a chunk starting inside a word (a row
/// of an f16 matrix of odd width) is copied from its word's start and the bytes before it are
/// skipped on the host.
pub(crate) fn download(
    g: &GpuDevice,
    src: &wgpu::Buffer,
    offset: u64,
    dst: &mut [u8],
) -> Result<()> {
    let chunk = g.staging_chunk_bytes() as usize;
    // A staged chunk: its staging block, where it goes in `dst`, its length, and the bytes
    // before it in the block.
    let mut pending: VecDeque<(Staging, usize, usize, usize)> = VecDeque::new();
    let finish =
        |(staging, at, len, skew): (Staging, usize, usize, usize), dst: &mut [u8]| -> Result<()> {
            let ptr = staging.buffer.host_ptr(g)?;
            // SAFETY: the block's mapping holds the `skew + len` bytes just copied into it.
            par_copy(&mut dst[at..at + len], unsafe {
                std::slice::from_raw_parts(ptr.add(skew), len)
            });
            Ok(())
        };
    let total = dst.len();
    let mut at = 0;
    while at < total {
        let from = offset + at as u64;
        let skew = (from % 4) as usize;
        let len = (chunk - skew).min(total - at);
        // Copies move whole 4-byte words; the staging block is a power of two >= that.
        let words = ((skew + len) as u64).next_multiple_of(4);
        let mut staging = Staging::new(g, words, PinnedKind::Download)?;
        staging.record(true, ("memcpy DtoH (pageable)", words), |enc, dst_buf| {
            enc.copy_buffer_to_buffer(src, from - skew as u64, dst_buf, 0, words)
        })?;
        pending.push_back((staging, at, len, skew));
        if pending.len() >= DEPTH {
            finish(pending.pop_front().expect("non-empty"), dst)?;
        }
        at += len;
    }
    while let Some(p) = pending.pop_front() {
        finish(p, dst)?;
    }
    g.check("read")?;
    g.check_asserts()
}

/// kiln's CUDA event: a point in a device's stream. Recording one submits what is queued, so
/// that it completes without further calls.
#[derive(Clone, Debug)]
pub struct Event {
    device: Device,
    seq: u64,
}

impl Event {
    pub(crate) fn at(device: &Device, seq: u64) -> Event {
        Event {
            device: device.clone(),
            seq,
        }
    }

    /// Whether all work queued before the event has completed. Never blocks.
    pub fn query(&self) -> bool {
        match self.device.gpu() {
            Some(g) => lock(&g.stream).query(&g.device, self.seq),
            None => true,
        }
    }

    /// Blocks until the event has completed (`cudaEventSynchronize`).
    pub fn synchronize(&self) -> Result<()> {
        let Some(g) = self.device.gpu() else {
            return Ok(());
        };
        super::stream::wait_unlocked(&g.stream, &g.device, &g.queue, self.seq)
            .map_err(wgpu_err("event synchronize"))?;
        g.check("event synchronize")
    }

    /// The submission sequence number (events of one device are ordered by it).
    pub fn sequence(&self) -> u64 {
        self.seq
    }
}

impl Device {
    /// Records an event after all work queued so far (`torch.cuda.Event().record()`).
    pub fn record_event(&self) -> Result<Event> {
        let seq = match self.gpu() {
            Some(g) => {
                g.check("record_event")?;
                lock(&g.stream).submit(&g.queue)
            }
            None => 0,
        };
        Ok(Event {
            device: self.clone(),
            seq,
        })
    }
}

/// A non-blocking copy in flight: wait for it, poll it, or `.await` it.
///
/// For a copy into pinned memory, completion also means the host may read the pinned tensor
/// without waiting; for a copy out of pinned memory, that the host may write it again.
pub struct Transfer {
    pub(crate) event: Event,
    pub(crate) pinned: Option<(Device, Arc<PinnedBuffer>)>,
}

impl Transfer {
    /// Blocks until the copy has landed.
    pub fn wait(&self) -> Result<()> {
        self.event.synchronize()?;
        if let Some((gpu, buffer)) = &self.pinned {
            if let Some(g) = gpu.gpu() {
                buffer.host_ptr(g)?;
            }
        }
        Ok(())
    }

    /// Whether the copy has landed. Never blocks.
    pub fn is_ready(&self) -> bool {
        match &self.pinned {
            Some((gpu, buffer)) => gpu.gpu().is_none_or(|g| buffer.is_ready(g)),
            None => self.event.query(),
        }
    }

    /// The event that completes with the copy.
    pub fn event(&self) -> &Event {
        &self.event
    }
}

impl std::future::IntoFuture for Transfer {
    type Output = Result<()>;
    type IntoFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send>>;

    /// wgpu runs completion callbacks only inside `poll`, so a helper thread waits for the copy
    /// and completes a futures-intrusive oneshot channel the future awaits.
    fn into_future(self) -> Self::IntoFuture {
        let (tx, rx) = futures_intrusive::channel::shared::oneshot_channel::<Result<()>>();
        std::thread::spawn(move || {
            let _ = tx.send(self.wait());
        });
        Box::pin(async move {
            rx.receive().await.unwrap_or_else(|| {
                Err(Error::Wgpu {
                    op: "transfer",
                    msg: "the waiting thread ended without an answer".into(),
                })
            })
        })
    }
}
