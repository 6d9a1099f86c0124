//! The fused layer norm (`ops::layer_norm`, `nn::LayerNorm`) on every adapter against the CPU
//! device's composite formula: the output and the gradients of x, weight and bias, for rows of
//! vec4s and of odd lengths, several normalised dims, many row chunks, strided inputs, f16,
//! rows whose mean dwarfs their spread, autocast, and PyTorch's errors with the allocator left
//! intact.

use kiln::amp::{autocast, DeviceType};
use kiln::nn::{LayerNorm, Module};
use kiln::ops::layer_norm;
use kiln::{DType, Device, Error, Tensor};

fn devices() -> Vec<Device> {
    kiln::device::test_devices().expect("KILN_REQUIRE_GPU=1 and no GPU adapter")
}

/// Deterministic values in [-1, 1) from a seed (an LCG), the same on every device.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn tensor(shape: &[usize], seed: u64, dev: &Device) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_slice(&values(n, seed), shape, dev).unwrap()
}

fn host(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap()
}

fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs() / (1.0 + b.abs()))
        .fold(0.0f32, f32::max);
    assert!(
        worst <= tol && got.iter().all(|v| v.is_finite()),
        "{what}: worst relative error {worst} > {tol}"
    );
}

/// y and the gradients of x, weight and bias (when given) of `sum(y * r)` for a fixed `r`.
fn run(
    x: &Tensor,
    normalized: &[usize],
    affine: (bool, bool),
    dtype: DType,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let dev = x.device();
    let x = x.to_dtype(dtype).unwrap().requires_grad_(true).unwrap();
    let param = |seed| {
        let t = tensor(normalized, seed, dev).add_scalar(1.0).unwrap();
        t.to_dtype(dtype).unwrap().requires_grad_(true).unwrap()
    };
    let w = affine.0.then(|| param(7));
    let b = affine.1.then(|| param(8));
    let y = layer_norm(&x, normalized, w.as_ref(), b.as_ref(), 1e-5).unwrap();
    // GPUs take the fused kernels (PyTorch's node name); the CPU device the composite.
    let fused = y.grad_fn_name() == Some("NativeLayerNormBackward0");
    assert_eq!(fused, !dev.is_cpu(), "{dev:?}");
    let r = tensor(x.shape(), 9, dev).to_dtype(dtype).unwrap();
    y.mul(&r).unwrap().sum_all().unwrap().backward().unwrap();
    let mut grads = vec![host(&x.grad().unwrap())];
    grads.extend(w.iter().chain(&b).map(|t| host(&t.grad().unwrap())));
    (host(&y), grads)
}

#[test]
fn fused_kernels_match_the_cpu_composite() {
    let cpu = Device::cpu().unwrap();
    // (shape, normalised dims): vec4 rows, odd rows, two normalised dims, rows longer than a
    // workgroup's vec4s, and more rows than one weight-gradient chunk.
    let cases: [(&[usize], &[usize]); 5] = [
        (&[4, 3, 8], &[8]),
        (&[5, 7], &[7]),
        (&[3, 2, 6], &[2, 6]),
        (&[3, 1000], &[1000]),
        (&[130, 12], &[12]),
    ];
    // Both kernel forms on every adapter: a workgroup per row (GPUs) and a row per invocation
    // (CPU adapters).
    for (form, serial) in [("tree", false), ("serial", true)] {
        kiln::ops::force_layer_norm_serial(Some(serial));
        for dev in devices() {
            for (shape, normalized) in cases {
                for affine in [(true, true), (true, false), (false, false)] {
                    let x = tensor(shape, 3, &cpu).mul_scalar(2.0).unwrap();
                    let want = run(&x, normalized, affine, DType::F32);
                    let got = run(&x.to_device(&dev).unwrap(), normalized, affine, DType::F32);
                    let what = format!("{form} {dev:?} {shape:?} {affine:?}");
                    assert_close(&format!("{what} y"), &got.0, &want.0, 1e-5);
                    for (i, (g, w)) in got.1.iter().zip(&want.1).enumerate() {
                        assert_close(&format!("{what} grad {i}"), g, w, 1e-4);
                    }
                }
            }
        }
    }
    kiln::ops::force_layer_norm_serial(None);
}

#[test]
fn strided_f16_and_large_mean_rows() {
    let cpu = Device::cpu().unwrap();
    for dev in devices() {
        // A transposed input: read through a copy, gradients in the input's layout.
        let xs = tensor(&[16, 6], 4, &dev);
        let xt = xs.t().unwrap().requires_grad_(true).unwrap();
        let y = layer_norm(&xt, &[16], None, None, 1e-5).unwrap();
        let y_ref = layer_norm(
            &xs.t().unwrap().to_device(&cpu).unwrap(),
            &[16],
            None,
            None,
            1e-5,
        )
        .unwrap();
        assert_close(&format!("{dev:?} strided"), &host(&y), &host(&y_ref), 1e-5);
        y.sum_all().unwrap().backward().unwrap();
        assert_eq!(xt.grad().unwrap().shape(), &[6, 16]);

        // Rows whose mean is 1000 times their spread: the shifted sums keep the variance.
        let big = tensor(&[4, 64], 5, &cpu).add_scalar(1000.0).unwrap();
        let want = layer_norm(&big.to_dtype(DType::F64).unwrap(), &[64], None, None, 1e-5).unwrap();
        let got = layer_norm(&big.to_device(&dev).unwrap(), &[64], None, None, 1e-5).unwrap();
        assert_close(
            &format!("{dev:?} mean 1000"),
            &host(&got),
            &host(&want),
            2e-3,
        );

        // f16 storage against f32 (f32 arithmetic in both).
        if Tensor::zeros(&[1], DType::F16, &dev).is_ok() && !dev.is_cpu() {
            let x = tensor(&[8, 64], 6, &dev);
            let (y32, g32) = run(&x, &[64], (true, true), DType::F32);
            let (y16, g16) = run(&x, &[64], (true, true), DType::F16);
            assert_close(&format!("{dev:?} f16 y"), &y16, &y32, 5e-3);
            for (i, (a, b)) in g16.iter().zip(&g32).enumerate() {
                assert_close(&format!("{dev:?} f16 grad {i}"), a, b, 2e-2);
            }
        }
    }
}

#[test]
fn layer_norm_runs_in_f32_under_autocast() {
    for dev in devices() {
        if dev.is_cpu() || Tensor::zeros(&[1], DType::F16, &dev).is_err() {
            continue;
        }
        let ln = LayerNorm::new(32, &dev).unwrap();
        let x = tensor(&[4, 32], 2, &dev).to_dtype(DType::F16).unwrap();
        let _region = autocast(DeviceType::Gpu, DType::F16, true).unwrap();
        let y = ln.forward(&x).unwrap();
        assert_eq!(y.dtype(), DType::F32, "{dev:?}");
        let plain = layer_norm(&x.to_dtype(DType::F32).unwrap(), &[32], None, None, 1e-5);
        assert_close(&format!("{dev:?}"), &host(&y), &host(&plain.unwrap()), 1e-5);
    }
}

#[test]
fn bad_inputs_get_typed_errors_and_leave_the_device_intact() {
    let cpu = Device::cpu().unwrap();
    for dev in devices() {
        let x = tensor(&[2, 3], 1, &dev);
        let w4 = Tensor::ones(&[4], DType::F32, &dev).unwrap();
        let w3 = Tensor::ones(&[3], DType::F32, &dev).unwrap();
        let ids = Tensor::zeros(&[2, 3], DType::I32, &dev).unwrap();
        let before = dev.memory_allocated();
        let shape = |r: kiln::Result<Tensor>, what: &str| match r {
            Err(Error::ShapeMismatch { op, .. }) => assert_eq!(op, "layer_norm", "{what}"),
            other => panic!("{dev:?} {what}: {other:?}"),
        };
        shape(layer_norm(&x, &[4], None, None, 1e-5), "input");
        shape(layer_norm(&x, &[2, 2], None, None, 1e-5), "two dims");
        shape(layer_norm(&x, &[3], Some(&w4), None, 1e-5), "weight");
        shape(layer_norm(&x, &[3], Some(&w3), Some(&w4), 1e-5), "bias");
        assert!(matches!(
            layer_norm(&ids, &[3], None, None, 1e-5),
            Err(Error::UnsupportedDType {
                op: "layer_norm",
                ..
            })
        ));
        assert!(matches!(
            layer_norm(&x, &[], None, None, 1e-5),
            Err(Error::InvalidArgument {
                op: "layer_norm",
                ..
            })
        ));
        if !dev.is_cpu() {
            let w_cpu = Tensor::ones(&[3], DType::F32, &cpu).unwrap();
            assert!(matches!(
                layer_norm(&x, &[3], Some(&w_cpu), None, 1e-5),
                Err(Error::DeviceMismatch {
                    op: "layer_norm",
                    ..
                })
            ));
        }
        assert_eq!(dev.memory_allocated(), before, "{dev:?}");
        // The device still works.
        let y = layer_norm(&x, &[3], Some(&w3), None, 1e-5).unwrap();
        assert!(host(&y).iter().all(|v| v.is_finite()));
    }
}
