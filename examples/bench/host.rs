use crate::{time_per_iter, Row};
use kiln::{DType, Device, Tensor};
use std::time::Instant;

/// Host-device copies of 1, 64 and 256 MiB: pageable and pinned non-blocking (kiln), against the
/// naive wgpu paths (`queue.write_buffer`; a fresh `MAP_READ` buffer, `map_async` and a copy into
/// a new `Vec`), and the latency of a small non-blocking round trip. GB/s are 1e9 bytes/s, as
/// the PyTorch anchor prints them.
pub fn transfer_suite(dev: &Device, rows: &mut Vec<Row>) -> kiln::Result<()> {
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
pub fn loader_suite(dev: &Device, rows: &mut Vec<Row>) -> kiln::Result<()> {
    use kiln::data::{synthetic_glyphs, DataLoader, LoaderOptions};
    use kiln::nn::{cross_entropy, Linear, Module, Relu, Sequential};
    use kiln::optim::{Optimizer, Sgd};
    let software = super::is_software(dev);
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
    let mut opt = Sgd::new(model.parameters(), 1e-2)?.momentum(0.9)?;
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
