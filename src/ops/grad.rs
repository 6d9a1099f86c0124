//! Backward formulas of the elementwise family (unary, binary with broadcasting, scalar),
//! written with tensor ops so that they run where the forward ran. Each saves only what its
//! formula reads, as PyTorch's derivatives.yaml does.

use super::{binary, compare, BinaryOp, CmpOp, UnaryOp};
use crate::graph::{save, save_output, BackwardFn, Saved};
use crate::ops::sum_to;
use crate::tensor::Tensor;
use crate::Result;
use std::sync::Arc;

/// The backward node name of a binary op.
pub(super) fn binary_name(op: BinaryOp) -> &'static str {
    match op {
        BinaryOp::Add => "AddBackward0",
        BinaryOp::AddRelu => "AddReluBackward0",
        BinaryOp::Sub => "SubBackward0",
        BinaryOp::Mul => "MulBackward0",
        BinaryOp::Div => "DivBackward0",
        BinaryOp::Pow => "PowBackward1",
        BinaryOp::Maximum => "MaximumBackward0",
        BinaryOp::Minimum => "MinimumBackward0",
        BinaryOp::Right => "ExpandBackward0",
        BinaryOp::Grad(_) => "UnaryGradBackward",
    }
}

pub(super) fn scalar_name(op: BinaryOp) -> &'static str {
    match op {
        BinaryOp::Add => "AddBackward1",
        BinaryOp::AddRelu => "AddReluBackward1",
        BinaryOp::Sub => "SubBackward1",
        BinaryOp::Mul => "MulBackward1",
        BinaryOp::Div => "DivBackward1",
        BinaryOp::Pow => "PowBackward0",
        BinaryOp::Maximum | BinaryOp::Minimum => "ClampBackward1",
        BinaryOp::Right => "FillBackward0",
        BinaryOp::Grad(_) => "UnaryGradBackward",
    }
}

fn no_double_backward(name: &'static str) -> crate::Error {
    crate::Error::Autograd {
        op: name,
        msg: "kiln does not differentiate backward kernels (double backward)".into(),
    }
}

pub(super) fn unary(x: &Tensor, out: &Tensor, op: UnaryOp) -> Result<BackwardFn> {
    let saved: Option<Arc<Saved>> = match op {
        UnaryOp::Identity | UnaryOp::Neg => None,
        _ if op.grad_from_output() => Some(Arc::new(save_output(out, op.backward_name())?)),
        _ => Some(Arc::new(save(x)?)),
    };
    // ReLU's formula can ride in the epilogue of the product that computes its incoming
    // gradient (Note [Backward epilogues]).
    if let (UnaryOp::Relu, Some(s)) = (op, &saved) {
        crate::graph::offer_fusion(crate::graph::Fusable::ReluMask(Arc::downgrade(s)));
    }
    Ok(Box::new(move |g, _| {
        let gx = match (&saved, op) {
            (_, UnaryOp::Identity) => g.clone(),
            (_, UnaryOp::Neg) => g.neg()?,
            (Some(s), _) => binary(&s.get()?, g, BinaryOp::Grad(op))?,
            (None, _) => unreachable!("saved above"),
        };
        Ok(vec![Some(gx)])
    }))
}

/// 1 where `a` wins, 0 where `b` does, 0.5 on ties (PyTorch splits the gradient evenly).
fn winner_weight(a: &Tensor, b: &Tensor, op: BinaryOp) -> Result<Tensor> {
    let cmp = if op == BinaryOp::Maximum {
        CmpOp::Gt
    } else {
        CmpOp::Lt
    };
    let wins = compare(a, b, cmp)?.to_dtype(a.dtype())?;
    let ties = compare(a, b, CmpOp::Eq)?.to_dtype(a.dtype())?;
    wins.add(&ties.mul_scalar(0.5)?)
}

pub(super) fn binary_op(a: &Tensor, b: &Tensor, out: &Tensor, op: BinaryOp) -> Result<BackwardFn> {
    let (sa, sb) = (a.shape().to_vec(), b.shape().to_vec());
    let (need_a, need_b) = (a.requires_grad(), b.requires_grad());
    // What each formula reads: the other operand (mul), both (div, max/min), the output (pow).
    let (keep_a, keep_b, keep_out) = match op {
        BinaryOp::Mul => (need_b, need_a, false),
        BinaryOp::Div => (need_b, true, false),
        BinaryOp::Pow => (true, true, need_b),
        // ReLU's mask, from the output as ReluBackward0 takes it.
        BinaryOp::AddRelu => (false, false, true),
        BinaryOp::Maximum | BinaryOp::Minimum => (true, true, false),
        _ => (false, false, false),
    };
    let name = binary_name(op);
    let a_s = keep_a.then(|| save(a)).transpose()?;
    let b_s = keep_b.then(|| save(b)).transpose()?;
    let o_s = keep_out.then(|| save_output(out, name)).transpose()?;
    Ok(Box::new(move |g, needs| {
        let get = |s: &Option<Saved>| s.as_ref().expect("saved above").get();
        let (ga, gb) = match op {
            BinaryOp::Add => (Some(g.clone()), Some(g.clone())),
            BinaryOp::AddRelu => {
                let masked = binary(&get(&o_s)?, g, BinaryOp::Grad(UnaryOp::Relu))?;
                (Some(masked.clone()), Some(masked))
            }
            BinaryOp::Sub => (Some(g.clone()), needs[1].then(|| g.neg()).transpose()?),
            BinaryOp::Right => (None, Some(g.clone())),
            BinaryOp::Mul => (
                needs[0].then(|| g.mul(&get(&b_s)?)).transpose()?,
                needs[1].then(|| g.mul(&get(&a_s)?)).transpose()?,
            ),
            BinaryOp::Div => {
                let b = get(&b_s)?;
                let ga = needs[0].then(|| g.div(&b)).transpose()?;
                let gb = match needs[1] {
                    true => Some(g.mul(&get(&a_s)?)?.div(&b.square()?)?.neg()?),
                    false => None,
                };
                (ga, gb)
            }
            BinaryOp::Pow => {
                let (a, b) = (get(&a_s)?, get(&b_s)?);
                let ga = match needs[0] {
                    true => Some(g.mul(&b)?.mul(&a.pow(&b.sub_scalar(1.0)?)?)?),
                    false => None,
                };
                // d/db a^b = a^b ln a; PyTorch takes it as 0 where a == 0 and b >= 0.
                let gb = match needs[1] {
                    true => {
                        let ln = a.log()?;
                        let zero = a.eq_scalar(0.0)?;
                        let ln = ln.masked_fill(&zero, 0.0)?;
                        Some(g.mul(&get(&o_s)?)?.mul(&ln)?)
                    }
                    false => None,
                };
                (ga, gb)
            }
            BinaryOp::Maximum | BinaryOp::Minimum => {
                let w = winner_weight(&get(&a_s)?, &get(&b_s)?, op)?;
                let ga = needs[0].then(|| g.mul(&w)).transpose()?;
                let gb = match needs[1] {
                    true => Some(g.mul(&w.neg()?.add_scalar(1.0)?)?),
                    false => None,
                };
                (ga, gb)
            }
            BinaryOp::Grad(_) => return Err(no_double_backward(name)),
        };
        let ga = ga
            .filter(|_| needs[0])
            .map(|t| sum_to(&t, &sa))
            .transpose()?;
        let gb = gb
            .filter(|_| needs[1])
            .map(|t| sum_to(&t, &sb))
            .transpose()?;
        Ok(vec![ga, gb])
    }))
}

pub(super) fn scalar_op(a: &Tensor, s: f64, op: BinaryOp) -> Result<BackwardFn> {
    let name = scalar_name(op);
    let keep = matches!(op, BinaryOp::Pow | BinaryOp::Maximum | BinaryOp::Minimum);
    let a_s = keep.then(|| save(a)).transpose()?;
    Ok(Box::new(move |g, _| {
        let get = || a_s.as_ref().expect("saved above").get();
        let ga = match op {
            BinaryOp::Add | BinaryOp::Sub => Some(g.clone()),
            BinaryOp::Mul => Some(g.mul_scalar(s)?),
            BinaryOp::Div => Some(g.div_scalar(s)?),
            BinaryOp::Pow if s == 0.0 => Some(g.zeros_like()?),
            BinaryOp::Pow => Some(g.mul(&get()?.pow_scalar(s - 1.0)?)?.mul_scalar(s)?),
            BinaryOp::Maximum | BinaryOp::Minimum => {
                let a = get()?;
                let s_t = Tensor::full(&[], s, a.dtype(), a.device())?;
                Some(g.mul(&winner_weight(&a, &s_t, op)?)?)
            }
            BinaryOp::Right => None,
            BinaryOp::AddRelu => {
                return Err(crate::Error::Autograd {
                    op: name,
                    msg: "add_relu takes a tensor, not a scalar".into(),
                })
            }
            BinaryOp::Grad(_) => return Err(no_double_backward(name)),
        };
        Ok(vec![ga])
    }))
}
