//! The profiler on every device: scopes, kernels and copies with GPU times, attribution of
//! kernels and memory to the innermost scope, PyTorch's table and a Chrome trace; golden
//! layouts (insta) for a fixed profile and for a fixed program's snapshot dict.

use kiln::alloc::{HistoryContext, HistoryEnabled, HistoryStacks};
use kiln::nn::{cross_entropy, Linear, Module, Relu, Sequential};
use kiln::optim::{Optimizer, Sgd};
use kiln::profiler::{profile, record_function, EventKind, ProfEvent, Profile, ProfileOptions};
use kiln::{DType, Device, Tensor};

#[test]
fn profile_records_scopes_kernels_and_memory_with_pytorchs_table() {
    let devices = kiln::device::test_devices().expect("KILN_REQUIRE_GPU=1 and no GPU adapter");
    for dev in devices {
        dev.manual_seed(0);
        let model = Sequential::new()
            .push(Linear::new(64, 128, true, &dev).unwrap())
            .push(Relu)
            .push(Linear::new(128, 10, true, &dev).unwrap());
        let mut opt = Sgd::new(model.parameters(), 0.1).unwrap().momentum(0.9);
        let x = Tensor::randn(&[32, 64], DType::F32, &dev).unwrap();
        let y = Tensor::from_slice(&[1i32; 32], &[32], &dev).unwrap();
        let host = Tensor::randn(&[1 << 16], DType::F32, &Device::cpu().unwrap()).unwrap();
        let opts = ProfileOptions {
            devices: vec![dev.clone()],
            profile_memory: true,
        };
        let (kept, prof) = profile(&opts, || {
            let loss = record_function("## forward ##", || cross_entropy(&model.forward(&x)?, &y))?;
            record_function("## backward ##", || loss.backward())?;
            record_function("## optimizer ##", || opt.step())?;
            let up = record_function("## upload ##", || host.to_device(&dev))?;
            Ok(up)
        })
        .unwrap();
        let names: Vec<&str> = prof.events.iter().map(|e| e.name.as_str()).collect();
        for want in [
            "## forward ##",
            "## backward ##",
            // Linear is one addmm node, as in PyTorch; its backward runs two mm.
            "addmm",
            "addmm_backward",
            "mm",
            "relu",
            "SGD.step",
        ] {
            assert!(names.contains(&want), "{want} missing on {}", dev.name());
        }
        let forward = prof
            .events
            .iter()
            .find(|e| e.name == "## forward ##")
            .unwrap();
        assert_eq!(forward.kind, EventKind::UserScope);
        assert!(forward.cpu_dur_us > 0.0 && forward.self_cpu_us <= forward.cpu_dur_us);
        // The forward's activations stay alive for backward: it allocated and kept memory.
        let mem = if dev.is_cpu() {
            forward.cpu_mem
        } else {
            forward.gpu_mem
        };
        assert!(
            mem >= 32 * 128 * 4,
            "forward kept {mem} bytes on {}",
            dev.name()
        );
        let addmm = prof.events.iter().find(|e| e.name == "addmm").unwrap();
        assert_eq!(addmm.shapes, "[[128], [32, 64], [64, 128]]");
        if !dev.is_cpu() {
            let kernels: Vec<&ProfEvent> = prof
                .events
                .iter()
                .filter(|e| e.kind == EventKind::Kernel)
                .collect();
            assert!(kernels.len() >= 10);
            if prof.gpu_measured {
                assert!(kernels.iter().all(|k| k.gpu_start_us.is_some()));
                // GPU totals add up through the scopes.
                let inner: f64 = kernels
                    .iter()
                    .filter(|k| {
                        k.cpu_start_us >= forward.cpu_start_us
                            && k.cpu_start_us <= forward.cpu_start_us + forward.cpu_dur_us
                    })
                    .map(|k| k.self_gpu_us)
                    .sum();
                assert!((forward.gpu_total_us - inner).abs() <= 1e-6 * inner.max(1.0));
                assert!(inner > 0.0);
            }
            let copies = prof
                .events
                .iter()
                .filter(|e| e.kind == EventKind::Copy && e.name.contains("HtoD"))
                .map(|e| e.bytes)
                .sum::<i64>();
            assert_eq!(copies, 4 << 16);
        }
        let table = prof.key_averages().table("cpu_time_total", 200);
        if dev.spec() == "vulkan:0" {
            println!("{table}");
        }
        assert!(table.contains("Self CPU %") && table.contains("# of Calls"));
        assert!(table.contains("## forward ##") && table.contains("addmm_backward"));
        assert!(table.contains("Self CPU time total:"));
        let trace: serde_json::Value = serde_json::from_str(&prof.chrome_trace_json()).unwrap();
        let events = trace["traceEvents"].as_array().unwrap();
        assert!(events.iter().any(|e| e["cat"] == "user_annotation"));
        assert!(events
            .iter()
            .any(|e| e["cat"] == "allocator" && e["pid"] == 1));
        if !dev.is_cpu() {
            assert!(events.iter().any(|e| e["cat"] == "kernel" && e["pid"] == 1));
            assert!(events
                .iter()
                .any(|e| e["cat"] == "gpu_memcpy" && e["tid"] == 1));
        }
        drop(kept);
    }
}

/// A fixed profile: a forward scope with two kernels, a free and an allocation.
fn fixed_profile() -> Profile {
    let ev = |name: &str, kind, start: f64, dur: f64| {
        let mut e: ProfEvent = ProfEvent {
            name: name.into(),
            kind,
            device: None,
            thread: 1,
            cpu_start_us: start,
            cpu_dur_us: dur,
            gpu_start_us: None,
            self_cpu_us: dur,
            self_gpu_us: 0.0,
            gpu_total_us: 0.0,
            self_cpu_mem: 0,
            cpu_mem: 0,
            self_gpu_mem: 0,
            gpu_mem: 0,
            bytes: 0,
            shapes: String::new(),
        };
        if kind == EventKind::Kernel {
            e.device = Some(0);
            e.gpu_start_us = Some(start + 5.0);
            e.self_gpu_us = dur * 10.0;
            e.gpu_total_us = dur * 10.0;
        }
        e
    };
    let mut fwd = ev("## forward ##", EventKind::UserScope, 0.0, 100.0);
    fwd.self_cpu_us = 40.0;
    fwd.self_gpu_us = 0.0;
    fwd.gpu_total_us = 150.0;
    fwd.gpu_mem = 1 << 20;
    let mut mm = ev("mm", EventKind::Scope, 10.0, 50.0);
    mm.self_cpu_us = 45.0;
    mm.self_gpu_us = 100.0;
    mm.gpu_total_us = 100.0;
    mm.self_gpu_mem = 1 << 20;
    mm.gpu_mem = 1 << 20;
    mm.shapes = "[[32, 64], [64, 128]]".into();
    let mut k1 = ev("matmul", EventKind::Kernel, 20.0, 5.0);
    k1.self_gpu_us = 100.0;
    k1.gpu_total_us = 100.0;
    let k2 = ev("relu", EventKind::Kernel, 70.0, 5.0);
    let mut alloc = ev("[memory] alloc", EventKind::Memory, 15.0, 0.0);
    alloc.device = Some(0);
    alloc.bytes = 1 << 20;
    Profile {
        events: vec![fwd, mm, k1, k2, alloc],
        devices: vec!["vulkan:0".into()],
        gpu_measured: true,
    }
}

#[test]
fn golden_profiler_table_and_trace() {
    let p = fixed_profile();
    insta::assert_snapshot!(
        "profiler_table",
        p.key_averages().table("cpu_time_total", 10)
    );
    insta::assert_snapshot!(
        "profiler_table_shapes",
        p.key_averages_by(true).table("self_gpu_time_total", 2)
    );
    insta::assert_json_snapshot!("profiler_chrome_trace", p.chrome_trace());
}

#[test]
fn golden_snapshot_dict_of_a_fixed_program() {
    let dev = Device::cpu().unwrap();
    dev.record_memory_history(
        Some(HistoryEnabled::All),
        HistoryContext::All,
        HistoryStacks::Kiln,
        1000,
    );
    let a = Tensor::ones(&[1000, 1000], DType::F32, &dev).unwrap();
    let b = record_function("## scope ##", || a.relu().unwrap());
    drop(a);
    let snap = dev.memory_snapshot();
    drop(b);
    let mut v: serde_json::Value = serde_json::from_str(&snap.to_json()).unwrap();
    for e in v["device_traces"][0].as_array_mut().unwrap() {
        e["time_us"] = 0.into();
        // The record_function frame names this file's line; keep it stable.
        for f in e["frames"].as_array_mut().into_iter().flatten() {
            if f["filename"].as_str().is_some_and(|s| s.ends_with(".rs")) {
                f["line"] = 0.into();
            }
        }
    }
    for s in v["segments"].as_array_mut().unwrap() {
        for b in s["blocks"].as_array_mut().unwrap() {
            for f in b["frames"].as_array_mut().unwrap() {
                f["line"] = 0.into();
            }
        }
    }
    insta::assert_json_snapshot!("snapshot_dict_fixed_program", v);
}
