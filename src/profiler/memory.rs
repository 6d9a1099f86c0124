//! The categorised memory timeline (PyTorch's `profile.export_memory_timeline`): bytes over
//! time on one device, split into PyTorch's categories. Each allocation counts under what it
//! held when it ended (the allocator writes that into the free's trace entry; for blocks still
//! alive at the end, their category then), from its allocation to its free; blocks alive when
//! profiling started count from the start.

use super::Profile;
use crate::alloc::{BlockState, MemoryCategory, Snapshot, TraceAction};
use crate::{Error, Result};
use std::collections::HashMap;
use std::path::Path;

/// One change of a device's categorised memory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryRecord {
    /// Index of the device in the profile.
    pub device: usize,
    /// Microseconds since the Unix epoch (PyTorch's timeline is in microseconds too).
    pub time_us: i64,
    /// Bytes allocated (positive) or freed (negative).
    pub bytes: i64,
    /// What the memory holds.
    pub category: MemoryCategory,
}

/// Live allocated blocks of a snapshot: address -> (requested bytes, category).
pub(super) fn live_blocks(snapshot: &Snapshot) -> HashMap<u64, (u64, MemoryCategory)> {
    snapshot
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state != BlockState::Inactive)
        .map(|b| (b.address, (b.requested_size, b.category)))
        .collect()
}

/// The records of one device: the blocks live at the start (at `start_us`), then each
/// allocation and completed free of `end`'s trace from `start_us` on, each under the category
/// its allocation ended with.
pub(super) fn records(
    device: usize,
    start: &HashMap<u64, (u64, MemoryCategory)>,
    start_us: i64,
    end: &Snapshot,
) -> Vec<MemoryRecord> {
    let alive = live_blocks(end);
    let trace: Vec<_> = end
        .device_traces
        .first()
        .map(|t| {
            t.iter()
                .filter(|e| e.time_us as i64 >= start_us)
                .filter(|e| matches!(e.action, TraceAction::Alloc | TraceAction::FreeCompleted))
                .collect()
        })
        .unwrap_or_default();
    // Walk backwards: each allocation takes the category of the next free at its address.
    let mut ending: HashMap<u64, MemoryCategory> = HashMap::new();
    let mut categories = vec![MemoryCategory::Unknown; trace.len()];
    for (i, e) in trace.iter().enumerate().rev() {
        let addr = e.addr.unwrap_or(0);
        match e.action {
            TraceAction::FreeCompleted => {
                ending.insert(addr, e.category);
                categories[i] = e.category;
            }
            _ => {
                categories[i] = ending
                    .remove(&addr)
                    .or_else(|| alive.get(&addr).map(|a| a.1))
                    .unwrap_or(e.category);
            }
        }
    }
    // Blocks live at the start end as their first free (before any new allocation at the
    // address) says, or as they are at the end.
    let mut start_end: HashMap<u64, MemoryCategory> = HashMap::new();
    let mut reused = std::collections::HashSet::new();
    for e in &trace {
        let addr = e.addr.unwrap_or(0);
        match e.action {
            TraceAction::Alloc => {
                reused.insert(addr);
            }
            _ if start.contains_key(&addr) && !reused.contains(&addr) => {
                start_end.entry(addr).or_insert(e.category);
            }
            _ => {}
        }
    }
    let mut out: Vec<MemoryRecord> = start
        .iter()
        .map(|(addr, &(bytes, category))| MemoryRecord {
            device,
            time_us: start_us,
            bytes: bytes as i64,
            category: start_end
                .get(addr)
                .copied()
                .or_else(|| {
                    (!reused.contains(addr))
                        .then(|| alive.get(addr).map(|a| a.1))
                        .flatten()
                })
                .unwrap_or(category),
        })
        .collect();
    for (e, category) in trace.iter().zip(categories) {
        let sign = if e.action == TraceAction::Alloc {
            1
        } else {
            -1
        };
        out.push(MemoryRecord {
            device,
            time_us: e.time_us as i64,
            bytes: sign * e.size as i64,
            category,
        });
    }
    out
}

/// Memory by category at the highest total of `records` (in time order), taken allocation by
/// allocation rather than from the coalesced timeline, where an allocation and a free in one
/// microsecond (as a dry run makes them) would hide a peak: each category with its bytes, in
/// PyTorch's order.
fn peak_of<'a>(records: impl Iterator<Item = &'a MemoryRecord>) -> Vec<(MemoryCategory, i64)> {
    let (mut now, mut peak) = ([0i64; 8], [0i64; 8]);
    for r in records {
        now[r.category.index()] += r.bytes;
        if now.iter().sum::<i64>() > peak.iter().sum::<i64>() {
            peak = now;
        }
    }
    MemoryCategory::ALL
        .iter()
        .map(|&c| (c, peak[c.index()]))
        .collect()
}

/// A device's memory by category at its highest total, from a snapshot whose trace was
/// recorded from the start (`record_memory_history` before the first allocation counted; the
/// ring must hold the whole run): what a dry run reports without a profiler around it.
pub fn peak_by_category(snapshot: &Snapshot) -> Vec<(MemoryCategory, i64)> {
    peak_of(records(0, &HashMap::new(), 0, snapshot).iter())
}

/// A device's memory by category over time, as PyTorch's `_coalesce_timeline` returns it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MemoryTimeline {
    /// Microseconds since the Unix epoch, one per distinct time.
    pub times_us: Vec<i64>,
    /// Bytes after each time: a leading 0, then one column per `MemoryCategory::ALL`.
    pub sizes: Vec<[i64; 9]>,
}

impl MemoryTimeline {
    /// The largest total over time.
    pub fn peak(&self) -> i64 {
        self.series().peak()
    }

    /// The series to draw (`viz`).
    pub fn series(&self) -> crate::viz::CategorySeries<'_> {
        crate::viz::CategorySeries {
            times_us: &self.times_us,
            sizes: &self.sizes,
        }
    }

    /// PyTorch's `.json` file: `[times, sizes]`.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&(&self.times_us, &self.sizes)).expect("plain numbers")
    }
}

impl Profile {
    /// The categorised timeline of profiled device `device` (an index into `devices`); empty
    /// unless profiled with `profile_memory`.
    pub fn memory_timeline(&self, device: usize) -> MemoryTimeline {
        let mut tl = MemoryTimeline::default();
        for r in self.memory.iter().filter(|r| r.device == device) {
            if tl.times_us.last() != Some(&r.time_us) {
                let last = tl.sizes.last().copied().unwrap_or([0; 9]);
                tl.times_us.push(r.time_us);
                tl.sizes.push(last);
            }
            let row = tl.sizes.last_mut().expect("pushed above");
            row[r.category.index() + 1] += r.bytes;
        }
        tl
    }

    /// Device `device`'s memory by category at its highest total (`peak_of`); empty unless
    /// profiled with `profile_memory`.
    pub fn peak_by_category(&self, device: usize) -> Vec<(MemoryCategory, i64)> {
        peak_of(self.memory.iter().filter(|r| r.device == device))
    }

    /// Writes the first profiled device's categorised memory timeline, chosen by the path's
    /// extension as PyTorch does: `.json` PyTorch's `[times, sizes]`; `.svg` or `.png` the
    /// stacked picture (PyTorch writes `.html` around a PNG; kiln writes the picture itself).
    pub fn export_memory_timeline(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let tl = self.memory_timeline(0);
        let title = format!(
            "{}: memory by category (peak {:.1} MiB)",
            self.devices.first().map_or("", |d| d.as_str()),
            tl.peak() as f64 / (1u64 << 20) as f64
        );
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        match ext {
            "json" => {
                crate::base::write_atomic("export_memory_timeline", path, tl.to_json().as_bytes())
            }
            "svg" => crate::viz::write_category_timeline_svg(&tl.series(), path, &title),
            "png" => crate::viz::write_category_timeline_png(&tl.series(), path, &title),
            _ => Err(Error::InvalidArgument {
                op: "export_memory_timeline",
                msg: format!(
                    "{}: the extension must be .json, .svg or .png",
                    path.display()
                ),
            }),
        }
    }
}
