//! Saved-tensor hooks and `save_on_cpu`, against PyTorch's semantics: the pack hook runs once
//! per saved tensor and the unpack hook once per read in backward; gradients are those of a run
//! without hooks (every adapter against the CPU device); guards nest; an in-place write before
//! backward is caught through a packed tensor too; a bad unpack is an error. `save_on_cpu`
//! lowers the device's peak by the activations, puts them in the pinned pool, and its dry run
//! allocates what its real run does.

use kiln::autograd::{save_on_cpu, save_on_cpu_ahead, saved_tensors_hooks, Packed};
use kiln::nn::{cross_entropy, Linear, Module, Relu, Sequential};
use kiln::{DType, Device, Error, Tensor};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

fn devices() -> Vec<Device> {
    kiln::device::test_devices().expect("KILN_REQUIRE_GPU=1 and no GPU adapter")
}

/// An MLP whose activations outweigh its parameters and backward's temporaries: 8 layers of
/// 32 on a batch of 2048 (256 KiB per activation), small enough for the CPU device in a debug
/// build.
fn mlp(dev: &Device) -> Sequential {
    dev.manual_seed(7);
    let mut s = Sequential::new();
    for i in 0..8 {
        s = s.push(Linear::new(if i == 0 { 16 } else { 32 }, 32, true, dev).unwrap());
        s = s.push(Relu);
    }
    s.push(Linear::new(32, 10, true, dev).unwrap())
}

fn batch(dev: &Device) -> (Tensor, Tensor) {
    let cpu = Device::cpu().unwrap();
    cpu.manual_seed(8);
    let x = Tensor::randn(&[2048, 16], DType::F32, &cpu).unwrap();
    let y: Vec<i32> = (0..2048).map(|i| i % 10).collect();
    (
        x.to_device(dev).unwrap(),
        Tensor::from_slice(&y, &[2048], dev).unwrap(),
    )
}

/// The loss's gradients of the MLP's parameters, with `hooks` in force over the forward; the
/// device's peak allocated from before the forward.
fn grads(
    dev: &Device,
    hooks: impl FnOnce() -> Option<kiln::autograd::SavedTensorsHooks>,
) -> (Vec<Vec<f32>>, u64) {
    let model = mlp(dev);
    let (x, y) = batch(dev);
    dev.synchronize().unwrap();
    dev.reset_peak_memory_stats();
    let loss = {
        let _h = hooks();
        cross_entropy(&model.forward(&x).unwrap(), &y).unwrap()
    };
    loss.backward().unwrap();
    dev.synchronize().unwrap();
    let peak = dev.max_memory_allocated();
    let g = model
        .parameters()
        .iter()
        .map(|p| p.grad().unwrap().to_vec::<f32>().unwrap())
        .collect();
    (g, peak)
}

fn close(a: &[Vec<f32>], b: &[Vec<f32>], what: &str) {
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        for (u, v) in x.iter().zip(y) {
            assert!(
                (u - v).abs() <= 1e-4 * (1.0 + v.abs()),
                "{what}: parameter {i}: {u} vs {v}"
            );
        }
    }
}

#[test]
fn hooks_pack_once_per_saved_tensor_and_unpack_once_per_read() {
    for dev in devices() {
        let (packs, unpacks) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (p, u) = (packs.clone(), unpacks.clone());
        let (plain, _) = grads(&dev, || None);
        let (hooked, _) = grads(&dev, || {
            Some(saved_tensors_hooks(
                move |t: &Tensor| -> kiln::Result<Packed> {
                    p.fetch_add(1, Ordering::Relaxed);
                    Ok(Box::new(t.detach()))
                },
                move |packed: &Packed| -> kiln::Result<Tensor> {
                    u.fetch_add(1, Ordering::Relaxed);
                    Ok(packed.downcast_ref::<Tensor>().unwrap().clone())
                },
            ))
        });
        close(&hooked, &plain, &dev.name());
        let (packs, unpacks) = (
            packs.load(Ordering::Relaxed),
            unpacks.load(Ordering::Relaxed),
        );
        assert!(packs >= 9, "{}: {packs} packs", dev.name());
        // Every saved tensor is read by backward, once per access (PyTorch's unpack per
        // access): a ReLU output offered to its producer's kernel as an epilogue is read
        // there, and by its own node where the offer is not taken (log_softmax's output too).
        assert!(
            unpacks >= packs && unpacks <= 2 * packs,
            "{}: {packs} packs, {unpacks} unpacks",
            dev.name()
        );
    }
}

#[test]
fn the_innermost_hooks_apply_and_a_dropped_guard_stops_them() {
    let dev = Device::cpu().unwrap();
    let (outer, inner) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let counting = |n: Arc<AtomicUsize>| {
        saved_tensors_hooks(
            move |t: &Tensor| -> kiln::Result<Packed> {
                n.fetch_add(1, Ordering::Relaxed);
                // A tensor the hook itself saves is kept as it is: no recursion.
                let w = t.detach().requires_grad_(true)?;
                let _ = w.mul(&w)?;
                Ok(Box::new(t.detach()))
            },
            |p: &Packed| -> kiln::Result<Tensor> {
                Ok(p.downcast_ref::<Tensor>().unwrap().clone())
            },
        )
    };
    let x = Tensor::randn(&[8], DType::F32, &dev)
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    let _o = counting(outer.clone());
    let a = x.mul(&x).unwrap(); // two saves, outer hooks
    {
        let _i = counting(inner.clone());
        let _ = a.exp().unwrap(); // exp saves its output: inner hooks
    }
    let _ = a.sin().unwrap(); // outer again
    drop(_o);
    let _ = a.cos().unwrap(); // none
    assert_eq!(outer.load(Ordering::Relaxed), 3);
    assert_eq!(inner.load(Ordering::Relaxed), 1);
}

#[test]
fn an_in_place_write_to_a_packed_tensor_is_caught_and_a_bad_unpack_is_an_error() {
    for dev in devices() {
        let x = Tensor::randn(&[16], DType::F32, &dev)
            .unwrap()
            .requires_grad_(true)
            .unwrap();
        let h = x.mul(&x).unwrap();
        let y = {
            let _offload = save_on_cpu(true);
            h.exp().unwrap().sum_all().unwrap() // exp saves its output; sum saves nothing
        };
        let z = {
            let _offload = save_on_cpu(false);
            h.sin().unwrap() // saves h
        };
        kiln::no_grad(|| h.fill_(1.0)).unwrap();
        let err = z.sum_all().unwrap().backward().unwrap_err();
        assert!(
            matches!(err, Error::ModifiedInplace { .. }),
            "{}: {err}",
            dev.name()
        );
        y.backward().unwrap();
        let wrong = {
            let _h = saved_tensors_hooks(
                |_: &Tensor| -> kiln::Result<Packed> { Ok(Box::new(())) },
                |_: &Packed| -> kiln::Result<Tensor> {
                    Tensor::zeros(&[3], DType::F32, &Device::cpu()?)
                },
            );
            x.mul(&x).unwrap().sum_all().unwrap()
        };
        let err = wrong.backward().unwrap_err();
        assert!(
            matches!(
                err,
                Error::Autograd {
                    op: "unpack_hook",
                    ..
                }
            ),
            "{err}"
        );
    }
}

#[test]
fn save_on_cpu_gives_the_same_gradients_with_a_lower_peak() {
    for dev in devices() {
        let (plain, peak) = grads(&dev, || None);
        for pin in [false, true] {
            let (offloaded, _) = grads(&dev, || Some(save_on_cpu(pin)));
            close(&offloaded, &plain, &format!("{} pin {pin}", dev.name()));
            // Without a look-ahead (the default where copies share the kernels' queue), as
            // PyTorch: each activation leaves the device as it is saved.
            let (offloaded, offload_peak) = grads(&dev, || Some(save_on_cpu_ahead(pin, 0)));
            close(&offloaded, &plain, &format!("{} pin {pin}", dev.name()));
            if !dev.is_cpu() {
                // Eight ReLU outputs of 256 KiB each are off the device between forward and
                // backward.
                assert!(
                    offload_peak + (1 << 20) <= peak,
                    "{} pin {pin}: {offload_peak} vs {peak}",
                    dev.name()
                );
            }
        }
        if !dev.is_cpu() {
            assert!(dev.host_memory_stats().num_host_alloc > 0, "{}", dev.name());
        }
    }
}

#[test]
fn a_dry_run_of_save_on_cpu_allocates_what_the_real_run_does() {
    kiln::kernels::tune::set_autotune(kiln::kernels::tune::Autotune::Off);
    for dev in devices().into_iter().filter(|d| !d.is_cpu()) {
        dry_run_equals_real_run(&dev, || save_on_cpu(true));
    }
}

/// One forward and backward of the MLP under `hooks` on `dev` (fresh) and on its planning twin:
/// every memory statistic equal.
fn dry_run_equals_real_run(dev: &Device, hooks: impl Fn() -> kiln::autograd::SavedTensorsHooks) {
    let plan = dev.planning_twin().unwrap();
    let run = |d: &Device| {
        let model = mlp(d);
        let (x, y) = batch(d);
        let loss = {
            let _offload = hooks();
            cross_entropy(&model.forward(&x)?, &y)?
        };
        loss.backward()
    };
    run(dev).unwrap();
    dev.synchronize().unwrap();
    run(&plan).unwrap();
    assert_eq!(plan.memory_stats(), dev.memory_stats(), "{}", dev.name());
}

/// `save_on_cpu_ahead`: the copies run up to the look-ahead ahead of the kernels, so the
/// device keeps some saved tensors longer in forward and brings some back earlier in backward
/// (a higher peak than without, by at most the look-ahead each way); the gradients are the
/// same, and a dry run allocates exactly what the real run does.
#[test]
fn copies_run_within_the_look_ahead_and_a_dry_run_allocates_the_same() {
    kiln::kernels::tune::set_autotune(kiln::kernels::tune::Autotune::Off);
    // Three of the MLP's 256 KiB activations.
    const AHEAD: u64 = 768 << 10;
    for dev in devices().into_iter().filter(|d| !d.is_cpu()) {
        dry_run_equals_real_run(&dev, || save_on_cpu_ahead(true, AHEAD));
        let (plain, _) = grads(&dev, || None);
        let (ahead, ahead_peak) = grads(&dev, || Some(save_on_cpu_ahead(true, AHEAD)));
        let (_, none_peak) = grads(&dev, || Some(save_on_cpu_ahead(true, 0)));
        close(&ahead, &plain, &format!("{} ahead", dev.name()));
        assert!(
            ahead_peak > none_peak && ahead_peak <= none_peak + 2 * AHEAD + (256 << 10),
            "{}: peak {ahead_peak} with the look-ahead, {none_peak} without",
            dev.name()
        );
    }
}

/// Memory held ahead of need gives way before an out-of-memory error (Note [Memory pressure]):
/// under a cap on reserved memory that the look-ahead-0 run fits and a 64 MiB look-ahead
/// (more than every activation of the MLP) does not, the look-ahead run completes with the
/// same gradients and no out-of-memory in the statistics. Its dry run, under the same cap,
/// allocates what it does.
#[test]
fn a_look_ahead_gives_its_memory_back_before_an_out_of_memory() {
    kiln::kernels::tune::set_autotune(kiln::kernels::tune::Autotune::Off);
    const AHEAD: u64 = 64 << 20;
    for dev in devices().into_iter().filter(|d| !d.is_cpu()) {
        let (plain, _) = grads(&dev, || None);
        let reserved_peak = |ahead: u64| {
            dev.empty_cache();
            dev.reset_peak_memory_stats();
            grads(&dev, || Some(save_on_cpu_ahead(true, ahead)));
            dev.max_memory_reserved()
        };
        let (without, with) = (reserved_peak(0), reserved_peak(AHEAD));
        assert!(with > without, "{}: {with} against {without}", dev.name());
        dev.empty_cache();
        dev.reset_accumulated_memory_stats();
        dev.set_memory_limit(Some(without));
        let (got, _) = grads(&dev, || Some(save_on_cpu_ahead(true, AHEAD)));
        close(&got, &plain, &format!("{} under the cap", dev.name()));
        assert_eq!(dev.memory_stats()["num_ooms"], 0, "{}", dev.name());
        dev.set_memory_limit(None);
        // A fresh device of the same adapter, for statistics from zero.
        let fresh = devices()
            .into_iter()
            .find(|d| d.name() == dev.name())
            .unwrap();
        fresh.set_memory_limit(Some(without));
        dry_run_equals_real_run(&fresh, || save_on_cpu_ahead(true, AHEAD));
    }
}
