//! The allocator's policy against PyTorch's figures (spec §1-§4, observed on torch 2.11, H100),
//! through the public API with a simulated device.

use kiln::alloc::*;
use kiln::Error;

const MIB: u64 = 1 << 20;

fn allocator(conf: &str, capacity: Option<u64>) -> CachingAllocator<SimulatedSource> {
    CachingAllocator::new(
        SimulatedSource::new(capacity),
        AllocatorConfig::parse(conf).unwrap(),
    )
}

fn stat(a: &CachingAllocator<SimulatedSource>, key: &str) -> i64 {
    a.stats().to_map()[key]
}

/// Spec §1 golden table: request -> block size, pool, segment size, blocks in the segment.
#[test]
fn golden_table_of_rounding_pools_and_segments() {
    let cases: &[(u64, u64, &str, u64, &[u64])] = &[
        (1, 512, "small", 2 * MIB, &[512, 2096640]),
        (511, 512, "small", 2 * MIB, &[512, 2096640]),
        (513, 1024, "small", 2 * MIB, &[1024, 2096128]),
        (1048575, MIB, "small", 2 * MIB, &[MIB, MIB]),
        (1048576, MIB, "small", 2 * MIB, &[MIB, MIB]),
        (1048577, 1049088, "large", 20 * MIB, &[1049088, 19922432]),
        (10485759, 10 * MIB, "large", 10 * MIB, &[10 * MIB]),
        (10485761, 10486272, "large", 12 * MIB, &[10486272, 2096640]),
        (11534337, 12 * MIB, "large", 12 * MIB, &[12 * MIB]),
        (19 * MIB + MIB / 2, 20 * MIB, "large", 20 * MIB, &[20 * MIB]),
        (21 * MIB, 22 * MIB, "large", 22 * MIB, &[22 * MIB]),
        (
            104857601,
            104858112,
            "large",
            102 * MIB,
            &[104858112, 2096640],
        ),
    ];
    for &(request, block, pool, segment, blocks) in cases {
        let mut a = allocator("", None);
        let b = a.malloc(request, 0).unwrap().unwrap();
        assert_eq!(b.size, block, "request {request}");
        assert_eq!(stat(&a, "allocated_bytes.all.current") as u64, block);
        assert_eq!(stat(&a, "requested_bytes.all.current") as u64, request);
        assert_eq!(stat(&a, "reserved_bytes.all.current") as u64, segment);
        let segs = a.segments_snapshot(0);
        assert_eq!(segs.len(), 1);
        assert_eq!(segs[0].segment_type, pool);
        let sizes: Vec<u64> = segs[0].blocks.iter().map(|b| b.size).collect();
        assert_eq!(sizes, blocks, "request {request}");
    }
}

#[test]
fn roundup_power2_divisions_matches_observed() {
    let a = allocator("roundup_power2_divisions:4", None);
    for (request, rounded) in [
        (600, 1024),
        (1228800, 1310720),
        (1331200, 1572864),
        (3145729, 3670016),
        (104857601, 117440512),
    ] {
        assert_eq!(a.round_size(request), rounded, "{request}");
    }
    let a = allocator("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]", None);
    assert_eq!(a.round_size(1100 * MIB), 1280 * MIB);
    assert_eq!(a.round_size(2100 * MIB), 2304 * MIB);
    assert_eq!(a.round_size(600 * MIB + 1), 768 * MIB);
    assert_eq!(a.round_size(300 * MIB + 1), 300 * MIB + 512);
}

#[test]
fn zero_bytes_is_null_and_1eb_is_refused_without_stats() {
    let mut a = allocator("", None);
    assert!(a.malloc(0, 0).unwrap().is_none());
    let e = a.malloc(1 << 60, 0).unwrap_err();
    assert!(e.to_string().contains("more than 1EB"), "{e}");
    assert_eq!(
        a.stats(),
        &DeviceStats {
            max_split_size: -1,
            ..Default::default()
        }
    );
}

#[test]
fn split_carves_the_front_and_keeps_one_mib_remainders() {
    // 3, 4 and 12 MiB land at offsets 0, 3 and 7 MiB of one 20 MiB segment; the 12 MiB request
    // takes the whole 13 MiB remainder because exactly 1 MiB would remain.
    let mut a = allocator("", None);
    let x = a.malloc(3 * MIB, 0).unwrap().unwrap();
    let y = a.malloc(4 * MIB, 0).unwrap().unwrap();
    let z = a.malloc(12 * MIB, 0).unwrap().unwrap();
    assert_eq!((x.offset, y.offset, z.offset), (0, 3 * MIB, 7 * MIB));
    assert_eq!(z.size, 13 * MIB);
    assert_eq!(stat(&a, "segment.all.current"), 1);
}

#[test]
fn small_pool_packs_six_300k_blocks_per_segment() {
    let mut a = allocator("", None);
    for _ in 0..8 {
        a.malloc(300 * 1024, 0).unwrap();
    }
    assert_eq!(stat(&a, "segment.small_pool.current"), 2);
    assert_eq!(stat(&a, "inactive_split.small_pool.current"), 2);
}

#[test]
fn oversize_blocks_follow_max_split_size() {
    // A 10 MiB request never takes a cached 100 MiB oversize block.
    let mut a = allocator("max_split_size_mb:64", None);
    let big = a.malloc(100 * MIB, 0).unwrap().unwrap();
    a.free(big.addr).unwrap();
    let small = a.malloc(10 * MIB, 0).unwrap().unwrap();
    assert_eq!(stat(&a, "segment.all.current"), 2);
    a.free(small.addr).unwrap();
    // A 70 MiB request: the 100 MiB block is >= 70 + 20 MiB, so a new 70 MiB segment.
    let b70 = a.malloc(70 * MIB, 0).unwrap().unwrap();
    assert_eq!(stat(&a, "segment.all.current"), 3);
    a.free(b70.addr).unwrap();
    // A 90 MiB request: the best fit is the 100 MiB block (< 90 + 20 MiB), taken whole, unsplit.
    let b90 = a.malloc(90 * MIB, 0).unwrap().unwrap();
    assert_eq!(b90.size, 100 * MIB);
    assert_eq!(stat(&a, "allocated_bytes.all.current") as u64, 100 * MIB);
    assert_eq!(stat(&a, "requested_bytes.all.current") as u64, 90 * MIB);
    assert_eq!(stat(&a, "oversize_allocations.current"), 1);
    assert_eq!(stat(&a, "oversize_segments.current"), 2);
    assert_eq!(stat(&a, "max_split_size"), 64 * MIB as i64);
}

#[test]
fn release_available_cached_blocks_frees_an_oversize_block_without_sync() {
    // Spec §3 5c: M=64 MiB, 400 MiB cap, cached 300 MiB block, 200 MiB request succeeds with
    // no retry and no sync, one device free.
    let mut a = allocator("max_split_size_mb:64", None);
    a.set_memory_limit(Some(400 * MIB));
    let b = a.malloc(300 * MIB, 0).unwrap().unwrap();
    a.free(b.addr).unwrap();
    a.malloc(200 * MIB, 0).unwrap().unwrap();
    assert_eq!(stat(&a, "num_alloc_retries"), 0);
    assert_eq!(stat(&a, "num_device_free"), 1);
    assert_eq!(stat(&a, "num_sync_all_streams"), 0);
    assert_eq!(stat(&a, "reserved_bytes.all.current") as u64, 200 * MIB);
}

#[test]
fn oom_releases_cache_retries_once_and_reports_pytorch_facts() {
    let mut a = allocator("", Some(80 * MIB));
    let keep = a.malloc(3 * MIB, 0).unwrap().unwrap();
    let cached = a.malloc(30 * MIB, 0).unwrap().unwrap();
    a.free(cached.addr).unwrap();
    let err = a.malloc(70 * MIB, 0).unwrap_err();
    let Error::OutOfMemory(oom) = &err else {
        panic!("{err}")
    };
    assert_eq!(oom.alloc_size, 70 * MIB);
    assert_eq!(oom.requested, 70 * MIB);
    assert_eq!(stat(&a, "num_alloc_retries"), 1);
    assert_eq!(stat(&a, "num_ooms"), 1);
    assert_eq!(stat(&a, "num_sync_all_streams"), 1);
    assert_eq!(stat(&a, "num_device_free"), 1); // the cached 30 MiB segment went back
    let msg = err.to_string();
    assert!(
        msg.starts_with("kiln out of memory. Tried to allocate 70.00 MiB"),
        "{msg}"
    );
    assert!(
        msg.contains("has a total capacity of 80.00 MiB of which 60.00 MiB is free."),
        "{msg}"
    );
    assert!(msg.contains("Of the allocated memory 3.00 MiB is allocated by kiln, and 17.00 MiB is reserved by kiln but unallocated."), "{msg}");
    assert!(
        msg.contains("fragmentation.  See documentation for Memory Management  (https://"),
        "{msg}"
    );
    // Beyond PyTorch's message: the fragmentation, and whether expandable segments would help
    // (17 MiB cached free + 60 MiB free on the device >= 70 MiB).
    assert!(
        msg.contains("the largest free cached block is 17.00 MiB, so the 17.00 MiB reserved but unallocated is free but unusable"),
        "{msg}"
    );
    assert!(
        msg.contains("With KILN_ALLOC_CONF=expandable_segments:True this request would have fit."),
        "{msg}"
    );
    // The allocator is intact: the live block is still there and new allocations work.
    a.check_invariants().unwrap();
    a.free(keep.addr).unwrap();
    assert!(a.malloc(60 * MIB, 0).unwrap().is_some());
}

#[test]
fn fraction_caps_reserved_and_names_the_allowance() {
    let mut a = allocator("", Some(100 * MIB));
    a.set_memory_fraction(0.5).unwrap();
    assert_eq!(a.memory_limit(), Some(50 * MIB));
    let msg = a.malloc(60 * MIB, 0).unwrap_err().to_string();
    assert!(msg.contains("50.00 MiB allowed; "), "{msg}");
    assert!(a.set_memory_fraction(1.5).is_err());
    let mut unknown = CachingAllocator::new(SimulatedSource::new(None), AllocatorConfig::default());
    assert!(unknown
        .set_memory_fraction(0.5)
        .unwrap_err()
        .to_string()
        .contains("unknown"));
}

#[test]
fn garbage_collection_reclaims_old_cached_blocks_before_growing() {
    let mut a = allocator("garbage_collection_threshold:0.5", Some(1024 * MIB));
    a.set_memory_limit(Some(100 * MIB));
    let x = a.malloc(30 * MIB, 0).unwrap().unwrap();
    let y = a.malloc(30 * MIB, 0).unwrap().unwrap();
    a.free(x.addr).unwrap();
    a.free(y.addr).unwrap();
    // Reserved 60 MiB > 0.5 × 100 MiB: a 40 MiB request first frees aged cached blocks.
    a.malloc(40 * MIB, 0).unwrap().unwrap();
    assert_eq!(stat(&a, "num_device_free"), 2);
    assert_eq!(stat(&a, "num_alloc_retries"), 0);
    assert_eq!(stat(&a, "reserved_bytes.all.current") as u64, 40 * MIB);
}

#[test]
fn recorded_use_defers_reuse_until_synchronised() {
    let mut a = allocator("", None);
    let b = a.malloc(4 * MIB, 0).unwrap().unwrap();
    a.record_use(b.addr, 7).unwrap();
    a.free(b.addr).unwrap();
    assert_eq!(stat(&a, "allocated_bytes.all.current"), 0);
    assert_eq!(stat(&a, "active_bytes.all.current") as u64, 4 * MIB);
    assert_eq!(stat(&a, "requested_bytes.all.current") as u64, 4 * MIB);
    assert_eq!(
        a.segments_snapshot(0)[0].blocks[0].state,
        BlockState::ActivePendingFree
    );
    a.empty_cache();
    assert_eq!(stat(&a, "active_bytes.all.current"), 0);
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 0);
    assert!(matches!(a.free(b.addr), Err(Error::InvalidPointer { .. })));
}

#[test]
fn empty_cache_keeps_partially_used_segments() {
    let mut a = allocator("", None);
    let x = a.malloc(MIB + 1, 0).unwrap().unwrap();
    let y = a.malloc(MIB + 1, 0).unwrap().unwrap();
    a.free(x.addr).unwrap();
    a.empty_cache();
    assert_eq!(stat(&a, "reserved_bytes.all.current") as u64, 20 * MIB);
    assert_eq!(stat(&a, "num_sync_all_streams"), 1);
    a.free(y.addr).unwrap();
    a.empty_cache();
    assert_eq!(stat(&a, "reserved_bytes.all.current"), 0);
}

#[test]
fn history_ring_is_bounded_and_records_pytorch_actions() {
    let mut a = allocator("", None);
    a.record_memory_history(
        Some(HistoryEnabled::All),
        HistoryContext::All,
        HistoryStacks::Kiln,
        3,
    );
    let b = {
        let _scope = push_scope("## forward ##", "train.rs", 12);
        a.malloc(1000, 0).unwrap().unwrap()
    };
    a.free(b.addr).unwrap();
    let snap = a.snapshot(0);
    let actions: Vec<TraceAction> = snap.device_traces[0].iter().map(|t| t.action).collect();
    // segment_alloc, alloc, free_requested, free_completed: the ring keeps the last 3.
    assert_eq!(
        actions,
        [
            TraceAction::Alloc,
            TraceAction::FreeRequested,
            TraceAction::FreeCompleted
        ]
    );
    let alloc = &snap.device_traces[0][0];
    assert_eq!(alloc.size, 1000);
    assert_eq!(alloc.frames.as_ref().unwrap()[0].name, "## forward ##");
    // The snapshot entry is recorded after the copy: it shows in the next snapshot.
    let next = a.snapshot(0);
    assert_eq!(
        next.device_traces[0].last().unwrap().action,
        TraceAction::Snapshot
    );
    a.record_memory_history(None, HistoryContext::None, HistoryStacks::Kiln, 0);
    assert!(a.snapshot(0).device_traces[0].is_empty());
}

/// Spec §5 [obs]: 3 MiB, 25 MiB, 1000 B and 700 KiB with expandable_segments:True make one
/// large range with 40 MiB mapped (two 20 MiB maps: 3 | 25 | 12 free) and a small range with
/// 2 MiB; reserved 42 MiB, no segment counted, three maps; freeing the 25 MiB block and
/// emptying the cache unmaps the one page wholly inside free space (42 -> 22 MiB).
#[test]
fn expandable_segments_map_pages_as_pytorch_does() {
    let mut a = allocator("expandable_segments:True", None);
    a.record_memory_history(
        Some(HistoryEnabled::All),
        HistoryContext::All,
        HistoryStacks::Kiln,
        1000,
    );
    let three = a.malloc(3 * MIB, 0).unwrap().unwrap();
    let big = a.malloc(25 * MIB, 0).unwrap().unwrap();
    a.malloc(1000, 0).unwrap().unwrap();
    a.malloc(700 << 10, 0).unwrap().unwrap();
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (42 * MIB) as i64);
    assert_eq!(stat(&a, "segment.all.current"), 0);
    assert_eq!(stat(&a, "num_device_alloc"), 3);
    assert_eq!(
        big.addr,
        three.addr + 3 * MIB,
        "the 25 MiB block follows in the same range"
    );
    let snap = a.snapshot(0);
    let maps: Vec<u64> = snap.device_traces[0]
        .iter()
        .filter(|e| e.action == TraceAction::SegmentMap)
        .map(|e| e.size)
        .collect();
    assert_eq!(maps, vec![20 * MIB, 20 * MIB, 2 * MIB]);
    let mut segs: Vec<(String, u64, Vec<u64>, bool)> = snap
        .segments
        .iter()
        .map(|s| {
            let sizes = s.blocks.iter().map(|b| b.size).collect();
            (
                s.segment_type.to_string(),
                s.total_size,
                sizes,
                s.is_expandable,
            )
        })
        .collect();
    segs.sort();
    assert_eq!(
        segs,
        vec![
            (
                "large".into(),
                40 * MIB,
                vec![3 * MIB, 25 * MIB, 12 * MIB],
                true
            ),
            (
                "small".into(),
                2 * MIB,
                vec![1024, 700 << 10, 2 * MIB - 1024 - (700 << 10)],
                true
            ),
        ]
    );
    a.free(big.addr).unwrap();
    a.empty_cache();
    assert_eq!(stat(&a, "reserved_bytes.all.current"), (22 * MIB) as i64);
    assert_eq!(stat(&a, "num_device_free"), 1);
    a.check_invariants().unwrap();

    // A source without virtual memory (the CPU device's) keeps ordinary segments.
    let host = CachingAllocator::new(
        HostSource::new(None, "CPU"),
        AllocatorConfig::parse("expandable_segments:True").unwrap(),
    );
    assert!(!host.config().expandable_segments);
}

/// Blocks of `EXTERNAL_STREAM` (memory NCCL imports) get segments of their own, never shared
/// with the device queue's blocks and never expandable (an imported allocation cannot grow),
/// and count in every statistic as any block does.
#[test]
fn external_stream_blocks_live_in_plain_segments_of_their_own() {
    for conf in ["", "expandable_segments:True"] {
        let mut a = allocator(conf, None);
        let ordinary = a.malloc(3 * MIB, 0).unwrap().unwrap();
        let bucket = a.malloc(3 * MIB, EXTERNAL_STREAM).unwrap().unwrap();
        let small = a.malloc(1000, EXTERNAL_STREAM).unwrap().unwrap();
        assert_eq!(stat(&a, "allocation.all.current"), 3, "{conf}");
        let snap = a.snapshot(0);
        let seg_of = |addr: u64| {
            snap.segments
                .iter()
                .find(|s| s.address <= addr && addr < s.address + s.total_size)
                .expect("a segment holds the block")
        };
        let (o, b, s) = (
            seg_of(ordinary.addr),
            seg_of(bucket.addr),
            seg_of(small.addr),
        );
        assert_ne!(o.address, b.address, "{conf}: its own segment");
        assert_eq!((b.stream, s.stream), (EXTERNAL_STREAM, EXTERNAL_STREAM));
        assert!(!b.is_expandable && !s.is_expandable, "{conf}");
        assert_eq!(o.is_expandable, !conf.is_empty(), "{conf}");
        // Freed, an external block is reused only by the external stream.
        a.free(bucket.addr).unwrap();
        let again = a.malloc(3 * MIB, 0).unwrap().unwrap();
        assert_ne!(again.addr, bucket.addr, "{conf}");
        let ext_again = a.malloc(3 * MIB, EXTERNAL_STREAM).unwrap().unwrap();
        assert_eq!(ext_again.addr, bucket.addr, "{conf}");
    }
}
