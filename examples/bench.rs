//! kiln's benchmark runner: `cargo run --release --example bench -- [--adapter all|INDEX]
//! [--suite NAME] [--json PATH]`. Suites: `alloc` (cached allocation + free against raw wgpu
//! buffer creation). Prints a table per adapter; `--json` writes the figures.

use kiln::Device;
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
        if suite == "all" || suite == "alloc" {
            alloc_suite(dev, &mut rows);
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
