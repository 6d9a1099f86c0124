//! The user's named scopes (PyTorch's `torch.profiler.record_function`): allocations made inside
//! one carry its name as a frame in memory history and snapshots, next to kiln's op, module and
//! optimizer frames.

use crate::alloc::{push_scope, ScopeGuard};

/// A named scope until dropped (`with record_function("## forward ##"):`). The frame records
/// the caller's file and line.
#[must_use = "the scope ends when the guard drops"]
pub struct RecordFunction {
    _scope: ScopeGuard,
}

impl RecordFunction {
    #[track_caller]
    pub fn new(name: &str) -> RecordFunction {
        let at = std::panic::Location::caller();
        RecordFunction {
            _scope: push_scope(name, at.file(), at.line()),
        }
    }
}

/// Runs `f` inside the scope `name`.
#[track_caller]
pub fn record_function<R>(name: &str, f: impl FnOnce() -> R) -> R {
    let _scope = RecordFunction::new(name);
    f()
}
