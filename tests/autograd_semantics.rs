//! Autograd's behaviour as PyTorch users know it: accumulation, freed graphs, in-place checks,
//! grad modes, and the memory each of these keeps alive, measured through `memory_allocated`.

use kiln::nn::{cross_entropy, Linear, Module, Relu, Sequential};
use kiln::optim::{Adam, Optimizer, Sgd};
use kiln::{DType, Device, Error, Tensor};

fn devices() -> Vec<Device> {
    kiln::device::test_devices().expect("KILN_REQUIRE_GPU=1 and no GPU adapter")
}

fn leaf(v: &[f32], shape: &[usize], dev: &Device) -> Tensor {
    Tensor::from_slice(v, shape, dev)
        .unwrap()
        .requires_grad_(true)
        .unwrap()
}

fn vec(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

#[test]
fn gradients_accumulate_until_zeroed() {
    for dev in devices() {
        let x = leaf(&[1.0, 2.0, 3.0], &[3], &dev);
        for _ in 0..2 {
            x.mul_scalar(2.0)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
        }
        assert_eq!(vec(&x.grad().unwrap()), [4.0, 4.0, 4.0], "{dev:?}");
        x.zero_grad(false).unwrap();
        assert_eq!(vec(&x.grad().unwrap()), [0.0; 3]);
        x.zero_grad(true).unwrap();
        assert!(x.grad().is_none());
        // A clone is the same tensor: it sees the same .grad.
        let y = x.clone();
        x.square().unwrap().sum_all().unwrap().backward().unwrap();
        assert_eq!(vec(&y.grad().unwrap()), [2.0, 4.0, 6.0]);
    }
}

#[test]
fn graph_is_freed_after_backward_unless_retained() {
    for dev in devices() {
        let x = leaf(&[0.5, -1.0], &[2], &dev);
        let y = x.exp().unwrap().sum_all().unwrap();
        y.backward_with(&Tensor::ones(&[], DType::F32, &dev).unwrap(), true)
            .unwrap();
        y.backward().unwrap();
        let err = y.backward().unwrap_err();
        assert!(
            matches!(&err, Error::Autograd { msg, .. } if msg.contains("backward through the graph a second time")),
            "{err}"
        );
        let e = [0.5f32.exp(), (-1f32).exp()];
        let g = vec(&x.grad().unwrap());
        assert!((g[0] - 2.0 * e[0]).abs() < 1e-5 && (g[1] - 2.0 * e[1]).abs() < 1e-5);
    }
}

#[test]
fn inplace_change_of_a_saved_tensor_fails_at_backward() {
    for dev in devices() {
        let w = leaf(&[1.0, 2.0], &[2], &dev);
        let x = Tensor::from_slice(&[3.0f32, 4.0], &[2], &dev).unwrap();
        let y = w.mul(&x).unwrap().sum_all().unwrap(); // saves x for w's gradient
        x.add_scalar_(1.0).unwrap();
        let err = y.backward().unwrap_err();
        match &err {
            Error::ModifiedInplace {
                version, expected, ..
            } => assert_eq!((*version, *expected), (1, 0)),
            e => panic!("{dev:?}: {e}"),
        }
        assert!(err.to_string().contains("modified by an inplace operation"));
        // An output saved by its op (sigmoid saves its result).
        let s = w.sigmoid().unwrap();
        let loss = s.sum_all().unwrap();
        kiln::no_grad(|| s.mul_scalar_(2.0)).unwrap();
        let msg = loss.backward().unwrap_err().to_string();
        assert!(msg.contains("output 0 of SigmoidBackward0"), "{msg}");
    }
}

#[test]
fn inplace_on_a_leaf_that_requires_grad_is_refused_except_under_no_grad() {
    for dev in devices() {
        let w = leaf(&[1.0, 2.0], &[2], &dev);
        let err = w.add_scalar_(1.0).unwrap_err();
        assert!(
            err.to_string().contains("leaf Variable that requires grad"),
            "{err}"
        );
        assert_eq!(vec(&w), [1.0, 2.0], "the tensor is untouched");
        kiln::no_grad(|| w.add_scalar_(1.0)).unwrap();
        assert_eq!(vec(&w), [2.0, 3.0]);
    }
}

#[test]
fn grad_modes() {
    let dev = Device::cpu().unwrap();
    let w = leaf(&[1.0], &[1], &dev);
    assert!(kiln::no_grad(|| w.exp().unwrap()).grad_fn_name().is_none());
    assert_eq!(w.exp().unwrap().grad_fn_name(), Some("ExpBackward0"));
    let inner = kiln::no_grad(|| kiln::enable_grad(|| w.exp().unwrap()));
    assert!(inner.requires_grad());
    {
        let _g = kiln::autograd::GradModeGuard::no_grad();
        assert!(!kiln::autograd::is_grad_enabled());
        assert!(!w.mul_scalar(2.0).unwrap().requires_grad());
    }
    assert!(kiln::autograd::is_grad_enabled(), "the guard restores");
    // Grad mode is per thread.
    kiln::no_grad(|| {
        std::thread::spawn(|| assert!(kiln::autograd::is_grad_enabled()))
            .join()
            .unwrap()
    });
    // Inference tensors: no graph, and autograd refuses to save them later.
    let t = kiln::inference_mode(|| w.exp().unwrap());
    assert!(!t.requires_grad());
    let err = w.mul(&t).unwrap_err();
    assert!(
        err.to_string()
            .contains("Inference tensors cannot be saved"),
        "{err}"
    );
    assert!(w.add(&t).is_ok(), "add saves nothing, as in PyTorch");
    assert!(
        t.add_scalar_(1.0).is_err(),
        "in-place outside inference mode"
    );
}

#[test]
fn retain_grad_detach_and_errors() {
    let dev = Device::cpu().unwrap();
    let x = leaf(&[1.0, 2.0], &[2], &dev);
    let h = x.mul_scalar(3.0).unwrap();
    h.retain_grad().unwrap();
    let d = h.detach();
    assert!(!d.requires_grad() && d.shares_storage(&h));
    h.square().unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(vec(&h.grad().unwrap()), [6.0, 12.0]);
    assert_eq!(vec(&x.grad().unwrap()), [18.0, 36.0]);
    let plain = Tensor::ones(&[2], DType::F32, &dev).unwrap();
    assert!(plain.sum_all().unwrap().backward().is_err());
    assert!(
        x.mul_scalar(1.0).unwrap().backward().is_err(),
        "not a scalar"
    );
    assert!(Tensor::ones(&[1], DType::I32, &dev)
        .unwrap()
        .requires_grad_(true)
        .is_err());
}

fn mlp(dev: &Device) -> Sequential {
    dev.manual_seed(7);
    Sequential::new()
        .push(Linear::new(32, 64, true, dev).unwrap())
        .push(Relu)
        .push(Linear::new(64, 10, true, dev).unwrap())
}

fn batch(dev: &Device) -> (Tensor, Tensor) {
    let x = Tensor::randn(&[16, 32], DType::F32, dev).unwrap();
    let y = Tensor::from_slice(&(0..16).map(|i| i % 10).collect::<Vec<i32>>(), &[16], dev).unwrap();
    (x, y)
}

#[test]
fn training_memory_is_steady_after_the_second_step() {
    for dev in devices() {
        let model = mlp(&dev);
        let mut opt = Sgd::new(model.parameters(), 0.1)
            .unwrap()
            .momentum(0.9)
            .unwrap();
        let (x, y) = batch(&dev);
        let mut after = Vec::new();
        let mut losses = Vec::new();
        for _ in 0..100 {
            let loss = cross_entropy(&model.forward(&x).unwrap(), &y).unwrap();
            opt.zero_grad(true).unwrap();
            loss.backward().unwrap();
            opt.step().unwrap();
            losses.push(loss.item::<f32>().unwrap());
            drop(loss);
            after.push(dev.memory_allocated());
        }
        assert!(
            after[2..].iter().all(|&m| m == after[1]),
            "{dev:?}: {after:?}"
        );
        assert!(
            losses[99] < 0.1 * losses[0],
            "{dev:?}: loss {} -> {}",
            losses[0],
            losses[99]
        );
    }
}

#[test]
fn forgetting_zero_grad_grows_memory_only_at_the_first_accumulation() {
    for dev in devices() {
        let model = mlp(&dev);
        let (x, y) = batch(&dev);
        let base = dev.memory_allocated();
        let mut after = Vec::new();
        for _ in 0..5 {
            cross_entropy(&model.forward(&x).unwrap(), &y)
                .unwrap()
                .backward()
                .unwrap();
            after.push(dev.memory_allocated());
        }
        let param_bytes: u64 = model
            .parameters()
            .iter()
            .map(|p| (p.numel() * 4).next_multiple_of(512) as u64)
            .sum();
        assert_eq!(
            after[0] - base,
            param_bytes,
            "{dev:?}: .grad of every parameter"
        );
        assert!(after.iter().all(|&m| m == after[0]), "{dev:?}: {after:?}");
        model.zero_grad(true).unwrap();
        assert_eq!(dev.memory_allocated(), base);
    }
}

#[test]
fn storing_losses_with_their_graph_leaks_and_item_does_not() {
    for dev in devices() {
        let model = mlp(&dev);
        let (x, y) = batch(&dev);
        let step = |keep: &mut Vec<Tensor>, with_graph: bool| {
            let loss = cross_entropy(&model.forward(&x).unwrap(), &y).unwrap();
            if with_graph {
                keep.push(loss); // the loss keeps every activation its graph saved
            } else {
                let _ = loss.item::<f32>().unwrap();
            }
        };
        let mut kept = Vec::new();
        let base = dev.memory_allocated();
        let mut grow = Vec::new();
        for _ in 0..4 {
            step(&mut kept, true);
            grow.push(dev.memory_allocated() - base);
        }
        assert!(grow.windows(2).all(|w| w[1] > w[0]), "{dev:?}: {grow:?}");
        assert!(grow[3] > 4 * 16 * 64 * 4, "activations of four graphs");
        drop(kept);
        assert_eq!(dev.memory_allocated(), base);
        let mut none = Vec::new();
        for _ in 0..4 {
            step(&mut none, false);
        }
        assert_eq!(dev.memory_allocated(), base, "{dev:?}");
    }
}

#[test]
fn checkpoint_lowers_peak_memory_and_gives_the_same_gradients() {
    use std::sync::Arc;
    // GPUs only: the CPU reference's f64 loops take minutes over these matmuls in a debug
    // build, and the allocator (the thing measured) is the same code on every device.
    for dev in devices().into_iter().filter(|d| !d.is_cpu()) {
        let run = |use_checkpoint: bool| {
            dev.manual_seed(3);
            // Six blocks, each checkpointed on its own (checkpoint_sequential's pattern): only
            // the block boundaries stay alive until backward, not the wide inner activations.
            let blocks: Vec<Arc<Sequential>> = (0..6)
                .map(|_| {
                    Arc::new(
                        Sequential::new()
                            .push(Linear::new(64, 256, true, &dev).unwrap())
                            .push(Relu)
                            .push(Linear::new(256, 64, true, &dev).unwrap())
                            .push(Relu),
                    )
                })
                .collect();
            let head = Linear::new(64, 10, true, &dev).unwrap();
            let x = Tensor::randn(&[512, 64], DType::F32, &dev).unwrap();
            let y = Tensor::from_slice(
                &(0..512).map(|i| i % 10).collect::<Vec<i32>>(),
                &[512],
                &dev,
            )
            .unwrap();
            dev.synchronize().unwrap();
            dev.reset_peak_memory_stats();
            let base = dev.memory_allocated();
            let mut h = x;
            for b in &blocks {
                h = if use_checkpoint {
                    let b = b.clone();
                    kiln::checkpoint(move |xs: &[Tensor]| b.forward(&xs[0]), &[h]).unwrap()
                } else {
                    b.forward(&h).unwrap()
                };
            }
            cross_entropy(&head.forward(&h).unwrap(), &y)
                .unwrap()
                .backward()
                .unwrap();
            let peak = dev.max_memory_allocated() - base;
            let g = blocks[0].parameters()[0]
                .grad()
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            (peak, g)
        };
        let t0 = std::time::Instant::now();
        let (plain, g0) = run(false);
        let (ckpt, g1) = run(true);
        eprintln!(
            "{dev:?}: peak {plain} plain, {ckpt} checkpointed ({:?})",
            t0.elapsed()
        );
        assert!(ckpt < plain, "{dev:?}: checkpoint peak {ckpt} vs {plain}");
        for (a, b) in g0.iter().zip(&g1) {
            assert!((a - b).abs() < 1e-5, "{dev:?}: {a} vs {b}");
        }
    }
}

#[test]
fn fused_optimizers_match_the_cpu_formulas() {
    let cpu = Device::cpu().unwrap();
    // Five elements take the one-per-invocation kernels, eight the vec4 ones; 3001 and 8196
    // span several workgroups, each with a partial last one.
    let values: Vec<f32> = (0..8196)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0)
        .collect();
    for (dev, n) in devices()
        .into_iter()
        .filter(|d| !d.is_cpu())
        .flat_map(|d| [(d.clone(), 5), (d.clone(), 8), (d.clone(), 3001), (d, 8196)])
    {
        for which in ["sgd", "nesterov", "adam", "adamw"] {
            let mut results = Vec::new();
            for d in [&cpu, &dev] {
                let p = leaf(&values[..n], &[n], d);
                let mut opt: Box<dyn Optimizer> = match which {
                    "sgd" => Box::new(
                        Sgd::new(vec![p.clone()], 0.1)
                            .unwrap()
                            .momentum(0.9)
                            .and_then(|o| o.weight_decay(0.01))
                            .unwrap(),
                    ),
                    "nesterov" => Box::new(
                        Sgd::new(vec![p.clone()], 0.1)
                            .unwrap()
                            .momentum(0.9)
                            .and_then(|o| o.nesterov(true))
                            .unwrap(),
                    ),
                    "adam" => Box::new(
                        Adam::new(vec![p.clone()], 0.01)
                            .unwrap()
                            .weight_decay(0.1)
                            .unwrap(),
                    ),
                    _ => Box::new(Adam::adamw(vec![p.clone()], 0.01).unwrap()),
                };
                for _ in 0..3 {
                    opt.zero_grad(true).unwrap();
                    p.square()
                        .unwrap()
                        .mul(&p)
                        .unwrap()
                        .sum_all()
                        .unwrap()
                        .backward()
                        .unwrap();
                    opt.step().unwrap();
                }
                results.push(vec(&p));
            }
            for (a, b) in results[0].iter().zip(&results[1]) {
                assert!(
                    (a - b).abs() < 1e-5 * (1.0 + b.abs()),
                    "{which} n {n} on {dev:?}: {a} vs CPU {b}"
                );
            }
        }
    }
}

/// The tensors a node saved are freed once it has run, also where the node offered its
/// formula to the kernel before it (Note [Backward epilogues]: ReLU's output, log_softmax's):
/// with the loss still held, backward leaves the leaves, their gradients and the loss.
#[test]
fn saved_outputs_are_freed_by_backward() {
    for dev in devices() {
        let x = Tensor::randn(&[512, 256], DType::F32, &dev)
            .unwrap()
            .requires_grad_(true)
            .unwrap();
        let target = Tensor::zeros(&[512], DType::I32, &dev).unwrap();
        let relu = x.relu().unwrap().sum_all().unwrap();
        let ce = cross_entropy(&x, &target).unwrap();
        let loss = relu.add(&ce).unwrap();
        dev.synchronize().unwrap();
        let before = dev.memory_allocated() as i64;
        loss.backward().unwrap();
        dev.synchronize().unwrap();
        let after = dev.memory_allocated() as i64;
        // x.grad arrives (512 KiB); ReLU's output and log_softmax's (512 KiB each) and
        // nll_loss's total_weight go.
        let (mib, grad) = (1i64 << 20, 512 * 1024);
        assert!(
            after - before <= grad - mib + mib / 8,
            "{dev:?}: {before} -> {after}"
        );
        drop((relu, ce, loss));
    }
}
