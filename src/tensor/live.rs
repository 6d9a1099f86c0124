//! The live-tensor registry that `kiln::debug` reports: while tensor tracking is on (the flag
//! lives in the allocator's history, which also records frames then), every new storage is
//! noted with its shape, dtype and the frames it was made under.

use super::{Storage, Tensor};
use crate::alloc::{current_kiln_frames, tensor_tracking, Frames};
use crate::base::DType;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// One tensor made while tracking was on.
pub(crate) struct Tracked {
    pub storage: Weak<Storage>,
    pub shape: Vec<usize>,
    pub dtype: DType,
    pub frames: Frames,
}

static TENSORS: Mutex<Vec<Tracked>> = Mutex::new(Vec::new());

/// The tensors noted so far (some may have died).
pub(crate) fn tracked() -> MutexGuard<'static, Vec<Tracked>> {
    crate::base::lock(&TENSORS)
}

/// Notes a new tensor's storage (called where storages are made).
pub(crate) fn register(t: &Tensor) {
    if !tensor_tracking() {
        return;
    }
    let mut v = tracked();
    if v.len() >= 4096 && v.len().is_power_of_two() {
        v.retain(|e| e.storage.strong_count() > 0);
    }
    v.push(Tracked {
        storage: Arc::downgrade(&t.storage),
        shape: t.shape().to_vec(),
        dtype: t.dtype(),
        frames: current_kiln_frames(),
    });
}
