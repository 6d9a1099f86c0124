//! `DeviceBlock`: memory from a device's caching allocator, returned to it on drop, and the raw
//! operations tensors are built on (fill, write, read). GPU writes are staged and copied inside
//! the stream's encoder, so they stay ordered after work recorded earlier.
//! See Note [Ordered uploads] in ARCHITECTURE.md.

use super::{lock, with_alloc, Backend, Device};
use crate::alloc::HostSegment;
use crate::kernels::{grid, Kernel, WORKGROUP};
use crate::{Error, Result};

pub(crate) enum Mem {
    Host(HostSegment),
    Gpu(wgpu::Buffer),
}

/// A block of device memory. Dropping it frees the block to the cache (not to the device).
pub struct DeviceBlock {
    device: Device,
    addr: u64,
    offset: u64,
    size: u64,
    requested: u64,
    mem: Option<Mem>,
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
        let (addr, offset, size, mem) = match &device.0.backend {
            Backend::Cpu(m) => match lock(m).malloc(size_bytes, 0)? {
                Some(b) => (b.addr, b.offset, b.size, Some(Mem::Host(b.segment))),
                None => (0, 0, 0, None),
            },
            Backend::Gpu(g) => {
                g.check("allocate")?;
                match lock(&g.alloc).malloc(size_bytes, 0)? {
                    Some(b) => (b.addr, b.offset, b.size, Some(Mem::Gpu(b.segment))),
                    None => (0, 0, 0, None),
                }
            }
        };
        Ok(DeviceBlock {
            device: device.clone(),
            addr,
            offset,
            size,
            requested: size_bytes,
            mem,
        })
    }

    pub fn device(&self) -> &Device {
        &self.device
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

    /// The whole block as a storage binding, refused past the device's binding limit.
    pub(crate) fn binding(&self, max_binding_bytes: u64) -> Result<wgpu::BufferBinding<'_>> {
        let Some(Mem::Gpu(buffer)) = &self.mem else {
            return Err(Error::InvalidArgument {
                op: "bind",
                msg: "not a GPU block".into(),
            });
        };
        if self.size > max_binding_bytes {
            return Err(Error::TooLarge {
                op: "bind",
                size_bytes: self.size,
                limit_bytes: max_binding_bytes,
                what: "a tensor larger than one storage binding",
            });
        }
        Ok(wgpu::BufferBinding {
            buffer,
            offset: self.offset,
            size: wgpu::BufferSize::new(self.size),
        })
    }

    /// The host address of the block's first byte (CPU device only).
    pub(crate) fn host_ptr(&self) -> Option<*mut u8> {
        match &self.mem {
            // SAFETY: the offset lies inside the segment.
            Some(Mem::Host(seg)) => Some(unsafe { seg.as_ptr().add(self.offset as usize) }),
            _ => None,
        }
    }

    /// Sets every 32-bit word of the block to `value` (the kernel behind `fill_`/`zero_`).
    /// Queued on the GPU; returns at once.
    pub fn fill_u32(&self, value: u32) -> Result<()> {
        // Whole words: a block is at least 512 bytes, so the last partial word is its own.
        let words = self.requested.div_ceil(4);
        match (&self.mem, self.device.gpu()) {
            (None, _) => Ok(()),
            (Some(Mem::Host(seg)), _) => {
                // SAFETY: this block owns [offset, offset + requested) of the segment.
                let bytes = unsafe {
                    std::slice::from_raw_parts_mut(
                        seg.as_ptr().add(self.offset as usize),
                        (words * 4) as usize,
                    )
                };
                for w in bytes.chunks_exact_mut(4) {
                    w.copy_from_slice(&value.to_le_bytes());
                }
                Ok(())
            }
            (Some(Mem::Gpu(buffer)), Some(g)) => {
                g.check("fill_u32")?;
                let kernel = lock(&g.kernels).get(&g.device, Kernel::Fill);
                let limits = &g.info.limits;
                // Bind at most the largest aligned range a binding may cover; loop over chunks.
                let align = limits.min_storage_buffer_offset_alignment as u64;
                let max_bind = (limits.max_storage_buffer_binding_size / align) * align;
                let max_words = (max_bind / 4).min(
                    WORKGROUP as u64 * limits.max_compute_workgroups_per_dimension as u64 * 65535,
                );
                let mut done = 0u64;
                let mut stream = lock(&g.stream);
                while done < words {
                    let n = (words - done).min(max_words);
                    let bind_bytes = (n * 4).next_multiple_of(4);
                    let bind_group = g.device.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: Some("fill"),
                        layout: &kernel.layout,
                        entries: &[wgpu::BindGroupEntry {
                            binding: 0,
                            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                                buffer,
                                offset: self.offset + done * 4,
                                size: wgpu::BufferSize::new(bind_bytes),
                            }),
                        }],
                    });
                    let (x, y) = grid(n, limits.max_compute_workgroups_per_dimension);
                    let pass = stream.pass(&g.device);
                    pass.set_pipeline(&kernel.pipeline);
                    pass.set_bind_group(0, &bind_group, &[]);
                    let params = [n as u32, value];
                    pass.set_immediates(0, bytemuck::cast_slice(&params));
                    pass.dispatch_workgroups(x, y, 1);
                    stream.recorded(&g.queue);
                    done += n;
                }
                Ok(())
            }
            (Some(Mem::Gpu(_)), None) => unreachable!("GPU memory belongs to a GPU device"),
        }
    }

    /// Copies `data` into the block at byte `offset`. On a GPU the data is staged and the copy
    /// is recorded in the stream, after all work recorded before it. Lengths and offsets are
    /// multiples of 4 (wgpu's copy alignment).
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        let len = data.len() as u64;
        self.check_range("write", offset, len)?;
        if len == 0 {
            return Ok(());
        }
        match (&self.mem, self.device.gpu()) {
            (None, _) => Ok(()),
            (Some(Mem::Host(seg)), _) => {
                // SAFETY: within this block's range, checked above.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        data.as_ptr(),
                        seg.as_ptr().add((self.offset + offset) as usize),
                        data.len(),
                    )
                };
                Ok(())
            }
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
                let staging = g.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("kiln upload"),
                    size: len,
                    usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::MAP_WRITE,
                    mapped_at_creation: true,
                });
                staging
                    .slice(..)
                    .get_mapped_range_mut()
                    .map_err(|e| Error::Wgpu {
                        op: "write",
                        msg: e.to_string(),
                    })?
                    .copy_from_slice(data);
                staging.unmap();
                let mut stream = lock(&g.stream);
                stream.copy_encoder(&g.device).copy_buffer_to_buffer(
                    &staging,
                    0,
                    buffer,
                    self.offset + offset,
                    len,
                );
                stream.recorded(&g.queue);
                Ok(())
            }
            (Some(Mem::Gpu(_)), None) => unreachable!("GPU memory belongs to a GPU device"),
        }
    }

    /// Reads the whole block to the host: a sync point (waits for the work that writes it).
    pub fn read(&self) -> Result<Vec<u8>> {
        let len = self.requested;
        match (&self.mem, self.device.gpu()) {
            (None, _) => Ok(Vec::new()),
            (Some(Mem::Host(seg)), _) => {
                // SAFETY: within this block's range.
                let bytes = unsafe {
                    std::slice::from_raw_parts(seg.as_ptr().add(self.offset as usize), len as usize)
                };
                Ok(bytes.to_vec())
            }
            (Some(Mem::Gpu(buffer)), Some(g)) => {
                g.check("read")?;
                let padded = len.next_multiple_of(4);
                let staging = g.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("kiln readback"),
                    size: padded,
                    usage: wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::MAP_READ,
                    mapped_at_creation: false,
                });
                let mut stream = lock(&g.stream);
                stream.copy_encoder(&g.device).copy_buffer_to_buffer(
                    buffer,
                    self.offset,
                    &staging,
                    0,
                    padded,
                );
                let event = stream.submit(&g.queue);
                staging.slice(..).map_async(wgpu::MapMode::Read, |_| {});
                stream
                    .wait(&g.device, &g.queue, event)
                    .map_err(|e| Error::Wgpu {
                        op: "read",
                        msg: e.to_string(),
                    })?;
                drop(stream);
                // The map callback runs inside poll; wait once more for it to have run.
                g.device
                    .poll(wgpu::PollType::wait_indefinitely())
                    .map_err(|e| Error::Wgpu {
                        op: "read",
                        msg: e.to_string(),
                    })?;
                g.check("read")?;
                g.check_asserts()?;
                let view = staging
                    .slice(..)
                    .get_mapped_range()
                    .map_err(|e| Error::Wgpu {
                        op: "read",
                        msg: e.to_string(),
                    })?;
                Ok(view[..len as usize].to_vec())
            }
            (Some(Mem::Gpu(_)), None) => unreachable!("GPU memory belongs to a GPU device"),
        }
    }
}

impl Drop for DeviceBlock {
    fn drop(&mut self) {
        if self.mem.take().is_some() {
            // Freeing a block this allocator handed out cannot fail; nothing to report in drop.
            let _ = with_alloc!(self.device, a => a.free(self.addr));
        }
    }
}
