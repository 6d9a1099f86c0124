//! Data-parallel scaling: the big MLP (784-4096-4096-10, batch 512 per rank) and ResNet-50
//! (batch 32 per rank, 224x224), SGD with momentum, under `DistributedDataParallel`. Run once
//! with one rank and once with one rank per GPU; rank 0 prints, per model, the step time with
//! DDP, the same step inside `no_sync` (no communication), the time the all-reduce adds per
//! step, the throughput, and a bare all-reduce of the gradients' size.
//!
//!     mpirun -n 1 cargo run --release --features mpi --example ddp_scaling
//!     mpirun -n 2 cargo run --release --features mpi --example ddp_scaling
//!
//! Options: `--model mlp|resnet50|all`, `--steps N`, `--resnet-batch B`, `--mlp-batch B`,
//! `--profile N` (N DDP steps under the profiler; rank 0 prints the table), `--bucket-view`
//! (PyTorch's `gradient_as_bucket_view=True`), `--bucket-cap-mb MB` (PyTorch's `bucket_cap_mb`,
//! 25). Rank 0 also prints its peak allocated memory
//! over the DDP steps.

use indicatif::{ProgressBar, ProgressStyle};
use kiln::distributed::{DdpOptions, DistributedDataParallel, ProcessGroup, ReduceOp};
use kiln::nn::{cross_entropy, Linear, Module, Relu, Sequential};
use kiln::optim::{Optimizer, Sgd};
use kiln::{DType, Device, Tensor};
use std::time::Instant;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    let at = args.iter().position(|a| a == name)?;
    args.get(at + 1).cloned()
}

fn flag(name: &str) -> bool {
    std::env::args().any(|a| a == name)
}

fn num(name: &str, default: usize) -> usize {
    arg(name).and_then(|v| v.parse().ok()).unwrap_or(default)
}

struct Figures {
    step_ms: f64,
    local_ms: f64,
    grad_bytes: usize,
    all_reduce_ms: f64,
    /// Rank 0's peak allocated bytes over the timed DDP steps.
    peak_bytes: u64,
}

/// Times `steps` training steps of `ddp` on (x, y), with and without communication.
fn measure<M: Module>(
    pg: &ProcessGroup,
    ddp: &DistributedDataParallel<M>,
    x: &Tensor,
    y: &Tensor,
    steps: usize,
    label: &str,
) -> kiln::Result<Figures> {
    let dev = pg.device();
    let mut opt = Sgd::new(ddp.parameters(), 0.01)?.momentum(0.9)?;
    let step = |opt: &mut Sgd| -> kiln::Result<()> {
        ddp.zero_grad(true)?;
        cross_entropy(&ddp.forward(x)?, y)?.backward()?;
        opt.step()
    };
    let bar = if pg.rank() == 0 {
        ProgressBar::new((3 * steps + 4) as u64)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{prefix:>10} [{bar:30}] {pos}/{len} {msg} ({elapsed})")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(label.to_string());
    // Warm up: kernels compiled and tuned, caches filled.
    for _ in 0..2 {
        step(&mut opt)?;
        ddp.no_sync(|| step(&mut opt))?;
        bar.inc(2);
    }
    let mut time = |synced: bool| -> kiln::Result<f64> {
        pg.barrier()?;
        dev.synchronize()?;
        let t = Instant::now();
        for _ in 0..steps {
            if synced {
                step(&mut opt)?;
            } else {
                ddp.no_sync(|| step(&mut opt))?;
            }
            bar.inc(1);
        }
        dev.synchronize()?;
        Ok(t.elapsed().as_secs_f64() * 1e3 / steps as f64)
    };
    bar.set_message("DDP");
    dev.synchronize()?;
    dev.reset_peak_memory_stats();
    let step_ms = time(true)?;
    let peak_bytes = dev.max_memory_allocated();
    bar.set_message("no_sync");
    let local_ms = time(false)?;
    // A bare all-reduce of every gradient's bytes (one flat f32 tensor, in memory NCCL works
    // on in place where the group uses it, as DDP's buckets are).
    let grad_numel: usize = ddp.parameters().iter().map(Tensor::numel).sum();
    let flat = pg.empty_for_collectives(&[grad_numel], DType::F32)?;
    flat.zero_()?;
    pg.all_reduce(&flat, ReduceOp::Sum)?;
    pg.barrier()?;
    let t = Instant::now();
    for _ in 0..steps {
        pg.all_reduce(&flat, ReduceOp::Sum)?;
        bar.inc(1);
    }
    dev.synchronize()?;
    let all_reduce_ms = t.elapsed().as_secs_f64() * 1e3 / steps as f64;
    bar.finish_and_clear();
    // `--profile N`: N DDP steps under kiln's profiler on every rank (timestamps around every
    // kernel and copy, so the steps run slower); rank 0 prints where the GPU's time went.
    let profiled = num("--profile", 0);
    if profiled > 0 {
        use kiln::profiler::{profile, ProfileOptions};
        let opts = ProfileOptions {
            devices: vec![dev.clone()],
            profile_memory: false,
        };
        pg.barrier()?;
        let ((), prof) = profile(&opts, || {
            for _ in 0..profiled {
                step(&mut opt)?;
            }
            dev.synchronize()
        })?;
        if pg.rank() == 0 {
            println!(
                "{label}: {profiled} DDP steps profiled on rank 0\n{}",
                prof.key_averages().table("self_gpu_time_total", 25)
            );
        }
    }
    Ok(Figures {
        step_ms,
        local_ms,
        grad_bytes: grad_numel * 4,
        all_reduce_ms,
        peak_bytes,
    })
}

fn report(pg: &ProcessGroup, model: &str, batch: usize, f: &Figures) {
    if pg.rank() != 0 {
        return;
    }
    let world = pg.world_size();
    let per_s = (world * batch) as f64 / (f.step_ms / 1e3);
    println!(
        "{model}: {world} rank(s), batch {batch} per rank: step {:.2} ms with DDP, {:.2} ms \
         without communication (no_sync): all-reduce adds {:.2} ms per step; {:.0} samples/s; \
         bare all_reduce of {:.1} MiB: {:.2} ms ({:.2} GB/s); peak allocated {:.1} MiB",
        f.step_ms,
        f.local_ms,
        f.step_ms - f.local_ms,
        per_s,
        f.grad_bytes as f64 / (1 << 20) as f64,
        f.all_reduce_ms,
        f.grad_bytes as f64 / (f.all_reduce_ms / 1e3) / 1e9,
        f.peak_bytes as f64 / (1 << 20) as f64,
    );
    println!(
        "{{\"suite\":\"ddp\",\"model\":\"{model}\",\"world\":{world},\"batch_per_rank\":{batch},\
         \"step_ms\":{:.3},\"no_sync_step_ms\":{:.3},\"samples_per_s\":{per_s:.1},\
         \"grad_bytes\":{},\"all_reduce_ms\":{:.3},\"bucket_view\":{},\"peak_mib\":{:.1}}}",
        f.step_ms,
        f.local_ms,
        f.grad_bytes,
        f.all_reduce_ms,
        flag("--bucket-view"),
        f.peak_bytes as f64 / (1 << 20) as f64
    );
}

fn main() -> kiln::Result<()> {
    let pg = kiln::distributed::init_process_group()?;
    let which = arg("--model").unwrap_or_else(|| "all".into());
    let steps = num("--steps", 10);
    let options = DdpOptions {
        gradient_as_bucket_view: flag("--bucket-view"),
        bucket_cap_mb: arg("--bucket-cap-mb")
            .and_then(|v| v.parse().ok())
            .unwrap_or(25.0),
        ..DdpOptions::default()
    };
    let dev: Device = pg.device().clone();
    if pg.rank() == 0 {
        println!(
            "ddp_scaling: {} rank(s) over {}; rank 0 on {}",
            pg.world_size(),
            pg.backend(),
            dev.name()
        );
    }
    if which == "mlp" || which == "all" {
        let batch = num("--mlp-batch", 512);
        dev.manual_seed(0);
        let model = Sequential::new()
            .push(Linear::new(784, 4096, true, &dev)?)
            .push(Relu)
            .push(Linear::new(4096, 4096, true, &dev)?)
            .push(Relu)
            .push(Linear::new(4096, 10, true, &dev)?);
        let ddp = DistributedDataParallel::with_options(model, &pg, options.clone())?;
        let x = Tensor::randn(&[batch, 784], DType::F32, &dev)?;
        let y = Tensor::zeros(&[batch], DType::I32, &dev)?;
        let f = measure(&pg, &ddp, &x, &y, steps, "mlp")?;
        report(&pg, "mlp 784-4096-4096-10", batch, &f);
    }
    if which == "resnet50" || which == "all" {
        let batch = num("--resnet-batch", 32);
        let side = num("--side", 224);
        dev.manual_seed(0);
        let model = kiln::nn::models::resnet50(1000, &dev)?;
        let ddp = DistributedDataParallel::with_options(model, &pg, options.clone())?;
        let x = Tensor::randn(&[batch, 3, side, side], DType::F32, &dev)?;
        let y = Tensor::zeros(&[batch], DType::I32, &dev)?;
        let f = measure(&pg, &ddp, &x, &y, steps, "resnet50")?;
        report(&pg, "resnet50", batch, &f);
    }
    Ok(())
}
