//! The memory pitfalls PyTorch users meet, each reproduced, measured and fixed, with a timeline
//! picture of both runs (`kiln::viz`) and `kiln::debug::report()` naming the culprits.
//!
//!     cargo run --release --example memory_leaks -- [--device SPEC] [--iters N] [--out DIR]
//!
//! Every scenario runs N iterations the wrong way, then the right way, on a clean allocator, and
//! prints memory_allocated after the last iteration and the peak. Pictures go to
//! `DIR/{scenario}_{mistake,fix}.{svg,png}` (default `target/memory_leaks`).

use kiln::alloc::{format_size, HistoryContext, HistoryEnabled, HistoryStacks};
use kiln::nn::{cross_entropy, Linear, LstmCell, Module, Relu, Sequential};
use kiln::optim::{Optimizer, Sgd};
use kiln::profiler::record_function;
use kiln::{DType, Device, Tensor};
use std::path::{Path, PathBuf};

struct Run {
    allocated: u64,
    peak: u64,
    reserved: u64,
    allocations: i64,
}

fn mlp(dev: &Device) -> kiln::Result<Sequential> {
    Ok(Sequential::new()
        .push(Linear::new(256, 512, true, dev)?)
        .push(Relu)
        .push(Linear::new(512, 10, true, dev)?))
}

fn batch(dev: &Device, n: usize) -> kiln::Result<(Tensor, Tensor)> {
    let x = Tensor::randn(&[n, 256], DType::F32, dev)?;
    let labels: Vec<i32> = (0..n as i32).map(|i| i % 10).collect();
    Ok((x, Tensor::from_slice(&labels, &[n], dev)?))
}

/// One scenario run: `body(mistake)` runs the iterations; history and measures around it.
fn measure(
    dev: &Device,
    name: &str,
    mistake: bool,
    out: &Path,
    mut body: impl FnMut(bool) -> kiln::Result<(u64, u64)>,
) -> kiln::Result<Run> {
    dev.synchronize()?;
    dev.empty_cache();
    dev.reset_peak_memory_stats();
    dev.reset_accumulated_memory_stats();
    dev.record_memory_history(
        Some(HistoryEnabled::All),
        HistoryContext::All,
        HistoryStacks::Kiln,
        200_000,
    );
    kiln::debug::track_tensors(true);
    let base = dev.memory_allocated();
    let (at_end, reserved) = body(mistake)?;
    dev.synchronize()?;
    let stats = dev.memory_stats();
    let run = Run {
        allocated: at_end.saturating_sub(base),
        peak: dev.max_memory_allocated() - base,
        reserved,
        allocations: stats["allocation.all.allocated"],
    };
    let which = if mistake { "mistake" } else { "fix" };
    let opts = kiln::viz::TimelineOptions {
        title: format!("{name}: {which}"),
        ..Default::default()
    };
    let stem = out.join(format!("{}_{which}", name.replace(' ', "_")));
    kiln::viz::write_timeline(&dev.memory_snapshot(), &stem, &opts)?;
    kiln::debug::track_tensors(false);
    dev.record_memory_history(None, HistoryContext::None, HistoryStacks::Kiln, 0);
    Ok(run)
}

fn main() -> kiln::Result<()> {
    use clap::{value_parser, Arg, Command};
    let args = Command::new("memory_leaks")
        .about("PyTorch's memory pitfalls in kiln: each leak beside its fix")
        .arg(
            Arg::new("device")
                .long("device")
                .help("vulkan:0, gl:0, cpu, ... (default: the best adapter)"),
        )
        .arg(
            Arg::new("iters")
                .long("iters")
                .default_value("20")
                .value_parser(value_parser!(u64).range(1..))
                .help("iterations per scenario"),
        )
        .arg(
            Arg::new("out")
                .long("out")
                .default_value("target/memory_leaks")
                .value_parser(value_parser!(PathBuf))
                .help("folder for the snapshots and timelines"),
        )
        .get_matches();
    let dev = match args.get_one::<String>("device") {
        Some(s) => Device::from_spec(s)?,
        None => Device::best()?,
    };
    let iters = *args.get_one::<u64>("iters").expect("has a default") as usize;
    let out = args
        .get_one::<PathBuf>("out")
        .expect("has a default")
        .clone();
    std::fs::create_dir_all(&out).map_err(|e| kiln::Error::InvalidArgument {
        op: "memory_leaks",
        msg: format!("{}: {e}", out.display()),
    })?;
    println!(
        "kiln memory pitfalls on {}, {iters} iterations each\n",
        dev.name()
    );
    let mut table: Vec<(String, Run, Run, &str)> = Vec::new();

    // 1. Gradients never zeroed: they stay allocated between steps (and keep growing in value).
    let name = "gradients never zeroed";
    let mut go = |mistake: bool| -> kiln::Result<(u64, u64)> {
        dev.manual_seed(0);
        let model = mlp(&dev)?;
        let mut opt = Sgd::new(model.parameters(), 1e-3)?;
        for _ in 0..iters {
            let (x, y) = batch(&dev, 64)?;
            let loss = record_function("## forward ##", || cross_entropy(&model.forward(&x)?, &y))?;
            record_function("## backward ##", || loss.backward())?;
            record_function("## optimizer ##", || opt.step())?;
            if !mistake {
                opt.zero_grad(true)?;
            }
        }
        Ok((dev.memory_allocated(), dev.memory_reserved()))
    };
    let (a, b) = (
        measure(&dev, name, true, &out, &mut go)?,
        measure(&dev, name, false, &out, &mut go)?,
    );
    table.push((
        name.into(),
        a,
        b,
        "zero_grad(set_to_none=true) after each step frees them",
    ));

    // 2. Losses stored with their graph: every step's activations stay alive.
    let name = "losses stored with graph";
    let mut culprits = String::new();
    let mut go = |mistake: bool| -> kiln::Result<(u64, u64)> {
        dev.manual_seed(0);
        let model = mlp(&dev)?;
        let mut opt = Sgd::new(model.parameters(), 1e-3)?;
        let mut history: Vec<Tensor> = Vec::new();
        let mut values: Vec<f32> = Vec::new();
        let (xv, yv) = batch(&dev, 256)?;
        for _ in 0..iters {
            let (x, y) = batch(&dev, 64)?;
            let loss = record_function("## forward ##", || cross_entropy(&model.forward(&x)?, &y))?;
            record_function("## backward ##", || loss.backward())?;
            opt.step()?;
            opt.zero_grad(true)?;
            // A held-out loss logged every step, with grad mode on: no backward ever frees its
            // graph, so a stored tensor keeps every step's activations.
            let logged =
                record_function("## logging ##", || cross_entropy(&model.forward(&xv)?, &yv))?;
            if mistake {
                history.push(logged);
            } else {
                values.push(logged.item()?);
            }
        }
        if mistake {
            culprits = kiln::debug::report();
        }
        Ok((dev.memory_allocated(), dev.memory_reserved()))
    };
    let a = measure(&dev, name, true, &out, &mut go)?;
    let b = measure(&dev, name, false, &out, &mut go)?;
    table.push((name.into(), a, b, "store loss.item() (or loss.detach())"));
    println!("kiln::debug::report() in the middle of the mistake (largest first):\n{culprits}");

    // 3. An LSTM hidden state carried across batches without detach: the graph spans every batch.
    let name = "hidden state not detached";
    let mut go = |mistake: bool| -> kiln::Result<(u64, u64)> {
        dev.manual_seed(0);
        let cell = LstmCell::new(64, 128, &dev)?;
        let (mut h, mut c) = cell.zero_state(32)?;
        for _ in 0..iters {
            let x = Tensor::randn(&[32, 64], DType::F32, &dev)?;
            if !mistake {
                (h, c) = (h.detach(), c.detach());
            }
            let (h2, c2) = cell.step(&x, (&h, &c))?;
            let loss = h2.sum_all()?;
            // Without detach, backward must keep the old graph (retain_graph) and it grows.
            loss.backward_with(&loss.ones_like()?, mistake)?;
            cell.zero_grad(true)?;
            (h, c) = (h2, c2);
        }
        Ok((dev.memory_allocated(), dev.memory_reserved()))
    };
    let a = measure(&dev, name, true, &out, &mut go)?;
    let b = measure(&dev, name, false, &out, &mut go)?;
    table.push((
        name.into(),
        a,
        b,
        "h = h.detach() between batches (truncated BPTT)",
    ));

    // 4. Evaluation without no_grad: every output keeps its activations.
    let name = "eval without no_grad";
    let mut go = |mistake: bool| -> kiln::Result<(u64, u64)> {
        dev.manual_seed(0);
        let model = mlp(&dev)?;
        let eval = || -> kiln::Result<Vec<Tensor>> {
            let mut outputs = Vec::new();
            for _ in 0..iters {
                let (x, _) = batch(&dev, 256)?;
                outputs.push(model.forward(&x)?.argmax(1, false)?);
                outputs.push(model.forward(&x)?);
            }
            Ok(outputs)
        };
        let outputs = if mistake {
            eval()?
        } else {
            kiln::no_grad(eval)?
        };
        let at_end = (dev.memory_allocated(), dev.memory_reserved());
        drop(outputs);
        Ok(at_end)
    };
    let a = measure(&dev, name, true, &out, &mut go)?;
    let b = measure(&dev, name, false, &out, &mut go)?;
    table.push((
        name.into(),
        a,
        b,
        "kiln::no_grad(|| ...) around evaluation (peak)",
    ));

    // 5. A checkpointed result cached on the model: the cache keeps its graph and inputs.
    let name = "checkpoint result cached";
    let mut go = |mistake: bool| -> kiln::Result<(u64, u64)> {
        dev.manual_seed(0);
        let model = std::sync::Arc::new(mlp(&dev)?);
        let mut cache: Vec<Tensor> = Vec::new();
        for _ in 0..iters {
            let (x, y) = batch(&dev, 1024)?;
            let m = model.clone();
            let out = kiln::checkpoint(move |v| m.forward(&v[0]), std::slice::from_ref(&x))?;
            record_function("## backward ##", || cross_entropy(&out, &y)?.backward())?;
            model.zero_grad(true)?;
            // Features for a monitor, recomputed under checkpointing and cached on the model:
            // the cached result keeps its checkpoint's saved inputs (the whole batch).
            let (xm, _) = batch(&dev, 1024)?;
            let m = model.clone();
            let feats = kiln::checkpoint(move |v| m.forward(&v[0]), std::slice::from_ref(&xm))?;
            cache.push(if mistake { feats } else { feats.detach() });
            if cache.len() > 8 {
                cache.remove(0);
            }
        }
        Ok((dev.memory_allocated(), dev.memory_reserved()))
    };
    let a = measure(&dev, name, true, &out, &mut go)?;
    let b = measure(&dev, name, false, &out, &mut go)?;
    table.push((name.into(), a, b, "cache y.detach(), not y"));

    // 6. A fresh tensor per iteration instead of one reused buffer.
    let name = "allocation per iteration";
    let mut go = |mistake: bool| -> kiln::Result<(u64, u64)> {
        let src = Tensor::randn(&[512, 512], DType::F32, &dev)?;
        let buf = Tensor::zeros(&[512, 512], DType::F32, &dev)?;
        for _ in 0..iters * 10 {
            if mistake {
                let t = src.mul_scalar(2.0)?;
                drop(t);
            } else {
                buf.copy_(&src)?;
                buf.mul_scalar_(2.0)?;
            }
        }
        Ok((dev.memory_allocated(), dev.memory_reserved()))
    };
    let a = measure(&dev, name, true, &out, &mut go)?;
    let b = measure(&dev, name, false, &out, &mut go)?;
    table.push((
        name.into(),
        a,
        b,
        "one buffer and in-place ops: no allocator calls",
    ));

    // 7. Fragmentation from varying batch sizes: reserved grows past what is allocated.
    // `empty_cache` gives the cached segments back; `max_split_size_mb` is no cure here: blocks
    // above it are never split, so every size gets segments of its own (PyTorch PR #113481).
    let name = "fragmentation";
    let varying = |release: bool| -> kiln::Result<(u64, u64)> {
        let mut keep: Vec<Tensor> = Vec::new();
        let mut s = 12345u64;
        for i in 0..iters * 10 {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let rows = 256 + (s >> 33) as usize % 8192;
            let t = record_function("## activations ##", || {
                Tensor::empty(&[rows, 1024], DType::F32, &dev)
            })?;
            if i % 3 == 0 {
                keep.push(t);
                if keep.len() > 6 {
                    keep.remove(0);
                }
            }
        }
        if release {
            dev.empty_cache();
        }
        Ok((dev.memory_allocated(), dev.memory_reserved()))
    };
    let mut go = |mistake: bool| varying(!mistake);
    let a = measure(&dev, name, true, &out, &mut go)?;
    let b = measure(&dev, name, false, &out, &mut go)?;
    table.push((
        name.into(),
        a,
        b,
        "empty_cache() returns the cached segments (reserved)",
    ));
    let name = "max_split_size_mb";
    let mut go = |mistake: bool| {
        if !mistake {
            dev.set_allocator_settings("max_split_size_mb:20")?;
        }
        let r = varying(false);
        dev.set_allocator_settings("")?;
        r
    };
    let a = measure(&dev, name, true, &out, &mut go)?;
    let b = measure(&dev, name, false, &out, &mut go)?;
    table.push((
        name.into(),
        a,
        b,
        "max_split_size_mb:20: higher here (oversize blocks unsplit)",
    ));

    println!(
        "{:<26} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>8} {:>8}  fix",
        "scenario",
        "alloc (bad)",
        "alloc (fix)",
        "peak (bad)",
        "peak (fix)",
        "rsrvd (bad)",
        "rsrvd (fix)",
        "#alloc",
        "#alloc"
    );
    for (name, a, b, fix) in &table {
        println!(
            "{:<26} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>8} {:>8}  {fix}",
            name,
            format_size(a.allocated),
            format_size(b.allocated),
            format_size(a.peak),
            format_size(b.peak),
            format_size(a.reserved),
            format_size(b.reserved),
            a.allocations,
            b.allocations
        );
    }
    println!(
        "\ntimelines: {}/*_{{mistake,fix}}.{{svg,png}}",
        out.display()
    );
    Ok(())
}
