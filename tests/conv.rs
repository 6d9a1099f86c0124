//! conv2d and pooling on every adapter against the CPU device, with PyTorch's output sizes,
//! a hand-checked case, and the errors for shapes that do not fit.

use kiln::ops::{avg_pool2d, conv2d, max_pool2d, Conv2dParams};
use kiln::{DType, Device, Tensor};

fn gpus() -> Vec<Device> {
    let d = kiln::device::test_devices().expect("KILN_REQUIRE_GPU=1 and no GPU adapter");
    d.into_iter().filter(|d| !d.is_cpu()).collect()
}

fn values(n: usize, seed: u64) -> Vec<f64> {
    (0..n)
        .map(|i| (((i as u64 + 1) * (seed * 2654435761 + 97)) % 1000) as f64 / 500.0 - 1.0)
        .collect()
}

fn close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}: element {i}: {g} vs {w}"
        );
    }
}

#[test]
fn conv2d_matches_the_cpu_and_pytorch() {
    let cpu = Device::cpu().unwrap();
    // torch.nn.functional.conv2d(torch.arange(16.).view(1,1,4,4), torch.ones(1,1,2,2)) ->
    // [[10, 14, 18], [26, 30, 34], [42, 46, 50]]
    for dev in gpus().into_iter().chain([cpu.clone()]) {
        let x = Tensor::arange(0.0, 16.0, 1.0, DType::F32, &dev)
            .unwrap()
            .view(&[1, 1, 4, 4])
            .unwrap();
        let w = Tensor::ones(&[1, 1, 2, 2], DType::F32, &dev).unwrap();
        let y = conv2d(&x, &w, None, Conv2dParams::default()).unwrap();
        assert_eq!(y.shape(), &[1, 1, 3, 3]);
        assert_eq!(
            y.to_vec::<f32>().unwrap(),
            vec![10.0, 14.0, 18.0, 26.0, 30.0, 34.0, 42.0, 46.0, 50.0]
        );
    }
    let cases = [
        ([2, 4, 9, 7], [6, 4, 3, 3], Conv2dParams::default(), true),
        (
            [1, 4, 9, 7],
            [6, 2, 3, 2],
            Conv2dParams {
                stride: (2, 1),
                padding: (1, 2),
                dilation: (1, 2),
                groups: 2,
            },
            true,
        ),
        (
            [3, 3, 8, 8],
            [5, 3, 1, 1],
            Conv2dParams {
                stride: (3, 3),
                ..Default::default()
            },
            false,
        ),
    ];
    for dev in gpus() {
        let mut dtypes = vec![(DType::F32, 1e-5)];
        if dev.adapter_info().is_some_and(|a| a.features.shader_f16) {
            dtypes.push((DType::F16, 2e-2));
        }
        for (dtype, tol) in dtypes {
            for (i, (xs, ws, p, bias)) in cases.iter().enumerate() {
                let (nx, nw) = (xs.iter().product(), ws.iter().product());
                let run = |d: &Device| {
                    let x =
                        Tensor::from_f64_slice(&values(nx, i as u64 + 1), xs, dtype, d).unwrap();
                    let w =
                        Tensor::from_f64_slice(&values(nw, i as u64 + 7), ws, dtype, d).unwrap();
                    let b = Tensor::from_f64_slice(&values(ws[0], 3), &[ws[0]], dtype, d).unwrap();
                    conv2d(&x, &w, bias.then_some(&b), *p).unwrap()
                };
                let (got, want) = (run(&dev), run(&cpu));
                assert_eq!(got.shape(), want.shape());
                close(
                    &got.to_f64_vec().unwrap(),
                    &want.to_f64_vec().unwrap(),
                    tol,
                    &format!("{dev:?} {dtype} case {i}"),
                );
            }
        }
        let x = Tensor::zeros(&[1, 3, 4, 4], DType::F32, &dev).unwrap();
        let w = Tensor::zeros(&[2, 2, 3, 3], DType::F32, &dev).unwrap();
        assert!(
            conv2d(&x, &w, None, Conv2dParams::default()).is_err(),
            "channels do not fit"
        );
        let big = Tensor::zeros(&[2, 3, 5, 5], DType::F32, &dev).unwrap();
        assert!(
            conv2d(&x, &big, None, Conv2dParams::default()).is_err(),
            "kernel larger than input"
        );
    }
}

#[test]
fn pooling_matches_the_cpu_and_pytorch() {
    let cpu = Device::cpu().unwrap();
    for dev in gpus().into_iter().chain([cpu.clone()]) {
        // F.max_pool2d(torch.arange(16.).view(1,1,4,4), 2) -> [[5, 7], [13, 15]]; avg -> [[2.5, 4.5], [10.5, 12.5]]
        let x = Tensor::arange(0.0, 16.0, 1.0, DType::F32, &dev)
            .unwrap()
            .view(&[1, 1, 4, 4])
            .unwrap();
        assert_eq!(
            max_pool2d(&x, (2, 2), (2, 2), (0, 0))
                .unwrap()
                .to_vec::<f32>()
                .unwrap(),
            vec![5.0, 7.0, 13.0, 15.0]
        );
        assert_eq!(
            avg_pool2d(&x, (2, 2), (2, 2), (0, 0))
                .unwrap()
                .to_vec::<f32>()
                .unwrap(),
            vec![2.5, 4.5, 10.5, 12.5]
        );
        assert!(
            max_pool2d(&x, (2, 2), (2, 2), (2, 2)).is_err(),
            "padding over half the kernel"
        );
    }
    // Forward and input gradient against the CPU: windows that overlap (ResNet's 3x3 stride 2
    // padded max pool), a rectangular one, strided averages, a non-contiguous input, the
    // output's gradient at an offset, and ties (integer values: the first maximum in
    // row-major order takes the gradient).
    // (max, kernel, stride, padding, ties)
    type Pair = (usize, usize);
    let cases: [(bool, Pair, Pair, Pair, bool); 5] = [
        (true, (3, 2), (2, 2), (1, 1), false),
        (true, (3, 3), (2, 2), (1, 1), false),
        (true, (3, 3), (2, 2), (1, 1), true),
        (false, (3, 3), (1, 2), (1, 0), false),
        (false, (2, 2), (2, 2), (0, 0), true),
    ];
    for dev in gpus() {
        for (i, &(is_max, k, st, pad, ties)) in cases.iter().enumerate() {
            let run = |d: &Device| {
                let n = 2 * 3 * 11 * 9;
                let v: Vec<f64> = match ties {
                    true => (0..n).map(|j| ((j * 7) % 3) as f64).collect(),
                    false => values(n, 5),
                };
                let x = Tensor::from_f64_slice(&v, &[2, 3, 11, 9], DType::F32, d).unwrap();
                // A non-contiguous input.
                let x = x.transpose(2, 3).unwrap().requires_grad_(true).unwrap();
                let y = if is_max {
                    max_pool2d(&x, k, st, pad).unwrap()
                } else {
                    avg_pool2d(&x, k, st, pad).unwrap()
                };
                // The output's gradient from an offset (the second of two stacked batches).
                let mut shape = y.shape().to_vec();
                shape[0] *= 2;
                let n = shape.iter().product();
                let gy = Tensor::from_f64_slice(&values(n, 9), &shape, DType::F32, d)
                    .unwrap()
                    .narrow(0, y.shape()[0], y.shape()[0])
                    .unwrap();
                y.backward_with(&gy, false).unwrap();
                [y.detach(), x.grad().unwrap()]
            };
            let (got, want) = (run(&dev), run(&cpu));
            for j in 0..2 {
                assert_eq!(got[j].shape(), want[j].shape());
                close(
                    &got[j].to_f64_vec().unwrap(),
                    &want[j].to_f64_vec().unwrap(),
                    1e-6,
                    &format!("{dev:?} case {i} max {is_max} {}", ["output", "grad"][j]),
                );
            }
        }
    }
}

/// The implicit-GEMM convolution (taken for groups of 8 or more channels on Vulkan) against
/// the CPU device: output and all three gradients, aligned (channels per group a multiple of
/// 16) and ragged channels, strides, padding, dilation, groups, 1x1, more rows than one tile,
/// a non-contiguous input, a wgrad whose pixels are split, and f16 where the adapter has it.
/// f32 cases of one group with channels multiples of 4 take the weight's gradient from NHWC
/// copies on vec4 loads (`WgradVec4`, or `PointwiseWgrad` from NCHW for a 1x1); the others
/// (10, 9 and 3 input channels, groups) the scalar NCHW gather.
#[test]
fn conv2d_gemm_forward_and_gradients_match_the_cpu() {
    let cpu = Device::cpu().unwrap();
    let p = |s: usize, pad: usize, d: usize, g: usize| Conv2dParams {
        stride: (s, s),
        padding: (pad, pad),
        dilation: (d, d),
        groups: g,
    };
    // (input, weight, params, transposed input)
    let cases: Vec<([usize; 4], [usize; 4], Conv2dParams, bool)> = vec![
        ([2, 16, 9, 7], [32, 16, 3, 3], p(1, 1, 1, 1), false),
        ([2, 10, 9, 11], [12, 10, 3, 3], p(2, 1, 1, 1), false),
        ([1, 32, 12, 12], [144, 16, 3, 3], p(1, 2, 2, 2), false),
        ([3, 24, 8, 8], [40, 24, 1, 1], p(2, 0, 1, 1), true),
        ([1, 9, 15, 13], [16, 9, 5, 3], p(1, 2, 1, 1), false),
        ([4, 16, 20, 20], [16, 16, 3, 3], p(1, 1, 1, 1), false),
        ([1, 16, 6, 6], [160, 16, 3, 3], p(1, 1, 1, 1), false),
        ([2, 3, 23, 21], [16, 3, 7, 7], p(2, 3, 1, 1), false),
        // 32 channels, one group: the f32 forward pass from an NHWC copy (vec4 loads), strided
        // and dilated, from a transposed view.
        ([2, 32, 11, 10], [24, 32, 3, 3], p(2, 1, 2, 1), true),
        // Stride 1, 16 output channels: the input's gradient as the forward pass of the
        // output's gradient with the rotated kernel (dilated; no padding), and a 1x1 padded
        // by more than the kernel reaches (the inverse-window kernel instead).
        ([2, 16, 10, 9], [32, 16, 3, 3], p(1, 2, 2, 1), false),
        ([1, 16, 8, 8], [16, 16, 3, 3], p(1, 0, 1, 1), false),
        ([1, 16, 5, 5], [16, 16, 1, 1], p(1, 1, 1, 1), false),
        // Strided, 16 output channels, no dilation: the input's gradient phase by phase (each
        // residue of the row and column mod the stride a stride-1 pass with a sub-kernel):
        // ResNet's 3x3 stride 2 at odd sizes; a 1x1 at stride 2 (phases that receive no tap
        // stay zero) from a transposed view; stride 3 with a 5x4 kernel; and a 1x1 at stride
        // 2 padded by 1 (a phase would need a negative padding: the inverse-window kernel).
        ([2, 24, 11, 10], [32, 24, 3, 3], p(2, 1, 1, 1), false),
        ([2, 16, 9, 8], [16, 16, 1, 1], p(2, 0, 1, 1), true),
        ([1, 8, 13, 12], [32, 8, 5, 4], p(3, 1, 1, 1), false),
        ([1, 16, 6, 6], [16, 16, 1, 1], p(2, 1, 1, 1), false),
        // Pointwise (1x1, stride 1, no padding; channels of 16, pixels per image of 4): all
        // three products straight from NCHW on vec4 loads, with more output channels than one
        // tile and a wgrad whose pixels are split; from a transposed view (the weight's
        // gradient then from NHWC copies); and 9 pixels per image (the NHWC kernels instead).
        ([2, 16, 4, 5], [144, 16, 1, 1], p(1, 0, 1, 1), false),
        ([4, 32, 20, 20], [48, 32, 1, 1], p(1, 0, 1, 1), false),
        ([3, 16, 8, 4], [32, 16, 1, 1], p(1, 0, 1, 1), true),
        ([2, 16, 3, 3], [16, 16, 1, 1], p(1, 0, 1, 1), false),
        // The f16 weight gradient's tiles on tensor cores (`CoopTile::for_wgrad`, the least
        // padding): 128 output channels by 128 columns (taps times input channels) take the
        // 128x128 tile, by 64 the 128x64, 64 by 128 the 64x128; most cases above the 64x64.
        ([2, 16, 6, 6], [128, 16, 2, 4], p(1, 0, 1, 1), false),
        ([2, 8, 6, 6], [128, 8, 2, 4], p(1, 0, 1, 1), false),
        ([2, 16, 6, 6], [64, 16, 2, 4], p(1, 0, 1, 1), false),
    ];
    for dev in gpus() {
        let mut dtypes = vec![(DType::F32, 1e-4)];
        if dev.adapter_info().is_some_and(|a| a.features.shader_f16) {
            dtypes.push((DType::F16, 3e-2));
        }
        for (dtype, tol) in dtypes {
            for (i, (xs, ws, p, transposed)) in cases.iter().enumerate() {
                let (nx, nw) = (xs.iter().product(), ws.iter().product());
                let run = |d: &Device| {
                    let x = if *transposed {
                        // Stored [n, c, w, h], read through a transposing view.
                        let s = [xs[0], xs[1], xs[3], xs[2]];
                        Tensor::from_f64_slice(&values(nx, i as u64 + 1), &s, dtype, d)
                            .unwrap()
                            .transpose(2, 3)
                            .unwrap()
                    } else {
                        Tensor::from_f64_slice(&values(nx, i as u64 + 1), xs, dtype, d).unwrap()
                    };
                    let x = x.requires_grad_(true).unwrap();
                    let w = Tensor::from_f64_slice(&values(nw, i as u64 + 7), ws, dtype, d)
                        .unwrap()
                        .requires_grad_(true)
                        .unwrap();
                    let b = Tensor::from_f64_slice(&values(ws[0], 3), &[ws[0]], dtype, d)
                        .unwrap()
                        .requires_grad_(true)
                        .unwrap();
                    let y = conv2d(&x, &w, Some(&b), *p).unwrap();
                    let gy = Tensor::from_f64_slice(&values(y.numel(), 11), y.shape(), dtype, d)
                        .unwrap();
                    y.backward_with(&gy, false).unwrap();
                    [
                        y.detach(),
                        x.grad().unwrap(),
                        w.grad().unwrap(),
                        b.grad().unwrap(),
                    ]
                };
                let (got, want) = (run(&dev), run(&cpu));
                for (j, what) in ["output", "grad input", "grad weight", "grad bias"]
                    .iter()
                    .enumerate()
                {
                    assert_eq!(got[j].shape(), want[j].shape(), "{what}");
                    assert_eq!(got[j].dtype(), dtype, "{what}");
                    // Sums over many pixels: the tolerance scales with the reduction's length.
                    let scale = if j >= 2 {
                        1.0 + (xs[0] * xs[2]) as f64 / 16.0
                    } else {
                        1.0
                    };
                    close(
                        &got[j].to_f64_vec().unwrap(),
                        &want[j].to_f64_vec().unwrap(),
                        tol * scale,
                        &format!("{dev:?} {dtype} case {i} {what}"),
                    );
                }
            }
        }
    }
}

/// The f16 convolution on tensor cores (taken where the adapter has cooperative matrices, one
/// group, channels in whole tiles; elsewhere these run on the SIMT kernels) against the CPU
/// device in f16: output and all three gradients. The input's gradient at stride 1 (3x3,
/// dilated, 1x1) as the rotated forward pass, strided (3x3 at an odd size, a 1x1 whose odd
/// rows and columns receive nothing) phase by phase; the weight's gradient with 64 and 128
/// output channels (tiles of 64 and 128 rows), taps x channels padded to whole tiles, pixels
/// split over several partials, the last one short, and a stem's three input channels padded
/// to eight.
#[test]
fn f16_convolution_gradients_on_tensor_cores_match_the_cpu() {
    let cpu = Device::cpu().unwrap();
    let p = |s: usize, pad: usize, d: usize| Conv2dParams {
        stride: (s, s),
        padding: (pad, pad),
        dilation: (d, d),
        groups: 1,
    };
    let cases: [([usize; 4], [usize; 4], Conv2dParams); 8] = [
        ([2, 64, 10, 10], [64, 64, 3, 3], p(1, 1, 1)),
        ([2, 64, 9, 9], [128, 64, 1, 1], p(2, 0, 1)),
        ([2, 128, 9, 9], [128, 128, 3, 3], p(2, 1, 1)),
        ([3, 64, 8, 8], [256, 64, 1, 1], p(1, 0, 1)),
        ([1, 64, 12, 12], [64, 64, 3, 3], p(1, 2, 2)),
        ([4, 64, 16, 16], [64, 64, 3, 3], p(1, 1, 1)),
        ([3, 64, 15, 15], [128, 64, 3, 3], p(1, 1, 1)),
        // A stem: three input channels, padded to eight for the weight's gradient.
        ([2, 3, 20, 20], [64, 3, 7, 7], p(2, 3, 1)),
    ];
    for dev in gpus() {
        if !dev.adapter_info().is_some_and(|a| a.features.shader_f16) {
            continue;
        }
        // Without cooperative matrices (lavapipe in CI) the SIMT kernels take these shapes,
        // which the test above covers: two cases, to keep the CPU reference's time short.
        let coop = dev
            .adapter_info()
            .is_some_and(|a| a.features.cooperative_matrix);
        let count = if coop { cases.len() } else { 2 };
        for (i, (xs, ws, p)) in cases.iter().enumerate().take(count) {
            let (nx, nw) = (xs.iter().product(), ws.iter().product());
            let run = |d: &Device| {
                let t = |n: usize, seed: u64, shape: &[usize]| {
                    Tensor::from_f64_slice(&values(n, seed), shape, DType::F16, d).unwrap()
                };
                let x = t(nx, i as u64 + 1, xs).requires_grad_(true).unwrap();
                let w = t(nw, i as u64 + 7, ws).requires_grad_(true).unwrap();
                let b = t(ws[0], 3, &[ws[0]]).requires_grad_(true).unwrap();
                let y = conv2d(&x, &w, Some(&b), *p).unwrap();
                y.backward_with(&t(y.numel(), 11, y.shape()), false)
                    .unwrap();
                [y.detach(), x.grad().unwrap(), w.grad().unwrap()]
            };
            let (got, want) = (run(&dev), run(&cpu));
            for (j, what) in ["output", "grad input", "grad weight"].iter().enumerate() {
                assert_eq!(got[j].shape(), want[j].shape(), "{what}");
                assert_eq!(got[j].dtype(), DType::F16, "{what}");
                // Sums over many values in f16: the tolerance grows with the sum's length.
                let terms = match j {
                    2 => xs[0] * xs[2] * xs[3],
                    _ => ws[1] * ws[2] * ws[3],
                };
                close(
                    &got[j].to_f64_vec().unwrap(),
                    &want[j].to_f64_vec().unwrap(),
                    2e-3 * (terms as f64).sqrt(),
                    &format!("{dev:?} case {i} {what}"),
                );
            }
        }
    }
}
