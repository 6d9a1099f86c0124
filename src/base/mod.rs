//! The vocabulary every layer shares, at the bottom of the stack: the error type, dtypes, the op
//! descriptors (elementwise, comparison and convolution ops with their WGSL and CPU formulas side
//! by side, which the CPU device, the kernels and the ops all read), and the allocator's OOM
//! report with its size formatting. It uses nothing else in kiln; see ARCHITECTURE.md.
//!
//! # What is here
//!
//! - `error.rs`: the one `thiserror` enum; every public op returns `kiln::Result`.
//! - `dtype.rs`: `DType` and `Element`.
//! - The op descriptors, their WGSL and CPU formulas side by side, read by the CPU device, the
//!   kernels and the ops: `elementwise.rs` (`UnaryOp`, `BinaryOp`), `compare.rs` (`CmpOp`),
//!   `conv.rs` (`Conv2dParams`).
//! - `oom.rs`, `format.rs`: the allocator's out-of-memory report and `format_size` (here because
//!   the error type carries the report).
//! - `fs.rs`: atomic file writes (a temporary file beside the target, flushed, renamed over it);
//!   every file kiln writes goes through it.
//!
//! Each type is re-exported where users look for it (`kiln::tensor::DType`,
//! `kiln::ops::BinaryOp`, `kiln::alloc::OutOfMemory`).

mod compare;
mod conv;
mod dtype;
mod elementwise;
mod error;
mod format;
mod fs;
mod oom;

pub use compare::CmpOp;
pub use conv::Conv2dParams;
pub(crate) use dtype::expect_dtype;
pub use dtype::{DType, Element};
pub use elementwise::{BinaryOp, UnaryOp};
pub use error::{Error, Result};
pub use format::{format_size, parse_size};
pub(crate) use fs::{io_error, write_atomic, write_atomic_with};
pub use oom::OutOfMemory;

/// Locks a mutex, recovering the data if a panicking thread poisoned it: kiln's shared state
/// (allocators, caches, registries) is updated under one lock by code that does not panic, so
/// it stays consistent.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
