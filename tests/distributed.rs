//! `kiln::distributed`: post-accumulate-grad hooks and backward callbacks (what DDP is built
//! on), `DistributedSampler` against PyTorch's rule, a group of one process, and, with the `mpi`
//! feature, 2 and 3 MPI ranks launched by `mpirun` on the software adapter: exact all-reduce for
//! f32/f16/i32 at odd sizes, broadcast, all_gather, DDP against one process on the concatenated
//! batch (with `no_sync` accumulation), and a rank that does not answer making the other fail
//! with a timeout instead of hanging.

use kiln::autograd::queue_callback;
use kiln::data::{DataLoader, Dataset, DistributedSampler, LoaderOptions};
use kiln::distributed::{DdpOptions, DistributedDataParallel, ProcessGroup, ReduceOp};
use kiln::nn::{cross_entropy, Linear, Module, Relu, Sequential};
use kiln::optim::{Optimizer, Sgd};
use kiln::{DType, Device, Error, Tensor};
use std::sync::{Arc, Mutex, OnceLock};

fn gpu() -> Device {
    let d = kiln::device::test_devices().expect("KILN_REQUIRE_GPU=1 and no GPU adapter");
    d.into_iter()
        .find(|d| !d.is_cpu())
        .unwrap_or_else(|| Device::cpu().unwrap())
}

/// The process's group of one (no `mpirun` launched this process).
fn group() -> &'static ProcessGroup {
    static PG: OnceLock<ProcessGroup> = OnceLock::new();
    PG.get_or_init(|| kiln::distributed::init_process_group().unwrap())
}

fn model(dev: &Device, seed: u64) -> Sequential {
    dev.manual_seed(seed);
    Sequential::new()
        .push(Linear::new(12, 16, true, dev).unwrap())
        .push(Relu)
        .push(Linear::new(16, 5, true, dev).unwrap())
}

/// A fixed global batch: features [n, 12] and labels [n], made on the CPU.
fn batch(n: usize, seed: u64) -> (Tensor, Tensor) {
    let cpu = Device::cpu().unwrap();
    cpu.manual_seed(seed);
    let x = Tensor::randn(&[n, 12], DType::F32, &cpu).unwrap();
    let y: Vec<i32> = (0..n)
        .map(|i| ((i * 7 + seed as usize) % 5) as i32)
        .collect();
    (x, Tensor::from_slice(&y, &[n], &cpu).unwrap())
}

fn rows(t: &Tensor, start: usize, len: usize, dev: &Device) -> Tensor {
    t.narrow(0, start, len)
        .unwrap()
        .contiguous()
        .unwrap()
        .to_device(dev)
        .unwrap()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap()
}

fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}: element {i}: {g} vs {w}"
        );
    }
}

#[test]
fn post_accumulate_hooks_fire_once_per_backward_after_the_last_contribution() {
    let dev = gpu();
    let w = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], &dev)
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    let seen: Arc<Mutex<Vec<Vec<f32>>>> = Arc::default();
    let s = seen.clone();
    let handle = w
        .register_post_accumulate_grad_hook(move |g| {
            s.lock().unwrap().push(g.to_vec::<f32>()?);
            Ok(())
        })
        .unwrap();
    // w is used twice: the hook sees the sum of both contributions, once.
    let loss = w
        .mul(&w)
        .unwrap()
        .sum_all()
        .unwrap()
        .add(&w.sum_all().unwrap())
        .unwrap();
    loss.backward().unwrap();
    assert_eq!(*seen.lock().unwrap(), vec![vec![3.0, 5.0, 7.0]]);
    // A second backward accumulates, and the hook sees the total.
    w.mul_scalar(2.0)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(seen.lock().unwrap()[1], vec![5.0, 7.0, 9.0]);
    handle.remove();
    w.sum_all().unwrap().backward().unwrap();
    assert_eq!(seen.lock().unwrap().len(), 2, "a removed hook does not run");

    // Only leaves that require grad take hooks, with PyTorch's messages.
    let y = w.mul_scalar(3.0).unwrap();
    let e = y
        .register_post_accumulate_grad_hook(|_| Ok(()))
        .err()
        .unwrap();
    assert!(e.to_string().contains("non-leaf"), "{e}");
    let plain = Tensor::zeros(&[2], DType::F32, &dev).unwrap();
    assert!(plain
        .register_post_accumulate_grad_hook(|_| Ok(()))
        .is_err());

    // A hook's error ends backward with it.
    let v = Tensor::ones(&[2], DType::F32, &dev)
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    v.register_post_accumulate_grad_hook(|_| {
        Err(Error::InvalidArgument {
            op: "hook",
            msg: "refused".into(),
        })
    })
    .unwrap();
    let e = v.sum_all().unwrap().backward().err().unwrap();
    assert!(e.to_string().contains("refused"), "{e}");
}

#[test]
fn callbacks_run_after_the_graph_and_only_during_backward() {
    let dev = gpu();
    let e = queue_callback(|| Ok(())).err().unwrap();
    assert!(e.to_string().contains("during backward"), "{e}");
    let a = Tensor::ones(&[4], DType::F32, &dev)
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    let b = Tensor::ones(&[4], DType::F32, &dev)
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    let order = Arc::new(Mutex::new(Vec::<String>::new()));
    for (name, t) in [("a", &a), ("b", &b)] {
        let o = order.clone();
        t.register_post_accumulate_grad_hook(move |_| {
            o.lock().unwrap().push(name.into());
            if name == "a" {
                let o = o.clone();
                queue_callback(move || {
                    o.lock().unwrap().push("callback".into());
                    Ok(())
                })?;
            }
            Ok(())
        })
        .unwrap();
    }
    // a's gradient arrives first (its op ran last), the callback after the whole graph.
    let loss = b
        .sum_all()
        .unwrap()
        .add(&a.exp().unwrap().sum_all().unwrap())
        .unwrap();
    loss.backward().unwrap();
    let got = order.lock().unwrap().clone();
    assert_eq!(got.last().map(String::as_str), Some("callback"), "{got:?}");
    assert_eq!(got.len(), 3, "{got:?}");
}

/// PyTorch's DistributedSampler, written out from torch/utils/data/distributed.py.
fn torch_sampler(order: &[usize], replicas: usize, rank: usize, drop_last: bool) -> Vec<usize> {
    let n = order.len();
    let num_samples = if drop_last && !n.is_multiple_of(replicas) {
        ((n as f64 - replicas as f64) / replicas as f64)
            .ceil()
            .max(0.0) as usize
    } else {
        (n as f64 / replicas as f64).ceil() as usize
    };
    let total = num_samples * replicas;
    let mut idx = order.to_vec();
    if !drop_last {
        let pad = total - idx.len();
        if pad <= idx.len() {
            idx.extend_from_slice(&order[..pad]);
        } else {
            let reps = pad.div_ceil(idx.len());
            let extra: Vec<usize> = order.iter().copied().cycle().take(reps * n).collect();
            idx.extend_from_slice(&extra[..pad]);
        }
    } else {
        idx.truncate(total);
    }
    idx[..total]
        .iter()
        .skip(rank)
        .step_by(replicas)
        .copied()
        .collect()
}

#[test]
fn distributed_sampler_shards_as_pytorch_does() {
    for n in [1usize, 2, 7, 10, 12, 13] {
        let order: Vec<usize> = (0..n).map(|i| (2 * n - 1 - i + 3) % n).collect();
        for replicas in 1..=4 {
            for drop_last in [false, true] {
                let mut union = Vec::new();
                for rank in 0..replicas {
                    let mut s = DistributedSampler::new(replicas, rank).unwrap();
                    s.drop_last = drop_last;
                    let got = s.shard(&order);
                    let want = torch_sampler(&order, replicas, rank, drop_last);
                    assert_eq!(got, want, "n {n}, {replicas} replicas, rank {rank}");
                    assert_eq!(got.len(), s.num_samples(n));
                    union.extend(got);
                }
                union.sort_unstable();
                union.dedup();
                if !drop_last {
                    assert_eq!(union.len(), n, "every sample is drawn by some rank");
                }
            }
        }
    }
    let e = DistributedSampler::new(2, 2).err().unwrap();
    assert!(e.to_string().contains("Invalid rank 2"), "{e}");
}

/// Sample i has every feature equal to i and label i.
struct Indexed(usize);

impl Dataset for Indexed {
    fn len(&self) -> usize {
        self.0
    }
    fn sample_shape(&self) -> Vec<usize> {
        vec![2]
    }
    fn get(&self, index: usize, out: &mut [f32]) -> i32 {
        out.fill(index as f32);
        index as i32
    }
}

#[test]
fn a_loader_with_a_sampler_draws_its_rank_share_each_epoch() {
    let dev = gpu();
    let n = 11;
    let mut epochs = Vec::new();
    for rank in 0..3 {
        let opts = LoaderOptions {
            batch_size: 2,
            shuffle: true,
            sampler: Some(DistributedSampler::new(3, rank).unwrap()),
            ..Default::default()
        };
        let mut loader = DataLoader::new(Arc::new(Indexed(n)), &dev, opts).unwrap();
        assert_eq!(loader.len(), 2, "4 samples per rank in batches of 2");
        let mut mine = Vec::new();
        for _epoch in 0..2 {
            let mut labels = Vec::new();
            for b in loader.iter() {
                let (_, y) = b.unwrap();
                labels.extend(y.to_vec::<i32>().unwrap());
            }
            assert_eq!(labels.len(), 4);
            mine.push(labels);
        }
        assert_ne!(mine[0], mine[1], "each epoch shuffles anew");
        epochs.push(mine);
    }
    for e in 0..2 {
        let mut all: Vec<i32> = epochs.iter().flat_map(|r| r[e].clone()).collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "epoch {e}: the ranks cover the dataset");
    }
}

#[test]
fn a_group_of_one_process() {
    let pg = group();
    assert_eq!((pg.rank(), pg.world_size()), (0, 1));
    assert!(kiln::distributed::is_initialized());
    let e = kiln::distributed::init_process_group().err().unwrap();
    assert!(e.to_string().contains("twice"), "{e}");
    let dev = gpu();
    let t = Tensor::from_slice(&[1.0f32, -2.0, 3.5], &[3], &dev).unwrap();
    pg.all_reduce(&t, ReduceOp::Sum).unwrap();
    assert_eq!(values(&t), vec![1.0, -2.0, 3.5]);
    let parts = pg.all_gather(&t).unwrap();
    assert_eq!(parts.len(), 1);
    assert_eq!(values(&parts[0]), vec![1.0, -2.0, 3.5]);
    pg.broadcast(&t, 0).unwrap();
    pg.barrier().unwrap();
    // Bad input: typed errors naming the op, the tensor untouched.
    let e = pg.broadcast(&t, 1).err().unwrap();
    assert!(e.to_string().contains("broadcast"), "{e}");
    let m = Tensor::zeros(&[2, 3], DType::F32, &dev).unwrap();
    let e = pg
        .all_reduce(&m.transpose(0, 1).unwrap(), ReduceOp::Sum)
        .err()
        .unwrap();
    assert!(e.to_string().contains("contiguous"), "{e}");
    let i = Tensor::from_slice(&[1i32, 2], &[2], &dev).unwrap();
    assert!(matches!(
        pg.all_reduce(&i, ReduceOp::Avg),
        Err(Error::UnsupportedDType { .. })
    ));
    assert_eq!(values(&t), vec![1.0, -2.0, 3.5]);
}

/// Trains `steps` SGD steps: DDP over `pg` on this rank's rows of each global batch, and a
/// plain model on the whole batch; returns both models' parameters. With `accumulate`, every
/// step first runs a micro-batch under `no_sync`. With `as_view`, DDP's
/// `gradient_as_bucket_view`: on more than one rank each `.grad` is then checked to be in its
/// bucket (the two parameters of a bucket share storage), and the odd steps zero the gradients
/// in place instead of setting them to None, so that the next backward accumulates straight
/// into the buckets.
fn ddp_against_one_process(
    pg: &ProcessGroup,
    steps: usize,
    per_rank: usize,
    accumulate: bool,
    as_view: bool,
) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let dev = pg.device().clone();
    let (world, rank) = (pg.world_size(), pg.rank());
    // Every rank starts from other weights: DDP broadcasts rank 0's (seed 100).
    let ddp = DistributedDataParallel::with_options(
        model(&dev, 100 + rank as u64),
        pg,
        DdpOptions {
            // 209 bytes: the last layer's two parameters, then the first layer's.
            bucket_cap_mb: 0.0002,
            gradient_as_bucket_view: as_view,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(ddp.bucket_sizes(), vec![340, 832]);
    let reference = model(&dev, 100);
    let mut opt = Sgd::new(ddp.parameters(), 0.1)
        .unwrap()
        .momentum(0.9)
        .unwrap();
    let mut ref_opt = Sgd::new(reference.parameters(), 0.1)
        .unwrap()
        .momentum(0.9)
        .unwrap();
    for step in 0..steps {
        let micro = if accumulate { 2 } else { 1 };
        ddp.zero_grad(!(as_view && step % 2 == 1)).unwrap();
        reference.zero_grad(true).unwrap();
        for m in 0..micro {
            let (x, y) = batch(world * per_rank, 31 * step as u64 + m as u64);
            let (xr, yr) = (
                rows(&x, rank * per_rank, per_rank, &dev),
                rows(&y, rank * per_rank, per_rank, &dev),
            );
            let run = || cross_entropy(&ddp.forward(&xr)?, &yr)?.backward();
            if m + 1 < micro {
                ddp.no_sync(run).unwrap();
            } else {
                run().unwrap();
            }
            let (xa, ya) = (x.to_device(&dev).unwrap(), y.to_device(&dev).unwrap());
            cross_entropy(&reference.forward(&xa).unwrap(), &ya)
                .unwrap()
                .backward()
                .unwrap();
        }
        if as_view && world > 1 {
            // Buckets: [the last layer's bias and weight], [the first layer's].
            let grads: Vec<Tensor> = ddp.parameters().iter().map(|p| p.grad().unwrap()).collect();
            assert!(
                grads[0].shares_storage(&grads[1]),
                "step {step}: first layer"
            );
            assert!(
                grads[2].shares_storage(&grads[3]),
                "step {step}: last layer"
            );
            assert!(
                !grads[0].shares_storage(&grads[2]),
                "step {step}: two buckets"
            );
        }
        opt.step().unwrap();
        ref_opt.step().unwrap();
    }
    let params = |m: &dyn Module| m.parameters().iter().map(values).collect::<Vec<_>>();
    (params(&ddp), params(&reference))
}

#[test]
fn ddp_in_a_group_of_one_matches_plain_training() {
    let pg = group();
    for as_view in [false, true] {
        let (got, want) = ddp_against_one_process(pg, 3, 8, true, as_view);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_close(g, w, 1e-5, &format!("parameter {i}"));
        }
    }
    let names: Vec<String> = DistributedDataParallel::new(model(pg.device(), 1), pg)
        .unwrap()
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names[0], "module.0.weight", "PyTorch's DDP prefix");
    // Moving a wrapped module would strand its hooks: refused, as PyTorch users move first.
    let mut wrapped = DistributedDataParallel::new(model(pg.device(), 2), pg).unwrap();
    let e = wrapped.to_device(&Device::cpu().unwrap()).unwrap_err();
    assert!(e.to_string().contains("before wrapping"), "{e}");
    wrapped.to_device(&pg.device().clone()).unwrap();
}

#[test]
fn ddp_buckets_show_in_snapshots_under_their_own_frame() {
    let pg = group();
    let dev = pg.device().clone();
    let net = model(&dev, 3);
    dev.record_memory_history(
        Some(kiln::alloc::HistoryEnabled::All),
        kiln::alloc::HistoryContext::All,
        kiln::alloc::HistoryStacks::Kiln,
        1000,
    );
    let before = dev.memory_allocated();
    let ddp = DistributedDataParallel::new(net, pg).unwrap();
    let snap = dev.memory_snapshot();
    dev.record_memory_history(
        None,
        kiln::alloc::HistoryContext::All,
        kiln::alloc::HistoryStacks::Kiln,
        0,
    );
    let buckets: Vec<u64> = snap
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| {
            b.frames
                .first()
                .is_some_and(|f| f.name == "DistributedDataParallel.bucket")
        })
        .map(|b| b.requested_size)
        .collect();
    // One bucket (the model is under 1 MiB) as large as every parameter together, and the
    // device's statistics count it.
    let params: usize = ddp.parameters().iter().map(|p| p.numel() * 4).sum();
    assert_eq!(buckets, vec![params as u64], "{buckets:?}");
    assert_eq!(
        dev.memory_allocated() - before,
        512 * (params as u64).div_ceil(512)
    );
}

/// Runs this test binary's `mpi_child` under `mpirun -n ranks` with `KILN_DIST_CASE=case`;
/// returns (exit status success, output). Fails the test if the run takes over `limit_s`.
#[cfg(feature = "mpi")]
fn mpirun(ranks: usize, case: &str, extra_env: &[(&str, &str)], limit_s: u64) -> (bool, String) {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new("mpirun");
    cmd.args([
        "-n",
        &ranks.to_string(),
        "--oversubscribe",
        "--bind-to",
        "none",
    ]);
    if std::env::var("USER").as_deref() == Ok("root") || unsafe_is_root() {
        cmd.arg("--allow-run-as-root");
    }
    cmd.arg(&exe)
        .args([
            "--exact",
            "mpi_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("KILN_DIST_CASE", case)
        // Shared memory between ranks without ptrace-based single copy (containers forbid it).
        .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
        .env("OMPI_MCA_btl", "self,vader")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .expect("mpirun (Open MPI's openmpi-bin) must be installed");
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if start.elapsed() > Duration::from_secs(limit_s) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "mpirun -n {ranks} ({case}) hung for {limit_s} s:\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[cfg(feature = "mpi")]
fn unsafe_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .is_some_and(|l| l.split_whitespace().nth(1) == Some("0"))
    })
}

#[cfg(feature = "mpi")]
#[test]
fn mpi_collectives_on_2_and_3_ranks() {
    // Every rank on one host: the shared-memory all-reduce; then MPI's own, turned on by hand.
    for (ranks, shm) in [(2, true), (3, true), (2, false)] {
        let env: &[(&str, &str)] = if shm { &[] } else { &[("KILN_DIST_SHM", "0")] };
        let (ok, out) = mpirun(ranks, "collectives", env, 300);
        assert!(ok, "{out}");
        for r in 0..ranks {
            assert!(
                out.contains(&format!("rank {r}/{ranks}: collectives ok")),
                "{out}"
            );
        }
        assert_eq!(
            out.contains("all-reduce through shared memory"),
            shm,
            "which all-reduce ran: {out}"
        );
    }
}

/// Whether NCCL opens on this machine (two NVIDIA GPUs with CUDA and NCCL): the device runs
/// set `KILN_TEST_NCCL_OPENS=1`.
#[cfg(feature = "nccl")]
fn nccl_opens() -> bool {
    std::env::var("KILN_TEST_NCCL_OPENS").is_ok_and(|v| v == "1")
}

#[cfg(feature = "nccl")]
#[test]
fn nccl_asked_for_where_it_cannot_open_fails_with_the_reason() {
    if nccl_opens() {
        return; // `nccl_collectives_match_the_host_path_on_2_gpus` runs instead
    }
    let (ok, out) = mpirun(2, "nccl_refused", &[("KILN_DIST_BACKEND", "nccl")], 120);
    assert!(ok, "{out}");
    assert_eq!(out.matches("nccl refused ok").count(), 2, "{out}");
}

#[cfg(feature = "nccl")]
#[test]
fn nccl_collectives_match_the_host_path_on_2_gpus() {
    if !nccl_opens() {
        return; // `nccl_asked_for_where_it_cannot_open_fails_with_the_reason` runs instead
    }
    let env = [("KILN_DIST_BACKEND", "nccl")];
    for case in ["nccl", "collectives", "ddp"] {
        let (ok, out) = mpirun(2, case, &env, 300);
        assert!(ok, "{out}");
        for r in 0..2 {
            let line = format!("rank {r}/2: {case} ok (NCCL");
            assert!(out.contains(&line), "{line}: {out}");
        }
    }
}

#[cfg(feature = "mpi")]
#[test]
fn mpi_ddp_matches_one_process_on_the_concatenated_batch() {
    for ranks in [2, 3] {
        let (ok, out) = mpirun(ranks, "ddp", &[], 300);
        assert!(ok, "{out}");
        for r in 0..ranks {
            assert!(out.contains(&format!("rank {r}/{ranks}: ddp ok")), "{out}");
        }
    }
}

#[cfg(feature = "mpi")]
#[test]
fn a_rank_that_does_not_answer_makes_the_others_fail_not_hang() {
    let (_, out) = mpirun(2, "timeout", &[("KILN_DIST_TIMEOUT", "3")], 120);
    assert!(out.contains("rank 0/2: timeout ok"), "{out}");
    assert!(out.contains("timed out after 3.0 s"), "{out}");
}

/// The body of every MPI test, run by each rank under `mpirun`.
#[cfg(feature = "mpi")]
#[test]
#[ignore = "run by the MPI tests under mpirun"]
fn mpi_child() {
    let case = std::env::var("KILN_DIST_CASE").unwrap_or_default();
    if case == "nccl_refused" {
        // KILN_DIST_BACKEND=nccl where NCCL cannot open: every rank fails to start, saying why.
        let e = kiln::distributed::init_process_group().expect_err("NCCL cannot open here");
        let msg = e.to_string();
        assert!(
            matches!(e, Error::Distributed { .. }) && msg.contains("KILN_DIST_BACKEND=nccl"),
            "{msg}"
        );
        println!("nccl refused ok: {msg}");
        return;
    }
    // Not the static group: MPI is finalised when the last handle goes, at the end of this
    // function (mpirun reports a rank that exits without finalising as a failure).
    let pg = &kiln::distributed::init_process_group().unwrap();
    let (rank, world) = (pg.rank(), pg.world_size());
    assert!(world > 1, "launched by mpirun");
    let dev = pg.device().clone();
    match case.as_str() {
        "collectives" => collectives(pg),
        "ddp" => {
            buffers_follow_rank_0(pg);
            for (accumulate, as_view) in
                [(false, false), (true, false), (false, true), (true, true)]
            {
                let (got, want) = ddp_against_one_process(pg, 4, 4, accumulate, as_view);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let what = format!("rank {rank}: parameter {i} (bucket views {as_view})");
                    assert_close(g, w, 2e-5, &what);
                }
            }
            f16_buckets_average_as_the_host_path(pg);
        }
        "nccl" => nccl_matches_the_host_path(pg),
        "timeout" => {
            let t = Tensor::ones(&[1000], DType::F32, &dev).unwrap();
            if rank == 0 {
                let e = pg.all_reduce(&t, ReduceOp::Sum).expect_err("a timeout");
                assert!(matches!(e, Error::Distributed { .. }), "{e}");
                // The group is broken now: later calls fail at once.
                assert!(pg.barrier().is_err());
                println!("rank {rank}/{world}: timeout ok: {e}");
            } else {
                // This rank "fails": it never joins the collective.
                std::thread::sleep(std::time::Duration::from_secs(8));
            }
            return;
        }
        other => panic!("unknown case {other:?}"),
    }
    pg.barrier().unwrap();
    println!("rank {rank}/{world}: {case} ok ({})", pg.backend());
}

/// NCCL's all-reduce against MPI's through the host, bit for bit: f32 (random values: two
/// ranks' sum is one rounding either way), f16 and i32, odd sizes, in place in exportable
/// memory (DDP's buckets, through `gradient_as_bucket_view`) and through a staged copy.
#[cfg(feature = "mpi")]
fn nccl_matches_the_host_path(pg: &ProcessGroup) {
    assert!(pg.uses_nccl(), "{}", pg.backend());
    let dev = pg.device().clone();
    let rank = pg.rank();
    for n in [1usize, 7, 1023, 1_000_003] {
        for dtype in [DType::F32, DType::F16, DType::I32] {
            let x = if dtype == DType::I32 {
                let v: Vec<i32> = (0..n)
                    .map(|i| ((i * 13 + rank * 5) % 97) as i32 - 48)
                    .collect();
                Tensor::from_slice(&v, &[n], &dev).unwrap()
            } else {
                dev.manual_seed(11 + rank as u64);
                Tensor::randn(&[n], DType::F32, &dev)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap()
            };
            for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
                if op == ReduceOp::Avg && dtype == DType::I32 {
                    continue;
                }
                let fresh = || {
                    let t = Tensor::empty(&[n], dtype, &dev).unwrap();
                    t.copy_(&x).unwrap();
                    t
                };
                let a = fresh();
                pg.all_reduce(&a, op).unwrap();
                let b = fresh();
                pg.all_reduce_through_host(&b, op).unwrap().wait().unwrap();
                let bits = |t: &Tensor| -> Vec<u32> {
                    let v = t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
                    v.iter().map(|f| f.to_bits()).collect()
                };
                assert!(
                    bits(&a) == bits(&b),
                    "{op:?} of {n} {dtype}: NCCL and the host path differ"
                );
            }
        }
    }
    // DDP's buckets in exportable memory, reduced in place: the averages equal MPI's.
    let (got, want) = ddp_against_one_process(pg, 4, 4, false, true);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_close(
            g,
            w,
            2e-5,
            &format!("rank {rank}: parameter {i} (NCCL buckets)"),
        );
    }
    f16_buckets_average_as_the_host_path(pg);
}

/// An f16 model's buckets (f16, reduced by NCCL with ncclAvg) against each rank's own
/// gradients (`no_sync`) averaged through the host.
#[cfg(feature = "mpi")]
fn f16_buckets_average_as_the_host_path(pg: &ProcessGroup) {
    let dev = pg.device().clone();
    if !dev.adapter_info().is_some_and(|a| a.features.shader_f16) {
        return;
    }
    let rank = pg.rank();
    let mut net = model(&dev, 100);
    for (_, t) in net.tensors_mut() {
        *t = t
            .to_dtype(DType::F16)
            .unwrap()
            .detach()
            .requires_grad_(true)
            .unwrap();
    }
    let ddp = DistributedDataParallel::new(net, pg).unwrap();
    assert!(ddp.parameters().iter().all(|p| p.dtype() == DType::F16));
    let (x, y) = batch(pg.world_size() * 4, 77);
    let x = rows(&x, rank * 4, 4, &dev).to_dtype(DType::F16).unwrap();
    let y = rows(&y, rank * 4, 4, &dev);
    let loss = |m: &DistributedDataParallel<Sequential>| {
        let logits = m.forward(&x).unwrap().to_dtype(DType::F32).unwrap();
        cross_entropy(&logits, &y).unwrap()
    };
    ddp.zero_grad(true).unwrap();
    ddp.no_sync(|| loss(&ddp).backward()).unwrap();
    let local: Vec<Tensor> = ddp.parameters().iter().map(|p| p.grad().unwrap()).collect();
    for g in &local {
        pg.all_reduce_through_host(g, ReduceOp::Avg)
            .unwrap()
            .wait()
            .unwrap();
    }
    let want: Vec<Vec<f32>> = local.iter().map(values).collect();
    ddp.zero_grad(true).unwrap();
    loss(&ddp).backward().unwrap();
    for (i, (p, w)) in ddp.parameters().iter().zip(&want).enumerate() {
        let g = values(&p.grad().unwrap());
        assert_close(&g, w, 2e-3, &format!("rank {rank}: f16 parameter {i}"));
    }
}

/// BatchNorm's running statistics: rank 0's at construction and before every forward.
#[cfg(feature = "mpi")]
fn buffers_follow_rank_0(pg: &ProcessGroup) {
    let dev = pg.device().clone();
    let rank = pg.rank() as f64;
    let net = Sequential::new()
        .push(Linear::new(12, 16, true, &dev).unwrap())
        .push(kiln::nn::BatchNorm::new(16, &dev).unwrap());
    let set = |m: &dyn Module, v: f64| {
        for (_, b) in m.named_buffers() {
            if b.dtype() == DType::F32 {
                kiln::no_grad(|| b.fill_(v)).unwrap();
            }
        }
    };
    let check = |m: &dyn Module, v: f32, when: &str| {
        let mut seen = 0;
        for (name, b) in m.named_buffers() {
            if b.dtype() == DType::F32 {
                assert!(values(&b).iter().all(|&x| x == v), "{when}: {name}");
                seen += 1;
            }
        }
        assert_eq!(seen, 2, "{when}: running_mean and running_var");
    };
    set(&net, 10.0 + rank);
    let mut ddp = DistributedDataParallel::new(net, pg).unwrap();
    check(&ddp, 10.0, "after construction");
    ddp.eval();
    set(&ddp, 20.0 + rank);
    let (x, _) = batch(4, 5);
    let x = x.to_device(&dev).unwrap();
    kiln::no_grad(|| ddp.forward(&x)).unwrap();
    check(&ddp, 20.0, "after an eval forward");
    // Rank 0 sends what its last forward left where nothing changed since (Note [Buffers'
    // broadcast]); what the other ranks did to theirs is overwritten either way.
    if rank > 0.0 {
        set(&ddp, 50.0 + rank);
    }
    kiln::no_grad(|| ddp.forward(&x)).unwrap();
    check(&ddp, 20.0, "after a second eval forward");
    // A buffer rank 0 wrote in place since its last forward: the prefetched copy is stale and
    // must not be sent.
    set(&ddp, 30.0 + 10.0 * rank);
    kiln::no_grad(|| ddp.forward(&x)).unwrap();
    check(
        &ddp,
        30.0,
        "after rank 0 wrote its buffers between forwards",
    );
    // Training: the same batch everywhere updates every rank's statistics alike, from rank 0's;
    // the next forward starts from rank 0's updated ones, whatever the others hold.
    ddp.train(true);
    ddp.forward(&x).unwrap();
    let stats = |m: &dyn Module| -> Vec<Vec<f32>> {
        m.named_buffers()
            .into_iter()
            .filter(|(_, b)| b.dtype() == DType::F32)
            .map(|(_, b)| values(&b))
            .collect()
    };
    let after_one = stats(&ddp);
    assert!(
        after_one.iter().flatten().all(|&v| v != 30.0),
        "a training forward updates them"
    );
    if rank > 0.0 {
        set(&ddp, 70.0 + rank);
    }
    ddp.forward(&x).unwrap();
    let after_two = stats(&ddp);
    let expect: Vec<Vec<f32>> = {
        // Rank 0's statistics after two updates with the same batch statistics s: each update
        // is r <- 0.9 r + 0.1 s, so r2 = 0.9 r1 + (r1 - 0.9 r0) with r0 = 30.
        after_one
            .iter()
            .map(|r1| r1.iter().map(|&v| 0.9 * v + (v - 0.9 * 30.0)).collect())
            .collect()
    };
    for (got, want) in after_two.iter().zip(&expect) {
        assert_close(got, want, 1e-4, "after two training forwards");
    }
}

#[cfg(feature = "mpi")]
fn collectives(pg: &ProcessGroup) {
    let (rank, world) = (pg.rank(), pg.world_size());
    let gpu = pg.device().clone();
    let cpu = Device::cpu().unwrap();
    let f16 = gpu.adapter_info().is_some_and(|a| a.features.shader_f16);
    // Odd sizes, and one of several 4 MiB chunks with a ragged tail.
    for n in [1usize, 3, 1023, 2_500_001] {
        for dev in [&gpu, &cpu] {
            // Small integers: every sum is exact in f32, f16 and i32, in any order.
            let v = |r: usize, i: usize| ((i * 7 + r * 3) % 61) as i32 - 20;
            let mine: Vec<i32> = (0..n).map(|i| v(rank, i)).collect();
            let sum: Vec<i32> = (0..n).map(|i| (0..world).map(|r| v(r, i)).sum()).collect();
            let max: Vec<i32> = (0..n)
                .map(|i| (0..world).map(|r| v(r, i)).max().unwrap())
                .collect();
            let prod: Vec<i32> = (0..n)
                .map(|i| (0..world).map(|r| v(r, i)).product())
                .collect();
            let min: Vec<i32> = (0..n)
                .map(|i| (0..world).map(|r| v(r, i)).min().unwrap())
                .collect();
            // A new tensor each time (a CPU tensor's to_device(cpu) is the tensor itself).
            let fresh = |dtype: DType| {
                Tensor::from_slice(&mine, &[n], &cpu)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap()
                    .to_device(dev)
                    .unwrap()
            };
            let mut dtypes = vec![DType::F32, DType::I32];
            if f16 || dev.is_cpu() {
                dtypes.push(DType::F16);
            }
            for dtype in dtypes {
                let t = fresh(dtype);
                pg.all_reduce(&t, ReduceOp::Sum).unwrap();
                let got: Vec<f32> = values(&t);
                let want: Vec<f32> = sum.iter().map(|&s| s as f32).collect();
                assert_eq!(got, want, "sum of {n} {dtype} on {}", dev.name());
                let t = fresh(dtype);
                pg.all_reduce(&t, ReduceOp::Max).unwrap();
                let want: Vec<f32> = max.iter().map(|&s| s as f32).collect();
                assert_eq!(values(&t), want, "max of {n} {dtype} on {}", dev.name());
                let t = fresh(dtype);
                pg.all_reduce(&t, ReduceOp::Min).unwrap();
                let want: Vec<f32> = min.iter().map(|&s| s as f32).collect();
                assert_eq!(values(&t), want, "min of {n} {dtype} on {}", dev.name());
                if dtype != DType::F16 {
                    // Products up to 40^3: exact in f32 and i32, not in f16.
                    let t = fresh(dtype);
                    pg.all_reduce(&t, ReduceOp::Product).unwrap();
                    let want: Vec<f32> = prod.iter().map(|&s| s as f32).collect();
                    assert_eq!(values(&t), want, "product of {n} {dtype} on {}", dev.name());
                }
            }
            // Avg: the sum times 1/world, rounded as f32.
            let t = fresh(DType::F32);
            pg.all_reduce(&t, ReduceOp::Avg).unwrap();
            let want: Vec<f32> = sum
                .iter()
                .map(|&s| s as f32 * (1.0 / world as f64) as f32)
                .collect();
            assert_eq!(values(&t), want, "avg of {n} on {}", dev.name());

            // Broadcast from the last rank; all_gather in rank order.
            let t = fresh(DType::F32);
            pg.broadcast(&t, world - 1).unwrap();
            let want: Vec<f32> = (0..n).map(|i| v(world - 1, i) as f32).collect();
            assert_eq!(values(&t), want, "broadcast of {n} on {}", dev.name());
            let t = fresh(DType::F32);
            let parts = pg.all_gather(&t).unwrap();
            assert_eq!(parts.len(), world);
            for (r, p) in parts.iter().enumerate() {
                let want: Vec<f32> = (0..n).map(|i| v(r, i) as f32).collect();
                assert_eq!(
                    values(p),
                    want,
                    "all_gather part {r} of {n} on {}",
                    dev.name()
                );
                assert_eq!(p.device(), dev);
            }
        }
    }
    // Random f32 values: the sum within rounding of the f64 sum.
    let cpu_rand = |r: usize| {
        cpu.manual_seed(1000 + r as u64);
        Tensor::randn(&[4097], DType::F32, &cpu).unwrap()
    };
    let t = cpu_rand(rank).to_device(&gpu).unwrap();
    pg.all_reduce(&t, ReduceOp::Sum).unwrap();
    let all: Vec<Vec<f32>> = (0..world).map(|r| values(&cpu_rand(r))).collect();
    let want: Vec<f32> = (0..4097)
        .map(|i| all.iter().map(|v| v[i] as f64).sum::<f64>() as f32)
        .collect();
    assert_close(&values(&t), &want, 1e-6, "random sum");
    // Memory stays per device: the collectives leave nothing allocated behind.
    drop(t);
    assert_eq!(
        gpu.memory_allocated(),
        0,
        "rank {rank}: GPU memory left allocated"
    );
}
