//! Comparisons (to bool), dtype casts, `where` and `masked_fill`. Bool tensors are one byte per
//! element on every device, as in PyTorch.

use super::{coalesce_for_kernel, same_device, strided_header, u32_of};
use crate::cpu;
use crate::kernels::{launch, CmpOp, Kernel, PredicateForm, PredicateKernel};
use crate::tensor::{broadcast_shapes, DType, Tensor};
use crate::{Error, Result};

/// One launch of a predicate kernel: `a` and `b` (if any) broadcast to `out`'s shape.
fn gpu_predicate(
    kernel: PredicateKernel,
    a: &Tensor,
    b: Option<&Tensor>,
    scalar_bits: Option<u32>,
    out: &Tensor,
    op: &'static str,
) -> Result<()> {
    let b_layout = b.map_or(&a.layout, |b| &b.layout);
    let c = coalesce_for_kernel(op, out.shape(), &[&a.layout, b_layout, &out.layout])?;
    let off_b = match (b, scalar_bits) {
        (Some(b), _) => u32_of(op, b.layout.offset)?,
        (None, Some(bits)) => bits,
        (None, None) => 0,
    };
    let n = out.numel();
    let imm = strided_header(op, n, &c, u32_of(op, a.layout.offset)?, off_b)?;
    let mut blocks = vec![&a.storage.block];
    if let Some(b) = b {
        blocks.push(&b.storage.block);
    }
    blocks.push(&out.storage.block);
    let threads = if kernel.packs_bools() {
        n.div_ceil(4)
    } else {
        n
    };
    launch(Kernel::Predicate(kernel), &blocks, &imm, threads as u64)
}

fn scalar_bits(dtype: DType, s: f64) -> u32 {
    if dtype.is_float() {
        (s as f32).to_bits()
    } else {
        s as i64 as u32
    }
}

fn check_values(op: &'static str, dtype: DType) -> Result<()> {
    if dtype == DType::Bool {
        return Err(Error::UnsupportedDType {
            op,
            dtype,
            why: "as values here (cast to an integer first)".into(),
        });
    }
    Ok(())
}

/// `a OP b` elementwise with broadcasting, as a bool tensor.
pub fn compare(a: &Tensor, b: &Tensor, op: CmpOp) -> Result<Tensor> {
    let name = op.name();
    same_device(name, a, b)?;
    if a.dtype != b.dtype {
        return Err(Error::DTypeMismatch {
            op: name,
            expected: a.dtype,
            got: b.dtype,
        });
    }
    check_values(name, a.dtype)?;
    let shape = broadcast_shapes(name, a.shape(), b.shape())?;
    let a = Tensor {
        layout: a.layout.broadcast_to(name, &shape)?,
        ..a.clone()
    };
    let b = Tensor {
        layout: b.layout.broadcast_to(name, &shape)?,
        ..b.clone()
    };
    let out = Tensor::empty(&shape, DType::Bool, a.device())?;
    if out.numel() > 0 {
        if a.device().is_cpu() {
            super::ready_on_host(&[&a, &b])?;
            cpu::compare(&a, Some(&b), 0.0, &out, op);
        } else {
            let k = PredicateKernel {
                form: PredicateForm::Compare(op),
                input: a.dtype,
                output: DType::Bool,
            };
            gpu_predicate(k, &a, Some(&b), None, &out, name)?;
        }
    }
    Ok(out)
}

/// `a OP s` elementwise, as a bool tensor.
pub fn compare_scalar(a: &Tensor, s: f64, op: CmpOp) -> Result<Tensor> {
    let name = op.name();
    check_values(name, a.dtype)?;
    let out = Tensor::empty(a.shape(), DType::Bool, a.device())?;
    if out.numel() > 0 {
        if a.device().is_cpu() {
            a.host_ready()?;
            let s = if a.dtype.is_float() {
                s as f32 as f64
            } else {
                s
            };
            cpu::compare(a, None, s, &out, op);
        } else {
            let k = PredicateKernel {
                form: PredicateForm::CompareScalar(op),
                input: a.dtype,
                output: DType::Bool,
            };
            gpu_predicate(k, a, None, Some(scalar_bits(a.dtype, s)), &out, name)?;
        }
    }
    Ok(out)
}

/// A copy converted to `dtype` (floats to integers truncate toward zero; anything to bool is
/// `!= 0`, NaN included). The same dtype gives `self` back, as PyTorch's `.to(dtype)` does.
pub fn to_dtype(x: &Tensor, dtype: DType) -> Result<Tensor> {
    if dtype == x.dtype {
        return Ok(x.clone());
    }
    if x.requires_grad() && !dtype.is_float() {
        // Not differentiable: the result is a plain tensor, as in PyTorch.
        return crate::no_grad(|| to_dtype_forward(x, dtype));
    }
    let from = x.dtype;
    crate::graph::record(
        "ToCopyBackward0",
        &[x],
        || to_dtype_forward(x, dtype),
        |_| {
            // A float cast can pass its backward to the kernel before it (Note [Backward
            // epilogues]).
            if from.is_float() {
                crate::graph::offer_fusion(crate::graph::Fusable::Cast(from));
            }
            Ok(
                Box::new(move |g: &Tensor, _: &[bool]| Ok(vec![Some(g.to_dtype(from)?)]))
                    as crate::graph::BackwardFn,
            )
        },
    )
}

fn to_dtype_forward(x: &Tensor, dtype: DType) -> Result<Tensor> {
    const OP: &str = "to_dtype";
    x.device().check_dtype(OP, dtype)?;
    let out = Tensor::empty(x.shape(), dtype, x.device())?;
    if out.numel() > 0 {
        if x.device().is_cpu() {
            x.host_ready()?;
            cpu::unary(x, &out, super::UnaryOp::Identity);
        } else {
            cast_into(x, &out)?;
        }
    }
    Ok(out)
}

/// Converts (or copies) `x` into the fresh contiguous `out` on a GPU: f32 <-> f16 of whole
/// aligned vec4s four elements per invocation, anything else through the strided kernel.
pub(super) fn cast_into(x: &Tensor, out: &Tensor) -> Result<()> {
    let floats = [DType::F32, DType::F16];
    let n = x.numel();
    if floats.contains(&x.dtype)
        && floats.contains(&out.dtype)
        && x.dtype != out.dtype
        && x.is_contiguous()
        && out.is_contiguous()
        && n.is_multiple_of(4)
        && x.layout.offset.is_multiple_of(4)
        && out.layout.offset.is_multiple_of(4)
    {
        return cast_vec4(x, out);
    }
    let k = PredicateKernel {
        form: PredicateForm::Cast,
        input: x.dtype,
        output: out.dtype,
    };
    gpu_predicate(k, x, None, None, out, "to_dtype")
}

/// `cast_into`'s vec4 kernel: in one launch, or where either operand is larger than one
/// binding, in chunks that each bind the part of both they convert (Note [Windows]).
fn cast_vec4(x: &Tensor, out: &Tensor) -> Result<()> {
    const OP: &str = "to_dtype";
    let kernel = Kernel::CastVec4(x.dtype, out.dtype);
    let vecs = x.numel() / 4;
    let (x_off, out_off) = (x.layout.offset / 4, out.layout.offset / 4);
    let (xb, ob) = (&x.storage.block, &out.storage.block);
    let window = crate::kernels::window_bytes(x.device());
    if xb.block_size().max(ob.block_size()) <= window {
        let imm = [
            u32_of(OP, vecs)?,
            u32_of(OP, x_off)?,
            u32_of(OP, out_off)?,
            0,
        ];
        return launch(kernel, &[xb, ob], &imm, vecs as u64);
    }
    let (xv, ov) = (4 * x.dtype.size_bytes(), 4 * out.dtype.size_bytes());
    for (first, end) in crate::kernels::spans(vecs, window as usize / xv.max(ov)) {
        let span = |off: usize, v: usize| (((off + first) * v) as u64, ((off + end) * v) as u64);
        let (xs, xe) = span(x_off, xv);
        let (os, oe) = span(out_off, ov);
        let (xw, x_before) = crate::kernels::window_covering(xb, xs, xe)?;
        let (ow, o_before) = crate::kernels::window_covering(ob, os, oe)?;
        let imm = [
            u32_of(OP, end - first)?,
            u32_of(OP, x_before as usize / xv)?,
            u32_of(OP, o_before as usize / ov)?,
            0,
        ];
        crate::kernels::launch(kernel, &[xw, ow], &imm, (end - first) as u64)?;
    }
    Ok(())
}

/// Elements of `a` where `cond` holds, else of `b`; all three broadcast together.
pub fn where_(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    crate::graph::record(
        "WhereBackward0",
        &[a, b],
        || where_forward(cond, a, b),
        |_| {
            let (sa, sb) = (a.shape().to_vec(), b.shape().to_vec());
            let c = crate::graph::save(cond)?;
            Ok(Box::new(move |g: &Tensor, needs: &[bool]| {
                let cond = c.get()?;
                let zeros = Tensor::zeros(&[], g.dtype(), g.device())?;
                let ga = match needs[0] {
                    true => Some(crate::ops::sum_to(&where_(&cond, g, &zeros)?, &sa)?),
                    false => None,
                };
                let gb = match needs[1] {
                    true => Some(crate::ops::sum_to(&where_(&cond, &zeros, g)?, &sb)?),
                    false => None,
                };
                Ok(vec![ga, gb])
            }) as crate::graph::BackwardFn)
        },
    )
}

fn where_forward(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    const OP: &str = "where";
    same_device(OP, cond, a)?;
    same_device(OP, a, b)?;
    if cond.dtype != DType::Bool {
        return Err(Error::DTypeMismatch {
            op: OP,
            expected: DType::Bool,
            got: cond.dtype,
        });
    }
    if a.dtype != b.dtype {
        return Err(Error::DTypeMismatch {
            op: OP,
            expected: a.dtype,
            got: b.dtype,
        });
    }
    check_values(OP, a.dtype)?;
    let shape = broadcast_shapes(
        OP,
        &broadcast_shapes(OP, cond.shape(), a.shape())?,
        b.shape(),
    )?;
    // out = b, then a where cond: a fresh copy, never `b` itself.
    let out = super::copy(&b.expand(&shape)?)?;
    select_into(
        &out,
        &cond.expand(&shape)?,
        Some(&a.expand(&shape)?),
        0.0,
        OP,
    )?;
    Ok(out)
}

/// In place on the fresh contiguous `out`: where `cond`, take `value` (a tensor) or `s`.
fn select_into(
    out: &Tensor,
    cond: &Tensor,
    value: Option<&Tensor>,
    s: f64,
    op: &'static str,
) -> Result<()> {
    if out.numel() == 0 {
        return Ok(());
    }
    if out.device().is_cpu() {
        super::ready_on_host(&[out, cond])?;
        if let Some(v) = value {
            v.host_ready()?;
        }
        cpu::select(out, cond, value, s);
        return Ok(());
    }
    let form = if value.is_some() {
        PredicateForm::Select
    } else {
        PredicateForm::SelectScalar
    };
    let k = PredicateKernel {
        form,
        input: out.dtype,
        output: out.dtype,
    };
    gpu_predicate(k, cond, value, Some(scalar_bits(out.dtype, s)), out, op)
}

/// A copy of `x` with `value` where `mask` (broadcast to `x`'s shape) holds.
pub fn masked_fill(x: &Tensor, mask: &Tensor, value: f64) -> Result<Tensor> {
    crate::graph::record(
        "MaskedFillBackward0",
        &[x],
        || masked_fill_forward(x, mask, value),
        |_| {
            let m = crate::graph::save(mask)?;
            Ok(Box::new(move |g: &Tensor, _: &[bool]| {
                Ok(vec![Some(masked_fill(g, &m.get()?, 0.0)?)])
            }) as crate::graph::BackwardFn)
        },
    )
}

fn masked_fill_forward(x: &Tensor, mask: &Tensor, value: f64) -> Result<Tensor> {
    const OP: &str = "masked_fill";
    same_device(OP, x, mask)?;
    if mask.dtype != DType::Bool {
        return Err(Error::DTypeMismatch {
            op: OP,
            expected: DType::Bool,
            got: mask.dtype,
        });
    }
    check_values(OP, x.dtype)?;
    let out = super::copy(x)?;
    let value = if x.dtype.is_float() {
        value as f32 as f64
    } else {
        value
    };
    select_into(&out, &mask.expand(x.shape())?, None, value, OP)?;
    Ok(out)
}

macro_rules! compare_methods {
    ($($name:ident, $scalar:ident => $op:ident),* $(,)?) => {
        impl Tensor {$(
            #[doc = concat!("Elementwise `", stringify!($name), "` with broadcasting, as bool.")]
            pub fn $name(&self, other: &Tensor) -> Result<Tensor> {
                compare(self, other, CmpOp::$op)
            }
            #[doc = concat!("Elementwise `", stringify!($name), "` with a scalar, as bool.")]
            pub fn $scalar(&self, s: f64) -> Result<Tensor> {
                compare_scalar(self, s, CmpOp::$op)
            }
        )*}
    };
}

compare_methods! {
    eq, eq_scalar => Eq, ne, ne_scalar => Ne, lt, lt_scalar => Lt,
    le, le_scalar => Le, gt, gt_scalar => Gt, ge, ge_scalar => Ge,
}

impl Tensor {
    /// A copy in `dtype` (`self` when it already has it).
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        to_dtype(self, dtype)
    }

    /// `value` where `mask` holds, else `self` (a new tensor).
    pub fn masked_fill(&self, mask: &Tensor, value: f64) -> Result<Tensor> {
        masked_fill(self, mask, value)
    }
}
