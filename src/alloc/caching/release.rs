//! Giving memory back: event processing, releasing free segments (`cudaFree`), the
//! oversize-block release of `max_split_size`, garbage collection, and `release_cached_blocks`.

use super::{Block, BlockId, CachingAllocator};
use crate::alloc::history::TraceAction;
use crate::alloc::source::SegmentSource;
use crate::alloc::stats::PoolKind;

impl<S: SegmentSource> CachingAllocator<S> {
    /// Waits for every outstanding event and frees the blocks they held.
    pub(super) fn synchronize_and_free_events(&mut self) {
        self.stats.num_sync_all_streams += 1;
        // The source waits for all queued work too: on wgpu a released buffer's memory returns
        // only once the GPU is done with it, and the retry that follows needs it back.
        self.source.synchronize();
        while let Some((_, id)) = self.pending_events.pop_front() {
            self.complete_event(id);
        }
    }

    /// Returns a wholly free segment to the source (`cudaFree`).
    fn release_block(&mut self, id: BlockId) {
        let b = &self.blocks[id];
        debug_assert!(!b.is_split() && !b.allocated);
        let (pool, size, addr, stream, key, seg) =
            (b.pool, b.size, b.addr, b.stream, b.free_key(), b.segment);
        self.pool_mut(pool).free.remove(&key);
        self.blocks.remove(id);
        let segment = self.segments.remove(seg);
        self.va.release(segment.base, segment.size);
        self.source.release(segment.handle);
        self.stats.num_device_free += 1;
        self.trace(TraceAction::SegmentFree, Some(addr), size, stream, None);
        self.stats.segment.decrease(pool, 1);
        self.stats.reserved_bytes.decrease(pool, size);
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.decrease(1);
        }
    }

    /// Releases every wholly free segment of one pool, in free-set order; in expandable
    /// segments, unmaps the pages wholly inside free blocks, and gives back a range left with
    /// nothing mapped.
    fn release_blocks(&mut self, pool: PoolKind) {
        let free: Vec<BlockId> = self.pool_mut(pool).free.values().copied().collect();
        let mut to_unmap = Vec::new();
        for id in free {
            let b = &self.blocks[id];
            if b.expandable {
                to_unmap.push(id);
            } else if !b.is_split() {
                self.release_block(id);
            }
        }
        for id in to_unmap {
            if let Some(u) = self.unmap_block(id) {
                if !self.blocks[u].is_split() {
                    self.release_expandable_segment(u);
                }
            }
        }
    }

    /// PyTorch's `release_cached_blocks`: sync all events, then free every free segment.
    pub(super) fn release_cached_blocks(&mut self) {
        self.synchronize_and_free_events();
        self.release_blocks(PoolKind::Large);
        self.release_blocks(PoolKind::Small);
    }

    /// With `max_split_size` set: free the smallest oversize cached block that covers the
    /// request, or else oversize blocks from the largest down until enough is released.
    pub(super) fn release_available_cached_blocks(
        &mut self,
        pool: PoolKind,
        stream: u64,
        size: u64,
    ) -> bool {
        let max_split = self.config.max_split_size;
        if max_split == u64::MAX {
            return false;
        }
        let key_size = size.max(max_split);
        let p = self.pool_mut(pool);
        let hit = p
            .free
            .range((stream, key_size, 0)..)
            .next()
            .filter(|(k, _)| k.0 == stream)
            .map(|(_, &id)| id);
        if let Some(id) = hit.filter(|&id| !self.blocks[id].expandable) {
            // Oversize blocks are never split, so a free one is a whole segment.
            if self.blocks[id].is_split() {
                return false;
            }
            self.release_block(id);
            return true;
        }
        let p = self.pool_mut(pool);
        let candidates: Vec<(u64, BlockId)> = p
            .free
            .range(..(stream, key_size, 0))
            .rev()
            .take_while(|(k, _)| k.0 == stream && k.1 >= max_split)
            .map(|(k, &id)| (k.1, id))
            .collect();
        let mut released = 0;
        for (bsize, id) in candidates {
            if released >= key_size {
                break;
            }
            let b = &self.blocks[id];
            if !b.is_split() && !b.expandable {
                self.release_block(id);
                released += bsize;
            }
        }
        released >= key_size
    }

    /// With a limit and `garbage_collection_threshold` set: above threshold·limit reserved,
    /// free unsplit large cached blocks of at least average age until under the threshold.
    pub(super) fn garbage_collect_cached_blocks(&mut self) {
        let Some(limit) = self.limit else { return };
        let threshold = (self.config.garbage_collection_threshold * limit as f64) as u64;
        let reserved = self.stats.reserved_bytes.all().current as u64;
        if reserved <= threshold {
            return;
        }
        let target = reserved - threshold;
        let calls = self.large.get_free_blocks_call_count;
        let age = |b: &Block| calls - b.gc_count_base;
        let freeable: Vec<BlockId> = self
            .large
            .free
            .values()
            .copied()
            .filter(|&id| !self.blocks[id].is_split())
            .collect();
        let mut total_age: u64 = freeable.iter().map(|&id| age(&self.blocks[id])).sum();
        let mut count = freeable.len() as u64;
        let mut reclaimed = 0;
        let mut freed_any = true;
        while reclaimed < target && freed_any && count > 0 {
            let mean = total_age as f64 / count as f64;
            freed_any = false;
            let old: Vec<BlockId> = self
                .large
                .free
                .values()
                .copied()
                .filter(|&id| {
                    let b = &self.blocks[id];
                    !b.is_split() && !b.expandable && age(b) as f64 >= mean
                })
                .collect();
            for id in old {
                freed_any = true;
                reclaimed += self.blocks[id].size;
                total_age -= age(&self.blocks[id]);
                count -= 1;
                self.release_block(id);
            }
        }
    }
}
