//! Train a small GPT and watch what a PyTorch user watches: loss, tokens/s and memory per epoch,
//! `memory_summary` at the end. The built-in task is addition written as text (`"37+48=58\n"`
//! with `--digits 2`: the sum's digits reversed, as the model writes them), scored by the exact
//! match of the answers it generates through its key/value cache, on problems it trained on and
//! on operand pairs it never saw; `--data FILE` trains on any text file as bytes instead. The
//! default (1-digit problems, 2 layers of width 64, 120 steps of 32 sequences) takes under a
//! minute on lavapipe; `--digits 2 --steps 500 --width 128` on a GPU learns to add.
//!
//!     cargo run --release --example gpt                      # addition, small model
//!     cargo run --release --example gpt -- --amp --checkpoint --generate 5
//!     cargo run --release --example gpt -- --data book.txt --generate 200
//!     cargo run --release --example gpt -- --vary-length --alloc-conf expandable_segments:True
//!     cargo run --release --example gpt -- --save-checkpoint ck.safetensors --max-steps 50
//!     cargo run --release --example gpt -- --resume ck.safetensors
//!     cargo run --release --example gpt -- --plan-for H100 --amp --layers 12 --heads 12 \
//!         --width 768 --block 1024 --batch-size 8 --data book.txt --epochs 1 --steps 2
//!
//! `--vary-length` draws each step's sequence length (PyTorch's fragmentation scenario: every
//! step's activations a different size); the run ends with peak reserved over peak allocated.
//! `--plan` (or `--plan-for GPU`, `--memory-limit SIZE`) makes the run a dry run: the same
//! steps through the same allocator with no memory and no kernels, ending with the real run's
//! `memory_summary`, the peak by category and the largest batch that fits.

#[path = "common/plan.rs"]
mod plan;

use clap::{value_parser, Arg, ArgAction, ArgMatches, Command};
use indicatif::{ProgressBar, ProgressStyle};
use kiln::amp::{autocast, DeviceType, GradScaler};
use kiln::nn::models::{gpt2, Gpt, GptConfig, Sampling};
use kiln::nn::{clip_grad_norm_, state_dict, Module};
use kiln::optim::{Adam, Optimizer};
use kiln::training::Checkpoint;
use kiln::{DType, Device, Tensor};
use std::path::PathBuf;
use std::time::Instant;

fn args() -> ArgMatches {
    let num = |name: &'static str, default: &'static str, help: &'static str| {
        Arg::new(name)
            .long(name)
            .default_value(default)
            .value_parser(value_parser!(usize))
            .help(help)
    };
    let flag = |name: &'static str, help: &'static str| {
        Arg::new(name)
            .long(name)
            .action(ArgAction::SetTrue)
            .help(help)
    };
    plan::args(Command::new("gpt"))
        .about("Train a small GPT with kiln and print PyTorch's memory numbers")
        .arg(
            Arg::new("device")
                .long("device")
                .help("vulkan:0, gl:0, cpu (default: the best adapter)"),
        )
        .arg(
            Arg::new("data")
                .long("data")
                .value_parser(value_parser!(PathBuf))
                .help("a text file, trained on as bytes"),
        )
        .arg(num("epochs", "3", "epochs"))
        .arg(num("steps", "40", "steps per epoch"))
        .arg(num("batch-size", "32", "sequences per step"))
        .arg(num(
            "block",
            "21",
            "tokens per sequence (the longest, with --vary-length)",
        ))
        .arg(num("layers", "2", "transformer blocks"))
        .arg(num("heads", "2", "attention heads"))
        .arg(num("width", "64", "embedding width"))
        .arg(num("digits", "1", "digits of each addend"))
        .arg(
            Arg::new("lr")
                .long("lr")
                .default_value("0.01")
                .value_parser(value_parser!(f64)),
        )
        .arg(flag("amp", "autocast(f16) forward and loss, GradScaler"))
        .arg(flag(
            "checkpoint",
            "recompute each block's activations in backward",
        ))
        .arg(flag("vary-length", "draw each step's sequence length"))
        .arg(
            Arg::new("alloc-conf")
                .long("alloc-conf")
                .help("allocator settings, as PYTORCH_CUDA_ALLOC_CONF"),
        )
        .arg(
            Arg::new("max-steps")
                .long("max-steps")
                .value_parser(value_parser!(u64)),
        )
        .arg(
            Arg::new("save-checkpoint")
                .long("save-checkpoint")
                .value_parser(value_parser!(PathBuf)),
        )
        .arg(
            Arg::new("resume")
                .long("resume")
                .value_parser(value_parser!(PathBuf)),
        )
        .arg(num(
            "generate",
            "0",
            "samples to print after training (addition: problems; text: bytes)",
        ))
        .get_matches()
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// A small deterministic generator (SplitMix64) for the data: a step's batch depends only on
/// the seed and the step, so a resumed run sees the batches the first one would have.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Where the tokens come from.
enum Task {
    /// `a+b=` then the sum's digits reversed and a newline; tokens 0-9, `+` 10, `=` 11, `\n` 12.
    Addition { digits: usize },
    /// A file's bytes.
    Text(Vec<u8>),
}

impl Task {
    fn vocab(&self) -> usize {
        match self {
            Task::Addition { .. } => 13,
            Task::Text(_) => 256,
        }
    }

    /// One problem's tokens; the prompt is everything up to `=`.
    fn problem(digits: usize, a: usize, b: usize) -> Vec<i32> {
        let num = |x: usize, n: usize| -> Vec<i32> {
            (0..n)
                .rev()
                .map(|i| ((x / 10usize.pow(i as u32)) % 10) as i32)
                .collect()
        };
        let mut t = num(a, digits);
        t.push(10);
        t.extend(num(b, digits));
        t.push(11);
        t.extend(num(a + b, digits + 1).into_iter().rev());
        t.push(12);
        t
    }

    /// Whether the pair (a, b) is held out for scoring: a fifth of the pairs, by a hash, so
    /// that every digit still appears in every place of the training problems.
    fn held_out(a: usize, b: usize) -> bool {
        let mut h = Rng((a as u64) << 32 | b as u64);
        h.next().is_multiple_of(5)
    }

    /// A problem whose operand pair is not held out.
    fn training_problem(digits: usize, rng: &mut Rng) -> Vec<i32> {
        let n = 10usize.pow(digits as u32);
        loop {
            let (a, b) = (rng.below(n), rng.below(n));
            if !Task::held_out(a, b) {
                return Task::problem(digits, a, b);
            }
        }
    }

    /// Inputs and next-token targets `[batch, t]`.
    fn batch(&self, rng: &mut Rng, batch: usize, t: usize) -> (Vec<i32>, Vec<i32>) {
        let (mut x, mut y) = (Vec::with_capacity(batch * t), Vec::with_capacity(batch * t));
        for _ in 0..batch {
            let seq: Vec<i32> = match self {
                Task::Addition { digits } => {
                    let mut s = Vec::new();
                    while s.len() < t + 1 {
                        s.extend(Task::training_problem(*digits, rng));
                    }
                    s
                }
                Task::Text(bytes) => {
                    let start = rng.below(bytes.len() - t);
                    bytes[start..start + t + 1]
                        .iter()
                        .map(|&b| b as i32)
                        .collect()
                }
            };
            x.extend(&seq[..t]);
            match self {
                // Only the answers are scored (-100: cross_entropy's ignore_index): the
                // operands are random, and learning their digits is noise.
                Task::Addition { .. } => {
                    let mut after_eq = false;
                    for w in seq.windows(2).take(t) {
                        after_eq = match w[0] {
                            11 => true,
                            12 => false,
                            _ => after_eq,
                        };
                        y.push(if after_eq { w[1] } else { -100 });
                    }
                }
                Task::Text(_) => y.extend(&seq[1..t + 1]),
            }
        }
        (x, y)
    }
}

/// Up to `count` distinct operand pairs, held out (`held`) or trained on, in a fixed order.
fn pairs(digits: usize, count: usize, held: bool) -> Vec<(usize, usize)> {
    let n = 10usize.pow(digits as u32);
    let mut rng = Rng(0xE7A1);
    let mut out = Vec::new();
    for _ in 0..count * 50 {
        let (a, b) = (rng.below(n), rng.below(n));
        if Task::held_out(a, b) == held && !out.contains(&(a, b)) {
            out.push((a, b));
            if out.len() == count {
                break;
            }
        }
    }
    out
}

/// The share of `problems` whose generated answer is exactly right, with `shown` of them
/// printed.
fn exact_match(
    model: &Gpt,
    digits: usize,
    problems: &[(usize, usize)],
    shown: usize,
    device: &Device,
) -> kiln::Result<f64> {
    let prompt_len = 2 * digits + 2;
    let answer_len = digits + 2;
    let prompts: Vec<i32> = problems
        .iter()
        .flat_map(|&(a, b)| Task::problem(digits, a, b)[..prompt_len].to_vec())
        .collect();
    let prompts = Tensor::from_slice(&prompts, &[problems.len(), prompt_len], device)?;
    let greedy = Sampling {
        temperature: 0.0,
        top_k: None,
    };
    let (out, cache) = model.generate(&prompts, answer_len, &greedy)?;
    let out = out.to_vec::<i32>()?;
    let mut right = 0;
    for (i, (&(a, b), row)) in problems
        .iter()
        .zip(out.chunks(prompt_len + answer_len))
        .enumerate()
    {
        let want = &Task::problem(digits, a, b)[prompt_len..];
        let ok = &row[prompt_len..] == want;
        right += ok as usize;
        if i < shown {
            let got: String = row[prompt_len..prompt_len + digits + 1]
                .iter()
                .rev()
                .map(|d| char::from(b'0' + *d.clamp(&0, &9) as u8))
                .collect();
            println!("  {a}+{b}={got} {}", if ok { "right" } else { "wrong" });
        }
    }
    if shown > 0 {
        println!(
            "  (the key/value cache of that generation: {:.3} MiB)",
            mib(cache.bytes())
        );
    }
    Ok(right as f64 / problems.len() as f64)
}

/// `count` bytes sampled after the file's first bytes.
fn sample_text(model: &Gpt, bytes: &[u8], count: usize, device: &Device) -> kiln::Result<()> {
    let room = model.config.block_size.saturating_sub(count).clamp(1, 16);
    let prompt: Vec<i32> = bytes.iter().take(room).map(|&b| b as i32).collect();
    let ids = Tensor::from_slice(&prompt, &[1, prompt.len()], device)?;
    let count = count.min(model.config.block_size - prompt.len());
    let sampling = Sampling {
        temperature: 0.8,
        top_k: Some(40),
    };
    let (out, cache) = model.generate(&ids, count, &sampling)?;
    let text: Vec<u8> = out.to_vec::<i32>()?.iter().map(|&b| b as u8).collect();
    println!("{}", String::from_utf8_lossy(&text));
    println!("(the key/value cache: {:.3} MiB)", mib(cache.bytes()));
    Ok(())
}

fn main() -> kiln::Result<()> {
    let m = args();
    let device = plan::device(
        &m,
        || match m.get_one::<String>("device") {
            Some(spec) => Device::from_spec(spec),
            None => Device::best(),
        },
        m.get_one::<String>("alloc-conf").map(String::as_str),
    )?;
    let get = |name: &str| *m.get_one::<usize>(name).expect("default");
    let task = match m.get_one::<PathBuf>("data") {
        Some(path) => {
            let bytes = std::fs::read(path).map_err(|e| kiln::Error::Io {
                op: "gpt --data",
                path: path.display().to_string(),
                msg: e.to_string(),
            })?;
            if bytes.len() <= get("block") + 1 {
                return Err(kiln::Error::InvalidArgument {
                    op: "gpt --data",
                    msg: "the file is shorter than one block".into(),
                });
            }
            Task::Text(bytes)
        }
        None => Task::Addition {
            digits: get("digits").clamp(1, 6),
        },
    };
    let config = GptConfig {
        vocab_size: task.vocab(),
        block_size: get("block"),
        n_layer: get("layers"),
        n_head: get("heads"),
        n_embd: get("width"),
        ..GptConfig::gpt2()
    };
    plan::record(&device);
    device.manual_seed(0);
    let mut model = gpt2(config.clone(), &device)?;
    model.checkpoint_blocks = m.get_flag("checkpoint");
    let amp = m.get_flag("amp") && !device.is_cpu();
    println!(
        "{} on {}: {} parameters, {} layers, {} heads, width {}, block {}{}{}",
        match &task {
            Task::Addition { digits } => format!("{digits}-digit addition"),
            Task::Text(b) => format!("{} bytes of text", b.len()),
        },
        device.name(),
        model.num_parameters(),
        model.config.n_layer,
        model.config.n_head,
        model.config.n_embd,
        model.config.block_size,
        if amp {
            ", autocast f16 + GradScaler"
        } else {
            ""
        },
        if model.checkpoint_blocks {
            ", blocks checkpointed"
        } else {
            ""
        },
    );
    if device.is_dry_run() {
        return dry_run(&m, &mut model, &task, &device, amp);
    }
    train(&m, &mut model, &task, &device, amp)?;
    // The training's memory (what `--plan` plans), before the evaluation's generation.
    println!("\n{}", device.memory_summary(false));
    if let Task::Addition { digits } = task {
        // Exact match on problems it trained on (what it learnt) and on operand pairs it never
        // saw (whether it learnt to add).
        model.eval();
        let shown = get("generate");
        let (seen, held) = (pairs(digits, 200, false), pairs(digits, 200, true));
        let (s, h) = kiln::no_grad(|| -> kiln::Result<(f64, f64)> {
            Ok((
                exact_match(&model, digits, &seen, shown, &device)?,
                exact_match(&model, digits, &held, 0, &device)?,
            ))
        })?;
        println!(
            "exact match: {:.1}% of {} problems it trained on, {:.1}% of {} held-out ones",
            100.0 * s,
            seen.len(),
            100.0 * h,
            held.len()
        );
    } else if let (Task::Text(bytes), n) = (&task, get("generate")) {
        if n > 0 {
            model.eval();
            sample_text(&model, bytes, n, &device)?;
        }
    }
    Ok(())
}

/// One training step: the loss under autocast, backward through the scaler, gradients
/// unscaled and clipped at norm 1, the optimizer's step; returns the loss.
fn step(
    model: &Gpt,
    opt: &mut Adam,
    scaler: &mut GradScaler,
    (x, y): (&Tensor, &Tensor),
    amp: bool,
    device_type: DeviceType,
) -> kiln::Result<Tensor> {
    let loss = {
        let _amp = autocast(device_type, DType::F16, amp)?;
        model.loss(x, y)?
    };
    opt.zero_grad(true)?;
    scaler.scale(&loss)?.backward()?;
    scaler.unscale_(opt)?;
    clip_grad_norm_(&model.parameters(), 1.0, 2.0)?;
    scaler.step(opt)?;
    scaler.update(None)?;
    Ok(loss)
}

/// `--plan`: the training run as a dry run, its `memory_summary`, the peak by category, and
/// the largest batch whose two steps at full length fit the memory limit (or the GPU).
fn dry_run(
    m: &ArgMatches,
    model: &mut Gpt,
    task: &Task,
    device: &Device,
    amp: bool,
) -> kiln::Result<()> {
    let started = Instant::now();
    train(m, model, task, device, amp)?;
    println!(
        "dry run of the training: {:.2} s",
        started.elapsed().as_secs_f64()
    );
    println!("\n{}", device.memory_summary(false));
    let (target, budget) = plan::budget(device)?;
    let (config, checkpointed) = (model.config.clone(), model.checkpoint_blocks);
    let started = Instant::now();
    let fit = kiln::device::max_batch_size(&target, Some(budget), 1 << 16, |dev, batch| {
        dev.manual_seed(0);
        let mut model = gpt2(config.clone(), dev)?;
        model.checkpoint_blocks = checkpointed;
        let mut opt = Adam::adamw(model.parameters(), 1e-3)?;
        opt.weight_decay = 0.1;
        let mut scaler = GradScaler::new().enabled(amp);
        let mut rng = Rng(0x5EED);
        for _ in 0..2 {
            let t = config.block_size;
            let (x, y) = task.batch(&mut rng, batch, t);
            let x = Tensor::from_slice(&x, &[batch, t], dev)?;
            let y = Tensor::from_slice(&y, &[batch, t], dev)?;
            step(
                &model,
                &mut opt,
                &mut scaler,
                (&x, &y),
                amp,
                DeviceType::Gpu,
            )?;
        }
        Ok(())
    })?;
    plan::report(&plan::peaks(device), &fit, budget, started);
    Ok(())
}

/// The training loop: AdamW (weight decay 0.1, as GPT-2's), autocast and GradScaler with
/// `--amp`, gradients clipped at norm 1, checkpoints saved and resumed.
fn train(
    m: &ArgMatches,
    model: &mut Gpt,
    task: &Task,
    device: &Device,
    amp: bool,
) -> kiln::Result<()> {
    let get = |name: &str| *m.get_one::<usize>(name).expect("default");
    let (epochs, steps, batch) = (get("epochs"), get("steps"), get("batch-size"));
    let lr = *m.get_one::<f64>("lr").expect("default");
    let mut opt = Adam::adamw(model.parameters(), lr)?;
    opt.weight_decay = 0.1;
    let mut scaler = GradScaler::new().enabled(amp);
    let device_type = if device.is_cpu() {
        DeviceType::Cpu
    } else {
        DeviceType::Gpu
    };
    let mut global_step: u64 = 0;
    if let Some(path) = m.get_one::<PathBuf>("resume") {
        let mut ck = Checkpoint {
            model: state_dict(model),
            optimizer: Some(&mut opt),
            scaler: Some(&mut scaler),
            generator: Some(device.clone()),
            ..Default::default()
        };
        ck.load(path)?;
        global_step = ck
            .extra
            .get("step")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        println!("resumed from {} at step {global_step}", path.display());
    }
    let max_steps = m.get_one::<u64>("max-steps").copied();
    let vary = m.get_flag("vary-length");
    let block = model.config.block_size;
    let mut peak_reserved = 0u64;
    let mut peak_allocated = 0u64;
    let first_epoch = (global_step as usize / steps.max(1)) + 1;
    for epoch in first_epoch..=epochs {
        let bar = ProgressBar::new(steps as u64).with_style(
            ProgressStyle::with_template("epoch {prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed})")
                .expect("a valid template")
                .progress_chars("=> "),
        );
        bar.set_prefix(format!("{epoch}/{epochs}"));
        device.reset_peak_memory_stats();
        let started = Instant::now();
        let mut tokens = 0usize;
        let mut loss_sum = Tensor::zeros(&[], DType::F32, device)?;
        let mut done = 0;
        while done < steps && (global_step as usize) < epoch * steps {
            if max_steps.is_some_and(|max| global_step >= max) {
                break;
            }
            let mut rng = Rng(0x5EED ^ global_step.wrapping_mul(0x100_0000_01B3));
            let t = if vary {
                8 + rng.below(block - 7)
            } else {
                block
            };
            let (x, y) = task.batch(&mut rng, batch, t);
            let x = Tensor::from_slice(&x, &[batch, t], device)?;
            let y = Tensor::from_slice(&y, &[batch, t], device)?;
            let loss = step(model, &mut opt, &mut scaler, (&x, &y), amp, device_type)?;
            loss_sum = loss_sum.add(&loss.detach())?;
            tokens += batch * t;
            global_step += 1;
            done += 1;
            if done % 10 == 0 && !device.is_dry_run() {
                bar.set_message(format!("loss {:.4}", loss.item::<f32>()?));
            }
            bar.inc(1);
        }
        device.synchronize()?;
        let secs = started.elapsed().as_secs_f64();
        // A dry run has no values to show.
        let loss = match device.is_dry_run() {
            true => "(dry run)".to_string(),
            false => format!("{:.4}", loss_sum.item::<f32>()? / done.max(1) as f32),
        };
        bar.finish_with_message(format!("loss {loss}"));
        let stats = device.memory_stats();
        let peak = |key: &str| stats.get(key).copied().unwrap_or(0) as u64;
        peak_reserved = peak_reserved.max(peak("reserved_bytes.all.peak"));
        peak_allocated = peak_allocated.max(peak("allocated_bytes.all.peak"));
        println!(
            "epoch {epoch}: loss {loss}, {:.0} tokens/s | memory_allocated {:.2} MiB, max_memory_allocated {:.2} MiB, memory_reserved {:.2} MiB",
            tokens as f64 / secs,
            mib(device.memory_allocated()),
            mib(device.max_memory_allocated()),
            mib(device.memory_reserved()),
        );
        if let Some(path) = m
            .get_one::<PathBuf>("save-checkpoint")
            .filter(|_| !device.is_dry_run())
        {
            let ck = Checkpoint {
                model: state_dict(model),
                optimizer: Some(&mut opt),
                scaler: Some(&mut scaler),
                generator: Some(device.clone()),
                extra: [("step".to_string(), global_step.to_string())].into(),
                ..Default::default()
            };
            ck.save(path)?;
            println!(
                "training checkpoint (step {global_step}) written to {}",
                path.display()
            );
        }
        if max_steps.is_some_and(|max| global_step >= max) {
            println!("stopped at step {global_step} (--max-steps)");
            break;
        }
    }
    if vary {
        println!(
            "varying lengths: peak reserved {:.2} MiB / peak allocated {:.2} MiB = {:.3}",
            mib(peak_reserved),
            mib(peak_allocated),
            peak_reserved as f64 / peak_allocated.max(1) as f64
        );
    }
    Ok(())
}
