//! Convolution as implicit GEMM on the 128-tile matmul (`shaders/conv_gemm*.wgsl`): the
//! forward pass and both gradients, each one kernel over all groups (plus a one-off permuted
//! copy of the weight, and in wgrad the sum of the K splits). The direct kernel
//! (`shaders/conv2d.wgsl`) and the per-tap backward (`conv_grad.rs`) stay for what the GEMM
//! does not suit: depthwise convolutions (a GEMM of one row per group), the CPU device, and
//! GL, whose llvmpipe compiles a 128-tile variant in about 90 s.

use super::{end, u32_of, Conv2dParams};
use crate::kernels::{launch_groups, ConvGemm, ConvMode, Kernel};
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
    pub(super) fn rotated(&self) -> Option<Geometry> {
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
pub(super) struct Forced {
    /// `KILN_CONV_DIRECT`: every convolution on the direct kernel.
    pub(super) direct: bool,
    /// `KILN_CONV_NCHW`: the f32 kernels gather from NCHW (scalar loads) even where the NHWC
    /// vec4 kernel applies.
    pub(super) nchw: bool,
    /// `KILN_CONV_NHWC`: the tensor-core convolution always writes NHWC and transposes after.
    pub(super) nhwc: bool,
    /// `KILN_CONV_NARROW`: 64-row f32 convolutions keep the 64x128 tile where the 64x256 one
    /// would run.
    pub(super) narrow: bool,
}

pub(super) fn forced() -> &'static Forced {
    static FORCED: std::sync::OnceLock<Forced> = std::sync::OnceLock::new();
    FORCED.get_or_init(|| {
        let set = |var| std::env::var_os(var).is_some();
        Forced {
            direct: set("KILN_CONV_DIRECT"),
            nchw: set("KILN_CONV_NCHW"),
            nhwc: set("KILN_CONV_NHWC"),
            narrow: set("KILN_CONV_NARROW"),
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
    // The 64x256 tile where 64 rows suffice and the device gives a workgroup 48 KiB (three
    // swizzled 16 KiB tiles).
    let wide = mode == ConvMode::FwdVec4
        && m <= 64
        && a.device()
            .adapter_info()
            .is_some_and(|i| i.limits.max_compute_workgroup_storage_size >= 48 * 1024)
        && !forced().narrow;
    let kernel = ConvGemm {
        mode,
        dtype: a.dtype(),
        padded: padded(a) && !wide,
        bm64: m <= 64,
        wide,
    };
    let aligned = match mode {
        ConvMode::Fwd | ConvMode::FwdVec4 => g.cg().is_multiple_of(16),
        ConvMode::Dgrad => g.og().is_multiple_of(16),
        _ => false,
    };
    // Bit 2 (FwdVec4 as the input's gradient): A's taps read in reverse.
    let flags = bias.is_some() as usize | (aligned as usize) << 1 | (flip as usize) << 2;
    let p = g.p;
    // The modes on `conv_gemm_out4.wgsl` write any [n, c, h, w] view whose image stride is c
    // planes (a phase of the input's gradient); the others a contiguous output.
    let out_strides = match (mode, out.strides()) {
        (m, &[_, plane, rs, cs]) if m.out4() => [plane, rs, cs],
        _ => [0; 3],
    };
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
        ],
        &out_strides,
        &[0],
    ]
    .concat()
    .iter()
    .map(|&v| u32_of(op, v))
    .collect::<Result<Vec<u32>>>()?;
    // Every element index must fit a u32 too (the kernels compute them so).
    for t in [a, b, out] {
        u32_of(op, end(t))?;
    }
    let groups = (
        u32_of(op, n.div_ceil(if wide { 256 } else { 128 }))?,
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

/// `out = conv2d(x, weight) (+ bias)` into the contiguous `out`; `x`, `weight`, `bias`
/// contiguous.
pub(super) fn forward(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    g: &Geometry,
    out: &Tensor,
) -> Result<()> {
    const OP: &str = "conv2d";
    let k = g.taps() * g.cg();
    if pointwise_suits(x, g) && weight.layout().offset.is_multiple_of(4) {
        // [o, c, 1, 1] is A as it is.
        return pointwise(OP, x, weight, bias, g, out);
    }
    // [o, cg, kh, kw] -> [o, kh, kw, cg]: a tap's channels together.
    let w_taps = weight.permute(&[0, 2, 3, 1])?;
    if vec4_suits(x, g) {
        // The input's NHWC copy and the weight's in one launch.
        let (xh, wp) = super::contiguous_two(&x.permute(&[0, 2, 3, 1])?, &w_taps)?;
        return forward_vec4(OP, &xh, &wp, bias, g, out, false);
    }
    let wp = w_taps.contiguous()?;
    run(
        OP,
        ConvMode::Fwd,
        g,
        [g.og(), g.n * g.oh * g.ow, k, k],
        1,
        [&wp, x, out],
        bias,
        false,
    )
}

/// Whether `ConvMode::Pointwise` takes this convolution of `x` (NCHW, contiguous): f32, one
/// group, 1x1 at stride 1 without padding, input channels a multiple of 16 (whole K slices),
/// pixels per image a multiple of 4 and `x` contiguous from an element offset of 4 (a vector
/// never straddles two images or leaves the binding's alignment). ResNet-50: 33 of its 53
/// layers.
fn pointwise_suits(x: &Tensor, g: &Geometry) -> bool {
    let p = g.p;
    x.dtype() == DType::F32
        && p.groups == 1
        && (g.kh, g.kw, p.stride, p.padding) == (1, 1, (1, 1), (0, 0))
        && g.c.is_multiple_of(16)
        && (g.oh * g.ow).is_multiple_of(4)
        && x.is_contiguous()
        && x.layout().offset.is_multiple_of(4)
        && !forced().nchw
}

/// `out = conv2d(x, w) (+ bias)` for a pointwise `g` on `ConvMode::Pointwise`: per image the
/// product `w [o][c] @ x [c][pixels]`, read from NCHW with no copy.
fn pointwise(
    op: &'static str,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    g: &Geometry,
    out: &Tensor,
) -> Result<()> {
    run(
        op,
        ConvMode::Pointwise,
        g,
        [g.o, g.n * g.oh * g.ow, g.c, g.c],
        1,
        [w, x, out],
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

/// Whether the f32 weight gradient from NHWC copies (`ConvMode::WgradVec4`) takes this
/// convolution: one group, input and output channels multiples of 4 (a vector).
fn wgrad_vec4_suits(x: &Tensor, g: &Geometry) -> bool {
    x.dtype() == DType::F32
        && g.p.groups == 1
        && g.c.is_multiple_of(4)
        && g.o.is_multiple_of(4)
        && !forced().nchw
}

/// `t` [n, c, h, w] as a contiguous NHWC copy.
fn nhwc(t: &Tensor) -> Result<Tensor> {
    t.permute(&[0, 2, 3, 1])?.contiguous()
}

/// `out = conv2d(x, w) (+ bias)` on `ConvMode::FwdVec4`, `wp` the weight as `[o][tap][c]`
/// (contiguous), `xh` the input as a contiguous NHWC copy: four channels of a pixel per load.
/// With `flip`, tap t of `wp` serves as tap `taps - 1 - t` (the input gradient's rotated
/// kernel).
fn forward_vec4(
    op: &'static str,
    xh: &Tensor,
    wp: &Tensor,
    bias: Option<&Tensor>,
    g: &Geometry,
    out: &Tensor,
    flip: bool,
) -> Result<()> {
    let k = g.taps() * g.c;
    run(
        op,
        ConvMode::FwdVec4,
        g,
        [g.o, g.n * g.oh * g.ow, k, k],
        1,
        [wp, xh, out],
        bias,
        flip,
    )
}

/// conv2d's gradients `[input, weight]` where `needs` asks, from the output's (contiguous),
/// the weight and the input (needed for the weight's). One NHWC copy of the output's gradient
/// serves both vec4 paths.
pub(super) fn grads(
    gy: &Tensor,
    weight: &Tensor,
    x: Option<&Tensor>,
    g: &Geometry,
    needs: [bool; 2],
) -> Result<[Option<Tensor>; 2]> {
    const OP: &str = "conv2d_backward";
    // The NHWC copy of the output's gradient, made on first use.
    let mut gh: Option<Tensor> = None;
    let nhwc_gy = |gh: &mut Option<Tensor>| nhwc_once(gy, gh);
    let (rotated, phases) = (g.rotated(), phases(g));
    let coop_dx = needs[0]
        .then(|| super::conv_coop::input_grad_tile(gy, rotated.as_ref(), phases.as_ref()))
        .flatten();
    let coop_dx = match coop_dx {
        Some(tile) => super::conv_coop::input_grad(
            &nhwc_gy(&mut gh)?,
            weight,
            tile,
            rotated.as_ref(),
            phases.as_ref(),
        )?,
        None => None,
    };
    let dx = if coop_dx.is_some() {
        coop_dx
    } else if needs[0] {
        Some(match (rotated, phases) {
            (Some(r), _) if pointwise_suits(gy, &r) => {
                // [o, c, 1, 1] -> [c, o]: the forward pass's A, transposed.
                let wt = weight.permute(&[1, 2, 3, 0])?.contiguous()?;
                let dx = Tensor::empty(&[g.n, g.c, g.h, g.w], gy.dtype(), gy.device())?;
                pointwise(OP, gy, &wt, None, &r, &dx)?;
                dx
            }
            (Some(r), _) if vec4_suits(gy, &r) => {
                // [o, c, kh, kw] -> [c, kh, kw, o] beside the gradient's NHWC copy (the first).
                let wt = weight.permute(&[1, 2, 3, 0])?;
                let (gh_new, wt) = super::contiguous_two(&gy.permute(&[0, 2, 3, 1])?, &wt)?;
                gh = Some(gh_new.clone());
                rotated_input_grad(&gh_new, &wt, g, &r)?
            }
            (_, Some(phases)) if phases.suits(gy) => {
                phased_input_grad(&nhwc_gy(&mut gh)?, weight, &phases)?
            }
            _ => input_grad(gy, weight, g)?,
        })
    } else {
        None
    };
    let dw = match x.filter(|_| needs[1]) {
        Some(x) => Some(match padded_weight_grad(gy, x, g, &mut gh)? {
            Some(dw) => dw,
            None => weight_grad_of(gy, x, g, &mut gh)?,
        }),
        None => None,
    };
    Ok([dx, dw])
}

/// `gy` as a contiguous NHWC copy, made once (kept in `gh`).
fn nhwc_once(gy: &Tensor, gh: &mut Option<Tensor>) -> Result<Tensor> {
    if let Some(t) = gh {
        return Ok(t.clone());
    }
    let t = nhwc(gy)?;
    *gh = Some(t.clone());
    Ok(t)
}

/// The weight's gradient by the first kernel that takes it: tensor cores (f16), the pointwise
/// kernel from NCHW, the vec4 kernel from NHWC copies, or the scalar gather from NCHW. `gh`
/// caches the NHWC copy of the output's gradient.
fn weight_grad_of(
    gy: &Tensor,
    x: &Tensor,
    g: &Geometry,
    gh: &mut Option<Tensor>,
) -> Result<Tensor> {
    if let Some(tile) = super::conv_coop::weight_grad_tile(gy, g) {
        let coop = super::conv_coop::weight_grad(&nhwc_once(gy, gh)?, &nhwc(x)?, g, tile)?;
        if let Some(dw) = coop {
            return Ok(dw);
        }
    }
    if pointwise_suits(x, g) && gy.layout().offset.is_multiple_of(4) {
        return weight_grad(gy, x, g, ConvMode::PointwiseWgrad);
    }
    if wgrad_vec4_suits(gy, g) {
        let (gh, xh) = (nhwc_once(gy, gh)?, nhwc(x)?);
        return weight_grad(&gh, &xh, g, ConvMode::WgradVec4);
    }
    weight_grad(gy, &x.contiguous()?, g, ConvMode::Wgrad)
}

/// The f16 weight's gradient where the input has fewer channels than a vector of eight (a
/// stem's 3 RGB channels): the input copied to NHWC with its channels padded by zeros to
/// eight, so that the tensor-core kernel takes it in place of the scalar gather, and the
/// padding's gradients dropped after (H200, ResNet-50's 7x7 stem at batch 32: 1.60 -> 0.78 ms).
/// Not in f32: padded to four channels for the vec4 kernel, the same stem took 1.50 ms against
/// the scalar gather's 1.04. `None` where the padded shape does not take the kernel either.
fn padded_weight_grad(
    gy: &Tensor,
    x: &Tensor,
    g: &Geometry,
    gh: &mut Option<Tensor>,
) -> Result<Option<Tensor>> {
    const WIDTH: usize = 8;
    if gy.dtype() != DType::F16 || g.p.groups != 1 || g.c >= WIDTH {
        return Ok(None);
    }
    let gp = Geometry { c: WIDTH, ..*g };
    let Some(tile) = super::conv_coop::weight_grad_tile(gy, &gp) else {
        return Ok(None);
    };
    let xh = Tensor::zeros(&[g.n, g.h, g.w, WIDTH], x.dtype(), x.device())?;
    xh.narrow(3, 0, g.c)?.copy_(&x.permute(&[0, 2, 3, 1])?)?;
    let dw = super::conv_coop::weight_grad(&nhwc_once(gy, gh)?, &xh, &gp, tile)?;
    dw.map(|dw| dw.narrow(1, 0, g.c)?.contiguous()).transpose()
}

/// The input's gradient at stride 1 as the forward pass of `rotated` (`Geometry::rotated`):
/// `FwdVec4` on `gh`, the NHWC copy of the output's gradient, and `wt`, the weight as
/// `[c, kh, kw, o]` (A's rows are input channels, K runs over (tap, output channel)); the
/// kernel reads the taps in reverse.
fn rotated_input_grad(
    gh: &Tensor,
    wt: &Tensor,
    g: &Geometry,
    rotated: &Geometry,
) -> Result<Tensor> {
    let dx = Tensor::empty(&[g.n, g.c, g.h, g.w], gh.dtype(), gh.device())?;
    forward_vec4("conv2d_backward", gh, wt, None, rotated, &dx, true)?;
    Ok(dx)
}

/// One phase of the input's gradient at stride s along one spatial dim: the input rows
/// `r, r + s, ...` (`len` of them) receive only the kernel taps `k0, k0 + s, ...` (`taps` of
/// them, `k0 = (r + padding) % s`), and row `r + s*i` gathers tap `k0 + s*j` from the output's
/// gradient at row `i + delta - j` (`delta = (r + padding - k0) / s`). That is the stride-1
/// forward pass of the gradient with those taps reversed (`flip`) and padding
/// `pad = taps - 1 - delta`.
#[derive(Clone, Copy, Debug)]
struct Phase {
    r: usize,
    k0: usize,
    taps: usize,
    pad: usize,
    len: usize,
}

/// The phases along one dim (input size `n`, kernel `k`, stride `s`, padding `p`), `None`
/// where one would need a negative padding (padding beyond what the kernel reaches).
fn phases_1d(n: usize, k: usize, s: usize, p: usize) -> Option<Vec<Phase>> {
    (0..s.min(n))
        .map(|r| {
            let k0 = (r + p) % s;
            let taps = k.saturating_sub(k0).div_ceil(s);
            let delta = (r + p - k0) / s;
            let pad = match taps {
                0 => 0,
                _ => (taps - 1).checked_sub(delta)?,
            };
            Some(Phase {
                r,
                k0,
                taps,
                pad,
                len: (n - r).div_ceil(s),
            })
        })
        .collect()
}

/// The row and column phases of a strided convolution's input gradient.
pub(super) struct Phases {
    rows: Vec<Phase>,
    cols: Vec<Phase>,
    g: Geometry,
}

/// `Phases` where the input's gradient goes by phase: stride above 1, no dilation, one group.
pub(super) fn phases(g: &Geometry) -> Option<Phases> {
    let p = g.p;
    if p.stride == (1, 1) || p.dilation != (1, 1) || p.groups != 1 {
        return None;
    }
    Some(Phases {
        rows: phases_1d(g.h, g.kh, p.stride.0, p.padding.0)?,
        cols: phases_1d(g.w, g.kw, p.stride.1, p.padding.1)?,
        g: *g,
    })
}

impl Phases {
    /// The stride-1 convolution (of the output's gradient) that computes phase (`r`, `c`).
    fn geometry(&self, r: &Phase, c: &Phase) -> Geometry {
        let g = &self.g;
        Geometry {
            n: g.n,
            c: g.o,
            h: g.oh,
            w: g.ow,
            o: g.c,
            oh: r.len,
            ow: c.len,
            kh: r.taps,
            kw: c.taps,
            p: Conv2dParams {
                stride: (1, 1),
                padding: (r.pad, c.pad),
                dilation: (1, 1),
                groups: 1,
            },
        }
    }

    /// Whether every phase suits `FwdVec4` (their channels are the output's).
    fn suits(&self, gy: &Tensor) -> bool {
        vec4_suits(gy, &self.geometry(&self.rows[0], &self.cols[0]))
    }
}

/// The input's gradient of a strided convolution, phase by phase (`Phase`): each phase one
/// `FwdVec4` pass over `gh` (the output's gradient, NHWC) with its sub-kernel, writing every
/// s-th row and column of the gradient. Where a phase receives no tap (a 1x1 kernel at stride
/// 2 reaches only even rows), its rows stay zero. The inverse-window kernel (`Dgrad`) visits
/// every (pixel, tap) pair and throws most away; this does only the products that count.
fn phased_input_grad(gh: &Tensor, weight: &Tensor, phases: &Phases) -> Result<Tensor> {
    let dx = phases.zeroed_grad(gh)?;
    for (sub, pg, out) in phases.parts(weight, &dx)? {
        forward_vec4(
            "conv2d_backward",
            gh,
            &sub.contiguous()?,
            None,
            &pg,
            &out,
            true,
        )?;
    }
    Ok(dx)
}

impl Phases {
    /// The first phase that receives a tap (its channels are every phase's).
    pub(super) fn first(&self) -> Option<Geometry> {
        let r = self.rows.iter().find(|p| p.taps > 0)?;
        let c = self.cols.iter().find(|p| p.taps > 0)?;
        Some(self.geometry(r, c))
    }

    /// The input's gradient to fill, [n, c, h, w] like `gh`'s dtype and device: zeros where a
    /// phase receives no tap (it is never written), else uninitialised.
    pub(super) fn zeroed_grad(&self, gh: &Tensor) -> Result<Tensor> {
        let g = &self.g;
        let shape = [g.n, g.c, g.h, g.w];
        if self.rows.iter().chain(&self.cols).any(|p| p.taps == 0) {
            Tensor::zeros(&shape, gh.dtype(), gh.device())
        } else {
            Tensor::empty(&shape, gh.dtype(), gh.device())
        }
    }

    /// Each phase that receives taps: its sub-kernel (a view of `weight` as `[c, kh', kw', o]`),
    /// its stride-1 geometry, and its rows and columns of `dx` (a view).
    pub(super) fn parts(
        &self,
        weight: &Tensor,
        dx: &Tensor,
    ) -> Result<Vec<(Tensor, Geometry, Tensor)>> {
        let g = &self.g;
        let (s, w) = (g.p.stride, weight.layout().offset);
        let mut parts = Vec::new();
        for r in self.rows.iter().filter(|p| p.taps > 0) {
            for c in self.cols.iter().filter(|p| p.taps > 0) {
                // weight[:, :, k0::s, k0::s] as [c, kh', kw', o].
                let sub = weight
                    .as_strided(
                        &[g.o, g.c, r.taps, c.taps],
                        &[g.c * g.taps(), g.taps(), s.0 * g.kw, s.1],
                        w + r.k0 * g.kw + c.k0,
                    )
                    .permute(&[1, 2, 3, 0])?;
                let out = dx.as_strided(
                    &[g.n, g.c, r.len, c.len],
                    &[g.c * g.h * g.w, g.h * g.w, s.0 * g.w, s.1],
                    dx.layout().offset + r.r * g.w + c.r,
                );
                parts.push((sub, self.geometry(r, c), out));
            }
        }
        Ok(parts)
    }
}

/// The gradient of conv2d's input, [n, c, h, w], from the output's (contiguous) and the weight
/// on the inverse-window kernel (`Dgrad`).
fn input_grad(gy: &Tensor, weight: &Tensor, g: &Geometry) -> Result<Tensor> {
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
    let dx = Tensor::empty(&[g.n, g.c, g.h, g.w], gy.dtype(), gy.device())?;
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

/// The gradient of conv2d's weight, [o, cg, kh, kw] in `x`'s dtype, from the output's and the
/// input, both contiguous: NCHW (`Wgrad`, `PointwiseWgrad`), or NHWC copies (`WgradVec4`). The
/// pixels (GEMM's K) are split so that about 512 workgroups run; the f32 partials are summed
/// after.
fn weight_grad(gy: &Tensor, x: &Tensor, g: &Geometry, mode: ConvMode) -> Result<Tensor> {
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
        mode,
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
