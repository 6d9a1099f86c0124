//! Memory history: `record_memory_history`, the trace entries every allocation, free and
//! segment change records, and each allocated block's category.

use super::CachingAllocator;
use crate::alloc::category::MemoryCategory;
use crate::alloc::history::{
    now_us, Frames, History, HistoryContext, HistoryEnabled, HistoryStacks, TraceAction, TraceEntry,
};
use crate::alloc::source::SegmentSource;

impl<S: SegmentSource> CachingAllocator<S> {
    /// What `record_memory_history` last enabled.
    pub fn history_enabled(&self) -> Option<HistoryEnabled> {
        self.history.enabled
    }

    /// `record_memory_history`: `enabled = None` stops recording and clears the ring.
    pub fn record_memory_history(
        &mut self,
        enabled: Option<HistoryEnabled>,
        context: HistoryContext,
        stacks: HistoryStacks,
        max_entries: usize,
    ) {
        let h = &mut self.history;
        match enabled {
            None => h.replace(History::default()),
            Some(e) => {
                let mut new = History {
                    enabled: Some(e),
                    context,
                    stacks,
                    max_entries: if e == HistoryEnabled::State {
                        1
                    } else {
                        max_entries
                    },
                    ring: std::mem::take(&mut h.ring),
                };
                while new.ring.len() > new.max_entries {
                    new.ring.pop_front();
                }
                h.replace(new);
            }
        }
    }

    /// Marks the allocated block at `addr` as holding `category`, where its current one yields
    /// (`MemoryCategory::yields_to`); other addresses are ignored.
    pub fn set_category(&mut self, addr: u64, category: MemoryCategory) {
        if let Some(&id) = self.allocated.get(&addr) {
            let b = &mut self.blocks[id];
            if b.category.yields_to(category) {
                b.category = category;
            }
        }
    }

    /// The category of the allocated block at `addr`.
    pub fn category(&self, addr: u64) -> Option<MemoryCategory> {
        self.allocated
            .get(&addr)
            .map(|&id| self.blocks[id].category)
    }

    pub(crate) fn trace(
        &mut self,
        action: TraceAction,
        addr: Option<u64>,
        size: u64,
        stream: u64,
        frames: Option<Frames>,
    ) {
        self.trace_block(action, addr, size, stream, frames, MemoryCategory::Unknown);
    }

    /// `trace` for a block's alloc or free, with what the block holds (as allocated, or as it
    /// ended).
    pub(super) fn trace_block(
        &mut self,
        action: TraceAction,
        addr: Option<u64>,
        size: u64,
        stream: u64,
        frames: Option<Frames>,
        category: MemoryCategory,
    ) {
        if self.history.enabled.is_none() {
            return;
        }
        self.history.record(TraceEntry {
            action,
            addr,
            device_free: None,
            size,
            stream,
            time_us: now_us(),
            compile_context: "N/A",
            user_metadata: String::new(),
            frames,
            category,
        });
    }
}
