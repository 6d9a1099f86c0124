//! Reading tensors back, pinned CPU tensors and copies between devices: `to_vec`/`item`,
//! PyTorch's `pin_memory()`, `torch.empty(..., pin_memory=True)`, `to(device)`, `copy_` across
//! devices and `non_blocking=True`. Ops, not tensor primitives: a non-contiguous source is
//! first made contiguous by a copy kernel.
//! See Note [Pinned host memory] in ARCHITECTURE.md.

use crate::device::{Device, DeviceBlock, Event, Transfer};
use crate::host::PinnedKind;
use crate::tensor::{Element, Layout, Tensor};
use crate::{DType, Error, Result};
use std::sync::Arc;

/// A non-blocking copy moves whole 4-byte words from and to 4-byte aligned offsets.
fn word_aligned(t: &Tensor) -> bool {
    (t.layout.offset * t.dtype.size_bytes()).is_multiple_of(4)
}

/// A direct copy between pinned memory and its GPU (`copy_non_blocking_`, `copy_side_`): both
/// tensors contiguous, same shape and dtype, at word-aligned offsets, the pinned side's memory
/// going that way. GPU -> pinned (download) first, as a pinned destination asks, else pinned
/// -> GPU.
struct PinnedCopy<'a> {
    gpu: &'a Device,
    buffer: &'a Arc<crate::device::pinned::PinnedBuffer>,
    /// The pinned block's id in the host allocator.
    id: usize,
    /// The GPU side.
    on_gpu: &'a Tensor,
    download: bool,
    bytes: u64,
    /// Byte offsets of the destination and the source in their blocks.
    dst_at: u64,
    src_at: u64,
}

impl<'a> PinnedCopy<'a> {
    fn of(dst: &'a Tensor, src: &'a Tensor) -> Option<PinnedCopy<'a>> {
        let direct = dst.shape() == src.shape()
            && dst.dtype == src.dtype
            && dst.is_contiguous()
            && src.is_contiguous()
            && word_aligned(dst)
            && word_aligned(src);
        if !direct {
            return None;
        }
        let (gpu, buffer, id, on_gpu, download) =
            match (dst.storage.block.pinned(), src.storage.block.pinned()) {
                (Some((gpu, buffer, id)), _) if buffer.can_download() && src.device() == gpu => {
                    (gpu, buffer, id, src, true)
                }
                (_, Some((gpu, buffer, id))) if buffer.can_upload() && dst.device() == gpu => {
                    (gpu, buffer, id, dst, false)
                }
                _ => return None,
            };
        let at = |t: &Tensor| (t.layout.offset * t.dtype.size_bytes()) as u64;
        Some(PinnedCopy {
            gpu,
            buffer,
            id,
            on_gpu,
            download,
            bytes: (dst.numel() * dst.dtype.size_bytes()) as u64,
            dst_at: at(dst),
            src_at: at(src),
        })
    }
}

impl Tensor {
    /// The raw little-endian bytes of the elements in row-major order (`from_le_bytes`'s
    /// inverse): a sync point on a GPU.
    pub fn to_le_bytes(&self) -> Result<Vec<u8>> {
        let t = self.contiguous()?;
        let mut bytes = t.storage.block.read()?;
        let start = t.layout.offset * t.dtype.size_bytes();
        bytes.drain(..start.min(bytes.len()));
        bytes.truncate(t.numel() * t.dtype.size_bytes());
        Ok(bytes)
    }

    /// The elements in row-major order (a sync point). `T` must be the tensor's dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        crate::base::expect_dtype("to_vec", T::DTYPE, self.dtype)?;
        let w = self.dtype.size_bytes();
        Ok(self
            .to_le_bytes()?
            .chunks_exact(w)
            .map(T::read_le)
            .collect())
    }

    /// Any dtype as f64 (for tests and printing).
    pub fn to_f64_vec(&self) -> Result<Vec<f64>> {
        let bytes = self.to_le_bytes()?;
        let w = self.dtype.size_bytes();
        let decode = |c: &[u8]| match self.dtype {
            DType::F32 => f32::read_le(c).to_f64(),
            DType::F64 => f64::read_le(c),
            DType::F16 => half::f16::read_le(c).to_f64(),
            DType::I32 => i32::read_le(c).to_f64(),
            DType::U32 => u32::read_le(c).to_f64(),
            DType::Bool => bool::read_le(c).to_f64(),
        };
        Ok(bytes.chunks_exact(w).map(decode).collect())
    }

    /// The single element of a one-element tensor (a sync point).
    pub fn item<T: Element>(&self) -> Result<T> {
        if self.numel() != 1 {
            return Err(Error::InvalidArgument {
                op: "item",
                msg: format!(
                    "a tensor of shape {:?} has {} elements, not 1",
                    self.shape(),
                    self.numel()
                ),
            });
        }
        Ok(self.to_vec::<T>()?[0])
    }

    /// A copy on `device` (CPU and any GPU).
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        if device == self.device() {
            return Ok(self.clone());
        }
        let w = self.dtype.size_bytes();
        let odd_bytes = !(self.numel() * w).is_multiple_of(4);
        let out = if odd_bytes && !device.is_cpu() {
            // A GPU copy moves whole 4-byte words (an odd count of f16s, say): the words go
            // into a storage one element longer, viewed at the shape. The storage is new, so
            // the padding belongs to no other tensor; its block was rounded up anyway.
            let bytes = self.numel() * w;
            let extra = (bytes.next_multiple_of(4) - bytes).div_ceil(w);
            let padded = Tensor::empty(&[self.numel() + extra], self.dtype, device)?;
            let src = self.contiguous()?;
            src.with_host_bytes(|data| {
                let mut words = data.to_vec();
                words.resize((bytes + extra * w).next_multiple_of(4), 0);
                padded.storage.block.write(0, &words)
            })?;
            Tensor {
                layout: Layout::contiguous(self.shape()),
                ..padded
            }
        } else {
            let out = Tensor::empty(self.shape(), self.dtype, device)?;
            crate::no_grad(|| out.copy_across_devices(self))?;
            out
        };
        out.mark_upload();
        Ok(out)
    }

    /// An uninitialised pinned CPU tensor: its storage is a block of `gpu`'s pinned pool (a
    /// mapped staging buffer), which the host reads and writes in place and `gpu` copies
    /// without an extra host copy. On Vulkan, pinned memory is host-cached system memory the
    /// GPU copies both ways, as CUDA's; elsewhere wgpu lets a mappable buffer go one way only,
    /// and `kind` says which: `Upload` memory is a copy source (fill it, then
    /// `to_device_non_blocking`), `Download` memory a copy destination. A copy the other way
    /// still works there, staged through the pool.
    pub fn empty_pinned(
        shape: &[usize],
        dtype: DType,
        gpu: &Device,
        kind: PinnedKind,
    ) -> Result<Tensor> {
        gpu.check_dtype("empty_pinned", dtype)?;
        let bytes = crate::tensor::storage_bytes("empty_pinned", shape, dtype)?;
        let block = DeviceBlock::allocate_pinned(gpu, bytes, kind)?;
        Ok(Tensor::on_block(block, shape, dtype))
    }

    /// A pinned copy of this CPU tensor, ready to upload to `gpu` (PyTorch's `pin_memory()`);
    /// the tensor itself when it already is pinned memory of `gpu`.
    pub fn pin_memory(&self, gpu: &Device) -> Result<Tensor> {
        if !self.device().is_cpu() {
            return Err(Error::InvalidArgument {
                op: "pin_memory",
                msg: format!(
                    "cannot pin a tensor on {}: only CPU tensors can be pinned",
                    self.device().name()
                ),
            });
        }
        if self
            .storage
            .block
            .pinned()
            .is_some_and(|(owner, _, _)| owner == gpu)
        {
            return Ok(self.clone());
        }
        let out = Tensor::empty_pinned(self.shape(), self.dtype, gpu, PinnedKind::Upload)?;
        self.contiguous()?
            .with_host_bytes(|bytes| out.storage.block.write(0, bytes))?;
        Ok(out)
    }

    /// Runs `f` on the elements' bytes in place: a contiguous CPU tensor (pinned or not) lends
    /// its memory, anything else is read into a buffer first.
    pub(crate) fn with_host_bytes<R>(&self, f: impl FnOnce(&[u8]) -> Result<R>) -> Result<R> {
        let w = self.dtype.size_bytes();
        if self.device().is_cpu() && self.is_contiguous() {
            if let Some(ptr) = self.storage.block.host_address()? {
                // SAFETY: a contiguous tensor covers numel * w bytes of its block from its
                // offset; the storage lives as long as `self`.
                let bytes = unsafe {
                    std::slice::from_raw_parts(ptr.add(self.layout.offset * w), self.numel() * w)
                };
                return f(bytes);
            }
        }
        f(&self.to_le_bytes()?)
    }

    /// Runs `f` on the elements of a contiguous CPU tensor (pinned or not) in place, for the
    /// host to fill (a data loader writing a batch into pinned memory). Waits for a copy in
    /// flight first; bumps the version.
    pub fn with_host_data_mut<T: Element + bytemuck::Pod, R>(
        &self,
        f: impl FnOnce(&mut [T]) -> R,
    ) -> Result<R> {
        crate::base::expect_dtype("with_host_data_mut", T::DTYPE, self.dtype)?;
        // Host memory is at least 4-byte aligned (blocks start at aligned offsets, elements at
        // multiples of their size), so the cast cannot fail.
        self.host_bytes_mut("with_host_data_mut", |b| f(bytemuck::cast_slice_mut(b)))
    }

    /// Runs `f` on the bytes of a contiguous CPU tensor (pinned or not) in place, waiting for a
    /// copy in flight first (the untyped `with_host_data_mut`, for transports that move bytes of
    /// any dtype); bumps the version.
    pub(crate) fn with_host_bytes_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> Result<R> {
        self.host_bytes_mut("with_host_bytes_mut", f)
    }

    fn host_bytes_mut<R>(&self, op: &'static str, f: impl FnOnce(&mut [u8]) -> R) -> Result<R> {
        if !self.device().is_cpu() || !self.is_contiguous() {
            return Err(Error::InvalidArgument {
                op,
                msg: format!(
                    "needs a contiguous CPU tensor, got {:?} on {}",
                    self.strides(),
                    self.device().name()
                ),
            });
        }
        self.check_inplace(op)?;
        let w = self.dtype.size_bytes();
        let Some(ptr) = self.storage.block.host_address()? else {
            return Ok(f(&mut []));
        };
        // SAFETY: the contiguous tensor covers numel * w bytes of its block from its offset;
        // the storage lives as long as `self`.
        let data = unsafe {
            std::slice::from_raw_parts_mut(ptr.add(self.layout.offset * w), self.numel() * w)
        };
        let r = f(data);
        self.bump_version();
        Ok(r)
    }

    /// Whether the storage is pinned memory.
    pub fn is_pinned(&self) -> bool {
        self.storage.block.pinned().is_some()
    }

    /// `Upload` or `Download` for pinned tensors.
    pub fn pinned_kind(&self) -> Option<PinnedKind> {
        self.storage.block.pinned_kind()
    }

    /// Waits until the host may touch this tensor's memory (pinned memory with a copy in
    /// flight); a no-op for every other tensor.
    pub(crate) fn host_ready(&self) -> Result<()> {
        if self.storage.block.pinned().is_some() {
            self.storage.block.host_address()?;
        }
        Ok(())
    }

    /// A copy on `device` that does not wait where PyTorch's `non_blocking=True` does not:
    /// from pinned memory to its GPU the copy is queued in order with the GPU's work and this
    /// returns at once; from a GPU to the CPU the result is a pinned tensor the copy lands in
    /// (reading it on the host waits for the copy, see `copy_non_blocking_`). Anything else is
    /// `to_device`.
    pub fn to_device_non_blocking(&self, device: &Device) -> Result<Tensor> {
        if device == self.device() && device.is_cpu() == self.device().is_cpu() {
            return Ok(self.clone());
        }
        let pinned_here = self
            .storage
            .block
            .pinned()
            .is_some_and(|(owner, _, _)| owner == device);
        if pinned_here {
            let out = Tensor::empty(self.shape(), self.dtype, device)?;
            out.copy_non_blocking_(self)?;
            out.mark_upload();
            return Ok(out);
        }
        if !self.device().is_cpu() && device.is_cpu() {
            let out = Tensor::empty_pinned(
                self.shape(),
                self.dtype,
                self.device(),
                PinnedKind::Download,
            )?;
            out.copy_non_blocking_(self)?;
            return Ok(out);
        }
        self.to_device(device)
    }

    /// Copies `src` into `self` without waiting where the memory allows it (PyTorch's
    /// `copy_(src, non_blocking=True)`): pinned memory into its GPU, or a GPU tensor into pinned
    /// memory of that GPU (where the pinned memory goes that way, see `empty_pinned`), both contiguous, same shape and dtype, at
    /// 4-byte aligned offsets. The copy is queued after all work queued before it and starts at
    /// once. Every other case copies as `copy_` does and returns a finished transfer.
    ///
    /// Reading or writing a pinned tensor on the host while its copy is in flight never shows
    /// stale or torn data: the host access waits for the copy (kiln's choice where CUDA leaves
    /// the race to the user). The returned `Transfer` says when that wait would be free.
    pub fn copy_non_blocking_(&self, src: &Tensor) -> Result<Transfer> {
        if let Some(plan) = PinnedCopy::of(self, src) {
            let (dst_off, src_off) = (plan.dst_at, plan.src_at);
            let (bytes, words) = (plan.bytes, plan.bytes.next_multiple_of(4));
            // Rounding up to a word must not spill into bytes another view of `self` owns.
            let spill_ok = bytes == words || dst_off + words <= self.storage.block.block_size();
            if spill_ok {
                let PinnedCopy {
                    gpu,
                    buffer,
                    id,
                    on_gpu,
                    download,
                    ..
                } = plan;
                self.check_inplace("copy_")?;
                let g = gpu.gpu().expect("pinned memory belongs to a GPU");
                let Some(gpu_buf) = on_gpu.storage.block.gpu_buffer() else {
                    return self.copy_blocking(src);
                };
                let gpu_at =
                    on_gpu.storage.block.offset() + if download { src_off } else { dst_off };
                let name = if download {
                    "memcpy DtoH (pinned)"
                } else {
                    "memcpy HtoD (pinned)"
                };
                let event = buffer.record_copy(g, true, (name, words), |enc, pinned| {
                    if download {
                        enc.copy_buffer_to_buffer(gpu_buf, gpu_at, pinned, dst_off, words)
                    } else {
                        enc.copy_buffer_to_buffer(pinned, src_off, gpu_buf, gpu_at, words)
                    }
                })?;
                crate::device::lock(&g.host).record_event(id, event);
                self.bump_version();
                return Ok(Transfer::new(gpu, event, Some(buffer.clone())));
            }
        }
        self.copy_blocking(src)
    }

    fn copy_blocking(&self, src: &Tensor) -> Result<Transfer> {
        self.copy_(src)?;
        let gpu = if self.device().is_cpu() {
            src.device()
        } else {
            self.device()
        };
        Ok(Transfer::new(gpu, gpu.record_event()?.sequence(), None))
    }

    /// `copy_` between devices: `src` (cast and broadcast to `self`) lands in `self`'s memory,
    /// staged through the pinned pool in chunks. Blocking, as PyTorch's pageable copies are.
    pub(crate) fn copy_across_devices(&self, src: &Tensor) -> Result<()> {
        self.check_inplace("copy_")?;
        let src = if src.dtype != self.dtype {
            src.to_dtype(self.dtype)?
        } else {
            src.clone()
        };
        let src = src.broadcast_to(self.shape())?.contiguous()?;
        let w = self.dtype.size_bytes();
        let (bytes, at) = (self.numel() * w, (self.layout.offset * w) as u64);
        let block = &self.storage.block;
        if self.is_contiguous() && self.device().is_cpu() {
            // GPU -> host memory, straight into the destination.
            self.host_ready()?;
            let Some(ptr) = block.host_address()? else {
                return Ok(());
            };
            // SAFETY: the contiguous tensor covers `bytes` bytes of its block from `at`.
            let dst = unsafe { std::slice::from_raw_parts_mut(ptr.add(at as usize), bytes) };
            src.storage
                .block
                .read_into((src.layout.offset * w) as u64, dst)?;
        } else if self.is_contiguous() && at.is_multiple_of(4) && bytes.is_multiple_of(4) {
            // Host -> GPU memory, straight from the source's memory when it is on the host.
            src.with_host_bytes(|data| block.write(at, data))?;
        } else {
            let local = src.to_device(self.device())?;
            return self.copy_(&local);
        }
        self.bump_version();
        Ok(())
    }
}

impl Transfer {
    fn new(
        gpu: &Device,
        seq: u64,
        pinned: Option<Arc<crate::device::pinned::PinnedBuffer>>,
    ) -> Self {
        Transfer {
            event: Event::at(gpu, seq),
            pinned: pinned.map(|b| (gpu.clone(), b)),
        }
    }
}

/// A copy queued on a GPU's side queue (`Tensor::copy_side_`; Note [Side queue] in
/// `device/side_queue.rs`): `wait` for it before touching its memory. One never waited for
/// waits when dropped, so that the pinned block it uses is not handed out while it runs.
pub(crate) struct SideCopy {
    device: Device,
    value: u64,
    /// A copy into GPU memory: the stream's later work is ordered after it.
    into_gpu: bool,
    waited: bool,
}

impl SideCopy {
    pub(crate) fn wait(mut self) -> Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> Result<()> {
        if self.waited {
            return Ok(());
        }
        self.waited = true;
        #[cfg(any(windows, all(unix, not(target_vendor = "apple"))))]
        if let Some((g, side)) = self
            .device
            .gpu()
            .and_then(|g| g.side.as_ref().map(|s| (g, s)))
        {
            let way = if self.into_gpu {
                crate::device::side_queue::Way::ToGpu
            } else {
                crate::device::side_queue::Way::ToHost
            };
            side.wait(way, self.value).map_err(|msg| Error::Wgpu {
                op: "copy queue wait",
                msg,
            })?;
            if self.into_gpu {
                side.order_stream_after(g, self.value);
            }
        }
        Ok(())
    }
}

impl Drop for SideCopy {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

impl Tensor {
    /// A gate on `device`'s side queue: copies after it wait for everything recorded on the
    /// stream so far. `None` where the device has no side queue.
    pub(crate) fn side_gate(device: &Device) -> Option<u64> {
        #[cfg(any(windows, all(unix, not(target_vendor = "apple"))))]
        if let Some(g) = device.gpu() {
            return g.side.as_ref().map(|s| s.gate(g));
        }
        let _ = device;
        None
    }

    /// `copy_non_blocking_(src)` between a GPU tensor and pinned memory of that GPU (`gpu`),
    /// beside the kernels: on the side queue where the GPU has one, after everything recorded
    /// so far (`Some`: the caller waits for it before the copy's memory goes back to an
    /// allocator), else queued on the stream like any non-blocking copy (`None`).
    ///
    /// Into GPU memory, the destination is first cleared on the stream: wgpu zero-fills memory it
    /// has never seen written when a kernel first binds it, and it does not see the side
    /// queue's writes, so without the clear the first kernel to read them would read zeros.
    pub(crate) fn copy_beside_(&self, src: &Tensor, gpu: &Device) -> Result<Option<SideCopy>> {
        if gpu.copies_beside() && src.storage.block.pinned().is_some() {
            self.clear_on_stream()?;
        }
        if let Some(gate) = Tensor::side_gate(gpu) {
            if let Some(copy) = self.copy_side_(src, gate)? {
                return Ok(Some(copy));
            }
        }
        self.copy_non_blocking_(src)?;
        Ok(None)
    }

    /// Zeroes this contiguous GPU tensor's bytes with a clear recorded on the stream (which wgpu
    /// counts as initialising them). Nothing where the range is not whole words.
    fn clear_on_stream(&self) -> Result<()> {
        let (Some(g), Some(buf)) = (self.device().gpu(), self.storage.block.gpu_buffer()) else {
            return Ok(());
        };
        let at =
            self.storage.block.offset() + (self.layout.offset * self.dtype.size_bytes()) as u64;
        let bytes = (self.numel() * self.dtype.size_bytes()) as u64;
        if !self.is_contiguous() || !at.is_multiple_of(4) || !bytes.is_multiple_of(4) || bytes == 0
        {
            return Ok(());
        }
        let mut stream = crate::device::lock(&g.stream);
        stream
            .copy_encoder(&g.device)
            .clear_buffer(buf, at, Some(bytes));
        stream.recorded(&g.queue);
        Ok(())
    }

    /// `copy_non_blocking_(src)` on the GPU's side queue, after `gate` (`side_gate`): between
    /// a contiguous GPU tensor and pinned memory of its GPU that goes that way, same shape and
    /// dtype, word-aligned. `None`, with nothing done, where it cannot be: the caller copies
    /// on the stream instead. The caller keeps both tensors' memory untouched by later work
    /// until it has waited for the copy.
    pub(crate) fn copy_side_(&self, src: &Tensor, gate: u64) -> Result<Option<SideCopy>> {
        #[cfg(any(windows, all(unix, not(target_vendor = "apple"))))]
        {
            use crate::device::side_queue::Way;
            let Some(plan) =
                PinnedCopy::of(self, src).filter(|p| p.bytes > 0 && p.bytes.is_multiple_of(4))
            else {
                return Ok(None);
            };
            let (Some(g), Some(gpu_buf)) = (plan.gpu.gpu(), plan.on_gpu.storage.block.gpu_buffer())
            else {
                return Ok(None);
            };
            let Some(side) = g.side.as_ref() else {
                return Ok(None);
            };
            let (download, bytes) = (plan.download, plan.bytes);
            let pinned: &wgpu::Buffer = &plan.buffer.buffer;
            self.check_inplace("copy_")?;
            if download {
                // Mapped before the copy writes it: wgpu zero-fills a buffer's never-written
                // ranges when it maps them, and it does not see this queue's writes.
                self.storage.block.host_address()?;
            }
            let gpu_block = plan.on_gpu.storage.block.offset();
            let (from, to, way) = match download {
                true => (
                    (gpu_buf, gpu_block + plan.src_at),
                    (pinned, plan.dst_at),
                    Way::ToHost,
                ),
                false => (
                    (pinned, plan.src_at),
                    (gpu_buf, gpu_block + plan.dst_at),
                    Way::ToGpu,
                ),
            };
            let value = side
                .copy(from, to, bytes, gate, way)
                .map_err(|msg| Error::Wgpu {
                    op: "copy_ (copy queue)",
                    msg,
                })?;
            self.bump_version();
            return Ok(Some(SideCopy {
                device: plan.gpu.clone(),
                value,
                into_gpu: !download,
                waited: false,
            }));
        }
        #[allow(unreachable_code)]
        {
            let _ = (src, gate);
            Ok(None)
        }
    }
}
