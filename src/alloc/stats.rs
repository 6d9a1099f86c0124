//! PyTorch's allocator statistics: `Stat{current, peak, allocated, freed}`, per-pool arrays,
//! and the flat 122-key `memory_stats()` map.

use std::collections::BTreeMap;

/// One counter with its high-water mark and lifetime totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    /// The value now.
    pub current: i64,
    /// The highest value since the last peak reset.
    pub peak: i64,
    /// The total added since the last accumulated reset.
    pub allocated: i64,
    /// The total removed since the last accumulated reset.
    pub freed: i64,
}

impl Stat {
    pub(crate) fn increase(&mut self, n: u64) {
        self.current += n as i64;
        self.peak = self.peak.max(self.current);
        self.allocated += n as i64;
    }
    pub(crate) fn decrease(&mut self, n: u64) {
        self.current -= n as i64;
        self.freed += n as i64;
    }
    fn reset_peak(&mut self) {
        self.peak = self.current;
    }
    fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }
}

/// Which pool a block or segment belongs to; indexes a `StatArray` after `All`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PoolKind {
    /// Blocks of at most 1 MiB, from 2 MiB segments.
    Small,
    /// Larger blocks, from larger segments.
    Large,
}

impl PoolKind {
    /// `small` or `large`, as snapshots name the pool (`memory_stats` keys add `_pool`).
    pub fn name(self) -> &'static str {
        match self {
            PoolKind::Small => "small",
            PoolKind::Large => "large",
        }
    }
}

/// A `Stat` for all pools, the small pool and the large pool (PyTorch's index order).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatArray(pub [Stat; 3]);

impl StatArray {
    /// The pool names of `memory_stats` keys, `all` first.
    pub const POOL_NAMES: [&'static str; 3] = ["all", "small_pool", "large_pool"];

    /// Updates "all" and the block's own pool.
    pub(crate) fn increase(&mut self, pool: PoolKind, n: u64) {
        self.0[0].increase(n);
        self.0[Self::index(pool)].increase(n);
    }
    pub(crate) fn decrease(&mut self, pool: PoolKind, n: u64) {
        self.0[0].decrease(n);
        self.0[Self::index(pool)].decrease(n);
    }
    fn index(pool: PoolKind) -> usize {
        match pool {
            PoolKind::Small => 1,
            PoolKind::Large => 2,
        }
    }
    /// The statistic over both pools.
    pub fn all(&self) -> &Stat {
        &self.0[0]
    }
    /// The statistic of one pool.
    pub fn pool(&self, pool: PoolKind) -> &Stat {
        &self.0[Self::index(pool)]
    }
}

/// Everything `memory_stats()` reports for one device.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceStats {
    /// Blocks handed out (`allocation.*`).
    pub allocation: StatArray,
    /// Segments reserved (`segment.*`).
    pub segment: StatArray,
    /// Blocks in use or pending free (`active.*`).
    pub active: StatArray,
    /// Free blocks split off a larger one (`inactive_split.*`).
    pub inactive_split: StatArray,
    /// Bytes handed out (`allocated_bytes.*`).
    pub allocated_bytes: StatArray,
    /// Bytes reserved (`reserved_bytes.*`).
    pub reserved_bytes: StatArray,
    /// Bytes of active blocks (`active_bytes.*`).
    pub active_bytes: StatArray,
    /// Bytes of inactive split blocks (`inactive_split_bytes.*`).
    pub inactive_split_bytes: StatArray,
    /// Bytes asked for, before rounding (`requested_bytes.*`).
    pub requested_bytes: StatArray,
    /// Allocations above `max_split_size` (`oversize_allocations.*`).
    pub oversize_allocations: Stat,
    /// Segments above `max_split_size` (`oversize_segments.*`).
    pub oversize_segments: Stat,
    /// Allocations that released the cache and retried.
    pub num_alloc_retries: i64,
    /// Out-of-memory errors raised.
    pub num_ooms: i64,
    /// Times every stream was synchronised.
    pub num_sync_all_streams: i64,
    /// Segments reserved from the device.
    pub num_device_alloc: i64,
    /// Segments released to the device.
    pub num_device_free: i64,
    /// Fixed when the allocator is created (-1 = unlimited), as in PyTorch.
    pub max_split_size: i64,
}

impl DeviceStats {
    /// The nine arrays with their PyTorch names, in `memory_stats()` order of meaning.
    pub fn arrays(&self) -> [(&'static str, &StatArray); 9] {
        [
            ("allocation", &self.allocation),
            ("segment", &self.segment),
            ("active", &self.active),
            ("inactive_split", &self.inactive_split),
            ("allocated_bytes", &self.allocated_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("active_bytes", &self.active_bytes),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
        ]
    }

    /// Applies `f` to every `Stat` (all nine arrays and both oversize counters), so that a reset
    /// cannot forget one.
    fn for_each_stat(&mut self, mut f: impl FnMut(&mut Stat)) {
        let DeviceStats {
            allocation,
            segment,
            active,
            inactive_split,
            allocated_bytes,
            reserved_bytes,
            active_bytes,
            inactive_split_bytes,
            requested_bytes,
            oversize_allocations,
            oversize_segments,
            ..
        } = self;
        for arr in [
            allocation,
            segment,
            active,
            inactive_split,
            allocated_bytes,
            reserved_bytes,
            active_bytes,
            inactive_split_bytes,
            requested_bytes,
        ] {
            arr.0.iter_mut().for_each(&mut f);
        }
        f(oversize_allocations);
        f(oversize_segments);
    }

    /// `reset_peak_memory_stats`: peak := current everywhere.
    pub fn reset_peak(&mut self) {
        self.for_each_stat(Stat::reset_peak);
    }

    /// `reset_accumulated_memory_stats`: allocated := freed := 0 and the event counters to 0.
    pub fn reset_accumulated(&mut self) {
        self.for_each_stat(Stat::reset_accumulated);
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }

    /// The flat, sorted map of `torch.cuda.memory_stats()`: exactly 122 keys.
    pub fn to_map(&self) -> BTreeMap<String, i64> {
        let mut m = BTreeMap::new();
        let mut put = |prefix: &str, s: &Stat| {
            m.insert(format!("{prefix}.current"), s.current);
            m.insert(format!("{prefix}.peak"), s.peak);
            m.insert(format!("{prefix}.allocated"), s.allocated);
            m.insert(format!("{prefix}.freed"), s.freed);
        };
        for (name, arr) in self.arrays() {
            for (pool, s) in StatArray::POOL_NAMES.iter().zip(arr.0.iter()) {
                put(&format!("{name}.{pool}"), s);
            }
        }
        put("oversize_allocations", &self.oversize_allocations);
        put("oversize_segments", &self.oversize_segments);
        m.insert("num_alloc_retries".into(), self.num_alloc_retries);
        m.insert("num_ooms".into(), self.num_ooms);
        m.insert("num_sync_all_streams".into(), self.num_sync_all_streams);
        m.insert("num_device_alloc".into(), self.num_device_alloc);
        m.insert("num_device_free".into(), self.num_device_free);
        m.insert("max_split_size".into(), self.max_split_size);
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_map_has_pytorch_122_keys() {
        let m = DeviceStats::default().to_map();
        assert_eq!(m.len(), 122);
        assert!(m.contains_key("allocated_bytes.all.current"));
        assert!(m.contains_key("inactive_split_bytes.small_pool.freed"));
        assert!(m.contains_key("oversize_segments.peak"));
        assert!(m.contains_key("num_sync_all_streams"));
    }

    #[test]
    fn resets_follow_pytorch() {
        let mut s = DeviceStats::default();
        s.allocated_bytes.increase(PoolKind::Large, 100);
        s.allocated_bytes.decrease(PoolKind::Large, 60);
        s.oversize_allocations.increase(1);
        s.num_ooms = 3;
        s.reset_peak();
        assert_eq!(s.allocated_bytes.all().peak, 40);
        assert_eq!(s.allocated_bytes.pool(PoolKind::Large).peak, 40);
        s.reset_accumulated();
        assert_eq!(s.allocated_bytes.all().allocated, 0);
        assert_eq!(s.allocated_bytes.all().freed, 0);
        assert_eq!(s.allocated_bytes.all().current, 40);
        assert_eq!(s.oversize_allocations.allocated, 0);
        assert_eq!(s.num_ooms, 0);
    }
}
