//! Expandable segments (`expandable_segments:True`), after PyTorch's `ExpandableSegment` and
//! the allocator functions that use it (`try_allocate_expandable_block`, `find_expandable_block`,
//! `map_block`, `unmap_block`, `release_expandable_segment`): one reserved range per pool and
//! stream, pages of 2 MiB (small pool) or 20 MiB (large pool) mapped on demand at the lowest
//! address where free and unmapped space together fit the request, merged with the free block
//! beside them; on release only pages wholly inside free blocks are unmapped. Mapping moves
//! `reserved_bytes` and `num_device_alloc`/`num_device_free`, never the segment counts.
//! See `../shared/spec/pytorch-allocator.md` §5.

use super::{Block, BlockId, CachingAllocator, Segment};
use crate::alloc::config::MIB;
use crate::alloc::history::{Frames, TraceAction};
use crate::alloc::source::{SegmentSource, SourceError};
use crate::alloc::stats::PoolKind;
use crate::{Error, Result};

/// The page of each pool: PyTorch maps kSmallBuffer and kLargeBuffer at a time.
pub(crate) fn page_size(pool: PoolKind) -> u64 {
    match pool {
        PoolKind::Small => 2 * MIB,
        PoolKind::Large => 20 * MIB,
    }
}

/// Address space reserved per range when the source cannot tell its memory: an H100's 80 GiB.
const DEFAULT_TOTAL: u64 = 80 << 30;

impl<S: SegmentSource> CachingAllocator<S> {
    /// A free block's size for best fit: its own plus the unmapped space right after it.
    pub(super) fn expandable_size(&self, id: BlockId) -> u64 {
        let b = &self.blocks[id];
        let after = b
            .next
            .map(|n| &self.blocks[n])
            .filter(|n| !n.mapped)
            .map_or(0, |n| n.size);
        b.size + after
    }

    /// Free (or unmapped) and not waiting for events.
    fn allocatable(&self, id: Option<BlockId>) -> bool {
        id.is_some_and(|id| {
            let b = &self.blocks[id];
            !b.allocated && b.event_count == 0 && b.uses.is_empty()
        })
    }

    /// Whether the free and unmapped blocks from `id` on hold `size` bytes together.
    fn has_room(&self, mut id: Option<BlockId>, size: u64) -> bool {
        let mut bytes = 0;
        while bytes < size && self.allocatable(id) {
            let b = &self.blocks[id.expect("allocatable")];
            bytes += b.size;
            id = b.next;
        }
        bytes >= size
    }

    /// The lowest unmapped block (or the free block just before it) with room for `size`, or
    /// a new range's single unmapped block.
    fn find_expandable_block(
        &mut self,
        pool: PoolKind,
        stream: u64,
        size: u64,
        frames: &Option<Frames>,
    ) -> Result<BlockId> {
        let unmapped: Vec<BlockId> = self
            .pool(pool)
            .unmapped
            .range((stream, 0)..)
            .take_while(|(k, _)| k.0 == stream)
            .map(|(_, &id)| id)
            .collect();
        for c in unmapped {
            let prev = self.blocks[c].prev;
            let c = if self.allocatable(prev) {
                prev
            } else {
                Some(c)
            };
            if self.has_room(c, size) {
                return Ok(c.expect("a block"));
            }
        }
        let page = page_size(pool);
        let total = self.source.mem_total().unwrap_or(DEFAULT_TOTAL);
        let range = (total / 8 * 9).div_ceil(page) * page;
        let handle = match self.source.reserve(range) {
            Ok(h) => h,
            Err(SourceError::OutOfMemory) => {
                return Err(Error::Wgpu {
                    op: "malloc",
                    msg: format!("reserving {range} bytes of address space failed"),
                })
            }
            Err(SourceError::Other(msg)) => return Err(Error::Wgpu { op: "malloc", msg }),
        };
        let base = self.va.reserve(range);
        let segment = self.segments.insert(Segment {
            handle,
            base,
            size: range,
            pool,
            stream,
            head: 0,
            frames: frames.clone(),
            expandable: true,
        });
        let id = self.blocks.insert(Block::new(
            stream,
            pool,
            segment,
            base,
            range,
            (None, None),
            false,
            true,
        ));
        self.segments[segment].head = id;
        self.pool_mut(pool).unmapped.insert((stream, base), id);
        Ok(id)
    }

    /// Maps the pages that cover the first `size` bytes of unmapped block `id`, which becomes a
    /// free block merged with its free neighbours (the merged block's id is returned); any rest
    /// stays unmapped after it. `None` when the memory is not there (all or nothing); other
    /// failures of the source are errors.
    fn map_block(&mut self, id: BlockId, size: u64) -> Result<Option<BlockId>> {
        let b = &self.blocks[id];
        debug_assert!(!b.mapped && size <= b.size);
        let (pool, stream, addr, seg) = (b.pool, b.stream, b.addr, b.segment);
        let page = page_size(pool);
        let base = self.segments[seg].base;
        let offset = addr - base;
        let len = ((offset + size).div_ceil(page) * page - offset).min(b.size);
        // A memory limit caps what is mapped, whole pages included (the H100 traces: a 16 MiB
        // request 16 MiB under the limit fails when it needs a 20 MiB page).
        let reserved = self.stats.reserved_bytes.all().current as u64;
        if self.limit.is_some_and(|limit| reserved + len > limit) {
            return Ok(None);
        }
        // One source call per page (one `cuMemCreate` handle each in PyTorch), so that any page
        // can be unmapped alone later; all or nothing.
        let handle = self.segments[seg].handle.clone();
        for k in 0..len / page {
            if let Err(e) = self.source.map(&handle, offset + k * page, page) {
                for j in 0..k {
                    self.source.unmap(&handle, offset + j * page, page);
                }
                return match e {
                    SourceError::OutOfMemory => Ok(None),
                    SourceError::Other(msg) => Err(Error::Wgpu { op: "malloc", msg }),
                };
            }
        }
        self.pool_mut(pool).unmapped.remove(&(stream, addr));
        self.blocks[id].mapped = true;
        if len < self.blocks[id].size {
            let rest = self.blocks[id].size - len;
            let next = self.blocks[id].next;
            let r = self.blocks.insert(Block::new(
                stream,
                pool,
                seg,
                addr + len,
                rest,
                (Some(id), next),
                false,
                true,
            ));
            if let Some(n) = next {
                self.blocks[n].prev = Some(r);
            }
            self.blocks[id].next = Some(r);
            self.blocks[id].size = len;
            self.pool_mut(pool).unmapped.insert((stream, addr + len), r);
        }
        let prev = self.blocks[id].prev;
        self.try_merge_blocks(id, prev);
        let next = self.blocks[id].next;
        self.try_merge_blocks(id, next);
        self.insert_free(id);
        self.stats.reserved_bytes.increase(pool, len);
        self.stats.num_device_alloc += 1;
        self.trace(TraceAction::SegmentMap, Some(addr), len, stream, None);
        Ok(Some(id))
    }

    /// PyTorch's `try_allocate_expandable_block`: a free block of at least `size` bytes made by
    /// mapping pages, taken out of the free set; `None` when the memory is not there.
    pub(super) fn try_allocate_expandable_block(
        &mut self,
        pool: PoolKind,
        stream: u64,
        size: u64,
        frames: &Option<Frames>,
    ) -> Result<Option<BlockId>> {
        // The candidate is unmapped (then nothing or free blocks follow), or free with unmapped
        // space right after it.
        let mut candidate = self.find_expandable_block(pool, stream, size, frames)?;
        if !self.blocks[candidate].mapped {
            let want = self.blocks[candidate].size.min(size);
            match self.map_block(candidate, want)? {
                Some(id) => candidate = id,
                None => return Ok(None),
            }
        }
        while self.blocks[candidate].size < size {
            let remaining = size - self.blocks[candidate].size;
            let next = self.blocks[candidate].next.expect("unmapped space follows");
            let want = self.blocks[next].size.min(remaining);
            match self.map_block(next, want)? {
                Some(id) => candidate = id,
                None => return Ok(None),
            }
        }
        let key = self.blocks[candidate].free_key();
        self.pool_mut(pool).free.remove(&key);
        Ok(Some(candidate))
    }

    /// Unmaps the pages wholly inside free block `id`; what is left of the block on either side
    /// stays free. The unmapped stretch merges with unmapped neighbours. Returns the id of the
    /// unmapped block, or `None` if no page was wholly inside.
    pub(super) fn unmap_block(&mut self, id: BlockId) -> Option<BlockId> {
        let b = &self.blocks[id];
        let (pool, stream, addr, size, seg) = (b.pool, b.stream, b.addr, b.size, b.segment);
        let page = page_size(pool);
        let base = self.segments[seg].base;
        let (lo, hi) = (
            (addr - base).div_ceil(page) * page,
            (addr - base + size) / page * page,
        );
        if lo >= hi {
            return None;
        }
        let handle = self.segments[seg].handle.clone();
        for p in (lo..hi).step_by(page as usize) {
            self.source.unmap(&handle, p, page);
        }
        let key = self.blocks[id].free_key();
        self.pool_mut(pool).free.remove(&key);
        let before = base + lo - addr;
        if before > 0 {
            let prev = self.blocks[id].prev;
            let f = self.free_piece(id, addr, before, prev, Some(id));
            match prev {
                Some(p) => self.blocks[p].next = Some(f),
                None => self.segments[seg].head = f,
            }
            self.blocks[id].prev = Some(f);
            self.insert_free(f);
        }
        let after = size - before - (hi - lo);
        if after > 0 {
            let next = self.blocks[id].next;
            let f = self.free_piece(id, base + hi, after, Some(id), next);
            if let Some(n) = next {
                self.blocks[n].prev = Some(f);
            }
            self.blocks[id].next = Some(f);
            self.insert_free(f);
        }
        let b = &mut self.blocks[id];
        b.addr = base + lo;
        b.size = hi - lo;
        b.mapped = false;
        let prev = self.blocks[id].prev;
        self.try_merge_blocks(id, prev);
        let next = self.blocks[id].next;
        self.try_merge_blocks(id, next);
        let at = self.blocks[id].addr;
        self.pool_mut(pool).unmapped.insert((stream, at), id);
        self.stats.reserved_bytes.decrease(pool, hi - lo);
        self.stats.num_device_free += 1;
        self.trace(
            TraceAction::SegmentUnmap,
            Some(base + lo),
            hi - lo,
            stream,
            None,
        );
        Some(id)
    }

    /// A free mapped block beside `of`, for the parts of a block that unmapping leaves.
    fn free_piece(
        &mut self,
        of: BlockId,
        addr: u64,
        size: u64,
        prev: Option<BlockId>,
        next: Option<BlockId>,
    ) -> BlockId {
        let b = &self.blocks[of];
        let (stream, pool, segment) = (b.stream, b.pool, b.segment);
        self.blocks.insert(Block::new(
            stream,
            pool,
            segment,
            addr,
            size,
            (prev, next),
            true,
            true,
        ))
    }

    /// Gives back a range whose every page is unmapped (`id` is its one block).
    pub(super) fn release_expandable_segment(&mut self, id: BlockId) {
        let b = self.blocks.remove(id);
        debug_assert!(!b.mapped && b.prev.is_none() && b.next.is_none());
        self.pool_mut(b.pool).unmapped.remove(&(b.stream, b.addr));
        let segment = self.segments.remove(b.segment);
        self.va.release(segment.base, segment.size);
        self.source.release_reservation(segment.handle);
    }
}
