//! The pinned-memory cache's policy against PyTorch's CachingHostAllocator (spec section 9),
//! without a GPU: rounding, exact-bucket LIFO reuse, reuse only after a copy's event, the order
//! events are processed in, `empty_cache`, and the 28 statistics keys.

use kiln::host::{CachingHostAllocator, PinnedKind, SimulatedPinnedSource};

const UP: PinnedKind = PinnedKind::Upload;

fn allocator() -> CachingHostAllocator<SimulatedPinnedSource> {
    CachingHostAllocator::new(SimulatedPinnedSource {
        completed: 0,
        live_bytes: 0,
    })
}

fn stat(a: &CachingHostAllocator<SimulatedPinnedSource>, key: &str) -> i64 {
    a.stats().to_map()[key]
}

#[test]
fn sizes_round_to_powers_of_two_as_pytorch_observed() {
    let mut a = allocator();
    let sizes: Vec<u64> = [1000, 5000, (3 << 20) + 1]
        .iter()
        .map(|&n| a.allocate(n, UP).unwrap().unwrap().size)
        .collect();
    assert_eq!(sizes, vec![1024, 8192, 4 << 20]);
    // PyTorch 2.11: allocated_bytes.current 4203520 after these three.
    assert_eq!(stat(&a, "allocated_bytes.current"), 4_203_520);
    assert_eq!(stat(&a, "num_host_alloc"), 3);
    assert_eq!(a.source().live_bytes, 4_203_520);
    assert!(a.allocate(0, UP).unwrap().is_none());
    assert_eq!(stat(&a, "allocations.current"), 3);
}

#[test]
fn freed_blocks_are_reused_only_by_their_exact_bucket_last_in_first_out() {
    let mut a = allocator();
    let b1 = a.allocate(1000, UP).unwrap().unwrap();
    let b2 = a.allocate(5000, UP).unwrap().unwrap();
    let b3 = a.allocate(1024, UP).unwrap().unwrap();
    a.free(b1.id);
    a.free(b2.id);
    a.free(b3.id);
    assert_eq!(stat(&a, "active_requests.current"), 0);
    // 900 B and 4097 B requests reuse the 1024 and 8192 blocks (PyTorch's observation).
    let r1 = a.allocate(900, UP).unwrap().unwrap();
    assert_eq!(r1.id, b3.id, "last in, first out");
    let r2 = a.allocate(4097, UP).unwrap().unwrap();
    assert_eq!(r2.id, b2.id);
    assert_eq!(stat(&a, "num_host_alloc"), 3);
    // No splitting: a 512 B request does not take the free 1024 B block.
    let r3 = a.allocate(512, UP).unwrap().unwrap();
    assert_eq!((r3.size, stat(&a, "num_host_alloc")), (512, 4));
    // The other kind has its own lists.
    let r4 = a.allocate(1000, PinnedKind::Download).unwrap().unwrap();
    assert_ne!(r4.id, b1.id);
    assert_eq!(stat(&a, "num_host_alloc"), 5);
}

#[test]
fn a_block_used_by_a_copy_returns_only_after_its_event() {
    let mut a = allocator();
    let b = a.allocate(4096, UP).unwrap().unwrap();
    a.record_event(b.id, 5);
    a.free(b.id);
    assert_eq!(a.pending_events(), 1);
    // Still checked out until the copy's event completes.
    assert_eq!(stat(&a, "active_requests.current"), 1);
    let other = a.allocate(4096, UP).unwrap().unwrap();
    assert_ne!(other.id, b.id, "handed out again while its copy may run");
    assert_eq!(stat(&a, "num_host_alloc"), 2);
    a.source().completed = 5;
    a.free(other.id);
    let again = a.allocate(4096, UP).unwrap().unwrap();
    // The event completed: `b` goes back at this allocation, after `other` was freed, so last
    // in, first out gives `b`.
    assert_eq!(again.id, b.id);
    assert_eq!(a.pending_events(), 0);
    assert_eq!(stat(&a, "active_requests.current"), 1);
    let last = a.allocate(4096, UP).unwrap().unwrap();
    assert_eq!(last.id, other.id);
    assert_eq!(stat(&a, "num_host_alloc"), 2);
}

#[test]
fn events_are_processed_oldest_first_and_stop_at_the_first_running_one() {
    let mut a = allocator();
    let x = a.allocate(4096, UP).unwrap().unwrap();
    let y = a.allocate(4096, UP).unwrap().unwrap();
    a.record_event(x.id, 7);
    a.record_event(y.id, 3);
    a.free(x.id); // freed first: processed first
    a.free(y.id);
    a.source().completed = 5; // y's event is done, x's is not
    a.process_events();
    assert_eq!(a.pending_events(), 2, "x blocks the queue, as in PyTorch");
    a.source().completed = 7;
    a.process_events();
    assert_eq!(a.pending_events(), 0);
    assert_eq!(stat(&a, "active_requests.current"), 0);
}

#[test]
fn empty_cache_frees_cached_blocks_only_and_stats_follow() {
    let mut a = allocator();
    let blocks: Vec<_> = (0..3)
        .map(|i| a.allocate(1000 << i, UP).unwrap().unwrap())
        .collect();
    let kept = a.allocate(100, UP).unwrap().unwrap();
    let pending = a.allocate(64, UP).unwrap().unwrap();
    a.record_event(pending.id, 9);
    for b in &blocks {
        a.free(b.id);
    }
    a.free(pending.id);
    assert_eq!(stat(&a, "allocations.current"), 5);
    a.empty_cache();
    // PyTorch: allocations.current 3 -> 0 and num_host_free 0 -> 3 for three cached blocks.
    assert_eq!(stat(&a, "allocations.current"), 2);
    assert_eq!(stat(&a, "num_host_free"), 3);
    assert_eq!(stat(&a, "allocated_bytes.current"), 128 + 64);
    assert_eq!(stat(&a, "allocations.freed"), 3);
    assert_eq!(a.source().live_bytes, 128 + 64);
    a.free(kept.id);
    a.source().completed = 9;
    a.empty_cache();
    assert_eq!(stat(&a, "allocations.current"), 0);
    assert_eq!(a.source().live_bytes, 0);
    assert_eq!(stat(&a, "host_free_time.count"), 5);
}

#[test]
fn stats_have_pytorchs_28_keys_and_peaks_reset() {
    let mut a = allocator();
    let b = a.allocate(1 << 20, UP).unwrap().unwrap();
    let c = a.allocate(1 << 10, UP).unwrap().unwrap();
    a.free(b.id);
    a.free(c.id);
    let m = a.stats().to_map();
    let keys: Vec<&str> = m.keys().map(|k| k.as_str()).collect();
    let mut want = vec!["num_host_alloc", "num_host_free"];
    let stats = [
        "active_bytes",
        "active_requests",
        "allocated_bytes",
        "allocations",
    ];
    let fields = ["allocated", "current", "freed", "peak"];
    let names: Vec<String> = stats
        .iter()
        .flat_map(|s| fields.iter().map(move |f| format!("{s}.{f}")))
        .chain(["host_alloc_time", "host_free_time"].iter().flat_map(|t| {
            ["avg", "count", "max", "min", "total"]
                .iter()
                .map(move |f| format!("{t}.{f}"))
        }))
        .collect();
    want.extend(names.iter().map(|s| s.as_str()));
    want.sort();
    assert_eq!(keys, want);
    assert_eq!(m["active_bytes.peak"], (1 << 20) + (1 << 10));
    assert_eq!(m["host_alloc_time.count"], 2);
    a.reset_peak_stats();
    assert_eq!(stat(&a, "active_bytes.peak"), 0);
    assert_eq!(stat(&a, "allocated_bytes.peak"), (1 << 20) + (1 << 10));
    a.reset_accumulated_stats();
    assert_eq!(stat(&a, "num_host_alloc"), 0);
    assert_eq!(stat(&a, "allocations.allocated"), 0);
    assert_eq!(stat(&a, "allocations.current"), 2);
}
