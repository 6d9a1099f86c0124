use kiln::{DType, Device, Tensor};

/// The 128-tile kernel this adapter gets (padded or swizzled shared memory; scalar loads for
/// ragged shapes, vec4 loads for whole aligned tiles) on ragged, transposed random operands,
/// and `linear`'s bias epilogue, against the CPU.
pub fn matmul128(dev: &Device) -> kiln::Result<()> {
    let cpu = Device::cpu()?;
    kiln::ops::force_matmul_tile(Some(128));
    let mut worst = 0f64;
    // Ragged shapes take the scalar kernel; whole aligned tiles the vec4 one (f32).
    for (m, k, n, transposed) in [
        (257, 131, 385, false),
        (300, 77, 260, true),
        (256, 48, 384, false),
        (256, 32, 128, true),
    ] {
        let a = Tensor::randn(&[m, k], DType::F32, &cpu)?;
        let b = Tensor::randn(&[k, n], DType::F32, &cpu)?;
        let (ga, gb) = (a.to_device(dev)?, b.to_device(dev)?);
        let (ga, gb) = if transposed {
            (ga.t()?.contiguous()?.t()?, gb.t()?.contiguous()?.t()?)
        } else {
            (ga, gb)
        };
        let got = ga.matmul(&gb)?.to_vec::<f32>()?;
        let want = a.matmul(&b)?.to_vec::<f32>()?;
        worst = worst.max(worst_relative(&got, &want));
    }
    // The bias epilogue: linear on whole tiles.
    let (x, w, b) = (
        Tensor::randn(&[256, 64], DType::F32, &cpu)?,
        Tensor::randn(&[384, 64], DType::F32, &cpu)?,
        Tensor::randn(&[384], DType::F32, &cpu)?,
    );
    let [gx, gw, gb] = [&x, &w, &b].map(|t| t.to_device(dev));
    let got = kiln::ops::linear(&gx?, &gw?, Some(&gb?))?.to_vec::<f32>()?;
    let want = kiln::ops::linear(&x, &w, Some(&b))?.to_vec::<f32>()?;
    worst = worst.max(worst_relative(&got, &want));
    kiln::ops::force_matmul_tile(None);
    verdict(dev, "matmul 128-tile kernel", worst, 1e-4)
}

/// The f16 matmul (tensor cores where the adapter has cooperative matrices: these shapes are
/// whole tiles) on random operands, a batch and an offset view, against the CPU's product of the
/// same f16 values in f32: only the final rounding to f16 differs.
pub fn f16_matmul(dev: &Device) -> kiln::Result<()> {
    let cpu = Device::cpu()?;
    let mut worst = 0f64;
    // Operands stored row-major or transposed (`t`: the GPU copy is laid out [k][m] or [n][k]
    // and viewed back), in every combination the tensor-core kernel has a layout for.
    let stored = |x: &Tensor, t: bool| -> kiln::Result<Tensor> {
        let g = x.to_device(dev)?;
        if t {
            g.transpose(-1, -2)?.contiguous()?.transpose(-1, -2)
        } else {
            Ok(g)
        }
    };
    for (batch, m, k, n, offset, a_t, b_t) in [
        (1, 256, 512, 256, 0, false, false),
        (2, 256, 96, 512, 0, false, false),
        (1, 512, 256, 256, 8, false, false),
        (1, 256, 512, 256, 0, false, true),
        // B^T prefers K slices of 64, then 256-row tiles: k = 96 and m = 384 fit neither
        // (the default takes it); k = 96 and m = 256 fit the second.
        (1, 384, 96, 128, 0, false, true),
        (1, 256, 96, 128, 0, false, true),
        (2, 256, 96, 512, 0, true, false),
        (1, 256, 128, 384, 0, true, true),
    ] {
        let a = Tensor::randn(&[batch, m + offset, k], DType::F32, &cpu)?
            .to_dtype(DType::F16)?
            .narrow(1, offset, m)?;
        let b = Tensor::randn(&[batch, k, n], DType::F32, &cpu)?.to_dtype(DType::F16)?;
        let got = stored(&a, a_t)?
            .matmul(&stored(&b, b_t)?)?
            .to_dtype(DType::F32)?
            .to_vec::<f32>()?;
        let want = a
            .to_dtype(DType::F32)?
            .matmul(&b.to_dtype(DType::F32)?)?
            .to_vec::<f32>()?;
        worst = worst.max(worst_relative(&got, &want));
    }
    // 2-D products that are not whole tiles: ragged K or N (split into a tensor-core part and
    // a SIMT rest) and a long K over a narrow N (split-K), as an MLP with 784 inputs and 10
    // classes has them: x @ W1^T, g^T @ x, h @ W3^T.
    for (m, k, n, a_t, b_t) in [
        (512, 784, 256, false, true),
        (256, 512, 784, true, false),
        (256, 784, 400, false, false),
        (512, 4096, 10, false, true),
    ] {
        let a = Tensor::randn(&[m, k], DType::F32, &cpu)?.to_dtype(DType::F16)?;
        let b = Tensor::randn(&[k, n], DType::F32, &cpu)?.to_dtype(DType::F16)?;
        let got = stored(&a, a_t)?
            .matmul(&stored(&b, b_t)?)?
            .to_dtype(DType::F32)?
            .to_vec::<f32>()?;
        let want = a
            .to_dtype(DType::F32)?
            .matmul(&b.to_dtype(DType::F32)?)?
            .to_vec::<f32>()?;
        let e = worst_relative(&got, &want);
        println!("f16 {m}x{k}x{n} (A^T {a_t}, B^T {b_t}): max relative error {e:.2e}");
        worst = worst.max(e);
    }
    // As in PyTorch, the product allocates its f16 result and nothing else (the tensor-core
    // kernel rounds its f32 accumulators in place of an f32 temporary and a cast).
    let (a, b) = (
        Tensor::randn(&[512, 256], DType::F16, dev)?,
        Tensor::randn(&[256, 512], DType::F16, dev)?,
    );
    dev.synchronize()?;
    dev.reset_peak_memory_stats();
    let before = dev.memory_allocated();
    let c = a.matmul(&b)?;
    let extra = dev.max_memory_allocated() - before;
    if extra != (c.numel() * 2) as u64 {
        return Err(kiln::Error::InvalidArgument {
            op: "bench",
            msg: format!(
                "f16 matmul allocated {extra} bytes for a {} byte result",
                c.numel() * 2
            ),
        });
    }
    // f16 keeps 11 significant bits: the cast of the f32 sum is off by at most 2^-11 of it.
    verdict(dev, "f16 matmul", worst, 1e-3)
}

/// The f16 convolution (on tensor cores where the adapter has cooperative matrices: every shape
/// here but the 3-channel stem fits them, with pixels that end inside a tile, strides,
/// dilation, a bias and a non-contiguous input) against the CPU's f32 convolution of the same
/// f16 values: only the final rounding to f16 differs.
pub fn conv_f16(dev: &Device) -> kiln::Result<()> {
    use kiln::ops::{conv2d, Conv2dParams};
    let cpu = Device::cpu()?;
    let mut worst = 0f64;
    let p = |stride, padding, dilation| Conv2dParams {
        stride: (stride, stride),
        padding: (padding, padding),
        dilation: (dilation, dilation),
        groups: 1,
    };
    for (x, w, params, bias, permuted) in [
        ([4, 64, 14, 14], [64, 64, 3, 3], p(1, 1, 1), false, false),
        ([2, 128, 9, 9], [256, 128, 1, 1], p(2, 0, 1), false, false),
        ([2, 64, 11, 13], [128, 64, 3, 3], p(2, 1, 1), true, true),
        ([3, 32, 8, 8], [64, 32, 3, 3], p(1, 2, 2), true, false),
        ([2, 3, 32, 32], [64, 3, 7, 7], p(2, 3, 1), false, false),
        // Whole 8-pixel runs per image: written straight to NCHW.
        ([2, 64, 8, 8], [64, 64, 3, 3], p(1, 1, 1), true, false),
        ([3, 128, 16, 16], [256, 128, 1, 1], p(1, 0, 1), true, true),
        ([2, 64, 12, 12], [128, 64, 3, 3], p(1, 1, 1), false, false),
    ] {
        let f16 = |shape: &[usize], scale: f64| -> kiln::Result<Tensor> {
            Tensor::randn(shape, DType::F32, &cpu)?
                .mul_scalar(scale)?
                .to_dtype(DType::F16)
        };
        let xs = f16(&x, 1.0)?;
        let ws = f16(&w, 0.1)?;
        let bs = f16(&[w[0]], 1.0)?;
        // A non-contiguous input: stored NHWC on the device, viewed back as NCHW.
        let gx = if permuted {
            xs.to_device(dev)?
                .permute(&[0, 2, 3, 1])?
                .contiguous()?
                .permute(&[0, 3, 1, 2])?
        } else {
            xs.to_device(dev)?
        };
        let (gw, gb) = (ws.to_device(dev)?, bs.to_device(dev)?);
        let got = conv2d(&gx, &gw, bias.then_some(&gb), params)?
            .to_dtype(DType::F32)?
            .to_vec::<f32>()?;
        let [xf, wf, bf] = [&xs, &ws, &bs].map(|t| t.to_dtype(DType::F32));
        let bf = bf?;
        let want = conv2d(&xf?, &wf?, bias.then_some(&bf), params)?.to_vec::<f32>()?;
        let e = worst_relative(&got, &want);
        println!("conv f16 {x:?} * {w:?} {params:?} bias {bias}: max relative error {e:.2e}");
        worst = worst.max(e);
    }
    verdict(dev, "f16 convolution", worst, 1e-3)
}

/// Fails the run where the largest error `worst` passes `limit`; else prints it.
fn verdict(dev: &Device, what: &str, worst: f64, limit: f64) -> kiln::Result<()> {
    if worst > limit {
        return Err(kiln::Error::InvalidArgument {
            op: "bench",
            msg: format!("{what} check failed: relative error {worst}"),
        });
    }
    println!(
        "{what} check on {}: max relative error {worst:.2e}",
        dev.name()
    );
    Ok(())
}

/// The largest error of `got` against `want`, relative to `1 + |want|`.
fn worst_relative(got: &[f32], want: &[f32]) -> f64 {
    got.iter()
        .zip(want)
        .map(|(g, w)| ((g - w).abs() / (1.0 + w.abs())) as f64)
        .fold(0.0, f64::max)
}
