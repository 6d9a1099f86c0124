//! Replays every trace recorded from PyTorch 2.11 on an H100 (`tests/fixtures/`) and compares all
//! 122 statistics after every event, each event's error, the final segments and the summary rows.

use kiln::alloc::replay::{AllocTrace, Mismatch};

fn replay(name: &str) -> Result<usize, Mismatch> {
    let path = format!("{}/tests/fixtures/{name}.json", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("fixture exists");
    AllocTrace::from_json(&text).unwrap().replay().unwrap()
}

macro_rules! trace_test {
    ($($name:ident => $events:expr),* $(,)?) => {$(
        #[test]
        fn $name() {
            assert_eq!(replay(stringify!($name)), Ok($events));
        }
    )*};
}

trace_test! {
    seed_example_0 => 10,
    boundaries_0 => 27,
    fragmentation_0 => 105,
    small_churn_1 => 300,
    mixed_11 => 400,
    mixed_maxsplit_21 => 400,
    oom_41 => 41,
}

/// Known divergence, kept exact so that it cannot move silently. At event 395 two free small
/// blocks of 393216 bytes tie for best fit; PyTorch orders ties by the CUDA driver's segment
/// addresses, and there the segment created at event 300 lies *below* the one created at event
/// 0. No address model that also reproduces `small_churn_1` (which needs ascending creation
/// order) yields that, and the trace does not record addresses. All 122 statistics match for
/// events 0..=397; the tie shows at event 398. PyTorch's own replay is deterministic; CUDA's
/// placement rule is described in ARCHITECTURE.md (Note [Caching allocator]).
#[test]
fn mixed_pow2div_31_matches_until_the_address_tie() {
    let m = replay("mixed_pow2div_31").unwrap_err();
    assert_eq!(m.event, Some(398), "{m}");
    assert_eq!(m.key, "inactive_split.all.current");
}
