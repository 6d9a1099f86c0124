//! Replays every trace recorded from PyTorch 2.11 on an H100 (`tests/fixtures/`) and compares all
//! 122 statistics after every event, each event's error, the final segments and the summary rows.

use kiln::alloc::replay::{AllocTrace, Mismatch};
use std::io::Read;

fn replay(name: &str) -> Result<usize, Mismatch> {
    let path = format!("{}/tests/fixtures/{name}.json", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("fixture exists");
    AllocTrace::from_json(&text).unwrap().replay().unwrap()
}

/// A gzipped trace.
fn read_gz(path: &std::path::Path) -> AllocTrace {
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    AllocTrace::from_json(&text).unwrap()
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

/// Further cases recorded the same way by `tools/record_trace_in_torch.py` (H100, PyTorch 2.11,
/// 2026-11-23): random sequences under each configuration kiln supports, including
/// `garbage_collection_threshold` with a memory limit and limits that make PyTorch run out of
/// memory (up to 24 times in one trace). Gzipped: each is 1.4-3.8 MB of statistics.
/// `recorded_small_*` (2026-11-24, `--small`): 800 events of many small blocks freed
/// and reallocated across several 2 MiB segments under roundup_power2_divisions, where best-fit
/// ties between segments fall to addresses; the replay compares the final segments' contents
/// too, so a block in another segment than PyTorch's fails here.
#[test]
fn recorded_cases_replay_exactly() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/recorded");
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    assert_eq!(names.len(), 14);
    let mut confs = std::collections::BTreeSet::new();
    for path in names {
        let trace = read_gz(&path);
        confs.insert(format!(
            "{:?} {:?}",
            trace.alloc_conf, trace.memory_limit_bytes
        ));
        let n = trace.events.len();
        assert_eq!(trace.replay().unwrap(), Ok(n), "{}", path.display());
    }
    assert_eq!(
        confs.len(),
        10,
        "every configuration of both recording modes"
    );
}

/// `expandable_segments:True`, recorded by `tools/record_trace_in_torch.py
/// --expandable` on the H100 (PyTorch 2.11, 2026-11-24): alone, under a memory limit, with
/// roundup_power2_divisions, garbage collection and max_split_size; large and small events.
/// Every statistic after every event, the errors, the final mapped runs and the summary.
#[test]
fn expandable_segments_replay_exactly() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/expandable");
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    assert_eq!(names.len(), 10);
    let mut failures = Vec::new();
    let mut total_maps = 0;
    for path in names {
        let trace = read_gz(&path);
        // The layout is compared too: the map/unmap sequence and every mapped run's blocks.
        let maps = trace.segment_maps.as_ref().map_or(0, Vec::len);
        let runs = trace.expected.segments.as_ref().map_or(0, Vec::len);
        assert!(
            maps >= 1 && runs >= 1,
            "{}: {maps} maps, {runs} runs",
            path.display()
        );
        total_maps += maps;
        let n = trace.events.len();
        let got = trace.replay().unwrap();
        if got != Ok(n) {
            failures.push(format!("{}: {got:?}", path.display()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        total_maps > 50,
        "{total_maps} map and unmap entries compared"
    );
}

/// The same traces through a fresh allocator on each adapter's real memory
/// (`Device::replay_trace`): segments are real buffers there. Expandable traces need sparse
/// binding, which CI's lavapipe lacks: there they are refused with the reason, and where an
/// adapter has it (an H100: BENCHMARKS.md) they replay too.
#[test]
fn traces_replay_on_real_device_memory() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let ordinary = read_gz(std::path::Path::new(&format!(
        "{dir}/recorded/recorded_100.json.gz"
    )));
    let expandable = read_gz(std::path::Path::new(&format!(
        "{dir}/expandable/recorded_expandable_500.json.gz"
    )));
    let devices = kiln::device::test_devices().expect("KILN_REQUIRE_GPU=1 and no GPU adapter");
    for dev in devices.iter().filter(|d| !d.is_cpu()) {
        let n = ordinary.events.len();
        assert_eq!(
            dev.replay_trace(&ordinary).unwrap(),
            Ok(n),
            "{}",
            dev.name()
        );
        let sparse = dev
            .adapter_info()
            .is_some_and(|a| a.features.sparse_binding);
        match dev.replay_trace(&expandable) {
            Ok(got) => {
                assert!(sparse, "{}: replayed without sparse binding", dev.name());
                assert_eq!(got, Ok(expandable.events.len()), "{}", dev.name());
            }
            Err(e) => {
                assert!(!sparse, "{}: {e}", dev.name());
                assert!(e.to_string().contains("sparse"), "{e}");
            }
        }
    }
}

/// A replay that drifts is caught where it drifts: one statistic after one event, the final
/// segments, a summary row, and the event count each changed in a copy of a trace give a
/// mismatch naming that place.
#[test]
fn a_changed_expectation_is_reported_where_it_differs() {
    let path = format!(
        "{}/tests/fixtures/mixed_11.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let drift = |change: &dyn Fn(&mut AllocTrace)| {
        let mut t = AllocTrace::from_json(&text).unwrap();
        change(&mut t);
        t.replay()
            .unwrap()
            .expect_err("a changed expectation must not replay")
    };

    let m = drift(&|t| {
        let step = &mut t.expected.steps[7];
        let key = step.stats.keys().next().unwrap().clone();
        *step.stats.get_mut(&key).unwrap() += 1;
    });
    assert_eq!(m.event, Some(7), "{m:?}");

    let m = drift(&|t| t.expected.segments_sorted_by_size[0].total_size += 512);
    assert!(m.event.is_none() && m.key.starts_with("segments["), "{m:?}");

    let m = drift(&|t| t.expected.summary = t.expected.summary.replacen('|', "!", 1));
    assert!(m.key.starts_with("summary line"), "{m:?}");

    let m = drift(&|t| {
        t.expected.steps.pop();
    });
    assert_eq!(m.key, "steps", "{m:?}");
}
