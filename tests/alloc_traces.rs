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
    mixed_pow2div_31 => 400,
}
