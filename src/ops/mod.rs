//! Ops: checks (shape, dtype, device), then the CPU reference or one GPU launch. Each op family
//! keeps its forward in one file; backward formulas arrive with autograd.
//!
//! # What is here
//!
//! `mod.rs` checks shapes, dtypes and devices and picks the CPU reference or one GPU launch;
//! `autocast.rs` holds autocast's thread-local state and per-op policy (Note \[Autocast\]). One file
//! per op family, its backward beside it:
//! - elementwise (the launches; the formulas are `base`'s) with `grad.rs`, in-place ops
//!   (`inplace.rs`), reductions, softmax, predicates (compare, cast, where), indexing, random,
//!   composites, `sum_to`;
//! - `linear.rs` (`linear`, `linear_relu`); products: `matmul.rs`, `matmul_choice.rs` (which
//!   kernel a product takes), `matmul_narrow.rs` (a narrow side or a short K, and `grouped`, which
//!   holds a product backward's `short4` and `cols` launches until both are recorded and sends
//!   them as one dispatch), `matmul_words.rs` (the word products' launches), `matmul_grad.rs` (a
//!   product's backward, with the row sums and ReLU mask its kernels take in passing);
//! - `batch_norm.rs` (the fused GPU path for f32, the composite formula as the CPU reference);
//!   convolution (`conv.rs`; `conv_gemm.rs` picks the implicit GEMM on Vulkan, Metal and DX12
//!   GPUs and lays out its weight copies and K splits) with pooling, and `conv_grad.rs`;
//! - `layer_norm.rs`: the fused layer norm (one launch forward, one per backward gradient) and
//!   its composite, the CPU reference;
//! - `attention.rs`: `scaled_dot_product_attention` (the flash kernels' launches and backward
//!   node, and the composite that is the CPU reference and the fallback);
//! - `loss.rs`: nll_loss and the fused cross_entropy;
//! - `view.rs`: views, which record autograd nodes (`contiguous` copies);
//! - `transfer.rs`: reading tensors back, copies between devices, pinned tensors.

mod attention;
pub(crate) mod autocast;
mod batch_norm;
mod composite;
mod conv;
mod conv_gemm;
mod conv_grad;
mod grad;
mod index;
mod inplace;
mod layer_norm;
mod linear;
pub(crate) mod loss;
mod matmul;
mod matmul_choice;
mod matmul_grad;
mod matmul_narrow;
mod matmul_words;
mod predicate;
mod random;
mod reduce;
pub(crate) use reduce::sum_to;
mod softmax;
mod transfer;
pub(crate) use transfer::SideCopy;
mod view;
pub(crate) use view::isize_shape;

pub use crate::base::CmpOp;
pub use crate::base::Conv2dParams;
pub use crate::base::{BinaryOp, UnaryOp};
pub use attention::scaled_dot_product_attention;
pub use batch_norm::{batch_norm, batch_norm_relu};
pub use conv::{avg_pool2d, conv2d, max_pool2d};
pub use index::{embedding, gather, index_select, one_hot, scatter_add};
pub use inplace::{binary_, binary_scalar_, unary_};
pub use layer_norm::{force_layer_norm_serial, layer_norm};
pub use linear::{linear, linear_relu};
pub use matmul::matmul;
pub use matmul_choice::force_matmul_tile;
pub use predicate::{compare, compare_scalar, masked_fill, to_dtype, where_};

use crate::cpu;
use crate::kernels::{launch, launch_groups, tune, ElementwiseKernel, Form, Kernel, PER_THREAD};
use crate::tensor::{broadcast_shapes, DType, Layout, Tensor};
use crate::{Error, Result};

/// Waits until the host may read pinned operands whose copies are still in flight (see Note
/// [Pinned host memory]); a no-op for other tensors. Every CPU op calls it before its loop.
pub(crate) fn ready_on_host(ts: &[&Tensor]) -> Result<()> {
    ts.iter().try_for_each(|t| t.host_ready())
}

pub(crate) fn same_device(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.device() != b.device() {
        return Err(Error::DeviceMismatch {
            op,
            expected: a.device().name(),
            got: b.device().name(),
        });
    }
    Ok(())
}

/// The same rules on every device, so that the CPU stays a faithful reference.
fn check_supported(form: Form, dtype: DType, op: &'static str) -> Result<ElementwiseKernel> {
    let k = ElementwiseKernel {
        form,
        dtype,
        contiguous: false,
        vector: false,
        wide: false,
        inplace: false,
    };
    if k.expr().is_none() && !(dtype == DType::Bool && form == Form::Unary(UnaryOp::Identity)) {
        return Err(Error::UnsupportedDType {
            op,
            dtype,
            why: "(PyTorch promotes integers to float here; cast first)".into(),
        });
    }
    Ok(k)
}

/// One past the last element index `t` reaches.
fn end(t: &Tensor) -> usize {
    let l = t.layout();
    l.offset
        + t.shape()
            .iter()
            .zip(t.strides())
            .map(|(&n, &s)| n.saturating_sub(1) * s)
            .sum::<usize>()
        + 1
}

fn u32_of(op: &'static str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::TooLarge {
        op,
        size_bytes: v as u64,
        limit_bytes: u32::MAX as u64,
        what: "elements or offsets beyond 32-bit indexing",
    })
}

/// Appends each of `fields` (shape or strides, up to 8 dims) to the immediates as 8 u32s: the
/// `array<vec4<u32>, 2>` fields the strided kernels unravel with.
pub(crate) fn pack_dims<S: AsRef<[usize]>>(
    imm: &mut Vec<u32>,
    fields: &[S],
    op: &'static str,
) -> Result<()> {
    for field in fields {
        let mut packed = [0u32; 8];
        for (slot, &v) in packed.iter_mut().zip(field.as_ref()) {
            *slot = u32_of(op, v)?;
        }
        imm.extend_from_slice(&packed);
    }
    Ok(())
}

/// Operands seen over one shape, coalesced to the fewest dims a kernel indexes.
pub(crate) struct Coalesced {
    pub shape: Vec<usize>,
    /// One stride vector per operand, in the order given.
    pub strides: Vec<Vec<usize>>,
    /// Every operand walks memory in element order (no index arithmetic needed).
    pub contiguous: bool,
}

/// Coalesces `layouts` (all of `shape`) for a kernel; kernels index at most 8 dims.
pub(crate) fn coalesce_for_kernel(
    op: &'static str,
    shape: &[usize],
    layouts: &[&Layout],
) -> Result<Coalesced> {
    let mut strides: Vec<Vec<usize>> = layouts.iter().map(|l| l.strides.clone()).collect();
    let shape = Layout::coalesce(shape, &mut strides);
    if shape.len() > 8 {
        return Err(Error::InvalidArgument {
            op,
            msg: format!(
                "{} dims that cannot be merged; kernels index at most 8",
                shape.len()
            ),
        });
    }
    let contiguous = shape.len() <= 1 && strides.iter().all(|s| s.first().is_none_or(|&x| x == 1));
    Ok(Coalesced {
        shape,
        strides,
        contiguous,
    })
}

/// The immediates of the two-operand strided kernels (elementwise, predicate): element count,
/// rank, the operands' offsets, then the shape and both operands' strides.
pub(crate) fn strided_header(
    op: &'static str,
    n: usize,
    c: &Coalesced,
    off_a: u32,
    off_b: u32,
) -> Result<Vec<u32>> {
    let mut imm = vec![u32_of(op, n)?, c.shape.len() as u32, off_a, off_b];
    pack_dims(&mut imm, &[&c.shape, &c.strides[0], &c.strides[1]], op)?;
    Ok(imm)
}

/// Encodes one elementwise launch: operands coalesced to the fewest dims, contiguous fast path
/// when every operand walks memory in order.
fn gpu_elementwise(
    form: Form,
    a: &Tensor,
    b: Option<&Tensor>,
    scalar: Option<f64>,
    out: Option<&Tensor>,
    op: &'static str,
) -> Result<()> {
    // In place (`out` None), the result goes back into `a`'s own elements.
    let inplace = out.is_none();
    let out = out.unwrap_or(a);
    let b_layout = b.map_or(&a.layout, |b| &b.layout);
    let c = coalesce_for_kernel(op, out.shape(), &[&a.layout, b_layout, &out.layout])?;
    // A copy of a 2-D transpose, or of a batch of them (NCHW <-> NHWC): through shared memory
    // or strided, or in 64-bit words, as the tuner picks (`TransposeJob::pick`).
    let job = match inplace || form != Form::Unary(UnaryOp::Identity) {
        true => None,
        false => transpose_job(op, a, out, &c)?,
    };
    if let Some(job) = job {
        match job.pick(a, out, &c, op)? {
            TransposeCopy::Tiled => return job.launch(a, out),
            TransposeCopy::Words => return job.launch_words(a, out),
            TransposeCopy::Strided => {}
        }
    }
    gpu_elementwise_flat(form, a, b, scalar, out, inplace, &c, op)
}

/// How a `TransposeJob` copies: through a tile of workgroup memory (the default), strided
/// (the elementwise copy reading across rows: no barrier), or as 4x4 blocks of 64-bit words
/// (`shaders/transpose_words.wgsl`: no barrier, half the memory operations; 4-byte elements
/// where the adapter has 64-bit integers).
#[derive(Clone, Copy, PartialEq, Eq)]
enum TransposeCopy {
    Tiled,
    Strided,
    Words,
}

/// A copy of `a` into the contiguous `out` that is a 2-D transpose or a batch of them
/// (`transpose.wgsl`'s contract: `x` read down its rows, the output contiguous from its start).
#[derive(Clone, Copy)]
struct TransposeJob {
    /// `[rows, cols, off, lda, sb, 0, 0, 0]`.
    imm: [u32; 8],
    batch: u32,
}

/// `a`'s copy into `out` as a `TransposeJob`, where the coalesced layouts `c` (operands
/// `[a, a, out]`) have that form and the grid fits.
fn transpose_job(
    op: &'static str,
    a: &Tensor,
    out: &Tensor,
    c: &Coalesced,
) -> Result<Option<TransposeJob>> {
    let (shape, strides) = (&c.shape, &c.strides);
    let r = shape.len();
    let transposed = (r == 2 || r == 3)
        && out.layout.offset == 0
        && strides[0][r - 2] == 1
        && strides[2][r - 1] == 1
        && strides[2][r - 2] == shape[r - 1]
        && (r == 2 || strides[2][0] == shape[1] * shape[2]);
    if !transposed {
        return Ok(None);
    }
    let (batch, rows, cols) = match r {
        3 => (shape[0], shape[1], shape[2]),
        _ => (1, shape[0], shape[1]),
    };
    if rows.div_ceil(32) > 65535 || cols.div_ceil(32) > 65535 || batch > 65535 {
        return Ok(None);
    }
    let sb = if r == 3 { strides[0][0] } else { 0 };
    Ok(Some(TransposeJob {
        imm: [
            u32_of(op, rows)?,
            u32_of(op, cols)?,
            u32_of(op, a.layout.offset)?,
            u32_of(op, strides[0][r - 1])?,
            u32_of(op, sb)?,
            0,
            0,
            0,
        ],
        batch: batch as u32,
    }))
}

impl TransposeJob {
    /// The tuner's key: dtype and the size classes of batch, rows and columns.
    fn key(&self, d: DType) -> String {
        let (r, c) = (
            tune::class(self.imm[0] as usize),
            tune::class(self.imm[1] as usize),
        );
        match self.batch {
            1 => format!("{d} {r}x{c}"),
            b => format!("{d} {}x{r}x{c}", tune::class(b as usize)),
        }
    }

    /// The tuner's pick of how to copy `a` into `out` (coalesced as `c`); measuring runs the
    /// candidates on the operands.
    fn pick(
        &self,
        a: &Tensor,
        out: &Tensor,
        c: &Coalesced,
        op: &'static str,
    ) -> Result<TransposeCopy> {
        let mut candidates = vec![
            (TransposeCopy::Tiled, "tiled"),
            (TransposeCopy::Strided, "strided"),
        ];
        let int64 = a
            .device()
            .adapter_info()
            .is_some_and(|i| i.features.shader_int64);
        let fits = self.imm[1] / 4 <= 65535;
        if int64 && fits && a.dtype.size_bytes() == 4 && self.imm[..5].iter().all(|v| v % 4 == 0) {
            candidates.push((TransposeCopy::Words, "words"));
        }
        // On a CPU adapter the barrier-free copies come first (the words, else the strided
        // copy: lavapipe's 2048^2 took 17.5 ms on words, 63 tiled); on GL's llvmpipe the tiled
        // copy is not a candidate.
        if tune::on_cpu_adapter(a.device()) {
            candidates.sort_by_key(|&(t, _)| match t {
                TransposeCopy::Words => 0,
                TransposeCopy::Strided => 1,
                TransposeCopy::Tiled => 2,
            });
            if tune::on_gl_cpu_adapter(a.device()) {
                candidates.retain(|&(t, _)| t != TransposeCopy::Tiled);
            }
        }
        let form = Form::Unary(UnaryOp::Identity);
        tune::pick(
            a.device(),
            "transpose",
            || self.key(a.dtype),
            out.numel() as u64,
            &candidates,
            |t| match t {
                TransposeCopy::Tiled => self.launch(a, out),
                TransposeCopy::Words => self.launch_words(a, out),
                TransposeCopy::Strided => {
                    gpu_elementwise_flat(form, a, None, None, out, false, c, op)
                }
            },
        )
    }

    /// The copy as 4x4 blocks of 64-bit words (the caller checked its conditions).
    fn launch_words(&self, a: &Tensor, out: &Tensor) -> Result<()> {
        let (rows, cols) = (self.imm[0], self.imm[1]);
        launch_groups(
            Kernel::TransposeWords,
            &[&a.storage.block, &out.storage.block],
            &self.imm,
            ((rows / 4).div_ceil(64), cols / 4, self.batch),
        )
    }

    /// 32x32 tiles along rows and along columns.
    fn tiles(&self) -> (u32, u32) {
        (self.imm[0].div_ceil(32), self.imm[1].div_ceil(32))
    }

    /// The tiled copy on its own; 16-bit elements two to a word where every row and offset
    /// starts on a word.
    fn launch(&self, a: &Tensor, out: &Tensor) -> Result<()> {
        let pairs = a.dtype.size_bytes() == 2 && self.imm[..5].iter().all(|v| v % 2 == 0);
        let (kernel, tile) = match pairs {
            true => (Kernel::TransposePairs, 64),
            false => (Kernel::Transpose(a.dtype), 32),
        };
        let (rows, cols) = (self.imm[0], self.imm[1]);
        launch_groups(
            kernel,
            &[&a.storage.block, &out.storage.block],
            &self.imm,
            (rows.div_ceil(tile), cols.div_ceil(tile), self.batch),
        )
    }
}

/// `a.contiguous()` and `b.contiguous()` for two GPU tensors of one float dtype whose copies
/// are batched transposes: one launch (`Kernel::TransposeTwo`, `b`'s tiles in workgroup layers
/// after `a`'s) where the tuner picks the tiled copy for `a`, else two copies. A convolution's
/// input goes to NHWC with its weight permuted beside it: on the H100 the weight's own launch
/// (147 KB) cost 9 us of the 3x3 64->64 forward's 331, a barrier and a kernel's ramp.
pub(crate) fn contiguous_two(a: &Tensor, b: &Tensor) -> Result<(Tensor, Tensor)> {
    const OP: &str = "contiguous";
    let separate = || Ok((a.contiguous()?, b.contiguous()?));
    if a.device().is_cpu()
        || a.device() != b.device()
        || a.dtype != b.dtype
        || !matches!(a.dtype, DType::F32 | DType::F16)
        || a.is_contiguous()
        || b.is_contiguous()
        || a.numel() == 0
        || b.numel() == 0
    {
        return separate();
    }
    let outs = [a, b].map(|t| Tensor::empty(t.shape(), t.dtype, t.device()));
    let [Ok(oa), Ok(ob)] = outs else {
        return separate();
    };
    let ca = coalesce_for_kernel(OP, a.shape(), &[&a.layout, &a.layout, &oa.layout])?;
    let cb = coalesce_for_kernel(OP, b.shape(), &[&b.layout, &b.layout, &ob.layout])?;
    let (Some(ja), Some(jb)) = (
        transpose_job(OP, a, &oa, &ca)?,
        transpose_job(OP, b, &ob, &cb)?,
    ) else {
        return separate();
    };
    let tiled = ja.pick(a, &oa, &ca, OP)? == TransposeCopy::Tiled;
    // b's tiles, numbered across a's (x, y) grid, fill the layers after a's batch.
    let ((ra, ca_tiles), (rb, cb_tiles)) = (ja.tiles(), jb.tiles());
    let layer = ra * ca_tiles;
    let extra = (rb * cb_tiles * jb.batch).div_ceil(layer);
    if !tiled || ja.batch + extra > 65535 {
        drop((oa, ob));
        return separate();
    }
    let mut imm = [0u32; 16];
    imm[..8].copy_from_slice(&ja.imm);
    imm[5] = ja.batch;
    imm[8..].copy_from_slice(&jb.imm);
    imm[13] = jb.batch;
    imm[14] = rb;
    imm[15] = cb_tiles;
    launch_groups(
        Kernel::TransposeTwo(a.dtype),
        &[
            &a.storage.block,
            &oa.storage.block,
            &b.storage.block,
            &ob.storage.block,
        ],
        &imm,
        (ra, ca_tiles, ja.batch + extra),
    )?;
    Ok((oa, ob))
}

/// `gpu_elementwise` through the elementwise kernel, operands coalesced into `c`.
#[allow(clippy::too_many_arguments)]
fn gpu_elementwise_flat(
    form: Form,
    a: &Tensor,
    b: Option<&Tensor>,
    scalar: Option<f64>,
    out: &Tensor,
    inplace: bool,
    c: &Coalesced,
    op: &'static str,
) -> Result<()> {
    let (contiguous, n) = (c.contiguous, out.numel());
    // Whole vectors of `k` elements from every operand's start.
    let aligned = |k: usize| {
        contiguous
            && n.is_multiple_of(k)
            && a.layout.offset.is_multiple_of(k)
            && b.is_none_or(|b| b.layout.offset.is_multiple_of(k))
    };
    // Strided operands whose innermost dim is unit-stride in every one of them, with every
    // other stride, the offsets and that dim's length whole vec4s (a head transpose
    // [B, H, T, D] -> [B, T, H, D], a copy into a narrow view): unravelled once per vec4. The
    // element-wise form moved GPT-2's 12.6 MB head copies at about 300 GB/s on the H200, its
    // index arithmetic (a division per dim) done for every element.
    let rows4 = !contiguous
        && c.shape.last().is_some_and(|d| d.is_multiple_of(4))
        && c.strides.iter().all(|s| {
            s.split_last()
                .is_some_and(|(&last, rest)| last == 1 && rest.iter().all(|x| x.is_multiple_of(4)))
        })
        && a.layout.offset.is_multiple_of(4)
        && b.is_none_or(|b| b.layout.offset.is_multiple_of(4))
        && out.layout.offset.is_multiple_of(4);
    if rows4 {
        let mut c4 = Coalesced {
            shape: c.shape.clone(),
            strides: c.strides.clone(),
            contiguous: false,
        };
        if let Some(last) = c4.shape.last_mut() {
            *last /= 4;
        }
        for s in &mut c4.strides {
            let rank = s.len();
            for x in &mut s[..rank - 1] {
                *x /= 4;
            }
        }
        let kernel = ElementwiseKernel {
            contiguous: false,
            vector: true,
            wide: false,
            inplace,
            ..check_supported(form, a.dtype, op)?
        };
        let off_b = match (b, scalar) {
            (Some(b), _) => u32_of(op, b.layout.offset / 4)?,
            (None, Some(s)) if a.dtype.is_float() => (s as f32).to_bits(),
            (None, Some(s)) => s as i64 as u32,
            (None, None) => 0,
        };
        let imm = strided_header(op, n / 4, &c4, u32_of(op, a.layout.offset / 4)?, off_b)?;
        let mut blocks = vec![&a.storage.block];
        if let Some(b) = b {
            blocks.push(&b.storage.block);
        }
        if !inplace {
            blocks.push(&out.storage.block);
        }
        let groups = ((n / 4) as u64).div_ceil(PER_THREAD as u64);
        return launch(Kernel::Elementwise(kernel), &blocks, &imm, groups);
    }
    let vector = aligned(4);
    // One launch with the layout chosen: vec4s, 32-byte words (`wide`), or single elements.
    let mut launch_as = |wide: bool| -> Result<()> {
        // The vec4 form counts elements and offsets in vec4s, the wide one in eights.
        let unit = if wide {
            8
        } else if vector {
            4
        } else {
            1
        };
        let kernel = ElementwiseKernel {
            contiguous,
            vector,
            wide,
            inplace,
            ..check_supported(form, a.dtype, op)?
        };
        let off_b = match (b, scalar) {
            (Some(b), _) => u32_of(op, b.layout.offset / unit)?,
            (None, Some(s)) if a.dtype.is_float() => (s as f32).to_bits(),
            (None, Some(s)) => s as i64 as u32,
            (None, None) => 0,
        };
        let imm = strided_header(op, n / unit, c, u32_of(op, a.layout.offset / unit)?, off_b)?;
        let mut blocks = vec![&a.storage.block];
        if let Some(b) = b {
            blocks.push(&b.storage.block);
        }
        if !inplace {
            blocks.push(&out.storage.block);
        }
        launch(
            Kernel::Elementwise(kernel),
            &blocks,
            &imm,
            ((n / unit) as u64).div_ceil(PER_THREAD as u64),
        )
    };
    let wide = aligned(8) && elementwise_wide(form, a, n, inplace, &mut launch_as)?;
    launch_as(wide)
}

/// Whether contiguous 4-byte elements go as 32-byte words (`ElementwiseKernel::wide`): where
/// the adapter has 64-bit integers, as autotuning measured for this form, dtype and size class
/// (an in-place op is never run twice to be timed: it takes what its out-of-place form
/// measured, else vec4).
fn elementwise_wide(
    form: Form,
    a: &Tensor,
    n: usize,
    inplace: bool,
    run: impl FnMut(bool) -> Result<()>,
) -> Result<bool> {
    let device = a.device();
    if a.dtype.size_bytes() != 4
        || !device
            .adapter_info()
            .is_some_and(|i| i.features.shader_int64)
    {
        return Ok(false);
    }
    let form = match form {
        Form::Unary(_) => "unary",
        Form::Binary(_) => "binary",
        Form::Scalar(_) => "scalar",
    };
    let key = || format!("{form} {} n {}", a.dtype, tune::class(n));
    let candidates = [(false, "vec4"), (true, "vec8")];
    if inplace {
        return Ok(tune::remembered(device, "elementwise", key, &candidates));
    }
    tune::pick(device, "elementwise", key, n as u64, &candidates, run)
}

/// A new tensor `op(x)`.
pub fn unary(x: &Tensor, op: UnaryOp) -> Result<Tensor> {
    if matches!(op, UnaryOp::Exp | UnaryOp::Log) {
        if let Some(v) = autocast::fp32(&[x])? {
            return unary(&v[0], op);
        }
    }
    crate::graph::record(
        op.backward_name(),
        &[x],
        || unary_forward(x, op),
        |out| grad::unary(x, out, op),
    )
}

fn unary_forward(x: &Tensor, op: UnaryOp) -> Result<Tensor> {
    let name = op.name();
    check_supported(Form::Unary(op), x.dtype, name)?;
    // A copy of rows (a matrix narrowed along its columns, or with padded rows): word by
    // word, where the elementwise kernel indexes each element.
    if op == UnaryOp::Identity && x.rank() == 2 && !x.is_contiguous() && x.dtype != DType::Bool {
        if let Some(out) = copy_rows(x, x.shape()[1])? {
            return Ok(out);
        }
    }
    let out = Tensor::empty(x.shape(), x.dtype, x.device())?;
    if out.numel() == 0 {
        return Ok(out);
    }
    if x.device().is_cpu() {
        x.host_ready()?;
        cpu::unary(x, &out, op);
    } else {
        if x.dtype == DType::Bool {
            // Only the copy takes bools (check_supported); bytes go through the cast kernel.
            predicate::cast_into(x, &out)?;
        } else {
            gpu_elementwise(Form::Unary(op), x, None, None, Some(&out), name)?;
        }
    }
    Ok(out)
}

/// `x` (2-D, unit stride along its rows) into a new contiguous `[rows, cols]` tensor of its
/// dtype: its first `cols` columns where that is fewer, zeros after its columns where more.
/// One pass of `shaders/copy_rows.wgsl` in 4-byte words (16-byte vectors where every count
/// and offset allows) where the rows are whole words; `None` where they are not, or on the
/// CPU, for the caller's elementwise path. No graph is recorded: for copies inside an op.
pub(crate) fn copy_rows(x: &Tensor, cols: usize) -> Result<Option<Tensor>> {
    const OP: &str = "copy_rows";
    let [rows, x_cols] = *x.shape() else {
        return Ok(None);
    };
    let [stride, unit_stride] = *x.strides() else {
        return Ok(None);
    };
    if x.device().is_cpu() || (unit_stride != 1 && x_cols > 1) {
        return Ok(None);
    }
    let es = x.dtype().size_bytes();
    let copied = x_cols.min(cols);
    // (A fresh output starts at offset 0: only the source's counts and offset decide.)
    let bytes = [copied, cols, stride, x.layout.offset].map(|v| v * es);
    // f16 rows of any length (GPT-2's 50257 logits) in 2-byte units where the adapter has f16.
    let halves = x.dtype() == DType::F16
        && x.device()
            .adapter_info()
            .is_some_and(|a| a.features.shader_f16);
    let Some(unit) = [16, 4, 2]
        .into_iter()
        .filter(|&u| u > 2 || halves)
        .find(|&u| bytes.iter().all(|b| b.is_multiple_of(u)))
    else {
        return Ok(None);
    };
    let out = Tensor::empty(&[rows, cols], x.dtype(), x.device())?;
    let out_off = out.layout.offset * es / unit;
    let [copied, cols, stride, x_off] = bytes.map(|b| b / unit);
    let total = rows * cols;
    if total == 0 {
        return Ok(Some(out));
    }
    // Every word index the kernel forms fits a u32.
    u32_of(OP, x_off + (rows - 1) * stride + copied)?;
    let imm = [total, cols, copied, stride, x_off, out_off, 0, 0]
        .into_iter()
        .map(|v| u32_of(OP, v))
        .collect::<Result<Vec<u32>>>()?;
    launch(
        Kernel::CopyRows(unit as u8),
        &[&x.storage.block, &out.storage.block],
        &imm,
        total as u64,
    )?;
    Ok(Some(out))
}

/// A contiguous copy.
pub(crate) fn copy(x: &Tensor) -> Result<Tensor> {
    unary(x, UnaryOp::Identity)
}

/// A new tensor `op(a, b)` with NumPy broadcasting. Both operands share dtype and device.
pub fn binary(a: &Tensor, b: &Tensor, op: BinaryOp) -> Result<Tensor> {
    if let Some((a, b)) = autocast::promote(a, b)? {
        return binary(&a, &b, op);
    }
    if op == BinaryOp::Pow {
        if let Some(v) = autocast::fp32(&[a, b])? {
            return binary(&v[0], &v[1], op);
        }
    }
    crate::graph::record(
        grad::binary_name(op),
        &[a, b],
        || binary_forward(a, b, op),
        |out| grad::binary_op(a, b, out, op),
    )
}

fn binary_forward(a: &Tensor, b: &Tensor, op: BinaryOp) -> Result<Tensor> {
    let name = op.name();
    same_device(name, a, b)?;
    if a.dtype != b.dtype {
        return Err(Error::DTypeMismatch {
            op: name,
            expected: a.dtype,
            got: b.dtype,
        });
    }
    check_supported(Form::Binary(op), a.dtype, name)?;
    let shape = broadcast_shapes(name, a.shape(), b.shape())?;
    let (la, lb) = (
        a.layout.broadcast_to(name, &shape)?,
        b.layout.broadcast_to(name, &shape)?,
    );
    let (a, b) = (
        Tensor {
            layout: la,
            ..a.clone()
        },
        Tensor {
            layout: lb,
            ..b.clone()
        },
    );
    let out = Tensor::empty(&shape, a.dtype, a.device())?;
    if out.numel() == 0 {
        return Ok(out);
    }
    if a.device().is_cpu() {
        ready_on_host(&[&a, &b])?;
        cpu::binary(&a, &b, &out, op);
    } else {
        gpu_elementwise(Form::Binary(op), &a, Some(&b), None, Some(&out), name)?;
    }
    Ok(out)
}

/// A new tensor `op(a, s)`. On integer tensors `s` must be a whole number.
pub fn binary_scalar(a: &Tensor, s: f64, op: BinaryOp) -> Result<Tensor> {
    if op == BinaryOp::Pow {
        if let Some(v) = autocast::fp32(&[a])? {
            return binary_scalar(&v[0], s, op);
        }
    }
    crate::graph::record(
        grad::scalar_name(op),
        &[a],
        || binary_scalar_forward(a, s, op),
        |_| grad::scalar_op(a, s, op),
    )
}

fn binary_scalar_forward(a: &Tensor, s: f64, op: BinaryOp) -> Result<Tensor> {
    let name = op.name();
    check_supported(Form::Scalar(op), a.dtype, name)?;
    if !a.dtype.is_float() && s.fract() != 0.0 {
        return Err(Error::InvalidArgument {
            op: name,
            msg: format!(
                "scalar {s} on a {} tensor: PyTorch would promote to float; cast first",
                a.dtype
            ),
        });
    }
    let out = Tensor::empty(a.shape(), a.dtype, a.device())?;
    if out.numel() == 0 {
        return Ok(out);
    }
    if a.device().is_cpu() {
        a.host_ready()?;
        // The GPU sees the scalar as f32; so does the reference.
        let s = if a.dtype.is_float() {
            s as f32 as f64
        } else {
            s
        };
        cpu::binary_scalar(a, s, &out, op);
    } else {
        gpu_elementwise(Form::Scalar(op), a, None, Some(s), Some(&out), name)?;
    }
    Ok(out)
}

macro_rules! unary_methods {
    ($($name:ident => $op:ident),* $(,)?) => {
        impl Tensor {$(
            #[doc = concat!("Elementwise `", stringify!($name), "` into a new tensor.")]
            pub fn $name(&self) -> Result<Tensor> {
                unary(self, UnaryOp::$op)
            }
        )*}
    };
}

unary_methods! {
    neg => Neg, abs => Abs, exp => Exp, log => Log, sqrt => Sqrt, rsqrt => Rsqrt,
    reciprocal => Reciprocal, square => Square, sin => Sin, cos => Cos, tanh => Tanh,
    sigmoid => Sigmoid, relu => Relu, gelu => Gelu, gelu_tanh => GeluTanh, silu => Silu,
}

macro_rules! binary_methods {
    ($($name:ident, $scalar:ident => $op:ident),* $(,)?) => {
        impl Tensor {$(
            #[doc = concat!("Elementwise `", stringify!($name), "` with broadcasting.")]
            pub fn $name(&self, other: &Tensor) -> Result<Tensor> {
                binary(self, other, BinaryOp::$op)
            }
            #[doc = concat!("Elementwise `", stringify!($name), "` with a scalar.")]
            pub fn $scalar(&self, s: f64) -> Result<Tensor> {
                binary_scalar(self, s, BinaryOp::$op)
            }
        )*}
    };
}

binary_methods! {
    add, add_scalar => Add,
    sub, sub_scalar => Sub,
    mul, mul_scalar => Mul,
    div, div_scalar => Div,
    pow, pow_scalar => Pow,
    maximum, maximum_scalar => Maximum,
    minimum, minimum_scalar => Minimum,
}

macro_rules! operators {
    ($($trait:ident, $method:ident => $op:ident),*) => {$(
        impl std::ops::$trait<&Tensor> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                binary(self, rhs, BinaryOp::$op)
            }
        }
    )*};
}

operators!(Add, add => Add, Sub, sub => Sub, Mul, mul => Mul, Div, div => Div);
