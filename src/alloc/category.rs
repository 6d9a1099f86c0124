//! What each allocation holds, for the categorised memory timeline (PyTorch's
//! `profiler.export_memory_timeline`). PyTorch infers the categories after the fact from the
//! profiler's data-flow graph; kiln knows them as they happen: modules mark parameters, the
//! optimizers their state, autograd the tensors it saves and the gradients it writes, the data
//! loader its batches, and a block allocated and freed inside one op is a temporary.
//!
//! The allocator keeps each live block's category and writes it into the free's trace entries,
//! so a trace says what every allocation was when it ended; the op and backward scopes below are
//! this thread's, pushed by autograd.

use serde::Serialize;
use std::cell::{Cell, RefCell};

/// PyTorch's categories, in the order of its timeline's columns (`_CATEGORY_TO_INDEX`), with
/// `Unknown` for its `None`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub enum MemoryCategory {
    /// A module's parameter.
    Parameter,
    /// An optimizer's state (momentum buffers, Adam's moments).
    OptimizerState,
    /// A model's input (a batch).
    Input,
    /// Freed within the op or step that made it.
    Temporary,
    /// Saved by autograd for backward.
    Activation,
    /// A parameter's `.grad`.
    Gradient,
    /// Autograd's own bookkeeping between forward and backward.
    AutogradDetail,
    /// Not yet attributed.
    #[default]
    Unknown,
}

impl MemoryCategory {
    /// Every category, in PyTorch's order.
    pub const ALL: [MemoryCategory; 8] = [
        MemoryCategory::Parameter,
        MemoryCategory::OptimizerState,
        MemoryCategory::Input,
        MemoryCategory::Temporary,
        MemoryCategory::Activation,
        MemoryCategory::Gradient,
        MemoryCategory::AutogradDetail,
        MemoryCategory::Unknown,
    ];

    /// Column in PyTorch's timeline JSON, after its leading zero column.
    pub fn index(self) -> usize {
        self as usize
    }

    /// PyTorch's legend label.
    pub fn name(self) -> &'static str {
        match self {
            MemoryCategory::Parameter => "PARAMETER",
            MemoryCategory::OptimizerState => "OPTIMIZER_STATE",
            MemoryCategory::Input => "INPUT",
            MemoryCategory::Temporary => "TEMPORARY",
            MemoryCategory::Activation => "ACTIVATION",
            MemoryCategory::Gradient => "GRADIENT",
            MemoryCategory::AutogradDetail => "AUTOGRAD_DETAIL",
            MemoryCategory::Unknown => "unknown",
        }
    }

    /// Whether a block now counted as `self` becomes `to` when marked so. A block keeps its
    /// first definite role (a parameter saved for backward stays a parameter), except that
    /// autograd's own buffers become gradients or temporaries, and an uploaded tensor that
    /// becomes a parameter, optimizer state or a gradient is that.
    pub fn yields_to(self, to: MemoryCategory) -> bool {
        use MemoryCategory::*;
        self != to
            && match self {
                Unknown => true,
                AutogradDetail => matches!(to, Gradient | Temporary),
                Input => matches!(to, Parameter | OptimizerState | Gradient),
                _ => false,
            }
    }
}

thread_local! {
    /// Ops open on this thread (innermost last), by a number unique on the thread.
    static OPS: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    static NEXT_OP: Cell<u64> = const { Cell::new(1) };
    /// Depth of backward passes running on this thread.
    static BACKWARD: Cell<u32> = const { Cell::new(0) };
}

/// An op running on this thread until dropped.
#[must_use = "the op ends when the guard drops"]
pub struct OpScope {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for OpScope {
    fn drop(&mut self) {
        OPS.with(|o| o.borrow_mut().pop());
    }
}

/// Marks an op as running on this thread (autograd's `record` and each backward node).
pub fn op_scope() -> OpScope {
    let id = NEXT_OP.with(|n| {
        let id = n.get();
        n.set(id + 1);
        id
    });
    OPS.with(|o| o.borrow_mut().push(id));
    OpScope {
        _not_send: std::marker::PhantomData,
    }
}

/// The outermost op running on this thread (0: none): PyTorch's temporaries are allocated and
/// freed inside one top-level op.
pub fn outer_op() -> u64 {
    OPS.try_with(|o| o.borrow().first().copied().unwrap_or(0))
        .unwrap_or(0)
}

/// Whether op `id` is still running on this thread (blocks dropped while the thread's locals
/// are torn down ask too: `try_with`).
pub fn op_is_open(id: u64) -> bool {
    id != 0 && OPS.try_with(|o| o.borrow().contains(&id)).unwrap_or(false)
}

/// A backward pass running on this thread until dropped.
#[must_use = "the pass ends when the guard drops"]
pub struct BackwardScope {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for BackwardScope {
    fn drop(&mut self) {
        BACKWARD.with(|b| b.set(b.get() - 1));
    }
}

/// Marks a backward pass as running on this thread: what it allocates is autograd's.
pub fn backward_scope() -> BackwardScope {
    BACKWARD.with(|b| b.set(b.get() + 1));
    BackwardScope {
        _not_send: std::marker::PhantomData,
    }
}

/// The category a new block starts with on this thread.
pub fn initial_category() -> MemoryCategory {
    if BACKWARD.try_with(|b| b.get()).unwrap_or(0) > 0 {
        MemoryCategory::AutogradDetail
    } else {
        MemoryCategory::Unknown
    }
}
