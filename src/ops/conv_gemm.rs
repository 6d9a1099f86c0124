//! Convolution as implicit GEMM on the 128-tile matmul (`shaders/conv_gemm*.wgsl`): the
//! forward pass and both gradients, each one kernel over all groups (plus a one-off permuted
//! copy of the weight, and in wgrad the sum of the K splits). The direct kernel
//! (`shaders/conv2d.wgsl`) and the per-tap backward (`conv_grad.rs`) stay for what the GEMM
//! does not suit: depthwise convolutions (a GEMM of one row per group), the CPU device, and
//! GL, whose llvmpipe compiles a 128-tile variant in about 90 s.

use super::{u32_of, Conv2dParams};
use crate::kernels::{launch_groups, ConvGemm, ConvMode, CoopTile, Kernel};
use crate::tensor::{DType, Tensor};
use crate::Result;

/// The sizes of one convolution, as the kernels' immediates name them.
#[derive(Clone, Copy, Debug)]
pub(super) struct Geometry {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub o: usize,
    pub oh: usize,
    pub ow: usize,
    pub kh: usize,
    pub kw: usize,
    pub p: Conv2dParams,
}

impl Geometry {
    /// From the input's and the weight's shapes (NCHW, [o, cg, kh, kw]) and the output's size.
    pub fn new(x: &[usize], weight: &[usize], (oh, ow): (usize, usize), p: Conv2dParams) -> Self {
        Geometry {
            n: x[0],
            c: x[1],
            h: x[2],
            w: x[3],
            o: weight[0],
            oh,
            ow,
            kh: weight[2],
            kw: weight[3],
            p,
        }
    }

    fn cg(&self) -> usize {
        self.c / self.p.groups
    }

    fn og(&self) -> usize {
        self.o / self.p.groups
    }

    fn taps(&self) -> usize {
        self.kh * self.kw
    }

    /// At stride 1, the convolution whose forward pass is this one's input gradient: from the
    /// output's gradient to the input's, with the kernel rotated by 180 degrees and its channel
    /// dims swapped, padded by `dilation * (k - 1) - padding` (`None` where that is negative).
    fn rotated(&self) -> Option<Geometry> {
        let p = self.p;
        let pad = |k: usize, d: usize, pad: usize| (d * (k - 1)).checked_sub(pad);
        if p.stride != (1, 1) {
            return None;
        }
        Some(Geometry {
            n: self.n,
            c: self.o,
            h: self.oh,
            w: self.ow,
            o: self.c,
            oh: self.h,
            ow: self.w,
            kh: self.kh,
            kw: self.kw,
            p: Conv2dParams {
                padding: (
                    pad(self.kh, p.dilation.0, p.padding.0)?,
                    pad(self.kw, p.dilation.1, p.padding.1)?,
                ),
                ..p
            },
        })
    }
}

/// Whether the GEMM kernels take this convolution on `x`'s device: a GPU other than GL, at
/// least 8 output channels per group and a reduction of at least 8 (channels x taps) per
/// output (depthwise convolutions stay direct: a tile of 64 rows would be mostly empty). A
/// stem (3 input channels, 7x7) goes to the GEMM: on the H100 its direct forward and per-tap
/// backward (49 small matmuls) cost 40 ms of ResNet-50's step at batch 32.
pub(super) fn suits(x: &Tensor, g: &Geometry) -> bool {
    let Some(info) = x.device().adapter_info() else {
        return false;
    };
    info.backend != wgpu::Backend::Gl
        && matches!(x.dtype(), DType::F32 | DType::F16)
        && !forced().direct
        && g.og() >= 8
        && g.cg() * g.taps() >= 8
}

/// The switches that turn a path off for comparisons in benchmarks, read once.
struct Forced {
    /// `KILN_CONV_DIRECT`: every convolution on the direct kernel.
    direct: bool,
    /// `KILN_CONV_NCHW`: the f32 kernels gather from NCHW (scalar loads) even where the NHWC
    /// vec4 kernel applies.
    nchw: bool,
    /// `KILN_CONV_NHWC`: the tensor-core convolution always writes NHWC and transposes after.
    nhwc: bool,
}

fn forced() -> &'static Forced {
    static FORCED: std::sync::OnceLock<Forced> = std::sync::OnceLock::new();
    FORCED.get_or_init(|| {
        let set = |var| std::env::var_os(var).is_some();
        Forced {
            direct: set("KILN_CONV_DIRECT"),
            nchw: set("KILN_CONV_NCHW"),
            nhwc: set("KILN_CONV_NHWC"),
        }
    })
}

fn padded(t: &Tensor) -> bool {
    t.device()
        .adapter_info()
        .is_some_and(|i| i.limits.max_compute_workgroup_storage_size >= 33 * 1024)
}

/// Launches one mode over GEMM `[m, n, k]` (k of one split), `z` workgroup layers.
#[allow(clippy::too_many_arguments)]
fn run(
    op: &'static str,
    mode: ConvMode,
    g: &Geometry,
    [m, n, k, k_total]: [usize; 4],
    splits: usize,
    operands: [&Tensor; 3],
    bias: Option<&Tensor>,
    flip: bool,
) -> Result<()> {
    let [a, b, out] = operands;
    let kernel = ConvGemm {
        mode,
        dtype: a.dtype(),
        padded: padded(a),
        bm64: m <= 64,
    };
    let aligned = match mode {
        ConvMode::Fwd | ConvMode::FwdVec4 => g.cg().is_multiple_of(16),
        ConvMode::Dgrad => g.og().is_multiple_of(16),
        ConvMode::Wgrad => false,
    };
    // Bit 2 (FwdVec4 as the input's gradient): A's taps read in reverse.
    let flags = bias.is_some() as usize | (aligned as usize) << 1 | (flip as usize) << 2;
    let p = g.p;
    let imm = [
        &[
            m, n, k, k_total, g.n, g.c, g.h, g.w, g.o, g.oh, g.ow, g.kh, g.kw,
        ][..],
        &p.window(),
        &[
            g.cg(),
            g.og(),
            p.groups,
            a.layout().offset,
            b.layout().offset,
            out.layout().offset,
            bias.map_or(0, |t| t.layout().offset),
            flags,
            0,
        ],
    ]
    .concat()
    .iter()
    .map(|&v| u32_of(op, v))
    .collect::<Result<Vec<u32>>>()?;
    // Every element index must fit a u32 too (the kernels compute them so).
    for t in [a, b, out] {
        u32_of(op, t.layout().offset + t.numel())?;
    }
    let groups = (
        u32_of(op, n.div_ceil(128))?,
        u32_of(op, m.div_ceil(kernel.bm() as usize))?,
        u32_of(op, p.groups * splits)?,
    );
    let bias_block = bias.map_or(&a.storage.block, |t| &t.storage.block);
    launch_groups(
        Kernel::ConvGemm(kernel),
        &[
            &a.storage.block,
            &b.storage.block,
            &out.storage.block,
            bias_block,
        ],
        &imm,
        groups,
    )
}

/// The f16 forward pass on tensor cores (`Kernel::ConvCoop`), where the adapter has cooperative
/// matrices and the shape suits: one group, input channels in whole K slices, output channels
/// in whole tiles (ResNet's every layer but the stem). The input goes to NHWC and the weight to
/// `[o][kh][kw][c]` first, so that eight channels of one pixel at one tap are one 16-byte
/// load; the product comes out NHWC and goes back to NCHW. Both copies are memory-bound
/// transposes, paid so that the gather is vector loads (as cuDNN's and CUTLASS's tensor-core
/// convolutions want NHWC). `None` where the shape does not suit.
pub(super) fn forward_coop(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    g: &Geometry,
) -> Result<Option<Tensor>> {
    const OP: &str = "conv2d";
    let Some(gpu) = x.device().gpu().filter(|d| crate::kernels::coop_f16(d)) else {
        return Ok(None);
    };
    let shared = gpu.info.limits.max_compute_workgroup_storage_size;
    if x.dtype() != DType::F16 || g.p.groups != 1 || forced().direct {
        return Ok(None);
    }
    let Some(tile) = CoopTile::for_conv(g.o, g.c, shared) else {
        return Ok(None);
    };
    let bias = bias.map(|b| b.contiguous()).transpose()?;
    if bias.as_ref().is_some_and(|b| b.layout().offset % 8 != 0) {
        return Ok(None);
    }
    let xh = x.permute(&[0, 2, 3, 1])?.contiguous()?;
    let wp = weight.permute(&[0, 2, 3, 1])?.contiguous()?;
    let (m, n, k) = (g.n * g.oh * g.ow, g.o, g.taps() * g.c);
    // Straight into NCHW where every image's pixels are whole 8-runs (56x56, 28x28), else NHWC
    // and a transpose after (14x14, 7x7).
    let nchw = (g.oh * g.ow).is_multiple_of(8) && !forced().nhwc;
    let shape = if nchw {
        [g.n, g.o, g.oh, g.ow]
    } else {
        [g.n, g.oh, g.ow, g.o]
    };
    let y = Tensor::empty(&shape, DType::F16, x.device())?;
    if [&xh, &wp, &y].iter().any(|t| t.layout().offset % 8 != 0) {
        return Ok(None);
    }
    let p = g.p;
    let imm = [
        m,
        n,
        k,
        1,
        xh.layout().offset,
        0,
        0,
        wp.layout().offset,
        0,
        k,
        y.layout().offset,
        bias.as_ref().map_or(0, |b| b.layout().offset),
        g.h,
        g.w,
        g.c / 8,
        g.oh,
        g.ow,
        g.kw,
    ]
    .into_iter()
    .chain(p.window())
    .chain([g.c, bias.is_some() as usize | (nchw as usize) << 1, 0, 0])
    .map(|v| u32_of(OP, v))
    .collect::<Result<Vec<u32>>>()?;
    for t in [&xh, &wp, &y] {
        u32_of(OP, t.layout().offset + t.numel())?;
    }
    let groups = (
        u32_of(OP, n / tile.block_n() as usize)?,
        u32_of(OP, m.div_ceil(tile.block_m() as usize))?,
        1,
    );
    let bias_block = bias
        .as_ref()
        .map_or(&wp.storage.block, |t| &t.storage.block);
    launch_groups(
        Kernel::ConvCoop(tile),
        &[
            &xh.storage.block,
            &wp.storage.block,
            &y.storage.block,
            bias_block,
        ],
        &imm,
        groups,
    )?;
    drop((xh, wp));
    if nchw {
        return Ok(Some(y));
    }
    y.permute(&[0, 3, 1, 2])?.contiguous().map(Some)
}

/// `out = conv2d(x, weight) (+ bias)` into the contiguous `out`; `x`, `weight`, `bias`
/// contiguous.
pub(super) fn forward(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    g: &Geometry,
    out: &Tensor,
) -> Result<()> {
    // [o, cg, kh, kw] -> [o, kh, kw, cg]: a tap's channels together.
    let wp = weight.permute(&[0, 2, 3, 1])?.contiguous()?;
    let k = g.taps() * g.cg();
    if vec4_suits(x, g) {
        return forward_vec4("conv2d", x, &wp, bias, g, out, false);
    }
    run(
        "conv2d",
        ConvMode::Fwd,
        g,
        [g.og(), g.n * g.oh * g.ow, k, k],
        1,
        [&wp, x, out],
        bias,
        false,
    )
}

/// Whether the f32 forward pass from an NHWC copy (`ConvMode::FwdVec4`) takes this
/// convolution: one group, input channels a multiple of 16 (a slice in one tap, four channels
/// a vector).
fn vec4_suits(x: &Tensor, g: &Geometry) -> bool {
    x.dtype() == DType::F32 && g.p.groups == 1 && g.c.is_multiple_of(16) && !forced().nchw
}

/// `out = conv2d(x, w) (+ bias)` on `ConvMode::FwdVec4`, `wp` the weight as `[o][tap][c]`
/// (contiguous), `x` NCHW: four channels of a pixel per load from an NHWC copy of `x`. With
/// `flip`, tap t of `wp` serves as tap `taps - 1 - t` (the input gradient's rotated kernel).
fn forward_vec4(
    op: &'static str,
    x: &Tensor,
    wp: &Tensor,
    bias: Option<&Tensor>,
    g: &Geometry,
    out: &Tensor,
    flip: bool,
) -> Result<()> {
    let xh = x.permute(&[0, 2, 3, 1])?.contiguous()?;
    let k = g.taps() * g.c;
    run(
        op,
        ConvMode::FwdVec4,
        g,
        [g.o, g.n * g.oh * g.ow, k, k],
        1,
        [wp, &xh, out],
        bias,
        flip,
    )
}

/// The gradient of conv2d's input, [n, c, h, w], from the output's (contiguous) and the weight.
/// With stride 1 (and f32, one group, output channels a multiple of 16), it is the forward
/// pass of `Geometry::rotated`: `FwdVec4` on an NHWC copy of the gradient, the rotation read in
/// the kernel. Else the inverse-window kernel (`Dgrad`).
pub(super) fn input_grad(gy: &Tensor, weight: &Tensor, g: &Geometry) -> Result<Tensor> {
    let empty = || Tensor::empty(&[g.n, g.c, g.h, g.w], gy.dtype(), gy.device());
    if let Some(rotated) = g.rotated().filter(|r| vec4_suits(gy, r)) {
        // [o, c, kh, kw] -> [c, kh, kw, o]: A's rows are input channels, K runs over
        // (tap, output channel); the kernel reads the taps in reverse.
        let wt = weight.permute(&[1, 2, 3, 0])?.contiguous()?;
        let dx = empty()?;
        forward_vec4("conv2d_backward", gy, &wt, None, &rotated, &dx, true)?;
        return Ok(dx);
    }
    let groups = g.p.groups as isize;
    // [o, cg, kh, kw] -> [groups, kh, kw, og, cg].
    let wd = weight
        .reshape(&[
            groups,
            g.og() as isize,
            g.cg() as isize,
            g.kh as isize,
            g.kw as isize,
        ])?
        .permute(&[0, 3, 4, 1, 2])?
        .contiguous()?;
    let dx = empty()?;
    let k = g.taps() * g.og();
    run(
        "conv2d_backward",
        ConvMode::Dgrad,
        g,
        [g.cg(), g.n * g.h * g.w, k, k],
        1,
        [&wd, gy, &dx],
        None,
        false,
    )?;
    Ok(dx)
}

/// The gradient of conv2d's weight, [o, cg, kh, kw] in `x`'s dtype, from the output's
/// (contiguous) and the input (contiguous). The pixels (GEMM's K) are split so that about 512
/// workgroups run; the f32 partials are summed after.
pub(super) fn weight_grad(gy: &Tensor, x: &Tensor, g: &Geometry) -> Result<Tensor> {
    let (m, n) = (g.og(), g.taps() * g.cg());
    let k_total = g.n * g.oh * g.ow;
    let tiles = m.div_ceil(if m <= 64 { 64 } else { 128 }) * n.div_ceil(128) * g.p.groups;
    let splits = 512usize
        .div_ceil(tiles)
        .clamp(1, k_total.div_ceil(256).max(1));
    // Whole 16-deep slices per split.
    let k = k_total.div_ceil(splits).div_ceil(16) * 16;
    let splits = k_total.div_ceil(k);
    let partial = Tensor::empty(&[splits, g.p.groups, m, n], DType::F32, gy.device())?;
    run(
        "conv2d_backward",
        ConvMode::Wgrad,
        g,
        [m, n, k, k_total],
        splits,
        [gy, x, &partial],
        None,
        false,
    )?;
    let summed = match splits {
        1 => partial,
        // Over the leading dim: the column-sum kernel.
        _ => partial.sum(&[0], false)?,
    };
    // [groups, og, kh, kw, cg] -> [o, cg, kh, kw].
    summed
        .reshape(&[g.o as isize, g.kh as isize, g.kw as isize, g.cg() as isize])?
        .permute(&[0, 3, 1, 2])?
        .contiguous()?
        .to_dtype(x.dtype())
}
