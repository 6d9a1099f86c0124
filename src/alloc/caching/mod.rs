//! The caching allocator's policy, after PyTorch's `DeviceCachingAllocator`: rounding, the
//! small and large pools, best fit, split and merge, oversize blocks, garbage collection, the
//! release-and-retry cascade and the out-of-memory report. It talks to memory only through a
//! `SegmentSource`. See Note [Caching allocator] in ARCHITECTURE.md.

mod expandable;
mod invariants;
mod oom;
mod release;
mod slab;
mod trace;

pub use oom::Attempt;

use super::category::MemoryCategory;
use super::config::{AllocatorConfig, MIB};
use super::history::{Frames, History, TraceAction};
use super::source::{SegmentSource, SourceError, EXTERNAL_STREAM};
use super::stats::{DeviceStats, PoolKind};
use super::vaspace::VaSpace;
use crate::base::OutOfMemory;
use crate::{Error, Result};
use rustc_hash::FxHashMap;
use slab::Slab;
use std::collections::{BTreeMap, VecDeque};

/// Every block size is a multiple of this (PyTorch's kMinBlockSize).
pub const MIN_BLOCK_SIZE: u64 = 512;
/// Rounded sizes up to this go to the small pool (kSmallSize).
pub const SMALL_SIZE: u64 = MIB;
/// Segment size of the small pool (kSmallBuffer).
pub const SMALL_BUFFER: u64 = 2 * MIB;
/// Rounded sizes from this get a segment of their own size (kMinLargeAlloc).
pub const MIN_LARGE_ALLOC: u64 = 10 * MIB;
/// Rounding unit of such segments (kRoundLarge).
pub const ROUND_LARGE: u64 = 2 * MIB;
/// Requests of this size or more fail at once (PyTorch's 1 EB guard).
const ONE_EB: u64 = 1 << 60;

pub(crate) type BlockId = usize;
type SegmentId = usize;
/// Free-set key: (stream, size, address), PyTorch's BlockComparatorSize order.
type FreeKey = (u64, u64, u64);

#[derive(Debug)]
pub(crate) struct Block {
    pub stream: u64,
    pub size: u64,
    /// The caller's size at the last allocation; stale on a freed block, as in PyTorch.
    pub requested_size: u64,
    pub pool: PoolKind,
    pub addr: u64,
    pub allocated: bool,
    pub prev: Option<BlockId>,
    pub next: Option<BlockId>,
    pub segment: SegmentId,
    /// Outstanding events (submission indices) that gate reuse after a free.
    pub event_count: usize,
    /// Events recorded through `record_use` while allocated.
    pub uses: Vec<u64>,
    pub gc_count_base: u64,
    pub frames: Option<Frames>,
    /// What the allocated block holds (for the categorised memory timeline).
    pub category: MemoryCategory,
    /// Backed by memory; false only for the unmapped stretches of an expandable segment.
    pub mapped: bool,
    /// Part of an expandable segment (a reserved range with pages mapped on demand).
    pub expandable: bool,
}

impl Block {
    /// A free block with no history: a new segment's, a split's front, an unmapped stretch.
    #[allow(clippy::too_many_arguments)]
    fn new(
        stream: u64,
        pool: PoolKind,
        segment: SegmentId,
        addr: u64,
        size: u64,
        (prev, next): (Option<BlockId>, Option<BlockId>),
        mapped: bool,
        expandable: bool,
    ) -> Block {
        Block {
            stream,
            size,
            requested_size: 0,
            pool,
            addr,
            allocated: false,
            prev,
            next,
            segment,
            event_count: 0,
            uses: Vec::new(),
            gc_count_base: 0,
            frames: None,
            category: MemoryCategory::Unknown,
            mapped,
            expandable,
        }
    }

    fn is_split(&self) -> bool {
        self.prev.is_some() || self.next.is_some()
    }
    fn free_key(&self) -> FreeKey {
        (self.stream, self.size, self.addr)
    }
}

pub(crate) struct Segment<H> {
    pub handle: H,
    pub base: u64,
    pub size: u64,
    pub pool: PoolKind,
    pub stream: u64,
    /// The block at the lowest address.
    pub head: BlockId,
    pub frames: Option<Frames>,
    /// An expandable segment: a reserved range, `size` bytes of address space of which only
    /// the mapped blocks have memory.
    pub expandable: bool,
}

#[derive(Default)]
struct BlockPool {
    /// Free mapped blocks.
    free: BTreeMap<FreeKey, BlockId>,
    /// Unmapped stretches of expandable segments, by (stream, address).
    unmapped: BTreeMap<(u64, u64), BlockId>,
    get_free_blocks_call_count: u64,
}

/// A block handed out to a caller.
#[derive(Clone, Debug)]
pub struct BlockRef<H> {
    /// The block's address in kiln's virtual address space (stable for the block's life).
    pub addr: u64,
    /// Byte offset of the block inside its segment: what a tensor binds.
    pub offset: u64,
    /// The block's size (rounded; possibly larger than asked).
    pub size: u64,
    /// The caller's size.
    pub requested_size: u64,
    /// The source's handle of the segment the block lies in.
    pub segment: H,
}

/// PyTorch's caching allocator for one device, generic over where segments come from.
/// Not synchronised itself: the device wraps it in one mutex.
pub struct CachingAllocator<S: SegmentSource> {
    pub(crate) source: S,
    pub(crate) config: AllocatorConfig,
    pub(crate) stats: DeviceStats,
    pub(crate) blocks: Slab<Block>,
    pub(crate) segments: Slab<Segment<S::Handle>>,
    small: BlockPool,
    large: BlockPool,
    /// Allocated blocks by address (PyTorch's allocated_blocks).
    allocated: FxHashMap<u64, BlockId>,
    /// Freed blocks waiting for their events, in event order.
    pending_events: VecDeque<(u64, BlockId)>,
    va: VaSpace,
    /// Cap on reserved bytes (PyTorch's allowed_memory_maximum), armed by a fraction or limit.
    limit: Option<u64>,
    fraction: f64,
    pub(crate) history: History,
}

fn pool_of(size: u64) -> PoolKind {
    if size <= SMALL_SIZE {
        PoolKind::Small
    } else {
        PoolKind::Large
    }
}

impl<S: SegmentSource> CachingAllocator<S> {
    /// An allocator over `source` with `config`, holding no memory yet.
    pub fn new(source: S, config: AllocatorConfig) -> Self {
        let stats = DeviceStats {
            max_split_size: if config.max_split_size == u64::MAX {
                -1
            } else {
                config.max_split_size as i64
            },
            ..Default::default()
        };
        let config = Self::checked_config(&source, config);
        CachingAllocator {
            source,
            config,
            stats,
            blocks: Slab::new(),
            segments: Slab::new(),
            small: BlockPool::default(),
            large: BlockPool::default(),
            allocated: FxHashMap::default(),
            pending_events: VecDeque::new(),
            va: VaSpace::new(),
            limit: None,
            fraction: 1.0,
            history: History::default(),
        }
    }

    /// The settings in force (`KILN_ALLOC_CONF` or `set_allocator_settings`).
    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    /// Replaces the settings at run time, as `_set_allocator_settings` does. As in PyTorch,
    /// `max_split_size` in the statistics keeps the value the allocator was created with.
    pub fn set_config(&mut self, config: AllocatorConfig) {
        self.config = Self::checked_config(&self.source, config);
    }

    /// `expandable_segments:True` where the source cannot back it falls back to ordinary
    /// segments with one warning naming the device and the missing feature, as PyTorch does on
    /// platforms without virtual memory management.
    fn checked_config(source: &S, mut config: AllocatorConfig) -> AllocatorConfig {
        if config.expandable_segments {
            if let Some(why) = source.expandable_unsupported() {
                static WARNED: std::sync::Once = std::sync::Once::new();
                WARNED.call_once(|| {
                    eprintln!(
                        "kiln: expandable_segments:True is not supported here ({why}); \
                         using ordinary segments"
                    )
                });
                config.expandable_segments = false;
            }
        }
        config
    }

    /// PyTorch's `DeviceStats`, behind `memory_stats`.
    pub fn stats(&self) -> &DeviceStats {
        &self.stats
    }

    /// The segment source (a wgpu device's buffers, host memory, or sizes only).
    pub fn source(&self) -> &S {
        &self.source
    }

    /// The segment source, mutably.
    pub fn source_mut(&mut self) -> &mut S {
        &mut self.source
    }

    /// `round_size`: 512-byte rounding, or `roundup_power2_divisions` above 512·d bytes.
    pub fn round_size(&self, size: u64) -> u64 {
        if size < MIN_BLOCK_SIZE {
            return MIN_BLOCK_SIZE;
        }
        let interval = (63 - size.leading_zeros() as i64 - 20).clamp(0, 15) as usize;
        let divisions = self.config.roundup_power2_divisions[interval];
        if divisions > 1 && size > MIN_BLOCK_SIZE * divisions {
            if size.is_power_of_two() {
                return size;
            }
            let floor = 1u64 << (63 - size.leading_zeros());
            let step = floor / divisions;
            if step == 0 {
                return floor * 2;
            }
            return size.div_ceil(step) * step;
        }
        size.div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
    }

    /// The segment size a request of `rounded` bytes creates when nothing cached fits.
    pub fn allocation_size(&self, rounded: u64) -> u64 {
        if rounded <= SMALL_SIZE {
            SMALL_BUFFER
        } else if rounded < MIN_LARGE_ALLOC {
            self.config.large_segment_size
        } else {
            rounded.div_ceil(ROUND_LARGE) * ROUND_LARGE
        }
    }

    fn pool(&self, kind: PoolKind) -> &BlockPool {
        match kind {
            PoolKind::Small => &self.small,
            PoolKind::Large => &self.large,
        }
    }

    fn pool_mut(&mut self, kind: PoolKind) -> &mut BlockPool {
        match kind {
            PoolKind::Small => &mut self.small,
            PoolKind::Large => &mut self.large,
        }
    }

    fn gc_armed(&self) -> bool {
        self.limit.is_some() && self.config.garbage_collection_threshold > 0.0
    }

    /// Allocates `size` bytes on `stream` (0 = the device's queue). `Ok(None)` for 0 bytes,
    /// as PyTorch hands out a null pointer. The cascade: cached block, else \[gc\], else a new
    /// segment, else release oversize cached blocks and retry, else release the whole cache and
    /// retry, else out of memory.
    pub fn malloc(&mut self, size: u64, stream: u64) -> Result<Option<BlockRef<S::Handle>>> {
        self.malloc_as(size, stream, Attempt::Only)
    }

    /// `malloc`, with an out-of-memory end as `attempt` says (Note [Memory pressure] in
    /// `device/pressure.rs`).
    pub fn malloc_as(
        &mut self,
        size: u64,
        stream: u64,
        attempt: Attempt,
    ) -> Result<Option<BlockRef<S::Handle>>> {
        if size == 0 {
            return Ok(None);
        }
        if size >= ONE_EB {
            return Err(Error::OutOfMemory(Box::new(OutOfMemory::more_than_1eb(
                self.source.describe(),
            ))));
        }
        let frames = self.history.gather();
        self.process_events();
        let rounded = self.round_size(size);
        let pool = pool_of(rounded);
        let alloc_size = self.allocation_size(rounded);
        // (Expandable segments map pages into one range of the whole memory: no buffer bound.)
        let max_segment = self.source.max_segment_size();
        if alloc_size > max_segment && !self.config.expandable_segments {
            return Err(Error::TooLarge {
                op: "malloc",
                size_bytes: alloc_size,
                limit_bytes: max_segment,
                what: "bytes of the segment for this request (the largest buffer the device can create)",
            });
        }

        let mut found = self.get_free_block(pool, stream, rounded);
        if found.is_none() {
            if self.gc_armed() {
                self.garbage_collect_cached_blocks();
            }
            let sizes = (rounded, alloc_size);
            found = self.alloc_block(pool, stream, sizes, false, &frames)?;
            if found.is_none() && self.release_available_cached_blocks(pool, stream, rounded) {
                found = self.alloc_block(pool, stream, sizes, false, &frames)?;
            }
            if found.is_none() {
                self.release_cached_blocks();
                let counted = attempt != Attempt::Again;
                found = self.alloc_block(pool, stream, sizes, counted, &frames)?;
            }
        }
        let Some(block) = found else {
            return Err(self.no_fit(attempt, size, (rounded, alloc_size), stream));
        };
        let id = self.alloc_found_block(block, rounded, size, frames);
        let b = &self.blocks[id];
        let seg = &self.segments[b.segment];
        Ok(Some(BlockRef {
            addr: b.addr,
            offset: b.addr - seg.base,
            size: b.size,
            requested_size: size,
            segment: seg.handle.clone(),
        }))
    }

    /// Best fit by (stream, size, address), refusing oversize blocks as PyTorch does.
    fn get_free_block(&mut self, pool: PoolKind, stream: u64, size: u64) -> Option<BlockId> {
        let gc = self.gc_armed();
        let (max_split, rounding) = (
            self.config.max_split_size,
            self.config.max_non_split_rounding,
        );
        let expandable = self.config.expandable_segments;
        if gc {
            self.pool_mut(pool).get_free_blocks_call_count += 1;
        }
        let mut it = self
            .pool(pool)
            .free
            .range((stream, size, 0)..)
            .take_while(|(k, _)| k.0 == stream)
            .peekable();
        let (mut key, mut id) = it.next().map(|(&k, &id)| (k, id))?;
        if self.blocks[id].expandable {
            if expandable {
                // Best fit counts the unmapped space after an expandable block as its own: a
                // block that can grow less is preferred (PyTorch's expandable_size).
                while let Some((&k, &next)) = it.peek() {
                    if !self.blocks[id].expandable
                        || self.expandable_size(next) >= self.expandable_size(id)
                    {
                        break;
                    }
                    (key, id) = (k, next);
                    it.next();
                }
            } else {
                // Expandable segments turned off since: only ordinary blocks qualify.
                let (k, next) = it
                    .find(|(_, &b)| !self.blocks[b].expandable)
                    .map(|(&k, &b)| (k, b))?;
                (key, id) = (k, next);
            }
        }
        let block_size = key.1;
        if (size < max_split && block_size >= max_split)
            || (size >= max_split && block_size >= size.saturating_add(rounding))
        {
            return None;
        }
        self.pool_mut(pool).free.remove(&key);
        Some(id)
    }

    /// Creates a segment (`cudaMalloc`). `Ok(None)` on out-of-memory or over the limit;
    /// other backend errors are returned.
    fn alloc_block(
        &mut self,
        pool: PoolKind,
        stream: u64,
        (rounded, size): (u64, u64),
        is_retry: bool,
        frames: &Option<Frames>,
    ) -> Result<Option<BlockId>> {
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        let reserved = self.stats.reserved_bytes.all().current as u64;
        if self.limit.is_some_and(|limit| reserved + size > limit) {
            return Ok(None);
        }
        if self.config.expandable_segments && stream != EXTERNAL_STREAM {
            return self.try_allocate_expandable_block(pool, stream, rounded, frames);
        }
        let handle = match self.source.allocate_on(stream, size) {
            Ok(h) => h,
            Err(SourceError::OutOfMemory) => return Ok(None),
            Err(SourceError::Other(msg)) => return Err(Error::Wgpu { op: "malloc", msg }),
        };
        let base = self.va.reserve(size);
        let segment = self.segments.insert(Segment {
            handle,
            base,
            size,
            pool,
            stream,
            head: 0,
            frames: frames.clone(),
            expandable: false,
        });
        let id = self.blocks.insert(Block::new(
            stream,
            pool,
            segment,
            base,
            size,
            (None, None),
            true,
            false,
        ));
        self.segments[segment].head = id;
        self.stats.segment.increase(pool, 1);
        self.stats.reserved_bytes.increase(pool, size);
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        self.trace(
            TraceAction::SegmentAlloc,
            Some(base),
            size,
            stream,
            frames.clone(),
        );
        Ok(Some(id))
    }

    fn should_split(&self, id: BlockId, size: u64) -> bool {
        let b = &self.blocks[id];
        let remaining = b.size - size;
        if b.pool == PoolKind::Small || self.config.expandable_segments {
            return remaining >= MIN_BLOCK_SIZE;
        }
        size < self.config.max_split_size && remaining > SMALL_SIZE
    }

    /// Hands out `id` (splitting off the tail when worth it) and counts the allocation.
    fn alloc_found_block(
        &mut self,
        id: BlockId,
        size: u64,
        requested: u64,
        frames: Option<Frames>,
    ) -> BlockId {
        let split = self.should_split(id, size);
        let already_split = self.blocks[id].is_split();
        let pool = self.blocks[id].pool;
        // PyTorch leaves expandable blocks out of inactive_split: their free pages can always
        // be given back.
        let counts_split = !self.blocks[id].expandable;
        let id = if split {
            // The found block stays as the free remainder; a new block takes the front.
            let remaining = id;
            let r = &self.blocks[remaining];
            let front = self.blocks.insert(Block::new(
                r.stream,
                pool,
                r.segment,
                r.addr,
                size,
                (r.prev, Some(remaining)),
                true,
                r.expandable,
            ));
            match self.blocks[front].prev {
                Some(p) => self.blocks[p].next = Some(front),
                None => {
                    let seg = self.blocks[front].segment;
                    self.segments[seg].head = front;
                }
            }
            let r = &mut self.blocks[remaining];
            r.prev = Some(front);
            r.addr += size;
            r.size -= size;
            let remaining_size = r.size;
            self.insert_free(remaining);
            if counts_split && already_split {
                self.stats.inactive_split_bytes.decrease(pool, size);
            } else if counts_split {
                self.stats
                    .inactive_split_bytes
                    .increase(pool, remaining_size);
                self.stats.inactive_split.increase(pool, 1);
            }
            front
        } else {
            if already_split && counts_split {
                let bsize = self.blocks[id].size;
                self.stats.inactive_split_bytes.decrease(pool, bsize);
                self.stats.inactive_split.decrease(pool, 1);
            }
            id
        };
        let b = &mut self.blocks[id];
        b.allocated = true;
        b.requested_size = requested;
        b.frames = frames.clone();
        b.category = super::category::initial_category();
        let (addr, bsize, stream) = (b.addr, b.size, b.stream);
        self.allocated.insert(addr, id);
        let s = &mut self.stats;
        s.allocation.increase(pool, 1);
        s.allocated_bytes.increase(pool, bsize);
        s.active.increase(pool, 1);
        s.active_bytes.increase(pool, bsize);
        s.requested_bytes.increase(pool, requested);
        if bsize >= self.config.max_split_size {
            s.oversize_allocations.increase(1);
        }
        let category = self.blocks[id].category;
        self.trace_block(
            TraceAction::Alloc,
            Some(addr),
            requested,
            stream,
            frames,
            category,
        );
        id
    }

    fn insert_free(&mut self, id: BlockId) {
        let pool = self.blocks[id].pool;
        let count = self.pool_mut(pool).get_free_blocks_call_count;
        let b = &mut self.blocks[id];
        b.gc_count_base = count;
        let key = b.free_key();
        self.pool_mut(pool).free.insert(key, id);
    }

    /// Marks the block at `addr` as used by `event` (a submission index): after a free it is not
    /// reused until that event completes (PyTorch's `record_stream`).
    pub fn record_use(&mut self, addr: u64, event: u64) -> Result<()> {
        let id = *self.allocated.get(&addr).ok_or(Error::InvalidPointer {
            op: "record_use",
            addr,
        })?;
        let uses = &mut self.blocks[id].uses;
        if !uses.contains(&event) {
            uses.push(event);
        }
        Ok(())
    }

    /// Frees the block at `addr`. Its bytes stop counting as allocated at once; it becomes
    /// reusable now, or when its recorded uses complete.
    pub fn free(&mut self, addr: u64) -> Result<()> {
        let id = self
            .allocated
            .remove(&addr)
            .ok_or(Error::InvalidPointer { op: "free", addr })?;
        let b = &mut self.blocks[id];
        b.allocated = false;
        let (pool, size, requested, stream) = (b.pool, b.size, b.requested_size, b.stream);
        let uses = std::mem::take(&mut b.uses);
        self.stats.allocation.decrease(pool, 1);
        self.stats.allocated_bytes.decrease(pool, size);
        let frames = self.blocks[id].frames.clone();
        let category = self.blocks[id].category;
        self.trace_block(
            TraceAction::FreeRequested,
            Some(addr),
            requested,
            stream,
            frames,
            category,
        );
        if size >= self.config.max_split_size {
            self.stats.oversize_allocations.decrease(1);
        }
        if uses.is_empty() {
            self.free_block(id);
        } else {
            self.blocks[id].event_count = uses.len();
            let mut queue: Vec<(u64, BlockId)> = self.pending_events.drain(..).collect();
            queue.extend(uses.into_iter().map(|e| (e, id)));
            queue.sort_by_key(|&(e, _)| e);
            self.pending_events = queue.into();
        }
        Ok(())
    }

    /// Returns a block to its pool, merging free neighbours, and counts it inactive.
    fn free_block(&mut self, id: BlockId) {
        let b = &self.blocks[id];
        let (pool, size, requested, addr, stream) =
            (b.pool, b.size, b.requested_size, b.addr, b.stream);
        let frames = b.frames.clone();
        let category = b.category;
        self.trace_block(
            TraceAction::FreeCompleted,
            Some(addr),
            requested,
            stream,
            frames,
            category,
        );
        self.blocks[id].frames = None;
        let (mut net_blocks, mut net_bytes) = (0i64, 0i64);
        for neighbour in [self.blocks[id].prev, self.blocks[id].next] {
            let subsumed = self.try_merge_blocks(id, neighbour);
            if subsumed > 0 {
                net_blocks -= 1;
                net_bytes -= subsumed as i64;
            }
        }
        self.insert_free(id);
        if self.blocks[id].is_split() {
            net_blocks += 1;
            net_bytes += self.blocks[id].size as i64;
        }
        if self.blocks[id].expandable {
            (net_blocks, net_bytes) = (0, 0);
        }
        let s = &mut self.stats;
        match net_blocks.signum() {
            1 => s.inactive_split.increase(pool, net_blocks as u64),
            -1 => s.inactive_split.decrease(pool, net_blocks.unsigned_abs()),
            _ => {}
        }
        match net_bytes.signum() {
            1 => s.inactive_split_bytes.increase(pool, net_bytes as u64),
            -1 => s
                .inactive_split_bytes
                .decrease(pool, net_bytes.unsigned_abs()),
            _ => {}
        }
        s.active.decrease(pool, 1);
        s.active_bytes.decrease(pool, size);
        s.requested_bytes.decrease(pool, requested);
    }

    /// Merges free neighbour `src` into `dst`; returns the bytes subsumed (0 if not merged).
    fn try_merge_blocks(&mut self, dst: BlockId, src: Option<BlockId>) -> u64 {
        let Some(src) = src else { return 0 };
        let s = &self.blocks[src];
        if s.allocated || s.event_count > 0 || s.mapped != self.blocks[dst].mapped {
            return 0;
        }
        let (key, pool, mapped, at) = (s.free_key(), s.pool, s.mapped, (s.stream, s.addr));
        if mapped {
            self.pool_mut(pool).free.remove(&key);
        } else {
            self.pool_mut(pool).unmapped.remove(&at);
        }
        let s = self.blocks.remove(src);
        if self.blocks[dst].prev == Some(src) {
            // [src dst]: dst takes over src's start.
            self.blocks[dst].addr = s.addr;
            self.blocks[dst].prev = s.prev;
            match s.prev {
                Some(p) => self.blocks[p].next = Some(dst),
                None => self.segments[s.segment].head = dst,
            }
        } else {
            // [dst src]
            self.blocks[dst].next = s.next;
            if let Some(n) = s.next {
                self.blocks[n].prev = Some(dst);
            }
        }
        self.blocks[dst].size += s.size;
        s.size
    }

    /// Frees blocks whose events have completed, oldest first, stopping at the first that has not.
    fn process_events(&mut self) {
        while let Some(&(event, id)) = self.pending_events.front() {
            if !self.source.event_completed(event) {
                break;
            }
            self.pending_events.pop_front();
            self.complete_event(id);
        }
    }

    fn complete_event(&mut self, id: BlockId) {
        let b = &mut self.blocks[id];
        b.event_count -= 1;
        if b.event_count == 0 {
            self.free_block(id);
        }
    }

    /// `empty_cache`: waits for outstanding events, then releases every wholly free segment.
    pub fn empty_cache(&mut self) {
        self.release_cached_blocks();
    }

    /// Caps reserved bytes at `limit` (`None` removes the cap). Also arms the garbage collector.
    pub fn set_memory_limit(&mut self, limit: Option<u64>) {
        self.limit = limit;
        if limit.is_none() {
            self.fraction = 1.0;
        }
    }

    /// `set_per_process_memory_fraction`: cap reserved bytes at floor(fraction × total).
    pub fn set_memory_fraction(&mut self, fraction: f64) -> Result<()> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(Error::InvalidArgument {
                op: "set_per_process_memory_fraction",
                msg: format!("Invalid fraction value: {fraction}. Allowed range: 0~1"),
            });
        }
        let total = self
            .source
            .mem_total()
            .ok_or_else(|| Error::InvalidArgument {
                op: "set_per_process_memory_fraction",
                msg: format!(
                    "the capacity of {} is unknown; set a limit in bytes with set_memory_limit",
                    self.source.describe()
                ),
            })?;
        self.fraction = fraction;
        self.limit = Some((fraction * total as f64) as u64);
        Ok(())
    }

    /// The fraction of the device's capacity the allocator may reserve (`set_per_process_memory_fraction`).
    pub fn memory_fraction(&self) -> f64 {
        self.fraction
    }

    /// The cap on reserved bytes in force, if any (a memory limit, or the fraction of a known capacity).
    pub fn memory_limit(&self) -> Option<u64> {
        self.limit
    }

    /// `reset_peak_memory_stats`: every peak set to its current value.
    pub fn reset_peak_stats(&mut self) {
        self.stats.reset_peak();
    }

    /// `reset_accumulated_memory_stats`: the allocated and freed counters and the event counts set to zero.
    pub fn reset_accumulated_stats(&mut self) {
        self.stats.reset_accumulated();
    }
}
