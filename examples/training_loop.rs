//! PyTorch's memory-efficient training loop, line for line, in kiln: a pinned `DataLoader`
//! with non-blocking uploads, `zero_grad(set_to_none=True)`, forward and loss under
//! `autocast`, `scaler.scale(loss).backward()`, `scaler.step(optimizer)`, `scaler.update()`,
//! Adam, validation under `no_grad`, `.item()` for logging (a number, not the loss with its
//! graph), memory figures per epoch and `memory_summary()` at the end. The PyTorch line each
//! kiln line stands for is in the comment above it.
//!
//!     cargo run --release --example training_loop -- --epochs 3
//!     cargo run --release --example training_loop -- --no-amp        # the same loop in f32

use clap::{value_parser, Arg, ArgAction, Command};
use indicatif::{ProgressBar, ProgressStyle};
use kiln::amp::{autocast, DeviceType, GradScaler};
use kiln::data::{read_mnist, synthetic_glyphs, DataLoader, LoaderOptions};
use kiln::nn::{cross_entropy, Flatten, Linear, Module, Relu, Sequential};
use kiln::optim::{Adam, Optimizer};
use kiln::{DType, Device};
use std::path::PathBuf;
use std::sync::Arc;

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

fn main() -> kiln::Result<()> {
    let m = Command::new("training_loop")
        .about("PyTorch's memory-efficient AMP training loop in kiln")
        .arg(
            Arg::new("device")
                .long("device")
                .help("vulkan:0, gl:0, cpu, ... (default: the best adapter)"),
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
                .default_value("128")
                .value_parser(value_parser!(usize)),
        )
        .arg(
            Arg::new("hidden")
                .long("hidden")
                .default_value("512")
                .value_parser(value_parser!(usize)),
        )
        .arg(
            Arg::new("train-size")
                .long("train-size")
                .default_value("8192")
                .value_parser(value_parser!(usize)),
        )
        .arg(
            Arg::new("data")
                .long("data")
                .value_parser(value_parser!(PathBuf))
                .help("a directory with MNIST's IDX files"),
        )
        .arg(
            Arg::new("no-amp")
                .long("no-amp")
                .action(ArgAction::SetTrue)
                .help("f32: autocast and the scaler disabled"),
        )
        .get_matches();
    // device = torch.device("cuda")
    let device = match m.get_one::<String>("device") {
        Some(spec) => Device::from_spec(spec)?,
        None => Device::best()?,
    };
    let device_type = if device.is_cpu() {
        DeviceType::Cpu
    } else {
        DeviceType::Gpu
    };
    let use_amp = !m.get_flag("no-amp");
    let epochs = *m.get_one::<usize>("epochs").expect("default");
    let hidden = *m.get_one::<usize>("hidden").expect("default");
    let (train_set, val_set) = match m.get_one::<PathBuf>("data") {
        Some(dir) => (read_mnist(dir, true)?, read_mnist(dir, false)?),
        None => {
            let n = *m.get_one::<usize>("train-size").expect("default");
            (synthetic_glyphs(n, 1), synthetic_glyphs(n / 4, 2))
        }
    };
    let side = train_set.side;
    println!(
        "training_loop on {}: MLP {}-{hidden}-{hidden}-10, Adam, {}",
        device.name(),
        side * side,
        if use_amp {
            "autocast(f16) + GradScaler"
        } else {
            "f32"
        }
    );

    // train_loader = DataLoader(train_set, batch_size=128, shuffle=True, pin_memory=True,
    //                           num_workers=1, drop_last=True)
    let mut train_loader = DataLoader::new(
        Arc::new(train_set),
        &device,
        LoaderOptions {
            batch_size: *m.get_one::<usize>("batch-size").expect("default"),
            shuffle: true,
            drop_last: true,
            pin_memory: true,
            ..Default::default()
        },
    )?;
    // val_loader = DataLoader(val_set, batch_size=512, pin_memory=True)
    let val_len = val_set.len();
    let mut val_loader = DataLoader::new(
        Arc::new(val_set),
        &device,
        LoaderOptions {
            batch_size: 512,
            pin_memory: true,
            ..Default::default()
        },
    )?;

    // model = nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), ...).to(device)
    device.manual_seed(0);
    let mut model = Sequential::new()
        .push(Flatten)
        .push(Linear::new(side * side, hidden, true, &device)?)
        .push(Relu)
        .push(Linear::new(hidden, hidden, true, &device)?)
        .push(Relu)
        .push(Linear::new(hidden, 10, true, &device)?);
    // optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    let mut optimizer = Adam::new(model.parameters(), 1e-3)?;
    // scaler = torch.amp.GradScaler("cuda", enabled=use_amp)
    let mut scaler = GradScaler::new().enabled(use_amp);

    // for epoch in range(epochs):
    for epoch in 1..=epochs {
        // model.train(); torch.cuda.reset_peak_memory_stats()
        model.train(true);
        device.reset_peak_memory_stats();
        let bar = ProgressBar::new(train_loader.len() as u64).with_style(
            ProgressStyle::with_template("epoch {prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed})")
                .expect("a valid template")
                .progress_chars("=> "),
        );
        bar.set_prefix(format!("{epoch}/{epochs}"));
        let (mut running_loss, mut steps) = (0.0f64, 0usize);
        // for x, y in train_loader:
        for batch in train_loader.iter() {
            // x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            // (kiln's loader issues those copies itself, `prefetch` batches ahead)
            let (x, y) = batch?;
            // optimizer.zero_grad(set_to_none=True)
            optimizer.zero_grad(true)?;
            // with torch.autocast(device_type="cuda", dtype=torch.float16, enabled=use_amp):
            let loss = {
                let _autocast = autocast(device_type, DType::F16, use_amp)?;
                //     loss = F.cross_entropy(model(x), y)
                cross_entropy(&model.forward(&x)?, &y)?
            };
            // scaler.scale(loss).backward()
            scaler.scale(&loss)?.backward()?;
            // scaler.step(optimizer); scaler.update()
            scaler.step(&mut optimizer)?;
            scaler.update(None)?;
            // running_loss += loss.item()   (a float: the graph is not kept alive)
            running_loss += loss.item::<f32>()? as f64;
            steps += 1;
            bar.set_message(format!("loss {:.4}", running_loss / steps as f64));
            bar.inc(1);
        }
        bar.finish();
        let train_peak = device.max_memory_allocated();

        // model.eval()
        // with torch.no_grad(), torch.autocast(device_type="cuda", dtype=torch.float16):
        model.eval();
        let correct = kiln::no_grad(|| -> kiln::Result<f64> {
            let _autocast = autocast(device_type, DType::F16, use_amp)?;
            let mut correct = 0.0;
            for batch in val_loader.iter() {
                let (x, y) = batch?;
                // correct += (model(x).argmax(1) == y).sum().item()
                let pred = model.forward(&x)?.argmax(1, false)?;
                correct += pred
                    .eq(&y)?
                    .to_dtype(DType::F32)?
                    .sum_all()?
                    .item::<f32>()? as f64;
            }
            Ok(correct)
        })?;
        // print(epoch, running_loss / steps, accuracy, torch.cuda.memory_allocated(), ...)
        println!(
            "epoch {epoch}: train loss {:.4}, val accuracy {:.2}% | memory_allocated {:.2} MiB, max_memory_allocated {:.2} MiB (training), memory_reserved {:.2} MiB{}",
            running_loss / steps.max(1) as f64,
            100.0 * correct / val_len as f64,
            mib(device.memory_allocated()),
            mib(train_peak),
            mib(device.memory_reserved()),
            if use_amp { format!(", scale {}", scaler.get_scale()) } else { String::new() },
        );
    }
    // print(torch.cuda.memory_summary())
    println!("\n{}", device.memory_summary(false));
    Ok(())
}
