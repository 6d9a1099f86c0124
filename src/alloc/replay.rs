//! Replays allocator traces recorded from PyTorch (`tests/fixtures/*.json`, format in
//! `../shared/alloc-traces/README.md`) and compares every statistic after every event, the
//! error of every event, the final segments and the rows of the final `memory_summary()`.

use super::{memory_summary, AllocatorConfig, CachingAllocator, SegmentSource, SimulatedSource};
use crate::{Error, Result};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};

/// One event of a recorded allocator trace.
#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum TraceEvent {
    /// `torch.empty(size)` kept as `id`.
    Alloc {
        /// The allocation's id in the trace.
        id: u64,
        /// Bytes asked for.
        size: u64,
    },
    /// `del` of allocation `id`.
    Free {
        /// The allocation's id in the trace.
        id: u64,
    },
    /// `torch.cuda.empty_cache()`.
    EmptyCache,
    /// `torch.cuda.reset_peak_memory_stats()`.
    ResetPeak,
}

/// What PyTorch reported after one event.
#[derive(Debug, Deserialize)]
pub struct ExpectedStep {
    /// The error PyTorch raised, if the event failed (an out-of-memory message).
    pub error: Option<String>,
    /// `memory_stats()` after the event.
    pub stats: BTreeMap<String, i64>,
}

/// One block of a segment as PyTorch's snapshot lists it.
#[derive(Debug, Deserialize, PartialEq, Eq, PartialOrd, Ord, Clone)]
pub struct ExpectedBlock {
    /// Bytes of the block.
    pub size: u64,
    /// Bytes asked for (before rounding).
    pub requested_size: u64,
    /// `active_allocated`, `active_pending_free` or `inactive`.
    pub state: String,
}

/// One segment as PyTorch's snapshot lists it.
#[derive(Debug, Deserialize, PartialEq, Eq, PartialOrd, Ord, Clone)]
pub struct ExpectedSegment {
    /// Bytes of the segment.
    pub total_size: u64,
    /// Bytes of its allocated blocks.
    pub allocated_size: u64,
    /// Bytes of its active blocks.
    pub active_size: u64,
    /// Bytes asked for by its blocks' requests.
    pub requested_size: u64,
    /// `small` or `large`.
    pub segment_type: String,
    /// Its blocks, in address order.
    pub blocks: Vec<ExpectedBlock>,
}

/// Everything PyTorch reported for a trace.
#[derive(Debug, Deserialize)]
pub struct Expected {
    /// The statistics after each event.
    pub steps: Vec<ExpectedStep>,
    /// `memory_summary()` at the end.
    pub summary: String,
    /// The segments at the end, largest first.
    pub segments_sorted_by_size: Vec<ExpectedSegment>,
    /// The final segments with addresses (expandable recordings): their layout is compared
    /// relative to the range each lies in.
    #[serde(default)]
    pub segments: Option<Vec<LaidOutSegment>>,
}

/// A block at its address, as a replay laid it out.
#[derive(Debug, Deserialize, Clone)]
pub struct LaidOutBlock {
    /// The block's address.
    pub address: u64,
    /// Bytes of the block.
    pub size: u64,
    /// Bytes asked for.
    pub requested_size: u64,
    /// `active_allocated`, `active_pending_free` or `inactive`.
    pub state: String,
}

/// A segment at its address, as a replay laid it out.
#[derive(Debug, Deserialize, Clone)]
pub struct LaidOutSegment {
    /// The segment's address.
    pub address: u64,
    /// Bytes of the segment.
    pub total_size: u64,
    /// `small` or `large`.
    pub segment_type: String,
    /// Whether it is an expandable segment.
    pub is_expandable: bool,
    /// Its blocks, in address order.
    pub blocks: Vec<LaidOutBlock>,
}

/// A segment as its pool, its range, its offset in the range, its size, whether it is
/// expandable, and its blocks as (offset in the segment, size, requested size, state).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Relative {
    segment_type: String,
    range: usize,
    offset: u64,
    total_size: u64,
    is_expandable: bool,
    blocks: Vec<(u64, u64, u64, String)>,
}

fn relative(segs: &[LaidOutSegment], ranges: &mut Ranges) -> Vec<Relative> {
    let mut out: Vec<Relative> = segs
        .iter()
        .map(|s| {
            let (range, offset) = ranges.offset(s.address);
            Relative {
                segment_type: s.segment_type.clone(),
                range,
                offset,
                total_size: s.total_size,
                is_expandable: s.is_expandable,
                blocks: s
                    .blocks
                    .iter()
                    .map(|b| {
                        (
                            b.address - s.address,
                            b.size,
                            b.requested_size,
                            b.state.clone(),
                        )
                    })
                    .collect(),
            }
        })
        .collect();
    out.sort();
    out
}

/// A block state as PyTorch's snapshot spells it (`active_allocated`, ...).
fn state_name(state: super::BlockState) -> String {
    serde_json::to_value(state)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Addresses as (range, offset): a new range starts at an address no known range holds
/// (ranges lie further apart than this, and no trace maps this far into one).
struct Ranges(Vec<u64>);

const RANGE_WINDOW: u64 = 64 << 30;

impl Ranges {
    fn offset(&mut self, addr: u64) -> (usize, u64) {
        if let Some(i) = self
            .0
            .iter()
            .position(|&b| addr >= b && addr - b < RANGE_WINDOW)
        {
            return (i, addr - self.0[i]);
        }
        self.0.push(addr);
        (self.0.len() - 1, 0)
    }
}

/// One recorded case.
#[derive(Debug, Deserialize)]
pub struct AllocTrace {
    /// The trace's name.
    pub name: String,
    /// The `PYTORCH_CUDA_ALLOC_CONF` it was recorded under.
    pub alloc_conf: Option<String>,
    /// The memory limit it was recorded under, if any.
    pub memory_limit_bytes: Option<u64>,
    /// The events, in order.
    pub events: Vec<TraceEvent>,
    /// What PyTorch reported.
    pub expected: Expected,
    /// `segment_map`/`segment_unmap` (and `segment_alloc`/`segment_free`) trace entries as
    /// (action, address, size), where recorded.
    #[serde(default)]
    pub segment_maps: Option<Vec<(String, u64, u64)>>,
}

/// The first difference between kiln and PyTorch: `event K: key: got X, expected Y`.
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch {
    /// Event index, or `None` for the final segments and summary.
    pub event: Option<usize>,
    /// The statistic or item that differs.
    pub key: String,
    /// kiln's value.
    pub got: String,
    /// PyTorch's value.
    pub expected: String,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.event {
            Some(k) => write!(f, "event {k}: ")?,
            None => write!(f, "final: ")?,
        }
        write!(
            f,
            "{}: got {}, expected {}",
            self.key, self.got, self.expected
        )
    }
}

fn mismatch(event: Option<usize>, key: &str, got: String, expected: String) -> Mismatch {
    Mismatch {
        event,
        key: key.to_string(),
        got,
        expected,
    }
}

impl AllocTrace {
    /// Parses a trace file written by `tools/record_trace_in_torch.py`.
    pub fn from_json(text: &str) -> Result<Self> {
        serde_json::from_str(text).map_err(|e| Error::InvalidArgument {
            op: "AllocTrace::from_json",
            msg: e.to_string(),
        })
    }

    /// Replays the events through a fresh allocator on the simulated source; `Ok(events)` when
    /// everything matches.
    pub fn replay(&self) -> Result<std::result::Result<usize, Mismatch>> {
        self.replay_on(SimulatedSource::new(None))
    }

    /// The same on any source: a device's real memory (`Device::replay_trace`).
    pub fn replay_on<S: SegmentSource>(
        &self,
        source: S,
    ) -> Result<std::result::Result<usize, Mismatch>> {
        let config = match &self.alloc_conf {
            Some(c) => AllocatorConfig::parse(c)?,
            None => AllocatorConfig::default(),
        };
        if config.expandable_segments {
            if let Some(why) = source.expandable_unsupported() {
                return Err(Error::AllocConfig(format!(
                    "{}: expandable_segments:True cannot be replayed here: {why}",
                    self.name
                )));
            }
        }
        let mut alloc = CachingAllocator::new(source, config);
        alloc.set_memory_limit(self.memory_limit_bytes);
        if self.segment_maps.is_some() {
            alloc.record_memory_history(
                Some(super::HistoryEnabled::All),
                super::HistoryContext::All,
                super::HistoryStacks::Kiln,
                usize::MAX,
            );
        }
        if let Some(m) = self.events_mismatch(&mut alloc)? {
            return Ok(Err(m));
        }
        if let Some(m) = self
            .segments_mismatch(&alloc)
            .or_else(|| self.summary_mismatch(&alloc))
            .or_else(|| self.layout_mismatch(&mut alloc))
        {
            return Ok(Err(m));
        }
        alloc
            .check_invariants()
            .map_err(|msg| Error::InvalidArgument { op: "replay", msg })?;
        Ok(Ok(self.events.len()))
    }

    /// Runs the events, comparing the error and every statistic after each with PyTorch's.
    fn events_mismatch<S: SegmentSource>(
        &self,
        alloc: &mut CachingAllocator<S>,
    ) -> Result<Option<Mismatch>> {
        let mut live: HashMap<u64, u64> = HashMap::new();
        for (k, (event, step)) in self.events.iter().zip(&self.expected.steps).enumerate() {
            let mut error = None;
            match *event {
                TraceEvent::Alloc { id, size } => match alloc.malloc(size, 0) {
                    Ok(Some(b)) => {
                        live.insert(id, b.addr);
                    }
                    Ok(None) => {}
                    Err(Error::OutOfMemory(_)) => error = Some("oom".to_string()),
                    Err(e) => error = Some(e.to_string()),
                },
                // A free of an allocation that failed is a no-op, as `del` of nothing.
                TraceEvent::Free { id } => {
                    if let Some(addr) = live.remove(&id) {
                        alloc.free(addr)?;
                    }
                }
                TraceEvent::EmptyCache => alloc.empty_cache(),
                TraceEvent::ResetPeak => alloc.reset_peak_stats(),
            }
            if error != step.error {
                let (got, want) = (format!("{error:?}"), format!("{:?}", step.error));
                return Ok(Some(mismatch(Some(k), "error", got, want)));
            }
            let got = alloc.stats().to_map();
            if got.len() != step.stats.len() {
                let (got, want) = (got.len().to_string(), step.stats.len().to_string());
                return Ok(Some(mismatch(Some(k), "key count", got, want)));
            }
            for (key, want) in &step.stats {
                let have = got.get(key).copied();
                if have != Some(*want) {
                    let got = format!("{have:?}");
                    return Ok(Some(mismatch(Some(k), key, got, want.to_string())));
                }
            }
        }
        if self.events.len() != self.expected.steps.len() {
            let (got, want) = (self.events.len(), self.expected.steps.len());
            return Ok(Some(mismatch(
                None,
                "steps",
                got.to_string(),
                want.to_string(),
            )));
        }
        Ok(None)
    }

    /// The final segments against PyTorch's. PyTorch sorted them by size (stably, from real
    /// addresses); compared as sorted by (size, contents), so that ties between equal-size
    /// segments do not depend on addresses.
    fn segments_mismatch<S: SegmentSource>(&self, alloc: &CachingAllocator<S>) -> Option<Mismatch> {
        let mut got: Vec<ExpectedSegment> = alloc
            .segments_snapshot(0)
            .into_iter()
            .map(|s| ExpectedSegment {
                total_size: s.total_size,
                allocated_size: s.allocated_size,
                active_size: s.active_size,
                requested_size: s.requested_size,
                segment_type: s.segment_type.to_string(),
                blocks: s
                    .blocks
                    .into_iter()
                    .map(|b| ExpectedBlock {
                        size: b.size,
                        requested_size: b.requested_size,
                        state: state_name(b.state),
                    })
                    .collect(),
            })
            .collect();
        let mut want = self.expected.segments_sorted_by_size.clone();
        got.sort();
        want.sort();
        if got == want {
            return None;
        }
        let i = got
            .iter()
            .zip(&want)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(want.len()));
        Some(mismatch(
            None,
            &format!("segments[{i}] (of {} vs {})", got.len(), want.len()),
            format!("{:?}", got.get(i)),
            format!("{:?}", want.get(i)),
        ))
    }

    /// `memory_summary` against PyTorch's: every row but the title line.
    fn summary_mismatch<S: SegmentSource>(&self, alloc: &CachingAllocator<S>) -> Option<Mismatch> {
        let summary = memory_summary(alloc.stats(), "kiln memory summary, device 0", false);
        let want = &self.expected.summary;
        for (i, (a, b)) in summary.lines().zip(want.lines()).enumerate() {
            if i != 1 && a != b {
                let key = format!("summary line {i}");
                return Some(mismatch(None, &key, a.to_string(), b.to_string()));
            }
        }
        let (got, want) = (summary.lines().count(), want.lines().count());
        (got != want).then(|| mismatch(None, "summary lines", got.to_string(), want.to_string()))
    }

    /// Where recorded: the map/unmap sequence and the final segments' layout, each address as
    /// an offset into its range (kiln's addresses are its own, PyTorch's the driver's).
    fn layout_mismatch<S: SegmentSource>(
        &self,
        alloc: &mut CachingAllocator<S>,
    ) -> Option<Mismatch> {
        let mismatch = |key: String, got, expected| mismatch(None, &key, got, expected);
        if self.segment_maps.is_none() && self.expected.segments.is_none() {
            return None;
        }
        let (mut theirs, mut ours) = (Ranges(Vec::new()), Ranges(Vec::new()));
        let snap = alloc.snapshot(0);
        if let Some(maps) = &self.segment_maps {
            let want: Vec<(String, (usize, u64), u64)> = maps
                .iter()
                .map(|(a, addr, size)| (a.clone(), theirs.offset(*addr), *size))
                .collect();
            let got: Vec<(String, (usize, u64), u64)> = snap.device_traces[0]
                .iter()
                .filter_map(|e| {
                    let action = serde_json::to_value(e.action).ok()?.as_str()?.to_string();
                    action
                        .starts_with("segment_")
                        .then(|| (action, ours.offset(e.addr.unwrap_or(0)), e.size))
                })
                .collect();
            if let Some(i) = (0..got.len().max(want.len())).find(|&i| got.get(i) != want.get(i)) {
                return Some(mismatch(
                    format!(
                        "segment trace entry {i} (of {} vs {})",
                        got.len(),
                        want.len()
                    ),
                    format!("{:?}", got.get(i)),
                    format!("{:?}", want.get(i)),
                ));
            }
        }
        let want = relative(self.expected.segments.as_ref()?, &mut theirs);
        let laid: Vec<LaidOutSegment> = snap
            .segments
            .iter()
            .map(|s| LaidOutSegment {
                address: s.address,
                total_size: s.total_size,
                segment_type: s.segment_type.to_string(),
                is_expandable: s.is_expandable,
                blocks: s
                    .blocks
                    .iter()
                    .map(|b| LaidOutBlock {
                        address: b.address,
                        size: b.size,
                        requested_size: b.requested_size,
                        state: state_name(b.state),
                    })
                    .collect(),
            })
            .collect();
        let got = relative(&laid, &mut ours);
        let i = (0..got.len().max(want.len())).find(|&i| got.get(i) != want.get(i))?;
        Some(mismatch(
            format!("laid-out segment {i} (of {} vs {})", got.len(), want.len()),
            format!("{:?}", got.get(i)),
            format!("{:?}", want.get(i)),
        ))
    }
}
