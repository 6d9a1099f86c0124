//! `--suite gpt`: a GPT-2 124M training step (batch 8, T 1024, AdamW lr 3e-4 weight decay 0.1)
//! under AMP (autocast f16 + GradScaler) and in f32, timed over steps after two warm-up steps
//! with the peak of the timed steps, as PyTorch's anchor measures it; then the fragmentation
//! scenario: 40 AMP steps with T drawn from 64..1024, without and with expandable segments,
//! peak reserved over peak allocated. CPU adapters run a 2-layer model of width 64 on T 64.

use crate::{is_software, Row};
use kiln::amp::{autocast, DeviceType, GradScaler};
use kiln::nn::models::{gpt2, Gpt, GptConfig};
use kiln::nn::Module;
use kiln::optim::{Adam, Optimizer};
use kiln::{DType, Device, Tensor};
use std::time::Instant;

const MIB: f64 = (1 << 20) as f64;

/// The model and batch the suite runs on `dev`: GPT-2 small at batch 8 and T 1024 on GPUs.
pub(crate) fn sizes(dev: &Device) -> (GptConfig, usize, usize, usize) {
    match is_software(dev) {
        true => (
            GptConfig {
                vocab_size: 512,
                block_size: 64,
                n_layer: 2,
                n_head: 2,
                n_embd: 64,
                ..GptConfig::gpt2()
            },
            2,
            64,
            3,
        ),
        false => (GptConfig::gpt2(), 8, 1024, 12),
    }
}

/// Token ids in [0, vocab) from a seed, `[b, t]`.
pub(crate) fn ids(
    b: usize,
    t: usize,
    vocab: usize,
    seed: u64,
    dev: &Device,
) -> kiln::Result<Tensor> {
    let mut s = seed;
    let v: Vec<i32> = (0..b * t)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) % vocab as u64) as i32
        })
        .collect();
    Tensor::from_slice(&v, &[b, t], dev)
}

pub fn gpt_suite(dev: &Device, rows: &mut Vec<Row>) -> kiln::Result<()> {
    let (config, b, t, steps) = sizes(dev);
    let f16 = dev.adapter_info().is_some_and(|a| a.features.shader_f16);
    let name = format!(
        "gpt2 {}L {}d b{b} T{t} AdamW",
        config.n_layer, config.n_embd
    );
    // KILN_BENCH_GPT=TEXT: only the steps whose tag contains TEXT, and no varying lengths.
    let only = std::env::var("KILN_BENCH_GPT").ok();
    for (amp, offload) in [(true, false), (true, true), (false, false)] {
        if amp && !f16 {
            continue;
        }
        let tag = match (amp, offload) {
            (true, false) => "AMP f16",
            // Its copies run on the side queue where the device opened one (Note [Offload
            // ahead]), a different figure from the stream's.
            (true, true) if dev.copies_beside() => {
                "AMP f16 save_on_cpu(pin_memory), copies on the copy queue"
            }
            (true, true) => "AMP f16 save_on_cpu(pin_memory)",
            _ => "f32",
        };
        if only.as_ref().is_some_and(|o| !tag.contains(o.as_str())) {
            continue;
        }
        let steps = if amp { steps } else { steps / 2 };
        let (secs, peak, reserved) = step_figures(dev, &config, (b, t), (amp, offload), steps)?;
        let mut push = |case: String, value: f64, unit: &'static str| {
            rows.push(Row {
                adapter: dev.name(),
                suite: "gpt",
                case,
                value,
                unit,
            })
        };
        push(format!("{name} {tag} step"), secs * 1e3, "ms");
        push(
            format!("{name} {tag} tokens/s"),
            (b * t) as f64 / secs,
            "tok/s",
        );
        push(
            format!("{name} {tag} peak allocated"),
            peak as f64 / MIB,
            "MiB",
        );
        push(
            format!("{name} {tag} reserved"),
            reserved as f64 / MIB,
            "MiB",
        );
    }
    if f16 && only.is_none() {
        varying_rows(dev, &config, b, rows)?;
    }
    Ok(())
}

/// A fresh model with its AdamW and GradScaler, made after the cache is emptied.
pub(crate) struct Run {
    model: Gpt,
    opt: Adam,
    scaler: GradScaler,
    amp: bool,
    /// The forward under `save_on_cpu(pin_memory=True)`.
    pub(crate) offload: bool,
    /// `KILN_BENCH_OFFLOAD_AHEAD=BYTES`: `save_on_cpu_ahead` with that look-ahead instead.
    offload_ahead: Option<u64>,
}

impl Run {
    pub(crate) fn new(
        dev: &Device,
        config: &GptConfig,
        seed: u64,
        weight_decay: f64,
        amp: bool,
    ) -> kiln::Result<Run> {
        dev.synchronize()?;
        dev.empty_cache();
        dev.manual_seed(seed);
        let model = gpt2(config.clone(), dev)?;
        let mut opt = Adam::adamw(model.parameters(), 3e-4)?;
        opt.weight_decay = weight_decay;
        Ok(Run {
            model,
            opt,
            scaler: GradScaler::new().enabled(amp),
            amp,
            offload: false,
            offload_ahead: std::env::var("KILN_BENCH_OFFLOAD_AHEAD")
                .ok()
                .and_then(|v| v.parse().ok()),
        })
    }

    /// One step as PyTorch's anchor takes it: zero_grad, forward and loss under autocast, the
    /// scaled backward, the scaler's step and update.
    pub(crate) fn step(&mut self, x: &Tensor, y: &Tensor) -> kiln::Result<()> {
        self.opt.zero_grad(true)?;
        let loss = {
            let _offload = self.offload.then(|| match self.offload_ahead {
                Some(bytes) => kiln::autograd::save_on_cpu_ahead(true, bytes),
                None => kiln::autograd::save_on_cpu(true),
            });
            let _amp = autocast(DeviceType::Gpu, DType::F16, self.amp)?;
            self.model.loss(x, y)?
        };
        self.scaler.scale(&loss)?.backward()?;
        self.scaler.step(&mut self.opt)?;
        self.scaler.update(None)
    }
}

/// Seconds per step, peak allocated over the timed steps and reserved after them.
fn step_figures(
    dev: &Device,
    config: &GptConfig,
    (b, t): (usize, usize),
    (amp, offload): (bool, bool),
    steps: usize,
) -> kiln::Result<(f64, u64, u64)> {
    let mut run = Run::new(dev, config, 0, 0.1, amp)?;
    run.offload = offload;
    let (x, y) = (
        ids(b, t, config.vocab_size, 1, dev)?,
        ids(b, t, config.vocab_size, 2, dev)?,
    );
    let mut step = || run.step(&x, &y);
    for _ in 0..3 {
        step()?;
    }
    dev.synchronize()?;
    dev.reset_peak_memory_stats();
    let started = Instant::now();
    for _ in 0..steps {
        step()?;
    }
    dev.synchronize()?;
    let secs = started.elapsed().as_secs_f64() / steps as f64;
    let figures = (secs, dev.max_memory_allocated(), dev.memory_reserved());
    let tag = match (amp, offload) {
        (true, false) => "AMP f16",
        (true, true) => "AMP f16 save_on_cpu",
        _ => "f32",
    };
    super::print_profile(dev, &format!("gpt2 {tag} step"), 2, 40, step)?;
    Ok(figures)
}

/// PyTorch's fragmentation scenario: AMP steps whose T is drawn from 64..=block (on CPU adapters
/// 8..=block and 8 steps), with a fresh model and an emptied cache per allocator setting.
fn varying_rows(
    dev: &Device,
    config: &GptConfig,
    b: usize,
    rows: &mut Vec<Row>,
) -> kiln::Result<()> {
    let (low, steps) = if is_software(dev) { (8, 8) } else { (64, 40) };
    for conf in ["expandable_segments:False", "expandable_segments:True"] {
        dev.synchronize()?;
        dev.empty_cache();
        dev.set_allocator_settings(conf)?;
        let mut run = Run::new(dev, config, 1, 0.0, true)?;
        dev.reset_peak_memory_stats();
        let mut s: u64 = 1;
        let started = Instant::now();
        for i in 0..steps {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let t = low + ((s >> 33) as usize) % (config.block_size - low + 1);
            let x = ids(b, t, config.vocab_size, i as u64, dev)?;
            run.step(&x, &x)?;
        }
        dev.synchronize()?;
        let secs = started.elapsed().as_secs_f64() / steps as f64;
        let stats = dev.memory_stats();
        let get = |k: &str| stats.get(k).copied().unwrap_or(0) as f64;
        let (alloc, reserved) = (
            get("allocated_bytes.all.peak"),
            get("reserved_bytes.all.peak"),
        );
        let name = format!(
            "gpt2 {}L varying T {low}..{} b{b} {steps} AMP steps {conf}",
            config.n_layer, config.block_size
        );
        for (what, value, unit) in [
            (
                "peak reserved / peak allocated",
                reserved / alloc.max(1.0),
                "ratio",
            ),
            ("peak allocated", alloc / MIB, "MiB"),
            ("peak reserved", reserved / MIB, "MiB"),
            ("step", secs * 1e3, "ms"),
        ] {
            rows.push(Row {
                adapter: dev.name(),
                suite: "gpt",
                case: format!("{name}: {what}"),
                value,
                unit,
            });
        }
        drop(run);
    }
    dev.synchronize()?;
    dev.empty_cache();
    dev.set_allocator_settings("expandable_segments:False")
}
