//! Mixed precision against PyTorch's rules: the autocast policy per op (output dtypes), nested
//! and disabled regions, the weight cast cache, GradScaler's scale sequence and skipped steps,
//! the on-device unscale against the tensor-op reference, clip_grad_norm_, f16 fused optimizer
//! kernels against the CPU device, and AMP training against f32 training.

#[path = "common/observe.rs"]
mod observe;
use kiln::amp::{
    autocast, autocast_cache_len, is_autocast_enabled, with_autocast, DeviceType, GradScaler,
};
use kiln::nn::{
    clip_grad_norm_, cross_entropy, mse_loss, nll_loss, BatchNorm, LayerNorm, Linear, Module,
};
use kiln::ops::Conv2dParams;
use kiln::optim::{Adam, Optimizer, Sgd};
use kiln::{DType, Device, Error, Tensor};
use observe::{kernel_trace, stats_delta};

fn devices() -> Vec<Device> {
    kiln::device::test_devices().expect("KILN_REQUIRE_GPU=1 and no GPU adapter")
}

fn has_f16(dev: &Device) -> bool {
    dev.adapter_info().is_none_or(|i| i.features.shader_f16)
}

fn device_type(dev: &Device) -> DeviceType {
    if dev.is_cpu() {
        DeviceType::Cpu
    } else {
        DeviceType::Gpu
    }
}

fn randn(shape: &[usize], dev: &Device) -> Tensor {
    Tensor::randn(shape, DType::F32, dev).unwrap()
}

// PyTorch 2.11, `with torch.autocast("cuda", dtype=torch.float16):` on f32 inputs gives
// linear/matmul/conv2d -> float16; softmax/log_softmax/cross_entropy/nll_loss/mse_loss/
// layer_norm/sum/exp/log/pow of float16 inputs -> float32; relu and batch_norm (f32 weights)
// keep float16; a float16 +
// float32 add -> float32 (type promotion). Outside autocast the f32 ops stay f32.
#[test]
fn autocast_policy_gives_pytorchs_output_dtypes() {
    for dev in devices().into_iter().filter(has_f16) {
        dev.manual_seed(0);
        let x = randn(&[4, 8], &dev);
        let lin = Linear::new(8, 6, true, &dev).unwrap();
        let _region = autocast(device_type(&dev), DType::F16, true).unwrap();
        let h = lin.forward(&x).unwrap();
        assert_eq!(h.dtype(), DType::F16, "{dev:?} linear");
        let no_bias = kiln::ops::linear(&x, &lin.weight, None).unwrap();
        assert_eq!(no_bias.dtype(), DType::F16, "{dev:?} linear without bias");
        assert_eq!(x.matmul(&x.t().unwrap()).unwrap().dtype(), DType::F16);
        // Batched matmul.
        let b = randn(&[2, 4, 8], &dev);
        assert_eq!(b.matmul(&x.t().unwrap()).unwrap().dtype(), DType::F16);
        let img = randn(&[1, 2, 5, 5], &dev);
        let w = randn(&[3, 2, 3, 3], &dev);
        let conv = kiln::ops::conv2d(&img, &w, None, Conv2dParams::default()).unwrap();
        assert_eq!(conv.dtype(), DType::F16, "{dev:?} conv2d");
        assert_eq!(h.relu().unwrap().dtype(), DType::F16, "relu keeps f16");
        // batch_norm is on none of the lists: f16 input with the module's f32 parameters
        // gives f16, and the parameters' gradients stay f32.
        let bn = BatchNorm::new(6, &dev).unwrap();
        let hg = h.detach().requires_grad_(true).unwrap();
        let y = bn.forward(&hg).unwrap();
        assert_eq!(y.dtype(), DType::F16, "{dev:?} batch_norm");
        y.sum(&[], false).unwrap().backward().unwrap();
        assert_eq!(bn.weight.grad().unwrap().dtype(), DType::F32);
        assert_eq!(hg.grad().unwrap().dtype(), DType::F16);
        for (name, t) in [
            ("softmax", h.softmax(1).unwrap()),
            ("log_softmax", h.log_softmax(1).unwrap()),
            ("sum", h.sum(&[1], false).unwrap()),
            ("mean", h.mean(&[], false).unwrap()),
            ("exp", h.exp().unwrap()),
            ("log", h.abs().unwrap().log().unwrap()),
            ("pow", h.pow_scalar(2.0).unwrap()),
            ("pow (tensor)", h.pow(&h).unwrap()),
            ("add f16 + f32", h.add(&randn(&[4, 6], &dev)).unwrap()),
            ("mul f32 * f16", randn(&[4, 6], &dev).mul(&h).unwrap()),
            (
                "layer_norm",
                LayerNorm::new(6, &dev).unwrap().forward(&h).unwrap(),
            ),
            ("mse_loss", mse_loss(&h, &h.relu().unwrap()).unwrap()),
        ] {
            assert_eq!(t.dtype(), DType::F32, "{dev:?} {name}");
        }
        let labels = Tensor::from_slice(&[0i32, 1, 2, 3], &[4], &dev).unwrap();
        assert_eq!(cross_entropy(&h, &labels).unwrap().dtype(), DType::F32);
        assert_eq!(nll_loss(&h, &labels).unwrap().dtype(), DType::F32);
        drop(_region);
        // Outside: nothing changes, and mixed dtypes are an error again.
        assert_eq!(lin.forward(&x).unwrap().dtype(), DType::F32);
        let err = h.add(&randn(&[4, 6], &dev)).unwrap_err();
        assert!(matches!(err, Error::DTypeMismatch { .. }), "{err}");
    }
}

#[test]
fn gradients_reach_the_f32_weights_through_the_casts() {
    for dev in devices().into_iter().filter(has_f16) {
        dev.manual_seed(3);
        let lin = Linear::new(16, 8, true, &dev).unwrap();
        let x = randn(&[32, 16], &dev);
        let labels: Vec<i32> = (0..32).map(|i| i % 8).collect();
        let y = Tensor::from_slice(&labels, &[32], &dev).unwrap();
        let loss = with_autocast(device_type(&dev), DType::F16, true, || {
            cross_entropy(&lin.forward(&x)?, &y)
        })
        .unwrap()
        .unwrap();
        loss.backward().unwrap();
        let g16 = lin.weight.grad().unwrap();
        assert_eq!(g16.dtype(), DType::F32, "{dev:?}: the weight's grad is f32");
        let g16 = g16.to_vec::<f32>().unwrap();
        lin.zero_grad(true).unwrap();
        cross_entropy(&lin.forward(&x).unwrap(), &y)
            .unwrap()
            .backward()
            .unwrap();
        let g32 = lin.weight.grad().unwrap().to_vec::<f32>().unwrap();
        let scale = g32.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = g16
            .iter()
            .zip(&g32)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            worst <= 1e-2 * scale,
            "{dev:?}: f16 grads off by {worst} (max {scale})"
        );
    }
}

/// cross_entropy of f16 logits under autocast allocates what PyTorch 2.11's does (its trace of
/// a GPT-2 124M AMP step, `_record_memory_history`): log_softmax's f16 output, then nll_loss's
/// f32 copy of it, both alive into the backward; there nll_loss's f32 gradient, the copy's f16
/// gradient, then log_softmax's f16 gradient. The gradient matches the f32 computation's.
#[test]
fn cross_entropy_under_autocast_allocates_what_pytorch_does() {
    use kiln::alloc::{HistoryContext, HistoryEnabled, HistoryStacks, TraceAction};
    for dev in devices().into_iter().filter(|d| !d.is_cpu() && has_f16(d)) {
        let (n, c) = (64usize, 1000usize);
        dev.manual_seed(4);
        let x = randn(&[n, c], &dev);
        let labels: Vec<i32> = (0..n as i32).map(|i| (i * 37) % c as i32).collect();
        let y = Tensor::from_slice(&labels, &[n], &dev).unwrap();
        let logits = x
            .to_dtype(DType::F16)
            .unwrap()
            .requires_grad_(true)
            .unwrap();
        dev.synchronize().unwrap();
        let before = dev.memory_allocated();
        dev.record_memory_history(
            Some(HistoryEnabled::All),
            HistoryContext::Alloc,
            HistoryStacks::Kiln,
            10_000,
        );
        let loss = with_autocast(DeviceType::Gpu, DType::F16, true, || {
            cross_entropy(&logits, &y)
        })
        .unwrap()
        .unwrap();
        // The loss and its total_weight are 512 bytes each.
        let (half, full) = ((n * c * 2) as u64, (n * c * 4) as u64);
        assert_eq!(
            dev.memory_allocated() - before,
            half + full + 1024,
            "{dev:?}"
        );
        loss.backward().unwrap();
        let trace = dev.memory_snapshot().device_traces[0].clone();
        dev.record_memory_history(None, HistoryContext::None, HistoryStacks::Kiln, 0);
        let large: Vec<u64> = trace
            .iter()
            .filter(|e| e.action == TraceAction::Alloc && e.size >= half)
            .map(|e| e.size)
            .collect();
        assert_eq!(large, [half, full, full, half, half], "{dev:?}");
        let got = logits.grad().unwrap().to_dtype(DType::F32).unwrap();
        let x32 = x.requires_grad_(true).unwrap();
        cross_entropy(&x32, &y).unwrap().backward().unwrap();
        let want = x32.grad().unwrap().to_vec::<f32>().unwrap();
        let worst = got
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .zip(&want)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(worst <= 2e-5, "{dev:?}: gradient off by {worst}");
    }
}

/// Under autocast, the backward of f16 logits' cross_entropy (nll_loss's, the f32 copy's and
/// log_softmax's) runs as one kernel where the engine offers it (Note [Backward epilogues],
/// through a cast): the same loss, gradient and allocator statistics as the three kernels with
/// epilogues off, the gradient against the formula in f64, and only the one kernel running.
/// Shapes: rows shorter than a 16-byte chunk (C = 5), a last chunk the tensor ends inside,
/// rows of thousands, ignored rows.
#[test]
fn amp_cross_entropy_backward_fuses_through_the_f32_copy() {
    let cpu = Device::cpu().unwrap();
    for (n, c) in [(37usize, 5usize), (40, 101), (9, 5003)] {
        cpu.manual_seed(6);
        let x16 = randn(&[n, c], &cpu)
            .mul_scalar(3.0)
            .unwrap()
            .to_dtype(DType::F16)
            .unwrap();
        let labels: Vec<i32> = (0..n as i32)
            .map(|i| {
                if i % 7 == 3 {
                    -100
                } else {
                    (i * 31) % c as i32
                }
            })
            .collect();
        let xs = x16.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        let count = labels.iter().filter(|&&t| t != -100).count() as f64;
        // d loss / d x = (softmax(x) - onehot) / count on a counted row.
        let want: Vec<f64> = (0..n * c)
            .map(|e| {
                let (i, j) = (e / c, e % c);
                if labels[i] == -100 {
                    return 0.0;
                }
                let row = &xs[i * c..(i + 1) * c];
                let m = row.iter().fold(f32::MIN, |a, &b| a.max(b)) as f64;
                let z: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
                let p = (xs[e] as f64 - m).exp() / z;
                (p - (labels[i] == j as i32) as u8 as f64) / count
            })
            .collect();
        for dev in devices().into_iter().filter(|d| !d.is_cpu() && has_f16(d)) {
            let y = Tensor::from_slice(&labels, &[n], &dev).unwrap();
            let offload = std::cell::Cell::new(false);
            let run = |fused: bool| {
                kiln::autograd::set_backward_epilogues(fused);
                let x = x16.to_device(&dev).unwrap().requires_grad_(true).unwrap();
                let l = {
                    let _hooks = offload.get().then(|| kiln::autograd::save_on_cpu(true));
                    with_autocast(DeviceType::Gpu, DType::F16, true, || cross_entropy(&x, &y))
                        .unwrap()
                        .unwrap()
                };
                l.backward().unwrap();
                kiln::autograd::set_backward_epilogues(true);
                let g = x.grad().unwrap().to_dtype(DType::F32).unwrap();
                (l.item::<f32>().unwrap(), g.to_vec::<f32>().unwrap())
            };
            let stats = |fused: bool| stats_delta(&dev, || run(fused));
            // Under save_on_cpu nothing is offered (an offer would bring log_softmax's saved
            // output back to the device before its backward): the statistics are the three
            // kernels' too.
            offload.set(true);
            let (fused_off, plain_off) = (stats(true), stats(false));
            assert_eq!(fused_off.1, plain_off.1, "{dev:?} {n}x{c}: save_on_cpu");
            offload.set(false);
            let ((fused, fused_stats), (plain, plain_stats)) = (stats(true), stats(false));
            assert_eq!(
                fused_stats, plain_stats,
                "{dev:?} {n}x{c}: allocator statistics"
            );
            assert_eq!(fused.0, plain.0, "{dev:?} {n}x{c}: loss");
            let s = 1.0 / count;
            for (e, ((a, b), w)) in fused.1.iter().zip(&plain.1).zip(&want).enumerate() {
                // f16 gradients: the fused kernel rounds once, the three kernels three times.
                assert!(
                    (a - b).abs() as f64 <= 2e-3 * s && (*a as f64 - w).abs() <= 4e-3 * s,
                    "{dev:?} {n}x{c} element {e}: fused {a}, three kernels {b}, f64 {w}"
                );
            }
            assert!(fused.1.iter().any(|v| *v != 0.0));
            if dev.adapter_info().unwrap().features.timestamp_query {
                let ran = |fused: bool| {
                    let t = kernel_trace(&dev, || Ok(run(fused)));
                    [
                        "cross_entropy_backward_f16_words_from_f32",
                        "nll_loss_backward_f32",
                        "cast_f32_f16",
                        // (Kernels; the op is `log_softmax_backward` either way.)
                        "softmax_backward_",
                    ]
                    .map(|k| t.contains(k))
                };
                assert_eq!(ran(true), [true, false, false, false], "{dev:?} {n}x{c}");
                assert_eq!(ran(false), [false, true, true, true], "{dev:?} {n}x{c}");
            }
        }
    }
}

#[test]
fn nested_and_disabled_regions_and_the_weight_cast_cache() {
    for dev in devices().into_iter().filter(has_f16) {
        let dt = device_type(&dev);
        dev.manual_seed(1);
        let lin = Linear::new(8, 8, true, &dev).unwrap();
        let x = randn(&[2, 8], &dev);
        dev.synchronize().unwrap();
        let before = dev.memory_allocated();
        {
            let _outer = autocast(dt, DType::F16, true).unwrap();
            assert!(is_autocast_enabled(dt));
            let first = lin.forward(&x).unwrap();
            // weight and bias: f32 leaves that require grad, cast once and cached.
            assert_eq!(autocast_cache_len(), 2, "{dev:?}");
            let cached = dev.memory_allocated();
            // Without a graph (nothing saved for backward), a second forward allocates only
            // its output: one 512-byte block; the weights' casts come from the cache.
            let second = kiln::no_grad(|| lin.forward(&x)).unwrap();
            assert_eq!(dev.memory_allocated() - cached, 512, "{dev:?}");
            assert_eq!(first.to_f64_vec().unwrap(), second.to_f64_vec().unwrap());
            // The activation is not a leaf: never cached.
            let _ = x.matmul(&lin.weight.t().unwrap()).unwrap();
            assert_eq!(autocast_cache_len(), 2);
            {
                let _inner = autocast(dt, DType::F16, false).unwrap();
                assert!(!is_autocast_enabled(dt));
                assert_eq!(lin.forward(&x).unwrap().dtype(), DType::F32);
                {
                    let _again = autocast(dt, DType::F16, true).unwrap();
                    assert_eq!(lin.forward(&x).unwrap().dtype(), DType::F16);
                }
                assert_eq!(lin.forward(&x).unwrap().dtype(), DType::F32);
            }
            // Only the outermost region's end empties the cache.
            assert_eq!(autocast_cache_len(), 2);
            assert_eq!(lin.forward(&x).unwrap().dtype(), DType::F16);
            // A weight changed in place is cast again (not a stale copy).
            kiln::no_grad(|| lin.weight.mul_scalar_(2.0)).unwrap();
            let third = lin.forward(&x).unwrap().to_f64_vec().unwrap();
            let want = kiln::ops::linear(
                &x.to_dtype(DType::F16).unwrap(),
                &lin.weight.detach().to_dtype(DType::F16).unwrap(),
                Some(
                    &lin.bias
                        .as_ref()
                        .unwrap()
                        .detach()
                        .to_dtype(DType::F16)
                        .unwrap(),
                ),
            )
            .unwrap()
            .to_f64_vec()
            .unwrap();
            assert_eq!(third, want, "{dev:?}");
        }
        assert!(!is_autocast_enabled(dt));
        assert_eq!(autocast_cache_len(), 0);
        dev.synchronize().unwrap();
        assert_eq!(
            dev.memory_allocated(),
            before,
            "{dev:?}: the casts were freed"
        );
    }
}

#[test]
fn autocast_on_one_device_type_leaves_the_other_exact() {
    let cpu = Device::cpu().unwrap();
    cpu.manual_seed(2);
    let lin = Linear::new(8, 4, true, &cpu).unwrap();
    let x = randn(&[3, 8], &cpu);
    let plain = lin.forward(&x).unwrap().to_vec::<f32>().unwrap();
    let under_gpu = with_autocast(DeviceType::Gpu, DType::F16, true, || lin.forward(&x))
        .unwrap()
        .unwrap();
    assert_eq!(under_gpu.dtype(), DType::F32);
    assert_eq!(under_gpu.to_vec::<f32>().unwrap(), plain);
    // On the CPU device, a CPU region runs the f16 policy, and the GPUs agree with it.
    let cpu16 = with_autocast(DeviceType::Cpu, DType::F16, true, || lin.forward(&x))
        .unwrap()
        .unwrap();
    assert_eq!(cpu16.dtype(), DType::F16);
    let cpu16 = cpu16.to_f64_vec().unwrap();
    for dev in Device::all_gpus().into_iter().filter(has_f16) {
        let lin_d = Linear {
            weight: lin.weight.to_device(&dev).unwrap(),
            bias: lin.bias.as_ref().map(|b| b.to_device(&dev).unwrap()),
        };
        let y = with_autocast(DeviceType::Gpu, DType::F16, true, || {
            lin_d.forward(&x.to_device(&dev)?)
        })
        .unwrap()
        .unwrap()
        .to_f64_vec()
        .unwrap();
        for (a, b) in y.iter().zip(&cpu16) {
            assert!(
                (a - b).abs() <= 2e-3 * b.abs().max(1.0),
                "{dev:?}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn bad_autocast_input_is_a_typed_error_that_disturbs_nothing() {
    let err = autocast(DeviceType::Gpu, DType::F32, true).err().unwrap();
    assert!(
        matches!(err, Error::UnsupportedDType { op: "autocast", .. }),
        "{err}"
    );
    assert!(!is_autocast_enabled(DeviceType::Gpu));
    // Disabled regions take any dtype, as PyTorch's.
    drop(autocast(DeviceType::Gpu, DType::F32, false).unwrap());
    assert!(DeviceType::parse("tpu").is_err());
    assert_eq!(DeviceType::parse("cuda").unwrap(), DeviceType::Gpu);
    // An adapter without shader-f16 (wgpu's GL backend on llvmpipe): the op says so.
    for dev in Device::all_gpus().into_iter().filter(|d| !has_f16(d)) {
        let lin = Linear::new(4, 2, true, &dev).unwrap();
        let x = randn(&[1, 4], &dev);
        dev.synchronize().unwrap();
        let before = dev.memory_allocated();
        let err = with_autocast(DeviceType::Gpu, DType::F16, true, || lin.forward(&x))
            .unwrap()
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::UnsupportedDType {
                    op: "linear",
                    dtype: DType::F16,
                    ..
                }
            ),
            "{dev:?}: {err}"
        );
        assert_eq!(dev.memory_allocated(), before);
        assert_eq!(lin.forward(&x).unwrap().dtype(), DType::F32, "still usable");
    }
}

/// A leaf that requires grad, filled with `value` (a parameter).
fn leaf(value: f64, shape: &[usize], dtype: DType, dev: &Device) -> Tensor {
    Tensor::full(shape, value, dtype, dev)
        .unwrap()
        .requires_grad_(true)
        .unwrap()
}

/// One parameter `w` with `grad` set by hand (so that infs can be injected).
fn set_grad(p: &Tensor, values: &[f32]) {
    let g = Tensor::from_slice(values, p.shape(), p.device()).unwrap();
    p.set_grad(Some(g)).unwrap();
}

// PyTorch's rule (`_amp_update_scale_`), for GradScaler(init_scale=65536, growth_factor=2,
// backoff_factor=0.5, growth_interval=2) with an inf gradient at steps 1, 4 and 5:
//   for i in range(8):
//       loss = scaler.scale(w.sum()); loss.backward()
//       if i in (1, 4, 5): w.grad[0] = float("inf")
//       scaler.step(opt); scaler.update(); print(scaler.get_scale())
// prints 65536, 32768, 32768, 65536, 32768, 16384, 16384, 32768.
#[test]
fn grad_scaler_follows_pytorchs_scale_sequence() {
    for dev in devices() {
        let w = leaf(1.0, &[5], DType::F32, &dev);
        let mut opt = Sgd::new(vec![w.clone()], 0.1).unwrap();
        let mut scaler = GradScaler::with_options(65536.0, 2.0, 0.5, 2, true).unwrap();
        let mut scales = Vec::new();
        let mut stepped = Vec::new();
        for i in 0..8 {
            opt.zero_grad(true).unwrap();
            let loss = scaler.scale(&w.sum_all().unwrap()).unwrap();
            loss.backward().unwrap();
            let g = w.grad().unwrap().to_vec::<f32>().unwrap();
            assert_eq!(
                g,
                vec![scaler.get_scale() as f32; 5],
                "{dev:?}: scaled gradient"
            );
            if [1, 4, 5].contains(&i) {
                let mut g = g;
                g[4] = if i == 4 { f32::NAN } else { f32::INFINITY };
                set_grad(&w, &g);
            }
            stepped.push(scaler.step(&mut opt).unwrap());
            scaler.update(None).unwrap();
            scales.push(scaler.get_scale());
        }
        assert_eq!(
            scales,
            [65536.0, 32768.0, 32768.0, 65536.0, 32768.0, 16384.0, 16384.0, 32768.0],
            "{dev:?}"
        );
        assert_eq!(
            stepped,
            [true, false, true, true, false, false, true, true],
            "{dev:?}"
        );
        // Five clean steps of lr 0.1 on unscaled gradients of 1.
        let w_now = w.to_vec::<f32>().unwrap();
        let want = (0..5).fold(1f32, |v, _| v - 0.1f32);
        assert!(w_now.iter().all(|v| (v - want).abs() < 1e-6), "{w_now:?}");
        assert_eq!(scaler.get_growth_tracker(), 0);
    }
}

#[test]
fn a_grown_scale_that_overflows_is_not_taken() {
    let dev = Device::cpu().unwrap();
    let w = leaf(0.0, &[1], DType::F32, &dev);
    let mut opt = Sgd::new(vec![w.clone()], 0.0).unwrap();
    let mut scaler = GradScaler::with_options(2f64.powi(127), 2.0, 0.5, 1, true).unwrap();
    scaler.scale(&w.sum_all().unwrap()).unwrap();
    set_grad(&w, &[1.0]);
    assert!(scaler.step(&mut opt).unwrap());
    scaler.update(None).unwrap();
    assert_eq!(scaler.get_scale(), 2f64.powi(127));
    assert_eq!(scaler.get_growth_tracker(), 0);
}

#[test]
fn a_skipped_step_leaves_parameters_and_adam_state_bit_identical() {
    for dev in devices() {
        dev.manual_seed(5);
        let lin = Linear::new(6, 3, true, &dev).unwrap();
        let mut opt = Adam::new(lin.parameters(), 1e-2).unwrap();
        let mut scaler = GradScaler::new();
        let x = randn(&[4, 6], &dev);
        let run = |opt: &mut Adam, scaler: &mut GradScaler, inject: bool| -> bool {
            opt.zero_grad(true).unwrap();
            let loss = lin
                .forward(&x)
                .unwrap()
                .square()
                .unwrap()
                .mean(&[], false)
                .unwrap();
            scaler.scale(&loss).unwrap().backward().unwrap();
            if inject {
                let g = lin.bias.as_ref().unwrap().grad().unwrap();
                let mut v = g.to_vec::<f32>().unwrap();
                v[1] = f32::NEG_INFINITY;
                set_grad(lin.bias.as_ref().unwrap(), &v);
            }
            let stepped = scaler.step(opt).unwrap();
            scaler.update(None).unwrap();
            stepped
        };
        assert!(run(&mut opt, &mut scaler, false));
        assert!(run(&mut opt, &mut scaler, false));
        let snapshot = |opt: &Adam| -> Vec<(String, Vec<u8>)> {
            let mut v: Vec<(String, Vec<u8>)> = lin
                .named_parameters()
                .into_iter()
                .chain(opt.state_tensors())
                .map(|(n, t)| (n, t.to_le_bytes().unwrap()))
                .collect();
            v.sort();
            v
        };
        let before = snapshot(&opt);
        assert!(
            !run(&mut opt, &mut scaler, true),
            "{dev:?}: the step is skipped"
        );
        assert_eq!(snapshot(&opt), before, "{dev:?}");
        assert_eq!(scaler.get_scale(), 32768.0);
        assert!(run(&mut opt, &mut scaler, false));
        assert_ne!(snapshot(&opt), before);
    }
}

/// A skipped first step creates no optimizer state and counts no step, so that the next step
/// is the first: SGD's momentum buffer starts as that step's gradient, Adam's step is 1.
/// Against the CPU.
#[test]
fn a_skipped_first_step_creates_no_state() {
    let cpu = Device::cpu().unwrap();
    for adam in [false, true] {
        let run = |dev: &Device| -> (Vec<(String, Vec<f64>)>, Vec<String>) {
            cpu.manual_seed(9);
            let lin = Linear::new(6, 4, true, &cpu).unwrap();
            let params: Vec<Tensor> = lin
                .parameters()
                .iter()
                .map(|p| {
                    p.detach()
                        .to_device(dev)
                        .unwrap()
                        .requires_grad_(true)
                        .unwrap()
                })
                .collect();
            let mut opt: Box<dyn Optimizer> = if adam {
                Box::new(Adam::new(params.clone(), 1e-2).unwrap())
            } else {
                Box::new(
                    Sgd::new(params.clone(), 0.1)
                        .unwrap()
                        .momentum(0.9)
                        .unwrap(),
                )
            };
            let mut scaler = GradScaler::new();
            let x = Tensor::from_slice(
                &(0..24).map(|i| i as f32 * 0.1 - 1.0).collect::<Vec<_>>(),
                &[4, 6],
                dev,
            )
            .unwrap();
            let mut after_skip = Vec::new();
            for inject in [true, false, false] {
                opt.zero_grad(true).unwrap();
                let y = x
                    .matmul(&params[0].t().unwrap())
                    .unwrap()
                    .add(&params[1])
                    .unwrap();
                let loss = y.square().unwrap().mean(&[], false).unwrap();
                scaler.scale(&loss).unwrap().backward().unwrap();
                if inject {
                    let mut v = params[1].grad().unwrap().to_vec::<f32>().unwrap();
                    v[2] = f32::INFINITY;
                    set_grad(&params[1], &v);
                }
                assert_eq!(scaler.step(opt.as_mut()).unwrap(), !inject, "{dev:?}");
                scaler.update(None).unwrap();
                if inject {
                    after_skip = opt.state_tensors().into_iter().map(|(n, _)| n).collect();
                }
            }
            let mut state: Vec<(String, Vec<f64>)> = opt
                .state_tensors()
                .into_iter()
                .map(|(n, t)| (n, t.to_f64_vec().unwrap()))
                .chain(
                    params
                        .iter()
                        .enumerate()
                        .map(|(i, p)| (format!("param {i}"), p.to_f64_vec().unwrap())),
                )
                .collect();
            state.sort_by(|a, b| a.0.cmp(&b.0));
            (state, after_skip)
        };
        let (want, skipped) = run(&cpu);
        assert!(
            skipped.is_empty(),
            "state after a skipped step on the CPU: {skipped:?}"
        );
        for dev in Device::all_gpus() {
            let (got, skipped) = run(&dev);
            assert!(
                skipped.is_empty(),
                "{dev:?}: state after a skipped step: {skipped:?}"
            );
            assert_eq!(got.len(), want.len(), "{dev:?}");
            for ((gn, g), (wn, w)) in got.iter().zip(&want) {
                assert_eq!(gn, wn);
                for (a, b) in g.iter().zip(w) {
                    assert!(
                        (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                        "{dev:?} adam {adam} {gn}: {a} vs {b}"
                    );
                }
            }
        }
    }
}

/// An f32's bits, every NaN as one: NVIDIA's GPUs return the canonical NaN from arithmetic on
/// a NaN (as CUDA's do, so PyTorch's unscaled NaN gradients are canonical there too), where the
/// CPU keeps the operand's payload.
fn bits(f: f32) -> u32 {
    if f.is_nan() {
        f32::NAN.to_bits()
    } else {
        f.to_bits()
    }
}

#[test]
fn on_device_unscale_matches_the_tensor_op_reference() {
    // Sizes for the vec4 kernel (8), the scalar one (7) and a single element.
    for n in [8usize, 7, 1] {
        let cpu = Device::cpu().unwrap();
        let values: Vec<f32> = (0..n).map(|i| (i as f32 - 3.3) * 1234.567).collect();
        for bad in [
            None,
            Some(f32::NAN),
            Some(f32::INFINITY),
            Some(f32::NEG_INFINITY),
        ] {
            let mut v = values.clone();
            if let Some(b) = bad {
                v[n - 1] = b;
            }
            let result = |dev: &Device| -> (Vec<u32>, bool) {
                let w = leaf(0.0, &[n], DType::F32, dev);
                let mut opt = Sgd::new(vec![w.clone()], 1.0).unwrap();
                let mut scaler = GradScaler::with_options(3.0, 2.0, 0.5, 100, true).unwrap();
                scaler.scale(&w.sum_all().unwrap()).unwrap();
                set_grad(&w, &v);
                scaler.unscale_(&opt).unwrap();
                let g = w.grad().unwrap().to_vec::<f32>().unwrap();
                let stepped = scaler.step(&mut opt).unwrap();
                (g.iter().map(|&f| bits(f)).collect(), stepped)
            };
            let want = result(&cpu);
            assert_eq!(want.1, bad.is_none());
            for dev in Device::all_gpus() {
                assert_eq!(result(&dev), want, "{dev:?} n={n} bad={bad:?}");
            }
        }
    }
}

/// Many gradients at once (ten, so two launches of the multi-gradient kernel, seven to a
/// launch, plus one of 7 elements on the single kernel), sizes over several workgroups: the
/// unscaled values bit for bit and the skip decision as on the CPU, with an inf or a NaN
/// placed in the first launch, in the second, deep in a large gradient, or nowhere.
#[test]
fn unscaling_many_gradients_matches_the_cpu() {
    let sizes = [8usize, 4100, 12, 7, 1024, 4, 2048 + 16, 40, 300, 65536];
    let cpu = Device::cpu().unwrap();
    for bad in [
        None,
        Some((1, 4099)),
        Some((8, 0)),
        Some((9, 60000)),
        Some((6, 5)),
    ] {
        let result = |dev: &Device| -> (Vec<Vec<u32>>, bool) {
            let params: Vec<Tensor> = sizes
                .iter()
                .map(|&n| leaf(0.0, &[n], DType::F32, dev))
                .collect();
            let mut opt = Sgd::new(params.clone(), 1.0).unwrap();
            let mut scaler = GradScaler::with_options(8.0, 2.0, 0.5, 100, true).unwrap();
            scaler.scale(&params[0].sum_all().unwrap()).unwrap();
            for (j, (p, &n)) in params.iter().zip(&sizes).enumerate() {
                let mut v: Vec<f32> = (0..n)
                    .map(|i| (i as f32 - 7.7) * (j as f32 + 0.3))
                    .collect();
                if let Some((bj, bi)) = bad {
                    if bj == j {
                        v[bi] = if bj % 2 == 0 { f32::NAN } else { f32::INFINITY };
                    }
                }
                set_grad(p, &v);
            }
            scaler.unscale_(&opt).unwrap();
            let grads = params
                .iter()
                .map(|p| {
                    let g = p.grad().unwrap().to_vec::<f32>().unwrap();
                    g.iter().map(|&f| bits(f)).collect()
                })
                .collect();
            (grads, scaler.step(&mut opt).unwrap())
        };
        let want = result(&cpu);
        assert_eq!(want.1, bad.is_none());
        for dev in Device::all_gpus() {
            let got = result(&dev);
            assert_eq!(got.1, want.1, "{dev:?} bad={bad:?}: stepped");
            for (j, (g, w)) in got.0.iter().zip(&want.0).enumerate() {
                assert!(g == w, "{dev:?} bad={bad:?}: gradient {j} differs");
            }
        }
    }
}

#[test]
fn grad_scaler_misuse_is_a_typed_error_and_disturbs_nothing() {
    for dev in devices() {
        let w = leaf(1.0, &[3], DType::F32, &dev);
        let mut opt = Sgd::new(vec![w.clone()], 0.5).unwrap();
        let mut scaler = GradScaler::new();
        set_grad(&w, &[1.0, 1.0, 1.0]);
        let err = scaler.step(&mut opt).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidArgument { op: "GradScaler.step", msg } if msg.contains("_scale is None")),
            "{err}"
        );
        assert_eq!(w.to_vec::<f32>().unwrap(), vec![1.0; 3], "no step taken");
        assert!(scaler.update(None).is_err());
        scaler.scale(&w.sum_all().unwrap()).unwrap();
        scaler.unscale_(&opt).unwrap();
        let err = scaler.unscale_(&opt).unwrap_err();
        assert!(err.to_string().contains("already been called"), "{err}");
        assert!(scaler.step(&mut opt).unwrap());
        assert!(scaler.step(&mut opt).is_err(), "step twice");
        scaler.update(None).unwrap();
        assert_eq!(scaler.get_growth_tracker(), 1);
        // f16 gradients are refused, as PyTorch's unscale_ refuses them.
        if has_f16(&dev) {
            let h = leaf(1.0, &[2], DType::F16, &dev);
            h.set_grad(Some(Tensor::ones(&[2], DType::F16, &dev).unwrap()))
                .unwrap();
            let mut opt16 = Sgd::new(vec![h.clone()], 0.5).unwrap();
            scaler.scale(&h.sum_all().unwrap()).unwrap();
            let err = scaler.step(&mut opt16).unwrap_err();
            assert!(matches!(
                err,
                Error::UnsupportedDType {
                    op: "GradScaler.unscale_",
                    ..
                }
            ));
            assert_eq!(h.to_f64_vec().unwrap(), vec![1.0; 2]);
        }
    }
}

#[test]
fn disabled_scaler_passes_through_and_state_dict_round_trips() {
    let dev = Device::cpu().unwrap();
    let w = leaf(1.0, &[2], DType::F32, &dev);
    let mut opt = Sgd::new(vec![w.clone()], 0.5).unwrap();
    let mut off = GradScaler::new().enabled(false);
    let loss = w.sum_all().unwrap();
    let scaled = off.scale(&loss).unwrap();
    assert!(scaled.shares_storage(&loss));
    scaled.backward().unwrap();
    assert!(off.step(&mut opt).unwrap());
    off.update(None).unwrap();
    assert_eq!(off.get_scale(), 1.0);
    assert!(off.state_dict().is_empty());
    assert_eq!(w.to_vec::<f32>().unwrap(), vec![0.5, 0.5]);

    let mut a = GradScaler::with_options(1024.0, 4.0, 0.25, 3, true).unwrap();
    a.scale(&loss).unwrap();
    set_grad(&w, &[1.0, 1.0]);
    a.step(&mut opt).unwrap();
    a.update(None).unwrap();
    let sd = a.state_dict();
    assert_eq!(sd["scale"], 1024.0);
    assert_eq!(sd["_growth_tracker"], 1.0);
    assert_eq!(sd["growth_interval"], 3.0);
    let mut b = GradScaler::new();
    b.load_state_dict(&sd).unwrap();
    assert_eq!(b.state_dict(), sd);
    assert!(GradScaler::new()
        .load_state_dict(&off.state_dict())
        .is_err());
    assert!(GradScaler::with_options(1.0, 0.5, 0.5, 1, true).is_err());
}

#[test]
fn clip_grad_norm_matches_its_definition() {
    for dev in devices() {
        let a = leaf(0.0, &[3], DType::F32, &dev);
        let b = leaf(0.0, &[2, 2], DType::F32, &dev);
        set_grad(&a, &[3.0, -4.0, 0.0]);
        set_grad(&b, &[0.0, 12.0, 0.0, 0.0]);
        // Total 2-norm sqrt(9 + 16 + 144) = 13; clipped to 6.5: factor 6.5 / (13 + 1e-6).
        let norm = clip_grad_norm_(&[a.clone(), b.clone()], 6.5, 2.0).unwrap();
        assert!((norm.item::<f32>().unwrap() - 13.0).abs() < 1e-5);
        let f = 6.5f32 / (13.0f32 + 1e-6);
        let ga = a.grad().unwrap().to_vec::<f32>().unwrap();
        assert!((ga[1] - (-4.0 * f)).abs() < 1e-5, "{dev:?} {ga:?}");
        // Under the limit: untouched (factor clamped to 1).
        let norm = clip_grad_norm_(&[a.clone(), b.clone()], 100.0, f64::INFINITY).unwrap();
        assert!((norm.item::<f32>().unwrap() - 12.0 * f).abs() < 1e-5);
        assert_eq!(a.grad().unwrap().to_vec::<f32>().unwrap(), ga);
        assert!(clip_grad_norm_(&[a], 1.0, -1.0).is_err());
    }
}

#[test]
fn fused_optimizers_update_f16_parameters_like_the_cpu_reference() {
    let cpu = Device::cpu().unwrap();
    let init: Vec<f32> = (0..64)
        .map(|i| ((i * 37) % 17) as f32 / 17.0 - 0.5)
        .collect();
    let grads: Vec<f32> = (0..64)
        .map(|i| ((i * 11) % 13) as f32 / 13.0 - 0.4)
        .collect();
    let run = |dev: &Device, adam: bool| -> Vec<f64> {
        let p = Tensor::from_slice(&init, &[64], dev)
            .unwrap()
            .to_dtype(DType::F16)
            .unwrap()
            .requires_grad_(true)
            .unwrap();
        let mut opt: Box<dyn Optimizer> = match adam {
            true => Box::new(Adam::new(vec![p.clone()], 1e-2).unwrap()),
            false => Box::new(
                Sgd::new(vec![p.clone()], 0.1)
                    .unwrap()
                    .momentum(0.9)
                    .unwrap(),
            ),
        };
        for _ in 0..3 {
            let g = Tensor::from_slice(&grads, &[64], dev)
                .unwrap()
                .to_dtype(DType::F16)
                .unwrap();
            p.set_grad(Some(g)).unwrap();
            opt.step().unwrap();
        }
        for (_, s) in opt.state_tensors() {
            if s.numel() == 64 {
                assert_eq!(s.dtype(), DType::F16, "state in the parameter's dtype");
            }
        }
        p.to_f64_vec().unwrap()
    };
    for adam in [false, true] {
        let want = run(&cpu, adam);
        for dev in Device::all_gpus().into_iter().filter(has_f16) {
            let got = run(&dev, adam);
            for (a, b) in got.iter().zip(&want) {
                // One f16 rounding of the state per step apart at most.
                assert!((a - b).abs() <= 4e-3, "{dev:?} adam={adam}: {a} vs {b}");
            }
        }
    }
}

/// Trains 784-128-10 on 4096 built-in glyphs for six epochs and returns the test accuracy.
fn train_accuracy(dev: &Device, amp: bool) -> f64 {
    use kiln::nn::{Relu, Sequential};
    let train = kiln::data::synthetic_glyphs(4096, 1);
    let test = kiln::data::synthetic_glyphs(512, 2);
    dev.manual_seed(0);
    let model = Sequential::new()
        .push(Linear::new(784, 128, true, dev).unwrap())
        .push(Relu)
        .push(Linear::new(128, 10, true, dev).unwrap());
    let mut opt = Sgd::new(model.parameters(), 0.05)
        .unwrap()
        .momentum(0.9)
        .unwrap();
    let mut scaler = GradScaler::new().enabled(amp);
    let dt = device_type(dev);
    let batch = |set: &kiln::data::ImageSet, idx: &[usize]| {
        let mut x = Vec::with_capacity(idx.len() * 784);
        for &i in idx {
            x.extend_from_slice(set.image(i));
        }
        let y: Vec<i32> = idx.iter().map(|&i| set.labels[i]).collect();
        (
            Tensor::from_slice(&x, &[idx.len(), 784], dev).unwrap(),
            Tensor::from_slice(&y, &[idx.len()], dev).unwrap(),
        )
    };
    for epoch in 0..6 {
        for s in 0..train.len() / 64 {
            // A different permutation per epoch (997 is prime to the set's 4096).
            let idx: Vec<usize> = (0..64)
                .map(|i| ((s * 64 + i) * 997 + epoch * 131) % train.len())
                .collect();
            let (x, y) = batch(&train, &idx);
            opt.zero_grad(true).unwrap();
            let loss = with_autocast(dt, DType::F16, amp, || {
                cross_entropy(&model.forward(&x)?, &y)
            })
            .unwrap()
            .unwrap();
            scaler.scale(&loss).unwrap().backward().unwrap();
            scaler.step(&mut opt).unwrap();
            scaler.update(None).unwrap();
        }
    }
    let idx: Vec<usize> = (0..test.len()).collect();
    let (x, y) = batch(&test, &idx);
    let correct = kiln::no_grad(|| {
        with_autocast(dt, DType::F16, amp, || {
            model
                .forward(&x)?
                .argmax(1, false)?
                .eq(&y)?
                .to_dtype(DType::F32)?
                .sum_all()
        })
    })
    .unwrap()
    .unwrap()
    .item::<f32>()
    .unwrap();
    correct as f64 / test.len() as f64
}

#[test]
fn amp_training_reaches_the_f32_runs_accuracy() {
    for dev in Device::all_gpus().into_iter().filter(has_f16).take(1) {
        let f32_acc = train_accuracy(&dev, false);
        let amp_acc = train_accuracy(&dev, true);
        println!("{dev:?}: test accuracy f32 {f32_acc}, AMP {amp_acc}");
        assert!(
            f32_acc > 0.5,
            "{dev:?}: the f32 run learns ({f32_acc}; chance is 0.1)"
        );
        assert!(
            amp_acc >= f32_acc - 0.02,
            "{dev:?}: AMP {amp_acc} vs f32 {f32_acc}"
        );
    }
}

/// Under autocast, an f32 plus an f16 tensor (a residual stream plus a block's output) adds in
/// one kernel that promotes as it reads, as PyTorch's add does: the sum equals the f32 add of
/// the f16 operand cast to f32, bit for bit, in either order; the node is `AddBackward0`; the
/// f16 operand's gradient is the f32 gradient rounded to f16; no cast kernel runs. A
/// broadcast pair still goes through the cast.
#[test]
fn autocast_adds_f32_and_f16_in_one_kernel() {
    let cpu = Device::cpu().unwrap();
    cpu.manual_seed(8);
    let x = randn(&[4, 6], &cpu);
    let y16 = randn(&[4, 6], &cpu).to_dtype(DType::F16).unwrap();
    let g = randn(&[4, 6], &cpu);
    let want = x.add(&y16.to_dtype(DType::F32).unwrap()).unwrap();
    let want = want.to_vec::<f32>().unwrap();
    let gw = g.to_vec::<f32>().unwrap();
    let g16 = g
        .to_dtype(DType::F16)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    let g16 = g16.to_vec::<f32>().unwrap();
    for dev in devices().into_iter().filter(|d| !d.is_cpu() && has_f16(d)) {
        for swapped in [false, true] {
            let a = x.to_device(&dev).unwrap().requires_grad_(true).unwrap();
            let b = y16.to_device(&dev).unwrap().requires_grad_(true).unwrap();
            let mut sum = None;
            let trace = kernel_trace(&dev, || {
                let _region = autocast(DeviceType::Gpu, DType::F16, true)?;
                sum = Some(if swapped { b.add(&a)? } else { a.add(&b)? });
                Ok(())
            });
            let sum = sum.unwrap();
            assert!(
                trace.contains("binary_add_f32_f16_vec4"),
                "{dev:?}: {trace}"
            );
            assert!(!trace.contains("cast_f16_f32"), "{dev:?}: {trace}");
            assert_eq!(sum.dtype(), DType::F32);
            assert_eq!(sum.grad_fn_name(), Some("AddBackward0"));
            assert_eq!(
                sum.to_vec::<f32>().unwrap(),
                want,
                "{dev:?} swapped {swapped}"
            );
            sum.backward_with(&g.to_device(&dev).unwrap(), false)
                .unwrap();
            assert_eq!(a.grad().unwrap().to_vec::<f32>().unwrap(), gw);
            let gb = b.grad().unwrap();
            assert_eq!(gb.dtype(), DType::F16);
            assert_eq!(
                gb.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(),
                g16
            );
        }
        let row = y16.narrow(0, 0, 1).unwrap().to_device(&dev).unwrap();
        let _region = autocast(DeviceType::Gpu, DType::F16, true).unwrap();
        let s = x.to_device(&dev).unwrap().add(&row).unwrap();
        assert_eq!(s.dtype(), DType::F32);
        assert_eq!(s.grad_fn_name(), None);
    }
}
