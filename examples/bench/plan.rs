//! `--suite plan`: dry runs (Note [Dry runs]) beside the real runs they plan. On each adapter,
//! three GPT-2 training steps of the gpt suite's size under AMP (f32 where the adapter has no
//! f16), with ordinary and with expandable segments, on the device and on its planning twin:
//! the peaks allocated and reserved of both, which must be equal. Then, on any machine, a dry
//! run of GPT-2 124M b8 T1024 AMP for an H100 (its wall time, the target being 2 s on a 2-core
//! box) and the largest batch at T 1024 that fits the H100's 80 GB, with segments and with
//! expandable segments; `KILN_PLAN_CHECK_BATCH=1` runs the batch found for this adapter and the
//! next one for real (on a GPU with the memory), also within an H100's memory as its driver
//! would lend it.

use crate::gpt::{ids, sizes, Run};
use crate::Row;
use kiln::nn::models::GptConfig;
use kiln::{Device, PlanTarget};
use std::time::Instant;

const MIB: f64 = (1 << 20) as f64;

/// `steps` on `dev` from an emptied cache and reset peaks: (peak allocated, peak reserved).
fn fresh(
    dev: &Device,
    steps: impl FnOnce(&Device) -> kiln::Result<()>,
) -> kiln::Result<(u64, u64)> {
    dev.synchronize()?;
    dev.empty_cache();
    dev.reset_peak_memory_stats();
    steps(dev)?;
    dev.synchronize()?;
    Ok((dev.max_memory_allocated(), dev.max_memory_reserved()))
}

/// Three GPT-2 steps of a fresh model, from an emptied cache: (peak allocated, reserved).
fn three_steps(
    dev: &Device,
    config: &GptConfig,
    (b, t): (usize, usize),
    amp: bool,
) -> kiln::Result<(u64, u64)> {
    fresh(dev, |dev| {
        let mut run = Run::new(dev, config, 0, 0.1, amp)?;
        let (x, y) = (
            ids(b, t, config.vocab_size, 1, dev)?,
            ids(b, t, config.vocab_size, 2, dev)?,
        );
        for _ in 0..3 {
            run.step(&x, &y)?;
        }
        Ok(())
    })
}

/// The resnet suite's model and batch: ResNet-50 b32 224x224 on GPUs.
fn resnet_size(dev: &Device) -> (&'static str, usize, usize) {
    match crate::is_software(dev) {
        true => ("resnet18", 2, 64),
        false => ("resnet50", 32, 224),
    }
}

/// Three SGD-momentum steps of a fresh ResNet (the resnet suite's).
fn resnet_steps(dev: &Device, n: usize, hw: usize) -> kiln::Result<()> {
    use kiln::nn::models::{resnet18, resnet50};
    use kiln::nn::Module;
    use kiln::optim::{Optimizer, Sgd};
    use kiln::{DType, Tensor};
    dev.manual_seed(0);
    let model = match n {
        2 => resnet18(1000, dev)?,
        _ => resnet50(1000, dev)?,
    };
    let mut opt = Sgd::new(model.parameters(), 1e-2)?.momentum(0.9)?;
    let x = Tensor::randn(&[n, 3, hw, hw], DType::F32, dev)?;
    let labels: Vec<i32> = (0..n as i32).map(|i| i * 31 % 1000).collect();
    let y = Tensor::from_slice(&labels, &[n], dev)?;
    for _ in 0..3 {
        opt.zero_grad(true)?;
        kiln::nn::cross_entropy(&model.forward(&x)?, &y)?.backward()?;
        opt.step()?;
    }
    Ok(())
}

pub fn plan_suite(dev: &Device, rows: &mut Vec<Row>) -> kiln::Result<()> {
    let (config, b, t, _) = sizes(dev);
    let amp = dev.adapter_info().is_some_and(|a| a.features.shader_f16);
    let mut push = |case: String, value: f64, unit: &'static str| {
        rows.push(Row {
            adapter: dev.name(),
            suite: "plan",
            case,
            value,
            unit,
        })
    };
    let name = format!(
        "gpt2 {}L b{b} T{t} {}",
        config.n_layer,
        if amp { "AMP" } else { "f32" }
    );
    for conf in ["expandable_segments:False", "expandable_segments:True"] {
        dev.set_allocator_settings(conf)?;
        // The first run tunes the kernels (the tuner runs candidates, which allocate); the
        // dry run follows the tuned choices, as a tuned process does.
        three_steps(dev, &config, (b, t), amp)?;
        let real = three_steps(dev, &config, (b, t), amp)?;
        let plan = dev.planning_twin()?;
        let started = Instant::now();
        let dry = three_steps(&plan, &config, (b, t), amp)?;
        let secs = started.elapsed().as_secs_f64();
        let short = conf.trim_start_matches("expandable_segments:");
        push(
            format!("{name} exp {short}: real peak allocated"),
            real.0 as f64 / MIB,
            "MiB",
        );
        push(
            format!("{name} exp {short}: dry peak allocated"),
            dry.0 as f64 / MIB,
            "MiB",
        );
        push(
            format!("{name} exp {short}: real peak reserved"),
            real.1 as f64 / MIB,
            "MiB",
        );
        push(
            format!("{name} exp {short}: dry peak reserved"),
            dry.1 as f64 / MIB,
            "MiB",
        );
        push(
            format!("{name} exp {short}: dry equals real"),
            (real == dry) as u8 as f64,
            "bool",
        );
        push(format!("{name} exp {short}: dry run of 3 steps"), secs, "s");
    }
    dev.set_allocator_settings("expandable_segments:False")?;
    offloaded_rows(dev, &config, (b, t), amp, &name, &mut push)?;
    let (rname, n, hw) = resnet_size(dev);
    fresh(dev, |d| resnet_steps(d, n, hw))?;
    let real = fresh(dev, |d| resnet_steps(d, n, hw))?;
    let dry = fresh(&dev.planning_twin()?, |d| resnet_steps(d, n, hw))?;
    let name = format!("{rname} b{n} {hw}x{hw} SGD momentum");
    push(
        format!("{name}: real peak allocated"),
        real.0 as f64 / MIB,
        "MiB",
    );
    push(
        format!("{name}: dry peak allocated"),
        dry.0 as f64 / MIB,
        "MiB",
    );
    push(
        format!("{name}: real peak reserved"),
        real.1 as f64 / MIB,
        "MiB",
    );
    push(
        format!("{name}: dry equals real"),
        (real == dry) as u8 as f64,
        "bool",
    );
    if std::env::var("KILN_PLAN_CHECK_BATCH").is_ok_and(|v| v == "1") && amp {
        check_batch(dev, &config, t, &mut push)?;
    }
    Ok(())
}

/// Three steps under `save_on_cpu(pin_memory=True)`, real and dry: the device's peaks and the
/// pinned pool's (Note [Dry runs]). The pool is emptied after the inputs' uploads (whose
/// staging a dry run does not model) and the device synchronized after each step, so that the
/// real pool takes its blocks back once their copies are done, as the dry one does.
fn offloaded_rows(
    dev: &Device,
    config: &GptConfig,
    (b, t): (usize, usize),
    amp: bool,
    name: &str,
    push: &mut impl FnMut(String, f64, &'static str),
) -> kiln::Result<()> {
    let steps = |d: &Device| -> kiln::Result<[u64; 4]> {
        d.synchronize()?;
        d.empty_cache();
        d.reset_peak_memory_stats();
        let mut run = Run::new(d, config, 0, 0.1, amp)?;
        run.offload = true;
        let (x, y) = (
            ids(b, t, config.vocab_size, 1, d)?,
            ids(b, t, config.vocab_size, 2, d)?,
        );
        d.synchronize()?;
        d.empty_host_cache();
        d.reset_peak_host_memory_stats();
        d.reset_accumulated_host_memory_stats();
        for _ in 0..3 {
            run.step(&x, &y)?;
            d.synchronize()?;
        }
        let host = d.host_memory_stats();
        Ok([
            d.max_memory_allocated(),
            d.max_memory_reserved(),
            host.allocated_bytes.peak as u64,
            host.allocations.allocated as u64,
        ])
    };
    let real = steps(dev)?;
    let dry = steps(&dev.planning_twin()?)?;
    let name = format!("{name} save_on_cpu");
    for (what, r, d) in [
        ("peak allocated", real[0], dry[0]),
        ("peak reserved", real[1], dry[1]),
        ("pinned peak", real[2], dry[2]),
    ] {
        push(format!("{name}: real {what}"), r as f64 / MIB, "MiB");
        push(format!("{name}: dry {what}"), d as f64 / MIB, "MiB");
    }
    push(
        format!("{name}: real pinned blocks made"),
        real[3] as f64,
        "blocks",
    );
    push(
        format!("{name}: dry pinned blocks made"),
        dry[3] as f64,
        "blocks",
    );
    push(
        format!("{name}: dry equals real"),
        (real == dry) as u8 as f64,
        "bool",
    );
    Ok(())
}

/// The GPT-2 124M rows for a named GPU, which need no GPU: one AMP step's dry run and the
/// largest batch at T 1024, with segments and with expandable segments.
pub fn named_rows(gpu: &str, rows: &mut Vec<Row>) -> kiln::Result<()> {
    let target = PlanTarget::named(gpu)?;
    let plan = Device::planning(target.clone())?;
    let config = GptConfig::gpt2();
    let started = Instant::now();
    let mut run = Run::new(&plan, &config, 0, 0.1, true)?;
    let (x, y) = (
        ids(8, 1024, config.vocab_size, 1, &plan)?,
        ids(8, 1024, config.vocab_size, 2, &plan)?,
    );
    run.step(&x, &y)?;
    let secs = started.elapsed().as_secs_f64();
    let mut push = |case: String, value: f64, unit: &'static str| {
        rows.push(Row {
            adapter: plan.name(),
            suite: "plan",
            case,
            value,
            unit,
        })
    };
    push(
        "gpt2 124M b8 T1024 AMP: one step's dry run (model built)".into(),
        secs,
        "s",
    );
    push(
        "gpt2 124M b8 T1024 AMP: dry peak allocated".into(),
        plan.max_memory_allocated() as f64 / MIB,
        "MiB",
    );
    push(
        "gpt2 124M b8 T1024 AMP: dry peak reserved".into(),
        plan.max_memory_reserved() as f64 / MIB,
        "MiB",
    );
    drop(run);
    // With segments (a tensor in one buffer: NVIDIA's 4 GiB bound GPT-2's batch), then with
    // expandable segments (the memory bounds it; Note [Windows] in `kernels/launch.rs`).
    for (expandable, amp) in [(false, true), (true, true), (true, false)] {
        let mut target = target.clone();
        target.config.expandable_segments |= expandable;
        let tag = match (expandable, amp) {
            (false, _) => " AMP",
            (true, true) => " AMP, expandable",
            (true, false) => " f32, expandable",
        };
        let started = Instant::now();
        let fit = largest_batch(&target, &config, 1024, amp)?;
        push(
            format!("gpt2 124M T1024{tag}: largest batch"),
            fit.batch as f64,
            "seqs",
        );
        push(
            format!("gpt2 124M T1024{tag}: its peak reserved"),
            fit.peak_reserved as f64 / MIB,
            "MiB",
        );
        push(
            format!("gpt2 124M T1024{tag}: next batch would reserve"),
            fit.next_peak_reserved as f64 / MIB,
            "MiB",
        );
        eprintln!(
            "gpt2 124M T1024{tag}: batch {} does not fit: {}",
            fit.batch + 1,
            fit.next_fails_with.lines().next().unwrap_or_default()
        );
        push(
            format!("gpt2 124M T1024{tag}: search"),
            started.elapsed().as_secs_f64(),
            "s",
        );
    }
    Ok(())
}

/// The largest batch whose three steps (AMP or f32) at length `t` fit `target`.
fn largest_batch(
    target: &PlanTarget,
    config: &GptConfig,
    t: usize,
    amp: bool,
) -> kiln::Result<kiln::device::BatchFit> {
    kiln::device::max_batch_size(target, None, 4096, |dev, b| {
        let mut run = Run::new(dev, config, 0, 0.1, amp)?;
        let (x, y) = (
            ids(b, t, config.vocab_size, 1, dev)?,
            ids(b, t, config.vocab_size, 2, dev)?,
        );
        for _ in 0..3 {
            run.step(&x, &y)?;
        }
        Ok(())
    })
}

/// The batch `max_batch_size` finds for this adapter, run for real, and the next one, which
/// must fail as its dry run did: in the GPU's whole memory, within an 80 GB H100's (the issue's
/// target GPU, which the lab does not have) and within 11 GiB.
fn check_batch(
    dev: &Device,
    config: &GptConfig,
    t: usize,
    push: &mut impl FnMut(String, f64, &'static str),
) -> kiln::Result<()> {
    // With segments, a tensor is one buffer (NVIDIA: at most 4 GiB); with expandable segments
    // the memory bounds the batch (Note [Windows] in `kernels/launch.rs`).
    // The H100's memory as its driver would lend it, as the H200 emulates it with a limit.
    let h100 = PlanTarget::named("H100")?;
    let h100 = h100.capacity.map(|c| c - h100.driver_held);
    push(
        "driver holds of the GPU's memory".into(),
        PlanTarget::like(dev)?.driver_held as f64 / MIB,
        "MiB",
    );
    // (expandable segments, memory limit, AMP): f32 once, within the H100's memory.
    let cases = [
        (false, None, true),
        (false, Some(11u64 << 30), true),
        (true, None, true),
        (true, h100, true),
        (true, h100, false),
    ];
    for (expandable, limit, amp) in cases {
        let conf = format!(
            "expandable_segments:{}",
            ["False", "True"][expandable as usize]
        );
        if dev.set_allocator_settings(&conf).is_err() {
            continue;
        }
        dev.set_memory_limit(limit);
        let within = match limit {
            Some(l) if l.is_multiple_of(1 << 30) => format!(" within {} GiB", l >> 30),
            Some(l) => format!(" within {:.2} GiB", l as f64 / (1u64 << 30) as f64),
            None => String::new(),
        } + if expandable { ", expandable" } else { "" };
        let mode = if amp { "AMP" } else { "f32" };
        let target = PlanTarget::like(dev)?;
        let fit = largest_batch(&target, config, t, amp)?;
        push(
            format!("gpt2 T{t} {mode}{within}: largest batch (dry)"),
            fit.batch as f64,
            "seqs",
        );
        push(
            format!("gpt2 T{t} {mode}{within}: its dry peak reserved"),
            fit.peak_reserved as f64 / MIB,
            "MiB",
        );
        let fits = three_steps(dev, config, (fit.batch, t), amp);
        push(
            format!(
                "gpt2 T{t} {mode}{within}: batch {} runs for real",
                fit.batch
            ),
            fits.is_ok() as u8 as f64,
            "bool",
        );
        match &fits {
            Ok((_, reserved)) => push(
                format!("gpt2 T{t} {mode}{within}: its real peak reserved"),
                *reserved as f64 / MIB,
                "MiB",
            ),
            Err(e) => eprintln!(
                "batch {} {mode}{within} (planned to fit): real: {e}",
                fit.batch
            ),
        }
        let next = three_steps(dev, config, (fit.batch + 1, t), amp);
        let first = |s: &str| s.lines().next().unwrap_or_default().to_string();
        let real_error = next
            .as_ref()
            .err()
            .map(|e| first(&e.to_string()))
            .unwrap_or_default();
        eprintln!(
            "batch {} {mode}{within}: real: {real_error}; dry: {}",
            fit.batch + 1,
            first(&fit.next_fails_with)
        );
        let same = match next {
            Err(kiln::Error::OutOfMemory(_)) => fit.next_fails_with.contains("out of memory"),
            Err(kiln::Error::TooLarge { .. }) => fit.next_fails_with.contains("exceeds"),
            _ => false,
        };
        push(
            format!(
                "gpt2 T{t} {mode}{within}: batch {} fails as planned",
                fit.batch + 1
            ),
            same as u8 as f64,
            "bool",
        );
        dev.synchronize()?;
        dev.empty_cache();
    }
    dev.set_memory_limit(None);
    dev.set_allocator_settings("expandable_segments:False")?;
    Ok(())
}
