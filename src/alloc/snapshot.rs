//! `memory_snapshot()`: segments and blocks with PyTorch's keys and states, the trace ring as
//! `device_traces`, and `allocator_settings`; serialisable to PyTorch's dict layout as JSON.

use super::caching::CachingAllocator;
use super::history::{Frame, TraceAction, TraceEntry};
use super::source::SegmentSource;
use serde::Serialize;
use std::collections::BTreeMap;

/// A block's state as PyTorch names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    /// Handed out and in use.
    ActiveAllocated,
    /// Freed by its owner, waiting for recorded uses to complete.
    ActivePendingFree,
    /// Free, in its pool.
    Inactive,
}

/// One block of a segment (PyTorch's snapshot `blocks` entry).
#[derive(Clone, Debug, Serialize)]
pub struct BlockInfo {
    /// The block's address.
    pub address: u64,
    /// Bytes of the block.
    pub size: u64,
    /// Bytes asked for (before rounding).
    pub requested_size: u64,
    /// Whether it is in use, pending free, or free.
    pub state: BlockState,
    /// Where it was allocated (with history on).
    pub frames: Vec<Frame>,
    /// kiln's: what an allocated block holds (not in PyTorch's snapshot files).
    #[serde(skip)]
    pub category: super::category::MemoryCategory,
}

/// One segment (PyTorch's snapshot `segments` entry).
#[derive(Clone, Debug, Serialize)]
pub struct SegmentInfo {
    /// The device index.
    pub device: u32,
    /// The segment's address.
    pub address: u64,
    /// Bytes of the segment.
    pub total_size: u64,
    /// Bytes of its allocated blocks.
    pub allocated_size: u64,
    /// Bytes of its active blocks.
    pub active_size: u64,
    /// Bytes asked for by its blocks' requests.
    pub requested_size: u64,
    /// The stream it belongs to.
    pub stream: u64,
    /// `small` or `large`.
    pub segment_type: &'static str,
    /// PyTorch's private-pool id; `(0, 0)` for the default pools.
    pub segment_pool_id: (u64, u64),
    /// Whether it is an expandable segment.
    pub is_expandable: bool,
    /// Where it was allocated (with history on).
    pub frames: Vec<Frame>,
    /// Its blocks, in address order.
    pub blocks: Vec<BlockInfo>,
}

/// The allocator settings a snapshot records, with PyTorch's keys.
#[derive(Clone, Debug, Serialize)]
pub struct AllocatorSettings {
    /// The configuration string in force.
    #[serde(rename = "PYTORCH_CUDA_ALLOC_CONF")]
    pub alloc_conf: String,
    /// Bytes, or -1 when unlimited.
    pub max_split_size: i64,
    /// `garbage_collection_threshold` (0 when off).
    pub garbage_collection_threshold: f64,
    /// Whether `expandable_segments` is on.
    pub expandable_segments: bool,
    /// PyTorch's pinned-memory registration threads (kiln: its default).
    pub pinned_num_register_threads: u32,
    /// PyTorch's setting of the same name (kiln: always false).
    pub release_lock_on_cudamalloc: bool,
    /// PyTorch's setting of the same name (kiln: always false).
    pub pinned_use_cuda_host_register: bool,
    /// PyTorch's setting of the same name (kiln: always false).
    pub graph_capture_record_stream_reuse: bool,
    /// Interval start in MB -> divisions.
    pub roundup_power2_divisions: BTreeMap<String, u64>,
}

/// `torch.cuda.memory._snapshot()`'s dict.
#[derive(Clone, Debug, Serialize)]
pub struct Snapshot {
    /// Every segment of every pool.
    pub segments: Vec<SegmentInfo>,
    /// The alloc/free history, one ring per device.
    pub device_traces: Vec<Vec<TraceEntry>>,
    /// The settings in force.
    pub allocator_settings: AllocatorSettings,
    /// PyTorch's external annotations (kiln: none).
    pub external_annotations: Vec<serde_json::Value>,
}

impl Snapshot {
    /// The snapshot as JSON (the same keys as the pickle).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("snapshot is plain data")
    }

    /// The dict as `torch.cuda.memory._dump_snapshot` pickles it (protocol 4), for
    /// pytorch.org/memory_viz and `python -m torch.cuda._memory_viz`.
    pub fn to_pickle(&self) -> Vec<u8> {
        super::pickle::to_pickle(self).expect("snapshot is plain data")
    }
}

impl<S: SegmentSource> CachingAllocator<S> {
    /// The segments of this device in address order, with their blocks.
    pub fn segments_snapshot(&self, device: u32) -> Vec<SegmentInfo> {
        let frames_of =
            |f: &Option<super::history::Frames>| f.as_deref().cloned().unwrap_or_default();
        // An expandable segment shows as one segment per run of mapped blocks, as PyTorch
        // reports it (and draws it in memory_viz).
        let runs: Vec<(usize, Vec<usize>)> = self
            .segment_blocks()
            .into_iter()
            .flat_map(|(sid, ids)| {
                let mut runs: Vec<Vec<usize>> = vec![Vec::new()];
                for id in ids {
                    if self.blocks[id].mapped {
                        runs.last_mut().expect("one run").push(id);
                    } else if runs.last().is_some_and(|r| !r.is_empty()) {
                        runs.push(Vec::new());
                    }
                }
                runs.into_iter()
                    .filter(|r| !r.is_empty())
                    .map(move |r| (sid, r))
            })
            .collect();
        runs.into_iter()
            .map(|(sid, ids)| {
                let seg = &self.segments[sid];
                let blocks: Vec<BlockInfo> = ids
                    .iter()
                    .map(|&id| {
                        let b = &self.blocks[id];
                        let state = if b.allocated {
                            BlockState::ActiveAllocated
                        } else if b.event_count > 0 {
                            BlockState::ActivePendingFree
                        } else {
                            BlockState::Inactive
                        };
                        BlockInfo {
                            address: b.addr,
                            size: b.size,
                            requested_size: b.requested_size,
                            category: b.category,
                            state,
                            frames: if state == BlockState::Inactive {
                                Vec::new()
                            } else {
                                frames_of(&b.frames)
                            },
                        }
                    })
                    .collect();
                let sum = |f: &dyn Fn(&BlockInfo) -> bool, v: &dyn Fn(&BlockInfo) -> u64| {
                    blocks.iter().filter(|b| f(b)).map(v).sum::<u64>()
                };
                let active = |b: &BlockInfo| b.state != BlockState::Inactive;
                // PyTorch reports the segment's frames only while its head block is the original.
                let head_frames = if blocks.first().is_some_and(|b| b.address == seg.base) {
                    frames_of(&seg.frames)
                } else {
                    Vec::new()
                };
                let (address, total_size) = (
                    blocks.first().map_or(seg.base, |b| b.address),
                    blocks.iter().map(|b| b.size).sum(),
                );
                SegmentInfo {
                    device,
                    address,
                    total_size,
                    allocated_size: sum(&|b| b.state == BlockState::ActiveAllocated, &|b| b.size),
                    active_size: sum(&active, &|b| b.size),
                    requested_size: sum(&active, &|b| b.requested_size),
                    stream: seg.stream,
                    segment_type: seg.pool.name(),
                    segment_pool_id: (0, 0),
                    is_expandable: seg.expandable,
                    frames: head_frames,
                    blocks,
                }
            })
            .collect()
    }

    /// The full snapshot. Like PyTorch, records a `snapshot` trace entry after copying the
    /// trace, so it shows up in the next snapshot.
    pub fn snapshot(&mut self, device: u32) -> Snapshot {
        let segments = self.segments_snapshot(device);
        let trace: Vec<TraceEntry> = self.history.ring.iter().cloned().collect();
        let active = self.stats.active_bytes.all().current as u64;
        self.trace(TraceAction::Snapshot, Some(0), active, 0, None);
        let c = &self.config;
        let roundup = c
            .roundup_power2_divisions
            .iter()
            .enumerate()
            .map(|(i, &d)| ((1u64 << i).to_string(), d))
            .collect();
        Snapshot {
            segments,
            device_traces: vec![trace],
            allocator_settings: AllocatorSettings {
                alloc_conf: c.source.clone(),
                max_split_size: if c.max_split_size == u64::MAX {
                    -1
                } else {
                    c.max_split_size as i64
                },
                garbage_collection_threshold: c.garbage_collection_threshold,
                expandable_segments: self.config.expandable_segments,
                pinned_num_register_threads: 1,
                release_lock_on_cudamalloc: false,
                pinned_use_cuda_host_register: false,
                graph_capture_record_stream_reuse: false,
                roundup_power2_divisions: roundup,
            },
            external_annotations: Vec::new(),
        }
    }
}
