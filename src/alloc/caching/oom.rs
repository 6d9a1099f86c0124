//! The end of the malloc cascade: the out-of-memory error with PyTorch's message and kiln's
//! fragmentation figures (the largest free block, and whether expandable segments would have
//! made the request fit).

use super::CachingAllocator;
use crate::alloc::category::MemoryCategory;
use crate::alloc::history::{now_us, TraceAction, TraceEntry};
use crate::alloc::source::SegmentSource;
use crate::base::OutOfMemory;
use crate::Error;

/// How `malloc_as` ends a request that nothing fits, even after releasing the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// PyTorch's `malloc`: the out-of-memory error, recorded (the trace's `oom` entry and
    /// `num_ooms`).
    Only,
    /// The error, recorded nowhere: the caller frees memory and asks `Again`, or does without
    /// (a speculative request, such as `save_on_cpu` bringing a tensor back ahead of use).
    Quiet,
    /// After a `Quiet` attempt and a release: the cascade again, its retry not counted a
    /// second time, and the error recorded.
    Again,
}

impl<S: SegmentSource> CachingAllocator<S> {
    /// The error that ends a request nothing fits: PyTorch's message, recorded (the trace's
    /// `oom` entry, `num_ooms`) unless `attempt` is `Quiet`.
    pub(super) fn no_fit(
        &mut self,
        attempt: Attempt,
        requested: u64,
        (rounded, alloc_size): (u64, u64),
        stream: u64,
    ) -> Error {
        let info = self.source.mem_info();
        if attempt != Attempt::Quiet {
            self.history.record(TraceEntry {
                action: TraceAction::Oom,
                addr: None,
                device_free: Some(info.free.unwrap_or(0)),
                size: rounded,
                stream,
                time_us: now_us(),
                compile_context: "N/A",
                user_metadata: String::new(),
                frames: None,
                category: MemoryCategory::Unknown,
            });
            self.stats.num_ooms += 1;
        }
        let allocated = self.stats.allocated_bytes.all().current as u64;
        let reserved = self.stats.reserved_bytes.all().current as u64;
        let largest_free_block = self.largest_free_block();
        // Expandable segments could unmap the cached free memory and map it again in one run,
        // next to what the device (or the limit) still has.
        let headroom = match (info.free, self.limit) {
            (Some(free), Some(limit)) => Some(free.min(limit.saturating_sub(reserved))),
            (Some(free), None) => Some(free),
            (None, Some(limit)) => Some(limit.saturating_sub(reserved)),
            (None, None) => None,
        };
        let expandable_would_fit = (!self.config.expandable_segments)
            .then_some(headroom)
            .flatten()
            .map(|h| reserved - allocated + h >= rounded);
        Error::OutOfMemory(Box::new(OutOfMemory {
            device: self.source.describe(),
            requested,
            alloc_size,
            total: info.total,
            free: info.free,
            allowed: self.limit,
            allocated,
            reserved,
            more_than_1eb: false,
            largest_free_block,
            expandable_would_fit,
        }))
    }

    /// The largest free block the cache holds, in either pool: the most a request can get
    /// without new memory.
    pub fn largest_free_block(&self) -> u64 {
        [&self.small, &self.large]
            .iter()
            .flat_map(|p| p.free.keys().map(|k| k.1))
            .max()
            .unwrap_or(0)
    }
}
