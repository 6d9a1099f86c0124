//! The CUDA memory notebook's ResNet-50 scenario in kiln: batch 1, 224x224, SGD with momentum
//! 0.9, five iterations while the allocator records its history, once with `zero_grad`
//! forgotten (`--forget-zero-grad`) and once with `zero_grad(set_to_none=True)`. Prints
//! `memory_allocated` and `max_memory_allocated` after each iteration (MiB above what was
//! allocated before the model was built) beside PyTorch 2.11's figures on the H100, dumps the
//! snapshot (open it in https://pytorch.org/memory_viz), draws the snapshot's timeline (SVG and
//! PNG) and, from the profiler, the memory timeline by category (parameter, optimizer state,
//! input, temporary, activation, gradient, autograd detail; SVG, PNG and PyTorch's JSON).
//!
//! `--amp` runs the iterations under autocast(f16) with a GradScaler, PyTorch's AMP loop,
//! beside PyTorch 2.11's figures for the same loop on an H200.
//!
//!     cargo run --release --example resnet_memory -- [--forget-zero-grad] [--amp] [--out DIR]
//!         [--device SPEC] [--size 224] [--plan | --plan-for H100] [--memory-limit 24GiB]
//!
//! `--plan` or `--plan-for GPU` runs it as a dry run (no memory, no kernels): the same table,
//! snapshot and timelines, then the largest batch whose iterations fit.

#[path = "common/plan.rs"]
mod plan;

use indicatif::{ProgressBar, ProgressStyle};
use kiln::alloc::{HistoryContext, HistoryEnabled, HistoryStacks};
use kiln::amp::{autocast, DeviceType, GradScaler};
use kiln::nn::models::{resnet50, ResNet};
use kiln::nn::Module;
use kiln::optim::{Optimizer, Sgd};
use kiln::{DType, Device, Tensor};
use std::path::PathBuf;

/// PyTorch 2.11 on the H100 (`../shared/anchors/torch_anchor_wave2.py`): (allocated, peak)
/// MiB after iterations 1..5, forgot zero_grad and set_to_none.
const TORCH_FORGOT: [(f64, f64); 5] = [
    (300.7, 300.7),
    (300.7, 393.0),
    (300.7, 392.9),
    (300.7, 392.9),
    (300.7, 392.9),
];
/// The same under autocast(f16) + GradScaler, PyTorch 2.11 on an H200 (2026-11-29): the loop
/// of `torch_anchor_wave2.py` with `with torch.autocast("cuda", dtype=torch.float16)` around
/// the forward and loss, then `scaler.scale(loss).backward()`, `scaler.step(optimizer)`,
/// `scaler.update()`. At batch 1 the gradients overflow the scaler's first scales and steps
/// are skipped: with set_to_none neither allocates momentum in five iterations.
const TORCH_AMP_FORGOT: [(f64, f64); 5] = [
    (261.7, 296.4),
    (261.7, 363.0),
    (261.7, 363.0),
    (261.7, 363.0),
    (261.7, 363.0),
];
const TORCH_AMP_SET_TO_NONE: [(f64, f64); 5] = [
    (98.3, 231.4),
    (98.3, 231.4),
    (98.3, 231.4),
    (98.3, 231.4),
    (98.3, 231.4),
];
const TORCH_SET_TO_NONE: [(f64, f64); 5] = [
    (200.2, 300.7),
    (200.2, 367.5),
    (200.2, 368.0),
    (200.2, 368.0),
    (200.2, 368.0),
];

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

fn main() -> kiln::Result<()> {
    use clap::{value_parser, Arg, ArgAction, Command};
    let args = plan::args(Command::new("resnet_memory"))
        .about("ResNet-50 memory scenarios: zero_grad forgotten or set_to_none, snapshot and timelines")
        .arg(
            Arg::new("forget-zero-grad")
                .long("forget-zero-grad")
                .action(ArgAction::SetTrue)
                .help("never call zero_grad (gradients accumulate)"),
        )
        .arg(
            Arg::new("amp")
                .long("amp")
                .action(ArgAction::SetTrue)
                .help("autocast(f16) forward and loss, GradScaler (GPUs with f16)"),
        )
        .arg(
            Arg::new("device")
                .long("device")
                .help("vulkan:0, gl:0, cpu, ... (default: the best adapter)"),
        )
        .arg(
            Arg::new("size")
                .long("size")
                .default_value("224")
                .value_parser(value_parser!(u64).range(64..))
                .help("image height and width in pixels"),
        )
        .arg(
            Arg::new("out")
                .long("out")
                .default_value("target/resnet_memory")
                .value_parser(value_parser!(PathBuf))
                .help("folder for the snapshot and the timelines"),
        )
        .get_matches();
    let forget = args.get_flag("forget-zero-grad");
    let device = plan::device(
        &args,
        || match args.get_one::<String>("device") {
            Some(spec) => Device::from_spec(spec),
            None => Device::best(),
        },
        None,
    )?;
    let size = *args.get_one::<u64>("size").expect("has a default") as usize;
    let amp = args.get_flag("amp");
    if amp && !device.adapter_info().is_some_and(|a| a.features.shader_f16) {
        return Err(kiln::Error::InvalidArgument {
            op: "resnet_memory",
            msg: format!("--amp needs a GPU with f16; {} has none", device.name()),
        });
    }
    let out = args
        .get_one::<PathBuf>("out")
        .expect("has a default")
        .clone();
    std::fs::create_dir_all(&out).map_err(|e| kiln::Error::InvalidArgument {
        op: "resnet_memory",
        msg: format!("creating {}: {e}", out.display()),
    })?;
    println!(
        "ResNet-50, batch 1, {size}x{size}, SGD momentum 0.9{}, on {}; zero_grad {}",
        if amp {
            ", autocast f16 + GradScaler"
        } else {
            ""
        },
        device.name(),
        if forget {
            "forgotten"
        } else {
            "(set_to_none=True)"
        }
    );

    // torch.cuda.memory._record_memory_history(max_entries=100000)
    device.record_memory_history(
        Some(HistoryEnabled::All),
        HistoryContext::All,
        HistoryStacks::Kiln,
        100_000,
    );
    let base = device.memory_allocated();
    // model = models.resnet50().to(device)
    let model = resnet50(1000, &device)?;
    // inputs = torch.randn(1, 3, 224, 224); labels = torch.rand_like(model(inputs))
    let inputs = Tensor::randn(&[1, 3, size, size], DType::F32, &device)?;
    let labels = kiln::no_grad(|| model.forward(&inputs))?.rand_like()?;
    // optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    let mut optimizer = Sgd::new(model.parameters(), 1e-2)?.momentum(0.9)?;
    let mut scaler = GradScaler::new().enabled(amp);
    let params: usize = model.parameters().iter().map(|p| p.numel() * 4).sum();
    println!("parameters: {:.1} MiB", mib(params as u64));

    let bar = ProgressBar::new(5).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} iterations [{elapsed}<{eta}]")
            .expect("a valid template"),
    );
    let mut rows = Vec::new();
    // with torch.profiler.profile(profile_memory=True, ...) as prof:
    let profiling = kiln::profiler::ProfileOptions {
        devices: vec![device.clone()],
        profile_memory: true,
    };
    let ((), prof) = kiln::profiler::profile(&profiling, || {
        for _ in 0..5 {
            device.reset_peak_memory_stats();
            iteration(
                (&model, &inputs, &labels),
                &mut optimizer,
                &mut scaler,
                forget,
            )?;
            device.synchronize()?;
            rows.push((
                mib(device.memory_allocated() - base),
                mib(device.max_memory_allocated() - base),
            ));
            bar.inc(1);
        }
        Ok(())
    })?;
    bar.finish_and_clear();

    let torch = match (amp, forget) {
        (false, true) => TORCH_FORGOT,
        (false, false) => TORCH_SET_TO_NONE,
        (true, true) => TORCH_AMP_FORGOT,
        (true, false) => TORCH_AMP_SET_TO_NONE,
    };
    println!(
        "{:>9}  {:>14} {:>14}  {:>14} {:>14}",
        "iteration", "allocated MiB", "PyTorch", "peak MiB", "PyTorch"
    );
    for (i, ((a, p), (ta, tp))) in rows.iter().zip(torch).enumerate() {
        println!("{:>9}  {a:>14.1} {ta:>14.1}  {p:>14.1} {tp:>14.1}", i + 1);
    }
    println!(
        "allocated: parameters, momentum and (forgotten) gradients, as in PyTorch (whose ~2 MiB \
         more are its input and cuDNN's cached workspace); the peak adds the activations \
         backward keeps (the same tensors as PyTorch's: each BatchNorm saves its input and \
         [4, C] statistics) and kiln's weight-gradient partials where PyTorch's adds cuDNN's \
         workspaces"
    );
    if amp && device.is_dry_run() {
        println!(
            "a dry run's GradScaler finds no inf (values are not computed), so every step is \
             taken and momentum is allocated; on the GPU, batch 1's gradients overflow the first \
             scales and those steps are skipped"
        );
    }
    if amp {
        println!(
            "under autocast each BatchNorm takes the convolution's f16 output with its f32 \
             parameters and saves that f16 input, as PyTorch's cuDNN kernel does"
        );
    }

    let which = match (forget, amp) {
        (true, false) => "forgot_zero_grad",
        (false, false) => "set_to_none",
        (true, true) => "forgot_zero_grad_amp",
        (false, true) => "set_to_none_amp",
    };
    let snapshot = out.join(format!("resnet50_{which}.pickle"));
    // torch.cuda.memory._dump_snapshot("snapshot.pickle")
    device.dump_snapshot(&snapshot)?;
    let opts = kiln::viz::TimelineOptions {
        title: format!("ResNet-50, batch 1: {which}"),
        ..Default::default()
    };
    let stem = out.join(format!("resnet50_{which}"));
    kiln::viz::write_timeline(&device.memory_snapshot(), &stem, &opts)?;
    device.record_memory_history(None, HistoryContext::None, HistoryStacks::Kiln, 0);
    // prof.export_memory_timeline("categories.html"): by category, as PyTorch's profiler.
    let categories = out.join(format!("resnet50_{which}_categories"));
    for ext in ["svg", "png", "json"] {
        prof.export_memory_timeline(categories.with_extension(ext))?;
    }
    let tl = prof.memory_timeline(0);
    if let Some(peak) = tl.sizes.iter().max_by_key(|s| s.iter().sum::<i64>()) {
        let parts: Vec<String> = kiln::alloc::MemoryCategory::ALL
            .iter()
            .filter(|c| peak[c.index() + 1] != 0)
            .map(|c| {
                format!(
                    "{} {:.1}",
                    c.name(),
                    peak[c.index() + 1] as f64 / (1 << 20) as f64
                )
            })
            .collect();
        println!("at the peak, MiB by category: {}", parts.join(", "));
    }
    println!(
        "snapshot: {} (https://pytorch.org/memory_viz); timeline: {}.{{svg,png}}; by category: \
         {}.{{svg,png,json}}",
        snapshot.display(),
        stem.display(),
        categories.display()
    );
    if device.is_dry_run() {
        // The largest batch whose five iterations fit, each on a fresh model.
        let (target, budget) = plan::budget(&device)?;
        let started = std::time::Instant::now();
        let fit = kiln::device::max_batch_size(&target, Some(budget), 1 << 16, |dev, n| {
            let model = resnet50(1000, dev)?;
            let inputs = Tensor::randn(&[n, 3, size, size], DType::F32, dev)?;
            let labels = kiln::no_grad(|| model.forward(&inputs))?.rand_like()?;
            let mut optimizer = Sgd::new(model.parameters(), 1e-2)?.momentum(0.9)?;
            let mut scaler = GradScaler::new().enabled(amp);
            for _ in 0..5 {
                iteration(
                    (&model, &inputs, &labels),
                    &mut optimizer,
                    &mut scaler,
                    forget,
                )?;
            }
            Ok(())
        })?;
        plan::report(&prof.peak_by_category(0), &fit, budget, started);
    }
    Ok(())
}

/// One iteration: `pred = model(inputs)`, `loss_fn(pred, labels).backward()` (CrossEntropyLoss
/// with probabilities as targets: `-(labels * log_softmax(pred)).sum(1).mean()`),
/// `optimizer.step()`, `optimizer.zero_grad(set_to_none=True)` unless forgotten; with the scaler
/// enabled, the forward and loss under autocast(f16), `scaler.scale(loss).backward()`,
/// `scaler.step(optimizer)`, `scaler.update()`.
fn iteration(
    (model, inputs, labels): (&ResNet, &Tensor, &Tensor),
    optimizer: &mut Sgd,
    scaler: &mut GradScaler,
    forget: bool,
) -> kiln::Result<()> {
    let (pred, loss) = {
        let _amp = autocast(DeviceType::Gpu, DType::F16, scaler.is_enabled())?;
        let pred = model.forward(inputs)?;
        let loss = labels
            .mul(&pred.log_softmax(1)?)?
            .sum(&[1], false)?
            .mean(&[0], false)?
            .neg()?;
        (pred, loss)
    };
    scaler.scale(&loss)?.backward()?;
    drop((pred, loss));
    scaler.step(optimizer)?;
    scaler.update(None)?;
    if !forget {
        optimizer.zero_grad(true)?;
    }
    Ok(())
}
