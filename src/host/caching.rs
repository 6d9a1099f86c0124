//! `CachingHostAllocator`: PyTorch's pinned-memory cache (`ATen/core/CachingHostAllocator.h`,
//! `../shared/spec/pytorch-allocator.md` section 9), rule for rule. Sizes round up to a power of
//! two; 64 free lists, one per power, reused last-in first-out and only for an exact bucket (no
//! splitting, no merging); a block whose memory a queued copy uses goes back to its list only
//! once that copy's event has completed, checked from the oldest event at the next allocation.
//!
//! kiln has two kinds of staging memory where CUDA has one (see Note [Pinned host memory] in
//! ARCHITECTURE.md): each kind has its own 64 lists; the statistics count both.

use crate::alloc::Stat;
use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

/// Which way the GPU copies a staging block. wgpu lets a mappable buffer be only a copy
/// source (`MAP_WRITE | COPY_SRC`: the host writes, the GPU reads) or only a copy destination
/// (`MAP_READ | COPY_DST`: the GPU writes, the host reads, from cached memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PinnedKind {
    /// Host to device.
    Upload,
    /// Device to host.
    Download,
}

impl PinnedKind {
    fn index(self) -> usize {
        match self {
            PinnedKind::Upload => 0,
            PinnedKind::Download => 1,
        }
    }
}

/// Creates and frees staging memory (PyTorch's `cudaHostAlloc`/`cudaFreeHost`) and answers
/// event queries. No policy.
pub trait PinnedSource: Send {
    /// A piece of staging memory.
    type Segment: Clone + Send + Sync;
    /// Creates staging memory of `size_bytes` for `kind` copies (`cudaHostAlloc`).
    fn allocate(&mut self, size_bytes: u64, kind: PinnedKind) -> crate::Result<Self::Segment>;
    /// Frees staging memory (`cudaFreeHost`).
    fn free(&mut self, segment: Self::Segment);
    /// Whether the work behind `event` has completed. Never blocks.
    fn event_completed(&mut self, event: u64) -> bool;
}

/// PyTorch's `c10::CachingAllocator::DurationStat`, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DurationStat {
    /// Microseconds in all.
    pub total: i64,
    /// The longest, in microseconds.
    pub max: i64,
    /// The shortest, in microseconds.
    pub min: i64,
    /// How many were timed.
    pub count: i64,
}

impl DurationStat {
    fn increase(&mut self, us: i64) {
        self.total += us;
        self.count += 1;
        self.max = self.max.max(us);
        self.min = if self.min == 0 { us } else { self.min.min(us) };
    }
    fn avg(&self) -> i64 {
        if self.count == 0 {
            0
        } else {
            self.total / self.count
        }
    }
}

/// Per-bucket counters (PyTorch keeps them per bucket so that buckets lock independently;
/// totals sum them, peaks included, which makes the total peak an upper bound).
#[derive(Clone, Copy, Debug, Default)]
struct BucketStats {
    allocations: Stat,
    allocated_bytes: Stat,
    active_requests: Stat,
    active_bytes: Stat,
}

/// `torch.cuda.host_memory_stats()`'s numbers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostStats {
    /// Blocks owned (checked out or cached).
    pub allocations: Stat,
    /// Bytes handed out.
    pub allocated_bytes: Stat,
    /// Blocks checked out (including those waiting for their copies).
    pub active_requests: Stat,
    /// Bytes in use or waiting for their events.
    pub active_bytes: Stat,
    /// Time spent creating staging memory.
    pub host_alloc_time: DurationStat,
    /// Time spent freeing it.
    pub host_free_time: DurationStat,
    /// Staging allocations made.
    pub num_host_alloc: i64,
    /// Staging allocations freed.
    pub num_host_free: i64,
}

impl HostStats {
    /// The flat map with PyTorch's 28 keys, sorted.
    pub fn to_map(&self) -> BTreeMap<String, i64> {
        let mut m = BTreeMap::new();
        for (name, s) in [
            ("allocations", &self.allocations),
            ("allocated_bytes", &self.allocated_bytes),
            ("active_requests", &self.active_requests),
            ("active_bytes", &self.active_bytes),
        ] {
            m.insert(format!("{name}.current"), s.current);
            m.insert(format!("{name}.peak"), s.peak);
            m.insert(format!("{name}.allocated"), s.allocated);
            m.insert(format!("{name}.freed"), s.freed);
        }
        for (name, d) in [
            ("host_alloc_time", &self.host_alloc_time),
            ("host_free_time", &self.host_free_time),
        ] {
            m.insert(format!("{name}.total"), d.total);
            m.insert(format!("{name}.max"), d.max);
            m.insert(format!("{name}.min"), d.min);
            m.insert(format!("{name}.count"), d.count);
            m.insert(format!("{name}.avg"), d.avg());
        }
        m.insert("num_host_alloc".into(), self.num_host_alloc);
        m.insert("num_host_free".into(), self.num_host_free);
        m
    }
}

const BUCKETS: usize = 64;

struct Block<G> {
    size: u64,
    kind: PinnedKind,
    segment: G,
    allocated: bool,
    /// The latest event of a copy that uses the block (PyTorch records one per stream; kiln
    /// has one stream per device).
    use_event: Option<u64>,
}

/// A block handed out: its id (for `record_event`/`free`), rounded size and memory.
#[derive(Clone, Debug)]
pub struct HostBlock<G> {
    /// The block's id, for `record_event` and `free`.
    pub id: usize,
    /// Bytes, rounded up to a power of two.
    pub size: u64,
    /// The memory.
    pub segment: G,
}

/// PyTorch's `CachingHostAllocator`: pinned blocks in power-of-two buckets, reused once the events recorded on them complete.
pub struct CachingHostAllocator<S: PinnedSource> {
    source: S,
    blocks: Vec<Option<Block<S::Segment>>>,
    vacant: Vec<usize>,
    free_lists: [[Vec<usize>; BUCKETS]; 2],
    /// (event, block) of freed blocks whose copies may still run; newest at the front.
    events: VecDeque<(u64, usize)>,
    buckets: [BucketStats; BUCKETS],
    alloc_time: DurationStat,
    free_time: DurationStat,
    num_host_alloc: i64,
    num_host_free: i64,
}

fn bucket(size: u64) -> usize {
    size.trailing_zeros() as usize
}

fn micros(since: Instant) -> i64 {
    since.elapsed().as_micros() as i64
}

impl<S: PinnedSource> CachingHostAllocator<S> {
    /// An allocator over `source`, holding no memory yet.
    pub fn new(source: S) -> Self {
        CachingHostAllocator {
            source,
            blocks: Vec::new(),
            vacant: Vec::new(),
            free_lists: std::array::from_fn(|_| std::array::from_fn(|_| Vec::new())),
            events: VecDeque::new(),
            buckets: [BucketStats::default(); BUCKETS],
            alloc_time: DurationStat::default(),
            free_time: DurationStat::default(),
            num_host_alloc: 0,
            num_host_free: 0,
        }
    }

    /// The staging source.
    pub fn source(&mut self) -> &mut S {
        &mut self.source
    }

    /// A block of at least `size_bytes` (rounded up to a power of two), or `None` for zero
    /// bytes (PyTorch's null pointer).
    pub fn allocate(
        &mut self,
        size_bytes: u64,
        kind: PinnedKind,
    ) -> crate::Result<Option<HostBlock<S::Segment>>> {
        if size_bytes == 0 {
            return Ok(None);
        }
        self.process_events();
        let size = size_bytes
            .checked_next_power_of_two()
            .ok_or(crate::Error::TooLarge {
                op: "pinned allocate",
                size_bytes,
                limit_bytes: 1 << 63,
                what: "bytes of a pinned block (sizes round up to a power of two)",
            })?;
        let b = bucket(size);
        if let Some(id) = self.free_lists[kind.index()][b].pop() {
            let block = self.blocks[id].as_mut().expect("listed blocks exist");
            block.allocated = true;
            self.buckets[b].active_requests.increase(1);
            self.buckets[b].active_bytes.increase(size);
            return Ok(Some(HostBlock {
                id,
                size,
                segment: block.segment.clone(),
            }));
        }
        let start = Instant::now();
        let segment = self.source.allocate(size, kind)?;
        self.alloc_time.increase(micros(start));
        self.num_host_alloc += 1;
        let block = Block {
            size,
            kind,
            segment: segment.clone(),
            allocated: true,
            use_event: None,
        };
        let id = match self.vacant.pop() {
            Some(id) => {
                self.blocks[id] = Some(block);
                id
            }
            None => {
                self.blocks.push(Some(block));
                self.blocks.len() - 1
            }
        };
        let s = &mut self.buckets[b];
        s.allocations.increase(1);
        s.allocated_bytes.increase(size);
        s.active_requests.increase(1);
        s.active_bytes.increase(size);
        Ok(Some(HostBlock { id, size, segment }))
    }

    /// Notes that a copy in the submission `event` uses the block (PyTorch's `record_event`,
    /// which non-blocking copies call): the block is not reused before that event completes.
    pub fn record_event(&mut self, id: usize, event: u64) {
        if let Some(Some(b)) = self.blocks.get_mut(id) {
            if b.allocated {
                b.use_event = Some(b.use_event.map_or(event, |e| e.max(event)));
            }
        }
    }

    /// Returns a block: to its free list at once, or, if a copy used it, once that copy's event
    /// has completed.
    pub fn free(&mut self, id: usize) {
        let Some(Some(b)) = self.blocks.get_mut(id) else {
            return;
        };
        if !b.allocated {
            return;
        }
        b.allocated = false;
        match b.use_event.take() {
            Some(event) => self.events.push_front((event, id)),
            None => self.push_free(id),
        }
    }

    fn push_free(&mut self, id: usize) {
        let b = self.blocks[id].as_ref().expect("block exists");
        let (size, kind) = (b.size, b.kind);
        let k = bucket(size);
        self.free_lists[kind.index()][k].push(id);
        self.buckets[k].active_requests.decrease(1);
        self.buckets[k].active_bytes.decrease(size);
    }

    /// Moves blocks whose events completed to their free lists, oldest first, stopping at the
    /// first event still running (PyTorch's `process_events`).
    pub fn process_events(&mut self) {
        while let Some(&(event, id)) = self.events.back() {
            if !self.source.event_completed(event) {
                return;
            }
            self.events.pop_back();
            self.push_free(id);
        }
    }

    /// Frees every cached block (`torch._C._host_emptyCache()`); blocks in use or waiting for
    /// their copies stay.
    pub fn empty_cache(&mut self) {
        self.process_events();
        for kind in 0..2 {
            for b in 0..BUCKETS {
                for id in std::mem::take(&mut self.free_lists[kind][b]) {
                    let block = self.blocks[id].take().expect("listed blocks exist");
                    self.vacant.push(id);
                    let start = Instant::now();
                    self.source.free(block.segment);
                    self.free_time.increase(micros(start));
                    self.num_host_free += 1;
                    self.buckets[b].allocations.decrease(1);
                    self.buckets[b].allocated_bytes.decrease(block.size);
                }
            }
        }
    }

    /// The statistics, summed over buckets without processing events first (as PyTorch's
    /// `getStats`, which keeps it cheap).
    pub fn stats(&self) -> HostStats {
        let mut s = HostStats::default();
        let add = |acc: &mut Stat, o: &Stat| {
            acc.current += o.current;
            acc.peak += o.peak;
            acc.allocated += o.allocated;
            acc.freed += o.freed;
        };
        for b in &self.buckets {
            add(&mut s.allocations, &b.allocations);
            add(&mut s.allocated_bytes, &b.allocated_bytes);
            add(&mut s.active_requests, &b.active_requests);
            add(&mut s.active_bytes, &b.active_bytes);
        }
        s.host_alloc_time = self.alloc_time;
        s.host_free_time = self.free_time;
        s.num_host_alloc = self.num_host_alloc;
        s.num_host_free = self.num_host_free;
        s
    }

    /// `torch.cuda.reset_peak_host_memory_stats()`.
    pub fn reset_peak_stats(&mut self) {
        for b in &mut self.buckets {
            for s in [
                &mut b.allocations,
                &mut b.allocated_bytes,
                &mut b.active_requests,
                &mut b.active_bytes,
            ] {
                s.peak = s.current;
            }
        }
        for d in [&mut self.alloc_time, &mut self.free_time] {
            d.max = 0;
            d.min = 0;
        }
    }

    /// `torch.cuda.reset_accumulated_host_memory_stats()`.
    pub fn reset_accumulated_stats(&mut self) {
        for b in &mut self.buckets {
            for s in [
                &mut b.allocations,
                &mut b.allocated_bytes,
                &mut b.active_requests,
                &mut b.active_bytes,
            ] {
                s.allocated = 0;
                s.freed = 0;
            }
        }
        for d in [&mut self.alloc_time, &mut self.free_time] {
            d.total = 0;
            d.count = 0;
        }
        self.num_host_alloc = 0;
        self.num_host_free = 0;
    }

    /// Blocks waiting for their copies' events.
    pub fn pending_events(&self) -> usize {
        self.events.len()
    }
}

/// Staging memory from the heap with events completed by hand: the policy's test source.
pub struct SimulatedPinnedSource {
    /// The highest event that counts as complete.
    pub completed: u64,
    /// Bytes of live staging memory.
    pub live_bytes: u64,
}

impl PinnedSource for SimulatedPinnedSource {
    type Segment = u64;
    fn allocate(&mut self, size_bytes: u64, _kind: PinnedKind) -> crate::Result<u64> {
        self.live_bytes += size_bytes;
        Ok(size_bytes)
    }
    fn free(&mut self, segment: u64) {
        self.live_bytes -= segment;
    }
    fn event_completed(&mut self, event: u64) -> bool {
        event <= self.completed
    }
}
