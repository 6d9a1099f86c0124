//! 2-D convolution and pooling over NCHW tensors, with PyTorch's parameters and output sizes.

use super::{same_device, u32_of};
use crate::base::Conv2dParams;
use crate::kernels::{launch, Kernel};
use crate::tensor::Tensor;
use crate::{Error, Result};

/// PyTorch's output size: floor((in + 2p - d(k - 1) - 1) / s) + 1, or `None` if not positive.
/// Every step is checked: huge padding, dilation or kernel sizes give `None`, never a wrapped size.
fn out_size(input: usize, k: usize, s: usize, p: usize, d: usize) -> Option<usize> {
    let span = d.checked_mul(k.checked_sub(1)?)?.checked_add(1)?;
    let padded = p.checked_mul(2)?.checked_add(input)?;
    padded.checked_sub(span).map(|r| r / s.max(1) + 1)
}

fn check_4d(op: &'static str, t: &Tensor) -> Result<()> {
    if t.rank() != 4 {
        return Err(Error::InvalidArgument {
            op,
            msg: format!(
                "expected a 4-D (N, C, H, W) tensor, got shape {:?}",
                t.shape()
            ),
        });
    }
    if !t.dtype().is_float() {
        return Err(Error::UnsupportedDType {
            op,
            dtype: t.dtype(),
            why: "(a float op)".into(),
        });
    }
    Ok(())
}

/// `conv2d(x [N, C_in, H, W], weight [C_out, C_in / groups, KH, KW], bias [C_out])`.
pub fn conv2d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    p: Conv2dParams,
) -> Result<Tensor> {
    let mut inputs = vec![x, weight];
    inputs.extend(bias);
    if let Some(v) = super::autocast::lower("conv2d", &inputs)? {
        return super::autocast::suspended(|| conv2d(&v[0], &v[1], v.get(2), p));
    }
    crate::graph::record(
        "ConvolutionBackward0",
        &inputs,
        || conv2d_forward(x, weight, bias, p),
        |_| {
            let xs = weight
                .requires_grad()
                .then(|| crate::graph::save(x))
                .transpose()?;
            let ws = crate::graph::save(weight)?;
            let shape = x.shape().to_vec();
            Ok(Box::new(move |g: &Tensor, needs: &[bool]| {
                let w = ws.get()?;
                let x = xs.as_ref().map(|s| s.get()).transpose()?;
                let want = [needs[0], needs[1], needs.get(2).copied().unwrap_or(false)];
                let [gx, gw, gb] =
                    super::conv_grad::conv2d_backward(x.as_ref(), &shape, &w, g, p, want)?;
                let mut v = vec![gx, gw];
                if needs.len() == 3 {
                    v.push(gb);
                }
                Ok(v)
            }) as crate::graph::BackwardFn)
        },
    )
}

fn conv2d_forward(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    p: Conv2dParams,
) -> Result<Tensor> {
    const OP: &str = "conv2d";
    check_4d(OP, x)?;
    check_4d(OP, weight)?;
    same_device(OP, x, weight)?;
    let (n, cin, h, w) = (x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]);
    let (cout, cin_g, kh, kw) = (
        weight.shape()[0],
        weight.shape()[1],
        weight.shape()[2],
        weight.shape()[3],
    );
    let bad = |msg: String| Error::InvalidArgument { op: OP, msg };
    if p.groups == 0 || cin % p.groups != 0 || cout % p.groups != 0 || cin_g * p.groups != cin {
        return Err(bad(format!(
            "input {:?} and weight {:?} do not fit groups={}",
            x.shape(),
            weight.shape(),
            p.groups
        )));
    }
    if p.stride.0 == 0 || p.stride.1 == 0 || p.dilation.0 == 0 || p.dilation.1 == 0 {
        return Err(bad("stride and dilation must be positive".into()));
    }
    if let Some(b) = bias {
        same_device(OP, x, b)?;
        if b.shape() != [cout] {
            return Err(Error::ShapeMismatch {
                op: OP,
                lhs: vec![cout],
                rhs: b.shape().to_vec(),
            });
        }
    }
    for t in [Some(weight), bias].into_iter().flatten() {
        if t.dtype() != x.dtype() {
            return Err(Error::DTypeMismatch {
                op: OP,
                expected: x.dtype(),
                got: t.dtype(),
            });
        }
    }
    let oh = out_size(h, kh, p.stride.0, p.padding.0, p.dilation.0);
    let ow = out_size(w, kw, p.stride.1, p.padding.1, p.dilation.1);
    let (Some(oh), Some(ow)) = (oh, ow) else {
        return Err(bad(format!(
            "kernel {kh}x{kw} (dilated) is larger than the padded input {h}x{w}"
        )));
    };
    let geometry = super::conv_gemm::Geometry::new(x.shape(), weight.shape(), (oh, ow), p);
    if n * cout * oh * ow > 0 {
        if let Some(y) = super::conv_coop::forward(x, weight, bias, &geometry)? {
            return Ok(y);
        }
    }
    let out = Tensor::empty(&[n, cout, oh, ow], x.dtype(), x.device())?;
    if out.numel() == 0 {
        return Ok(out);
    }
    let (x, weight) = (x.contiguous()?, weight.contiguous()?);
    let bias = bias.map(|b| b.contiguous()).transpose()?;
    if x.device().is_cpu() {
        crate::ops::ready_on_host(&[&x, &weight])?;
        if let Some(b) = &bias {
            b.host_ready()?;
        }
        crate::cpu::conv2d(&x, &weight, bias.as_ref(), &out, p);
        return Ok(out);
    }
    if super::conv_gemm::suits(&x, &geometry) {
        super::conv_gemm::forward(&x, &weight, bias.as_ref(), &geometry, &out)?;
        return Ok(out);
    }
    let b = bias.as_ref().unwrap_or(&weight);
    let imm = [n, cin, h, w, cout, oh, ow, kh, kw]
        .into_iter()
        .chain(p.window())
        .chain([
            p.groups,
            bias.is_some() as usize,
            x.layout().offset,
            weight.layout().offset,
            b.layout().offset,
        ])
        .map(|v| u32_of(OP, v))
        .collect::<Result<Vec<u32>>>()?;
    let blocks = [
        &x.storage.block,
        &weight.storage.block,
        &b.storage.block,
        &out.storage.block,
    ];
    launch(Kernel::Conv2d(x.dtype()), &blocks, &imm, out.numel() as u64)?;
    Ok(out)
}

/// One pooling window's geometry, as `shaders/pool2d*.wgsl` read it.
#[derive(Clone, Copy)]
pub(super) struct Pool2dWindow {
    pub kernel: (usize, usize),
    pub stride: (usize, usize),
    pub padding: (usize, usize),
    pub is_max: bool,
}

impl Pool2dWindow {
    /// The kernels' immediates over contiguous `x` [n, c, h, w] and an output of `out` rows and
    /// columns; `extra`, the last, is the gradient's offset in the backward kernel (zero in the
    /// forward kernel, whose initial -inf it is OR'd into at run time).
    pub fn immediates(
        &self,
        op: &'static str,
        x: &Tensor,
        (oh, ow): (usize, usize),
        extra: usize,
    ) -> Result<Vec<u32>> {
        let s = x.shape();
        let (k, st, p) = (self.kernel, self.stride, self.padding);
        [
            s[0] * s[1],
            s[2],
            s[3],
            oh,
            ow,
            k.0,
            k.1,
            st.0,
            st.1,
            p.0,
            p.1,
            1,
            1,
            self.is_max as usize,
            x.layout().offset,
            extra,
        ]
        .iter()
        .map(|&v| u32_of(op, v))
        .collect()
    }
}

fn pool2d(
    x: &Tensor,
    kernel: (usize, usize),
    stride: (usize, usize),
    padding: (usize, usize),
    is_max: bool,
) -> Result<Tensor> {
    let name = if is_max {
        "MaxPool2DWithIndicesBackward0"
    } else {
        "AvgPool2DBackward0"
    };
    crate::graph::record(
        name,
        &[x],
        || pool2d_forward(x, kernel, stride, padding, is_max),
        |out| {
            let xs = crate::graph::save(x)?;
            let os = is_max
                .then(|| crate::graph::save_output(out, name))
                .transpose()?;
            Ok(Box::new(move |g: &Tensor, _: &[bool]| {
                let out = os.as_ref().map(|o| o.get()).transpose()?;
                let gx = super::conv_grad::pool2d_backward(
                    &xs.get()?,
                    out.as_ref(),
                    g,
                    kernel,
                    stride,
                    padding,
                )?;
                Ok(vec![Some(gx)])
            }) as crate::graph::BackwardFn)
        },
    )
}

fn pool2d_forward(
    x: &Tensor,
    kernel: (usize, usize),
    stride: (usize, usize),
    padding: (usize, usize),
    is_max: bool,
) -> Result<Tensor> {
    let op = if is_max { "max_pool2d" } else { "avg_pool2d" };
    check_4d(op, x)?;
    let (n, c, h, w) = (x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]);
    if stride.0 == 0 || stride.1 == 0 || kernel.0 == 0 || kernel.1 == 0 {
        return Err(Error::InvalidArgument {
            op,
            msg: "kernel and stride must be positive".into(),
        });
    }
    if padding.0 > kernel.0 / 2 || padding.1 > kernel.1 / 2 {
        return Err(Error::InvalidArgument {
            op,
            msg: "pad should be at most half of the kernel size".into(),
        });
    }
    let (Some(oh), Some(ow)) = (
        out_size(h, kernel.0, stride.0, padding.0, 1),
        out_size(w, kernel.1, stride.1, padding.1, 1),
    ) else {
        return Err(Error::InvalidArgument {
            op,
            msg: format!("kernel {kernel:?} is larger than the padded input {h}x{w}"),
        });
    };
    let out = Tensor::empty(&[n, c, oh, ow], x.dtype(), x.device())?;
    if out.numel() == 0 {
        return Ok(out);
    }
    let x = x.contiguous()?;
    if x.device().is_cpu() {
        x.host_ready()?;
        crate::cpu::pool2d(&x, &out, kernel, stride, padding, is_max);
        return Ok(out);
    }
    let window = Pool2dWindow {
        kernel,
        stride,
        padding,
        is_max,
    };
    let imm = window.immediates(op, &x, (oh, ow), 0)?;
    launch(
        Kernel::Pool2d(x.dtype()),
        &[&x.storage.block, &out.storage.block],
        &imm,
        out.numel() as u64,
    )?;
    Ok(out)
}

/// Max pooling (padding is ignored; NaN propagates).
pub fn max_pool2d(
    x: &Tensor,
    kernel: (usize, usize),
    stride: (usize, usize),
    padding: (usize, usize),
) -> Result<Tensor> {
    pool2d(x, kernel, stride, padding, true)
}

/// Average pooling, dividing by the whole window (count_include_pad=True).
pub fn avg_pool2d(
    x: &Tensor,
    kernel: (usize, usize),
    stride: (usize, usize),
    padding: (usize, usize),
) -> Result<Tensor> {
    pool2d(x, kernel, stride, padding, false)
}
