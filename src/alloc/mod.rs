//! The caching allocator: PyTorch's CUDA caching allocator policy, statistics, summary,
//! snapshots and history, over a pluggable `SegmentSource`. Nothing here knows wgpu.
//!
//! # What is here
//!
//! - `caching/`: the policy. malloc and free in `mod.rs`, release and garbage collection in
//!   `release.rs`, the out-of-memory error in `oom.rs`, history, trace entries and block
//!   categories in `trace.rs`, invariant checks in `invariants.rs`, and expandable segments in
//!   `expandable.rs` (reserved ranges whose pages are mapped and unmapped through the source's
//!   `reserve`/`map`/`unmap`).
//! - `config.rs` (`KILN_ALLOC_CONF`), `stats.rs` (the 122 keys), `summary.rs`
//!   (`memory_summary`), `snapshot.rs` and its pickle encoder `pickle.rs`.
//! - `history.rs`: history and scopes, with the tensor-tracking flag that `debug` sets and
//!   `tensor` reads; `category.rs`: memory categories and this thread's op and backward scopes
//!   (each allocated block's category, written into its free's trace entry).
//! - `vaspace.rs`: the virtual addresses CUDA's driver would give segments; `replay.rs`: replaying
//!   PyTorch's recorded traces.
//! - `source.rs`: `SegmentSource`, the three-method seam to memory (a wgpu buffer, host memory, or
//!   nothing at all in `SimulatedSource`). The OOM report and `format_size` live in `base` and are
//!   re-exported here.

mod caching;
mod category;
mod config;
mod history;
pub mod pickle;
pub mod replay;
mod snapshot;
mod source;
mod stats;
mod summary;
mod vaspace;

pub use crate::base::OutOfMemory;
pub use crate::base::{format_size, parse_size};
pub use caching::{Attempt, BlockRef, CachingAllocator, MIN_BLOCK_SIZE, SMALL_BUFFER, SMALL_SIZE};
pub use category::{
    backward_scope, op_is_open, op_scope, outer_op, BackwardScope, MemoryCategory, OpScope,
};
pub use config::{AllocatorConfig, ROUNDUP_INTERVALS};
pub use history::{
    annotate_scope, current_kiln_frames, frames_wanted, kiln_scope, now_us, op_frame_name,
    push_scope, start_scope_log, take_scope_log, thread_number, Frame, Frames, HistoryContext,
    HistoryEnabled, HistoryStacks, ScopeGuard, ScopeRecord, TraceAction, TraceEntry,
};
pub(crate) use history::{set_tensor_tracking, tensor_tracking};
pub use snapshot::{AllocatorSettings, BlockInfo, BlockState, SegmentInfo, Snapshot};
pub use source::{
    HostMemory, HostSegment, HostSource, MemInfo, SegmentSource, SimulatedSource, SourceError,
    EXTERNAL_STREAM,
};
pub use stats::{DeviceStats, PoolKind, Stat, StatArray};
pub use summary::memory_summary;
