//! `save_on_cpu` (PyTorch's `torch.autograd.graph.save_on_cpu`): the tensors autograd saves in
//! forward go to host memory and come back for the backward that reads them, so the device
//! holds parameters, gradients and what is in flight rather than every activation.
//! See Note [Offload ahead].

// Note [Offload ahead]
// ~~~~~~~~~~~~~~~~~~~~
// With `pin_memory`, every copy is non-blocking, and where the GPU has a side queue (Note
// [Side queue]) the copies run on its copy engines beside the kernels. A guard has a
// look-ahead in bytes of device memory (`save_on_cpu_ahead`; `save_on_cpu` takes
// `DEFAULT_AHEAD` where the copies run beside the kernels, 0 elsewhere):
// - forward: the copy of a saved tensor to pinned memory is queued as the op saves it. The
//   tensor's device memory must outlive the copy, so the guard keeps the tensors whose copies
//   may still be reading them, oldest first, up to the look-ahead (at least the newest); the
//   oldest beyond it is *retired*: the host waits for its copy, and its memory goes back to
//   the allocator. The host, and so the kernels, run up to the look-ahead ahead of the copy
//   engine.
// - backward: each unpack also brings back, in reverse order of packing (the order backward
//   reads them), the tensors not read yet, while they fit in the look-ahead with those back
//   before their unpack (a tensor larger than that comes back when read, on the stream).
//   Their copies wait for the kernels recorded before (the memory may have been another
//   tensor's) and run during the kernels between; the unpack that reads one waits for its
//   copy on the host and orders the stream after it.
// The host waits, rather than device-side waits only, keep the reasoning simple: once a copy
// is known done on the host, nothing recorded later can race it (a semaphore wait in a batch
// without commands does not order what a later batch's gate signals).
// On the stream, the same look-ahead keeps and brings back the same tensors at the same points
// (the copies are ordered with the kernels, so nothing waits): where a dry run lets the copies
// run ahead as its target does (`PlanTarget::copy_queue`), it allocates exactly as the real
// run, on any adapter. What overlap costs is memory: up to the look-ahead of leaving tensors
// at the end of forward, and as much brought back early in backward.
// Memory held ahead must never cost a program that fits under PyTorch an out-of-memory error
// (Note [Memory pressure]). Where an allocation on a device would fail, the guard's reliever
// retires every leaving tensor and drops those brought back early; from then on it looks no
// bytes ahead. Its own requests in an unpack do the same (the reliever cannot lock the ledger
// then), and it brings tensors back early speculatively: a request that does not fit ends the
// walk and leaves no out-of-memory in the statistics.
// Without `pin_memory` the copies are blocking, through the pinned pool's staging chunks, as
// PyTorch's are, and nothing is kept or brought back early.

use crate::device::{planned_pin, planned_staging, PlannedPin, Reliever, RelieverGuard};
use crate::graph::{saved_tensors_hooks, Packed, SavedTensorsHooks};
use crate::host::PinnedKind;
use crate::ops::SideCopy;
use crate::tensor::{DType, Tensor};
use crate::{Device, Result};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// How far copies may run ahead of the kernels by default where they run beside them, in bytes
/// of device memory, each way (Note [Offload ahead]): about 5 ms of PCIe 5 copies. On the
/// H200, GPT-2 124M b8 T1024 AMP under `save_on_cpu(true)`: 275-288 ms a step with 64 MiB,
/// 241-243 with 256 (2026-11-29, BENCHMARKS.md).
pub const DEFAULT_AHEAD: u64 = 256 << 20;

/// `save_on_cpu`'s look-ahead on `device`: `DEFAULT_AHEAD` where its copies run beside the
/// kernels (or a dry run's target's do), else none: on the stream they would gain nothing.
fn default_ahead(device: &Device) -> u64 {
    match device.copies_beside() {
        true => DEFAULT_AHEAD,
        false => 0,
    }
}

/// What `save_on_cpu`'s pack hook keeps of a saved tensor.
enum Offloaded {
    /// A parameter (the memory of a leaf that requires grad, or a view of it, as `w.t()` in a
    /// linear layer) or a tensor already on the host: kept as it is.
    /// A parameter's memory stays on the device with its module whatever autograd keeps, so
    /// copying it out would cost the copies and free nothing (PyTorch copies it all the same).
    Kept(Tensor),
    /// Without `pin_memory`: the values in pageable host memory, and the device they came
    /// from.
    Pageable(Tensor, Device),
    /// Without `pin_memory`, on a planning device (a dry run), where nothing is copied: the
    /// shape and dtype (the way back takes staging chunks).
    PlannedPageable {
        shape: Vec<usize>,
        dtype: DType,
        device: Device,
    },
    /// With `pin_memory`: a slot of the guard's ledger.
    Pinned(Entry),
}

/// The host side of a pinned slot.
enum Host {
    /// The values in pinned memory.
    Pinned(Tensor),
    /// On a planning device: the block of its pinned pool the copy would take, held for its
    /// drop, which frees the block.
    Planned { _pin: Option<PlannedPin> },
}

/// A device tensor with the copy that reads (forward) or writes (backward) it beside the
/// kernels, if it went to the side queue.
struct InFlight {
    tensor: Tensor,
    copy: Option<SideCopy>,
}

/// One packed tensor of a guard.
struct Slot {
    host: Host,
    shape: Vec<usize>,
    dtype: DType,
    device: Device,
    bytes: u64,
    /// The guard's look-ahead on the slot's device, in bytes.
    ahead: u64,
    /// Forward: the device tensor its copy to the host may still read (not retired yet).
    leaving: Option<InFlight>,
    /// Backward: the device tensor brought back ahead of its unpack.
    back: Option<InFlight>,
    /// Unpacked at least once: never brought back ahead again.
    read: bool,
}

/// The slots of one `save_on_cpu(pin_memory=True)` guard, in order of packing, shared by its
/// pack hook and every tensor it packed.
struct Ledger {
    /// The look-ahead asked for (`save_on_cpu_ahead`); `None`: each device's default. 0 once
    /// memory ran short (`release`).
    ahead: Option<u64>,
    /// The index of `slots[0]`.
    first: u64,
    /// `None`: the packed tensor is gone.
    slots: VecDeque<Option<Slot>>,
    /// Bytes of slots still `leaving`.
    leaving: u64,
    /// Bytes of slots brought `back` ahead of their unpack.
    back: u64,
    /// The reliever registered on each device the guard holds memory ahead on (Note [Memory
    /// pressure]).
    relievers: Vec<(Device, RelieverGuard)>,
}

/// A packed tensor: its slot in the guard's ledger.
struct Entry {
    ledger: Arc<Mutex<Ledger>>,
    index: u64,
}

/// `torch.autograd.graph.save_on_cpu(pin_memory)`: while the guard lives, every tensor autograd
/// saves on this thread is copied to host memory (pinned with `pin_memory`, through
/// non-blocking copies) and copied back when backward reads it. Gradients are the same as
/// without it; the device's peak loses the saved activations, and `host_memory_stats` shows
/// the pinned bytes. Where the GPU copies beside its kernels (`Device::copies_beside`:
/// `KILN_COPY_QUEUE=transfer`), pinned copies overlap the kernels within `DEFAULT_AHEAD` bytes
/// each way, and backward brings tensors back before it reads them (`save_on_cpu_ahead`).
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
    hooks(pin_memory, None)
}

/// `save_on_cpu(pin_memory)` with copies running up to `ahead` bytes of device memory ahead of
/// the kernels each way, on every device (Note [Offload ahead]): in forward, saved tensors
/// whose copies to the host may still be running keep their device memory until more than
/// `ahead` bytes wait behind them; in backward, the tensors backward will read next are
/// brought back up to `ahead` bytes before it reads them. `save_on_cpu` takes
/// `DEFAULT_AHEAD` where the GPU copies beside its kernels (`Device::copies_beside`) and 0
/// elsewhere; 0 is PyTorch's behaviour. Without `pin_memory`, `ahead` is not used.
pub fn save_on_cpu_ahead(pin_memory: bool, ahead: u64) -> SavedTensorsHooks {
    hooks(pin_memory, Some(ahead))
}

fn hooks(pin_memory: bool, ahead: Option<u64>) -> SavedTensorsHooks {
    let ledger = Arc::new(Mutex::new(Ledger {
        ahead,
        first: 0,
        slots: VecDeque::new(),
        leaving: 0,
        back: 0,
        relievers: Vec::new(),
    }));
    saved_tensors_hooks(move |t| pack(t, pin_memory, &ledger), unpack)
}

/// The reliever of `ledger`'s memory held ahead of need: its `release`, unless the ledger is
/// busy (locked by the allocating thread itself, inside a pack or an unpack, or by another).
fn reliever(ledger: &Arc<Mutex<Ledger>>) -> Reliever {
    let weak = Arc::downgrade(ledger);
    Arc::new(move || {
        let Some(ledger) = weak.upgrade() else {
            return false;
        };
        let Ok(mut l) = ledger.try_lock() else {
            return false;
        };
        l.release().unwrap_or(false)
    })
}

fn lock(ledger: &Mutex<Ledger>) -> std::sync::MutexGuard<'_, Ledger> {
    ledger.lock().unwrap_or_else(|e| e.into_inner())
}

fn pack(t: &Tensor, pin_memory: bool, ledger: &Arc<Mutex<Ledger>>) -> Result<Packed> {
    let device = t.device().clone();
    let parameter = t.storage.leaf_requires_grad.load(Ordering::Relaxed);
    if device.is_cpu() || parameter {
        return Ok(Box::new(Offloaded::Kept(t.detach())));
    }
    let src = t.detach().contiguous()?;
    let bytes = crate::tensor::storage_bytes("save_on_cpu", t.shape(), t.dtype())?;
    if !pin_memory {
        return pack_pageable(t, &src, device, bytes);
    }
    let (host, copy) = match device.is_dry_run() {
        // What `Tensor::empty_pinned` takes below.
        true => (
            Host::Planned {
                _pin: planned_pin(&device, bytes, PinnedKind::Download)?,
            },
            None,
        ),
        false => {
            let host = Tensor::empty_pinned(t.shape(), t.dtype(), &device, PinnedKind::Download)?;
            let copy = host.copy_beside_(&src, &device)?;
            (Host::Pinned(host), copy)
        }
    };
    let mut l = lock(ledger);
    let index = l.first + l.slots.len() as u64;
    let ahead = l.ahead.unwrap_or_else(|| default_ahead(&device));
    if ahead > 0 && !l.relievers.iter().any(|(d, _)| *d == device) {
        let guard = device.add_reliever(reliever(ledger));
        l.relievers.push((device.clone(), guard));
    }
    l.slots.push_back(Some(Slot {
        host,
        shape: t.shape().to_vec(),
        dtype: t.dtype(),
        device,
        bytes,
        ahead,
        leaving: Some(InFlight { tensor: src, copy }),
        back: None,
        read: false,
    }));
    l.leaving += bytes;
    l.retire_beyond(ahead)?;
    drop(l);
    Ok(Box::new(Offloaded::Pinned(Entry {
        ledger: ledger.clone(),
        index,
    })))
}

/// Without `pin_memory`: a blocking copy to pageable memory, or on a planning device the
/// staging chunks it would take.
fn pack_pageable(t: &Tensor, src: &Tensor, device: Device, bytes: u64) -> Result<Packed> {
    if device.is_dry_run() {
        planned_staging(&device, bytes.next_multiple_of(4), PinnedKind::Download)?;
        return Ok(Box::new(Offloaded::PlannedPageable {
            shape: t.shape().to_vec(),
            dtype: t.dtype(),
            device,
        }));
    }
    let host = src.to_device(&Device::cpu()?)?;
    Ok(Box::new(Offloaded::Pageable(host, device)))
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
        Offloaded::Pageable(host, device) => host.to_device_non_blocking(device)?,
        Offloaded::PlannedPageable {
            shape,
            dtype,
            device,
        } => {
            let back = Tensor::empty(shape, *dtype, device)?;
            // The real run's upload from pageable memory: staging chunks of its bytes.
            let bytes = (back.numel() * dtype.size_bytes()) as u64;
            planned_staging(device, bytes, PinnedKind::Upload)?;
            back
        }
        Offloaded::Pinned(entry) => lock(&entry.ledger).unpack(entry.index)?,
    };
    back.storage
        .block
        .set_category(crate::alloc::MemoryCategory::Activation);
    Ok(back)
}

/// The device tensor of a copy beside the kernels, once the copy is done (the host waits for
/// it, and the stream's next work is ordered after a copy into the GPU): its memory and the
/// pinned memory may then be reused.
fn settle(flight: InFlight) -> Result<Tensor> {
    if let Some(copy) = flight.copy {
        copy.wait()?;
    }
    Ok(flight.tensor)
}

/// A new device tensor with the slot's values: copied beside the kernels (`beside`, where the
/// GPU has a side queue) or on the stream; on a planning device, only allocated.
fn bring_back(slot: &Slot, beside: bool) -> Result<InFlight> {
    let tensor = Tensor::empty(&slot.shape, slot.dtype, &slot.device)?;
    tensor
        .storage
        .block
        .set_category(crate::alloc::MemoryCategory::Activation);
    let copy = match (&slot.host, beside) {
        (Host::Pinned(host), true) => tensor.copy_beside_(host, &slot.device)?,
        (Host::Pinned(host), false) => {
            tensor.copy_non_blocking_(host)?;
            None
        }
        (Host::Planned { .. }, _) => None,
    };
    Ok(InFlight { tensor, copy })
}

impl Ledger {
    fn position(&self, index: u64) -> Option<usize> {
        let at = usize::try_from(index.checked_sub(self.first)?).ok()?;
        (at < self.slots.len()).then_some(at)
    }

    /// Ends slot `at`'s copy to the host: the host waits for it, the device tensor goes.
    fn retire(&mut self, at: usize) -> Result<()> {
        let Some(slot) = self.slots[at].as_mut() else {
            return Ok(());
        };
        if let Some(flight) = slot.leaving.take() {
            self.leaving -= slot.bytes;
            settle(flight)?;
        }
        Ok(())
    }

    /// Retires the oldest leaving slots while more than `ahead` bytes are leaving.
    fn retire_beyond(&mut self, ahead: u64) -> Result<()> {
        let mut at = 0;
        while self.leaving > ahead && at < self.slots.len() {
            self.retire(at)?;
            at += 1;
        }
        Ok(())
    }

    /// Backward reads slot `index`: its device tensor, brought back ahead or now, and the
    /// slots packed before it brought back ahead (Note [Offload ahead]).
    fn unpack(&mut self, index: u64) -> Result<Tensor> {
        let Some(at) = self.position(index).filter(|&at| self.slots[at].is_some()) else {
            return Err(crate::Error::Autograd {
                op: "save_on_cpu",
                msg: "a saved tensor whose offloaded copy is gone".into(),
            });
        };
        self.retire(at)?;
        let slot = self.slots[at].as_mut().expect("checked above");
        slot.read = true;
        let (ahead, early) = (slot.ahead, slot.back.take());
        let tensor = match early {
            Some(flight) => {
                self.back -= slot.bytes;
                settle(flight)?
            }
            None => self.bring_back_now(at)?,
        };
        self.bring_back_ahead(at, ahead)?;
        Ok(tensor)
    }

    /// Slot `at` brought back for its unpack. Where the guard holds memory ahead of need, the
    /// first request is speculative; if nothing fits, the guard releases what it holds and
    /// asks again (its reliever cannot run while the ledger is locked here).
    fn bring_back_now(&mut self, at: usize) -> Result<Tensor> {
        let slot = self.slots[at].as_ref().expect("a live slot");
        if self.leaving == 0 && self.back == 0 {
            return Ok(bring_back(slot, false)?.tensor);
        }
        match crate::device::speculatively(|| bring_back(slot, false)) {
            Err(crate::Error::OutOfMemory(_)) => {}
            other => return Ok(other?.tensor),
        }
        self.release()?;
        let slot = self.slots[at].as_ref().expect("a live slot");
        Ok(bring_back(slot, false)?.tensor)
    }

    /// Frees what the guard holds ahead of need (Note [Memory pressure]): the device tensors
    /// whose copies to the host may still run (the host waits for them) and those brought
    /// back before their unpack (they come back again when read). From then on the guard,
    /// and each slot it packed, looks no bytes ahead. True where it freed any.
    fn release(&mut self) -> Result<bool> {
        let held = self.leaving + self.back > 0;
        self.ahead = Some(0);
        for at in 0..self.slots.len() {
            self.retire(at)?;
            let Some(slot) = self.slots[at].as_mut() else {
                continue;
            };
            slot.ahead = 0;
            if let Some(flight) = slot.back.take() {
                self.back -= slot.bytes;
                drop(settle(flight)?);
            }
        }
        Ok(held)
    }

    /// Brings back the slots before `at` not read yet, latest first, while each fits in `ahead`
    /// with those already back ahead of their unpack (one that does not ends the walk: it comes
    /// back when read). Each is a speculative request: running out of memory only ends the walk
    /// (the tensors come back when read instead), and no out-of-memory is recorded.
    fn bring_back_ahead(&mut self, mut at: usize, ahead: u64) -> Result<()> {
        while self.back < ahead && at > 0 {
            at -= 1;
            let Some(slot) = self.slots[at].as_ref() else {
                continue;
            };
            if slot.read || slot.back.is_some() {
                continue;
            }
            if self.back + slot.bytes > ahead {
                // Too large to come back early without passing the look-ahead: it comes
                // back when read, and the tensors before it wait for it.
                break;
            }
            self.retire(at)?;
            let slot = self.slots[at].as_mut().expect("checked above");
            match crate::device::speculatively(|| bring_back(slot, true)) {
                Ok(flight) => slot.back = Some(flight),
                Err(crate::Error::OutOfMemory(_)) => return Ok(()),
                Err(e) => return Err(e),
            }
            self.back += slot.bytes;
        }
        Ok(())
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        let mut l = lock(&self.ledger);
        let Some(slot) = l.position(self.index).and_then(|at| l.slots[at].take()) else {
            return;
        };
        // The stream waits for copies still running before their memory is reused; an error
        // here (a lost device) has nowhere to go and leaves nothing to protect.
        if let Some(flight) = slot.leaving {
            l.leaving -= slot.bytes;
            let _ = settle(flight);
        }
        if let Some(flight) = slot.back {
            l.back -= slot.bytes;
            let _ = settle(flight);
        }
        while l.slots.front().is_some_and(Option::is_none) {
            l.slots.pop_front();
            l.first += 1;
        }
    }
}
