//! Every op on every adapter against the CPU device, on random inputs: contiguous, transposed,
//! sliced, broadcast, empty and odd-sized; f32 everywhere and f16 where the adapter has it.
//! Tolerances: f32 1e-5 relative + 1e-5 absolute (1e-4 for transcendental ops: the GPU's exp,
//! log, erf approximations); f16 1e-2 (half precision).

use kiln::ops::{BinaryOp, UnaryOp};
use kiln::{DType, Device, Tensor};

fn gpus() -> Vec<Device> {
    let d = kiln::device::test_devices().expect("KILN_REQUIRE_GPU=1 and no GPU adapter");
    d.into_iter().filter(|d| !d.is_cpu()).collect()
}

/// Deterministic values in [lo, hi).
fn random(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f64> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            lo + (hi - lo) * ((s >> 11) as f64 / (1u64 << 53) as f64)
        })
        .collect()
}

fn close(got: &[f64], want: &[f64], rtol: f64, atol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || (g == w) || (g - w).abs() <= atol + rtol * w.abs();
        assert!(ok, "{what}: element {i}: got {g}, want {w}");
    }
}

/// A family of views of the same values on `dev`: (name, tensor).
fn views(values: &[f64], dtype: DType, dev: &Device) -> Vec<(String, Tensor)> {
    let base = Tensor::from_f64_slice(values, &[6, 36], dtype, dev).unwrap();
    vec![
        ("contiguous [6,36] (vec4 path)".into(), base.clone()),
        (
            "contiguous offset by 1 [215]".into(),
            base.reshape(&[-1]).unwrap().narrow(0, 1, 215).unwrap(),
        ),
        ("transposed [36,6]".into(), base.t().unwrap()),
        ("narrowed [6,17]".into(), base.narrow(1, 5, 17).unwrap()),
        (
            "permuted 3-d".into(),
            base.reshape(&[6, 6, 6])
                .unwrap()
                .permute(&[2, 0, 1])
                .unwrap(),
        ),
        (
            "column broadcast [6,35]".into(),
            base.narrow(1, 3, 1).unwrap().expand(&[6, 36]).unwrap(),
        ),
        ("empty [6,0]".into(), base.narrow(1, 0, 0).unwrap()),
        (
            "odd [1,7]".into(),
            base.narrow(0, 2, 1).unwrap().narrow(1, 1, 7).unwrap(),
        ),
        // Rows of whole vec4s, unit-stride inside (the strided vec4 path): a narrowed view
        // at an offset of 4, and a head transpose as attention's [B, H, T, D] -> [B, T, H, D].
        (
            "narrowed [6,24] (strided vec4)".into(),
            base.narrow(1, 4, 24).unwrap(),
        ),
        (
            "permuted rows [3,6,12] (strided vec4)".into(),
            base.reshape(&[6, 3, 12])
                .unwrap()
                .permute(&[1, 0, 2])
                .unwrap(),
        ),
    ]
}

fn dtypes(dev: &Device) -> Vec<(DType, f64, f64)> {
    let mut v = vec![(DType::F32, 1e-5, 1e-5)];
    if dev.adapter_info().is_some_and(|a| a.features.shader_f16) {
        v.push((DType::F16, 1e-2, 1e-2));
    }
    v
}

fn domain(op: UnaryOp) -> (f64, f64) {
    match op {
        UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Reciprocal => (0.1, 4.0),
        _ => (-4.0, 4.0),
    }
}

#[test]
fn unary_ops_match_the_cpu() {
    let cpu = Device::cpu().unwrap();
    for dev in gpus() {
        for (dtype, rtol, atol) in dtypes(&dev) {
            for op in UnaryOp::ALL {
                let (lo, hi) = domain(op);
                let values = random(216, op as u64, lo, hi);
                let tol = if dtype == DType::F32
                    && !matches!(
                        op,
                        UnaryOp::Identity
                            | UnaryOp::Neg
                            | UnaryOp::Abs
                            | UnaryOp::Square
                            | UnaryOp::Relu
                    ) {
                    1e-4
                } else {
                    rtol
                };
                for ((name, g), (_, c)) in views(&values, dtype, &dev)
                    .into_iter()
                    .zip(views(&values, dtype, &cpu))
                {
                    let got = kiln::ops::unary(&g, op).unwrap();
                    let want = kiln::ops::unary(&c, op).unwrap();
                    assert_eq!(got.shape(), want.shape());
                    close(
                        &got.to_f64_vec().unwrap(),
                        &want.to_f64_vec().unwrap(),
                        tol,
                        atol.max(tol),
                        &format!("{dev:?} {dtype} {} {name}", op.name()),
                    );
                }
            }
        }
    }
}

/// gelu(approximate="tanh") and its gradient far out in both tails, where the kernels' form
/// (one exponential, capped) must neither overflow to NaN nor lose the tail: against the CPU
/// device's f64 formula with PyTorch's tanh.
#[test]
fn gelu_tanh_and_its_gradient_hold_in_the_tails() {
    let cpu = Device::cpu().unwrap();
    let xs: Vec<f32> = vec![
        -1e14, -1e13, -1e4, -60.0, -20.0, -10.5, -10.0, -9.0, -6.0, -3.0, -0.5, 0.0, 0.5, 3.0, 6.0,
        10.0, 60.0, 1e4,
    ];
    for dev in gpus() {
        let on = |d: &Device| {
            let x = Tensor::from_slice(&xs, &[xs.len()], d)
                .unwrap()
                .requires_grad_(true)
                .unwrap();
            let y = x.gelu_tanh().unwrap();
            y.sum_all().unwrap().backward().unwrap();
            (
                y.to_f64_vec().unwrap(),
                x.grad().unwrap().to_f64_vec().unwrap(),
            )
        };
        let (y, g) = on(&dev);
        let (want_y, want_g) = on(&cpu);
        close(&y, &want_y, 1e-5, 1e-6, &format!("{dev:?} gelu_tanh"));
        close(
            &g,
            &want_g,
            1e-5,
            1e-6,
            &format!("{dev:?} gelu_tanh gradient"),
        );
    }
}

#[test]
fn binary_ops_broadcast_and_match_the_cpu() {
    let cpu = Device::cpu().unwrap();
    for dev in gpus() {
        for (dtype, rtol, atol) in dtypes(&dev) {
            for (k, op) in BinaryOp::ALL.into_iter().enumerate() {
                let (lo, hi) = if op == BinaryOp::Pow {
                    (0.2, 2.0)
                } else {
                    (-3.0, 3.0)
                };
                let a = random(216, 7 + k as u64, lo, hi);
                let b = random(216, 99 + k as u64, lo, hi);
                let tol = if op == BinaryOp::Pow {
                    rtol.max(1e-4)
                } else {
                    rtol
                };
                let pairs = |d: &Device| {
                    let va = views(&a, dtype, d);
                    let vb = views(&b, dtype, d);
                    let row = Tensor::from_f64_slice(&b[..36], &[36], dtype, d).unwrap();
                    let col = Tensor::from_f64_slice(&b[..6], &[6, 1], dtype, d).unwrap();
                    vec![
                        ("same layout", va[0].1.clone(), vb[0].1.clone()),
                        ("transposed + transposed", va[2].1.clone(), vb[2].1.clone()),
                        (
                            "offset by one + offset by one",
                            va[1].1.clone(),
                            vb[1].1.clone(),
                        ),
                        ("contiguous + row broadcast", va[0].1.clone(), row),
                        ("narrowed + column broadcast", va[3].1.clone(), col.clone()),
                        (
                            "column + row (outer)",
                            col,
                            Tensor::from_f64_slice(&a[..7], &[1, 7], dtype, d).unwrap(),
                        ),
                        ("empty", va[6].1.clone(), vb[6].1.clone()),
                        ("same tensor twice", va[4].1.clone(), va[4].1.clone()),
                        ("strided vec4 rows, both", va[8].1.clone(), vb[8].1.clone()),
                        (
                            "permuted rows + a row broadcast along them",
                            va[9].1.clone(),
                            Tensor::from_f64_slice(&b[..12], &[12], dtype, d).unwrap(),
                        ),
                        (
                            "permuted rows + contiguous",
                            va[9].1.clone(),
                            vb[9].1.contiguous().unwrap(),
                        ),
                    ]
                };
                for ((name, ga, gb), (_, ca, cb)) in pairs(&dev).into_iter().zip(pairs(&cpu)) {
                    let got = kiln::ops::binary(&ga, &gb, op).unwrap();
                    let want = kiln::ops::binary(&ca, &cb, op).unwrap();
                    assert_eq!(got.shape(), want.shape(), "{name}");
                    close(
                        &got.to_f64_vec().unwrap(),
                        &want.to_f64_vec().unwrap(),
                        tol,
                        atol,
                        &format!("{dev:?} {dtype} {} {name}", op.name()),
                    );
                    let got = kiln::ops::binary_scalar(&ga, 1.5, op).unwrap();
                    let want = kiln::ops::binary_scalar(&ca, 1.5, op).unwrap();
                    close(
                        &got.to_f64_vec().unwrap(),
                        &want.to_f64_vec().unwrap(),
                        tol,
                        atol,
                        &format!("{dev:?} {dtype} {}_scalar {name}", op.name()),
                    );
                }
            }
        }
    }
}

#[test]
fn integer_ops_wrap_like_pytorch() {
    let cpu = Device::cpu().unwrap();
    for dev in gpus().into_iter().chain([cpu.clone()]) {
        let a = Tensor::from_slice(&[i32::MAX, -5, 7, 0], &[4], &dev).unwrap();
        let b = Tensor::from_slice(&[1, 3, -2, 9], &[4], &dev).unwrap();
        assert_eq!(
            (&a + &b).unwrap().to_vec::<i32>().unwrap(),
            vec![i32::MIN, -2, 5, 9]
        );
        assert_eq!(
            a.maximum(&b).unwrap().to_vec::<i32>().unwrap(),
            vec![i32::MAX, 3, 7, 9]
        );
        assert_eq!(
            a.abs().unwrap().relu().unwrap().to_vec::<i32>().unwrap(),
            vec![i32::MAX, 5, 7, 0]
        );
        assert!(matches!(a.exp(), Err(kiln::Error::UnsupportedDType { .. })));
        assert!(matches!(
            a.div(&b),
            Err(kiln::Error::UnsupportedDType { .. })
        ));
        assert!(matches!(
            a.add_scalar(0.5),
            Err(kiln::Error::InvalidArgument { .. })
        ));
        let u = Tensor::from_slice(&[0u32, 4_000_000_000], &[2], &dev).unwrap();
        assert_eq!(
            u.add_scalar(500_000_000.0)
                .unwrap()
                .to_vec::<u32>()
                .unwrap(),
            vec![500_000_000, 205_032_704]
        );
    }
}

#[test]
fn reductions_match_the_cpu() {
    let cpu = Device::cpu().unwrap();
    let dims: &[(&[isize], bool)] = &[
        (&[], false),
        (&[0], false),
        (&[1], true),
        (&[-1], false),
        (&[0, 1], true),
    ];
    for dev in gpus() {
        for (dtype, rtol, atol) in dtypes(&dev) {
            let values = random(216, 5, -2.0, 2.0);
            for ((name, g), (_, c)) in views(&values, dtype, &dev)
                .into_iter()
                .zip(views(&values, dtype, &cpu))
            {
                for &(d, keep) in dims.iter().filter(|(d, _)| {
                    d.iter()
                        .all(|&i| i.unsigned_abs() < g.rank().max(1) || i == -1)
                }) {
                    for mean in [false, true] {
                        let f = |t: &Tensor| {
                            if mean {
                                t.mean(d, keep)
                            } else {
                                t.sum(d, keep)
                            }
                        };
                        let (got, want) = (f(&g).unwrap(), f(&c).unwrap());
                        assert_eq!(got.shape(), want.shape());
                        close(
                            &got.to_f64_vec().unwrap(),
                            &want.to_f64_vec().unwrap(),
                            rtol * 10.0,
                            atol * 10.0,
                            &format!("{dev:?} {dtype} {name} dims {d:?} keep {keep} mean {mean}"),
                        );
                    }
                }
            }
        }
        // Long rows take the two-pass path (partials, then their sum).
        let n = 1 << 20;
        let values = random(n, 11, -1.0, 1.0);
        let want: f64 = values.iter().map(|&v| v as f32 as f64).sum();
        let t = Tensor::from_f64_slice(&values, &[n], DType::F32, &dev).unwrap();
        let got = t.sum_all().unwrap().item::<f32>().unwrap() as f64;
        assert!(
            (got - want).abs() < 1e-2,
            "{dev:?}: sum of 2^20: {got} vs {want}"
        );
        let rows = t
            .reshape(&[1024, 1024])
            .unwrap()
            .t()
            .unwrap()
            .sum(&[1], false)
            .unwrap();
        assert_eq!(rows.shape(), &[1024]);
        // Sums and means over leading dims (a bias gradient's shape).
        let values = random(3 * 40 * 96, 13, -1.0, 1.0);
        let on = |d: &Device| Tensor::from_f64_slice(&values, &[3, 40, 96], DType::F32, d).unwrap();
        let (g, c) = (on(&dev), on(&cpu));
        for (d, keep) in [
            (&[0isize, 1][..], false),
            (&[0][..], true),
            (&[0, 1][..], true),
        ] {
            for mean in [false, true] {
                let f = |t: &Tensor| {
                    if mean {
                        t.mean(d, keep)
                    } else {
                        t.sum(d, keep)
                    }
                    .unwrap()
                };
                let (got, want) = (f(&g), f(&c));
                assert_eq!(got.shape(), want.shape(), "{d:?} {keep}");
                close(
                    &got.to_f64_vec().unwrap(),
                    &want.to_f64_vec().unwrap(),
                    1e-5,
                    1e-4,
                    &format!("{dev:?} leading dims {d:?} keep {keep} mean {mean}"),
                );
            }
        }
        // The column kernel's chunks: 1003 rows (a ragged last chunk), 4100 columns (a ragged
        // last column block), a view starting at row 5 (an offset), and a width that is not
        // a multiple of 4 (the row kernel).
        // f16 too (autocast's bias gradients): f32 partials, the result rounded once.
        let values = random(1010 * 4100, 17, -1.0, 1.0);
        let f16 = dev.adapter_info().is_some_and(|i| i.features.shader_f16);
        let kinds = [(DType::F32, 1e-5, 1e-3), (DType::F16, 2e-3, 0.06)];
        for (dtype, rtol, atol) in kinds.into_iter().filter(|k| k.0 == DType::F32 || f16) {
            for (cols, start) in [(4100usize, 5usize), (4100, 0), (4099, 2)] {
                let rows = 1003;
                let on = |d: &Device| {
                    Tensor::from_f64_slice(&values[..1010 * cols], &[1010, cols], dtype, d)
                        .unwrap()
                        .narrow(0, start, rows)
                        .unwrap()
                };
                let (g, c) = (on(&dev), on(&cpu));
                for mean in [false, true] {
                    let f = |t: &Tensor| {
                        if mean {
                            t.mean(&[0], false)
                        } else {
                            t.sum(&[0], false)
                        }
                    };
                    let (got, want) = (f(&g).unwrap(), f(&c).unwrap());
                    assert_eq!(got.dtype(), dtype);
                    close(
                        &got.to_f64_vec().unwrap(),
                        &want.to_f64_vec().unwrap(),
                        rtol,
                        atol,
                        &format!(
                        "{dev:?} {dtype} column sums {rows}x{cols} from row {start} mean {mean}"
                    ),
                    );
                }
            }
        }
    }
}

#[test]
fn shape_dtype_and_device_errors_are_typed() {
    let cpu = Device::cpu().unwrap();
    for dev in gpus() {
        let a = Tensor::zeros(&[2, 3], DType::F32, &dev).unwrap();
        let b = Tensor::zeros(&[4], DType::F32, &dev).unwrap();
        let e = (&a + &b).unwrap_err();
        assert!(
            matches!(e, kiln::Error::ShapeMismatch { op: "add", .. }),
            "{e}"
        );
        let i = Tensor::zeros(&[2, 3], DType::I32, &dev).unwrap();
        assert!(matches!(
            (&a + &i).unwrap_err(),
            kiln::Error::DTypeMismatch { op: "add", .. }
        ));
        let c = Tensor::zeros(&[2, 3], DType::F32, &cpu).unwrap();
        let e = (&a + &c).unwrap_err();
        assert!(
            matches!(e, kiln::Error::DeviceMismatch { op: "add", .. }),
            "{e}"
        );
        assert!(e.to_string().contains("cpu"), "{e}");
        assert!(matches!(
            a.sum(&[2], false).unwrap_err(),
            kiln::Error::IndexOutOfRange { .. }
        ));
        // The device and the other tensors are intact.
        assert_eq!((&a + &a).unwrap().to_vec::<f32>().unwrap(), vec![0.0; 6]);
    }
}

/// Cached bind groups hold their buffers: `empty_cache` must still return a released segment's
/// memory to the driver (checked with wgpu's own allocator report, where the backend has one).
#[test]
fn empty_cache_really_frees_memory_bound_by_cached_bind_groups() {
    for dev in gpus() {
        let Some(raw) = kiln::device::raw_wgpu_device(&dev) else {
            continue;
        };
        dev.empty_cache();
        dev.synchronize().unwrap();
        let _ = raw.poll(wgpu::PollType::wait_indefinitely());
        if raw.generate_allocator_report().is_none() {
            continue;
        }
        let a = Tensor::full(&[16 << 20], 1.0, DType::F32, &dev).unwrap(); // 64 MiB
        let b = a.mul_scalar(2.0).unwrap();
        assert_eq!(
            b.narrow(0, 0, 2).unwrap().to_vec::<f32>().unwrap(),
            vec![2.0, 2.0]
        );
        let during = raw
            .generate_allocator_report()
            .unwrap()
            .total_allocated_bytes;
        drop((a, b));
        dev.empty_cache();
        dev.synchronize().unwrap();
        let _ = raw.poll(wgpu::PollType::wait_indefinitely());
        let after = raw
            .generate_allocator_report()
            .unwrap()
            .total_allocated_bytes;
        assert!(
            after + (128 << 20) <= during,
            "{dev:?}: {after} bytes allocated after empty_cache, {during} with both tensors live"
        );
    }
}

/// The tiled transpose at sizes with partial tiles on both edges, against the CPU.
#[test]
fn large_transposed_copies_match_the_cpu() {
    let cpu = Device::cpu().unwrap();
    for dev in gpus() {
        for (r, c) in [(1000usize, 777usize), (33, 2049), (4096, 31)] {
            let values = random(r * c, (r * c) as u64, -1.0, 1.0);
            let g = Tensor::from_f64_slice(&values, &[r, c], DType::F32, &dev).unwrap();
            let h = Tensor::from_f64_slice(&values, &[r, c], DType::F32, &cpu).unwrap();
            let got = g.t().unwrap().contiguous().unwrap().to_f64_vec().unwrap();
            let want = h.t().unwrap().contiguous().unwrap().to_f64_vec().unwrap();
            assert_eq!(got, want, "{dev:?} {r}x{c}");
            // A transposed slice: offset and leading dimension differ from the shape.
            let s = g
                .narrow(0, 3, r - 5)
                .unwrap()
                .narrow(1, 2, c - 3)
                .unwrap()
                .t()
                .unwrap();
            let sh = h
                .narrow(0, 3, r - 5)
                .unwrap()
                .narrow(1, 2, c - 3)
                .unwrap()
                .t()
                .unwrap();
            assert_eq!(
                s.contiguous().unwrap().to_f64_vec().unwrap(),
                sh.contiguous().unwrap().to_f64_vec().unwrap()
            );
        }
    }
}

/// NCHW <-> NHWC (a batch of transposes: the tiled kernel with one workgroup layer per image,
/// forced here, as autotuning may pick the strided copy on a CPU adapter), f32 and f16 (two to a
/// word where the sizes are even: 40x60 in one partial tile, 100x130 over several; element by
/// element where one is odd), from a whole tensor and from a slice of its batch (an offset),
/// against the CPU.
#[test]
fn batched_transposed_copies_match_the_cpu() {
    let cpu = Device::cpu().unwrap();
    kiln::kernels::tune::force_variant("transpose", Some("tiled"));
    for dev in gpus() {
        for (dtype, _, _) in dtypes(&dev) {
            for [n, c, h, w] in [[5usize, 24, 7, 9], [3, 40, 6, 10], [3, 100, 10, 13]] {
                let values = random(n * c * h * w, 77, -2.0, 2.0);
                let g = Tensor::from_f64_slice(&values, &[n, c, h, w], dtype, &dev).unwrap();
                let x = Tensor::from_f64_slice(&values, &[n, c, h, w], dtype, &cpu).unwrap();
                let nhwc = |t: &Tensor| t.permute(&[0, 2, 3, 1]).unwrap().contiguous().unwrap();
                let nchw = |t: &Tensor| t.permute(&[0, 3, 1, 2]).unwrap().contiguous().unwrap();
                let what = format!("{dev:?} {dtype} {n}x{c}x{h}x{w}");
                let got = nhwc(&g);
                assert_eq!(got.shape(), &[n, h, w, c]);
                assert_eq!(
                    got.to_f64_vec().unwrap(),
                    nhwc(&x).to_f64_vec().unwrap(),
                    "{what}: NCHW -> NHWC"
                );
                assert_eq!(
                    nchw(&got).to_f64_vec().unwrap(),
                    x.to_f64_vec().unwrap(),
                    "{what}: and back"
                );
                let part = |t: &Tensor| nhwc(&t.narrow(0, 1, 2).unwrap()).to_f64_vec().unwrap();
                assert_eq!(part(&g), part(&x), "{what}: slice of the batch");
            }
        }
    }
    kiln::kernels::tune::force_variant("transpose", None);
}

#[test]
fn softmax_matches_the_cpu() {
    let cpu = Device::cpu().unwrap();
    for dev in gpus() {
        for (dtype, rtol, atol) in dtypes(&dev) {
            let values = random(216, 17, -6.0, 6.0);
            for ((name, g), (_, c)) in views(&values, dtype, &dev)
                .into_iter()
                .zip(views(&values, dtype, &cpu))
            {
                for d in [-1isize, 0] {
                    for log in [false, true] {
                        let f = |t: &Tensor| if log { t.log_softmax(d) } else { t.softmax(d) };
                        let (got, want) = (f(&g).unwrap(), f(&c).unwrap());
                        assert_eq!(got.shape(), want.shape(), "{name}");
                        close(
                            &got.to_f64_vec().unwrap(),
                            &want.to_f64_vec().unwrap(),
                            rtol.max(1e-5) * 10.0,
                            atol * 10.0,
                            &format!("{dev:?} {dtype} {name} dim {d} log {log}"),
                        );
                    }
                }
            }
        }
        // Large values: stable (no overflow), rows of -inf give NaN as in PyTorch.
        let t = Tensor::from_slice(
            &[1000.0f32, 1001.0, 1002.0, f32::NEG_INFINITY],
            &[1, 4],
            &dev,
        )
        .unwrap();
        let s = t.softmax(-1).unwrap().to_vec::<f32>().unwrap();
        let want = [0.090_030_57f32, 0.244_728_48, 0.665_240_94, 0.0];
        for (a, b) in s.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{dev:?}: {s:?}");
        }
        let scalar = Tensor::from_slice(&[3.0f32], &[], &dev).unwrap();
        assert_eq!(scalar.softmax(0).unwrap().shape(), &[] as &[usize]);
        assert_eq!(scalar.log_softmax(-1).unwrap().item::<f32>().unwrap(), 0.0);
        let long = Tensor::from_f64_slice(
            &random(4096 * 3, 3, -3.0, 3.0),
            &[3, 4096],
            DType::F32,
            &dev,
        )
        .unwrap();
        let sums = long
            .softmax(1)
            .unwrap()
            .sum(&[1], false)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        assert!(
            sums.iter().all(|s| (s - 1.0).abs() < 1e-4),
            "{dev:?}: {sums:?}"
        );
    }
}

/// softmax (or log_softmax) of `x` (a leaf that requires grad) along dim 1, and x's gradient
/// from `sum(y * w)` with `w` the `weights` in x's shape and dtype.
fn softmax_and_grad(x: &Tensor, log: bool, weights: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let y = if log { x.log_softmax(1) } else { x.softmax(1) }.unwrap();
    let w = Tensor::from_f64_slice(weights, x.shape(), x.dtype(), x.device()).unwrap();
    y.mul(&w)
        .unwrap()
        .sum(&[], false)
        .unwrap()
        .backward()
        .unwrap();
    (
        y.to_f64_vec().unwrap(),
        x.grad().unwrap().to_f64_vec().unwrap(),
    )
}

/// Contiguous rows that are not whole vec4s (GPT-2's 50257 logits) take the words kernels on
/// a GPU (16-byte chunks inside a row, the elements a row shares a chunk with its neighbours
/// one at a time); forced here, since a CPU adapter picks the serial loop. Rows shorter than a
/// chunk, rows whose ends fall anywhere in a chunk, rows starting at an offset of whole chunks
/// and at one that is not (the strided kernel), NaN and all -inf rows, forward and backward
/// of both ops, against the CPU.
#[test]
fn softmax_rows_of_any_length_match_the_cpu() {
    let cpu = Device::cpu().unwrap();
    kiln::kernels::tune::force_variant("softmax", Some("tree"));
    kiln::kernels::tune::force_variant("softmax backward", Some("tree"));
    for dev in gpus() {
        for (dtype, rtol, atol) in dtypes(&dev) {
            for (rows, cols) in [(5, 3), (4, 13), (9, 37), (3, 1001), (3, 9001)] {
                // Eight spare elements, so that a narrow from 8 elements (f16's chunk) or 1
                // in is still inside.
                let mut values = random(rows * cols + 8, cols as u64, -6.0, 6.0);
                if cols > 8 {
                    values[cols + 5] = f64::NAN;
                    for v in &mut values[2 * cols..3 * cols] {
                        *v = f64::NEG_INFINITY;
                    }
                }
                let weights = random(rows * cols, 7, -1.0, 1.0);
                for skip in [0usize, 8, 1] {
                    let run = |d: &Device, log: bool| {
                        let all =
                            Tensor::from_f64_slice(&values, &[rows * cols + 8], dtype, d).unwrap();
                        let x = all
                            .narrow(0, skip, rows * cols)
                            .unwrap()
                            .reshape(&[rows as isize, cols as isize])
                            .unwrap()
                            .detach()
                            .requires_grad_(true)
                            .unwrap();
                        // The weights' NaN-free rows keep the backward's NaNs to the NaN rows.
                        softmax_and_grad(&x, log, &weights)
                    };
                    for log in [false, true] {
                        let (got, want) = (run(&dev, log), run(&cpu, log));
                        let what =
                            format!("{dev:?} {dtype} [{rows}, {cols}] from {skip} log {log}");
                        close(&got.0, &want.0, rtol * 10.0, atol * 10.0, &what);
                        close(
                            &got.1,
                            &want.1,
                            rtol * 10.0,
                            atol * 10.0,
                            &format!("{what} grad"),
                        );
                    }
                }
            }
        }
    }
    kiln::kernels::tune::force_variant("softmax", None);
    kiln::kernels::tune::force_variant("softmax backward", None);
}

/// One long row (a sampled token's 50257 logits) in the kernel each adapter picks by itself:
/// Mesa's llvmpipe breaks out of an invocation's loops after 65535 loop headers, so on CPU
/// adapters a row too long for the serial kernel takes the tree (a 16001-element row came
/// back zero after its 5843rd element). Strided and vec4 rows, forward and backward, against
/// the CPU.
#[test]
fn one_long_row_is_whole_on_every_adapter() {
    let cpu = Device::cpu().unwrap();
    for dev in gpus() {
        for n in [30011usize, 140000] {
            let values = random(n, 3, -6.0, 6.0);
            let weights = random(n, 4, -1.0, 1.0);
            for log in [false, true] {
                let run = |d: &Device| {
                    let x = Tensor::from_f64_slice(&values, &[1, n], DType::F32, d)
                        .unwrap()
                        .requires_grad_(true)
                        .unwrap();
                    softmax_and_grad(&x, log, &weights)
                };
                let (got, want) = (run(&dev), run(&cpu));
                let what = format!("{dev:?} [1, {n}] log {log}");
                close(&got.0, &want.0, 1e-3, 1e-6, &what);
                close(&got.1, &want.1, 1e-3, 1e-6, &format!("{what} grad"));
            }
        }
    }
}

/// In-place ops write through any view, bump the version shared by all views, and refuse
/// writes PyTorch refuses.
#[test]
fn inplace_ops_write_through_views_and_bump_versions() {
    let cpu = Device::cpu().unwrap();
    for dev in gpus().into_iter().chain([cpu.clone()]) {
        for (dtype, rtol, atol) in dtypes(&dev) {
            let values = random(216, 23, -2.0, 2.0);
            let other = random(216, 29, -2.0, 2.0);
            // The same in-place sequence on the device and on the CPU, through a transposed
            // narrow view of a bigger tensor: only the view's elements may change.
            let run = |d: &Device| {
                let base = Tensor::from_f64_slice(&values, &[6, 36], dtype, d).unwrap();
                let view = base.narrow(1, 2, 30).unwrap().t().unwrap(); // [30, 6], strided
                let o = Tensor::from_f64_slice(&other[..30], &[30, 1], dtype, d).unwrap();
                let v0 = base.version();
                view.mul_scalar_(3.0).unwrap();
                view.add_(&o).unwrap(); // broadcast along the columns
                view.relu_().unwrap();
                view.clamp_(0.1, 4.0).unwrap();
                assert_eq!(base.version(), v0 + 5, "views share the version counter");
                let contiguous = Tensor::from_f64_slice(&values, &[216], dtype, d).unwrap();
                // The vec4 in-place path, then (offset by one) not vec4s.
                contiguous.sub_scalar_(1.0).unwrap();
                contiguous.narrow(0, 1, 100).unwrap().fill_(7.0).unwrap();
                // A copy into a narrow view from permuted rows (both strided vec4s), as
                // attention's gradients go into the qkv projection's.
                let rows = Tensor::from_f64_slice(&other[..72], &[3, 2, 12], dtype, d).unwrap();
                let into = contiguous
                    .reshape(&[2, 3, 36])
                    .unwrap()
                    .narrow(2, 12, 12)
                    .unwrap();
                into.copy_(&rows.permute(&[1, 0, 2]).unwrap()).unwrap();
                (base.to_f64_vec().unwrap(), contiguous.to_f64_vec().unwrap())
            };
            let (got, want) = (run(&dev), run(&cpu));
            close(
                &got.0,
                &want.0,
                rtol,
                atol,
                &format!("{dev:?} {dtype} strided in-place"),
            );
            close(
                &got.1,
                &want.1,
                rtol,
                atol,
                &format!("{dev:?} {dtype} contiguous in-place"),
            );
            let first = Tensor::from_f64_slice(&values[..1], &[1], dtype, &cpu).unwrap();
            assert_eq!(
                got.0[0],
                first.to_f64_vec().unwrap()[0],
                "outside the view: untouched"
            );
        }
        let t = Tensor::zeros(&[3, 4], DType::F32, &dev).unwrap();
        t.fill_(2.5).unwrap();
        t.narrow(1, 1, 2).unwrap().zero_().unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap()[..4], [2.5, 0.0, 0.0, 2.5]);
        let src = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[4], &dev).unwrap();
        t.copy_(&src).unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), [1.0, 2.0, 3.0, 4.0].repeat(3));
        // Refusals: a broadcast view, a partially overlapping input, a shape that would grow.
        let row = Tensor::zeros(&[4], DType::F32, &dev)
            .unwrap()
            .expand(&[3, 4])
            .unwrap();
        assert!(matches!(
            row.add_scalar_(1.0),
            Err(kiln::Error::InvalidArgument { .. })
        ));
        let sq = Tensor::zeros(&[4, 4], DType::F32, &dev).unwrap();
        let e = sq.add_(&sq.t().unwrap()).unwrap_err();
        assert!(e.to_string().contains("single memory location"), "{e}");
        sq.add_(&sq).unwrap(); // the same view is fine
        assert!(matches!(
            src.add_(&t),
            Err(kiln::Error::ShapeMismatch { .. })
        ));
        let v = src.version();
        assert!(src
            .add_(&Tensor::zeros(&[4], DType::I32, &dev).unwrap())
            .is_err());
        assert_eq!(src.version(), v, "a refused op leaves the version alone");
    }
}

/// matmul with PyTorch's shape rules, transposed and sliced inputs read through their strides,
/// broadcast batches, against the CPU (f64) reference.
#[test]
fn matmul_matches_the_cpu() {
    let cpu = Device::cpu().unwrap();
    let cases: &[(&[usize], &[usize], &[usize])] = &[
        (&[37], &[37], &[]),
        (&[37, 53], &[53, 29], &[37, 29]),
        (&[53], &[53, 29], &[29]),
        (&[37, 53], &[53], &[37]),
        (&[2, 1, 17, 9], &[3, 9, 70], &[2, 3, 17, 70]),
        (&[5, 65, 130], &[130, 66], &[5, 65, 66]),
        (&[4, 0], &[0, 3], &[4, 3]),
        // Whole 128x128 tiles: the tensor-core path for f16 where the adapter has it.
        (&[128, 64], &[64, 256], &[128, 256]),
        (&[2, 128, 48], &[48, 256], &[2, 128, 256]),
        // The 128x128-tile kernel with ragged edges and a K that is no multiple of 16.
        (&[2, 131, 45], &[45, 257], &[2, 131, 257]),
        // Few tiles over a long K: split into chunks summed afterwards (f32 on GPUs).
        (&[70, 2048], &[2048, 10], &[70, 10]),
        (&[2048], &[2048, 10], &[10]),
        (&[1, 1], &[1, 1], &[1, 1]),
    ];
    for (dev, tile) in gpus()
        .into_iter()
        .flat_map(|d| [(d.clone(), None), (d, Some(128))])
    {
        // Every case also through the 128x128-tile kernel, which picks itself only for big
        // products.
        kiln::ops::force_matmul_tile(tile);
        for (dtype, rtol, atol) in dtypes(&dev) {
            for (i, &(sa, sb, want_shape)) in cases.iter().enumerate() {
                let na: usize = sa.iter().product();
                let nb: usize = sb.iter().product();
                let (va, vb) = (
                    random(na, 31 + i as u64, -1.0, 1.0),
                    random(nb, 37 + i as u64, -1.0, 1.0),
                );
                let on = |d: &Device| {
                    (
                        Tensor::from_f64_slice(&va, sa, dtype, d).unwrap(),
                        Tensor::from_f64_slice(&vb, sb, dtype, d).unwrap(),
                    )
                };
                let ((ga, gb), (ca, cb)) = (on(&dev), on(&cpu));
                let got = ga.matmul(&gb).unwrap();
                let want = ca.matmul(&cb).unwrap();
                assert_eq!(got.shape(), want_shape, "{sa:?} @ {sb:?}");
                assert_eq!(want.shape(), want_shape);
                let k = sa[sa.len() - 1] as f64;
                close(
                    &got.to_f64_vec().unwrap(),
                    &want.to_f64_vec().unwrap(),
                    rtol * 10.0,
                    atol * k.max(1.0),
                    &format!("{dev:?} {dtype} {sa:?} @ {sb:?}"),
                );
            }
            // Transposed and sliced operands, read through their strides (small and 128-tile
            // kernels).
            for (rows, cols, na, nb) in [(80, 90, 70, 33), (150, 180, 150, 140)] {
                let va = random(rows * cols, 41, -1.0, 1.0);
                let on = |d: &Device| Tensor::from_f64_slice(&va, &[rows, cols], dtype, d).unwrap();
                let (g, c) = (on(&dev), on(&cpu));
                let f = |t: &Tensor| {
                    t.narrow(1, 5, na)
                        .unwrap()
                        .t()
                        .unwrap()
                        .matmul(&t.narrow(1, 1, nb).unwrap())
                        .unwrap()
                };
                let (got, want) = (f(&g), f(&c));
                assert_eq!(got.shape(), &[na, nb]);
                close(
                    &got.to_f64_vec().unwrap(),
                    &want.to_f64_vec().unwrap(),
                    rtol * 10.0,
                    atol * rows as f64,
                    &format!("{dev:?} {dtype} transposed {rows}x{cols}"),
                );
            }
        }
        let a = Tensor::zeros(&[3, 4], DType::F32, &dev).unwrap();
        assert!(matches!(
            a.matmul(&a),
            Err(kiln::Error::ShapeMismatch { op: "matmul", .. })
        ));
        let i = Tensor::zeros(&[4, 4], DType::I32, &dev).unwrap();
        assert!(matches!(
            i.matmul(&i),
            Err(kiln::Error::UnsupportedDType { .. })
        ));
    }
    kiln::ops::force_matmul_tile(None);
}

/// Comparisons, casts, where and masked_fill against the CPU, bools one byte each.
#[test]
fn comparisons_casts_and_where_match_the_cpu() {
    let cpu = Device::cpu().unwrap();
    for dev in gpus() {
        let mut kinds = vec![DType::F32, DType::I32, DType::U32];
        if dev.adapter_info().is_some_and(|a| a.features.shader_f16) {
            kinds.push(DType::F16);
        }
        for &dtype in &kinds {
            // Small integers so every dtype holds them exactly, with ties for eq/le/ge.
            let a = random(216, 51, 0.0, 6.0)
                .iter()
                .map(|v| v.floor())
                .collect::<Vec<_>>();
            let b = random(216, 53, 0.0, 6.0)
                .iter()
                .map(|v| v.floor())
                .collect::<Vec<_>>();
            let on = |d: &Device| {
                let ta = Tensor::from_f64_slice(&a, &[6, 36], dtype, d).unwrap();
                let tb = Tensor::from_f64_slice(&b[..36], &[36], dtype, d).unwrap();
                (ta, tb)
            };
            let ((ga, gb), (ca, cb)) = (on(&dev), on(&cpu));
            for op in kiln::ops::CmpOp::ALL {
                let got =
                    kiln::ops::compare(&ga.t().unwrap(), &gb.unsqueeze(1).unwrap(), op).unwrap();
                let want =
                    kiln::ops::compare(&ca.t().unwrap(), &cb.unsqueeze(1).unwrap(), op).unwrap();
                assert_eq!(got.dtype(), DType::Bool);
                assert_eq!(
                    got.to_vec::<bool>().unwrap(),
                    want.to_vec::<bool>().unwrap(),
                    "{dev:?} {dtype} {}",
                    op.name()
                );
                let got =
                    kiln::ops::compare_scalar(&ga.narrow(1, 1, 33).unwrap(), 3.0, op).unwrap();
                let want =
                    kiln::ops::compare_scalar(&ca.narrow(1, 1, 33).unwrap(), 3.0, op).unwrap();
                assert_eq!(
                    got.to_vec::<bool>().unwrap(),
                    want.to_vec::<bool>().unwrap(),
                    "{dev:?} {dtype} {}_scalar",
                    op.name()
                );
            }
            // Casts to every dtype the device has, through a transposed view.
            for &to in kinds.iter().chain([&DType::Bool]) {
                let got = ga.t().unwrap().to_dtype(to).unwrap();
                let want = ca.t().unwrap().to_dtype(to).unwrap();
                assert_eq!(got.dtype(), to);
                assert_eq!(
                    got.to_f64_vec().unwrap(),
                    want.to_f64_vec().unwrap(),
                    "{dev:?} {dtype} -> {to}"
                );
            }
            // where and masked_fill, with broadcasting.
            let (gm, cm) = (ga.gt_scalar(2.0).unwrap(), ca.gt_scalar(2.0).unwrap());
            let got = kiln::ops::where_(&gm, &ga, &gb).unwrap();
            let want = kiln::ops::where_(&cm, &ca, &cb).unwrap();
            assert_eq!(
                got.to_f64_vec().unwrap(),
                want.to_f64_vec().unwrap(),
                "{dev:?} {dtype} where"
            );
            let row_mask = gm.narrow(0, 0, 1).unwrap(); // [1, 36] broadcast over rows
            let got = ga.masked_fill(&row_mask, 9.0).unwrap();
            let want = ca.masked_fill(&cm.narrow(0, 0, 1).unwrap(), 9.0).unwrap();
            assert_eq!(
                got.to_f64_vec().unwrap(),
                want.to_f64_vec().unwrap(),
                "{dev:?} {dtype} masked_fill"
            );
        }
        // Bool views copy on the GPU too; bools cast back to numbers.
        let bools =
            Tensor::from_slice(&[true, false, false, true, true, false], &[2, 3], &dev).unwrap();
        assert_eq!(
            bools
                .t()
                .unwrap()
                .contiguous()
                .unwrap()
                .to_vec::<bool>()
                .unwrap(),
            vec![true, true, false, true, false, false]
        );
        assert_eq!(
            bools.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(),
            vec![1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
        );
        let nan = Tensor::from_slice(&[f32::NAN, 0.0, -0.0, 2.5], &[4], &dev).unwrap();
        assert_eq!(
            nan.to_dtype(DType::Bool).unwrap().to_vec::<bool>().unwrap(),
            vec![true, false, false, true]
        );
        assert_eq!(
            nan.eq(&nan).unwrap().to_vec::<bool>().unwrap(),
            vec![false, true, true, true]
        );
        let f = Tensor::zeros(&[4], DType::F32, &dev).unwrap();
        assert!(matches!(
            kiln::ops::where_(&f, &f, &f),
            Err(kiln::Error::DTypeMismatch { .. })
        ));
    }
}

/// prod, amax, amin and max/min with indices: ties take the first index and NaN wins, as in
/// PyTorch; strided views and long (two-pass) rows against the CPU.
#[test]
fn extreme_and_product_reductions_match_the_cpu() {
    let cpu = Device::cpu().unwrap();
    for dev in gpus() {
        for (dtype, rtol, atol) in dtypes(&dev) {
            // Small integers (many ties); values near 1 for prod.
            let ints = random(216, 61, -4.0, 4.0)
                .iter()
                .map(|v| v.floor())
                .collect::<Vec<_>>();
            let near1 = random(216, 67, 0.9, 1.1);
            for ((name, g), (_, c)) in views(&ints, dtype, &dev)
                .into_iter()
                .zip(views(&ints, dtype, &cpu))
            {
                if g.numel() == 0 {
                    assert!(
                        g.amax(&[], false).is_err(),
                        "max of nothing has no identity"
                    );
                    continue;
                }
                for d in [-1isize, 0] {
                    let what = format!("{dev:?} {dtype} {name} dim {d}");
                    let f = |t: &Tensor| {
                        (
                            t.amax(&[d], false).unwrap(),
                            t.amin(&[d], true).unwrap(),
                            t.max_dim(d, false).unwrap(),
                            t.min_dim(d, true).unwrap(),
                        )
                    };
                    let (ga, gi, (gv, gx), (gmv, gmx)) = f(&g);
                    let (ca, ci, (cv, cx), (cmv, cmx)) = f(&c);
                    assert_eq!(
                        ga.to_f64_vec().unwrap(),
                        ca.to_f64_vec().unwrap(),
                        "{what} amax"
                    );
                    assert_eq!(
                        gi.to_f64_vec().unwrap(),
                        ci.to_f64_vec().unwrap(),
                        "{what} amin"
                    );
                    assert_eq!(
                        gv.to_f64_vec().unwrap(),
                        cv.to_f64_vec().unwrap(),
                        "{what} max values"
                    );
                    assert_eq!(
                        gx.to_vec::<i32>().unwrap(),
                        cx.to_vec::<i32>().unwrap(),
                        "{what} argmax (first of ties)"
                    );
                    assert_eq!(
                        gmv.to_f64_vec().unwrap(),
                        cmv.to_f64_vec().unwrap(),
                        "{what} min values"
                    );
                    assert_eq!(
                        gmx.to_vec::<i32>().unwrap(),
                        cmx.to_vec::<i32>().unwrap(),
                        "{what} argmin"
                    );
                }
            }
            for ((name, g), (_, c)) in views(&near1, dtype, &dev)
                .into_iter()
                .zip(views(&near1, dtype, &cpu))
            {
                let (gp, cp) = (g.prod(&[-1], false).unwrap(), c.prod(&[-1], false).unwrap());
                close(
                    &gp.to_f64_vec().unwrap(),
                    &cp.to_f64_vec().unwrap(),
                    rtol * 10.0,
                    atol * 10.0,
                    &format!("{dev:?} {dtype} {name} prod"),
                );
            }
        }
        // NaN wins max and min, at its first position; two-pass long rows.
        let t = Tensor::from_slice(&[1.0f32, f32::NAN, 3.0, f32::NAN], &[1, 4], &dev).unwrap();
        let (v, i) = t.max_dim(1, false).unwrap();
        assert!(v.to_vec::<f32>().unwrap()[0].is_nan());
        assert_eq!(i.to_vec::<i32>().unwrap(), vec![1]);
        assert!(t.amin(&[], false).unwrap().item::<f32>().unwrap().is_nan());
        let m = t.maximum_scalar(2.0).unwrap().to_vec::<f32>().unwrap();
        assert!(
            m[0] == 2.0 && m[1].is_nan() && m[2] == 3.0 && m[3].is_nan(),
            "{dev:?}: maximum keeps NaN: {m:?}"
        );
        let r = t.neg().unwrap().relu().unwrap().to_vec::<f32>().unwrap();
        assert!(
            r[0] == 0.0 && r[1].is_nan(),
            "{dev:?}: relu keeps NaN: {r:?}"
        );
        let n = 1 << 20;
        let values = random(n, 71, -1.0, 1.0);
        let big = Tensor::from_f64_slice(&values, &[n], DType::F32, &dev).unwrap();
        let want = values
            .iter()
            .map(|&v| v as f32)
            .fold(f32::NEG_INFINITY, f32::max);
        assert_eq!(big.amax(&[], false).unwrap().item::<f32>().unwrap(), want);
        let at = values
            .iter()
            .map(|&v| v as f32)
            .position(|v| v == want)
            .unwrap() as i32;
        assert_eq!(big.argmax(0, false).unwrap().item::<i32>().unwrap(), at);
    }
}

/// The contiguous f32 <-> f16 casts (four elements per invocation where the sizes and offsets
/// allow, the strided kernel elsewhere) round as the CPU device does: ties to even, overflow to
/// infinity, subnormals, NaN; at offsets that are and are not whole vec4s.
#[test]
fn float_casts_round_as_the_cpu_does() {
    let cpu = Device::cpu().unwrap();
    let specials = [
        0.0f32,
        -0.0,
        1.0,
        1.0 + 1.0 / 4096.0,
        65504.0,
        65520.0,
        1e6,
        -1e6,
        6e-8,
        1e-5,
        f32::NAN,
        f32::INFINITY,
    ];
    let mut vals: Vec<f32> = specials.to_vec();
    vals.extend(
        random(1024 - specials.len(), 7, -70000.0, 70000.0)
            .iter()
            .map(|&v| v as f32),
    );
    for dev in gpus() {
        if !dev.adapter_info().is_some_and(|i| i.features.shader_f16) {
            continue;
        }
        for (start, len) in [(0, 1024), (4, 512), (1, 515), (8, 7)] {
            let src = &vals[start..start + len];
            let g = Tensor::from_slice(&vals, &[1024], &dev)
                .unwrap()
                .narrow(0, start, len)
                .unwrap();
            let c = Tensor::from_slice(src, &[len], &cpu).unwrap();
            let (g16, c16) = (
                g.to_dtype(DType::F16).unwrap(),
                c.to_dtype(DType::F16).unwrap(),
            );
            let bits = |t: &Tensor| -> Vec<u16> {
                t.to_vec::<half::f16>()
                    .unwrap()
                    .iter()
                    .map(|h| if h.is_nan() { 0x7e00 } else { h.to_bits() })
                    .collect()
            };
            assert_eq!(
                bits(&g16),
                bits(&c16),
                "{dev:?} f32 -> f16 at {start}+{len}"
            );
            // And back, from an f16 tensor at the same offset.
            let g16v =
                Tensor::from_slice(&c16.to_vec::<half::f16>().unwrap(), &[len], &dev).unwrap();
            let back = g16v.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
            let want = c16.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
            assert!(
                back.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())),
                "{dev:?} f16 -> f32 at {start}+{len}"
            );
        }
    }
}

/// Copies of matrices narrowed along their columns go row by row: in 16-byte vectors where
/// the offsets and lengths allow, else four words or eight f16 elements to a 16-byte store;
/// exact against the CPU, for f32, i32 and f16 (rows of 32, 50 and 9 columns, at offsets of
/// whole vectors, of whole words and odd), and the trace names each kernel where the adapter
/// has timestamps.
#[test]
fn row_copies_match_the_cpu() {
    let cpu = Device::cpu().unwrap();
    for dev in gpus() {
        let mut types = vec![DType::F32, DType::I32];
        if dev.adapter_info().is_some_and(|a| a.features.shader_f16) {
            types.push(DType::F16);
        }
        for dtype in types {
            let values: Vec<f64> = (0..40 * 72).map(|i| (i % 1000) as f64).collect();
            let g = Tensor::from_f64_slice(&values, &[40, 72], dtype, &dev).unwrap();
            let h = Tensor::from_f64_slice(&values, &[40, 72], dtype, &cpu).unwrap();
            // (rows start, rows, columns start, columns): 16-byte aligned, word aligned, odd.
            for (r0, r, c0, c) in [(0, 40, 8, 32), (1, 30, 2, 50), (0, 40, 3, 50), (5, 1, 0, 9)] {
                let view = |t: &Tensor| t.narrow(0, r0, r).unwrap().narrow(1, c0, c).unwrap();
                let got = view(&g).contiguous().unwrap();
                assert!(got.is_contiguous());
                assert_eq!(
                    got.to_f64_vec().unwrap(),
                    view(&h).contiguous().unwrap().to_f64_vec().unwrap(),
                    "{dev:?} {dtype} rows {r0}+{r} columns {c0}+{c}"
                );
            }
            if !dev.adapter_info().unwrap().features.timestamp_query {
                continue;
            }
            // An odd f16 row (2-byte units) also goes by rows.
            let kernel = |t: &Tensor, name: &str| {
                let options = kiln::profiler::ProfileOptions {
                    devices: vec![dev.clone()],
                    profile_memory: false,
                };
                let (_, prof) = kiln::profiler::profile(&options, || {
                    t.contiguous().unwrap();
                    dev.synchronize()
                })
                .unwrap();
                prof.chrome_trace_json().contains(name)
            };
            if dtype == DType::F16 {
                let odd = g.narrow(1, 3, 50).unwrap();
                assert!(kernel(&odd, "copy_rows_f16"), "{dev:?}: odd f16 rows");
            } else {
                // Rows of whole words that are not whole vectors: four words a store.
                let words = g.narrow(0, 1, 30).unwrap().narrow(1, 2, 50).unwrap();
                assert!(
                    kernel(&words, "copy_rows_words"),
                    "{dev:?} {dtype}: word rows"
                );
            }
            let options = kiln::profiler::ProfileOptions {
                devices: vec![dev.clone()],
                profile_memory: false,
            };
            let (_, prof) = kiln::profiler::profile(&options, || {
                g.narrow(1, 8, 32).unwrap().contiguous().unwrap();
                dev.synchronize()
            })
            .unwrap();
            assert!(
                prof.chrome_trace_json().contains("copy_rows_vec4"),
                "{dev:?} {dtype}: the word kernel did not run"
            );
        }
    }
}
