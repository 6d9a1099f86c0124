//! The vec4 128-tile f32 matmul (whole tiles, 16-byte aligned rows) in every operand layout, and
//! `linear` (one `AddmmBackward0` node, the bias in the kernel's epilogue where it can be)
//! forward and backward, against the CPU device.

#[path = "common/observe.rs"]
mod observe;
use kiln::kernels::tune;
use kiln::{DType, Device, Tensor};
use observe::{allocation_delta, kernel_trace};

/// Held by each test for its whole run: a cold compile of the 128-tile kernel on GL (llvmpipe)
/// takes ~90 s and holds wgpu's GL context lock, which another test's GL calls give up on after a
/// second (a panic in wgpu-hal).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn gpus() -> Vec<Device> {
    let d = kiln::device::test_devices().expect("KILN_REQUIRE_GPU=1 and no GPU adapter");
    d.into_iter().filter(|d| !d.is_cpu()).collect()
}

/// Largest |got - want| over (1 + |want|).
fn worst(got: &Tensor, want: &Tensor) -> f32 {
    assert_eq!(got.shape(), want.shape());
    let (g, w) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
    g.iter()
        .zip(&w)
        .map(|(g, w)| (g - w).abs() / (1.0 + w.abs()))
        .fold(0.0, f32::max)
}

/// `worst` of `a @ b` on their device against the same product on `cpu`.
fn product_error(a: &Tensor, b: &Tensor, cpu: &Device) -> f32 {
    let got = a.matmul(b).unwrap();
    let on_cpu = |t: &Tensor| t.to_device(cpu).unwrap();
    worst(&got, &on_cpu(a).matmul(&on_cpu(b)).unwrap())
}

/// The profiler's trace of `a @ b` on their device.
fn product_trace(a: &Tensor, b: &Tensor) -> String {
    kernel_trace(a.device(), || a.matmul(b).map(drop))
}

/// A [rows, cols] view of random values: with `transposed`, the transpose of a contiguous
/// [cols, rows + 4] tensor's last `rows` columns (unit stride along rows); else the last `cols`
/// columns of a [rows, cols + 4] tensor. Either way an offset of 4 and a row stride of 4 more.
fn operand(rows: usize, cols: usize, transposed: bool, seed: u64, dev: &Device) -> Tensor {
    dev.manual_seed(seed);
    let cpu = Device::cpu().unwrap();
    cpu.manual_seed(seed);
    let (r, c) = if transposed {
        (cols, rows + 4)
    } else {
        (rows, cols + 4)
    };
    let base = Tensor::randn(&[r, c], DType::F32, &cpu)
        .unwrap()
        .to_device(dev)
        .unwrap();
    let view = base.narrow(1, 4, c - 4).unwrap();
    if transposed {
        view.t().unwrap()
    } else {
        view
    }
}

#[test]
fn vec4_matmul_reads_every_layout() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cpu = Device::cpu().unwrap();
    for dev in gpus() {
        // The vec4 kernel is a 128-tile kernel: force it for these few tiles.
        kiln::ops::force_matmul_tile(Some(128));
        // n = 260: a partial last tile of columns (the kernel skips B's vectors and the stores
        // past n). K = 16: one slice, which loads itself again and stores it into the other
        // buffer (`flat_slices`); 48: three. (A K of 16 is also a narrow product's, which the
        // tuner may give to the narrow kernels: kept on the tiled ones.)
        tune::force_variant("matmul narrow", Some("tiled"));
        for (ta, tb, n, k) in [
            (false, false, 256, 48),
            (false, true, 256, 48),
            (true, false, 256, 48),
            (true, true, 256, 48),
            (false, false, 260, 48),
            (true, true, 260, 48),
            (false, true, 256, 16),
            (true, false, 256, 16),
        ] {
            let m = 128;
            let a = operand(m, k, ta, 1, &dev);
            let b = operand(k, n, tb, 2, &dev);
            let e = product_error(&a, &b, &cpu);
            assert!(e < 1e-4, "{dev:?} a^T {ta} b^T {tb} n {n} k {k}: error {e}");
            // A column-major A by a row-major B and a row-major A by a column-major B run
            // their own kernels, the layout compiled in (`Operands`); the others test the
            // strides at run time.
            // (Not on GL, which keeps to the scalar 128-tile kernel.)
            let info = dev.adapter_info().unwrap();
            let gl = info.backend == wgpu::Backend::Gl;
            if info.features.timestamp_query && !gl && n == 256 {
                let trace = product_trace(&a, &b);
                assert!(trace.contains("matmul128_vec4_f32"), "{trace}");
                let want = match (ta, tb) {
                    (true, false) => Some("_ac_br"),
                    (false, true) => Some("_ar_bc"),
                    _ => None,
                };
                for suffix in ["_ac_br", "_ar_bc"] {
                    assert_eq!(
                        trace.contains(suffix),
                        want == Some(suffix),
                        "a^T {ta} b^T {tb}: {trace}"
                    );
                }
            }
            // A row-major A by a row-major B: the autotuning candidate that copies A
            // column-major and runs that kernel.
            if !ta && !tb && !gl {
                tune::force_variant("matmul", Some("tile128_vec4_col_a"));
                let e = product_error(&a, &b, &cpu);
                assert!(e < 1e-4, "{dev:?} col_a n {n}: error {e}");
                if info.features.timestamp_query {
                    let trace = product_trace(&a, &b);
                    assert!(
                        trace.contains("_ac_br"),
                        "col_a ran another kernel: {trace}"
                    );
                }
                tune::force_variant("matmul", None);
            }
        }
        tune::force_variant("matmul narrow", None);
        // A batch whose operands are slices of one tensor (batch strides multiples of 4).
        let x = operand(2 * 128, 32, false, 3, &dev)
            .reshape(&[2, 128, 32])
            .unwrap();
        let w = operand(32, 128, true, 4, &dev);
        let got = x.matmul(&w).unwrap();
        let want = x
            .to_device(&cpu)
            .unwrap()
            .matmul(&w.to_device(&cpu).unwrap())
            .unwrap();
        assert!(worst(&got, &want) < 1e-4, "{dev:?} batched");
        kiln::ops::force_matmul_tile(None);
    }
}

#[test]
fn linear_fuses_its_bias_and_backpropagates_through_it() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cpu = Device::cpu().unwrap();
    for dev in gpus() {
        kiln::ops::force_matmul_tile(Some(128));
        // Whole tiles (the epilogue bias), a batch of 48 (the bias gradient's row sums over a
        // K that is no multiple of 32), a bias at an offset no multiple of 4 (a separate
        // add), ragged shapes (the scalar kernel) and a 3-D input.
        for (x_shape, out, bias_offset) in [
            (vec![128, 48], 256, 0),
            (vec![48, 48], 256, 0),
            (vec![128, 48], 256, 1),
            (vec![130, 45], 129, 0),
            (vec![2, 128, 32], 128, 0),
        ] {
            let fin = *x_shape.last().unwrap();
            cpu.manual_seed(7);
            let data = [x_shape.clone(), vec![out, fin], vec![out + bias_offset]]
                .map(|s| Tensor::randn(&s, DType::F32, &cpu).unwrap());
            let on = |d: &Device| {
                let [x, w, b] = data
                    .clone()
                    .map(|t| t.to_device(d).unwrap().requires_grad_(true).unwrap());
                let y = kiln::ops::linear(&x, &w, Some(&b.narrow(0, bias_offset, out).unwrap()))
                    .unwrap();
                let r = y.detach().to_device(&cpu).unwrap().cos().unwrap();
                let r = r.to_device(d).unwrap();
                y.mul(&r).unwrap().sum_all().unwrap().backward().unwrap();
                let grads = [&x, &w, &b].map(|t| t.grad().unwrap());
                (y, grads)
            };
            let (gy, gg) = on(&dev);
            let (cy, cg) = on(&cpu);
            let what = format!("{dev:?} x {x_shape:?} out {out} bias offset {bias_offset}");
            assert!(worst(&gy, &cy) < 1e-4, "{what}: output");
            for (i, (g, c)) in gg.iter().zip(&cg).enumerate() {
                let e = worst(g, c);
                assert!(e < 1e-4, "{what}: gradient {i}: error {e}");
            }
        }
        // The bias's gradient (checked above) comes from the weight gradient's kernel, which
        // sums `g`'s rows as it loads them (`_ac_br_rowsum`), not from a column sum. (Not on
        // GL, which keeps to the scalar kernel.)
        let info = dev.adapter_info().unwrap();
        if info.features.timestamp_query && info.backend != wgpu::Backend::Gl {
            let [x, w, b] = [vec![128, 48], vec![256, 48], vec![256]]
                .map(|s| Tensor::randn(&s, DType::F32, &dev).unwrap());
            let [x, w, b] = [x, w, b].map(|t| t.requires_grad_(true).unwrap());
            let y = kiln::ops::linear(&x, &w, Some(&b)).unwrap();
            let loss = y.mul(&y.detach()).unwrap().sum_all().unwrap();
            let trace = kernel_trace(&dev, || loss.backward());
            assert!(trace.contains("_ac_br_rowsum"), "{dev:?}: {trace}");
            assert!(!trace.contains("colsum"), "{dev:?}: {trace}");
        }
        kiln::ops::force_matmul_tile(None);
        // A classifier head (10 outputs; its weight's gradient `g^T @ x` on the narrow `cols`
        // kernel, K = 300 rows, a partial last 256): the bias's gradient from the same launch.
        tune::force_variant("matmul narrow", Some("narrow"));
        cpu.manual_seed(9);
        let data = [vec![300, 40], vec![10, 40], vec![10]]
            .map(|s| Tensor::randn(&s, DType::F32, &cpu).unwrap());
        let on = |d: &Device| {
            let [x, w, b] = data
                .clone()
                .map(|t| t.to_device(d).unwrap().requires_grad_(true).unwrap());
            let y = kiln::ops::linear(&x, &w, Some(&b)).unwrap();
            let r = y.detach().to_device(&cpu).unwrap().cos().unwrap();
            let loss = y.mul(&r.to_device(d).unwrap()).unwrap().sum_all().unwrap();
            let trace = (!d.is_cpu()).then(|| kernel_trace(d, || loss.backward()));
            if d.is_cpu() {
                loss.backward().unwrap();
            }
            ([&x, &w, &b].map(|t| t.grad().unwrap()), trace)
        };
        let ((gg, trace), (cg, _)) = (on(&dev), on(&cpu));
        for (i, (g, c)) in gg.iter().zip(&cg).enumerate() {
            let e = worst(g, c);
            assert!(e < 1e-4, "{dev:?} head: gradient {i}: error {e}");
        }
        if let Some(trace) = trace.filter(|_| info.features.timestamp_query) {
            assert!(trace.contains("matmul_narrow_cols"), "{dev:?}: {trace}");
            // No reduction op or kernel (`sum`, `sum_f32_...`, `colsum_...`).
            for name in ["\"name\":\"sum\"", "\"name\":\"sum_f32"] {
                assert!(!trace.contains(name), "{dev:?}: {trace}");
            }
            assert!(!trace.contains("colsum"), "{dev:?}: {trace}");
        }
        tune::force_variant("matmul narrow", None);
    }
}

/// `t` on `dev`, stored transposed (and viewed back) where `transposed`: a Linear's `W^T`.
fn on_device(t: &Tensor, dev: &Device, transposed: bool) -> Tensor {
    let g = t.to_device(dev).unwrap();
    match transposed {
        true => g.t().unwrap().contiguous().unwrap().t().unwrap(),
        false => g,
    }
}

/// f16 products as an MLP with 784 inputs and 10 classes meets them under autocast (ragged K
/// or N, `g^T @ x` with A transposed; a long K over a narrow N, which takes split-K; few output
/// tiles of two row-major operands), against the CPU's f32 product of the same f16 values: only
/// f16 roundings of partial results differ. On adapters with cooperative matrices the ragged
/// dim is padded with zeros to whole tiles, the few tiles take the eight-subgroup tile, and
/// few tiles over a long K with A transposed (a weight gradient) take K split into f32
/// partials.
#[test]
fn f16_products_of_ragged_and_narrow_shapes_match_the_cpu() {
    let cpu = Device::cpu().unwrap();
    let devices = kiln::device::test_devices().expect("KILN_REQUIRE_GPU=1 and no GPU adapter");
    for dev in devices
        .into_iter()
        .filter(|d| !d.is_cpu() && d.adapter_info().is_some_and(|i| i.features.shader_f16))
    {
        for (m, k, n, a_t, b_t) in [
            (64, 784, 128, false, true),
            (128, 64, 784, false, false),
            (256, 128, 784, true, false),
            (256, 512, 256, false, false),
            (64, 4096, 10, false, true),
            // A ragged M with A transposed (GPT-2's head gradient `g^T @ h`, the vocabulary
            // along M), alone and with a ragged N.
            (301, 256, 128, true, false),
            (301, 64, 150, true, false),
            // Few 128 x 128 output tiles over a long K (a weight gradient `g^T @ x`), too many
            // for the widened route: on tensor cores K is split across workgroup layers into
            // f32 partials, summed, then rounded.
            (256, 1024, 512, true, false),
        ] {
            let a = Tensor::randn(&[m, k], DType::F32, &cpu)
                .unwrap()
                .to_dtype(DType::F16)
                .unwrap();
            let ga = on_device(&a, &dev, a_t);
            let b = Tensor::randn(&[k, n], DType::F32, &cpu)
                .unwrap()
                .to_dtype(DType::F16)
                .unwrap();
            let gb = on_device(&b, &dev, b_t);
            let got = ga.matmul(&gb).unwrap();
            assert_eq!(got.dtype(), DType::F16);
            let coop = dev
                .adapter_info()
                .is_some_and(|a| a.features.cooperative_matrix);
            if coop && a_t && k >= 1024 {
                let trace = product_trace(&ga, &gb);
                assert!(trace.contains("_partials"), "{dev:?} {m}x{k}x{n}: {trace}");
            }
            let got = got.to_f64_vec().unwrap();
            let want = a
                .to_dtype(DType::F32)
                .unwrap()
                .matmul(&b.to_dtype(DType::F32).unwrap())
                .unwrap()
                .to_f64_vec()
                .unwrap();
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (g - w).abs() <= 2e-3 * (1.0 + w.abs()),
                    "{dev:?} {m}x{k}x{n}: {g} vs {w}"
                );
            }
        }
        // A Linear's `x @ W^T + b`, K whole tiles or ragged (padded): on tensor cores the bias
        // is added in the kernel, before the rounding.
        let f16 = |shape: &[usize]| {
            Tensor::randn(shape, DType::F32, &cpu)
                .unwrap()
                .to_dtype(DType::F16)
                .unwrap()
        };
        for k in [128, 784] {
            let (x, w, b) = (f16(&[256, k]), f16(&[128, k]), f16(&[128]));
            let on = |t: &Tensor| t.to_device(&dev).unwrap();
            let got = kiln::ops::linear(&on(&x), &on(&w), Some(&on(&b)))
                .unwrap()
                .to_f64_vec()
                .unwrap();
            let wide = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
            let want = kiln::ops::linear(&wide(&x), &wide(&w), Some(&wide(&b)))
                .unwrap()
                .to_f64_vec()
                .unwrap();
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (g - w).abs() <= 2e-3 * (1.0 + w.abs()),
                    "{dev:?} linear with bias, K = {k}: {g} vs {w}"
                );
            }
        }
    }
}

/// K too long for one invocation on a CPU adapter (llvmpipe breaks out of an invocation's loops
/// after 65535 loop headers; these shapes came back wrong by up to 3.0 with K = 65535, which no
/// route split), in f32 and f16, with a narrow side and without, against the CPU: on CPU
/// adapters K goes in slices whose products are summed.
#[test]
fn products_longer_than_llvmpipes_loop_limit_match_the_cpu() {
    let cpu = Device::cpu().unwrap();
    for dev in gpus() {
        let f16 = dev.adapter_info().is_some_and(|a| a.features.shader_f16);
        for (m, k, n) in [(16, 65535, 16), (16, 65537, 1), (64, 70001, 10)] {
            for dtype in [DType::F32, DType::F16] {
                if dtype == DType::F16 && !f16 {
                    continue;
                }
                let draw = |shape: &[usize]| {
                    Tensor::randn(shape, DType::F32, &cpu)
                        .unwrap()
                        .mul_scalar(0.1)
                        .unwrap()
                        .to_dtype(dtype)
                        .unwrap()
                };
                let (a, b) = (draw(&[m, k]), draw(&[k, n]));
                let wide = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
                let want = wide(&a).matmul(&wide(&b)).unwrap().to_f64_vec().unwrap();
                let on = |t: &Tensor| t.to_device(&dev).unwrap();
                let got = on(&a).matmul(&on(&b)).unwrap().to_f64_vec().unwrap();
                for (g, w) in got.iter().zip(&want) {
                    assert!(
                        (g - w).abs() <= 2e-3 * (1.0 + w.abs()),
                        "{dev:?} {dtype} {m}x{k}x{n}: {g} vs {w}"
                    );
                }
            }
        }
    }
}

/// f32 products split for the kernels, against the CPU: too few tiles to fill a large GPU, K
/// split into chunks summed after (a long K of 4096 over a 512x10 output; a K of 512 under a
/// wide, flat output, the MLP's 10x4096 head gradient `g^T @ h` with A transposed; and a
/// product just under the size where that pays, unsplit); and, for contrast, an N that is not a
/// whole number of 128-column tiles (`g^T @ x` with N = 784 in the MLP; here 1100), which runs
/// whole on the scalar 128-tile kernel (split into the vec4 kernel's whole tiles and the rest
/// it was slower on the H100: 1.95 -> 1.975 ms per f32 MLP step).
#[test]
fn split_products_match_the_cpu() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cpu = Device::cpu().unwrap();
    for dev in gpus() {
        for (i, &(m, k, n, ta)) in [
            (512, 4096, 10, false),
            (10, 512, 4096, true),
            (10, 768, 4096, false),
            (8, 512, 1024, true),
            (1024, 64, 1100, true),
        ]
        .iter()
        .enumerate()
        {
            let a = operand(m, k, ta, 5 + i as u64, &dev);
            let b = operand(k, n, false, 9 + i as u64, &dev);
            let e = product_error(&a, &b, &cpu);
            assert!(e < 2e-4, "{dev:?} {m}x{k}x{n} a^T {ta}: error {e}");
        }
    }
}

/// `ops::linear_relu` against `linear` then `relu`: the values (NaN kept) against the CPU, the
/// gradients, the graph's node, and every allocator statistic the two leave behind, on the same
/// device; where the vec4 kernel takes the product, no ReLU kernel runs (its epilogue clamps).
#[test]
fn linear_relu_is_linear_then_relu() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cpu = Device::cpu().unwrap();
    for dev in gpus() {
        kiln::ops::force_matmul_tile(Some(128));
        let (m, k, n) = (128, 48, 256);
        cpu.manual_seed(11);
        let x = Tensor::randn(&[m, k], DType::F32, &cpu).unwrap();
        let w = Tensor::randn(&[n, k], DType::F32, &cpu).unwrap();
        let b = Tensor::randn(&[n], DType::F32, &cpu).unwrap();
        let c = Tensor::randn(&[m, n], DType::F32, &cpu).unwrap();
        let on = |t: &Tensor, d: &Device| t.to_device(d).unwrap();

        // Values, with a NaN in one row of x (its whole output row is NaN either way).
        let mut xv = x.to_vec::<f32>().unwrap();
        xv[3 * k + 5] = f32::NAN;
        let xn = Tensor::from_slice(&xv, &[m, k], &cpu).unwrap();
        let got = kiln::ops::linear_relu(&on(&xn, &dev), &on(&w, &dev), Some(&on(&b, &dev)))
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let want = kiln::ops::linear(&xn, &w, Some(&b))
            .unwrap()
            .relu()
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.is_nan(), w.is_nan(), "{dev:?} element {i}: {g} vs {w}");
            if !w.is_nan() {
                assert!(
                    (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
                    "{dev:?} {i}: {g} vs {w}"
                );
            }
        }
        assert!(got[3 * n..4 * n].iter().all(|v| v.is_nan()));
        // x column-major (a transposed copy, transposed back): with W^T, both operands
        // column-major, the kernel that tests the layouts at run time, the same epilogue
        // (the row-major x above runs the kernel with its layout compiled in).
        let xt = on(&xn, &dev)
            .t()
            .unwrap()
            .contiguous()
            .unwrap()
            .t()
            .unwrap();
        let got_t = kiln::ops::linear_relu(&xt, &on(&w, &dev), Some(&on(&b, &dev)))
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        for (i, (g, w)) in got_t.iter().zip(&want).enumerate() {
            assert_eq!(
                g.is_nan(),
                w.is_nan(),
                "{dev:?} x^T element {i}: {g} vs {w}"
            );
            if !w.is_nan() {
                assert!(
                    (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
                    "{dev:?} x^T {i}: {g} vs {w}"
                );
            }
        }

        // Gradients and graph, and the allocator's statistics over a forward and backward,
        // fused and not (the first run of each tunes the product; the second is measured).
        let leaves = |d: &Device| [&x, &w, &b].map(|t| on(t, d).requires_grad_(true).unwrap());
        let step = |d: &Device, fused: bool| {
            let [xl, wl, bl] = leaves(d);
            let r = match fused {
                true => kiln::ops::linear_relu(&xl, &wl, Some(&bl)).unwrap(),
                false => kiln::ops::linear(&xl, &wl, Some(&bl))
                    .unwrap()
                    .relu()
                    .unwrap(),
            };
            assert_eq!(r.grad_fn_name(), Some("ReluBackward0"));
            r.mul(&on(&c, d))
                .unwrap()
                .sum(&[0, 1], false)
                .unwrap()
                .backward()
                .unwrap();
            [xl, wl, bl].map(|t| t.grad().unwrap().to_vec::<f32>().unwrap())
        };
        let stats = |fused: bool| {
            step(&dev, fused);
            dev.synchronize().unwrap();
            let before = dev.memory_stats();
            dev.reset_peak_memory_stats();
            let grads = step(&dev, fused);
            dev.synchronize().unwrap();
            (grads, allocation_delta(&before, &dev.memory_stats()))
        };
        let (plain, plain_stats) = stats(false);
        let (fused, fused_stats) = stats(true);
        assert_eq!(
            plain_stats, fused_stats,
            "{dev:?}: allocator statistics differ"
        );
        let reference = step(&cpu, false);
        for (i, name) in ["x", "w", "b"].iter().enumerate() {
            for (got, label) in [(&fused[i], "fused"), (&plain[i], "plain")] {
                let worst = got
                    .iter()
                    .zip(&reference[i])
                    .map(|(g, w)| (g - w).abs() / (1.0 + w.abs()))
                    .fold(0.0, f32::max);
                assert!(
                    worst < 1e-4,
                    "{dev:?} {label} grad of {name}: error {worst}"
                );
            }
        }

        // The kernels: the vec4 product alone where it runs (not on GL, which keeps to the
        // scalar kernel and then runs the ReLU's own).
        let info = dev.adapter_info().unwrap();
        if info.features.timestamp_query {
            let (xd, wd, bd) = (on(&x, &dev), on(&w, &dev), on(&b, &dev));
            let trace = kernel_trace(&dev, || {
                kiln::ops::linear_relu(&xd, &wd, Some(&bd)).map(drop)
            });
            let vec4 = info.backend != wgpu::Backend::Gl;
            assert_eq!(trace.contains("matmul128_vec4"), vec4, "{trace}");
            assert_eq!(trace.contains("unary_relu"), !vec4, "{trace}");
        }
        kiln::ops::force_matmul_tile(None);
    }
}

/// Note [Backward epilogues]: an MLP whose ReLUs' backward formulas ride in the epilogues of
/// the products that compute their incoming gradients (the head's `g @ W3` on the narrow
/// `short` kernels, the hidden layer's `g @ W2` on the vec4 128-tile in both of its layouts),
/// against the CPU device and against the same device with the epilogues off: the gradients,
/// the allocator's statistics over a step, and the kernels (no ReLU backward kernel runs where
/// every product took its mask; one per ReLU with them off).
#[test]
fn relu_backward_rides_in_the_products() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cpu = Device::cpu().unwrap();
    let (batch, inputs, hidden, classes) = (128, 48, 256, 10);
    cpu.manual_seed(21);
    let shapes = [
        vec![hidden, inputs],
        vec![hidden],
        vec![hidden, hidden],
        vec![hidden],
        vec![classes, hidden],
        vec![classes],
    ];
    let params: Vec<Tensor> = shapes
        .iter()
        .map(|s| Tensor::randn(s, DType::F32, &cpu).unwrap())
        .collect();
    let x = Tensor::randn(&[batch, inputs], DType::F32, &cpu).unwrap();
    let c = Tensor::randn(&[batch, classes], DType::F32, &cpu).unwrap();
    // Linear + ReLU (fused forward), Linear then ReLU, the head; the loss sum(y * c).
    let step = |d: &Device| -> Vec<Vec<f32>> {
        let on = |t: &Tensor| t.to_device(d).unwrap();
        let p: Vec<Tensor> = params
            .iter()
            .map(|t| on(t).requires_grad_(true).unwrap())
            .collect();
        let h1 = kiln::ops::linear_relu(&on(&x), &p[0], Some(&p[1])).unwrap();
        let h2 = kiln::ops::linear(&h1, &p[2], Some(&p[3]))
            .unwrap()
            .relu()
            .unwrap();
        let y = kiln::ops::linear(&h2, &p[4], Some(&p[5])).unwrap();
        y.mul(&on(&c))
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        p.iter()
            .map(|t| t.grad().unwrap().to_vec::<f32>().unwrap())
            .collect()
    };
    let reference = step(&cpu);
    for dev in gpus() {
        let info = dev.adapter_info().unwrap();
        kiln::ops::force_matmul_tile(Some(128));
        for (tile, narrow) in [
            ("tile128_vec4", "narrow"),
            ("tile128_vec4_col_a", "narrow_vec4"),
        ] {
            tune::force_variant("matmul", Some(tile));
            tune::force_variant("matmul narrow", Some(narrow));
            let what = format!("{dev:?} {tile} {narrow}");
            // With and without the epilogues: the same gradients (the same products, the
            // formula applied in the epilogue or by its own kernel), near the CPU's, and the
            // same allocator statistics (the second step of each, after tuning).
            let mut runs = Vec::new();
            for on in [true, false] {
                kiln::autograd::set_backward_epilogues(on);
                step(&dev);
                dev.synchronize().unwrap();
                let before = dev.memory_stats();
                dev.reset_peak_memory_stats();
                let grads = step(&dev);
                dev.synchronize().unwrap();
                runs.push((grads, allocation_delta(&before, &dev.memory_stats())));
            }
            kiln::autograd::set_backward_epilogues(true);
            let ((fused, fused_stats), (plain, plain_stats)) = (&runs[0], &runs[1]);
            assert_eq!(fused_stats, plain_stats, "{what}: allocator statistics");
            for (i, want) in reference.iter().enumerate() {
                assert_eq!(fused[i], plain[i], "{what}: gradient {i} with and without");
                let e = fused[i]
                    .iter()
                    .zip(want)
                    .map(|(g, w)| (g - w).abs() / (1.0 + w.abs()))
                    .fold(0.0, f32::max);
                // (Three layers of f32 sums over 128 to 256 terms: the CPU's order differs.)
                assert!(e < 1e-3, "{what}: gradient {i}: error {e}");
            }
            // The kernels: none for ReLU's backward where both products applied the masks (not
            // on GL, which keeps to the scalar 128-tile kernel: there the hidden layer's ReLU
            // runs its own kernel, the head's rides in `short`).
            if info.features.timestamp_query {
                let trace = |on: bool| {
                    kiln::autograd::set_backward_epilogues(on);
                    let t = kernel_trace(&dev, || {
                        step(&dev);
                        Ok(())
                    });
                    kiln::autograd::set_backward_epilogues(true);
                    t.matches("ReluBackward0_f32").count()
                };
                let vec4 = info.backend != wgpu::Backend::Gl;
                assert_eq!(trace(true), if vec4 { 0 } else { 1 }, "{what}");
                assert_eq!(trace(false), 2, "{what}");
            }
        }
        tune::force_variant("matmul", None);
        tune::force_variant("matmul narrow", None);
        kiln::ops::force_matmul_tile(None);
    }
}

/// ReLU's backward as PyTorch's `threshold_backward`: zero where the output is <= 0, the
/// gradient elsewhere, a NaN output included; in its own kernel and in the products'
/// epilogues alike (a NaN in one row of `W2` makes a NaN column of the hidden ReLU's output,
/// whose gradient must still reach `W2`'s row).
#[test]
fn relu_backward_passes_the_gradient_at_nan_outputs() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let devices = kiln::device::test_devices().unwrap();
    for dev in &devices {
        let x = Tensor::from_slice(&[f32::NAN, -1.0, 0.0, 2.0], &[4], dev)
            .unwrap()
            .requires_grad_(true)
            .unwrap();
        x.relu().unwrap().sum_all().unwrap().backward().unwrap();
        let g = x.grad().unwrap().to_vec::<f32>().unwrap();
        assert_eq!(g, [1.0, 0.0, 0.0, 1.0], "{dev:?}");
    }
    let cpu = Device::cpu().unwrap();
    let (batch, hidden, classes, j) = (128, 256, 10, 7);
    cpu.manual_seed(4);
    let h1 = Tensor::randn(&[batch, hidden], DType::F32, &cpu).unwrap();
    let mut w2 = Tensor::randn(&[hidden, hidden], DType::F32, &cpu)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    w2[j * hidden + 3] = f32::NAN;
    let w2 = Tensor::from_slice(&w2, &[hidden, hidden], &cpu).unwrap();
    let w3 = Tensor::randn(&[classes, hidden], DType::F32, &cpu).unwrap();
    let step = |d: &Device, epilogues: bool| {
        kiln::autograd::set_backward_epilogues(epilogues);
        let on = |t: &Tensor| t.to_device(d).unwrap().requires_grad_(true).unwrap();
        let (h1, w2, w3) = (on(&h1), on(&w2), on(&w3));
        let h2 = kiln::ops::linear_relu(&h1, &w2, None).unwrap();
        let y = kiln::ops::linear(&h2, &w3, None).unwrap();
        y.sum_all().unwrap().backward().unwrap();
        kiln::autograd::set_backward_epilogues(true);
        [&h1, &w2, &w3].map(|t| t.grad().unwrap().to_vec::<f32>().unwrap())
    };
    let same = |a: &[f32], b: &[f32]| {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
    };
    let reference = step(&cpu, true);
    // W2's row j: the gradient passed at the NaN column, finite and not all zero.
    let row = &reference[1][j * hidden..(j + 1) * hidden];
    assert!(row.iter().all(|v| v.is_finite()) && row.iter().any(|v| *v != 0.0));
    for dev in gpus() {
        kiln::ops::force_matmul_tile(Some(128));
        tune::force_variant("matmul", Some("tile128_vec4"));
        tune::force_variant("matmul narrow", Some("narrow_vec4"));
        let (fused, plain) = (step(&dev, true), step(&dev, false));
        for i in 0..3 {
            assert!(same(&fused[i], &plain[i]), "{dev:?}: gradient {i}");
        }
        let got = &fused[1][j * hidden..(j + 1) * hidden];
        let e = got
            .iter()
            .zip(row)
            .map(|(g, w)| (g - w).abs() / (1.0 + w.abs()))
            .fold(0.0, f32::max);
        assert!(e < 1e-4, "{dev:?}: W2's row {j}: error {e}");
        tune::force_variant("matmul", None);
        tune::force_variant("matmul narrow", None);
        kiln::ops::force_matmul_tile(None);
    }
}

/// The head tests' cases on an adapter: each shape (m, n, k) in f32 and, where the adapter has
/// shader-f16, f16; on llvmpipe only those of up to 2^20 elements in x (the MLP's own head,
/// 512x10 by K = 4096, takes most of a second a product there).
fn head_cases(
    info: &kiln::AdapterInfo,
    shapes: &[(usize, usize, usize)],
) -> Vec<(usize, usize, usize, DType)> {
    let software = info.device_type == wgpu::DeviceType::Cpu;
    let dtypes = match info.features.shader_f16 {
        true => &[DType::F32, DType::F16][..],
        false => &[DType::F32][..],
    };
    shapes
        .iter()
        .filter(|&&(m, _, k)| !software || m * k <= 1 << 20)
        .flat_map(|&(m, n, k)| dtypes.iter().map(move |&d| (m, n, k, d)))
        .collect()
}

/// `head_step` on `dev` in `dtype` (its kernel trace first, where the adapter has timestamps),
/// and on the CPU in f32: (trace, got, want).
fn head_runs(
    inputs: [&Tensor; 4],
    relu: bool,
    dev: &Device,
    dtype: DType,
) -> (Option<String>, [Tensor; 4], [Tensor; 4]) {
    let trace = dev
        .adapter_info()
        .unwrap()
        .features
        .timestamp_query
        .then(|| {
            kernel_trace(dev, || {
                head_step(inputs, relu, dev, dtype);
                Ok(())
            })
        });
    let got = head_step(inputs, relu, dev, dtype);
    let want = head_step(inputs, relu, inputs[0].device(), DType::F32);
    (trace, got, want)
}

/// A classifier head `y = linear(x, W, b)` (of `relu(x)` with `relu`) on `d` in `dt`, and the
/// backward of sum(y * r): y and x's, W's and b's gradients, as f32 on the CPU.
fn head_step([x, w, b, r]: [&Tensor; 4], relu: bool, d: &Device, dt: DType) -> [Tensor; 4] {
    let cpu = x.device();
    let on = |t: &Tensor| {
        let t = t.to_device(d).unwrap().to_dtype(dt).unwrap();
        t.requires_grad_(true).unwrap()
    };
    let (x, w, b) = (on(x), on(w), on(b));
    let r = r.to_device(d).unwrap().to_dtype(dt).unwrap();
    let input = if relu { x.relu().unwrap() } else { x.clone() };
    let y = kiln::ops::linear(&input, &w, Some(&b)).unwrap();
    y.mul(&r).unwrap().sum_all().unwrap().backward().unwrap();
    [
        y.detach(),
        x.grad().unwrap(),
        w.grad().unwrap(),
        b.grad().unwrap(),
    ]
    .map(|t| t.to_dtype(DType::F32).unwrap().to_device(cpu).unwrap())
}

/// The classifier head `x @ W^T + b` and its gradients with the narrow kernels' vec4 variants
/// (`rows4`: 16-byte loads along K, subgroup sums; `short4` for the input's gradient where K is
/// 16 or less) and with the plain ones, against the CPU: rows not a multiple of four, 3 to 16
/// columns, a K that is not a multiple of a workgroup's 1024, f32 and f16. Where the adapter
/// has subgroups and timestamps, the trace names the kernel that ran.
#[test]
fn narrow_head_vec4_variants_match_the_cpu() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cpu = Device::cpu().unwrap();
    cpu.manual_seed(12);
    for dev in gpus() {
        let info = dev.adapter_info().unwrap();
        let sub = info.features.subgroups;
        // (The two gradients in one launch: `head_grads_in_one_launch_match_the_cpu`.)
        tune::force_variant("matmul narrow grads", Some("separate"));
        for variant in ["narrow_vec4", "narrow"] {
            tune::force_variant("matmul narrow", Some(variant));
            // (The MLP's own head, 512x10 by K = 4096, only on hardware: on llvmpipe each of
            // its products takes most of a second.)
            let shapes = [
                (301, 10, 260),
                (17, 16, 1024),
                (64, 3, 4096),
                (512, 10, 4096),
            ];
            for (m, n, k, dtype) in head_cases(info, &shapes) {
                let make = |s: &[usize]| {
                    Tensor::randn(s, DType::F32, &cpu)
                        .unwrap()
                        .to_dtype(dtype)
                        .unwrap()
                };
                let (x, w, b, r) = (make(&[m, k]), make(&[n, k]), make(&[n]), make(&[m, n]));
                // Forward, and the backward of sum(y * r): dx = r @ W (`short`), dW =
                // r^T @ x (`cols`, where the batch m is 256 or more) with db, the sums of
                // r's rows.
                let (trace, got, want) = head_runs([&x, &w, &b, &r], false, &dev, dtype);
                let what = format!("{dev:?} {variant} {dtype} {m}x{n}x{k}");
                // f16: the output's rounding, and the gradients' sums over m rows.
                let tol = if dtype == DType::F16 { 2e-3 } else { 1e-4 };
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let e = worst(g, w);
                    let tol = if i == 0 { tol } else { tol * 4.0 };
                    assert!(e < tol, "{what}: output {i}: error {e}");
                }
                // The kernels that ran, where the forced variant is a candidate (a variant
                // that is not leaves the choice to the tuner; GL keeps to the tiled path).
                if let Some(trace) = trace.filter(|_| info.backend != wgpu::Backend::Gl) {
                    let rows = match variant {
                        "narrow_vec4" if sub => Some("matmul_narrow_rows4"),
                        "narrow" => Some("matmul_narrow_rows_"),
                        _ => None,
                    };
                    if let Some(rows) = rows {
                        assert!(trace.contains(rows), "{what}: {trace}");
                    }
                    let (short, cols) = match variant {
                        "narrow_vec4" => ("matmul_narrow_short4", None),
                        _ => ("matmul_narrow_short_", Some("matmul_narrow_cols_")),
                    };
                    assert!(trace.contains(short), "{what}: {trace}");
                    if let Some(cols) = cols.filter(|_| m >= 256) {
                        assert!(trace.contains(cols), "{what}: {trace}");
                    }
                }
            }
        }
        tune::force_variant("matmul narrow", None);
        tune::force_variant("matmul narrow grads", None);
    }
}

/// A classifier head after a ReLU, `linear(relu(x), W, b)`, whose backward runs `short4` (the
/// input's gradient with the ReLU's mask) and `cols` (the weight's, with the bias's) in one
/// dispatch (`matmul_narrow_head_grads`) or in two, against the CPU: x's, W's and b's
/// gradients, f32 and f16, a batch that is no multiple of 4 or 16 and, on hardware, the MLP's
/// 512x10 by K = 4096. The trace names the kernels that ran where the adapter has timestamps.
#[test]
fn head_grads_in_one_launch_match_the_cpu() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cpu = Device::cpu().unwrap();
    cpu.manual_seed(13);
    // `short4` for x's gradient, `cols` for W's (`a|b`: the first that is a candidate).
    tune::force_variant("matmul narrow", Some("narrow_vec4|narrow"));
    // (Not on GL: a round took 40 s on its llvmpipe, for the WGSL the Vulkan adapters run.)
    let gpus = gpus()
        .into_iter()
        .filter(|d| d.adapter_info().unwrap().backend != wgpu::Backend::Gl);
    for dev in gpus {
        let info = dev.adapter_info().unwrap();
        for grads in ["grouped", "separate"] {
            tune::force_variant("matmul narrow grads", Some(grads));
            for (m, n, k, dtype) in head_cases(info, &[(301, 10, 260), (512, 10, 4096)]) {
                // Values of the dtype, both sides reading the same ones; x kept 0.01 or
                // more from zero, where an f16 ReLU on the H100 flushes subnormals to zero
                // (and so masks what the CPU's f32 keeps).
                let make = |s: &[usize]| {
                    let v = Tensor::randn(s, DType::F32, &cpu).unwrap();
                    let v: Vec<f32> = v.to_vec::<f32>().unwrap();
                    let v: Vec<f32> = v
                        .iter()
                        .map(|x| {
                            if x.abs() < 0.01 {
                                0.01f32.copysign(*x)
                            } else {
                                *x
                            }
                        })
                        .collect();
                    Tensor::from_slice(&v, s, &cpu)
                        .unwrap()
                        .to_dtype(dtype)
                        .unwrap()
                        .to_dtype(DType::F32)
                        .unwrap()
                };
                let (x, w, b, r) = (make(&[m, k]), make(&[n, k]), make(&[n]), make(&[m, n]));
                let (trace, got, want) = head_runs([&x, &w, &b, &r], true, &dev, dtype);
                let what = format!("{dev:?} {grads} {dtype} {m}x{n}x{k}");
                // f16: the inputs' rounding, and the gradients' sums over m rows.
                let tol = if dtype == DType::F16 { 8e-3 } else { 4e-4 };
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let e = worst(g, w);
                    assert!(e < tol, "{what}: output {i}: error {e}");
                }
                // x's gradient is zero where the ReLU clamped: the mask was applied.
                let gx = got[1].to_vec::<f32>().unwrap();
                let xs = x.to_vec::<f32>().unwrap();
                assert!(
                    gx.iter().zip(&xs).all(|(g, x)| *x > 0.0 || *g == 0.0),
                    "{what}"
                );
                if let Some(trace) = trace {
                    let one = trace.contains("matmul_narrow_head_grads");
                    let two = trace.contains("matmul_narrow_short4")
                        && trace.contains("matmul_narrow_cols");
                    let want = (grads == "grouped", grads == "separate");
                    assert_eq!((one, two), want, "{what}: {trace}");
                }
            }
        }
        tune::force_variant("matmul narrow grads", None);
    }
    tune::force_variant("matmul narrow", None);
}

/// f32 products that miss the vec4 kernel only by a ragged M, N or K (GPT-2's tied head in
/// f32: `x @ W^T` with N = 50257, `g @ W` with K = 50257, `g^T @ x` with M = 50257), padded to
/// whole vectors and tiles (`matmul::coop_split`'s f32 units), forced on every adapter but GL
/// and the CPU device: the padded product runs on the vec4 kernel and matches the CPU's.
#[test]
fn ragged_f32_products_run_padded_on_the_vec4_kernel() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cpu = Device::cpu().unwrap();
    // (m, n, k, A transposed, B transposed), as the head's three products lay them out.
    let cases = [
        (256, 261, 48, false, true),
        (256, 256, 75, false, false),
        (261, 256, 64, true, false),
    ];
    for dev in gpus() {
        let info = dev.adapter_info().unwrap();
        if info.backend == wgpu::Backend::Gl {
            continue;
        }
        tune::force_variant("matmul pad", Some("vec4"));
        tune::force_variant("matmul", Some("tile128_vec4"));
        kiln::ops::force_matmul_tile(Some(128));
        for (i, &(m, n, k, ta, tb)) in cases.iter().enumerate() {
            let a = operand(m, k, ta, 10 + i as u64, &dev);
            let b = operand(k, n, tb, 20 + i as u64, &dev);
            let e = product_error(&a, &b, &cpu);
            assert!(e < 1e-4, "{dev:?} case {i}: error {e}");
            if info.features.timestamp_query {
                let trace = product_trace(&a, &b);
                assert!(trace.contains("matmul128_vec4_f32"), "case {i}: {trace}");
            }
        }
        kiln::ops::force_matmul_tile(None);
        tune::force_variant("matmul", None);
        tune::force_variant("matmul pad", None);
    }
}

/// 16 whole 128x128 tiles over K = 8192 (GPT-2's weight gradients have such shapes): K in eight
/// chunks of 1024 (`matmul_choice::fill_split`), their partial products summed. Each row of A
/// holds two ones in different chunks, so each output row is the sum of two rows of B, a
/// reference the host computes at once (the CPU device's product of this size takes minutes
/// in a debug build).
#[test]
fn eight_chunks_of_k_sum_to_the_product() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (m, k, n) = (512, 8192, 512);
    let at = |i: usize| [(i * 37) % 1024, 4096 + (i * 101) % 4096];
    let mut a = vec![0.0f32; m * k];
    for i in 0..m {
        for c in at(i) {
            a[i * k + c] = 1.0;
        }
    }
    let b: Vec<f32> = (0..k * n)
        .map(|e| ((e * 7919) % 1000) as f32 / 1000.0)
        .collect();
    for dev in gpus() {
        if dev.adapter_info().unwrap().backend == wgpu::Backend::Gl {
            continue;
        }
        let ta = Tensor::from_slice(&a, &[m, k], &dev).unwrap();
        let tb = Tensor::from_slice(&b, &[k, n], &dev).unwrap();
        let got = ta.matmul(&tb).unwrap().to_vec::<f32>().unwrap();
        for i in 0..m {
            let [c0, c1] = at(i);
            for j in 0..n {
                let want = b[c0 * n + j] + b[c1 * n + j];
                let g = got[i * n + j];
                assert!(
                    (g - want).abs() < 1e-5,
                    "{dev:?} ({i}, {j}): {g} against {want}"
                );
            }
        }
    }
}
