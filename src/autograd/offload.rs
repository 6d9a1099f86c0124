//! `save_on_cpu` (PyTorch's `torch.autograd.graph.save_on_cpu`): the tensors autograd saves in
//! forward go to host memory and come back for the backward that reads them, so the device
//! holds parameters, gradients and what is in flight rather than every activation.
//!
//! kiln's copies are stream-ordered, so neither direction waits for the device: the copy to
//! pinned memory is queued behind the kernel that wrote the tensor (whose memory the allocator
//! may hand out again at once: later kernels are queued behind the copy), and the copy back is
//! queued behind it in turn. Neither the host nor the device stalls on an offload; the copies
//! take their time on the device's timeline. PyTorch's `save_on_cpu(pin_memory=True)` copies
//! with `non_blocking` too, but its unpack hook makes a pageable tensor pinned first.

use crate::device::{planned_pin, planned_staging, PlannedPin};
use crate::graph::{saved_tensors_hooks, Packed, SavedTensorsHooks};
use crate::host::PinnedKind;
use crate::tensor::{DType, Tensor};
use crate::{Device, Result};
use std::sync::atomic::Ordering;

/// What `save_on_cpu`'s pack hook keeps of a saved tensor.
enum Offloaded {
    /// A parameter (the memory of a leaf that requires grad, or a view of it, as `w.t()` in a
    /// linear layer) or a tensor already on the host: kept as it is.
    /// A parameter's memory stays on the device with its module whatever autograd keeps, so
    /// copying it out would cost the copies and free nothing (PyTorch copies it all the same).
    Kept(Tensor),
    /// The tensor's values in host memory (pinned where asked), and the device it came from.
    Host(Tensor, Device),
    /// On a planning device (a dry run), where nothing is copied: the shape and dtype, and the
    /// block of the planning device's pinned pool the copy would take (`pin_memory`), so that
    /// `host_memory_stats` counts it as the real run does.
    Planned {
        shape: Vec<usize>,
        dtype: DType,
        device: Device,
        /// Held for its drop, which frees the block.
        _pin: Option<PlannedPin>,
        /// Whether the copy went to pinned memory (else its way back takes staging chunks).
        pinned: bool,
    },
}

/// `torch.autograd.graph.save_on_cpu(pin_memory)`: while the guard lives, every tensor autograd
/// saves on this thread is copied to host memory (pinned with `pin_memory`, through
/// non-blocking copies) and copied back when backward reads it. Gradients are the same as
/// without it; the device's peak loses the saved activations, and `host_memory_stats` shows
/// the pinned bytes.
///
/// ```
/// use kiln::{DType, Device, Tensor};
/// # fn main() -> kiln::Result<()> {
/// let dev = Device::best()?;
/// let w = Tensor::randn(&[64, 64], DType::F32, &dev)?.requires_grad_(true)?;
/// let x = Tensor::randn(&[32, 64], DType::F32, &dev)?;
/// let loss = {
///     let _offload = kiln::autograd::save_on_cpu(true);
///     x.matmul(&w)?.relu()?.sum_all()?
/// };
/// loss.backward()?;
/// assert_eq!(w.grad().unwrap().shape(), [64, 64]);
/// # Ok(())
/// # }
/// ```
pub fn save_on_cpu(pin_memory: bool) -> SavedTensorsHooks {
    saved_tensors_hooks(move |t| pack(t, pin_memory), unpack)
}

fn pack(t: &Tensor, pin_memory: bool) -> Result<Packed> {
    let device = t.device().clone();
    let parameter = t.storage.leaf_requires_grad.load(Ordering::Relaxed);
    if device.is_cpu() || parameter {
        return Ok(Box::new(Offloaded::Kept(t.detach())));
    }
    let src = t.detach().contiguous()?;
    if device.is_dry_run() {
        // What `Tensor::empty_pinned` takes below, or without `pin_memory` the staging
        // chunks of the copy to pageable memory.
        let bytes = crate::tensor::storage_bytes("save_on_cpu", t.shape(), t.dtype())?;
        let pin = match pin_memory {
            true => planned_pin(&device, bytes, PinnedKind::Download)?,
            false => {
                planned_staging(&device, bytes.next_multiple_of(4), PinnedKind::Download)?;
                None
            }
        };
        return Ok(Box::new(Offloaded::Planned {
            shape: t.shape().to_vec(),
            dtype: t.dtype(),
            device,
            _pin: pin,
            pinned: pin_memory,
        }));
    }
    let host = match pin_memory {
        true => {
            let host = Tensor::empty_pinned(t.shape(), t.dtype(), &device, PinnedKind::Download)?;
            host.copy_non_blocking_(&src)?;
            host
        }
        false => src.to_device(&Device::cpu()?)?,
    };
    Ok(Box::new(Offloaded::Host(host, device)))
}

fn unpack(packed: &Packed) -> Result<Tensor> {
    let Some(offloaded) = packed.downcast_ref::<Offloaded>() else {
        return Err(crate::Error::Autograd {
            op: "save_on_cpu",
            msg: "a saved value that save_on_cpu did not pack".into(),
        });
    };
    let back = match offloaded {
        Offloaded::Kept(t) => return Ok(t.clone()),
        Offloaded::Host(host, device) => host.to_device_non_blocking(device)?,
        Offloaded::Planned {
            shape,
            dtype,
            device,
            pinned,
            ..
        } => {
            let back = Tensor::empty(shape, *dtype, device)?;
            if !pinned {
                // The real run's upload from pageable memory: staging chunks of its bytes.
                let bytes = (back.numel() * dtype.size_bytes()) as u64;
                planned_staging(device, bytes, PinnedKind::Upload)?;
            }
            back
        }
    };
    back.storage
        .block
        .set_category(crate::alloc::MemoryCategory::Activation);
    Ok(back)
}
