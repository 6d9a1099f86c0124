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
        let mut opt = Sgd::new(model.parameters(), 0.1)
            .unwrap()
            .momentum(0.9)
            .unwrap();
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
        memory: Vec::new(),
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

/// The categorised memory timeline (PyTorch's `export_memory_timeline`) of two training steps
/// of a small model with SGD momentum on every device: parameters from the start, momentum from
/// the first step, gradients kept (zero_grad not set_to_none), activations alive only between
/// forward and backward, the uploaded batch as input; every row adds up to the allocator's
/// requested bytes at the end; the JSON is PyTorch's `[times, sizes]`.
#[test]
fn memory_timeline_splits_bytes_by_category() {
    use kiln::alloc::MemoryCategory as C;
    let devices = kiln::device::test_devices().expect("KILN_REQUIRE_GPU=1 and no GPU adapter");
    for dev in devices {
        // Each CPU device has its own allocator; on the CPU the host tensors are `dev`'s.
        let cpu = if dev.is_cpu() {
            dev.clone()
        } else {
            Device::cpu().unwrap()
        };
        dev.manual_seed(0);
        let model = Sequential::new()
            .push(Linear::new(64, 128, true, &dev).unwrap())
            .push(Relu)
            .push(Linear::new(128, 10, true, &dev).unwrap());
        let params: u64 = model
            .parameters()
            .iter()
            .map(|p| (p.numel() * 4) as u64)
            .sum();
        let mut opt = Sgd::new(model.parameters(), 0.1)
            .unwrap()
            .momentum(0.9)
            .unwrap();
        let host_x = Tensor::randn(&[32, 64], DType::F32, &cpu).unwrap();
        let host_y = Tensor::from_slice(&[1i32; 32], &[32], &cpu).unwrap();
        let opts = ProfileOptions {
            devices: vec![dev.clone()],
            profile_memory: true,
        };
        let ((), prof) = profile(&opts, || {
            for _ in 0..2 {
                let x = host_x.to_device(&dev)?;
                let y = host_y.to_device(&dev)?;
                let loss = cross_entropy(&model.forward(&x)?, &y)?;
                loss.backward()?;
                opt.step()?;
                opt.zero_grad(false)?;
            }
            Ok(())
        })
        .unwrap();
        let tl = prof.memory_timeline(0);
        assert!(
            tl.times_us.len() > 10,
            "{}: {} times",
            dev.name(),
            tl.times_us.len()
        );
        assert!(tl.times_us.windows(2).all(|w| w[0] < w[1]));
        let col = |c: C| -> Vec<i64> { tl.sizes.iter().map(|s| s[c.index() + 1]).collect() };
        let last = |c: C| *col(c).last().unwrap();
        let max = |c: C| col(c).into_iter().max().unwrap();
        let name = dev.name();
        assert!(
            tl.sizes
                .iter()
                .all(|s| s[0] == 0 && s.iter().all(|&b| b >= 0)),
            "{name}"
        );
        // Parameters were there before profiling started; momentum and gradients stay.
        assert_eq!(col(C::Parameter)[0], params as i64, "{name}");
        assert_eq!(last(C::Parameter), params as i64, "{name}");
        assert_eq!(last(C::OptimizerState), params as i64, "{name}");
        assert_eq!(
            last(C::Gradient),
            params as i64,
            "{name}: {:?}",
            tl.sizes.last()
        );
        // The uploaded batch is an input (on a GPU; on the CPU device nothing is uploaded);
        // what autograd saved lives from forward to backward only.
        if !dev.is_cpu() {
            assert_eq!(max(C::Input), 32 * 64 * 4 + 32 * 4, "{name}");
        }
        assert!(max(C::Activation) >= 32 * 128 * 4, "{name}");
        // On the CPU device the batch is the host tensors themselves, still alive, which
        // autograd saved.
        let batch = if dev.is_cpu() {
            32 * 64 * 4 + 32 * 4
        } else {
            0
        };
        assert_eq!(last(C::Activation), batch, "{name}");
        // Backward's own buffers (the gradient between the layers), and the step's scratch.
        assert!(max(C::AutogradDetail) >= 32 * 128 * 4, "{name}");
        assert!(max(C::Temporary) > 0, "{name}");
        // Every row adds up; the last to what the allocator holds for live tensors.
        let total: i64 = tl.sizes.last().unwrap().iter().sum();
        assert_eq!(
            total,
            dev.memory_stats()["requested_bytes.all.current"],
            "{name}: {:?}",
            tl.sizes.last()
        );
        // PyTorch's JSON, and the pictures.
        let dir = std::env::temp_dir().join(format!("kiln-memtl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let json = dir.join("timeline.json");
        prof.export_memory_timeline(&json).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(v[0].as_array().unwrap().len(), tl.times_us.len());
        assert_eq!(v[1][0].as_array().unwrap().len(), 9);
        prof.export_memory_timeline(dir.join("timeline.svg"))
            .unwrap();
        let svg = std::fs::read_to_string(dir.join("timeline.svg")).unwrap();
        assert!(
            svg.contains("OPTIMIZER_STATE") && svg.contains("<polygon"),
            "{name}"
        );
        let e = prof
            .export_memory_timeline(dir.join("timeline.html"))
            .unwrap_err();
        assert!(e.to_string().contains(".json, .svg or .png"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
