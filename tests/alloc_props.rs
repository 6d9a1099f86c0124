//! Property tests on random alloc/free sequences: allocated <= reserved, segments do not
//! overlap, blocks tile their segments, no two free neighbours stay unmerged, and the
//! statistics equal a recount.

use kiln::alloc::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Alloc(u64),
    Free(usize),
    EmptyCache,
    ResetPeak,
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        1u64..4096,
        4096u64..(1 << 20),
        (1u64 << 20)..(12 << 20),
        (12u64 << 20)..(120 << 20),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => size().prop_map(Op::Alloc),
        5 => any::<usize>().prop_map(Op::Free),
        1 => Just(Op::EmptyCache),
        1 => Just(Op::ResetPeak),
    ]
}

fn conf() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        Just(""),
        Just("max_split_size_mb:40"),
        Just("roundup_power2_divisions:4"),
        Just("max_split_size_mb:20,roundup_power2_divisions:[1:2,64:8,>:1]"),
        Just("expandable_segments:True"),
        Just("expandable_segments:True,roundup_power2_divisions:4"),
        Just("expandable_segments:True,max_split_size_mb:40"),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn invariants_hold(conf in conf(), cap_mib in prop::option::of(64u64..600), ops in prop::collection::vec(op(), 1..200)) {
        let mut a = CachingAllocator::new(
            SimulatedSource::new(cap_mib.map(|m| m << 20)),
            AllocatorConfig::parse(conf).unwrap(),
        );
        let mut live: Vec<u64> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc(n) => match a.malloc(n, 0) {
                    Ok(Some(b)) => {
                        prop_assert!(b.size >= n && b.size % 512 == 0);
                        live.push(b.addr);
                    }
                    Ok(None) => unreachable!("sizes are positive"),
                    Err(kiln::Error::OutOfMemory(_)) => {}
                    Err(e) => prop_assert!(false, "unexpected error {e}"),
                },
                Op::Free(i) if !live.is_empty() => {
                    let addr = live.swap_remove(i % live.len());
                    a.free(addr).unwrap();
                }
                Op::Free(_) => {}
                Op::EmptyCache => a.empty_cache(),
                Op::ResetPeak => a.reset_peak_stats(),
            }
            if let Err(msg) = a.check_invariants() {
                prop_assert!(false, "{msg}");
            }
            let s = a.stats();
            prop_assert!(s.allocated_bytes.all().current <= s.reserved_bytes.all().current);
            prop_assert!(s.active_bytes.all().current >= s.allocated_bytes.all().current);
            prop_assert_eq!(s.allocation.all().current as usize, live.len());
            if let Some(cap) = cap_mib {
                prop_assert!(s.reserved_bytes.all().current as u64 <= cap << 20);
            }
        }
        for addr in live {
            a.free(addr).unwrap();
        }
        a.empty_cache();
        prop_assert_eq!(a.stats().reserved_bytes.all().current, 0);
        prop_assert_eq!(a.stats().inactive_split.all().current, 0);
    }
}
