//! Backward of conv2d and pooling, built from matmul and in-place adds over window views: for
//! each kernel tap (ki, kj) the inputs it touched form a strided view of the (padded) input, so
//! grad_input adds `g @ w[:, :, ki, kj]` into that view and grad_weight[:, :, ki, kj] is
//! `g^T @ view`. Exact for any stride, padding, dilation and groups; kh*kw matmuls per group.

use super::Conv2dParams;
use crate::kernels::{launch, Kernel};
use crate::tensor::Tensor;
use crate::Result;

/// `x` [N, C, H, W] with `ph`, `pw` elements of `value` on each side.
fn pad(x: &Tensor, ph: usize, pw: usize, value: f64) -> Result<Tensor> {
    let s = x.shape();
    if ph == 0 && pw == 0 {
        return x.contiguous();
    }
    let out = Tensor::full(
        &[s[0], s[1], s[2] + 2 * ph, s[3] + 2 * pw],
        value,
        x.dtype(),
        x.device(),
    )?;
    out.narrow(2, ph, s[2])?.narrow(3, pw, s[3])?.copy_(x)?;
    Ok(out)
}

/// The [N, C, OH, OW] view of contiguous `xp` read by tap (ki, kj).
fn window(
    xp: &Tensor,
    tap: (usize, usize),
    stride: (usize, usize),
    dilation: (usize, usize),
    out: (usize, usize),
) -> Tensor {
    let s = xp.shape();
    let st = xp.strides();
    let offset = xp.layout().offset + tap.0 * dilation.0 * st[2] + tap.1 * dilation.1 * st[3];
    xp.as_strided(
        &[s[0], s[1], out.0, out.1],
        &[st[0], st[1], stride.0 * st[2], stride.1 * st[3]],
        offset,
    )
}

/// (grad_input, grad_weight, grad_bias) of conv2d; `needs` as the engine gives it.
pub(super) fn conv2d_backward(
    x: Option<&Tensor>,
    x_shape: &[usize],
    w: &Tensor,
    g: &Tensor,
    p: Conv2dParams,
    needs: [bool; 3],
) -> Result<[Option<Tensor>; 3]> {
    let (n, h, wd) = (x_shape[0], x_shape[2], x_shape[3]);
    let (cout, cin_g, kh, kw) = (w.shape()[0], w.shape()[1], w.shape()[2], w.shape()[3]);
    let (oh, ow) = (g.shape()[2], g.shape()[3]);
    let g = g.contiguous()?;
    let gb = needs[2].then(|| g.sum(&[0, 2, 3], false)).transpose()?;
    let geometry = super::conv_gemm::Geometry::new(x_shape, w.shape(), (oh, ow), p);
    if super::conv_gemm::suits(&g, &geometry) {
        let [gx, gw] =
            super::conv_gemm::grads(&g, &w.contiguous()?, x, &geometry, [needs[0], needs[1]])?;
        return Ok([gx, gw, gb]);
    }
    let padded = [
        x_shape[0],
        x_shape[1],
        h + 2 * p.padding.0,
        wd + 2 * p.padding.1,
    ];
    let cout_g = cout / p.groups;
    let rows = (n * oh * ow) as isize;
    let xp = match (needs[1], x) {
        (true, Some(x)) => Some(pad(x, p.padding.0, p.padding.1, 0.0)?),
        _ => None,
    };
    let gx = needs[0]
        .then(|| Tensor::zeros(&padded, g.dtype(), g.device()))
        .transpose()?;
    let gw = needs[1]
        .then(|| Tensor::zeros(w.shape(), w.dtype(), w.device()))
        .transpose()?;
    for grp in 0..p.groups {
        let gg = g.narrow(1, grp * cout_g, cout_g)?;
        // [N*OH*OW, Cout_g]
        let g_rows = gg
            .permute(&[0, 2, 3, 1])?
            .reshape(&[rows, cout_g as isize])?;
        for ki in 0..kh {
            for kj in 0..kw {
                let wk = w
                    .narrow(0, grp * cout_g, cout_g)?
                    .narrow(2, ki, 1)?
                    .narrow(3, kj, 1)?
                    .reshape(&[cout_g as isize, cin_g as isize])?;
                if let Some(gx) = &gx {
                    // [N*OH*OW, Cin_g] -> [N, Cin_g, OH, OW] into the window.
                    let contrib = g_rows
                        .matmul(&wk)?
                        .reshape(&[n as isize, oh as isize, ow as isize, cin_g as isize])?
                        .permute(&[0, 3, 1, 2])?;
                    let win = window(gx, (ki, kj), p.stride, p.dilation, (oh, ow)).narrow(
                        1,
                        grp * cin_g,
                        cin_g,
                    )?;
                    win.add_(&contrib)?;
                }
                if let (Some(gw), Some(xp)) = (&gw, &xp) {
                    let xs = window(xp, (ki, kj), p.stride, p.dilation, (oh, ow))
                        .narrow(1, grp * cin_g, cin_g)?
                        .permute(&[0, 2, 3, 1])?
                        .reshape(&[rows, cin_g as isize])?;
                    let tap = g_rows.t()?.matmul(&xs)?;
                    gw.narrow(0, grp * cout_g, cout_g)?
                        .narrow(2, ki, 1)?
                        .narrow(3, kj, 1)?
                        .reshape(&[cout_g as isize, cin_g as isize])?
                        .copy_(&tap)?;
                }
            }
        }
    }
    let gx = gx
        .map(|gx| gx.narrow(2, p.padding.0, h)?.narrow(3, p.padding.1, wd))
        .transpose()?;
    Ok([gx, gw, gb])
}

/// grad_input of max (first maximum of each window takes the gradient, as in PyTorch) or
/// average pooling (count_include_pad): one gathering kernel on a GPU
/// (`shaders/pool2d_backward.wgsl`); on the CPU device, the reference, from strided window
/// views, one accumulation per tap.
pub(super) fn pool2d_backward(
    x: &Tensor,
    out: Option<&Tensor>,
    g: &Tensor,
    kernel: (usize, usize),
    stride: (usize, usize),
    padding: (usize, usize),
) -> Result<Tensor> {
    let (h, w) = (x.shape()[2], x.shape()[3]);
    let (oh, ow) = (g.shape()[2], g.shape()[3]);
    if !x.device().is_cpu() {
        return pool2d_backward_gpu(x, out.is_some(), g, kernel, stride, padding);
    }
    let fill = if out.is_some() {
        f64::NEG_INFINITY
    } else {
        0.0
    };
    let xp = pad(x, padding.0, padding.1, fill)?;
    let gx = Tensor::zeros(xp.shape(), x.dtype(), x.device())?;
    let mut taken = match out {
        Some(_) => Some(Tensor::zeros(g.shape(), g.dtype(), g.device())?),
        None => None,
    };
    for ki in 0..kernel.0 {
        for kj in 0..kernel.1 {
            let win = window(&gx, (ki, kj), stride, (1, 1), (oh, ow));
            match (out, &mut taken) {
                (Some(out), Some(taken)) => {
                    let hit = window(&xp, (ki, kj), stride, (1, 1), (oh, ow))
                        .eq(out)?
                        .to_dtype(g.dtype())?;
                    let first = hit.mul(&taken.neg()?.add_scalar(1.0)?)?;
                    win.add_(&g.mul(&first)?)?;
                    *taken = taken.add(&first)?;
                }
                _ => win.add_(&g.div_scalar((kernel.0 * kernel.1) as f64)?)?,
            }
        }
    }
    gx.narrow(2, padding.0, h)?.narrow(3, padding.1, w)
}

/// `pool2d_backward` on a GPU: one invocation per input element gathers the gradients of the
/// windows that contain it (for max pooling, those whose index names it).
fn pool2d_backward_gpu(
    x: &Tensor,
    is_max: bool,
    g: &Tensor,
    kernel: (usize, usize),
    stride: (usize, usize),
    padding: (usize, usize),
) -> Result<Tensor> {
    let op = if is_max {
        "max_pool2d_backward"
    } else {
        "avg_pool2d_backward"
    };
    let (x, g) = (x.contiguous()?, g.contiguous()?);
    let s = x.shape();
    let gx = Tensor::empty(s, x.dtype(), x.device())?;
    if gx.numel() == 0 {
        return Ok(gx);
    }
    super::u32_of(op, x.layout().offset + x.numel())?;
    super::u32_of(op, g.layout().offset + g.numel())?;
    let window = super::conv::Pool2dWindow {
        kernel,
        stride,
        padding,
        is_max,
    };
    let out_hw = (g.shape()[2], g.shape()[3]);
    let imm = window.immediates(op, &x, out_hw, g.layout().offset)?;
    // Max pooling: each window's index first (PyTorch's forward returns them; kiln finds them
    // here from the saved input), so that the gather reads one index per window.
    let idx = match is_max {
        true => {
            let idx = Tensor::empty(g.shape(), crate::tensor::DType::U32, x.device())?;
            let blocks = [&x.storage.block, &idx.storage.block];
            let fwd = window.immediates(op, &x, out_hw, 0)?;
            let n = g.numel() as u64;
            launch(Kernel::Pool2dArgmax(x.dtype()), &blocks, &fwd, n)?;
            Some(idx)
        }
        false => None,
    };
    let idx_block = idx.as_ref().map_or(&g.storage.block, |t| &t.storage.block);
    launch(
        Kernel::Pool2dBackward(x.dtype()),
        &[&g.storage.block, idx_block, &gx.storage.block],
        &imm,
        gx.numel() as u64,
    )?;
    Ok(gx)
}
