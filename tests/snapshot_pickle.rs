//! `dump_snapshot` writes the dict PyTorch's `_dump_snapshot` writes: read back with Python's own
//! `pickle` (CI has python3), it equals the JSON form, has the structure `_memory_viz` and the
//! browser viewer read, and its frames name kiln's ops, backward ops, modules, the optimizer and
//! the user's scopes. The pickle encoder's integers, floats and strings are checked on edge
//! values against Python too.

use kiln::alloc::{HistoryContext, HistoryEnabled, HistoryStacks};
use kiln::nn::{cross_entropy, Linear, Module, Relu, Sequential};
use kiln::optim::{Optimizer, Sgd};
use kiln::{DType, Tensor};
use std::path::PathBuf;
use std::process::Command;

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-snapshot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn python(script: &str, args: &[&PathBuf]) -> String {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("python3 runs (CI installs it)");
    assert!(
        out.status.success(),
        "python3 failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const CHECK: &str = r#"
import json, pickle, sys
with open(sys.argv[1], "rb") as f:
    raw = f.read()
assert raw[:2] == b"\x80\x04", raw[:2]
snap = pickle.loads(raw)
with open(sys.argv[2]) as f:
    js = json.load(f)
def lists(x):
    if isinstance(x, (list, tuple)): return [lists(v) for v in x]
    if isinstance(x, dict): return {k: lists(v) for k, v in x.items()}
    return x
# The JSON was dumped second: its trace ends with the first dump's `snapshot` entry.
assert js["device_traces"][0][-1]["action"] == "snapshot"
js["device_traces"][0].pop()
assert lists(snap) == js, "pickle and JSON differ"
assert list(snap) == ["segments", "device_traces", "allocator_settings", "external_annotations"], list(snap)
seg_keys = ["device", "address", "total_size", "allocated_size", "active_size", "requested_size",
            "stream", "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"]
for s in snap["segments"]:
    assert list(s) == seg_keys, list(s)
    assert isinstance(s["segment_pool_id"], tuple) and s["segment_type"] in ("small", "large")
    assert s["total_size"] == sum(b["size"] for b in s["blocks"])
    for b in s["blocks"]:
        assert list(b) == ["address", "size", "requested_size", "state", "frames"], list(b)
        assert b["state"] in ("active_allocated", "active_pending_free", "inactive")
traces = snap["device_traces"]
assert isinstance(traces, list) and isinstance(traces[0], list)
names = set()
for t in traces[0]:
    assert t["action"] in ("alloc", "free_requested", "free_completed", "segment_alloc",
                           "segment_free", "oom", "snapshot"), t["action"]
    assert isinstance(t["time_us"], int) and t["compile_context"] == "N/A"
    for fr in t.get("frames", []):
        assert set(fr) == {"filename", "line", "name"}
        names.add(fr["name"])
settings = snap["allocator_settings"]
assert "PYTORCH_CUDA_ALLOC_CONF" in settings and "roundup_power2_divisions" in settings
print(len(snap["segments"]), len(traces[0]))
print("\n".join(sorted(names)))
"#;

#[test]
fn dump_snapshot_pickle_reads_back_in_python_with_kiln_frames() {
    let devices = kiln::device::test_devices().expect("KILN_REQUIRE_GPU=1 and no GPU adapter");
    for dev in devices {
        dev.record_memory_history(
            Some(HistoryEnabled::All),
            HistoryContext::All,
            HistoryStacks::Kiln,
            100_000,
        );
        dev.manual_seed(0);
        let model = Sequential::new()
            .push(Linear::new(16, 32, true, &dev).unwrap())
            .push(Relu)
            .push(Linear::new(32, 4, true, &dev).unwrap());
        let mut opt = Sgd::new(model.parameters(), 0.1)
            .unwrap()
            .momentum(0.9)
            .unwrap();
        let x = Tensor::randn(&[8, 16], DType::F32, &dev).unwrap();
        let y = Tensor::from_slice(&[0i32, 1, 2, 3, 0, 1, 2, 3], &[8], &dev).unwrap();
        for _ in 0..2 {
            let loss = kiln::profiler::record_function("## forward ##", || {
                cross_entropy(&model.forward(&x)?, &y)
            })
            .unwrap();
            kiln::profiler::record_function("## backward ##", || loss.backward()).unwrap();
            opt.step().unwrap();
            opt.zero_grad(true).unwrap();
        }
        let tag = dev.spec().replace(':', "_");
        let (pkl, json) = (temp(&format!("{tag}.pickle")), temp(&format!("{tag}.json")));
        dev.dump_snapshot(&pkl).unwrap();
        dev.dump_snapshot(&json).unwrap();
        let out = python(CHECK, &[&pkl, &json]);
        let mut lines = out.lines();
        let counts: Vec<usize> = lines
            .next()
            .unwrap()
            .split(' ')
            .map(|n| n.parse().unwrap())
            .collect();
        assert!(
            counts[0] >= 1 && counts[1] > 20,
            "{counts:?} on {}",
            dev.name()
        );
        let names: Vec<&str> = lines.collect();
        for want in [
            "## forward ##",
            "## backward ##",
            "Sequential.0",
            "addmm",
            "addmm_backward",
            "relu",
            "SGD.step",
        ] {
            assert!(names.contains(&want), "no frame {want} in {names:?}");
        }
        dev.record_memory_history(None, HistoryContext::None, HistoryStacks::Kiln, 0);
    }
}

#[test]
fn pickled_scalars_match_pythons_on_edge_values() {
    #[derive(serde::Serialize)]
    struct Edge {
        ints: Vec<i64>,
        big: Vec<u64>,
        floats: Vec<f64>,
        strings: Vec<String>,
        flags: (bool, bool),
        none: Option<u8>,
        empty: Vec<u8>,
        many: Vec<u32>,
        triple: (u8, u8, u8),
        four: (u8, u8, u8, u8),
    }
    let e = Edge {
        ints: vec![
            0,
            1,
            255,
            256,
            65535,
            65536,
            -1,
            -129,
            i32::MIN as i64,
            i32::MAX as i64 + 1,
            i64::MIN,
            i64::MAX,
        ],
        big: vec![u64::MAX, 1 << 63, 0x7fff_ffff_ffff],
        floats: vec![0.0, -1.5, 1e300, f64::MIN_POSITIVE],
        strings: vec!["".into(), "é ünïcødé".into(), "x".repeat(300)],
        flags: (true, false),
        none: None,
        empty: vec![],
        many: (0..2500).collect(),
        triple: (1, 2, 3),
        four: (1, 2, 3, 4),
    };
    let path = temp("edge.pickle");
    std::fs::write(&path, kiln::alloc::pickle::to_pickle(&e).unwrap()).unwrap();
    let out = python(
        "import pickle,sys; d=pickle.load(open(sys.argv[1],'rb')); print(repr(d))",
        &[&path],
    );
    let want = format!(
        "{{'ints': [0, 1, 255, 256, 65535, 65536, -1, -129, -2147483648, 2147483648, -9223372036854775808, 9223372036854775807], 'big': [18446744073709551615, 9223372036854775808, 140737488355327], 'floats': [0.0, -1.5, 1e+300, 2.2250738585072014e-308], 'strings': ['', 'é ünïcødé', '{}'], 'flags': (True, False), 'none': None, 'empty': [], 'many': [{}], 'triple': (1, 2, 3), 'four': (1, 2, 3, 4)}}",
        "x".repeat(300),
        (0..2500).map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
    );
    assert_eq!(out.trim(), want);
}

#[test]
fn timeline_stacks_the_active_bytes_and_writes_svg_and_png() {
    let dev = kiln::Device::cpu().unwrap();
    dev.record_memory_history(
        Some(HistoryEnabled::All),
        HistoryContext::All,
        HistoryStacks::Kiln,
        100_000,
    );
    let x = Tensor::randn(&[64, 64], DType::F32, &dev).unwrap();
    let kept = kiln::profiler::record_function("## phase a ##", || {
        let a = x.matmul(&x).unwrap();
        let b = a.relu().unwrap();
        drop(a);
        b
    });
    kiln::profiler::record_function("## phase b ##", || {
        for _ in 0..3 {
            let t = x.exp().unwrap();
            drop(t);
        }
    });
    drop(kept);
    let snap = dev.memory_snapshot();
    let tl = kiln::viz::Timeline::from_snapshot(&snap, 0);
    // Independent replay: active bytes after each alloc / free_completed event.
    let mut active = 0i64;
    let mut want = Vec::new();
    for e in &snap.device_traces[0] {
        match e.action {
            kiln::alloc::TraceAction::Alloc => active += e.size as i64,
            kiln::alloc::TraceAction::FreeCompleted => active -= e.size as i64,
            _ => continue,
        }
        want.push(active as u64);
    }
    assert_eq!(tl.active, want);
    // Reserved memory never falls below active memory.
    assert_eq!(tl.reserved.len(), tl.events);
    assert!(tl.reserved.iter().zip(&tl.active).all(|(r, a)| r >= a));
    assert_eq!(*tl.reserved.last().unwrap(), dev.memory_reserved());
    // Every band sits on the ones below: at each event the live bands tile [0, active).
    for t in 0..tl.events {
        let mut spans: Vec<(u64, u64)> = tl
            .bands
            .iter()
            .filter(|b| b.steps[0].0 <= t && t < b.end)
            .map(|b| {
                let bottom = b.steps.iter().rev().find(|(s, _)| *s <= t).unwrap().1;
                (bottom, bottom + b.size)
            })
            .collect();
        spans.sort();
        let mut at = 0;
        for (lo, hi) in spans {
            assert_eq!(lo, at, "gap or overlap at event {t}");
            at = hi;
        }
        assert_eq!(at, tl.active[t]);
    }
    let names: Vec<&str> = tl.categories.iter().map(String::as_str).collect();
    for want in ["normal_", "mm", "relu", "exp"] {
        assert!(names.contains(&want), "{names:?}");
    }
    assert_eq!(tl.phase_names(), vec!["## phase a ##", "## phase b ##"]);
    let stem = temp("timeline");
    kiln::viz::write_timeline(&snap, &stem, &Default::default()).unwrap();
    let svg = std::fs::read_to_string(stem.with_extension("svg")).unwrap();
    assert_eq!(svg.matches("<polygon").count(), tl.bands.len());
    assert!(
        svg.contains("\n## phase a ##\n") && svg.contains("\nmm\n"),
        "labels"
    );
    let png = std::fs::read(stem.with_extension("png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let (w, h) = (
        u32::from_be_bytes(png[16..20].try_into().unwrap()),
        u32::from_be_bytes(png[20..24].try_into().unwrap()),
    );
    assert_eq!((w, h), (1400, 700));
}
