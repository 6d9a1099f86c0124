//! The training that fragments memory, with and without `expandable_segments:True`: an MLP
//! trained on batch sizes cycling 256, 512, 256, 1024 (PyTorch's 32, 64, 32, 128, scaled so the
//! activations live in the large pool), then an LSTM cell unrolled over sequence lengths cycling
//! 16, 64, 32, 128. Per step it prints reserved, allocated and the largest free cached block;
//! at the end, peak reserved over peak allocated for both runs, and both timelines.
//!
//!     cargo run --release --example fragmentation -- [--device SPEC] [--steps N] [--out DIR]
//!
//! `tools/fragmentation_in_torch.py` runs the same program in PyTorch; its H100 figures are in
//! BENCHMARKS.md. Where the device cannot map pages (no Vulkan sparse binding), the expandable
//! run prints one warning and uses ordinary segments, so both runs read alike.

use indicatif::{ProgressBar, ProgressStyle};
use kiln::alloc::{format_size, HistoryContext, HistoryEnabled, HistoryStacks};
use kiln::nn::{cross_entropy, mse_loss, Linear, LstmCell, Module, Relu, Sequential};
use kiln::optim::{Optimizer, Sgd};
use kiln::{DType, Device, Tensor};
use std::path::PathBuf;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    let at = args.iter().position(|a| a == name)?;
    args.get(at + 1).cloned()
}

struct Outcome {
    peak_reserved: u64,
    peak_allocated: u64,
    losses: Vec<f32>,
}

fn run(
    dev: &Device,
    expandable: bool,
    steps: usize,
    out: &std::path::Path,
) -> kiln::Result<Outcome> {
    dev.set_allocator_settings(if expandable {
        "expandable_segments:True"
    } else {
        "expandable_segments:False"
    })?;
    dev.record_memory_history(
        Some(HistoryEnabled::All),
        HistoryContext::All,
        HistoryStacks::Kiln,
        500_000,
    );
    dev.reset_peak_memory_stats();
    dev.manual_seed(0);
    let mlp = Sequential::new()
        .push(Linear::new(784, 2048, true, dev)?)
        .push(Relu)
        .push(Linear::new(2048, 2048, true, dev)?)
        .push(Relu)
        .push(Linear::new(2048, 10, true, dev)?);
    let lstm = LstmCell::new(64, 512, dev)?;
    let mut params = mlp.parameters();
    params.extend(lstm.parameters());
    let mut opt = Sgd::new(params, 0.01)?.momentum(0.9)?;
    let label = if expandable { "expandable" } else { "segments" };
    println!("\n{label}: step, batch or length, reserved, allocated, largest free block");
    let bar = ProgressBar::new(2 * steps as u64).with_style(
        ProgressStyle::with_template("{prefix:>10} [{bar:30}] {pos}/{len} ({elapsed})")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(label);
    let mut losses = Vec::new();
    let report = |what: String, dev: &Device, bar: &ProgressBar| {
        let line = format!(
            "  {what:<14} reserved {:>10}  allocated {:>10}  largest free {:>10}",
            format_size(dev.memory_reserved()),
            format_size(dev.memory_allocated()),
            format_size(dev.largest_free_block()),
        );
        bar.suspend(|| println!("{line}"));
        bar.inc(1);
    };
    for step in 0..steps {
        let n = [256, 512, 256, 1024][step % 4];
        let x = Tensor::randn(&[n, 784], DType::F32, dev)?;
        let y: Vec<i32> = (0..n as i32).map(|i| i % 10).collect();
        let y = Tensor::from_slice(&y, &[n], dev)?;
        opt.zero_grad(true)?;
        let loss = cross_entropy(&mlp.forward(&x)?, &y)?;
        loss.backward()?;
        opt.step()?;
        losses.push(loss.item::<f32>()?);
        report(format!("mlp {step:>3} b{n}"), dev, &bar);
    }
    for step in 0..steps {
        let len = [16, 64, 32, 128][step % 4];
        let (b, hidden) = (32, 512);
        let mut h = Tensor::zeros(&[b, hidden], DType::F32, dev)?;
        let mut c = Tensor::zeros(&[b, hidden], DType::F32, dev)?;
        opt.zero_grad(true)?;
        for _ in 0..len {
            let x = Tensor::randn(&[b, 64], DType::F32, dev)?;
            (h, c) = lstm.step(&x, (&h, &c))?;
        }
        let loss = mse_loss(&h, &Tensor::zeros(&[b, hidden], DType::F32, dev)?)?;
        loss.backward()?;
        opt.step()?;
        losses.push(loss.item::<f32>()?);
        report(format!("lstm {step:>3} t{len}"), dev, &bar);
    }
    bar.finish_and_clear();
    dev.synchronize()?;
    let outcome = Outcome {
        peak_reserved: dev.max_memory_reserved(),
        peak_allocated: dev.max_memory_allocated(),
        losses,
    };
    let snapshot = dev.memory_snapshot();
    let opts = kiln::viz::TimelineOptions {
        title: format!("fragmentation, {label}: active memory on {}", dev.name()),
        ..Default::default()
    };
    kiln::viz::write_timeline(&snapshot, &out.join(label), &opts)?;
    dev.record_memory_history(None, HistoryContext::All, HistoryStacks::Kiln, 0);
    drop((mlp, lstm, opt));
    dev.empty_cache();
    Ok(outcome)
}

/// What a 20 MiB page costs: the first allocation after `empty_cache` maps it (expandable) or
/// creates a segment, `empty_cache` unmaps or releases it; and the cached allocation + free pair.
fn map_cost(dev: &Device) -> kiln::Result<()> {
    dev.set_allocator_settings("expandable_segments:True")?;
    let expandable = dev.memory_snapshot().allocator_settings.expandable_segments;
    let page = 5 << 20; // f32 elements: 20 MiB
    let (mut maps, mut unmaps) = (Vec::new(), Vec::new());
    for i in 0..60 {
        dev.synchronize()?;
        let t = std::time::Instant::now();
        let x = Tensor::empty(&[page], DType::F32, dev)?;
        let mapped = t.elapsed();
        drop(x);
        let t = std::time::Instant::now();
        dev.empty_cache();
        if i >= 10 {
            maps.push(mapped.as_secs_f64() * 1e6);
            unmaps.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    let x = Tensor::empty(&[page], DType::F32, dev)?;
    drop(x);
    let mut cached = Vec::new();
    for _ in 0..2000 {
        let t = std::time::Instant::now();
        let x = Tensor::empty(&[page], DType::F32, dev)?;
        drop(x);
        cached.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "one 20 MiB page ({}): map (first allocation after empty_cache) median {:.1} us, \
         unmap (empty_cache) median {:.1} us; cached allocation + free median {:.2} us",
        if expandable {
            "expandable: a sparse page bound"
        } else {
            "no sparse binding here: a new segment"
        },
        median(&mut maps),
        median(&mut unmaps),
        median(&mut cached)
    );
    dev.empty_cache();
    Ok(())
}

fn main() -> kiln::Result<()> {
    let dev = match arg("--device") {
        Some(spec) => Device::from_spec(&spec)?,
        None => Device::best()?,
    };
    let steps: usize = arg("--steps").and_then(|s| s.parse().ok()).unwrap_or(16);
    let out = PathBuf::from(arg("--out").unwrap_or_else(|| "target/fragmentation".into()));
    std::fs::create_dir_all(&out).map_err(|e| kiln::Error::Io {
        op: "fragmentation",
        path: out.display().to_string(),
        msg: e.to_string(),
    })?;
    println!("fragmentation on {}", dev.name());
    if std::env::args().any(|a| a == "--map-cost-only") {
        return map_cost(&dev);
    }
    let plain = run(&dev, false, steps, &out)?;
    let grown = run(&dev, true, steps, &out)?;
    println!();
    for (label, o) in [("segments", &plain), ("expandable", &grown)] {
        println!(
            "{label:>10}: peak reserved {:>10}, peak allocated {:>10}: reserved / allocated {:.3}",
            format_size(o.peak_reserved),
            format_size(o.peak_allocated),
            o.peak_reserved as f64 / o.peak_allocated as f64
        );
    }
    // The memory layout must not change a single result.
    let same = plain.losses == grown.losses;
    println!(
        "losses {} in both runs; timelines in {}/{{segments,expandable}}.{{svg,png}}",
        if same { "identical" } else { "DIFFERENT" },
        out.display()
    );
    map_cost(&dev)?;
    if !same {
        return Err(kiln::Error::InvalidArgument {
            op: "fragmentation",
            msg: format!(
                "the runs' losses differ: {:?} vs {:?}",
                plain.losses, grown.losses
            ),
        });
    }
    Ok(())
}
