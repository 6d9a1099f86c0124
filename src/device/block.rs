//! `DeviceBlock`: memory from a device's caching allocator, returned to it on drop, and the raw
//! operations tensors are built on (write, read; the GPU fill is a kernel, `kernels/fill.rs`). GPU writes are staged and copied inside
//! the stream's encoder, so they stay ordered after work recorded earlier.
//! See Note [Ordered uploads] in ARCHITECTURE.md.

use super::pinned::PinnedBuffer;
use super::pressure::malloc_relieved;
use super::{lock, transfer, with_alloc, Backend, Device};
use crate::alloc::{HostSegment, MemoryCategory};
use crate::host::PinnedKind;
use crate::{Error, Result};
use std::sync::Arc;

pub(crate) enum Mem {
    Host(HostSegment),
    Gpu(wgpu::Buffer),
    /// A planning device's block: a size in its allocator, with no memory behind it.
    Planned,
    /// A block of a GPU's pinned pool: host memory (the block's device is the GPU's CPU
    /// device) that the GPU copies to or from without an extra host copy.
    Pinned {
        gpu: Device,
        id: usize,
        buffer: Arc<PinnedBuffer>,
    },
}

/// A block of device memory. Dropping it frees the block to the cache (not to the device).
pub struct DeviceBlock {
    device: Device,
    addr: u64,
    offset: u64,
    size: u64,
    requested: u64,
    mem: Option<Mem>,
    /// The top-level op running when the block was allocated (0: none): freed while that op
    /// still runs, the block was a temporary.
    op: u64,
}

impl std::fmt::Debug for DeviceBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBlock({:#x}, {} bytes on {})",
            self.addr,
            self.requested,
            self.device.spec()
        )
    }
}

impl DeviceBlock {
    pub(crate) fn allocate(device: &Device, size_bytes: u64) -> Result<DeviceBlock> {
        DeviceBlock::allocate_on(device, size_bytes, 0)
    }

    /// A block of the allocator's `stream` (`EXTERNAL_STREAM`: memory another driver imports).
    pub(crate) fn allocate_on(
        device: &Device,
        size_bytes: u64,
        stream: u64,
    ) -> Result<DeviceBlock> {
        let (addr, offset, size, mem) = match &device.0.backend {
            Backend::Cpu(m) => match lock(m).malloc(size_bytes, stream)? {
                Some(b) => (b.addr, b.offset, b.size, Some(Mem::Host(b.segment))),
                None => (0, 0, 0, None),
            },
            Backend::Gpu(g) => {
                g.check("allocate")?;
                match malloc_relieved(device, &g.alloc, size_bytes, stream)? {
                    Some(b) => (b.addr, b.offset, b.size, Some(Mem::Gpu(b.segment))),
                    None => (0, 0, 0, None),
                }
            }
            Backend::Plan(p) => match malloc_relieved(device, &p.alloc, size_bytes, stream)? {
                Some(b) => (b.addr, b.offset, b.size, Some(Mem::Planned)),
                None => (0, 0, 0, None),
            },
        };
        Ok(DeviceBlock {
            device: device.clone(),
            addr,
            offset,
            size,
            requested: size_bytes,
            mem,
            op: crate::alloc::outer_op(),
        })
    }

    /// A block of `gpu`'s pinned pool, on that GPU's CPU device.
    pub(crate) fn allocate_pinned(
        gpu: &Device,
        size_bytes: u64,
        kind: PinnedKind,
    ) -> Result<DeviceBlock> {
        if let Backend::Plan(p) = &gpu.0.backend {
            // A dry run's pinned tensors are plain host memory of its CPU device: what the
            // host holds is real data (a loader's batches), and no copy runs.
            return DeviceBlock::allocate(&p.host_device, size_bytes);
        }
        let Some(g) = gpu.gpu() else {
            return Err(Error::InvalidArgument {
                op: "pin_memory",
                msg: format!("pinned memory belongs to a GPU, not {}", gpu.name()),
            });
        };
        g.check("pin_memory")?;
        let block = lock(&g.host).allocate(size_bytes, kind)?;
        Ok(match block {
            Some(b) => DeviceBlock {
                device: g.host_device.clone(),
                addr: 0,
                offset: 0,
                size: b.size,
                requested: size_bytes,
                mem: Some(Mem::Pinned {
                    gpu: gpu.clone(),
                    id: b.id,
                    buffer: b.segment,
                }),
                op: 0,
            },
            None => DeviceBlock {
                device: g.host_device.clone(),
                addr: 0,
                offset: 0,
                size: 0,
                requested: 0,
                mem: None,
                op: 0,
            },
        })
    }

    /// The device the block belongs to.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Marks what the block holds, for the categorised memory timeline (where its current
    /// category yields: `MemoryCategory::yields_to`).
    pub(crate) fn set_category(&self, category: MemoryCategory) {
        if matches!(self.mem, Some(Mem::Gpu(_) | Mem::Host(_) | Mem::Planned)) {
            with_alloc!(self.device, a => a.set_category(self.addr, category));
        }
    }

    /// The GPU whose pinned pool holds this block, its staging buffer and pool id.
    pub(crate) fn pinned(&self) -> Option<(&Device, &Arc<PinnedBuffer>, usize)> {
        match &self.mem {
            Some(Mem::Pinned { gpu, id, buffer }) => Some((gpu, buffer, *id)),
            _ => None,
        }
    }

    /// The GPU buffer behind a GPU block.
    pub(crate) fn gpu_buffer(&self) -> Option<&wgpu::Buffer> {
        match &self.mem {
            Some(Mem::Gpu(b)) => Some(b),
            _ => None,
        }
    }

    /// Whether this is pinned memory (and of which kind).
    pub fn pinned_kind(&self) -> Option<PinnedKind> {
        self.pinned().map(|(_, b, _)| b.kind)
    }

    /// The host address of the block's first byte, for host memory (waiting for a copy in
    /// flight on pinned memory); `None` for GPU memory and empty blocks.
    pub(crate) fn host_address(&self) -> Result<Option<*mut u8>> {
        match &self.mem {
            // SAFETY: the offset lies inside the segment.
            Some(Mem::Host(seg)) => Ok(Some(unsafe { seg.as_ptr().add(self.offset as usize) })),
            Some(Mem::Pinned { gpu, buffer, .. }) => match gpu.gpu() {
                Some(g) => Ok(Some(buffer.host_ptr(g)?)),
                None => Ok(None),
            },
            _ => Ok(None),
        }
    }
    /// The bytes asked for.
    pub fn len_bytes(&self) -> u64 {
        self.requested
    }
    /// The block's size in the allocator (rounded up).
    pub fn block_size(&self) -> u64 {
        self.size
    }
    /// The block's address in kiln's virtual address space (as snapshots show it).
    pub fn address(&self) -> u64 {
        self.addr
    }
    /// Byte offset inside its segment's buffer.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Writes may cover the block's padding (up to its rounded size), so that elements of any
    /// width can be written in whole words.
    fn check_range(&self, op: &'static str, offset: u64, len: u64) -> Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(Error::InvalidArgument {
                op,
                msg: format!(
                    "range {offset}..{} outside a block of {} bytes",
                    offset.saturating_add(len),
                    self.size
                ),
            });
        }
        Ok(())
    }

    /// Whether `bytes` of the block (all of it, or a window) fit one storage binding of
    /// `max_binding_bytes` (a planning device's launch checks what the target's would).
    pub(crate) fn check_bindable(&self, bytes: u64, max_binding_bytes: u64) -> Result<()> {
        if bytes > max_binding_bytes {
            return Err(Error::TooLarge {
                op: "bind",
                size_bytes: bytes,
                limit_bytes: max_binding_bytes,
                what: "bytes of a tensor to bind (one storage binding)",
            });
        }
        Ok(())
    }

    /// The block as a storage binding: whole, or its bytes `[start, start + len)` (the launch
    /// has checked the size against the device's binding limit, `check_bindable`, and
    /// `kernels::window_covering` aligned the start).
    pub(crate) fn binding(&self, window: Option<(u64, u64)>) -> Result<wgpu::BufferBinding<'_>> {
        let Some(Mem::Gpu(buffer)) = &self.mem else {
            return Err(Error::InvalidArgument {
                op: "bind",
                msg: "not a GPU block".into(),
            });
        };
        let (start, len) = window.unwrap_or((0, self.size));
        self.check_range("bind", start, len)?;
        Ok(wgpu::BufferBinding {
            buffer,
            offset: self.offset + start,
            size: wgpu::BufferSize::new(len),
        })
    }

    /// The host address of the block's first byte (CPU device only). Pinned memory must have
    /// been made ready first (`ops::ready_on_host`); if a copy into it started since, this
    /// waits, and a failed wait gives `None`.
    pub(crate) fn host_ptr(&self) -> Option<*mut u8> {
        self.host_address().ok().flatten()
    }

    /// Sets every 32-bit word of a host (or pinned) block to `value` (a planning device's block
    /// has nothing to set). Returns `Ok(false)` for GPU memory, which the fill kernel sets instead (`DeviceBlock::fill_u32` in
    /// `kernels/fill.rs`: the device layer provides memory, the kernels layer launches).
    pub(crate) fn fill_host_u32(&self, value: u32) -> Result<bool> {
        let Some(Mem::Host(_) | Mem::Pinned { .. }) = &self.mem else {
            return Ok(matches!(self.mem, None | Some(Mem::Planned)));
        };
        let Some(ptr) = self.host_address()? else {
            return Ok(true);
        };
        // SAFETY: this block owns [offset, offset + requested) of its memory.
        let bytes = unsafe { std::slice::from_raw_parts_mut(ptr, self.requested as usize) };
        let pattern = value.to_le_bytes();
        let mut words = bytes.chunks_exact_mut(4);
        for w in &mut words {
            w.copy_from_slice(&pattern);
        }
        let tail = words.into_remainder();
        let n = tail.len();
        tail.copy_from_slice(&pattern[..n]);
        Ok(true)
    }

    /// The GPU buffer and the block's byte offset in it, for GPU memory.
    pub(crate) fn gpu_range(&self) -> Option<(&wgpu::Buffer, u64)> {
        match &self.mem {
            Some(Mem::Gpu(buffer)) => Some((buffer, self.offset)),
            _ => None,
        }
    }

    /// Copies `data` into the block at byte `offset`. On a GPU the data is staged through the
    /// pinned pool and the copy is recorded in the stream, after all work recorded before it;
    /// this returns once `data` may be reused. Lengths and offsets are multiples of 4 on a GPU
    /// (wgpu's copy alignment).
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        let len = data.len() as u64;
        self.check_range("write", offset, len)?;
        if len == 0 {
            return Ok(());
        }
        match (&self.mem, self.device.gpu()) {
            // A dry run drops writes (nothing reads them back), and takes the staging chunks
            // the upload would.
            (Some(Mem::Planned), _) => {
                super::planned_staging(&self.device, len, PinnedKind::Upload)
            }
            (None, _) => Ok(()),
            (Some(Mem::Gpu(buffer)), Some(g)) => {
                if !offset.is_multiple_of(4) || !len.is_multiple_of(4) {
                    return Err(Error::InvalidArgument {
                        op: "write",
                        msg: format!(
                            "offset {offset} and length {len} must be multiples of 4 on a GPU"
                        ),
                    });
                }
                g.check("write")?;
                transfer::upload(g, buffer, self.offset + offset, data)
            }
            (Some(Mem::Gpu(_)), None) => unreachable!("GPU memory belongs to a GPU device"),
            (Some(_), _) => {
                let Some(ptr) = self.host_address()? else {
                    return Ok(());
                };
                // SAFETY: within this block's range, checked above.
                let dst =
                    unsafe { std::slice::from_raw_parts_mut(ptr.add(offset as usize), data.len()) };
                transfer::par_copy(dst, data);
                Ok(())
            }
        }
    }

    /// Reads the whole block to the host: a sync point (waits for the work that writes it).
    pub fn read(&self) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.requested as usize];
        self.read_into(0, &mut out)?;
        Ok(out)
    }

    /// Reads `dst.len()` bytes from byte `offset` into `dst`: a sync point on a GPU.
    pub fn read_into(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.check_range("read", offset, dst.len() as u64)?;
        if dst.is_empty() {
            return Ok(());
        }
        match (&self.mem, self.device.gpu()) {
            (None, _) => Ok(()),
            (Some(Mem::Planned), _) => Err(Error::DryRun {
                op: "read",
                what: format!("{} bytes of a tensor on {}", dst.len(), self.device.name()),
            }),
            (Some(Mem::Gpu(buffer)), Some(g)) => {
                g.check("read")?;
                transfer::download(g, buffer, self.offset + offset, dst)
            }
            (Some(Mem::Gpu(_)), None) => unreachable!("GPU memory belongs to a GPU device"),
            (Some(_), _) => {
                let Some(ptr) = self.host_address()? else {
                    return Ok(());
                };
                // SAFETY: within this block's range, checked above.
                let src =
                    unsafe { std::slice::from_raw_parts(ptr.add(offset as usize), dst.len()) };
                transfer::par_copy(dst, src);
                Ok(())
            }
        }
    }
}

impl Drop for DeviceBlock {
    fn drop(&mut self) {
        if let Some(Mem::Pinned { gpu, id, .. }) = &self.mem {
            if let Some(g) = gpu.gpu() {
                lock(&g.host).free(*id);
            }
            self.mem = None;
        }
        if self.mem.take().is_some() {
            let temporary = crate::alloc::op_is_open(self.op);
            // Freeing a block this allocator handed out cannot fail; nothing to report in drop.
            let _ = with_alloc!(self.device, a => {
                if temporary {
                    a.set_category(self.addr, MemoryCategory::Temporary);
                }
                a.free(self.addr)
            });
        }
    }
}
