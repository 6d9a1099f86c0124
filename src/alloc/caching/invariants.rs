//! Walking segments block by block: for snapshots, and the structural checks and statistic
//! recount that the property tests run after every step.

use super::{BlockId, CachingAllocator, SegmentId};
use crate::alloc::source::SegmentSource;
use crate::alloc::stats::PoolKind;

impl<S: SegmentSource> CachingAllocator<S> {
    /// Walks the blocks of every segment, in address order; for snapshots and invariants.
    pub(crate) fn segment_blocks(&self) -> Vec<(SegmentId, Vec<BlockId>)> {
        let mut segs: Vec<(SegmentId, Vec<BlockId>)> = self
            .segments
            .iter()
            .map(|(sid, seg)| {
                let mut ids = Vec::new();
                let mut cur = Some(seg.head);
                while let Some(id) = cur {
                    ids.push(id);
                    cur = self.blocks[id].next;
                }
                (sid, ids)
            })
            .collect();
        segs.sort_by_key(|(sid, _)| self.segments[*sid].base);
        segs
    }

    /// Checks the structural invariants and recounts the statistics from the blocks.
    /// Returns a description of the first violation. Used by property tests.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let mut allocated = [0u64; 2];
        let mut active = [0u64; 2];
        let mut reserved = [0u64; 2];
        let mut inactive_split = [0u64; 2];
        let idx = |p: PoolKind| (p == PoolKind::Large) as usize;
        let mut prev_end = 0;
        for (sid, ids) in self.segment_blocks() {
            let seg = &self.segments[sid];
            if seg.base < prev_end {
                return Err(format!("segment {:#x} overlaps the one below", seg.base));
            }
            prev_end = seg.base + seg.size;
            let mut addr = seg.base;
            // Free and mapped or not; neighbours of the same kind must have merged.
            let mut prev_free = None;
            for &id in &ids {
                let b = &self.blocks[id];
                if b.addr != addr {
                    return Err(format!(
                        "segment {:#x}: gap or overlap at {:#x}",
                        seg.base, addr
                    ));
                }
                addr += b.size;
                if b.mapped {
                    reserved[idx(seg.pool)] += b.size;
                }
                let free = (!b.allocated && b.event_count == 0).then_some(b.mapped);
                if free.is_some() && free == prev_free {
                    return Err(format!("two free neighbours unmerged at {:#x}", b.addr));
                }
                prev_free = free;
                if b.expandable != seg.expandable || (!b.mapped && !seg.expandable) {
                    return Err(format!("block {:#x} does not fit its segment", b.addr));
                }
                if !b.mapped {
                    continue;
                }
                if b.allocated {
                    allocated[idx(b.pool)] += b.size;
                }
                if b.allocated || b.event_count > 0 {
                    active[idx(b.pool)] += b.size;
                } else if ids.len() > 1 && !b.expandable {
                    inactive_split[idx(b.pool)] += b.size;
                }
            }
            if addr != seg.base + seg.size {
                return Err(format!("segment {:#x}: blocks do not tile it", seg.base));
            }
        }
        let s = &self.stats;
        for (name, arr, want) in [
            ("allocated_bytes", &s.allocated_bytes, allocated),
            ("active_bytes", &s.active_bytes, active),
            ("reserved_bytes", &s.reserved_bytes, reserved),
            (
                "inactive_split_bytes",
                &s.inactive_split_bytes,
                inactive_split,
            ),
        ] {
            for pool in [PoolKind::Small, PoolKind::Large] {
                let got = arr.pool(pool).current as u64;
                if got != want[idx(pool)] {
                    return Err(format!(
                        "{name}.{}: stat {got}, recount {}",
                        pool.name(),
                        want[idx(pool)]
                    ));
                }
            }
            if arr.all().current as u64 != want[0] + want[1] {
                return Err(format!("{name}.all disagrees with its pools"));
            }
        }
        if s.allocated_bytes.all().current > s.reserved_bytes.all().current {
            return Err("allocated > reserved".into());
        }
        Ok(())
    }
}
