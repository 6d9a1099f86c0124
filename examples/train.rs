//! kiln's main job: train a classifier on the best adapter and show what a PyTorch user looks
//! for: loss and accuracy per epoch, evaluation under `no_grad`, and the allocator's numbers.
//! Batches come from a `DataLoader` that assembles them in pinned memory on a worker thread and
//! uploads them ahead with non-blocking copies (`--no-pin-memory` builds them on the main
//! thread in pageable memory instead).
//!
//!     cargo run --release --example train -- --model cnn --epochs 3
//!     cargo run --release --example train -- --amp --optimizer adam   # autocast + GradScaler
//!     cargo run --release --example train -- --data ~/mnist       # MNIST IDX files
//!     cargo run --release --example train -- --save-checkpoint ck.safetensors --max-steps 100
//!     cargo run --release --example train -- --save-checkpoint ck.safetensors --resume ck.safetensors
//!     mpirun -n 2 cargo run --release --features mpi --example train -- --ddp   # one process per GPU
//!
//! `--plan` (or `--plan-for GPU`, `--memory-limit SIZE`) runs the same program as a dry run:
//! no memory, no kernels, the same `memory_summary` at the end, then the peak by category and
//! the largest batch that fits, in seconds on a machine with no GPU.
//!
//!     cargo run --release --example train -- --model cnn --plan-for H100 --batch-size 4096
//!
//! With `--ddp`, each rank trains a `DistributedDataParallel` model on its `DistributedSampler`
//! share of every epoch (the batch size is per rank, as in PyTorch), and rank 0 prints.

use clap::{value_parser, Arg, ArgAction, Command};
use indicatif::{ProgressBar, ProgressStyle};
use kiln::amp::{autocast, DeviceType, GradScaler};
use kiln::data::{read_mnist, synthetic_glyphs, DataLoader, LoaderOptions, Resumable};
use kiln::distributed::{DistributedDataParallel, InitOptions, ProcessGroup};
use kiln::nn::{cross_entropy, Conv2d, Flatten, Linear, MaxPool2d, Module, Relu, Sequential};
use kiln::ops::Conv2dParams;
use kiln::optim::{Adam, Optimizer, Sgd};
use kiln::profiler::record_function;
use kiln::training::Checkpoint;
use kiln::{DType, Device, Tensor};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[path = "common/plan.rs"]
mod plan;

fn args() -> clap::ArgMatches {
    plan::args(Command::new("train"))
        .about("Train a classifier with kiln and print PyTorch's memory numbers")
        .arg(
            Arg::new("device")
                .long("device")
                .help("vulkan:0, gl:0, metal:0, cpu (default: the best adapter)"),
        )
        .arg(
            Arg::new("epochs")
                .long("epochs")
                .default_value("3")
                .value_parser(value_parser!(usize)),
        )
        .arg(
            Arg::new("batch-size")
                .long("batch-size")
                .default_value("64")
                .value_parser(value_parser!(usize)),
        )
        .arg(
            Arg::new("model")
                .long("model")
                .default_value("mlp")
                .value_parser(["mlp", "cnn"]),
        )
        .arg(
            Arg::new("lr")
                .long("lr")
                .value_parser(value_parser!(f64))
                .help("learning rate (default: 0.05 for SGD, 0.001 for Adam)"),
        )
        .arg(
            Arg::new("optimizer")
                .long("optimizer")
                .default_value("sgd")
                .value_parser(["sgd", "adam"])
                .help("SGD with momentum 0.9, or Adam"),
        )
        .arg(
            Arg::new("amp")
                .long("amp")
                .action(ArgAction::SetTrue)
                .help("mixed precision: forward and loss under autocast(f16), GradScaler"),
        )
        .arg(
            Arg::new("ddp")
                .long("ddp")
                .action(ArgAction::SetTrue)
                .help("data parallel over the ranks mpirun started (build with --features mpi)"),
        )
        .arg(
            Arg::new("train-size")
                .long("train-size")
                .default_value("6000")
                .value_parser(value_parser!(usize)),
        )
        .arg(
            Arg::new("data")
                .long("data")
                .value_parser(value_parser!(PathBuf))
                .help("a directory with MNIST's IDX files"),
        )
        .arg(
            Arg::new("no-pin-memory")
                .long("no-pin-memory")
                .action(ArgAction::SetTrue)
                .help("build batches in pageable memory and upload them synchronously"),
        )
        .arg(
            Arg::new("checkpoint")
                .long("checkpoint")
                .action(ArgAction::SetTrue)
                .help("recompute every block but the last in backward (gradient checkpointing)"),
        )
        .arg(
            Arg::new("snapshot")
                .long("snapshot")
                .value_parser(value_parser!(PathBuf))
                .help("record memory history and dump the snapshot here (.pickle for PyTorch's viewers, .json)"),
        )
        .arg(
            Arg::new("profile")
                .long("profile")
                .value_parser(value_parser!(PathBuf))
                .help("profile ten training steps first: print the table, write a Chrome trace here"),
        )
        .arg(
            Arg::new("save")
                .long("save")
                .value_parser(value_parser!(PathBuf))
                .help("write the trained state dict here (safetensors)"),
        )
        .arg(
            Arg::new("save-checkpoint")
                .long("save-checkpoint")
                .value_parser(value_parser!(PathBuf))
                .help("write a training checkpoint here (model, optimizer, GradScaler, generator, loader position) after every epoch and when --max-steps stops the run"),
        )
        .arg(
            Arg::new("resume")
                .long("resume")
                .value_parser(value_parser!(PathBuf))
                .help("resume from a training checkpoint: the run continues exactly where the saved one was"),
        )
        .arg(
            Arg::new("max-steps")
                .long("max-steps")
                .value_parser(value_parser!(u64))
                .help("stop after this many training steps in all (an interruption, for --save-checkpoint and --resume)"),
        )
        .arg(
            Arg::new("load")
                .long("load")
                .value_parser(value_parser!(PathBuf))
                .help("start from this state dict (safetensors, e.g. written by PyTorch)"),
        )
        .get_matches()
}

/// The model as blocks, so that `--checkpoint` can recompute each block in backward and keep
/// only the block boundaries alive (checkpointing a single block saves nothing at the peak).
fn model(
    kind: &str,
    side: usize,
    classes: usize,
    device: &Device,
) -> kiln::Result<Vec<Arc<Sequential>>> {
    let blocks = match kind {
        "cnn" => {
            let conv = |i, o| {
                Conv2d::new(
                    i,
                    o,
                    3,
                    Conv2dParams {
                        padding: (1, 1),
                        ..Default::default()
                    },
                    device,
                )
            };
            vec![
                Sequential::new()
                    .push(conv(1, 8)?)
                    .push(Relu)
                    .push(MaxPool2d::new(2)),
                Sequential::new()
                    .push(conv(8, 16)?)
                    .push(Relu)
                    .push(MaxPool2d::new(2))
                    .push(Flatten),
                Sequential::new().push(Linear::new(
                    16 * (side / 4) * (side / 4),
                    classes,
                    true,
                    device,
                )?),
            ]
        }
        _ => vec![
            Sequential::new()
                .push(Flatten)
                .push(Linear::new(side * side, 128, true, device)?)
                .push(Relu),
            Sequential::new()
                .push(Linear::new(128, 128, true, device)?)
                .push(Relu),
            Sequential::new().push(Linear::new(128, classes, true, device)?),
        ],
    };
    Ok(blocks.into_iter().map(Arc::new).collect())
}

/// The forward pass; with `checkpoint`, every block but the last is recomputed in backward.
fn forward(blocks: &[Arc<Sequential>], x: &Tensor, checkpoint: bool) -> kiln::Result<Tensor> {
    let mut h = x.clone();
    for (i, b) in blocks.iter().enumerate() {
        h = if checkpoint && i + 1 < blocks.len() && kiln::autograd::is_grad_enabled() {
            let b = b.clone();
            kiln::checkpoint(move |xs: &[Tensor]| b.forward(&xs[0]), &[h])?
        } else {
            b.forward(&h)?
        };
    }
    Ok(h)
}

/// The blocks as one module, for `DistributedDataParallel` (which finds the parameters to
/// reduce through `Module`).
struct Blocks {
    blocks: Vec<Arc<Sequential>>,
    checkpoint: bool,
}

impl Module for Blocks {
    fn forward(&self, x: &Tensor) -> kiln::Result<Tensor> {
        forward(&self.blocks, x, self.checkpoint)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let per_block = self.blocks.iter().enumerate();
        per_block
            .flat_map(|(i, b)| {
                b.named_parameters()
                    .into_iter()
                    .map(move |(n, t)| (format!("{i}.{n}"), t))
            })
            .collect()
    }
    /// The blocks are shared (`Arc`): nothing here moves or replaces their tensors.
    fn tensors_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        Vec::new()
    }
}

/// Prints on rank 0 only (every rank prints without `--ddp`).
macro_rules! say {
    ($main:expr, $($arg:tt)*) => {
        if $main {
            println!($($arg)*);
        }
    };
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

fn main() -> kiln::Result<()> {
    let m = args();
    let chosen = match m.get_one::<String>("device") {
        Some(spec) => Some(Device::from_spec(spec)?),
        None => None,
    };
    // With --ddp: one process per GPU, the local rank picking the adapter.
    let group: Option<ProcessGroup> = if m.get_flag("ddp") {
        Some(kiln::distributed::init_process_group_with(InitOptions {
            device: chosen.clone(),
            ..Default::default()
        })?)
    } else {
        None
    };
    let device = match (&group, chosen) {
        (Some(g), _) => g.device().clone(),
        (None, chosen) => plan::device(&m, || chosen.map_or_else(Device::best, Ok), None)?,
    };
    let dry = device.is_dry_run();
    let writes = ["save", "save-checkpoint"];
    if let Some(w) = writes.iter().find(|w| dry && m.contains_id(w)) {
        return Err(kiln::Error::InvalidArgument {
            op: "train --plan",
            msg: format!(
                "a dry run computes no values and runs no kernels: --{w} has nothing to write"
            ),
        });
    }
    plan::record(&device);
    // The host reads a value (a loss, the accuracy): none in a dry run.
    let read = |t: &Tensor| -> kiln::Result<f32> {
        match dry {
            true => Ok(f32::NAN),
            false => t.item::<f32>(),
        }
    };
    let main_rank = group.as_ref().is_none_or(|g| g.rank() == 0);
    let epochs = *m.get_one::<usize>("epochs").expect("default");
    let batch_size = *m.get_one::<usize>("batch-size").expect("default");
    let kind = m.get_one::<String>("model").expect("default").clone();
    let optimizer = m.get_one::<String>("optimizer").expect("default").clone();
    let lr = m
        .get_one::<f64>("lr")
        .copied()
        .unwrap_or(if optimizer == "adam" { 1e-3 } else { 0.05 });
    let amp = m.get_flag("amp");
    let device_type = if device.is_cpu() {
        DeviceType::Cpu
    } else {
        DeviceType::Gpu
    };
    let use_checkpoint = m.get_flag("checkpoint");
    let (train, test) = match m.get_one::<PathBuf>("data") {
        Some(dir) => (read_mnist(dir, true)?, read_mnist(dir, false)?),
        None => {
            let n = *m.get_one::<usize>("train-size").expect("default");
            (synthetic_glyphs(n, 1), synthetic_glyphs(n / 5, 2))
        }
    };
    let (side, classes) = (train.side, train.classes);
    say!(
            main_rank,
        "kiln train: {kind} on {} ({} train / {} test images of {}x{}, {} classes), batch {batch_size}, {epochs} epochs, {optimizer} lr {lr}{}{}",
        device.name(),
        train.len(),
        test.len(),
        train.side,
        train.side,
        train.classes,
        if use_checkpoint { ", gradient checkpointing" } else { "" },
        if amp { ", AMP (autocast f16 + GradScaler)" } else { "" }
    );

    let snapshot = m.get_one::<PathBuf>("snapshot");
    if snapshot.is_some() {
        use kiln::alloc::{HistoryContext, HistoryEnabled, HistoryStacks};
        device.record_memory_history(
            Some(HistoryEnabled::All),
            HistoryContext::All,
            HistoryStacks::Kiln,
            1_000_000,
        );
    }
    device.manual_seed(0);
    let blocks = model(&kind, train.side, train.classes, &device)?;
    // One Sequential view of the blocks' parameters for the state dict: `{block}.{layer}.{name}`.
    let named = |blocks: &[Arc<Sequential>]| -> Vec<(String, Tensor)> {
        blocks
            .iter()
            .enumerate()
            .flat_map(|(i, b)| {
                kiln::nn::state_dict(b.as_ref())
                    .into_iter()
                    .map(move |(n, t)| (format!("{i}.{n}"), t))
            })
            .collect()
    };
    if let Some(path) = m.get_one::<PathBuf>("load") {
        let loaded = kiln::nn::load_safetensors(path, &device)?;
        for (name, target) in named(&blocks) {
            let (_, src) = loaded.iter().find(|(n, _)| *n == name).ok_or_else(|| {
                kiln::Error::InvalidArgument {
                    op: "train --load",
                    msg: format!("{}: no tensor {name}", path.display()),
                }
            })?;
            kiln::no_grad(|| target.copy_(src))?;
        }
        say!(
            main_rank,
            "loaded {} tensors from {}",
            loaded.len(),
            path.display()
        );
    }
    if group.is_some() && use_checkpoint {
        return Err(kiln::Error::InvalidArgument {
            op: "train --ddp",
            msg: "--checkpoint recomputes blocks in a nested backward, where DDP's bucket \
                  hooks would finish the reduction early; use one or the other"
                .into(),
        });
    }
    let local = Blocks {
        blocks: blocks.clone(),
        checkpoint: use_checkpoint,
    };
    // DDP broadcasts rank 0's parameters (they are the same here: every rank seeds alike).
    let net: Box<dyn Module> = match &group {
        Some(g) => {
            let ddp = DistributedDataParallel::new(local, g)?;
            say!(
                main_rank,
                "DistributedDataParallel: {} ranks over {}, buckets of {:?} bytes",
                g.world_size(),
                g.backend(),
                ddp.bucket_sizes()
            );
            Box::new(ddp)
        }
        None => Box::new(local),
    };
    let params: Vec<Tensor> = net.parameters();
    let mut opt: Box<dyn Optimizer> = match optimizer.as_str() {
        "adam" => Box::new(Adam::new(params, lr)?),
        _ => Box::new(Sgd::new(params, lr)?.momentum(0.9)?),
    };
    // Disabled without --amp: every call passes through (PyTorch's `enabled=False`).
    let mut scaler = GradScaler::new().enabled(amp);
    // One training step, PyTorch's AMP recipe: forward and loss under autocast, backward of the
    // scaled loss, the scaler's step (skipped on inf/NaN gradients) and update.
    let train_step = |opt: &mut dyn Optimizer,
                      scaler: &mut GradScaler,
                      x: &Tensor,
                      y: &Tensor|
     -> kiln::Result<Tensor> {
        let loss = record_function("## forward ##", || {
            let _amp = autocast(device_type, DType::F16, amp)?;
            cross_entropy(&net.forward(x)?, y)
        })?;
        opt.zero_grad(true)?;
        record_function("## backward ##", || scaler.scale(&loss)?.backward())?;
        record_function("## optimizer ##", || {
            scaler.step(opt)?;
            scaler.update(None)
        })?;
        Ok(loss)
    };
    let started = Instant::now();
    let pin_memory = !m.get_flag("no-pin-memory");
    let test_len = test.len();
    let mut train_loader = DataLoader::new(
        Arc::new(train),
        &device,
        LoaderOptions {
            batch_size,
            shuffle: true,
            drop_last: true,
            pin_memory,
            prefetch: 2,
            num_workers: 1,
            seed: 0x5EED,
            sampler: group.as_ref().map(ProcessGroup::sampler),
        },
    )?;
    let mut test_loader = DataLoader::new(
        Arc::new(test),
        &device,
        LoaderOptions {
            batch_size: 256,
            pin_memory,
            ..Default::default()
        },
    )?;

    // A training checkpoint holds everything the next step depends on; `--resume` restores it
    // all or nothing, and the run continues with the loader's saved epoch and position.
    let save_path = m.get_one::<PathBuf>("save-checkpoint").cloned();
    let max_steps = m.get_one::<u64>("max-steps").copied();
    let mut global_step: u64 = 0;
    if let Some(path) = m.get_one::<PathBuf>("resume") {
        let mut ck = Checkpoint {
            model: named(&blocks),
            optimizer: Some(opt.as_mut()),
            scaler: Some(&mut scaler),
            loader: Some(&mut train_loader),
            generator: Some(device.clone()),
            ..Default::default()
        };
        ck.load(path)?;
        global_step = ck
            .extra
            .get("step")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let at = train_loader.loader_state();
        say!(
            main_rank,
            "resumed from {} at step {global_step} (epoch {}, batch {} of {})",
            path.display(),
            at.epoch + 1,
            at.position,
            train_loader.len()
        );
    }
    let save_checkpoint = |path: &PathBuf,
                           opt: &mut dyn Optimizer,
                           scaler: &mut GradScaler,
                           loader: &mut dyn Resumable,
                           step: u64|
     -> kiln::Result<()> {
        let ck = Checkpoint {
            model: named(&blocks),
            optimizer: Some(opt),
            scaler: Some(scaler),
            loader: Some(loader),
            generator: Some(device.clone()),
            extra: [("step".to_string(), step.to_string())].into(),
        };
        ck.save(path)
    };

    if let Some(path) = m.get_one::<PathBuf>("profile") {
        use kiln::profiler::{profile, ProfileOptions};
        let opts = ProfileOptions {
            devices: vec![device.clone()],
            profile_memory: true,
        };
        let ((), prof) = profile(&opts, || {
            for batch in train_loader.iter().take(10) {
                let (x, y) = batch?;
                train_step(opt.as_mut(), &mut scaler, &x, &y)?;
            }
            device.synchronize()
        })?;
        let sort = if prof.gpu_measured {
            "self_gpu_time_total"
        } else {
            "self_cpu_time_total"
        };
        say!(main_rank, "{}", prof.key_averages().table(sort, 15));
        prof.export_chrome_trace(path)?;
        say!(
            main_rank,
            "Chrome trace of ten steps written to {}\n",
            path.display()
        );
    }

    let first_epoch = train_loader.loader_state().epoch as usize + 1;
    let mut stopped = false;
    for epoch in first_epoch..=epochs {
        if stopped {
            break;
        }
        let steps = train_loader.len();
        let done_before = train_loader.loader_state().position;
        let bar = if main_rank {
            ProgressBar::new(steps as u64)
        } else {
            ProgressBar::hidden()
        };
        let bar = bar.with_style(
            ProgressStyle::with_template("epoch {prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed})")
                .expect("a valid template")
                .progress_chars("=> "),
        );
        bar.set_prefix(format!("{epoch}/{epochs}"));
        bar.set_position(done_before as u64);
        // The running loss stays on the device, detached: no sync per step, no graph kept.
        // The peak of this epoch's training steps (evaluation below has its own batches).
        device.reset_peak_memory_stats();
        let mut loss_sum = Tensor::zeros(&[], DType::F32, &device)?;
        // A fresh permutation per epoch (or the rest of a resumed one); batches arrive already
        // on the device.
        let mut batches = train_loader.iter();
        for step in done_before.. {
            if max_steps.is_some_and(|max| global_step >= max) {
                stopped = true;
                break;
            }
            let Some(batch) = batches.next() else { break };
            let (x, y) = batch?;
            // Named phases: they show as frames in memory snapshots and timelines.
            let loss = train_step(opt.as_mut(), &mut scaler, &x, &y)?;
            global_step += 1;
            loss_sum = loss_sum.add(&loss.detach())?;
            if step % 25 == 24 {
                bar.set_message(format!("loss {:.4}", read(&loss)?));
            }
            bar.inc(1);
        }
        drop(batches);
        if stopped {
            bar.abandon_with_message(format!("stopped at step {global_step} (--max-steps)"));
            if let (Some(path), true) = (&save_path, main_rank) {
                save_checkpoint(
                    path,
                    opt.as_mut(),
                    &mut scaler,
                    &mut train_loader,
                    global_step,
                )?;
                say!(
                    main_rank,
                    "training checkpoint written to {}",
                    path.display()
                );
            }
            break;
        }
        let steps = steps - done_before;
        let train_loss = read(&loss_sum)? / steps as f32;
        bar.finish_with_message(format!("loss {train_loss:.4}"));
        let train_peak = device.max_memory_allocated();

        // Evaluation: no graph, no saved activations.
        let correct = kiln::no_grad(|| -> kiln::Result<usize> {
            let mut correct = Tensor::zeros(&[], DType::F32, &device)?;
            for batch in test_loader.iter() {
                let (x, y) = batch?;
                let _amp = autocast(device_type, DType::F16, amp)?;
                let pred = forward(&blocks, &x, false)?.argmax(1, false)?;
                correct = correct.add(&pred.eq(&y)?.to_dtype(DType::F32)?.sum_all()?)?;
            }
            Ok(read(&correct)? as usize)
        })?;
        say!(
            main_rank,
            "epoch {epoch}: train loss {train_loss:.4}, test accuracy {:.2}% | memory_allocated {:.2} MiB, max_memory_allocated (training) {:.2} MiB, memory_reserved {:.2} MiB",
            100.0 * correct as f64 / test_len as f64,
            mib(device.memory_allocated()),
            mib(train_peak),
            mib(device.memory_reserved()),
        );
        if let (Some(path), true) = (&save_path, main_rank) {
            save_checkpoint(
                path,
                opt.as_mut(),
                &mut scaler,
                &mut train_loader,
                global_step,
            )?;
        }
    }
    if let (Some(path), true) = (m.get_one::<PathBuf>("save"), main_rank) {
        kiln::nn::save_safetensors(path, &named(&blocks))?;
        say!(main_rank, "saved the state dict to {}", path.display());
    }
    device.synchronize()?;
    say!(
        main_rank,
        "trained in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    if amp {
        say!(main_rank, "GradScaler: scale {}", scaler.get_scale());
    }
    let host = device.host_memory_stats();
    if host.num_host_alloc > 0 {
        say!(
            main_rank,
            "pinned memory (host_memory_stats): {} blocks, {:.2} MiB cached, {} cudaHostAlloc-equivalents",
            host.allocations.current,
            mib(host.allocated_bytes.current as u64),
            host.num_host_alloc
        );
    }
    say!(main_rank, "");
    say!(main_rank, "{}", device.memory_summary(false));
    if dry {
        // The largest batch whose two training steps fit, each on a fresh model.
        let (target, budget) = plan::budget(&device)?;
        let started = Instant::now();
        let fit = kiln::device::max_batch_size(&target, Some(budget), 1 << 20, |dev, b| {
            let blocks = model(&kind, side, classes, dev)?;
            let params: Vec<Tensor> = blocks.iter().flat_map(|b| b.parameters()).collect();
            let mut opt: Box<dyn Optimizer> = match optimizer.as_str() {
                "adam" => Box::new(Adam::new(params, lr)?),
                _ => Box::new(Sgd::new(params, lr)?.momentum(0.9)?),
            };
            let mut scaler = GradScaler::new().enabled(amp);
            for _ in 0..2 {
                let x = Tensor::zeros(&[b, 1, side, side], DType::F32, dev)?;
                let y = Tensor::zeros(&[b], DType::I32, dev)?;
                let loss = {
                    let _amp = autocast(device_type, DType::F16, amp)?;
                    cross_entropy(&forward(&blocks, &x, use_checkpoint)?, &y)?
                };
                opt.zero_grad(true)?;
                scaler.scale(&loss)?.backward()?;
                scaler.step(opt.as_mut())?;
                scaler.update(None)?;
            }
            Ok(())
        })?;
        plan::report(&plan::peaks(&device), &fit, budget, started);
    }
    if let (Some(path), true) = (snapshot, main_rank) {
        device.dump_snapshot(path)?;
        // The same trace as a picture, next to it.
        let opts = kiln::viz::TimelineOptions {
            title: format!("kiln train ({kind}): active memory on {}", device.name()),
            ..Default::default()
        };
        kiln::viz::write_timeline(&device.memory_snapshot(), path, &opts)?;
        say!(
            main_rank,
            "memory snapshot written to {} (timeline: {}, {})",
            path.display(),
            path.with_extension("svg").display(),
            path.with_extension("png").display()
        );
    }
    Ok(())
}
