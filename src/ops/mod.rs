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
//! - `linear.rs` (`linear`, `linear_relu`); products: `matmul.rs` (the ops),
//!   `matmul_plan.rs` (the planner: a checked product's route, the flattened operands, and one
//!   launch function per kernel family), `matmul_choice.rs` (the conditions each family sets),
//!   `matmul_partials.rs` (K split into f32 partials), `matmul_windows.rs` (tensor-core
//!   products of operands past one binding, over windows of them),
//!   `matmul_narrow.rs` (a narrow side or a short K, and `grouped`, which
//!   holds a product backward's `short4` and `cols` launches until both are recorded and sends
//!   them as one dispatch), `matmul_words.rs` (the word products' launches), `matmul_grad.rs` (a
//!   product's backward, with the row sums and ReLU mask its kernels take in passing);
//! - `batch_norm.rs` (the fused GPU path for f32 and f16 input, the composite formula as the CPU
//!   reference);
//!   convolution (`conv.rs`; `conv_gemm.rs` picks the implicit GEMM on Vulkan, Metal and DX12
//!   GPUs and lays out its weight copies and K splits; `conv_coop.rs` the f16 forward pass and
//!   both gradients on tensor cores) with pooling, and `conv_grad.rs`;
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
mod conv_coop;
mod conv_gemm;
mod conv_grad;
mod copies;
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
mod matmul_partials;
mod matmul_plan;
mod matmul_simt;
mod matmul_windows;
mod matmul_words;
mod predicate;
mod random;
mod reduce;
pub(crate) use reduce::sum_to;
mod softmax;
mod transfer;
pub(crate) use transfer::SideCopy;
mod view;
mod views;
pub(crate) use view::isize_shape;

pub use crate::base::CmpOp;
pub use crate::base::Conv2dParams;
pub use crate::base::{BinaryOp, UnaryOp};
pub use attention::scaled_dot_product_attention;
pub(crate) use batch_norm::batch_norm_counted;
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
use crate::kernels::{launch, tune, ElementwiseKernel, Form, Kernel, PER_THREAD};
use crate::tensor::{broadcast_shapes, DType, Layout, Tensor};
use crate::{Error, Result};
pub(crate) use copies::{contiguous_two, copy_rows};
use copies::{transpose_job, TransposeCopy};

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
        what: "elements or offset units (kiln's kernels index in 32 bits)",
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
    // (Not past one binding: `gpu_elementwise_flat` takes windows.)
    let big = |t: &Tensor| crate::kernels::past_one_binding(&t.storage.block);
    let job = match inplace || form != Form::Unary(UnaryOp::Identity) || big(a) || big(out) {
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
    // One launch of the kernel with `vector`/`wide`, counts, offsets and `dims` in units of
    // `unit` elements (vec4s: 4, 32-byte words: 8).
    let launch_in = |vector: bool, wide: bool, unit: usize, dims: &Coalesced| -> Result<()> {
        let kernel = ElementwiseKernel {
            contiguous: dims.contiguous,
            vector,
            wide,
            inplace,
            ..check_supported(form, a.dtype, op)?
        };
        let off_b = match b {
            Some(b) => u32_of(op, b.layout.offset / unit)?,
            None => scalar_word(a.dtype, scalar),
        };
        let off_a = u32_of(op, a.layout.offset / unit)?;
        let imm = strided_header(op, n / unit, dims, off_a, off_b)?;
        let mut blocks = vec![&a.storage.block];
        if let Some(b) = b {
            blocks.push(&b.storage.block);
        }
        if !inplace {
            blocks.push(&out.storage.block);
        }
        let invocations = ((n / unit) as u64).div_ceil(PER_THREAD as u64);
        launch(Kernel::Elementwise(kernel), &blocks, &imm, invocations)
    };
    if rows4 {
        return launch_in(true, false, 4, &in_vec4s(c));
    }
    let vector = aligned(4);
    let big = |t: &Tensor| crate::kernels::past_one_binding(&t.storage.block);
    if vector && (big(a) || b.is_some_and(big) || big(out)) {
        let kernel = ElementwiseKernel {
            contiguous: true,
            vector: true,
            wide: false,
            inplace,
            ..check_supported(form, a.dtype, op)?
        };
        return elementwise_windows(kernel, [a, out], b, scalar, op);
    }
    if !vector && (big(a) || b.is_some_and(big) || big(out)) && !c.shape.is_empty() {
        let kernel = ElementwiseKernel {
            contiguous: c.contiguous,
            vector: false,
            wide: false,
            inplace,
            ..check_supported(form, a.dtype, op)?
        };
        if views::outer_windows(kernel, [a, out], b, scalar, c, op)? {
            return Ok(());
        }
        // A transpose's view into a fresh output, which the kernel writes in order: `a` copied
        // into `out` in place (over blocks of both dims), then the op on `out` in place.
        if !inplace && out.dtype == a.dtype && c.shape.len() == 2 {
            gpu_elementwise(Form::Binary(BinaryOp::Right), out, Some(a), None, None, op)?;
            return match form {
                Form::Unary(UnaryOp::Identity) => Ok(()),
                Form::Unary(_) => gpu_elementwise(form, out, None, None, None, op),
                Form::Binary(_) => gpu_elementwise(form, out, b, None, None, op),
                Form::Scalar(_) => gpu_elementwise(form, out, None, scalar, None, op),
            };
        }
    }
    // The layout chosen: vec4s, 32-byte words (`wide`), or single elements.
    let mut launch_as = |wide: bool| -> Result<()> {
        let unit = if wide {
            8
        } else if vector {
            4
        } else {
            1
        };
        launch_in(vector, wide, unit, c)
    };
    let wide = aligned(8) && elementwise_wide(form, a, n, inplace, &mut launch_as)?;
    launch_as(wide)
}

/// A contiguous elementwise launch (`kernel`, in vec4s) where an operand is larger than one
/// binding, as launches over windows of vec4s of every operand (Note [Windows] in
/// `kernels/launch.rs`): the output's windows start on the binding alignment (the kernel
/// writes it from its first element), the inputs' pass their offsets inside theirs. In place,
/// `out` is `a`.
fn elementwise_windows(
    kernel: ElementwiseKernel,
    [a, out]: [&Tensor; 2],
    b: Option<&Tensor>,
    scalar: Option<f64>,
    op: &'static str,
) -> Result<()> {
    use crate::kernels::{aligned_rows, spans, window_covering, window_from, Window};
    let widest = [Some(a), b, Some(out)]
        .iter()
        .flatten()
        .map(|t| 4 * t.dtype.size_bytes())
        .max()
        .unwrap_or(16);
    let per = aligned_rows(a.device(), 4 * out.dtype.size_bytes(), widest)?;
    // The window of `t` holding vec4s first..end of the walk, and its offset there in vec4s.
    fn part<'t>(
        t: &'t Tensor,
        (first, end): (usize, usize),
        op: &'static str,
    ) -> Result<(Window<'t>, u32)> {
        let unit = 4 * t.dtype.size_bytes();
        let at = |v: usize| (t.layout.offset * t.dtype.size_bytes() + v * unit) as u64;
        let (w, before) = window_covering(&t.storage.block, at(first), at(end))?;
        Ok((w, u32_of(op, before as usize / unit)?))
    }
    for span in spans(out.numel() / 4, per) {
        let (wa, off_a) = part(a, span, op)?;
        let mut blocks = vec![wa];
        let off_b = match b {
            Some(b) => {
                let (wb, off_b) = part(b, span, op)?;
                blocks.push(wb);
                off_b
            }
            None => scalar_word(a.dtype, scalar),
        };
        if !kernel.inplace {
            // (A fresh output: the kernel writes it from its binding's first element.)
            let es = out.dtype.size_bytes();
            let at = |v: usize| ((out.layout.offset + 4 * v) * es) as u64;
            blocks.push(window_from(&out.storage.block, at(span.0), at(span.1), op)?);
        }
        let len = span.1 - span.0;
        let whole = Coalesced {
            shape: vec![4 * len],
            strides: vec![vec![1]; 3],
            contiguous: true,
        };
        let imm = strided_header(op, len, &whole, off_a, off_b)?;
        let invocations = (len as u64).div_ceil(PER_THREAD as u64);
        launch(Kernel::Elementwise(kernel), &blocks, &imm, invocations)?;
    }
    Ok(())
}

/// The elementwise kernel's second operand word without a second tensor: the scalar's bits
/// (an f32 for float ops, a two's-complement integer otherwise), or 0 for a unary op.
fn scalar_word(dtype: DType, scalar: Option<f64>) -> u32 {
    match scalar {
        Some(s) if dtype.is_float() => (s as f32).to_bits(),
        Some(s) => s as i64 as u32,
        None => 0,
    }
}

/// `c` counted in vec4s: its innermost dim (unit-stride in every operand) and every other
/// stride divided by 4.
fn in_vec4s(c: &Coalesced) -> Coalesced {
    let mut shape = c.shape.clone();
    if let Some(last) = shape.last_mut() {
        *last /= 4;
    }
    let strides = c
        .strides
        .iter()
        .map(|s| match s.split_last() {
            Some((&last, rest)) => rest.iter().map(|x| x / 4).chain([last]).collect(),
            None => Vec::new(),
        })
        .collect();
    Coalesced {
        shape,
        strides,
        contiguous: false,
    }
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

/// A contiguous copy.
pub(crate) fn copy(x: &Tensor) -> Result<Tensor> {
    unary(x, UnaryOp::Identity)
}

/// A new tensor `op(a, b)` with NumPy broadcasting. Both operands share dtype and device.
pub fn binary(a: &Tensor, b: &Tensor, op: BinaryOp) -> Result<Tensor> {
    if op == BinaryOp::Add {
        if let Some(sum) = add_mixed(a, b)? {
            return Ok(sum);
        }
    }
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

/// Under autocast, `a + b` of an f32 and an f16 tensor of one shape, contiguous in whole vec4s
/// on a GPU (a residual stream plus a block's output): one kernel that promotes as it adds
/// (`shaders/add_mixed_vec4.wgsl`), as PyTorch's add does, rather than a cast of the f16
/// operand to a fresh f32 tensor and an add. One `AddBackward0` node; the f16 operand's
/// gradient is the f32 one cast back, as PyTorch's engine casts it to the input's dtype.
/// `None` for anything else.
fn add_mixed(a: &Tensor, b: &Tensor) -> Result<Option<Tensor>> {
    let (wide, half) = match (a.dtype, b.dtype) {
        (DType::F32, DType::F16) => (a, b),
        (DType::F16, DType::F32) => (b, a),
        _ => return Ok(None),
    };
    let whole = |t: &Tensor| t.is_contiguous() && t.layout.offset.is_multiple_of(4);
    let fits = autocast::applies(a)
        && !a.device().is_cpu()
        && a.device() == b.device()
        && a.shape() == b.shape()
        && a.numel().is_multiple_of(4)
        && a.numel() > 0
        && whole(a)
        && whole(b);
    if !fits {
        return Ok(None);
    }
    let (da, db) = (a.dtype, b.dtype);
    crate::graph::record(
        grad::binary_name(BinaryOp::Add),
        &[a, b],
        || {
            const OP: &str = "add";
            let out = Tensor::empty(a.shape(), DType::F32, a.device())?;
            let imm = [
                u32_of(OP, a.numel() / 4)?,
                u32_of(OP, wide.layout.offset / 4)?,
                u32_of(OP, half.layout.offset / 4)?,
                u32_of(OP, out.layout.offset / 4)?,
            ];
            launch(
                Kernel::AddMixedVec4,
                &[&wide.storage.block, &half.storage.block, &out.storage.block],
                &imm,
                (a.numel() / 4) as u64,
            )?;
            Ok(out)
        },
        |_| {
            Ok(Box::new(move |g: &Tensor, needs: &[bool]| {
                let cast = |on: bool, d: DType| on.then(|| g.to_dtype(d)).transpose();
                Ok(vec![cast(needs[0], da)?, cast(needs[1], db)?])
            }) as crate::graph::BackwardFn)
        },
    )
    .map(Some)
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

impl Tensor {
    /// `relu(self + other)` with broadcasting, in one pass (a residual add and the ReLU after
    /// it: ResNet's blocks end with one). One `AddReluBackward0` node, which saves the output
    /// as ReluBackward0 does and gives both operands the masked gradient.
    pub fn add_relu(&self, other: &Tensor) -> Result<Tensor> {
        binary(self, other, BinaryOp::AddRelu)
    }
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
