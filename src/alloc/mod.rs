//! The caching allocator: PyTorch's CUDA caching allocator policy, statistics, summary,
//! snapshots and history, over a pluggable `SegmentSource`. Nothing here knows wgpu.

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

pub use crate::base::format_size;
pub use crate::base::OutOfMemory;
pub use caching::{BlockRef, CachingAllocator, MIN_BLOCK_SIZE, SMALL_BUFFER, SMALL_SIZE};
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
};
pub use stats::{DeviceStats, PoolKind, Stat, StatArray};
pub use summary::memory_summary;
