//! Losses, as `torch.nn.functional` computes them (mean reduction), built from differentiable
//! ops so that their backward runs on the device.

use crate::ops::autocast;
use crate::tensor::{DType, Tensor};
use crate::{Error, Result};

/// Negative log-likelihood of `log_probs` [N, C] at class indices `target` `[N]` (i32), averaged
/// over the rows whose target is not PyTorch's default `ignore_index`, -100 (one op with one
/// backward node, `NllLossBackward0`, as PyTorch's). A target outside [0, C) that is not -100
/// is an error: at once on the CPU, at the next sync point on a GPU (a device assert).
pub fn nll_loss(log_probs: &Tensor, target: &Tensor) -> Result<Tensor> {
    if let Some(v) = autocast::fp32(&[log_probs])? {
        return autocast::suspended(|| nll_loss(&v[0], target));
    }
    check_classes("nll_loss", log_probs, target)?;
    crate::ops::loss::nll_loss(log_probs, target, crate::ops::loss::IGNORE_INDEX)
}

/// Cross entropy of raw `logits` [N, C] against class indices `target` `[N]` (i32), averaged:
/// `nll_loss(log_softmax(logits, 1))` with PyTorch's two nodes and allocations, each pair of
/// kernels fused in one on a GPU (`ops::loss::cross_entropy`).
pub fn cross_entropy(logits: &Tensor, target: &Tensor) -> Result<Tensor> {
    if let Some(v) = autocast::fp32(&[logits])? {
        return autocast::suspended(|| cross_entropy(&v[0], target));
    }
    check_classes("cross_entropy", logits, target)?;
    crate::ops::loss::cross_entropy(logits, target, crate::ops::loss::IGNORE_INDEX)
}

/// A classification loss's operands: an [N, C] input and N i32 class indices.
fn check_classes(op: &'static str, input: &Tensor, target: &Tensor) -> Result<()> {
    if input.rank() != 2 || target.rank() != 1 || target.shape()[0] != input.shape()[0] {
        return Err(Error::ShapeMismatch {
            op,
            lhs: input.shape().to_vec(),
            rhs: target.shape().to_vec(),
        });
    }
    if target.dtype() != DType::I32 {
        return Err(Error::DTypeMismatch {
            op,
            expected: DType::I32,
            got: target.dtype(),
        });
    }
    Ok(())
}

/// Mean squared error.
pub fn mse_loss(input: &Tensor, target: &Tensor) -> Result<Tensor> {
    if let Some(v) = autocast::fp32(&[input, target])? {
        return autocast::suspended(|| mse_loss(&v[0], &v[1]));
    }
    if input.shape() != target.shape() {
        return Err(Error::ShapeMismatch {
            op: "mse_loss",
            lhs: input.shape().to_vec(),
            rhs: target.shape().to_vec(),
        });
    }
    input.sub(target)?.square()?.mean(&[], false)
}
