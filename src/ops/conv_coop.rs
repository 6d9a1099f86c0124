//! The f16 convolution on tensor cores, where the adapter has cooperative matrices: the forward
//! pass and both gradients, one group, channels in whole vectors of eight (ResNet's every layer
//! but the stem). Every operand is read NHWC, so that eight channels of one pixel are one
//! 16-byte load (as cuDNN's and CUTLASS's tensor-core convolutions want): the input and the
//! output's gradient go to NHWC copies first, memory-bound transposes paid so that the gathers
//! are vector loads.
//!
//! - Forward (`Kernel::ConvCoop`): A gathered from the input, B the weight as `[o][tap][c]`.
//! - Input gradient: at stride 1 the forward pass of the output's gradient with the kernel
//!   rotated (`Geometry::rotated`; the kernel's flipped variant reads the weight's taps in
//!   reverse, so the weight's copy is only transposed, `[c][tap][o]`); at a larger stride, phase by
//!   phase (`conv_gemm::Phases`), each phase such a pass with its sub-kernel, copied into every
//!   s-th row and column.
//! - Weight gradient (`Kernel::ConvCoopWgrad`): `[o][tap, c] = gy^T @ gathered x`, K (the
//!   pixels) split over workgroup layers into f32 partials summed after, as the SIMT kernels do.

use super::conv_gemm::{forced, Geometry, Phases};
use super::u32_of;
use crate::kernels::{launch_groups, CoopTile, Kernel};
use crate::tensor::{DType, Tensor};
use crate::Result;

/// The forward kernel's tile for `g` (input `x`), where the tensor-core path takes it: f16,
/// an adapter with cooperative matrices, one group, channels that fit a tile
/// (`CoopTile::fits_conv`).
fn conv_tile(x: &Tensor, g: &Geometry) -> Option<CoopTile> {
    let info = crate::kernels::coop_f16(x.device())?;
    if x.dtype() != DType::F16 || g.p.groups != 1 || forced().direct {
        return None;
    }
    CoopTile::for_conv(g.o, g.c, info.limits.max_compute_workgroup_storage_size)
}

/// Whether every operand starts on a 16-byte vector.
fn aligned(ts: &[&Tensor]) -> bool {
    ts.iter().all(|t| t.layout().offset.is_multiple_of(8))
}

/// The f16 forward pass on tensor cores, where the shape suits (`None` where it does not).
pub(super) fn forward(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    g: &Geometry,
) -> Result<Option<Tensor>> {
    let Some(tile) = conv_tile(x, g) else {
        return Ok(None);
    };
    let bias = bias.map(|b| b.contiguous()).transpose()?;
    if bias.as_ref().is_some_and(|b| !aligned(&[b])) {
        return Ok(None);
    }
    let (xh, wp) =
        super::contiguous_two(&x.permute(&[0, 2, 3, 1])?, &weight.permute(&[0, 2, 3, 1])?)?;
    run("conv2d", &xh, &wp, bias.as_ref(), g, tile, false)
}

/// `conv2d(xh, wp) (+ bias)` on `ConvCoop`, NCHW, from `xh` (the input, contiguous NHWC) and
/// `wp` (the weight as a contiguous `[o][tap][c]`); with `flip`, the weight's tap t serves as
/// tap `taps - 1 - t`. `None` where an operand does not start on a vector.
fn run(
    op: &'static str,
    xh: &Tensor,
    wp: &Tensor,
    bias: Option<&Tensor>,
    g: &Geometry,
    tile: CoopTile,
    flip: bool,
) -> Result<Option<Tensor>> {
    let (m, n, k) = (g.n * g.oh * g.ow, g.o, g.kh * g.kw * g.c);
    // Straight into NCHW where every image's pixels are whole 8-runs (56x56, 28x28), else NHWC
    // and a transpose after (14x14, 7x7).
    let nchw = (g.oh * g.ow).is_multiple_of(8) && !forced().nhwc;
    let shape = if nchw {
        [g.n, g.o, g.oh, g.ow]
    } else {
        [g.n, g.oh, g.ow, g.o]
    };
    let y = Tensor::empty(&shape, DType::F16, xh.device())?;
    if !aligned(&[xh, wp, &y]) {
        return Ok(None);
    }
    let flags = bias.is_some() as usize | (nchw as usize) << 1;
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
        bias.map_or(0, |b| b.layout().offset),
        g.h,
        g.w,
        g.c / 8,
        g.oh,
        g.ow,
        g.kw,
    ]
    .into_iter()
    .chain(g.p.window())
    .chain([g.c, flags, g.kh * g.kw, 0])
    .map(|v| u32_of(op, v))
    .collect::<Result<Vec<u32>>>()?;
    for t in [xh, wp, &y] {
        u32_of(op, t.layout().offset + t.numel())?;
    }
    let groups = (
        u32_of(op, n / tile.block_n() as usize)?,
        u32_of(op, m.div_ceil(tile.block_m() as usize))?,
        1,
    );
    let bias_block = bias.map_or(&wp.storage.block, |t| &t.storage.block);
    launch_groups(
        Kernel::ConvCoop(tile, flip),
        &[
            &xh.storage.block,
            &wp.storage.block,
            &y.storage.block,
            bias_block,
        ],
        &imm,
        groups,
    )?;
    if nchw {
        return Ok(Some(y));
    }
    y.permute(&[0, 3, 1, 2])?.contiguous().map(Some)
}

/// The input's gradient's tile where the tensor-core path takes it from `gy` (the output's
/// gradient): at stride 1 the rotated convolution's, else the phases'.
pub(super) fn input_grad_tile(
    gy: &Tensor,
    rotated: Option<&Geometry>,
    phases: Option<&Phases>,
) -> Option<CoopTile> {
    match (rotated, phases) {
        (Some(r), _) => conv_tile(gy, r),
        (None, Some(phases)) => conv_tile(gy, &phases.first()?),
        (None, None) => None,
    }
}

/// The input's gradient on tensor cores (`tile` from `input_grad_tile`) from `gh` (the output's
/// gradient, contiguous NHWC): at stride 1 (`rotated`), or phase by phase (`phases`). `None`
/// where an operand does not start on a vector.
pub(super) fn input_grad(
    gh: &Tensor,
    weight: &Tensor,
    tile: CoopTile,
    rotated: Option<&Geometry>,
    phases: Option<&Phases>,
) -> Result<Option<Tensor>> {
    const OP: &str = "conv2d_backward";
    if let Some(r) = rotated {
        // [o, c, kh, kw] -> [c, kh, kw, o]: the rotated kernel with its taps in place.
        let wt = weight.permute(&[1, 2, 3, 0])?.contiguous()?;
        return run(OP, gh, &wt, None, r, tile, true);
    }
    let Some(phases) = phases else {
        return Ok(None);
    };
    let dx = phases.zeroed_grad(gh)?;
    for (sub, pg, out) in phases.parts(weight, &dx)? {
        let Some(y) = run(OP, gh, &sub.contiguous()?, None, &pg, tile, true)? else {
            return Ok(None);
        };
        out.copy_(&y)?;
    }
    Ok(Some(dx))
}

/// The weight gradient's tile where the tensor-core path takes it from `gy` (the output's
/// gradient): f16, one group, input and output channels in vectors of eight.
pub(super) fn weight_grad_tile(gy: &Tensor, g: &Geometry) -> Option<CoopTile> {
    let info = crate::kernels::coop_f16(gy.device())?;
    if gy.dtype() != DType::F16
        || g.p.groups != 1
        || !g.c.is_multiple_of(8)
        || !g.o.is_multiple_of(8)
        || forced().direct
    {
        return None;
    }
    CoopTile::for_wgrad(
        g.o,
        g.kh * g.kw * g.c,
        info.limits.max_compute_workgroup_storage_size,
    )
}

/// The weight's gradient on tensor cores (`tile` from `weight_grad_tile`), `[o, c, kh, kw]` in
/// f16, from `gh` and `xh` (the output's gradient and the input, contiguous NHWC). The pixels
/// (K) are split so that about 512 workgroups run (at least 256 pixels each); each layer of
/// workgroups stores its f32 partial, padded to whole tiles, and the partials are summed after.
/// `None` where an operand does not start on a vector.
pub(super) fn weight_grad(
    gh: &Tensor,
    xh: &Tensor,
    g: &Geometry,
    tile: CoopTile,
) -> Result<Option<Tensor>> {
    const OP: &str = "conv2d_backward";
    if !aligned(&[gh, xh]) {
        return Ok(None);
    }
    let (bm, bn) = (tile.block_m() as usize, tile.block_n() as usize);
    let (m, n, k_total) = (g.o, g.kh * g.kw * g.c, g.n * g.oh * g.ow);
    let (mp, np) = (m.next_multiple_of(bm), n.next_multiple_of(bn));
    let tiles = (mp / bm) * (np / bn);
    let splits = 512usize
        .div_ceil(tiles)
        .clamp(1, k_total.div_ceil(256).max(1));
    let k = k_total
        .div_ceil(splits)
        .next_multiple_of(tile.k_step() as usize);
    let splits = k_total.div_ceil(k);
    let partial = Tensor::empty(&[splits, mp, np], DType::F32, gh.device())?;
    let p = g.p;
    let imm = [
        mp,
        np,
        k,
        splits,
        gh.layout().offset,
        k * m,
        m,
        xh.layout().offset,
        0,
        0,
        partial.layout().offset,
        k_total,
        m,
        n,
        g.h,
        g.w,
        g.c / 8,
        g.oh,
        g.ow,
        g.kw,
    ]
    .into_iter()
    .chain(p.window())
    .chain([g.c, 0])
    .map(|v| u32_of(OP, v))
    .collect::<Result<Vec<u32>>>()?;
    for t in [gh, xh, &partial] {
        u32_of(OP, t.layout().offset + t.numel())?;
    }
    let groups = (
        u32_of(OP, np / bn)?,
        u32_of(OP, mp / bm)?,
        u32_of(OP, splits)?,
    );
    launch_groups(
        Kernel::ConvCoopWgrad(tile),
        &[&gh.storage.block, &xh.storage.block, &partial.storage.block],
        &imm,
        groups,
    )?;
    let summed = match splits {
        1 => partial,
        _ => partial.sum(&[0], false)?,
    };
    // [o][(ky, kx, c)] (rows of np) read as [o, c, kh, kw], cast to f16 in one pass.
    let off = summed.layout().offset;
    summed
        .as_strided(&[g.o, g.c, g.kh, g.kw], &[np, 1, g.kw * g.c, g.c], off)
        .to_dtype(DType::F16)
        .map(Some)
}
