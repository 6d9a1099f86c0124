//! Memory held ahead of need, given back before an allocation fails: relievers, and requests
//! made speculatively. See Note [Memory pressure].

// Note [Memory pressure]
// ~~~~~~~~~~~~~~~~~~~~~~
// Some of kiln's memory is held ahead of need, where PyTorch holds none: `save_on_cpu`'s
// look-ahead (Note [Offload ahead]) keeps saved tensors until their copies to the host have
// left, and brings tensors back before backward reads them. A program that fits under
// PyTorch must not run out of memory for that. So a device keeps *relievers*: functions that
// free such memory and say whether they freed any.
// - A GPU or planning device with relievers asks its allocator first with `Attempt::Quiet`.
//   Where nothing fits, it runs every reliever with the allocator unlocked (their frees take
//   the lock), then asks `Again`. The out-of-memory error, if it still comes, is recorded
//   once, as PyTorch records it, and the cascade's retry is counted once.
// - Without relievers the request is PyTorch's `malloc`, unchanged.
// - A request made *speculatively* (`speculatively`: a tensor brought back ahead of use) ends
//   `Quiet`, with no reliever run. Its caller does without the memory, and the statistics show
//   no out-of-memory that the program never met.
// A planning device runs the same relievers at the same requests, since its allocator
// fails where the real one would. So a dry run still allocates what the real run does.

use super::{lock, Device};
use crate::alloc::{Attempt, BlockRef, CachingAllocator, SegmentSource};
use crate::{Error, Result};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// Frees memory held ahead of need; true where it freed any.
pub(crate) type Reliever = Arc<dyn Fn() -> bool + Send + Sync>;

/// A device's relievers, by registration.
#[derive(Default)]
pub(crate) struct Relievers {
    next: AtomicU64,
    /// How many are registered: every allocation reads it, and takes the list's lock only
    /// where there are some.
    live: AtomicUsize,
    list: Mutex<Vec<(u64, Reliever)>>,
}

/// Keeps a reliever registered; dropping it removes the reliever.
pub(crate) struct RelieverGuard {
    device: Weak<super::Inner>,
    id: u64,
}

impl Drop for RelieverGuard {
    fn drop(&mut self) {
        if let Some(inner) = self.device.upgrade() {
            let mut list = lock(&inner.relievers.list);
            list.retain(|(id, _)| *id != self.id);
            inner.relievers.live.store(list.len(), Ordering::Relaxed);
        }
    }
}

impl Device {
    /// Registers `f` to run where an allocation on this device would otherwise fail, until
    /// the guard is dropped (Note [Memory pressure]).
    pub(crate) fn add_reliever(&self, f: Reliever) -> RelieverGuard {
        let id = self.0.relievers.next.fetch_add(1, Ordering::Relaxed);
        let mut list = lock(&self.0.relievers.list);
        list.push((id, f));
        self.0.relievers.live.store(list.len(), Ordering::Relaxed);
        RelieverGuard {
            device: Arc::downgrade(&self.0),
            id,
        }
    }

    /// The relievers registered now.
    fn relievers(&self) -> Vec<Reliever> {
        lock(&self.0.relievers.list)
            .iter()
            .map(|(_, f)| f.clone())
            .collect()
    }
}

thread_local! {
    static SPECULATIVE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with this thread's device allocations made speculatively: where nothing fits, the
/// out-of-memory error is returned and recorded nowhere, and no reliever runs.
pub(crate) fn speculatively<R>(f: impl FnOnce() -> R) -> R {
    let outer = SPECULATIVE.with(|s| s.replace(true));
    let r = f();
    SPECULATIVE.with(|s| s.set(outer));
    r
}

/// `alloc`'s `malloc` for `device`, with its relievers run before an out-of-memory error.
pub(super) fn malloc_relieved<S: SegmentSource>(
    device: &Device,
    alloc: &Mutex<CachingAllocator<S>>,
    size: u64,
    stream: u64,
) -> Result<Option<BlockRef<S::Handle>>> {
    if SPECULATIVE.with(|s| s.get()) {
        return lock(alloc).malloc_as(size, stream, Attempt::Quiet);
    }
    if device.0.relievers.live.load(Ordering::Relaxed) == 0 {
        return lock(alloc).malloc(size, stream);
    }
    let first = lock(alloc).malloc_as(size, stream, Attempt::Quiet);
    if !matches!(first, Err(Error::OutOfMemory(_))) {
        return first;
    }
    // Only now, with nothing fitting, the relievers are gathered (not on every allocation).
    for relieve in device.relievers() {
        relieve();
    }
    lock(alloc).malloc_as(size, stream, Attempt::Again)
}
