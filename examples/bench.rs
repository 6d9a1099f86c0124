//! kiln's benchmark runner: `cargo run --release --example bench -- [--adapter all|INDEX]
//! [--suite NAME] [--json PATH]`. Suites: `alloc` (cached allocation + free against raw wgpu
//! buffer creation), `ops` (the work of `../shared/anchors/torch_anchor.py`: y=2x and a+b over
//! 2^26 f32, sum, 8192^2 transpose to contiguous, a tiny op's dispatch cost), `matmul` (the
//! big MLP step's f32 products by layout), `train` (an MLP step), `transfer` (host-device copies: pageable, pinned non-blocking, naive wgpu), `loader`
//! (whether the DataLoader's assembly and uploads overlap training steps). Prints a table per
//! adapter; `--json` writes the figures.
//!
//! GPU times are wall-clock over a batch of launches with one `synchronize()` at the end (as the
//! anchor times 50 launches between two CUDA events): the per-launch figure includes kiln's
//! amortised dispatch cost, which is what a user sees.

use kiln::{DType, Device, Tensor};
use std::time::Instant;

struct Row {
    adapter: String,
    suite: &'static str,
    case: String,
    value: f64,
    unit: &'static str,
}

/// Seconds per call of `f`: the best of five runs of about 0.1 s each (the least disturbed by
/// the machine's other work), after a warm-up.
fn time_per_iter(mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    let mut calibration = 0u64;
    while start.elapsed().as_secs_f64() < 0.05 {
        f();
        calibration += 1;
    }
    let iters = (calibration * 2).max(3);
    (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_secs_f64() / iters as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn alloc_suite(dev: &Device, rows: &mut Vec<Row>) {
    for size in [4096u64, 4 << 20, 64 << 20] {
        drop(dev.allocate(size).unwrap());
        let cached = time_per_iter(|| drop(dev.allocate(std::hint::black_box(size)).unwrap()));
        rows.push(Row {
            adapter: dev.name(),
            suite: "alloc",
            case: format!("cached alloc+free {size} B"),
            value: cached * 1e6,
            unit: "us",
        });
        if let Some(raw) = kiln::device::raw_wgpu_device(dev) {
            let new_buffer = |raw: &wgpu::Device| {
                raw.create_buffer(&wgpu::BufferDescriptor {
                    label: None,
                    size,
                    usage: wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_SRC
                        | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                })
            };
            // wgpu defers the real free to the next poll: without one, the loop only queues
            // destructions. With a poll per pair, the memory is really returned, as it is when a
            // cached block goes back to its pool.
            let create = time_per_iter(|| {
                let b = new_buffer(&raw);
                b.destroy();
                let _ = raw.poll(wgpu::PollType::Poll);
            });
            let deferred = time_per_iter(|| new_buffer(&raw).destroy());
            // Let wgpu free what the deferred loop queued before anything else is measured.
            let _ = raw.poll(wgpu::PollType::wait_indefinitely());
            let mut push = |case: String, value: f64, unit: &'static str| {
                rows.push(Row {
                    adapter: dev.name(),
                    suite: "alloc",
                    case,
                    value,
                    unit,
                })
            };
            push(
                format!("wgpu create+destroy+poll {size} B"),
                create * 1e6,
                "us",
            );
            push(
                format!("wgpu create+destroy (deferred) {size} B"),
                deferred * 1e6,
                "us",
            );
            push(
                format!("speedup vs create+destroy+poll {size} B"),
                create / cached,
                "x",
            );
            push(
                format!("speedup vs deferred destroy {size} B"),
                deferred / cached,
                "x",
            );
        }
    }
}

/// Seconds per call of `f`: GPU time from timestamp queries around `iters` calls where the
/// adapter has them, else wall-clock time between two synchronisations; best of three.
/// Returns the time and whether it came from timestamps.
fn gpu_time(
    dev: &Device,
    iters: u32,
    mut f: impl FnMut() -> kiln::Result<Tensor>,
) -> kiln::Result<(f64, bool)> {
    // Warm-up: at least three calls and 200 ms, so that a GPU idling at low clocks (a fresh
    // H100 machine ran its first f32 matmuls at a fifth of their speed) has ramped up.
    let start = Instant::now();
    let mut calls = 0;
    while calls < 3 || start.elapsed().as_secs_f64() < 0.2 {
        f()?;
        dev.synchronize()?;
        calls += 1;
    }
    let mut best = (f64::INFINITY, false);
    for _ in 0..3 {
        let t = Instant::now();
        let gpu = kiln::device::gpu_time(dev, || {
            for _ in 0..iters {
                f()?;
            }
            Ok(())
        })?;
        dev.synchronize()?;
        let wall = t.elapsed().as_secs_f64();
        let (secs, from_timestamps) = gpu.map_or((wall, false), |g| (g, true));
        if secs / (iters as f64) < best.0 {
            best = (secs / iters as f64, from_timestamps);
        }
    }
    Ok(best)
}

/// Wall-clock seconds per call over `iters` calls between two synchronisations, best of three:
/// what a user sees, dispatch costs included.
fn wall_time(
    dev: &Device,
    iters: u32,
    mut f: impl FnMut() -> kiln::Result<Tensor>,
) -> kiln::Result<f64> {
    for _ in 0..3 {
        f()?;
    }
    dev.synchronize()?;
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..iters {
            f()?;
        }
        dev.synchronize()?;
        best = best.min(t.elapsed().as_secs_f64() / iters as f64);
    }
    Ok(best)
}

fn ops_suite(dev: &Device, rows: &mut Vec<Row>) -> kiln::Result<()> {
    let software = dev
        .adapter_info()
        .is_none_or(|a| a.device_type == wgpu::DeviceType::Cpu);
    // Software adapters get smaller problems: the figures there are for relative checks only.
    let (n, side, iters) = if software {
        (1usize << 22, 2048usize, 5)
    } else {
        (1 << 26, 8192, 50)
    };
    let mut push = |case: String, value: f64, unit: &'static str| {
        rows.push(Row {
            adapter: dev.name(),
            suite: "ops",
            case,
            value,
            unit,
        })
    };
    let x = Tensor::full(&[n], 1.5, DType::F32, dev)?;
    let a = Tensor::full(&[n], 0.5, DType::F32, dev)?;
    let m = Tensor::full(&[side, side], 1.0, DType::F32, dev)?;
    let mt = m.t()?;
    let sm_side = if software { 1024 } else { 4096 };
    let sm = Tensor::full(&[sm_side, sm_side], 0.5, DType::F32, dev)?;
    let log2 = n.trailing_zeros();
    type Case<'a> = (String, usize, Box<dyn Fn() -> kiln::Result<Tensor> + 'a>);
    let cases: Vec<Case> = vec![
        (
            format!("y=2x n=2^{log2}"),
            2 * 4 * n,
            Box::new(|| x.mul_scalar(2.0)),
        ),
        (format!("a+b n=2^{log2}"), 3 * 4 * n, Box::new(|| &x + &a)),
        (format!("sum n=2^{log2}"), 4 * n, Box::new(|| x.sum_all())),
        (
            format!("transpose {side}^2 contiguous"),
            2 * 4 * side * side,
            Box::new(|| mt.contiguous()),
        ),
        (
            format!("softmax {sm_side}^2 (dim -1)"),
            2 * 4 * sm_side * sm_side,
            Box::new(|| sm.softmax(-1)),
        ),
    ];
    for (name, bytes, f) in cases {
        let (t, stamped) = gpu_time(dev, iters, &f)?;
        let clock = if stamped { "timestamps" } else { "wall clock" };
        push(format!("{name} ({clock})"), bytes as f64 / t / 1e9, "GB/s");
        if stamped {
            let w = wall_time(dev, iters, &f)?;
            push(
                format!("{name} (wall clock)"),
                bytes as f64 / w / 1e9,
                "GB/s",
            );
        }
    }
    let f16 = dev.adapter_info().is_some_and(|a| a.features.shader_f16);
    // The timed matmuls multiply constants; first check the 128-tile kernel this adapter gets
    // (padded or swizzled shared memory) on ragged, transposed random operands against the CPU.
    {
        let cpu = Device::cpu()?;
        kiln::ops::force_matmul_tile(Some(128));
        let mut worst = 0f64;
        // Ragged shapes take the scalar kernel; whole aligned tiles the vec4 one (f32).
        for (m, k, n, transposed) in [
            (257, 131, 385, false),
            (300, 77, 260, true),
            (256, 48, 384, false),
            (256, 32, 128, true),
        ] {
            let a = Tensor::randn(&[m, k], DType::F32, &cpu)?;
            let b = Tensor::randn(&[k, n], DType::F32, &cpu)?;
            let (ga, gb) = (a.to_device(dev)?, b.to_device(dev)?);
            let (ga, gb) = if transposed {
                (ga.t()?.contiguous()?.t()?, gb.t()?.contiguous()?.t()?)
            } else {
                (ga, gb)
            };
            let got = ga.matmul(&gb)?.to_vec::<f32>()?;
            let want = a.matmul(&b)?.to_vec::<f32>()?;
            worst = worst.max(worst_relative(&got, &want));
        }
        // The bias epilogue: linear on whole tiles.
        let (x, w, b) = (
            Tensor::randn(&[256, 64], DType::F32, &cpu)?,
            Tensor::randn(&[384, 64], DType::F32, &cpu)?,
            Tensor::randn(&[384], DType::F32, &cpu)?,
        );
        let [gx, gw, gb] = [&x, &w, &b].map(|t| t.to_device(dev));
        let got = kiln::ops::linear(&gx?, &gw?, Some(&gb?))?.to_vec::<f32>()?;
        let want = kiln::ops::linear(&x, &w, Some(&b))?.to_vec::<f32>()?;
        worst = worst.max(worst_relative(&got, &want));
        kiln::ops::force_matmul_tile(None);
        if worst > 1e-4 {
            return Err(kiln::Error::InvalidArgument {
                op: "bench",
                msg: format!("matmul 128-tile check failed: relative error {worst}"),
            });
        }
        println!(
            "matmul 128-tile kernel check on {}: max relative error {worst:.2e}",
            dev.name()
        );
    }
    if f16 && std::env::var("KILN_BENCH_NOCHECK").is_err() {
        check_f16_matmul(dev)?;
    }
    let sizes: &[usize] = if software { &[256] } else { &[1024, 4096] };
    for &size in sizes {
        for dtype in [DType::F32, DType::F16] {
            if dtype == DType::F16 && (!f16 || (size < 4096 && !software)) {
                continue;
            }
            let a = Tensor::full(&[size, size], 0.01, dtype, dev)?;
            let b = Tensor::full(&[size, size], 0.02, dtype, dev)?;
            let reps = if software { 2 } else { 10 };
            let (t, stamped) = gpu_time(dev, reps, || a.matmul(&b))?;
            let clock = if stamped { "timestamps" } else { "wall clock" };
            let flops = 2.0 * (size as f64).powi(3);
            push(
                format!("matmul {dtype} {size} ({clock})"),
                flops / t / 1e12,
                "TFLOP/s",
            );
        }
    }
    let tiny = Tensor::full(&[1], 1.0, DType::F32, dev)?;
    let t = wall_time(dev, 2000, || tiny.add_scalar(1.0))?;
    push(
        "tiny op (1 element) amortised, wall clock".into(),
        t * 1e6,
        "us",
    );
    Ok(())
}

/// The f32 products of the big MLP step, by operand layout (GPU time): TFLOP/s.
fn matmul_suite(dev: &Device, rows: &mut Vec<Row>) -> kiln::Result<()> {
    let s = if dev
        .adapter_info()
        .is_none_or(|a| a.device_type == wgpu::DeviceType::Cpu)
    {
        8
    } else {
        1
    };
    let r = |d: usize| Tensor::randn(&[d / s, 4096 / s], DType::F32, dev);
    let (x, w) = (r(512)?, r(4096)?);
    let xt = x.t()?;
    let (wt, bias) = (w.t()?, Tensor::randn(&[4096 / s], DType::F32, dev)?);
    type Case<'a> = (
        &'static str,
        [usize; 3],
        Box<dyn Fn() -> kiln::Result<Tensor> + 'a>,
    );
    let cases: Vec<Case> = vec![
        ("x @ W^T", [512, 4096, 4096], Box::new(|| x.matmul(&wt))),
        (
            "linear(x, W, b)",
            [512, 4096, 4096],
            Box::new(|| kiln::ops::linear(&x, &w, Some(&bias))),
        ),
        ("g @ W", [512, 4096, 4096], Box::new(|| x.matmul(&w))),
        ("g^T @ x", [4096, 4096, 512], Box::new(|| xt.matmul(&x))),
        ("W @ W", [4096, 4096, 4096], Box::new(|| w.matmul(&w))),
    ];
    for (name, [m, n, k], f) in cases {
        let (t, stamped) = gpu_time(dev, 10, &f)?;
        let clock = if stamped { "timestamps" } else { "wall clock" };
        let flops = 2.0 * (m * n * k) as f64 / (s * s * s) as f64;
        rows.push(Row {
            adapter: dev.name(),
            suite: "matmul",
            case: format!("{name} {}x{}x{} f32 ({clock})", m / s, n / s, k / s),
            value: flops / t / 1e12,
            unit: "TFLOP/s",
        });
    }
    // The f16 product on tensor cores where the adapter has cooperative matrices, named by
    // the tile shape in force (`KILN_COOP_TILE` sweeps it).
    if s == 1 && dev.adapter_info().is_some_and(|a| a.features.shader_f16) {
        if std::env::var("KILN_BENCH_NOCHECK").is_err() {
            check_f16_matmul(dev)?;
        }
        let a = Tensor::randn(&[4096, 4096], DType::F16, dev)?;
        let b = Tensor::randn(&[4096, 4096], DType::F16, dev)?;
        let (t, stamped) = gpu_time(dev, 10, || a.matmul(&b))?;
        let clock = if stamped { "timestamps" } else { "wall clock" };
        rows.push(Row {
            adapter: dev.name(),
            suite: "matmul",
            case: format!(
                "A @ B 4096^3 f16, {} ({clock})",
                kiln::kernels::CoopTile::from_env().name()
            ),
            value: 2.0 * 4096f64.powi(3) / t / 1e12,
            unit: "TFLOP/s",
        });
    }
    Ok(())
}

/// One SGD-momentum training step of an MLP (PyTorch anchor: the same model, batch and step).
fn train_suite(dev: &Device, rows: &mut Vec<Row>) -> kiln::Result<()> {
    use kiln::nn::{cross_entropy, Linear, Module, Relu, Sequential};
    use kiln::optim::{Optimizer, Sgd};
    let software = dev
        .adapter_info()
        .is_none_or(|a| a.device_type == wgpu::DeviceType::Cpu);
    let cases: &[(&str, usize, usize, usize)] = if software {
        &[("784-128-10 b64", 128, 0, 64)]
    } else {
        &[
            ("784-4096-4096-10 b512", 4096, 4096, 512),
            ("784-128-10 b64", 128, 0, 64),
        ]
    };
    for &(name, h1, h2, batch) in cases {
        dev.manual_seed(0);
        let mut model = Sequential::new()
            .push(Linear::new(784, h1, true, dev)?)
            .push(Relu);
        let last = if h2 > 0 {
            model = model.push(Linear::new(h1, h2, true, dev)?).push(Relu);
            h2
        } else {
            h1
        };
        let model = model.push(Linear::new(last, 10, true, dev)?);
        let mut opt = Sgd::new(model.parameters(), 1e-2)?.momentum(0.9);
        let x = Tensor::randn(&[batch, 784], DType::F32, dev)?;
        let labels: Vec<i32> = (0..batch as i32).map(|i| i % 10).collect();
        let y = Tensor::from_slice(&labels, &[batch], dev)?;
        let mut step = || -> kiln::Result<Tensor> {
            opt.zero_grad(true)?;
            let loss = cross_entropy(&model.forward(&x)?, &y)?;
            loss.backward()?;
            opt.step()?;
            Ok(loss)
        };
        dev.synchronize()?;
        dev.reset_peak_memory_stats();
        for _ in 0..5 {
            step()?;
        }
        let iters = if software { 20 } else { 200 };
        let t = wall_time(dev, iters, &mut step)?;
        // KILN_BENCH_PROFILE=1: where ten steps' GPU time goes, by op and input shape.
        if std::env::var("KILN_BENCH_PROFILE").is_ok() {
            let options = kiln::profiler::ProfileOptions {
                devices: vec![dev.clone()],
                profile_memory: false,
            };
            let ((), prof) = kiln::profiler::profile(&options, || {
                for _ in 0..10 {
                    step()?;
                }
                dev.synchronize()
            })?;
            println!(
                "{name}, ten steps:\n{}",
                prof.key_averages_by(true).table("self_gpu_time_total", 30)
            );
        }
        rows.push(Row {
            adapter: dev.name(),
            suite: "train",
            case: format!("MLP {name} SGD-momentum step f32 (wall clock)"),
            value: t * 1e3,
            unit: "ms",
        });
        rows.push(Row {
            adapter: dev.name(),
            suite: "train",
            case: format!("MLP {name} max_memory_allocated"),
            value: dev.max_memory_allocated() as f64 / (1 << 20) as f64,
            unit: "MiB",
        });
    }
    Ok(())
}

/// Host-device copies of 1, 64 and 256 MiB: pageable and pinned non-blocking (kiln), against the
/// naive wgpu paths (`queue.write_buffer`; a fresh `MAP_READ` buffer, `map_async` and a copy into
/// a new `Vec`), and the latency of a small non-blocking round trip. GB/s are 1e9 bytes/s, as
/// the PyTorch anchor prints them.
fn transfer_suite(dev: &Device, rows: &mut Vec<Row>) -> kiln::Result<()> {
    use kiln::PinnedKind;
    let (Some(raw), Some(queue)) = (
        kiln::device::raw_wgpu_device(dev),
        kiln::device::raw_wgpu_queue(dev),
    ) else {
        return Ok(());
    };
    let cpu = Device::cpu()?;
    let mut push = |case: String, bytes: usize, secs: f64| {
        rows.push(Row {
            adapter: dev.name(),
            suite: "transfer",
            case,
            value: bytes as f64 / secs / 1e9,
            unit: "GB/s",
        })
    };
    for mib in [1usize, 64, 256] {
        let bytes = mib << 20;
        let n = bytes / 4;
        let host = Tensor::rand(&[n], DType::F32, &cpu)?;
        let g = Tensor::empty(&[n], DType::F32, dev)?;
        let up = host.pin_memory(dev)?;
        let down = Tensor::empty_pinned(&[n], DType::F32, dev, PinnedKind::Download)?;
        // Batches of copies then one wait, as the anchor times 10 copies between syncs.
        let batch = |f: &dyn Fn() -> kiln::Result<kiln::Transfer>| {
            time_per_iter(|| {
                let mut last = None;
                for _ in 0..4 {
                    last = Some(f().unwrap());
                }
                last.unwrap().wait().unwrap();
            }) / 4.0
        };
        let t = batch(&|| g.copy_non_blocking_(&up));
        push(format!("h2d pinned non_blocking {mib} MiB"), bytes, t);
        let t = batch(&|| down.copy_non_blocking_(&g));
        push(format!("d2h pinned non_blocking {mib} MiB"), bytes, t);
        let t = time_per_iter(|| {
            g.copy_(&host).unwrap();
            dev.synchronize().unwrap();
        });
        push(format!("h2d pageable {mib} MiB"), bytes, t);
        let t = time_per_iter(|| host.copy_(&g).unwrap());
        push(format!("d2h pageable {mib} MiB"), bytes, t);
        // The host side of a pinned upload: writing into upload memory (pin_memory's copy, or
        // a DataLoader filling a batch), which on a large-BAR GPU is the PCIe transfer itself.
        let t = time_per_iter(|| drop(host.pin_memory(dev).unwrap()));
        push(
            format!("host write into pinned (pin_memory) {mib} MiB"),
            bytes,
            t,
        );
        // Naive wgpu on a buffer of its own.
        let buf = raw.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: bytes as u64,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let data = host.to_vec::<f32>()?;
        let data: &[u8] = bytemuck::cast_slice(&data);
        let t = time_per_iter(|| {
            queue.write_buffer(&buf, 0, data);
            let idx = queue.submit([]);
            raw.poll(wgpu::PollType::Wait {
                submission_index: Some(idx),
                timeout: None,
            })
            .unwrap();
        });
        push(format!("h2d naive write_buffer {mib} MiB"), bytes, t);
        let t = time_per_iter(|| {
            let stage = raw.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: bytes as u64,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            let mut enc = raw.create_command_encoder(&Default::default());
            enc.copy_buffer_to_buffer(&buf, 0, &stage, 0, bytes as u64);
            queue.submit([enc.finish()]);
            stage.slice(..).map_async(wgpu::MapMode::Read, |_| {});
            raw.poll(wgpu::PollType::wait_indefinitely()).unwrap();
            let v = stage.slice(..).get_mapped_range().unwrap().to_vec();
            std::hint::black_box(v);
        });
        push(format!("d2h naive map_async+to_vec {mib} MiB"), bytes, t);
    }
    // A small round trip: 4 KiB up and back, non-blocking, then wait.
    let host = Tensor::rand(&[1024], DType::F32, &cpu)?;
    let up = host.pin_memory(dev)?;
    let down = Tensor::empty_pinned(&[1024], DType::F32, dev, PinnedKind::Download)?;
    let g = Tensor::empty(&[1024], DType::F32, dev)?;
    let t = time_per_iter(|| {
        g.copy_non_blocking_(&up).unwrap();
        down.copy_non_blocking_(&g).unwrap().wait().unwrap();
    });
    rows.push(Row {
        adapter: dev.name(),
        suite: "transfer",
        case: "4 KiB non_blocking round trip".into(),
        value: t * 1e6,
        unit: "us",
    });
    Ok(())
}

/// Whether batch assembly and uploads overlap the training step: wall clock per step of an MLP
/// step on (a) one resident batch (compute only), (b) the pinned, prefetching `DataLoader`, and
/// (c) batches built on the main thread and copied from pageable memory. (b) close to (a) means
/// the worker's assembly and the non-blocking uploads are hidden behind the GPU's work.
fn loader_suite(dev: &Device, rows: &mut Vec<Row>) -> kiln::Result<()> {
    use kiln::data::{synthetic_glyphs, DataLoader, LoaderOptions};
    use kiln::nn::{cross_entropy, Linear, Module, Relu, Sequential};
    use kiln::optim::{Optimizer, Sgd};
    let software = dev
        .adapter_info()
        .is_none_or(|a| a.device_type == wgpu::DeviceType::Cpu);
    let (n, batch, hidden) = if software {
        (1024, 128, 128)
    } else {
        (16384, 2048, 1024)
    };
    let set = std::sync::Arc::new(synthetic_glyphs(n, 3));
    dev.manual_seed(0);
    let model = Sequential::new()
        .push(Linear::new(784, hidden, true, dev)?)
        .push(Relu)
        .push(Linear::new(hidden, hidden, true, dev)?)
        .push(Relu)
        .push(Linear::new(hidden, 10, true, dev)?);
    let mut opt = Sgd::new(model.parameters(), 1e-2)?.momentum(0.9);
    let mut step = |x: &Tensor, y: &Tensor| -> kiln::Result<()> {
        opt.zero_grad(true)?;
        let x = x.reshape(&[-1, 784])?;
        cross_entropy(&model.forward(&x)?, y)?.backward()?;
        opt.step()
    };
    let steps = n / batch;
    let mut report = |case: &str, secs: f64| {
        rows.push(Row {
            adapter: dev.name(),
            suite: "loader",
            case: format!("{case} (b{batch}, 784-{hidden}-{hidden}-10)"),
            value: secs / steps as f64 * 1e3,
            unit: "ms/step",
        })
    };
    let opts = LoaderOptions {
        batch_size: batch,
        shuffle: true,
        drop_last: true,
        ..Default::default()
    };
    // (a) compute only.
    let mut loader = DataLoader::new(set.clone(), dev, opts.clone())?;
    let (x0, y0) = loader.iter().next().expect("a batch")?;
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..steps {
            step(&x0, &y0)?;
        }
        dev.synchronize()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    report("resident batch (compute only)", best);
    // (b) the pinned, prefetching loader.
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        for b in loader.iter() {
            let (x, y) = b?;
            step(&x, &y)?;
        }
        dev.synchronize()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    report("DataLoader pin_memory prefetch 2", best);
    // The loader alone: its throughput bounds (b) from below.
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        for b in loader.iter() {
            drop(b?);
        }
        dev.synchronize()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    report("DataLoader alone (no step)", best);
    // (b') four threads assembling each batch.
    let mut loader4 = DataLoader::new(
        set.clone(),
        dev,
        LoaderOptions {
            num_workers: 4,
            ..opts.clone()
        },
    )?;
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        for b in loader4.iter() {
            let (x, y) = b?;
            step(&x, &y)?;
        }
        dev.synchronize()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    report("DataLoader pin_memory prefetch 2, num_workers 4", best);
    // (c) assembled on the main thread, pageable copies.
    let px = 784;
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        for s in 0..steps {
            let mut images = Vec::with_capacity(batch * px);
            let mut labels = Vec::with_capacity(batch);
            for i in s * batch..(s + 1) * batch {
                images.extend_from_slice(set.image(i));
                labels.push(set.labels[i]);
            }
            let x = Tensor::from_slice(&images, &[batch, 1, 28, 28], dev)?;
            let y = Tensor::from_slice(&labels, &[batch], dev)?;
            step(&x, &y)?;
        }
        dev.synchronize()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    report("main-thread batches, pageable copies", best);
    Ok(())
}

fn main() -> kiln::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opt = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let adapter = opt("--adapter").unwrap_or_else(|| "all".into());
    let suite = opt("--suite").unwrap_or_else(|| "all".into());
    let mut devices = Device::all_gpus();
    if devices.is_empty() {
        devices.push(Device::cpu()?);
    }
    if adapter != "all" {
        let i: usize = adapter.parse().map_err(|_| kiln::Error::InvalidArgument {
            op: "bench",
            msg: format!("--adapter takes all or an index, got {adapter}"),
        })?;
        devices = devices.into_iter().skip(i).take(1).collect();
    }
    let mut rows = Vec::new();
    for dev in &devices {
        if suite == "all" || suite == "ops" {
            ops_suite(dev, &mut rows)?;
        }
        if suite == "all" || suite == "matmul" {
            matmul_suite(dev, &mut rows)?;
        }
        if suite == "all" || suite == "alloc" {
            alloc_suite(dev, &mut rows);
        }
        if suite == "all" || suite == "train" {
            train_suite(dev, &mut rows)?;
        }
        if suite == "all" || suite == "transfer" {
            transfer_suite(dev, &mut rows)?;
        }
        if suite == "all" || suite == "loader" {
            loader_suite(dev, &mut rows)?;
        }
    }
    println!(
        "{:<50} {:<8} {:<36} {:>12}",
        "adapter", "suite", "case", "value"
    );
    for r in &rows {
        println!(
            "{:<50} {:<8} {:<36} {:>10.3} {}",
            r.adapter, r.suite, r.case, r.value, r.unit
        );
    }
    if let Some(path) = opt("--json") {
        let json: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| serde_json::json!({"adapter": r.adapter, "suite": r.suite, "case": r.case, "value": r.value, "unit": r.unit}))
            .collect();
        std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap()).map_err(|e| {
            kiln::Error::InvalidArgument {
                op: "bench",
                msg: format!("writing {path}: {e}"),
            }
        })?;
    }
    Ok(())
}

/// The f16 matmul (tensor cores where the adapter has cooperative matrices: these shapes are
/// whole tiles) on random operands, a batch and an offset view, against the CPU's product of the
/// same f16 values in f32: only the final rounding to f16 differs.
fn check_f16_matmul(dev: &Device) -> kiln::Result<()> {
    let cpu = Device::cpu()?;
    let mut worst = 0f64;
    for (batch, m, k, n, offset) in [
        (1, 256, 512, 256, 0),
        (2, 256, 96, 512, 0),
        (1, 512, 256, 256, 8),
    ] {
        let a = Tensor::randn(&[batch, m + offset, k], DType::F32, &cpu)?
            .to_dtype(DType::F16)?
            .narrow(1, offset, m)?;
        let b = Tensor::randn(&[batch, k, n], DType::F32, &cpu)?.to_dtype(DType::F16)?;
        let got = a
            .to_device(dev)?
            .matmul(&b.to_device(dev)?)?
            .to_dtype(DType::F32)?
            .to_vec::<f32>()?;
        let want = a
            .to_dtype(DType::F32)?
            .matmul(&b.to_dtype(DType::F32)?)?
            .to_vec::<f32>()?;
        worst = worst.max(worst_relative(&got, &want));
    }
    // f16 keeps 11 significant bits: the cast of the f32 sum is off by at most 2^-11 of it.
    if worst > 1e-3 {
        return Err(kiln::Error::InvalidArgument {
            op: "bench",
            msg: format!("f16 matmul check failed: relative error {worst}"),
        });
    }
    println!(
        "f16 matmul check on {}: max relative error {worst:.2e}",
        dev.name()
    );
    Ok(())
}

/// The largest error of `got` against `want`, relative to `1 + |want|`.
fn worst_relative(got: &[f32], want: &[f32]) -> f64 {
    got.iter()
        .zip(want)
        .map(|(g, w)| ((g - w).abs() / (1.0 + w.abs())) as f64)
        .fold(0.0, f64::max)
}
