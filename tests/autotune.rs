//! Autotuning (`kiln::kernels::tune`): every candidate kernel, forced by name, against the CPU
//! device; the cache file that lets a second process start tuned; `KILN_AUTOTUNE=off`.

#[path = "common/observe.rs"]
mod observe;
use kiln::kernels::tune;
use kiln::ops::linear;
use kiln::{DType, Device, Tensor};
use observe::kernel_trace;
use std::process::Command;

fn gpus() -> Vec<Device> {
    let d = kiln::device::test_devices().expect("KILN_REQUIRE_GPU=1 and no GPU adapter");
    d.into_iter().filter(|d| !d.is_cpu()).collect()
}

/// f32, and f16 where the adapter has it.
fn dtypes(dev: &Device) -> Vec<DType> {
    let f16 = dev.adapter_info().is_some_and(|a| a.features.shader_f16);
    [DType::F32, DType::F16]
        .into_iter()
        .filter(|&d| d == DType::F32 || f16)
        .collect()
}

/// Random values made on the CPU (the same on every device), cast to `dtype`, on `dev`.
fn random(shape: &[usize], dtype: DType, seed: u64, dev: &Device) -> Tensor {
    let cpu = Device::cpu().unwrap();
    cpu.manual_seed(seed);
    Tensor::randn(shape, DType::F32, &cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
        .to_device(dev)
        .unwrap()
}

/// Values of `t` as f64 (NaN kept).
fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
        .into_iter()
        .map(f64::from)
        .collect()
}

/// Asserts |got - want| <= tol * (1 + |want|) elementwise, NaN where the reference has NaN.
fn assert_close(got: &Tensor, want: &Tensor, tol: f64, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}");
    for (i, (g, w)) in values(got).iter().zip(values(want)).enumerate() {
        if w.is_nan() {
            assert!(g.is_nan(), "{what}: element {i}: {g} where the CPU has NaN");
        } else {
            assert!(
                (g - w).abs() <= tol * (1.0 + w.abs()),
                "{what}: element {i}: {g} vs the CPU's {w}"
            );
        }
    }
}

/// Runs `f` with `family`'s variant `name` forced on this thread.
fn forced<T>(family: &str, name: &str, f: impl FnOnce() -> T) -> T {
    tune::force_variant(family, Some(name));
    let out = f();
    tune::force_variant(family, None);
    out
}

#[test]
fn every_reduction_strategy_matches_the_cpu() {
    let cpu = Device::cpu().unwrap();
    // Long rows (split over several passes), a row that is not whole vec4s, a strided view
    // (dims reduced out of order), many short rows.
    let cases: [(&[usize], &[isize]); 5] = [
        (&[3, 70001], &[1]),
        (&[1 << 18], &[]),
        (&[37, 129, 5], &[0, 2]),
        (&[1000, 4], &[1]),
        (&[5, 3000], &[-1]),
    ];
    for dev in gpus() {
        let features = dev.adapter_info().unwrap().features;
        for strategy in ["tree", "subgroup", "serial", "interleaved", "serial_wide"] {
            if (strategy == "subgroup" && !features.subgroups)
                || (strategy == "serial_wide" && !features.shader_int64)
            {
                continue;
            }
            for (shape, dims) in cases {
                for dtype in dtypes(&dev) {
                    let x = random(shape, dtype, 7, &dev);
                    let xc = x.to_device(&cpu).unwrap();
                    let what = |op: &str| {
                        format!(
                            "{op} {shape:?} {dims:?} {dtype} {strategy} on {}",
                            dev.name()
                        )
                    };
                    let n: usize = shape.iter().product();
                    // Summation order differs from the CPU's f64: a tolerance per element summed.
                    let tol = if dtype == DType::F16 {
                        2e-3
                    } else {
                        1e-6 * (n as f64).sqrt() + 1e-5
                    };
                    forced("reduce", strategy, || {
                        let got = x.sum(dims, false).unwrap();
                        assert_close(
                            &got,
                            &xc.sum(dims, false).unwrap(),
                            tol * 30.0,
                            &what("sum"),
                        );
                        let got = x.mean(dims, true).unwrap();
                        assert_close(&got, &xc.mean(dims, true).unwrap(), tol, &what("mean"));
                        let got = x.amax(dims, false).unwrap();
                        assert_close(&got, &xc.amax(dims, false).unwrap(), 0.0, &what("amax"));
                        let got = x.amin(dims, false).unwrap();
                        assert_close(&got, &xc.amin(dims, false).unwrap(), 0.0, &what("amin"));
                    });
                }
            }
            // Rows that start past the buffer's start: a view one row in (offset 3000: whole
            // 32-byte words), and columns 12.. of every row (a strided view at offset 12).
            let x = random(&[6, 3000], DType::F32, 5, &dev);
            let xc = x.to_device(&cpu).unwrap();
            for (start, len) in [(1, 5), (0, 6)] {
                let (v, vc) = (
                    x.narrow(0, start, len).unwrap(),
                    xc.narrow(0, start, len).unwrap(),
                );
                let (v, vc) = if start == 0 {
                    (
                        v.narrow(1, 12, 2984).unwrap(),
                        vc.narrow(1, 12, 2984).unwrap(),
                    )
                } else {
                    (v, vc)
                };
                forced("reduce", strategy, || {
                    let got = v.sum(&[-1], false).unwrap();
                    let what = format!("{strategy}: sum of a view at {start}");
                    assert_close(&got, &vc.sum(&[-1], false).unwrap(), 1e-3, &what);
                });
            }
            // prod over short rows (long ones overflow), and NaN propagation of max and min.
            let x = random(&[64, 300], DType::F32, 3, &dev)
                .mul_scalar(0.05)
                .unwrap()
                .add_scalar(1.0)
                .unwrap();
            let xc = x.to_device(&cpu).unwrap();
            forced("reduce", strategy, || {
                let got = x.prod(&[1], false).unwrap();
                assert_close(&got, &xc.prod(&[1], false).unwrap(), 1e-4, strategy);
            });
            let mut v = vec![1.0f32; 1 << 17];
            v[77_777] = f32::NAN;
            let x = Tensor::from_slice(&v, &[1 << 17], &dev).unwrap();
            forced("reduce", strategy, || {
                for got in [x.amax(&[], false).unwrap(), x.amin(&[], false).unwrap()] {
                    assert!(values(&got)[0].is_nan(), "{strategy}: max/min lost a NaN");
                }
                assert!(values(&x.sum_all().unwrap())[0].is_nan(), "sum lost a NaN");
            });
        }
    }
}

#[test]
fn every_softmax_variant_matches_the_cpu() {
    let cpu = Device::cpu().unwrap();
    for dev in gpus() {
        for variant in ["tree", "serial"] {
            for (shape, dim) in [
                (&[300, 1024][..], -1isize),
                (&[70, 33][..], 1),
                (&[16, 40, 12][..], 1),
            ] {
                for dtype in dtypes(&dev) {
                    let x = random(shape, dtype, 11, &dev).mul_scalar(4.0).unwrap();
                    let xc = x.to_device(&cpu).unwrap();
                    let tol = if dtype == DType::F16 { 2e-3 } else { 1e-5 };
                    let what = format!("{shape:?} {dtype} {variant} on {}", dev.name());
                    forced("softmax", variant, || {
                        let got = x.softmax(dim).unwrap();
                        assert_close(&got, &xc.softmax(dim).unwrap(), tol, &what);
                        let got = x.log_softmax(dim).unwrap();
                        assert_close(&got, &xc.log_softmax(dim).unwrap(), tol * 4.0, &what);
                    });
                }
            }
            // PyTorch's extreme rows: all -inf, a NaN, +inf: NaN rows; huge equal values: uniform.
            let ninf = f32::NEG_INFINITY;
            let mut rows = vec![ninf; 64];
            rows.extend([f32::NAN; 1].iter().chain(&[0.5f32; 63]));
            rows.extend([f32::INFINITY; 1].iter().chain(&[0.5f32; 63]));
            rows.extend([-3.3e38f32; 64]);
            let x = Tensor::from_slice(&rows, &[4, 64], &dev).unwrap();
            let xc = x.to_device(&cpu).unwrap();
            forced("softmax", variant, || {
                let got = x.softmax(-1).unwrap();
                assert_close(&got, &xc.softmax(-1).unwrap(), 1e-6, variant);
            });
        }
    }
}

/// softmax's and log_softmax's backward kernels, each forced, against the CPU device: rows
/// of 3000 (a 3000-class cross_entropy), 1024, 300, 1001 and 33 (the last only ever serial), f32 and
/// f16; one allocation each (the input's gradient, as PyTorch's one kernel makes), and the
/// forced kernel is the one that ran (the tree nowhere on GL's llvmpipe).
#[test]
fn every_softmax_backward_variant_matches_the_cpu() {
    let cpu = Device::cpu().unwrap();
    for dev in gpus() {
        let info = dev.adapter_info().unwrap();
        let traced = info.features.timestamp_query;
        // (GL's llvmpipe has no barrier-loop kernels among its candidates: `tune`.)
        let gl_cpu = info.backend == wgpu::Backend::Gl && info.device_type == wgpu::DeviceType::Cpu;
        for variant in ["tree", "serial"] {
            // (Rows of whole vec4s, and 1001 and 33: elements one at a time.)
            for shape in [[7, 3000], [300, 1024], [33, 300], [9, 1001], [70, 33]] {
                for dtype in dtypes(&dev) {
                    for log in [true, false] {
                        let what =
                            format!("{shape:?} {dtype} log {log} {variant} on {}", dev.name());
                        let grad = |d: &Device| {
                            let x = random(&shape, dtype, 11, d)
                                .mul_scalar(4.0)
                                .unwrap()
                                .requires_grad_(true)
                                .unwrap();
                            let y = match log {
                                true => x.log_softmax(-1).unwrap(),
                                false => x.softmax(-1).unwrap(),
                            };
                            let g = random(&shape, dtype, 12, d);
                            d.synchronize().unwrap();
                            let before = d.memory_stats()["allocation.all.allocated"];
                            y.backward_with(&g, false).unwrap();
                            d.synchronize().unwrap();
                            let made = d.memory_stats()["allocation.all.allocated"] - before;
                            (x.grad().unwrap(), made)
                        };
                        let (want, _) = grad(&cpu);
                        let mut got = None;
                        let json = forced("softmax backward", variant, || {
                            kernel_trace(&dev, || {
                                got = Some(grad(&dev));
                                Ok(())
                            })
                        });
                        let (got, made) = got.unwrap();
                        let tol = if dtype == DType::F16 { 8e-3 } else { 1e-5 };
                        assert_close(&got, &want, tol, &what);
                        assert_eq!(made, 1, "{what}: allocations in the backward");
                        if traced {
                            let tree = variant == "tree" && shape[1] > 64 && !gl_cpu;
                            let name = format!("softmax_backward_tree_{dtype}");
                            assert_eq!(json.contains(&name), tree, "{what}: {name}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn every_transpose_variant_copies_exactly() {
    let cpu = Device::cpu().unwrap();
    for dev in gpus() {
        for variant in ["tiled", "strided"] {
            for dtype in dtypes(&dev) {
                let x = random(&[300, 517], dtype, 5, &dev);
                let xc = x.to_device(&cpu).unwrap();
                forced("transpose", variant, || {
                    let got = x.t().unwrap().contiguous().unwrap();
                    let want = xc.t().unwrap().contiguous().unwrap();
                    assert_close(&got, &want, 0.0, variant);
                });
            }
        }
        // 64-bit words (4x4 blocks): sides of multiples of 4, a view at an offset, and a batch
        // of transposes (NCHW -> NHWC), in f32 and i32.
        if !dev.adapter_info().unwrap().features.shader_int64 {
            continue;
        }
        let x = random(&[2, 12, 300, 516], DType::F32, 6, &dev);
        let xc = x.to_device(&cpu).unwrap();
        let cases: [(&str, View); 3] = [
            ("2-D", |t| {
                let m = t.narrow(0, 1, 1).unwrap().narrow(1, 5, 1).unwrap();
                m.reshape(&[300, 516]).unwrap().t().unwrap()
            }),
            ("a view at an offset", |t| {
                let m = t.narrow(0, 0, 1).unwrap().narrow(1, 3, 1).unwrap();
                let m = m.reshape(&[300, 516]).unwrap();
                m.narrow(0, 4, 292).unwrap().t().unwrap()
            }),
            ("NCHW -> NHWC", |t| t.permute(&[0, 2, 3, 1]).unwrap()),
        ];
        for (what, view) in cases {
            for dtype in [DType::F32, DType::I32] {
                let (v, vc) = (
                    view(&x.mul_scalar(100.0).unwrap().to_dtype(dtype).unwrap()),
                    view(&xc.mul_scalar(100.0).unwrap().to_dtype(dtype).unwrap()),
                );
                let (_, prof) = kiln::profiler::profile(
                    &kiln::profiler::ProfileOptions {
                        devices: vec![dev.clone()],
                        profile_memory: false,
                    },
                    || {
                        let got = forced("transpose", "words", || v.contiguous().unwrap());
                        assert_close(&got, &vc.contiguous().unwrap(), 0.0, what);
                        dev.synchronize()
                    },
                )
                .unwrap();
                if dev.adapter_info().unwrap().features.timestamp_query {
                    let trace = prof.chrome_trace_json();
                    assert!(
                        trace.contains("transpose_words"),
                        "{what}: words did not run"
                    );
                }
            }
        }
    }
}

/// A `[batch, m, k]` A (made `[batch, k, m]` and transposed where `ta`) and a 2-D `[k, n]` B
/// (transposed from `[n, k]` where `tb`), from seeds `seed` and `seed + 1`.
fn operands(
    [m, n, k, batch]: [usize; 4],
    ta: bool,
    tb: bool,
    dtype: DType,
    seed: u64,
    dev: &Device,
) -> (Tensor, Tensor) {
    let a_shape = if ta { [batch, k, m] } else { [batch, m, k] };
    let b_shape = if tb { [n, k] } else { [k, n] };
    let a = random(&a_shape, dtype, seed, dev);
    let b = random(&b_shape, dtype, seed + 1, dev);
    let a = if ta { a.transpose(1, 2).unwrap() } else { a };
    let b = if tb { b.t().unwrap() } else { b };
    (a, b)
}

#[test]
fn every_matmul_variant_matches_the_cpu() {
    let cpu = Device::cpu().unwrap();
    for dev in gpus() {
        for variant in ["tile64", "reg4x4"] {
            // Ragged edges, transposed operands, a broadcast batch.
            for (m, n, k, ta, tb, batch) in [
                (37, 45, 19, false, false, 1),
                (64, 96, 130, true, false, 1),
                (50, 33, 70, false, true, 1),
                (40, 40, 40, true, true, 1),
                (33, 20, 17, false, false, 3),
            ] {
                for dtype in dtypes(&dev) {
                    let (a, b) = operands([m, n, k, batch], ta, tb, dtype, 1, &dev);
                    let (ac, bc) = (a.to_device(&cpu).unwrap(), b.to_device(&cpu).unwrap());
                    let tol = if dtype == DType::F16 { 1e-2 } else { 1e-5 };
                    let what = format!(
                        "{m}x{n}x{k} a^T {ta} b^T {tb} batch {batch} {dtype} {variant} on {}",
                        dev.name()
                    );
                    forced("matmul", variant, || {
                        let got = a.matmul(&b).unwrap();
                        let want = ac.matmul(&bc).unwrap();
                        assert_close(&got, &want, tol, &what);
                    });
                }
            }
        }
    }
}

/// The products over 64-bit words (`reg4x8_wide`, `reg16x8_wide`: CPU adapters with 64-bit
/// integers), each forced, against the CPU in all four operand layouts (A's words along k or m,
/// B's along k or n), f32 (two elements a word) and f16 (four), ragged against their 32x64 and
/// 128x64 tiles, a batch with a broadcast B, a product smaller than one word row; and the
/// profiler's trace naming the kernel that ran.
#[test]
fn the_word_matmul_matches_the_cpu() {
    let cpu = Device::cpu().unwrap();
    let (mut checked, mut lavapipe) = (0, false);
    for dev in gpus() {
        let info = dev.adapter_info().unwrap();
        // (Offered on CPU adapters only; the H100 ran this test with it offered everywhere.)
        let cpu_adapter = info.device_type == wgpu::DeviceType::Cpu;
        lavapipe |= cpu_adapter && info.backend == wgpu::Backend::Vulkan;
        if !info.features.shader_int64 || info.backend == wgpu::Backend::Gl || !cpu_adapter {
            continue;
        }
        // (200x160 A, row-major: three windows of the uniform form, 96 + 96 + 8 rows.)
        for (m, n, k, batch) in [
            (36, 44, 20, 1),
            (64, 128, 64, 1),
            (4, 8, 4, 1),
            (36, 44, 12, 3),
            (200, 72, 160, 1),
        ] {
            let layouts = [(false, false), (true, false), (false, true), (true, true)];
            // The uniform form takes one batch, and a column-major A only where one window of
            // 16 rows spans all of K (not 200x160).
            let variants = ["reg4x8_wide", "reg16x8_wide", "reg16x8_wide_ubo"];
            for ((ta, tb), variant) in layouts
                .into_iter()
                .flat_map(|l| variants.map(|v| (l, v)))
                .filter(|&((ta, _), v)| {
                    v != "reg16x8_wide_ubo" || (batch == 1 && !(ta && m == 200))
                })
            {
                for dtype in dtypes(&dev) {
                    // f16's larger form has 8 rows (`MatmulWide::rows_for`).
                    let variant = match dtype {
                        DType::F16 => variant.replace("reg16x8", "reg8x8"),
                        _ => variant.to_string(),
                    };
                    let variant = variant.as_str();
                    let (a, b) = operands([m, n, k, batch], ta, tb, dtype, 3, &dev);
                    let (ac, bc) = (a.to_device(&cpu).unwrap(), b.to_device(&cpu).unwrap());
                    let tol = if dtype == DType::F16 { 1e-2 } else { 1e-5 };
                    let what = format!(
                        "{m}x{n}x{k} a^T {ta} b^T {tb} batch {batch} {dtype} {variant} on {}",
                        dev.name()
                    );
                    let options = kiln::profiler::ProfileOptions {
                        devices: vec![dev.clone()],
                        profile_memory: false,
                    };
                    let (got, prof) = kiln::profiler::profile(&options, || {
                        let got = forced("matmul", variant, || a.matmul(&b));
                        dev.synchronize()?;
                        got
                    })
                    .unwrap();
                    let want = ac.matmul(&bc).unwrap();
                    assert_close(&got, &want, tol, &what);
                    // Words along k for a row-major A and a column-major B.
                    let kernel = format!(
                        "matmul_{variant}_{dtype}_{}_{}",
                        if ta { "am" } else { "ak" },
                        if tb { "bk" } else { "bn" }
                    );
                    if info.features.timestamp_query {
                        let trace = prof.chrome_trace_json();
                        assert!(trace.contains(&kernel), "{what}: {kernel} did not run");
                    }
                    // `linear` with a bias: added in the kernel's epilogue (no add launched).
                    if b.rank() == 2 {
                        let bias = random(&[n], dtype, 7, &dev);
                        let wt = b.t().unwrap();
                        let (got, prof) = kiln::profiler::profile(&options, || {
                            let got = forced("matmul", variant, || linear(&a, &wt, Some(&bias)));
                            dev.synchronize()?;
                            got
                        })
                        .unwrap();
                        let bc = bias.to_device(&cpu).unwrap();
                        let want = linear(&ac, &wt.to_device(&cpu).unwrap(), Some(&bc)).unwrap();
                        assert_close(&got, &want, tol, &format!("{what}, linear"));
                        if info.features.timestamp_query {
                            let trace = prof.chrome_trace_json();
                            assert!(trace.contains(&kernel), "{what}: linear: {kernel}");
                            assert!(!trace.contains("binary_add"), "{what}: linear added");
                        }
                    }
                    checked += 1;
                }
            }
        }
    }
    // lavapipe, CI's adapter, has 64-bit integers and ran it (a machine with only GPUs has no
    // adapter that offers it).
    assert!(
        !lavapipe || checked > 0,
        "lavapipe did not run the word product"
    );
}

/// The child of `a_second_process_starts_tuned`: a sum big enough to be tuned on the first
/// GPU, then a report of what the tuner holds (`KILN_EXPECT` says what the parent expects).
#[test]
#[ignore = "run by a_second_process_starts_tuned in a child process"]
fn autotune_child() {
    let dev = gpus().into_iter().next().unwrap();
    let expect = std::env::var("KILN_EXPECT").unwrap();
    let x = random(&[1 << 20], DType::F32, 1, &dev);
    let got = values(&x.sum_all().unwrap())[0];
    let want = values(
        &x.to_device(&Device::cpu().unwrap())
            .unwrap()
            .sum_all()
            .unwrap(),
    )[0];
    assert!((got - want).abs() < 1e-2, "{got} vs {want}");
    let tuned = tune::tuned(&dev);
    let sum = tuned.iter().find(|r| r.family == "reduce");
    match expect.as_str() {
        "measured" => {
            let r = sum.expect("the sum was tuned");
            assert!(!r.from_cache, "measured, not read");
            assert!(r.candidates.len() >= 3, "{r:?}");
            assert!(r.tuning_seconds < 2.0, "tuning took {} s", r.tuning_seconds);
        }
        "cached" => {
            let r = sum.expect("the cache file had the sum");
            assert!(r.from_cache, "read from the cache file: {r:?}");
        }
        "off" => assert!(tuned.is_empty(), "KILN_AUTOTUNE=off tuned {tuned:?}"),
        other => panic!("KILN_EXPECT={other}"),
    }
}

#[test]
fn a_second_process_starts_tuned() {
    let dir = std::env::temp_dir().join(format!("kiln-autotune-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let child = |expect: &str, off: bool| {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", "autotune_child", "--ignored", "--nocapture"])
            .env("KILN_CACHE_DIR", &dir)
            .env("KILN_EXPECT", expect)
            .env_remove("KILN_AUTOTUNE");
        if off {
            cmd.env("KILN_AUTOTUNE", "off");
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "child expecting {expect}:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let file = dir.join("autotune.json");
    child("off", true);
    assert!(!file.exists(), "KILN_AUTOTUNE=off wrote {file:?}");
    child("measured", false);
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.contains("kiln.autotune.v1") && text.contains("reduce/sum f32"),
        "{text}"
    );
    assert!(
        text.contains(env!("CARGO_PKG_VERSION")),
        "keyed by kiln's version: {text}"
    );
    child("cached", false);
    // A record measured by a kiln with fewer candidates (an older build) is measured again.
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let mut shrunk = 0;
    for records in json["adapters"].as_object_mut().unwrap().values_mut() {
        for (id, r) in records.as_object_mut().unwrap() {
            if id.starts_with("reduce/sum f32") {
                r["offered"].as_array_mut().unwrap().pop();
                r["candidates"].as_array_mut().unwrap().pop();
                r["winner"] = r["offered"][0].clone();
                shrunk += 1;
            }
        }
    }
    assert!(shrunk > 0, "{json}");
    std::fs::write(&file, serde_json::to_vec(&json).unwrap()).unwrap();
    child("measured", false);
    child("cached", false);
    // A damaged cache is measured again and rewritten, never an error.
    std::fs::write(&file, b"{ not json").unwrap();
    child("measured", false);
    child("cached", false);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The profiler's trace names the kernel that ran, variant included.
#[test]
fn the_trace_names_the_variant() {
    let mut checked = 0;
    for dev in gpus() {
        if !dev.adapter_info().unwrap().features.timestamp_query {
            continue;
        }
        checked += 1;
        let x = random(&[1 << 16], DType::F32, 2, &dev);
        let options = kiln::profiler::ProfileOptions {
            devices: vec![dev.clone()],
            profile_memory: false,
        };
        let mut variants = vec![
            ("serial", "sum_f32_f32_vec4_serial"),
            ("tree", "sum_f32_f32_vec4_tree"),
        ];
        if dev.adapter_info().unwrap().features.shader_int64 {
            // (Which also shows that forcing it reaches the 32-byte words.)
            variants.push(("serial_wide", "sum_f32_f32_vec4_serial_wide"));
        }
        for (variant, kernel) in variants {
            let (_, prof) = kiln::profiler::profile(&options, || {
                forced("reduce", variant, || x.sum_all().unwrap());
                dev.synchronize()
            })
            .unwrap();
            let trace = prof.chrome_trace_json();
            assert!(
                trace.contains(kernel),
                "{kernel} not in the trace on {}",
                dev.name()
            );
        }
    }
    assert!(
        checked > 0,
        "no adapter with timestamps to profile kernels on"
    );
}

/// The narrow products (`shaders/matmul_narrow.wgsl`: 16 or fewer columns, or rows, over a
/// long K, or a K of 16 or less) and the tiled path they are measured against, each forced,
/// against the CPU: a classifier head `x @ W^T` (B a transposed view) with its bias added in
/// the kernel, its weight's gradient `g^T @ h` (A a transposed view), plain row-major
/// operands, the head's input gradient `g @ W` (K = 10, N not a multiple of 4), and a layer
/// with seven inputs `x @ W^T + b` (K = 7, B a transposed view, the bias in the kernel).
#[test]
fn both_narrow_product_variants_match_the_cpu() {
    let cpu = Device::cpu().unwrap();
    for dev in gpus() {
        for dtype in dtypes(&dev) {
            for variant in ["narrow", "narrow_vec4", "tiled"] {
                let what = |case: &str| format!("{case} {dtype} {variant} on {}", dev.name());
                let tol = if dtype == DType::F16 { 4e-3 } else { 1e-4 };
                forced("matmul narrow", variant, || {
                    // The head: [64, 1024] @ [1024, 10]^T + bias.
                    let x = random(&[64, 1024], dtype, 11, &dev);
                    let w = random(&[10, 1024], dtype, 12, &dev);
                    let b = random(&[10], dtype, 13, &dev);
                    let got = kiln::ops::linear(&x, &w, Some(&b)).unwrap();
                    let [xc, wc, bc] = [&x, &w, &b]
                        .map(|t| t.to_device(&cpu).unwrap().to_dtype(DType::F32).unwrap());
                    let want = kiln::ops::linear(&xc, &wc, Some(&bc)).unwrap();
                    assert_close(&got, &want, tol, &what("x @ W^T + b"));
                    // The head's weight gradient: [10, 64]^T-view @ [64 -> K = 300, 300].
                    let g = random(&[300, 10], dtype, 14, &dev);
                    let h = random(&[300, 520], dtype, 15, &dev);
                    let got = g.t().unwrap().matmul(&h).unwrap();
                    let [gc, hc] =
                        [&g, &h].map(|t| t.to_device(&cpu).unwrap().to_dtype(DType::F32).unwrap());
                    let want = gc.t().unwrap().matmul(&hc).unwrap();
                    assert_close(&got, &want, tol, &what("g^T @ h"));
                    // Row-major operands, 3 columns.
                    let a = random(&[42, 700], dtype, 16, &dev);
                    let c = random(&[700, 3], dtype, 17, &dev);
                    let got = a.matmul(&c).unwrap();
                    let [ac, cc] =
                        [&a, &c].map(|t| t.to_device(&cpu).unwrap().to_dtype(DType::F32).unwrap());
                    let want = ac.matmul(&cc).unwrap();
                    assert_close(&got, &want, tol, &what("a @ c"));
                    // K = 10: [70, 10] @ [10, 1030].
                    let g = random(&[70, 10], dtype, 18, &dev);
                    let w = random(&[10, 1030], dtype, 19, &dev);
                    let got = g.matmul(&w).unwrap();
                    let [gc, wc] =
                        [&g, &w].map(|t| t.to_device(&cpu).unwrap().to_dtype(DType::F32).unwrap());
                    let want = gc.matmul(&wc).unwrap();
                    assert_close(&got, &want, tol, &what("g @ W, K = 10"));
                    // K = 10, N whole vec4s (`short4`, with 70 rows: a last partial group of
                    // four).
                    let w = random(&[10, 1024], dtype, 25, &dev);
                    let got = g.matmul(&w).unwrap();
                    let wc = w.to_device(&cpu).unwrap().to_dtype(DType::F32).unwrap();
                    let want = gc.matmul(&wc).unwrap();
                    assert_close(&got, &want, tol, &what("g @ W, K = 10, N = 1024"));
                    // K = 7 with a bias: [33, 7] @ [300, 7]^T + b.
                    let x = random(&[33, 7], dtype, 20, &dev);
                    let w = random(&[300, 7], dtype, 21, &dev);
                    let b = random(&[300], dtype, 22, &dev);
                    let got = kiln::ops::linear(&x, &w, Some(&b)).unwrap();
                    let [xc, wc, bc] = [&x, &w, &b]
                        .map(|t| t.to_device(&cpu).unwrap().to_dtype(DType::F32).unwrap());
                    let want = kiln::ops::linear(&xc, &wc, Some(&bc)).unwrap();
                    assert_close(&got, &want, tol, &what("x @ W^T + b, K = 7"));
                });
                // The forced choice is the kernel that ran (where the profiler can see it).
                let timestamps = dev.adapter_info().unwrap().features.timestamp_query;
                if variant != "tiled" && timestamps {
                    let g = random(&[70, 10], dtype, 18, &dev);
                    // (`short4` needs N in whole vec4s.)
                    let n = if variant == "narrow" { 1030 } else { 1024 };
                    let w = random(&[10, n], dtype, 19, &dev);
                    let options = kiln::profiler::ProfileOptions {
                        devices: vec![dev.clone()],
                        profile_memory: false,
                    };
                    let (_, prof) = kiln::profiler::profile(&options, || {
                        forced("matmul narrow", variant, || g.matmul(&w).unwrap());
                        dev.synchronize()
                    })
                    .unwrap();
                    let entry = if variant == "narrow" {
                        "short"
                    } else {
                        "short4"
                    };
                    let kernel = format!("matmul_narrow_{entry}_{dtype}");
                    assert!(
                        prof.chrome_trace_json().contains(&kernel),
                        "{}",
                        what(&kernel)
                    );
                }
            }
        }
    }
}

/// A view of a tensor, made the same way on every device.
type View = fn(&Tensor) -> Tensor;

/// Contiguous elementwise ops as vec4s and as 32-byte words (`vec8`, where the adapter has
/// 64-bit integers), each forced, against the CPU: unary, binary, with a scalar and in place,
/// for f32, i32 and u32 (the word's two halves must land back in their places: a wrong
/// shuffle fails on every odd element), and the profiler's trace naming the word kernel.
#[test]
fn both_elementwise_layouts_match_the_cpu() {
    let cpu = Device::cpu().unwrap();
    let mut wide_checked = 0;
    for dev in gpus() {
        let int64 = dev.adapter_info().unwrap().features.shader_int64;
        for variant in ["vec4", "vec8"] {
            let a = random(&[1 << 12], DType::F32, 11, &dev);
            let b = random(&[1 << 12], DType::F32, 12, &dev);
            let (ac, bc) = (a.to_device(&cpu).unwrap(), b.to_device(&cpu).unwrap());
            forced("elementwise", variant, || {
                let got = a.exp().unwrap();
                assert_close(&got, &ac.exp().unwrap(), 1e-6, "exp");
                let got = a.sub(&b).unwrap();
                assert_close(&got, &ac.sub(&bc).unwrap(), 0.0, "sub");
                let got = a.mul_scalar(3.0).unwrap();
                assert_close(&got, &ac.mul_scalar(3.0).unwrap(), 0.0, "mul_scalar");
                let (x, xc) = (a.mul_scalar(1.0).unwrap(), ac.mul_scalar(1.0).unwrap());
                x.add_(&b).unwrap();
                xc.add_(&bc).unwrap();
                assert_close(&x, &xc, 0.0, "add_");
                // An offset of eight elements keeps the words whole.
                let (s, sc) = (
                    a.narrow(0, 8, 1 << 11).unwrap(),
                    ac.narrow(0, 8, 1 << 11).unwrap(),
                );
                let got = s.neg().unwrap();
                assert_close(&got, &sc.neg().unwrap(), 0.0, "neg of a view");
                for dtype in [DType::I32, DType::U32] {
                    let xi = (a.mul_scalar(1000.0).unwrap().abs().unwrap())
                        .to_dtype(dtype)
                        .unwrap();
                    let yi = (b.mul_scalar(1000.0).unwrap().abs().unwrap())
                        .to_dtype(dtype)
                        .unwrap();
                    let got = xi.add(&yi).unwrap().to_dtype(DType::F32).unwrap();
                    let want = xi
                        .to_device(&cpu)
                        .unwrap()
                        .add(&yi.to_device(&cpu).unwrap())
                        .unwrap()
                        .to_dtype(DType::F32)
                        .unwrap();
                    assert_close(&got, &want, 0.0, &format!("{dtype} add"));
                }
            });
        }
        if !int64 || !dev.adapter_info().unwrap().features.timestamp_query {
            continue;
        }
        wide_checked += 1;
        let options = kiln::profiler::ProfileOptions {
            devices: vec![dev.clone()],
            profile_memory: false,
        };
        let a = random(&[1 << 12], DType::F32, 13, &dev);
        let (_, prof) = kiln::profiler::profile(&options, || {
            forced("elementwise", "vec8", || a.exp().unwrap());
            dev.synchronize()
        })
        .unwrap();
        let trace = prof.chrome_trace_json();
        assert!(
            trace.contains("unary_exp_f32_vec8"),
            "the word kernel not in the trace on {}",
            dev.name()
        );
    }
    // lavapipe, CI's adapter, has 64-bit integers and timestamps.
    assert!(wide_checked > 0, "no adapter ran the 32-byte word kernels");
}
