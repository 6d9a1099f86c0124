//! kiln's virtual address space for segments. wgpu buffers have no device addresses, yet
//! PyTorch's policy orders free blocks by address (ties in best fit between segments) and
//! snapshots report addresses, so each segment gets an address here, placed as the CUDA driver
//! on the H100 places `cudaMalloc`s (measured with `tools/segment_addresses_in_torch.py`).
//!
//! The driver's rule, as far as it shows in 8 PyTorch traces and 24 raw `cudaMalloc`
//! sequences (see Note [Caching allocator] in ARCHITECTURE.md):
//! - Memory is reserved in *chunks*: a request takes `round_up(size, 32 MiB)` of address space,
//!   32 MiB aligned, at the highest free place below the chunk region's top (top-down). The
//!   unused tail of a chunk stays free for later, smaller requests.
//! - A request first tries the chunks that exist, newest first; within a chunk it takes the
//!   best-fitting free range (smallest, then lowest), at that range's low end.
//! - A chunk whose last allocation is freed goes back to the free address space.
//! - Two chunks exist before the first request, above the chunk region: the CUDA context's own,
//!   with 24 MiB (at top + 488 MiB) and 2 MiB (at top + 414 MiB, newer) free. The first small
//!   segments of a process land there, as they do under CUDA.
//!
//! With CUDA's own addresses every recorded trace replays exactly; with this model too. The
//! model is not the driver: on random raw sequences it follows CUDA's order for 72 segments on
//! average before the first difference (the old lowest-address model: 6).

use std::collections::BTreeMap;

/// Top of the chunk region: a CUDA-like address, so snapshots read familiarly.
const TOP: u64 = 0x7f00_0000_0000;
/// Where requests larger than everything below `TOP` go (only a simulated source could ask).
const BEYOND: u64 = 1 << 50;
const MIB: u64 = 1 << 20;
/// Segments are multiples of 2 MiB; ranges are kept at that granularity.
const GRANULE: u64 = 2 * MIB;
/// Granularity and alignment of the driver's reservations.
const CHUNK: u64 = 32 * MIB;
/// The CUDA context's chunks with free room, (offset above `TOP`, free bytes), oldest first.
const CONTEXT_CHUNKS: [(u64, u64); 2] = [(488 * MIB, 24 * MIB), (414 * MIB, 2 * MIB)];

/// Free ranges, start -> length, coalesced.
#[derive(Debug, Default)]
struct Ranges(BTreeMap<u64, u64>);

impl Ranges {
    fn insert(&mut self, start: u64, len: u64) {
        let (mut start, mut len) = (start, len);
        if let Some((&prev, &plen)) = self.0.range(..start).next_back() {
            if prev + plen == start {
                self.0.remove(&prev);
                start = prev;
                len += plen;
            }
        }
        if let Some(next_len) = self.0.remove(&(start + len)) {
            len += next_len;
        }
        self.0.insert(start, len);
    }

    /// Removes `[start, start + len)`, which lies inside the free range at `at`.
    fn take(&mut self, at: u64, start: u64, len: u64) {
        let range_len = self.0.remove(&at).expect("taken from a free range");
        if start > at {
            self.0.insert(at, start - at);
        }
        let end = at + range_len;
        if start + len < end {
            self.0.insert(start + len, end - start - len);
        }
    }
}

#[derive(Debug)]
struct Chunk {
    start: u64,
    len: u64,
    free: Ranges,
    /// Segments placed in the chunk.
    live: usize,
    /// The context's chunks are never given back.
    pinned: bool,
}

#[derive(Debug)]
pub(crate) struct VaSpace {
    /// Chunks in creation order (searched newest first).
    chunks: Vec<Chunk>,
    /// Address space below `TOP` that no chunk holds.
    unreserved: Ranges,
    /// Next address for a request that does not fit below `TOP`.
    beyond: u64,
}

impl VaSpace {
    pub fn new() -> Self {
        let chunks = CONTEXT_CHUNKS
            .iter()
            .map(|&(offset, len)| {
                let mut free = Ranges::default();
                free.insert(TOP + offset, len);
                Chunk {
                    start: TOP + offset,
                    len,
                    free,
                    live: 0,
                    pinned: true,
                }
            })
            .collect();
        let mut unreserved = Ranges::default();
        unreserved.insert(0, TOP);
        VaSpace {
            chunks,
            unreserved,
            beyond: BEYOND,
        }
    }

    /// Places a segment of `size` bytes and returns its address.
    pub fn reserve(&mut self, size: u64) -> u64 {
        let size = size.div_ceil(GRANULE) * GRANULE;
        for chunk in self.chunks.iter_mut().rev() {
            let best = chunk
                .free
                .0
                .iter()
                .filter(|(_, &len)| len >= size)
                .min_by_key(|(&start, &len)| (len, start))
                .map(|(&start, _)| start);
            if let Some(start) = best {
                chunk.free.take(start, start, size);
                chunk.live += 1;
                return start;
            }
        }
        let len = size.div_ceil(CHUNK) * CHUNK;
        let place = self.unreserved.0.iter().rev().find_map(|(&at, &range)| {
            let start = (at + range).checked_sub(len)? / CHUNK * CHUNK;
            (start >= at).then_some((at, start))
        });
        let start = match place {
            Some((at, start)) => {
                self.unreserved.take(at, start, len);
                start
            }
            None => {
                let start = self.beyond;
                self.beyond += len;
                start
            }
        };
        let mut free = Ranges::default();
        if len > size {
            free.insert(start + size, len - size);
        }
        self.chunks.push(Chunk {
            start,
            len,
            free,
            live: 1,
            pinned: false,
        });
        start
    }

    /// Frees a segment's range; a chunk left empty returns to the free address space.
    pub fn release(&mut self, start: u64, size: u64) {
        let size = size.div_ceil(GRANULE) * GRANULE;
        let Some(i) = self
            .chunks
            .iter()
            .position(|c| c.start <= start && start < c.start + c.len)
        else {
            debug_assert!(false, "release of an address kiln did not hand out");
            return;
        };
        let chunk = &mut self.chunks[i];
        chunk.free.insert(start, size);
        chunk.live -= 1;
        if chunk.live == 0 && !chunk.pinned {
            let chunk = self.chunks.remove(i);
            if chunk.start < TOP {
                self.unreserved.insert(chunk.start, chunk.len);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replays a segment sequence (`+n`: allocate n MiB, `-k`: free the k-th allocation) and
    /// returns each allocation's address in MiB relative to the lowest.
    fn place(ops: &[i64]) -> Vec<i64> {
        let mut va = VaSpace::new();
        let mut addrs = Vec::new();
        let mut sizes = Vec::new();
        for &op in ops {
            if op > 0 {
                addrs.push(va.reserve(op as u64 * MIB));
                sizes.push(op as u64 * MIB);
            } else {
                let k = (-op) as usize;
                va.release(addrs[k], sizes[k]);
            }
        }
        let low = *addrs.iter().min().unwrap();
        addrs.iter().map(|&a| ((a - low) / MIB) as i64).collect()
    }

    /// CUDA's segment addresses for `boundaries_0` on the H100 (MiB above the lowest):
    /// 510:2 584:2 586:20 64:10 74:12 32:20 0:22.
    #[test]
    fn boundaries_0_lands_where_cuda_put_it() {
        assert_eq!(
            place(&[2, 2, 20, 10, 12, 20, 22]),
            [510, 584, 586, 64, 74, 32, 0]
        );
    }

    /// CUDA's addresses for the start of `mixed_pow2div_31` (roundup_power2_divisions:4):
    /// a freed chunk is reused, top-down, and a chunk's tail serves a later small request.
    #[test]
    fn pow2div_31_reuses_freed_chunks_top_down() {
        // A798:2 A872:2 A352:24 A874:20 F352 F872 A872:2 A352:14 A320:24 A288:20 A256:32
        // A192:64 A128:48 F320 F256 F352 F288 A352:28 F192 A176:16 A380:2
        let got = place(&[
            2, 2, 24, 20, -2, -1, 2, 14, 24, 20, 32, 64, 48, -6, -8, -5, -7, 28, -9, 16, 2,
        ]);
        assert_eq!(
            got,
            [670, 744, 224, 746, 744, 224, 192, 160, 128, 64, 0, 224, 48, 252]
        );
    }

    /// Replays one recorded sequence (`[op, MiB above the lowest, MiB]`) through the model and
    /// returns the model's addresses (MiB above the lowest) and the index of the first
    /// allocation whose order against the live segments differs from CUDA's (`None`: none).
    fn follow(seq: &[(String, u64, u64)]) -> (Vec<u64>, Option<usize>) {
        let mut va = VaSpace::new();
        let mut live: Vec<(u64, u64, u64)> = Vec::new(); // (cuda, model, size)
        let (mut placed, mut first_diff) = (Vec::new(), None);
        for (i, (op, cuda, mib)) in seq.iter().enumerate() {
            let size = mib.div_ceil(2) * 2 * MIB;
            if op == "A" {
                let model = va.reserve(size);
                let agrees = live.iter().all(|&(c, m, _)| (c < *cuda) == (m < model));
                if !agrees && first_diff.is_none() {
                    first_diff = Some(i);
                }
                live.push((*cuda, model, size));
                placed.push(model);
            } else {
                let k = live.iter().position(|&(c, _, _)| c == *cuda).unwrap();
                let (_, model, size) = live.swap_remove(k);
                va.release(model, size);
            }
        }
        let low = placed.iter().copied().min().unwrap_or(0);
        (placed.iter().map(|a| (a - low) / MIB).collect(), first_diff)
    }

    type Recorded = std::collections::BTreeMap<String, Vec<(String, u64, u64)>>;

    fn recorded() -> (Recorded, Recorded) {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/cuda/segments.json"
        );
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let parse = |k: &str| serde_json::from_value::<Recorded>(v[k].clone()).unwrap();
        (parse("traces"), parse("raw"))
    }

    /// CUDA's own segment addresses for every trace (recorded on the H100): five are
    /// reproduced to the MiB. In the other three the model first orders a segment differently
    /// at the pinned event (CUDA then leaves a freed chunk unused, a rule not yet understood),
    /// yet no best-fit tie depends on it: all eight replay exactly (tests/alloc_traces.rs).
    #[test]
    fn follows_cuda_on_the_recorded_traces() {
        let (traces, _) = recorded();
        assert_eq!(traces.len(), 8);
        for (name, seq) in &traces {
            let (placed, first_diff) = follow(seq);
            let cuda: Vec<u64> = seq.iter().filter(|e| e.0 == "A").map(|e| e.1).collect();
            match name.as_str() {
                "mixed_11" => assert_eq!(first_diff, Some(9), "{name}"),
                "mixed_maxsplit_21" => assert_eq!(first_diff, Some(12), "{name}"),
                "mixed_pow2div_31" => assert_eq!(first_diff, Some(24), "{name}"),
                _ => assert_eq!(placed, cuda, "{name}"),
            }
        }
    }

    /// Raw cudaMalloc/cudaFree sequences: how long the model keeps CUDA's order. Pinned so that
    /// a change to the model shows whether it follows the driver better or worse.
    #[test]
    fn follows_cuda_on_raw_sequences() {
        let (_, raw) = recorded();
        assert_eq!(raw.len(), 24);
        let firsts: Vec<usize> = raw
            .values()
            .map(|seq| follow(seq).1.unwrap_or(seq.len()))
            .collect();
        let mean = firsts.iter().sum::<usize>() as f64 / firsts.len() as f64;
        assert!(
            (mean - 71.67).abs() < 0.01,
            "mean first difference {mean}: {firsts:?}"
        );
    }

    #[test]
    fn an_emptied_chunk_returns_and_the_context_chunks_stay() {
        let mut va = VaSpace::new();
        let a = va.reserve(40 * MIB);
        assert_eq!(a, TOP - 64 * MIB);
        va.release(a, 40 * MIB);
        assert_eq!(va.reserve(64 * MIB), TOP - 64 * MIB);
        let small = va.reserve(2 * MIB);
        assert_eq!(small, TOP + 414 * MIB);
        va.release(small, 2 * MIB);
        assert_eq!(va.reserve(2 * MIB), TOP + 414 * MIB);
    }

    #[test]
    fn a_request_larger_than_the_space_below_goes_beyond() {
        let mut va = VaSpace::new();
        let huge = 1 << 48;
        assert_eq!(va.reserve(huge), BEYOND);
        assert_eq!(va.reserve(huge), BEYOND + huge);
        va.release(BEYOND, huge);
        assert_eq!(va.reserve(32 * MIB), TOP - 32 * MIB);
    }
}
