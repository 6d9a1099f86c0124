//! Tunes kiln's kernels ahead of time on every GPU adapter (or one), so that the first real run
//! starts tuned: runs the ops whose kernel is chosen by measurement (sum, softmax, transposed
//! copies, matmuls) at the size classes of the `train` example and of common layers, then prints
//! what won and where the choices were written.
//!
//! `cargo run --release --example autotune [-- --device vulkan:0] [--retune]`
//!
//! Choices already in the cache file are kept (nothing is measured twice) unless `--retune`.
//! With `KILN_AUTOTUNE=off` there is nothing to tune.

use indicatif::{ProgressBar, ProgressStyle};
use kiln::kernels::tune;
use kiln::{DType, Device, Tensor};
use std::time::Instant;

/// One op at one size: what the progress bar names, and the op.
type Job = (String, Box<dyn Fn(&Device, DType) -> kiln::Result<Tensor>>);

fn jobs() -> Vec<Job> {
    let mut v: Vec<Job> = Vec::new();
    for log2 in [16, 18, 20, 22, 24] {
        v.push((
            format!("sum 2^{log2}"),
            Box::new(move |d, t| Tensor::ones(&[1 << log2], t, d)?.sum_all()),
        ));
    }
    for (rows, cols) in [(64, 10), (512, 10), (1024, 1024), (4096, 4096), (32, 1000)] {
        v.push((
            format!("softmax {rows}x{cols}"),
            Box::new(move |d, t| Tensor::ones(&[rows, cols], t, d)?.softmax(-1)),
        ));
        v.push((
            format!("sum rows {rows}x{cols}"),
            Box::new(move |d, t| Tensor::ones(&[rows, cols], t, d)?.sum(&[1], false)),
        ));
    }
    for side in [512, 1024, 2048, 4096] {
        v.push((
            format!("transpose {side}^2"),
            Box::new(move |d, t| Tensor::ones(&[side, side], t, d)?.t()?.contiguous()),
        ));
    }
    // The train example's MLP (784-128-10, batch 64) forward and both gradients, and square
    // products.
    for (m, k, n) in [(64, 784, 128), (64, 128, 10), (128, 64, 784), (10, 64, 128)] {
        v.push((
            format!("matmul {m}x{k} @ {k}x{n}"),
            Box::new(move |d, t| {
                let a = Tensor::ones(&[m, k], t, d)?;
                let b = Tensor::ones(&[n, k], t, d)?;
                a.matmul(&b.t()?)?;
                a.matmul(&Tensor::ones(&[k, n], t, d)?)
            }),
        ));
    }
    for side in [256, 512, 1024, 2048] {
        v.push((
            format!("matmul {side}^3"),
            Box::new(move |d, t| {
                let a = Tensor::ones(&[side, side], t, d)?;
                a.matmul(&a)
            }),
        ));
    }
    v
}

fn main() -> kiln::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let device = args
        .iter()
        .position(|a| a == "--device")
        .and_then(|i| args.get(i + 1));
    let devices = match device {
        Some(spec) => vec![Device::from_spec(spec)?],
        None => Device::all_gpus(),
    };
    if tune::autotune() == tune::Autotune::Off {
        println!("KILN_AUTOTUNE=off: kernels are the fixed defaults, nothing to tune");
        return Ok(());
    }
    let path = tune::cache_path();
    println!(
        "cache file: {}",
        path.as_ref()
            .map_or("none (no cache directory)".into(), |p| p
                .display()
                .to_string())
    );
    for dev in devices.iter().filter(|d| !d.is_cpu()) {
        if args.iter().any(|a| a == "--retune") {
            tune::forget(dev);
        }
        let f16 = dev.adapter_info().is_some_and(|a| a.features.shader_f16);
        let dtypes: Vec<DType> = [DType::F32, DType::F16]
            .into_iter()
            .filter(|&t| t == DType::F32 || f16)
            .collect();
        let jobs = jobs();
        let bar = ProgressBar::new((jobs.len() * dtypes.len()) as u64);
        bar.set_style(
            ProgressStyle::with_template("{msg:<32} {bar:30} {pos}/{len} [{elapsed}<{eta}]")
                .expect("a valid template"),
        );
        let start = Instant::now();
        for dtype in &dtypes {
            for (name, job) in &jobs {
                bar.set_message(format!("{name} {dtype}"));
                job(dev, *dtype)?;
                dev.synchronize()?;
                bar.inc(1);
            }
        }
        bar.finish_and_clear();
        let records = tune::tuned(dev);
        let measured: f64 = records
            .iter()
            .filter(|r| !r.from_cache)
            .map(|r| r.tuning_seconds)
            .sum();
        println!(
            "{}: {} size classes ({} measured now in {measured:.2} s, the rest from the cache), {:.2} s in all",
            dev.name(),
            records.len(),
            records.iter().filter(|r| !r.from_cache).count(),
            start.elapsed().as_secs_f64()
        );
        for r in records {
            let slowest = r.candidates.iter().map(|c| c.1).fold(0.0, f64::max);
            let best = r
                .candidates
                .iter()
                .map(|c| c.1)
                .fold(f64::INFINITY, f64::min);
            println!(
                "  {:<10} {:<44} {:<13} ({:.1}x over the slowest candidate)",
                r.family,
                r.key,
                r.winner,
                slowest / best
            );
        }
    }
    Ok(())
}
