//! `Tensor`: a cheap handle (shared storage + layout + dtype). Storage comes from the device's
//! caching allocator, so every tensor shows up in the memory statistics as it would in PyTorch.

mod layout;
pub(crate) mod live;
pub(crate) mod mode;

pub use crate::base::{DType, Element};
pub(crate) use layout::{
    broadcast_shapes, checked_numel, contiguous_strides, dim, dims, numel, storage_bytes,
};
pub use layout::{Layout, MAX_KERNEL_RANK};
pub use mode::{
    enable_grad, inference_mode, is_grad_enabled, is_inference_mode_enabled, no_grad,
    set_grad_enabled, GradModeGuard, InferenceModeGuard,
};

use crate::device::{Device, DeviceBlock};
use crate::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Memory behind one or more tensors (views share it), with the version counter that in-place
/// writes bump.
pub(crate) struct Storage {
    pub block: DeviceBlock,
    /// Shared, as PyTorch's `VariableVersion`: a tensor saved through hooks (offloaded) keeps
    /// the counter, not the memory, and backward still sees in-place writes made before.
    pub version: Arc<AtomicU64>,
    /// Made in inference mode: autograd refuses to save it.
    pub inference: bool,
    /// A leaf that requires grad (a parameter) owns it: its views share the parameter's memory,
    /// which `save_on_cpu` leaves on the device.
    pub leaf_requires_grad: std::sync::atomic::AtomicBool,
}

/// What a tensor carries for autograd, opaque to this layer (see `crate::graph`).
pub(crate) type AutogradSlot = Arc<dyn std::any::Any + Send + Sync>;

/// An n-dimensional array on a device.
#[derive(Clone)]
pub struct Tensor {
    pub(crate) storage: Arc<Storage>,
    pub(crate) layout: Layout,
    pub(crate) dtype: DType,
    /// Present when autograd tracks the tensor (see Note [Autograd graph]): the graph layer's
    /// `AutogradMeta`, which only that layer (above this one) reads back. PyTorch's
    /// `TensorImpl` holds its `AutogradMetaInterface` the same way.
    pub(crate) autograd: Option<AutogradSlot>,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor({:?}, {}, {})",
            self.layout.shape,
            self.dtype,
            self.device().spec()
        )
    }
}

/// The elements' little-endian bytes, padded to whole 4-byte words (what a GPU copy moves).
fn encode<T: Element>(data: &[T]) -> Vec<u8> {
    let n = data.len() * T::DTYPE.size_bytes();
    let mut bytes = Vec::with_capacity(n.next_multiple_of(4));
    if cfg!(target_endian = "little") && std::mem::size_of::<T>() == T::DTYPE.size_bytes() {
        // SAFETY: every `Element` (f32, f64, i32, u32, f16, bool) is plain data whose in-memory
        // form on a little-endian machine is its little-endian encoding (bool: one byte, 0/1).
        bytes.extend_from_slice(unsafe { std::slice::from_raw_parts(data.as_ptr().cast(), n) });
    } else {
        for &x in data {
            x.write_le(&mut bytes);
        }
    }
    bytes.resize(n.next_multiple_of(4), 0);
    bytes
}

impl Tensor {
    /// A fresh contiguous tensor with uninitialised contents (PyTorch's `empty`).
    pub fn empty(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        device.check_dtype("empty", dtype)?;
        let bytes = storage_bytes("empty", shape, dtype)?;
        let t = Tensor::on_block(device.allocate(bytes)?, shape, dtype);
        live::register(&t);
        Ok(t)
    }

    /// `empty` in memory another driver can import: a block of the allocator's
    /// `EXTERNAL_STREAM`, in segments of its own (NCCL's buffers; Note [Exported memory]).
    /// Where the device has no such memory, an ordinary block of that stream.
    pub(crate) fn empty_external(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        device.check_dtype("empty", dtype)?;
        let bytes = storage_bytes("empty", shape, dtype)?;
        let block =
            crate::device::DeviceBlock::allocate_on(device, bytes, crate::alloc::EXTERNAL_STREAM)?;
        let t = Tensor::on_block(block, shape, dtype);
        live::register(&t);
        Ok(t)
    }

    /// A fresh contiguous tensor over `block` (its storage's first and only tensor).
    pub(crate) fn on_block(block: DeviceBlock, shape: &[usize], dtype: DType) -> Tensor {
        Tensor {
            storage: Arc::new(Storage {
                block,
                version: Arc::new(AtomicU64::new(0)),
                leaf_requires_grad: std::sync::atomic::AtomicBool::new(false),
                inference: mode::is_inference_mode_enabled(),
            }),
            layout: Layout::contiguous(shape),
            dtype,
            autograd: None,
        }
    }

    /// A tensor holding `data` (row-major) with `shape`.
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize], device: &Device) -> Result<Tensor> {
        storage_bytes("from_slice", shape, T::DTYPE)?;
        if data.len() != numel(shape) {
            return Err(Error::ShapeMismatch {
                op: "from_slice",
                lhs: vec![data.len()],
                rhs: shape.to_vec(),
            });
        }
        let t = Tensor::empty(shape, T::DTYPE, device)?;
        t.storage.block.write(0, &encode(data))?;
        Ok(t)
    }

    /// A tensor from little-endian element bytes (safetensors and other files).
    pub fn from_le_bytes(
        bytes: &[u8],
        shape: &[usize],
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        storage_bytes("from_le_bytes", shape, dtype)?;
        if bytes.len() != numel(shape) * dtype.size_bytes() {
            return Err(Error::InvalidArgument {
                op: "from_le_bytes",
                msg: format!(
                    "{} bytes for shape {shape:?} of {dtype} ({} expected)",
                    bytes.len(),
                    numel(shape) * dtype.size_bytes()
                ),
            });
        }
        let t = Tensor::empty(shape, dtype, device)?;
        let mut padded = bytes.to_vec();
        padded.resize(padded.len().next_multiple_of(4), 0);
        t.storage.block.write(0, &padded)?;
        Ok(t)
    }

    /// A tensor of `shape` on `device` holding `data` (as `from_slice`).
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize], device: &Device) -> Result<Tensor> {
        Self::from_slice(&data, shape, device)
    }

    /// A tensor of `shape` filled with `value` (converted to `dtype`).
    pub fn full(shape: &[usize], value: f64, dtype: DType, device: &Device) -> Result<Tensor> {
        if dtype == DType::F64 {
            storage_bytes("full", shape, dtype)?;
            return Self::from_f64_slice(&vec![value; numel(shape)], shape, dtype, device);
        }
        let t = Tensor::empty(shape, dtype, device)?;
        t.storage.block.fill_u32(fill_word(value, dtype))?;
        Ok(t)
    }

    /// `torch.zeros`.
    pub fn zeros(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Self::full(shape, 0.0, dtype, device)
    }

    /// `torch.ones`.
    pub fn ones(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Self::full(shape, 1.0, dtype, device)
    }

    /// `torch.zeros_like`.
    pub fn zeros_like(&self) -> Result<Tensor> {
        Self::zeros(self.shape(), self.dtype, self.device())
    }

    /// `torch.ones_like`.
    pub fn ones_like(&self) -> Result<Tensor> {
        Self::ones(self.shape(), self.dtype, self.device())
    }

    /// `torch.full_like`.
    pub fn full_like(&self, value: f64) -> Result<Tensor> {
        Self::full(self.shape(), value, self.dtype, self.device())
    }

    /// `start, start + step, ...` below `end` (PyTorch's `arange`).
    pub fn arange(
        start: f64,
        end: f64,
        step: f64,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        if step == 0.0 || !((end - start) / step).is_finite() {
            return Err(Error::InvalidArgument {
                op: "arange",
                msg: format!("step {step} for [{start}, {end})"),
            });
        }
        let n = ((end - start) / step).ceil().max(0.0) as usize;
        let values: Vec<f64> = (0..n).map(|i| start + i as f64 * step).collect();
        Self::from_f64_slice(&values, &[n], dtype, device)
    }

    /// A tensor of any dtype from f64 values (rounded or converted as `as` does).
    pub fn from_f64_slice(
        values: &[f64],
        shape: &[usize],
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        match dtype {
            DType::F32 => Self::from_slice(
                &values.iter().map(|&v| v as f32).collect::<Vec<_>>(),
                shape,
                device,
            ),
            DType::F64 => Self::from_slice(values, shape, device),
            DType::F16 => Self::from_slice(
                &values
                    .iter()
                    .map(|&v| half::f16::from_f64(v))
                    .collect::<Vec<_>>(),
                shape,
                device,
            ),
            DType::I32 => Self::from_slice(
                &values.iter().map(|&v| v as i32).collect::<Vec<_>>(),
                shape,
                device,
            ),
            DType::U32 => Self::from_slice(
                &values.iter().map(|&v| v as u32).collect::<Vec<_>>(),
                shape,
                device,
            ),
            DType::Bool => Self::from_slice(
                &values.iter().map(|&v| v != 0.0).collect::<Vec<_>>(),
                shape,
                device,
            ),
        }
    }

    /// The size of each dim.
    pub fn shape(&self) -> &[usize] {
        &self.layout.shape
    }
    /// Strides in elements (not bytes).
    pub fn strides(&self) -> &[usize] {
        &self.layout.strides
    }
    /// Shape, strides and offset.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    /// The number of dims.
    pub fn rank(&self) -> usize {
        self.layout.rank()
    }
    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.layout.numel()
    }
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// The device the storage lives on.
    pub fn device(&self) -> &Device {
        self.storage.block.device()
    }
    /// Whether the elements are laid out row-major without gaps (views may not be).
    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }
    /// The version counter shared by all views of this storage; every in-place write bumps it.
    pub fn version(&self) -> u64 {
        self.storage.version.load(Ordering::Acquire)
    }
    pub(crate) fn bump_version(&self) {
        self.storage.version.fetch_add(1, Ordering::AcqRel);
    }
    /// The version counter itself, which outlives the memory of a tensor saved through hooks.
    pub(crate) fn version_counter(&self) -> Arc<AtomicU64> {
        self.storage.version.clone()
    }
    /// Whether two tensors share storage.
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    /// A tensor brought from the host to a GPU is an input (the memory timeline's category)
    /// until it becomes something more definite (a parameter).
    pub(crate) fn mark_upload(&self) {
        if !self.device().is_cpu() {
            self.storage
                .block
                .set_category(crate::alloc::MemoryCategory::Input);
        }
    }

    /// Marks what this tensor's memory holds, for the categorised memory timeline.
    pub(crate) fn mark(&self, category: crate::alloc::MemoryCategory) {
        self.storage.block.set_category(category);
    }
}

/// The 32-bit word that repeats `value` of `dtype` across a fill.
fn fill_word(value: f64, dtype: DType) -> u32 {
    match dtype {
        DType::F32 => (value as f32).to_bits(),
        DType::I32 => value as i32 as u32,
        DType::U32 => value as u32,
        DType::F16 => {
            let h = half::f16::from_f64(value).to_bits() as u32;
            h | (h << 16)
        }
        DType::Bool => {
            let b = (value != 0.0) as u32;
            b * 0x0101_0101
        }
        DType::F64 => unreachable!("f64 fills are written element by element"),
    }
}
