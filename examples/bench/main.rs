//! kiln's benchmark runner: `cargo run --release --example bench -- [--adapter all|INDEX]
//! [--suite NAME] [--json PATH]`. Suites: `alloc` (cached allocation + free against raw wgpu
//! buffer creation), `ops` (the work of `../shared/anchors/torch_anchor.py`: y=2x and a+b over
//! 2^26 f32, sum, 8192^2 transpose to contiguous, a tiny op's dispatch cost), `matmul` (the
//! big MLP step's f32 products by layout), `conv` (ResNet's 3x3 convolution, forward and
//! backward), `resnet` (a ResNet training step's time and peak memory), `train` (MLP steps: SGD-momentum and Adam, f32 and AMP f16), `transfer` (host-device copies: pageable, pinned non-blocking, naive wgpu), `loader`
//! (whether the DataLoader's assembly and uploads overlap training steps). Prints a table per
//! adapter; `--json` writes the figures.
//!
//! GPU times are wall-clock over a batch of launches with one `synchronize()` at the end (as the
//! anchor times 50 launches between two CUDA events): the per-launch figure includes kiln's
//! amortised dispatch cost, which is what a user sees.

mod attention;
mod checks;
mod gpt;
mod host;
mod plan;

use kiln::{DType, Device, Tensor};
use std::time::Instant;

pub(crate) struct Row {
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

/// Seconds per cached allocation + free of `size` bytes, as a row; the target that stays
/// (the allocator's target): under 0.5 us per pair on every adapter.
fn cached_pair(dev: &Device, size: u64, what: &str, rows: &mut Vec<Row>) -> f64 {
    drop(dev.allocate(size).unwrap());
    let cached = time_per_iter(|| drop(dev.allocate(std::hint::black_box(size)).unwrap()));
    let verdict = if cached < 0.5e-6 { "met" } else { "NOT met" };
    rows.push(Row {
        adapter: dev.name(),
        suite: "alloc",
        case: format!("cached alloc+free {size} B{what} (target < 0.5 us: {verdict})"),
        value: cached * 1e6,
        unit: "us",
    });
    cached
}

fn alloc_suite(dev: &Device, rows: &mut Vec<Row>) {
    for size in [4096u64, 4 << 20, 64 << 20] {
        let cached = cached_pair(dev, size, "", rows);
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
    // The same pair with expandable segments, where the adapter maps pages: blocks
    // of a mapped range, cached as any other.
    if dev
        .set_allocator_settings("expandable_segments:True")
        .is_ok()
        && dev.memory_snapshot().allocator_settings.expandable_segments
    {
        for size in [4096u64, 4 << 20, 64 << 20] {
            cached_pair(dev, size, ", expandable segments", rows);
        }
        dev.empty_cache();
    }
    let _ = dev.set_allocator_settings("expandable_segments:False");
}

/// Seconds per call of `f`: GPU time from timestamp queries around `iters` calls where the
/// adapter has them, else wall-clock time between two synchronisations; best of three.
/// Returns the time and whether it came from timestamps.
pub(crate) fn gpu_time(
    dev: &Device,
    iters: u32,
    mut f: impl FnMut() -> kiln::Result<Tensor>,
) -> kiln::Result<(f64, bool)> {
    // Warm-up: at least three calls and one second, so that a GPU idling at low clocks has
    // ramped up. The H100 drops its clocks within the seconds the CPU-side checks take, and
    // 200 ms did not bring them back: the first f16 product after the check ran at 72-89
    // TFLOP/s, the same product a moment later at 290.
    let start = Instant::now();
    let mut calls = 0;
    while calls < 3 || start.elapsed().as_secs_f64() < 1.0 {
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
    let software = is_software(dev);
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
    // log_softmax's forward and backward (4096 rows: a workgroup per row on a GPU), through
    // autograd as a model runs it; the gradient is set to None each time, as zero_grad does.
    let smx = sm.detach().requires_grad_(true)?;
    let smg = Tensor::full(&[sm_side, sm_side], 0.25, DType::F32, dev)?;
    let log_softmax_both = || -> kiln::Result<Tensor> {
        smx.zero_grad(true)?;
        smx.log_softmax(-1)?.backward_with(&smg, false)?;
        Ok(smg.clone())
    };
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
        (
            // (Forward: x read, y written; backward: y and g read, the gradient written.)
            format!("log_softmax {sm_side}^2 forward + backward"),
            5 * 4 * sm_side * sm_side,
            Box::new(log_softmax_both),
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
    // The timed matmuls multiply constants; first check the kernels against the CPU.
    checks::matmul128(dev)?;
    if f16 && std::env::var("KILN_BENCH_NOCHECK").is_err() {
        checks::f16_matmul(dev)?;
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
/// A software adapter (lavapipe, llvmpipe) or the CPU device: suites shrink their problems
/// there, whose figures are for relative checks only.
pub(crate) fn is_software(dev: &Device) -> bool {
    dev.adapter_info()
        .is_none_or(|a| a.device_type == wgpu::DeviceType::Cpu)
}

/// KILN_BENCH_PROFILE=1: prints where `steps` calls of `step` spend their GPU time, by op and
/// input shape (the `rows` largest).
fn print_profile(
    dev: &Device,
    label: &str,
    steps: usize,
    rows: usize,
    mut step: impl FnMut() -> kiln::Result<()>,
) -> kiln::Result<()> {
    if std::env::var("KILN_BENCH_PROFILE").is_err() {
        return Ok(());
    }
    let options = kiln::profiler::ProfileOptions {
        devices: vec![dev.clone()],
        profile_memory: false,
    };
    let ((), prof) = kiln::profiler::profile(&options, || {
        for _ in 0..steps {
            step()?;
        }
        dev.synchronize()
    })?;
    // KILN_BENCH_PROFILE=N: N rows instead of the suite's default.
    let rows = std::env::var("KILN_BENCH_PROFILE")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 1)
        .unwrap_or(rows);
    println!(
        "{label}, {steps} steps:\n{}",
        prof.key_averages_by(true)
            .table("self_gpu_time_total", rows)
    );
    Ok(())
}

fn matmul_suite(dev: &Device, rows: &mut Vec<Row>) -> kiln::Result<()> {
    let s = if is_software(dev) { 8 } else { 1 };
    let r = |d: usize| Tensor::randn(&[d / s, 4096 / s], DType::F32, dev);
    let (x, w) = (r(512)?, r(4096)?);
    let xt = x.t()?;
    let (wt, bias) = (w.t()?, Tensor::randn(&[4096 / s], DType::F32, dev)?);
    // The MLP's first layer: its 784-wide input and weight.
    let x1 = Tensor::randn(&[512 / s, 784 / s], DType::F32, dev)?;
    let w1t = Tensor::randn(&[4096 / s, 784 / s], DType::F32, dev)?.t()?;
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
        // The first layer's forward and weight gradient (224 tiles of 128 x 128: 1.7 waves
        // on the H100's 132 SMs, the last column of tiles 16 wide).
        ("x1 @ W1^T", [512, 4096, 784], Box::new(|| x1.matmul(&w1t))),
        ("g^T @ x1", [4096, 784, 512], Box::new(|| xt.matmul(&x1))),
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
            checks::f16_matmul(dev)?;
        }
        let a = Tensor::randn(&[4096, 4096], DType::F16, dev)?;
        let b = Tensor::randn(&[4096, 4096], DType::F16, dev)?;
        let (at, bt) = (a.t()?, b.t()?);

        type F16Case<'a> = (&'static str, Box<dyn Fn() -> kiln::Result<Tensor> + 'a>);
        let cases: [F16Case; 4] = [
            ("A @ B", Box::new(|| a.matmul(&b))),
            ("A @ B^T (linear)", Box::new(|| a.matmul(&bt))),
            ("A^T @ B", Box::new(|| at.matmul(&b))),
            ("A^T @ B^T", Box::new(|| at.matmul(&bt))),
        ];
        for ((name, f), layout) in cases.into_iter().zip(kiln::kernels::CoopLayout::ALL) {
            // The shapes tried for this layout at 4096^2 (32 x 32 tiles; the first that fits runs).
            let tiles = kiln::kernels::CoopTile::for_layout(layout, 32 * 32)
                .iter()
                .map(|t| t.name(layout))
                .collect::<Vec<_>>()
                .join(" or ");
            let (t, stamped) = gpu_time(dev, 10, f)?;
            let clock = if stamped { "timestamps" } else { "wall clock" };
            rows.push(Row {
                adapter: dev.name(),
                suite: "matmul",
                case: format!("{name} 4096^3 f16, {tiles} ({clock})"),
                value: 2.0 * 4096f64.powi(3) / t / 1e12,
                unit: "TFLOP/s",
            });
        }
    }
    Ok(())
}

/// conv2d 3x3 64->64 with padding 1 (ResNet-50's layer1 shape: 56x56, batch 32, on a GPU;
/// 16x16, batch 2, on a software adapter): the forward pass, and forward plus both gradients
/// through autograd (three products' FLOPs), f32 and f16 (PyTorch's anchor: cuDNN, TF32 off).
fn conv_suite(dev: &Device, rows: &mut Vec<Row>) -> kiln::Result<()> {
    use kiln::ops::{conv2d, Conv2dParams};
    let software = is_software(dev);
    let (n, hw) = if software { (2, 16) } else { (32, 56) };
    let p = Conv2dParams {
        padding: (1, 1),
        ..Default::default()
    };
    let mut dtypes = vec![DType::F32];
    if dev.adapter_info().is_some_and(|a| a.features.shader_f16) {
        dtypes.push(DType::F16);
    }
    let flops = 2.0 * (n * 64 * 64 * 9 * hw * hw) as f64;
    for dtype in dtypes {
        if dtype == DType::F16 {
            checks::conv_f16(dev)?;
        }
        let x = Tensor::randn(&[n, 64, hw, hw], dtype, dev)?;
        let w = Tensor::randn(&[64, 64, 3, 3], dtype, dev)?.mul_scalar(0.05)?;
        let (t, stamped) = gpu_time(dev, 10, || conv2d(&x, &w, None, p))?;
        print_profile(dev, &format!("conv {dtype} forward"), 5, 10, || {
            conv2d(&x, &w, None, p).map(drop)
        })?;
        let clock = if stamped { "timestamps" } else { "wall clock" };
        rows.push(Row {
            adapter: dev.name(),
            suite: "conv",
            case: format!("conv2d 3x3 64->64 {hw}x{hw} b{n} {dtype} forward ({clock})"),
            value: flops / t / 1e12,
            unit: "TFLOP/s",
        });
        let xg = x.detach().requires_grad_(true)?;
        let wg = w.detach().requires_grad_(true)?;
        let gy = Tensor::randn(&[n, 64, hw, hw], dtype, dev)?;
        // As the anchor's step: the gradients set to None first, so that backward stores them
        // rather than adding into the last step's (`torch_anchor_wave3.py`'s `fb`).
        let step = || {
            xg.set_grad(None)?;
            wg.set_grad(None)?;
            let y = conv2d(&xg, &wg, None, p)?;
            y.backward_with(&gy, false)?;
            Ok(y)
        };
        let (t, stamped) = gpu_time(dev, 5, step)?;
        print_profile(dev, &format!("conv {dtype}"), 5, 20, || step().map(drop))?;
        let clock = if stamped { "timestamps" } else { "wall clock" };
        rows.push(Row {
            adapter: dev.name(),
            suite: "conv",
            case: format!(
                "conv2d 3x3 64->64 {hw}x{hw} b{n} {dtype} forward + both gradients ({clock})"
            ),
            value: 3.0 * flops / t / 1e12,
            unit: "TFLOP/s",
        });
    }
    Ok(())
}

/// A ResNet training step as the anchor's `rstep`: `zero_grad(set_to_none)`, cross entropy of
/// the model's logits, backward, SGD with momentum 0.9; ResNet-50 at batch 32, 224x224 on a
/// GPU (the peak is `max_memory_allocated` over the steps), ResNet-18 at batch 2, 64x64 on a
/// software adapter.
fn resnet_suite(dev: &Device, rows: &mut Vec<Row>) -> kiln::Result<()> {
    let f16 = dev.adapter_info().is_some_and(|a| a.features.shader_f16);
    resnet_rows(dev, false, rows)?;
    if f16 {
        resnet_rows(dev, true, rows)?;
    }
    Ok(())
}

/// One ResNet step's rows, as `torch_anchor_wave3.py`'s `resnet_amp` takes it: a fresh model
/// after the cache is emptied, zero_grad(set_to_none), forward and loss under autocast (AMP),
/// `scaler.scale(loss).backward()`, `scaler.step(opt)`, `scaler.update()`; SGD with momentum
/// 0.9. The f32 row runs the same loop with autocast and the scaler disabled.
fn resnet_rows(dev: &Device, amp: bool, rows: &mut Vec<Row>) -> kiln::Result<()> {
    use kiln::amp::{autocast, DeviceType, GradScaler};
    use kiln::nn::models::{resnet18, resnet50};
    use kiln::nn::Module;
    use kiln::optim::{Optimizer, Sgd};
    let software = is_software(dev);
    dev.synchronize()?;
    dev.empty_cache();
    let (name, model, n, hw) = if software {
        ("resnet18", resnet18(1000, dev)?, 2, 64)
    } else {
        ("resnet50", resnet50(1000, dev)?, 32, 224)
    };
    let mut opt = Sgd::new(model.parameters(), 1e-2)?.momentum(0.9)?;
    let mut scaler = GradScaler::new().enabled(amp);
    let x = Tensor::randn(&[n, 3, hw, hw], DType::F32, dev)?;
    let labels: Vec<i32> = (0..n as i32).map(|i| i * 31 % 1000).collect();
    let y = Tensor::from_slice(&labels, &[n], dev)?;
    let mut step = || -> kiln::Result<()> {
        opt.zero_grad(true)?;
        let loss = {
            let _amp = autocast(DeviceType::Gpu, DType::F16, amp)?;
            kiln::nn::cross_entropy(&model.forward(&x)?, &y)?
        };
        scaler.scale(&loss)?.backward()?;
        scaler.step(&mut opt)?;
        scaler.update(None)
    };
    for _ in 0..3 {
        step()?;
    }
    dev.synchronize()?;
    dev.reset_peak_memory_stats();
    let iters = if software { 3 } else { 10 };
    let t = Instant::now();
    for _ in 0..iters {
        step()?;
    }
    dev.synchronize()?;
    let ms = t.elapsed().as_secs_f64() * 1e3 / iters as f64;
    let mode = if amp { "AMP f16" } else { "f32" };
    let case = format!("{name} b{n} {hw}x{hw} SGD momentum step {mode}");
    rows.push(Row {
        adapter: dev.name(),
        suite: "resnet",
        case: format!("{case} (wall clock)"),
        value: ms,
        unit: "ms",
    });
    rows.push(Row {
        adapter: dev.name(),
        suite: "resnet",
        case: format!("{case}: max_memory_allocated"),
        value: dev.max_memory_allocated() as f64 / (1 << 20) as f64,
        unit: "MiB",
    });
    print_profile(dev, &case, 1, 25, step)?;
    Ok(())
}

/// One training step of an MLP, PyTorch's loop (`torch_anchor_wave2.py`): `zero_grad(set_to_none)`,
/// forward and loss under autocast (AMP rows), `scaler.scale(loss).backward()`,
/// `scaler.step(opt)`, `scaler.update()`; SGD with momentum 0.9 or Adam. f32 rows run the same
/// loop with autocast and the scaler disabled, as the anchor does.
fn train_suite(dev: &Device, rows: &mut Vec<Row>) -> kiln::Result<()> {
    use kiln::amp::{autocast, DeviceType, GradScaler};
    use kiln::nn::{cross_entropy, Linear, Module, Relu, Sequential};
    use kiln::optim::{Adam, Optimizer, Sgd};
    let software = is_software(dev);
    let f16 = dev.adapter_info().is_some_and(|a| a.features.shader_f16);
    let sizes: &[(&str, usize, usize, usize)] = if software {
        &[("784-128-10 b64", 128, 0, 64)]
    } else {
        &[
            ("784-4096-4096-10 b512", 4096, 4096, 512),
            ("784-128-10 b64", 128, 0, 64),
        ]
    };
    let only = std::env::var("KILN_BENCH_TRAIN").ok();
    for &(name, h1, h2, batch) in sizes {
        for (opt_name, amp) in [
            ("SGD-momentum", false),
            ("Adam", false),
            ("SGD-momentum", true),
            ("Adam", true),
        ] {
            let case = format!(
                "MLP {name} {opt_name} step {}",
                if amp { "AMP f16" } else { "f32" }
            );
            if (amp && !f16) || only.as_ref().is_some_and(|o| !case.contains(o.as_str())) {
                continue;
            }
            dev.synchronize()?;
            dev.empty_cache();
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
            let mut opt: Box<dyn Optimizer> = match opt_name {
                "Adam" => Box::new(Adam::new(model.parameters(), 1e-3)?),
                _ => Box::new(Sgd::new(model.parameters(), 1e-2)?.momentum(0.9)?),
            };
            let mut scaler = GradScaler::new().enabled(amp);
            let x = Tensor::randn(&[batch, 784], DType::F32, dev)?;
            let labels: Vec<i32> = (0..batch as i32).map(|i| i % 10).collect();
            let y = Tensor::from_slice(&labels, &[batch], dev)?;
            let mut step = || -> kiln::Result<Tensor> {
                opt.zero_grad(true)?;
                let loss = {
                    let _amp = autocast(DeviceType::Gpu, DType::F16, amp)?;
                    cross_entropy(&model.forward(&x)?, &y)?
                };
                scaler.scale(&loss)?.backward()?;
                scaler.step(opt.as_mut())?;
                scaler.update(None)?;
                Ok(loss)
            };
            step()?;
            dev.synchronize()?;
            dev.reset_peak_memory_stats();
            for _ in 0..5 {
                step()?;
            }
            let iters = if software { 20 } else { 200 };
            let t = wall_time(dev, iters, &mut step)?;
            print_profile(dev, &case, 10, 30, || step().map(drop))?;
            rows.push(Row {
                adapter: dev.name(),
                suite: "train",
                case: format!("{case} (wall clock)"),
                value: t * 1e3,
                unit: "ms",
            });
            rows.push(Row {
                adapter: dev.name(),
                suite: "train",
                case: format!("{case} max_memory_allocated"),
                value: dev.max_memory_allocated() as f64 / (1 << 20) as f64,
                unit: "MiB",
            });
        }
    }
    Ok(())
}

/// Which kernel variant won each size class the suites met on `dev`, how long the tuning took
/// (0 where the choice came from the cache file of an earlier run), and every candidate's time.
fn autotune_rows(dev: &Device, rows: &mut Vec<Row>) {
    let tuned = kiln::kernels::tune::tuned(dev);
    if tuned.is_empty() {
        return;
    }
    println!(
        "autotune on {} ({:?}):",
        dev.name(),
        kiln::kernels::tune::autotune()
    );
    for r in tuned {
        let times = r
            .candidates
            .iter()
            .map(|(n, s)| format!("{n} {:.3} ms", s * 1e3))
            .collect::<Vec<_>>()
            .join(", ");
        let cached = if r.from_cache {
            " (from the cache)"
        } else {
            ""
        };
        println!(
            "  {:<10} {:<44} winner {:<10} tuned in {:.3} s{cached}: {times}",
            r.family, r.key, r.winner, r.tuning_seconds
        );
        rows.push(Row {
            adapter: dev.name(),
            suite: "autotune",
            case: format!("{} {} -> {}{cached}", r.family, r.key, r.winner),
            value: if r.from_cache { 0.0 } else { r.tuning_seconds },
            unit: "s",
        });
    }
}

/// The suites `--suite` takes.
const SUITES: [&str; 13] = [
    "all",
    "attention",
    "gpt",
    "ops",
    "matmul",
    "alloc",
    "conv",
    "resnet",
    "train",
    "transfer",
    "loader",
    "checkpoint",
    "plan",
];

/// What a durable checkpoint costs: ResNet-50's state dict (25,557,032 parameters plus the
/// BatchNorm buffers, 97.5 MiB) and a training checkpoint with SGD momentum for every
/// parameter (twice that), saved the way kiln saved before 2026-11-24 (serialised straight over
/// the target, no flush) and the way it saves now (a temporary file beside it, fsync, rename),
/// and loaded back with every key, shape and dtype checked. The median of three, in the
/// system's temporary directory; the tensors start on the device, so reading them back counts.
fn checkpoint_suite(dev: &Device, rows: &mut Vec<Row>) -> kiln::Result<()> {
    use kiln::nn::{models::resnet50, state_dict, Module};
    use kiln::training::Checkpoint;
    let model = resnet50(1000, dev)?;
    let named = state_dict(&model);
    let mut sgd = kiln::optim::Sgd::new(model.parameters(), 1e-2)?.momentum(0.9)?;
    // Momentum buffers as a first step makes them, without running the model: a gradient of
    // ones per parameter.
    for p in model.parameters() {
        p.set_grad(Some(p.ones_like()?))?;
    }
    kiln::optim::Optimizer::step(&mut sgd)?;
    let dir = std::env::temp_dir().join(format!("kiln-bench-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| kiln::Error::Io {
        op: "bench",
        path: dir.display().to_string(),
        msg: e.to_string(),
    })?;
    let path = dir.join("resnet50.safetensors");
    let median = |f: &mut dyn FnMut() -> kiln::Result<()>| -> kiln::Result<f64> {
        let mut t = Vec::new();
        for _ in 0..3 {
            let start = Instant::now();
            f()?;
            t.push(start.elapsed().as_secs_f64() * 1e3);
        }
        t.sort_by(f64::total_cmp);
        Ok(t[1])
    };
    // Before: the state dict serialised straight onto the path.
    let in_place = median(&mut || {
        let bytes: Vec<(String, Vec<u8>, Vec<usize>)> = named
            .iter()
            .map(|(n, t)| Ok((n.clone(), t.to_le_bytes()?, t.shape().to_vec())))
            .collect::<kiln::Result<_>>()?;
        let views: Vec<(String, safetensors::tensor::TensorView)> = bytes
            .iter()
            .map(|(n, b, s)| {
                (
                    n.clone(),
                    safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b)
                        .expect("a consistent view"),
                )
            })
            .collect();
        safetensors::serialize_to_file(views, None, &path).map_err(|e| kiln::Error::Io {
            op: "bench",
            path: path.display().to_string(),
            msg: e.to_string(),
        })
    })?;
    let atomic = median(&mut || kiln::nn::save_safetensors(&path, &named))?;
    let ck_path = dir.join("checkpoint.safetensors");
    let checkpoint = median(&mut || {
        Checkpoint {
            model: named.clone(),
            optimizer: Some(&mut sgd),
            generator: Some(dev.clone()),
            ..Default::default()
        }
        .save(&ck_path)
    })?;
    let load = median(&mut || {
        Checkpoint {
            model: named.clone(),
            optimizer: Some(&mut sgd),
            generator: Some(dev.clone()),
            ..Default::default()
        }
        .load(&ck_path)
    })?;
    let _ = std::fs::remove_dir_all(&dir);
    for (case, value) in [
        ("resnet50 state dict save, in place (before)", in_place),
        ("resnet50 state dict save, atomic + fsync", atomic),
        ("resnet50 + SGD momentum checkpoint save", checkpoint),
        ("resnet50 + SGD momentum checkpoint load", load),
    ] {
        rows.push(Row {
            adapter: dev.name(),
            suite: "ckpt",
            case: case.into(),
            value,
            unit: "ms",
        });
    }
    Ok(())
}

fn main() -> kiln::Result<()> {
    // An unknown option, a missing value or an unknown suite is an error that lists the valid
    // ones (clap), not an empty table.
    let cli = clap::Command::new("bench")
        .about("kiln's benchmarks: one table (and optionally JSON) per adapter")
        .arg(
            clap::Arg::new("adapter")
                .long("adapter")
                .value_name("all|INDEX|cpu")
                .default_value("all")
                .help("every GPU adapter, the one at this index, or the CPU device"),
        )
        .arg(
            clap::Arg::new("suite")
                .long("suite")
                .default_value("all")
                .value_parser(clap::builder::PossibleValuesParser::new(SUITES)),
        )
        .arg(
            clap::Arg::new("json")
                .long("json")
                .value_name("FILE")
                .help("also write the rows as JSON"),
        )
        .arg(
            clap::Arg::new("plan-for")
                .long("plan-for")
                .value_name("GPU")
                .default_value("H100")
                .help("the known GPU the plan suite's GPT-2 124M dry run plans for"),
        )
        .get_matches();
    let text = |name: &str| cli.get_one::<String>(name).cloned();
    let adapter = text("adapter").unwrap_or_else(|| "all".into());
    let suite = text("suite").unwrap_or_else(|| "all".into());
    let mut devices = if adapter == "cpu" {
        vec![Device::cpu()?]
    } else {
        Device::all_gpus()
    };
    if devices.is_empty() {
        devices.push(Device::cpu()?);
    }
    if adapter != "all" && adapter != "cpu" {
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
        if suite == "all" || suite == "conv" {
            conv_suite(dev, &mut rows)?;
        }
        if suite == "all" || suite == "resnet" {
            resnet_suite(dev, &mut rows)?;
        }
        if suite == "all" || suite == "train" {
            train_suite(dev, &mut rows)?;
        }
        if suite == "all" || suite == "transfer" {
            host::transfer_suite(dev, &mut rows)?;
        }
        if suite == "all" || suite == "loader" {
            host::loader_suite(dev, &mut rows)?;
        }
        if suite == "all" || suite == "attention" {
            attention::attention_suite(dev, &mut rows)?;
        }
        if suite == "all" || suite == "gpt" {
            gpt::gpt_suite(dev, &mut rows)?;
        }
        if suite == "all" || suite == "checkpoint" {
            checkpoint_suite(dev, &mut rows)?;
        }
        if (suite == "all" || suite == "plan") && !dev.is_cpu() {
            plan::plan_suite(dev, &mut rows)?;
        }
        autotune_rows(dev, &mut rows);
    }
    if suite == "all" || suite == "plan" {
        plan::named_rows(&text("plan-for").unwrap_or_default(), &mut rows)?;
    }
    println!(
        "{:<50} {:<8} {:<36} {:>12}",
        "adapter", "suite", "case", "value"
    );
    for r in &rows {
        // Figures under 0.1 (a software adapter's TFLOP/s) keep three significant digits.
        let value = if r.value.abs() < 0.1 && r.value != 0.0 {
            format!("{:>10.5}", r.value)
        } else {
            format!("{:>10.3}", r.value)
        };
        println!(
            "{:<50} {:<8} {:<36} {value} {}",
            r.adapter, r.suite, r.case, r.unit
        );
    }
    if let Some(path) = text("json") {
        write_json(&path, &devices, &rows)?;
    }
    Ok(())
}

/// The kiln commit this binary was built from: `KILN_COMMIT` where the caller sets it (a
/// device machine has the tree but not its history), else `git describe` of the checkout.
fn kiln_commit() -> String {
    if let Ok(c) = std::env::var("KILN_COMMIT") {
        return c;
    }
    std::process::Command::new("git")
        .args(["describe", "--always", "--dirty", "--abbrev=7"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// `--json`: the rows, and what `tools/bench_tables.py` needs to date and place them (the
/// day, the kiln commit, each adapter's backend and driver). Written to a temporary file and
/// renamed over `path`, as kiln writes every file.
fn write_json(path: &str, devices: &[Device], rows: &[Row]) -> kiln::Result<()> {
    let mut adapters: Vec<serde_json::Value> = devices
        .iter()
        .map(|d| match d.adapter_info() {
            Some(i) => serde_json::json!({
                "adapter": d.name(), "name": i.name, "backend": format!("{:?}", i.backend),
                "device_type": format!("{:?}", i.device_type), "driver": i.driver,
                "driver_info": i.driver_info,
            }),
            None => serde_json::json!({"adapter": d.name(), "name": "CPU device",
                "backend": "cpu", "device_type": "Cpu", "driver": "", "driver_info": ""}),
        })
        .collect();
    // The planning devices of `--suite plan` (rows under a name of no real device).
    let planned: std::collections::BTreeSet<&str> = rows
        .iter()
        .map(|r| r.adapter.as_str())
        .filter(|a| !devices.iter().any(|d| d.name() == *a))
        .collect();
    adapters.extend(planned.into_iter().map(|a| {
        serde_json::json!({"adapter": a, "name": a, "backend": "Plan",
            "device_type": "DryRun", "driver": "dry run: no memory allocated, no kernel run",
            "driver_info": ""})
    }));
    let rows: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| serde_json::json!({"adapter": r.adapter, "suite": r.suite, "case": r.case, "value": r.value, "unit": r.unit}))
        .collect();
    let json = serde_json::json!({
        "meta": {
            "date": today(),
            "commit": kiln_commit(),
            "kiln_version": env!("CARGO_PKG_VERSION"),
            "host_cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
            "adapters": adapters,
        },
        "rows": rows,
    });
    let io = |e: std::io::Error| kiln::Error::InvalidArgument {
        op: "bench",
        msg: format!("writing {path}: {e}"),
    };
    let tmp = format!("{path}.tmp-{}", std::process::id());
    let text = serde_json::to_string_pretty(&json).map_err(|e| io(std::io::Error::other(e)))?;
    std::fs::write(&tmp, text).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// Today's date (UTC) as `YYYY-MM-DD`, from the system clock (civil-from-days, Howard
/// Hinnant's algorithm), so the bench needs no date crate.
fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}
