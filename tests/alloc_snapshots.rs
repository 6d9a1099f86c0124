//! Golden (insta) snapshots of `memory_summary()` and of a snapshot's JSON for fixed sequences.

use kiln::alloc::*;

const MIB: u64 = 1 << 20;

fn fixed_sequence() -> CachingAllocator<SimulatedSource> {
    let mut a = CachingAllocator::new(SimulatedSource::new(None), AllocatorConfig::default());
    // The seed example of the traces: 300 MiB, 1000 B, 5 MiB live; a freed 2 GiB block.
    let big = a.malloc(2048 * MIB, 0).unwrap().unwrap();
    a.malloc(300 * MIB, 0).unwrap();
    a.malloc(1000, 0).unwrap();
    a.malloc(5 * MIB, 0).unwrap();
    a.free(big.addr).unwrap();
    a
}

#[test]
fn memory_summary_layout() {
    let a = fixed_sequence();
    insta::assert_snapshot!(
        "summary_full",
        memory_summary(
            a.stats(),
            "kiln memory summary, device 0 (simulated)",
            false
        )
    );
    insta::assert_snapshot!(
        "summary_abbreviated",
        memory_summary(a.stats(), "kiln memory summary, device 0 (simulated)", true)
    );
}

#[test]
fn snapshot_json_layout() {
    let mut a = fixed_sequence();
    let snap = a.snapshot(0);
    let mut v = serde_json::to_value(&snap).unwrap();
    // Addresses are kiln's virtual ones; keep them, they are deterministic.
    insta::assert_json_snapshot!("snapshot_segments", v["segments"].take());
    insta::assert_json_snapshot!("allocator_settings", v["allocator_settings"].take());
}
