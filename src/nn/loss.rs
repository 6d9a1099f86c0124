//! Losses, as `torch.nn.functional` computes them (mean reduction), built from differentiable
//! ops so that their backward runs on the device.

use crate::ops::autocast;
use crate::tensor::{DType, Tensor};
use crate::{Error, Result};

/// Negative log-likelihood of `log_probs` [N, C] at class indices `target` [N] (i32), averaged
/// over the rows whose target is not PyTorch's default `ignore_index`, -100 (one op with one
/// backward node, `NllLossBackward0`, as PyTorch's). A target outside [0, C) that is not -100
/// is an error: at once on the CPU, at the next sync point on a GPU (a device assert).
pub fn nll_loss(log_probs: &Tensor, target: &Tensor) -> Result<Tensor> {
    if let Some(v) = autocast::fp32(&[log_probs])? {
        return autocast::suspended(|| nll_loss(&v[0], target));
    }
    if log_probs.rank() != 2 || target.rank() != 1 || target.shape()[0] != log_probs.shape()[0] {
        return Err(Error::ShapeMismatch {
            op: "nll_loss",
            lhs: log_probs.shape().to_vec(),
            rhs: target.shape().to_vec(),
        });
    }
    if target.dtype() != DType::I32 {
        return Err(Error::DTypeMismatch {
            op: "nll_loss",
            expected: DType::I32,
            got: target.dtype(),
        });
    }
    crate::ops::loss::nll_loss(log_probs, target, crate::ops::loss::IGNORE_INDEX)
}

/// Cross entropy of raw `logits` [N, C] against class indices `target` [N] (i32), averaged:
/// `nll_loss(log_softmax(logits))`.
pub fn cross_entropy(logits: &Tensor, target: &Tensor) -> Result<Tensor> {
    if let Some(v) = autocast::fp32(&[logits])? {
        return autocast::suspended(|| cross_entropy(&v[0], target));
    }
    nll_loss(&logits.log_softmax(1)?, target)
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
