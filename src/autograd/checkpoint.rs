//! Gradient checkpointing (`torch.utils.checkpoint`, reentrant form): the forward runs without
//! recording a graph, so none of `f`'s activations stay alive; backward runs `f` again with grad
//! on and backpropagates through that fresh graph. Parameters that `f` uses receive their
//! gradients from the inner backward, as in PyTorch.
//!
//! Decision: the device's random generator is not rewound for the recomputation (PyTorch
//! restores it); a `f` that draws random numbers (dropout) sees different draws in backward.

use crate::graph::{attach, BackwardFn};
use crate::tensor::Tensor;
use crate::tensor::{is_grad_enabled, GradModeGuard};
use crate::Result;
use std::sync::Arc;

/// `f(inputs)` with its activations recomputed in backward instead of saved.
pub fn checkpoint<F>(f: F, inputs: &[Tensor]) -> Result<Tensor>
where
    F: Fn(&[Tensor]) -> Result<Tensor> + Send + Sync + 'static,
{
    let mut out = {
        let _guard = GradModeGuard::new(false);
        f(inputs)?
    };
    out.autograd = None;
    if !is_grad_enabled() {
        return Ok(out);
    }
    // The inputs themselves are saved (PyTorch keeps them too); nothing else is.
    let saved: Vec<(Tensor, bool)> = inputs
        .iter()
        .map(|t| (t.detach(), t.requires_grad()))
        .collect();
    let f = Arc::new(f);
    let backward: BackwardFn = Box::new(move |g, _| {
        let _guard = GradModeGuard::new(true);
        let xs = saved
            .iter()
            .map(|(t, requires)| t.detach().requires_grad_(*requires))
            .collect::<Result<Vec<_>>>()?;
        let y = f(&xs)?;
        if y.requires_grad() {
            y.backward_with(g, false)?;
        }
        Ok(xs.iter().map(|x| x.grad()).collect())
    });
    let refs: Vec<&Tensor> = inputs.iter().collect();
    attach(&mut out, "CheckpointFunctionBackward", &refs, backward);
    Ok(out)
}
