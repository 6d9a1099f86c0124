//! In-place ops, PyTorch's trailing underscore: the result goes back into the tensor's own
//! elements (through any view), and the version counter shared by its views is bumped.

use super::{check_supported, gpu_elementwise, same_device, BinaryOp, UnaryOp};
use crate::cpu;
use crate::kernels::Form;
use crate::tensor::{DType, Tensor};
use crate::{Error, Result};

/// PyTorch refuses to write through a view where several elements share one memory location.
fn check_writable(op: &'static str, t: &Tensor) -> Result<()> {
    let l = t.layout();
    if l.shape
        .iter()
        .zip(&l.strides)
        .any(|(&n, &s)| n > 1 && s == 0)
    {
        return Err(Error::InvalidArgument {
            op,
            msg: "unsupported operation: more than one element of the written-to tensor refers to a single memory location. Please clone() the tensor before performing the operation.".into(),
        });
    }
    if t.dtype() == DType::Bool && !t.device().is_cpu() {
        return Err(Error::UnsupportedDType {
            op,
            dtype: DType::Bool,
            why: "in GPU kernels yet".into(),
        });
    }
    Ok(())
}

/// An input that shares memory with the written tensor must be that very view (`x.add_(x)`),
/// not a different arrangement of the same elements (`x.add_(x.t())`), as in PyTorch.
fn check_no_partial_overlap(op: &'static str, out: &Tensor, input: &Tensor) -> Result<()> {
    if !out.shares_storage(input) || out.layout() == input.layout() {
        return Ok(());
    }
    let (lo, li) = (out.layout(), input.layout());
    let disjoint = lo.storage_span() <= li.offset || li.storage_span() <= lo.offset;
    if disjoint {
        return Ok(());
    }
    Err(Error::InvalidArgument {
        op,
        msg: "unsupported operation: some elements of the input tensor and the written-to tensor refer to a single memory location. Please clone() the tensor before performing the operation.".into(),
    })
}

/// `x = op(x)` in place.
pub fn unary_(x: &Tensor, op: UnaryOp) -> Result<()> {
    let name = op.name();
    check_supported(Form::Unary(op), x.dtype(), name)?;
    check_writable(name, x)?;
    x.check_inplace(name)?;
    if x.numel() > 0 {
        if x.device().is_cpu() {
            x.host_ready()?;
            cpu::unary(x, x, op);
        } else {
            gpu_elementwise(Form::Unary(op), x, None, None, None, name)?;
        }
    }
    x.bump_version();
    Ok(())
}

/// `a = op(a, b)` in place; `b` broadcasts to `a`'s shape (never the other way round).
pub fn binary_(a: &Tensor, b: &Tensor, op: BinaryOp) -> Result<()> {
    let name = op.name();
    same_device(name, a, b)?;
    if a.dtype() != b.dtype() {
        return Err(Error::DTypeMismatch {
            op: name,
            expected: a.dtype(),
            got: b.dtype(),
        });
    }
    check_supported(Form::Binary(op), a.dtype(), name)?;
    check_writable(name, a)?;
    a.check_inplace(name)?;
    let lb = b
        .layout()
        .broadcast_to(name, a.shape())
        .map_err(|_| Error::ShapeMismatch {
            op: name,
            lhs: a.shape().to_vec(),
            rhs: b.shape().to_vec(),
        })?;
    let b = Tensor {
        layout: lb,
        ..b.clone()
    };
    check_no_partial_overlap(name, a, &b)?;
    if a.numel() > 0 {
        if a.device().is_cpu() {
            crate::ops::ready_on_host(&[a, &b])?;
            cpu::binary(a, &b, a, op);
        } else {
            gpu_elementwise(Form::Binary(op), a, Some(&b), None, None, name)?;
        }
    }
    a.bump_version();
    Ok(())
}

/// `a = op(a, s)` in place.
pub fn binary_scalar_(a: &Tensor, s: f64, op: BinaryOp) -> Result<()> {
    let name = op.name();
    check_supported(Form::Scalar(op), a.dtype(), name)?;
    check_writable(name, a)?;
    a.check_inplace(name)?;
    if !a.dtype().is_float() && s.fract() != 0.0 {
        return Err(Error::InvalidArgument {
            op: name,
            msg: format!("scalar {s} on a {} tensor", a.dtype()),
        });
    }
    if a.numel() > 0 {
        if a.device().is_cpu() {
            a.host_ready()?;
            let s = if a.dtype().is_float() {
                s as f32 as f64
            } else {
                s
            };
            cpu::binary_scalar(a, s, a, op);
        } else {
            gpu_elementwise(Form::Scalar(op), a, None, Some(s), None, name)?;
        }
    }
    a.bump_version();
    Ok(())
}

macro_rules! unary_inplace {
    ($($name:ident => $op:ident),* $(,)?) => {
        impl Tensor {$(
            #[doc = concat!("In-place `", stringify!($op), "`; bumps the version counter.")]
            pub fn $name(&self) -> Result<()> {
                unary_(self, UnaryOp::$op)
            }
        )*}
    };
}

unary_inplace! {
    neg_ => Neg, abs_ => Abs, exp_ => Exp, log_ => Log, sqrt_ => Sqrt, rsqrt_ => Rsqrt,
    reciprocal_ => Reciprocal, square_ => Square, sin_ => Sin, cos_ => Cos, tanh_ => Tanh,
    sigmoid_ => Sigmoid, relu_ => Relu, gelu_ => Gelu, silu_ => Silu,
}

macro_rules! binary_inplace {
    ($($name:ident, $scalar:ident => $op:ident),* $(,)?) => {
        impl Tensor {$(
            #[doc = concat!("In-place `", stringify!($op), "` with `other` broadcast to this shape.")]
            pub fn $name(&self, other: &Tensor) -> Result<()> {
                binary_(self, other, BinaryOp::$op)
            }
            #[doc = concat!("In-place `", stringify!($op), "` with a scalar.")]
            pub fn $scalar(&self, s: f64) -> Result<()> {
                binary_scalar_(self, s, BinaryOp::$op)
            }
        )*}
    };
}

binary_inplace! {
    add_, add_scalar_ => Add,
    sub_, sub_scalar_ => Sub,
    mul_, mul_scalar_ => Mul,
    div_, div_scalar_ => Div,
    pow_, pow_scalar_ => Pow,
    maximum_, maximum_scalar_ => Maximum,
    minimum_, minimum_scalar_ => Minimum,
}

impl Tensor {
    /// Copies `src` (broadcast to this shape) into this tensor's elements.
    pub fn copy_(&self, src: &Tensor) -> Result<()> {
        if self.device() != src.device() || self.device().is_cpu() != src.device().is_cpu() {
            return self.copy_across_devices(src);
        }
        binary_(self, src, BinaryOp::Right)
    }

    /// Sets every element to `value`.
    pub fn fill_(&self, value: f64) -> Result<()> {
        binary_scalar_(self, value, BinaryOp::Right)
    }

    /// `zero_()`: every element set to zero, in place.
    pub fn zero_(&self) -> Result<()> {
        self.fill_(0.0)
    }

    /// Clamps into [lo, hi] in place (NaN stays NaN).
    pub fn clamp_(&self, lo: f64, hi: f64) -> Result<()> {
        self.maximum_scalar_(lo)?;
        self.minimum_scalar_(hi)
    }

    /// Clamps into [lo, hi] into a new tensor.
    pub fn clamp(&self, lo: f64, hi: f64) -> Result<Tensor> {
        self.maximum_scalar(lo)?.minimum_scalar(hi)
    }
}
