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
///
/// Under autocast, f16 logits go as in PyTorch, whose `cross_entropy` is on none of autocast's
/// lists: it calls log_softmax with the logits' own dtype (autocast leaves an op that is given
/// a dtype alone), so the log-probabilities LogSoftmaxBackward0 saves are f16, and nll_loss
/// (autocast's fp32 list) takes an f32 copy of them, which NllLossBackward0 saves; the gradient
/// comes back through the copy to f16. PyTorch 2.11's trace of a GPT-2 124M AMP step shows
/// these sizes; casting the logits to f32 first (as before) kept one more f32 [N, C] alive at
/// the step's peak (785 MiB at batch 8 x 1024 tokens).
pub fn cross_entropy(logits: &Tensor, target: &Tensor) -> Result<Tensor> {
    check_classes("cross_entropy", logits, target)?;
    if logits.dtype() == DType::F16 && autocast::applies(logits) {
        let log_probs = autocast::suspended(|| logits.log_softmax(1))?;
        return nll_loss(&log_probs, target);
    }
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
