//! Reverse-mode autograd with PyTorch's semantics, including the ones that make memory grow when
//! a user gets them wrong: a tensor that holds a graph keeps every tensor that graph saved alive;
//! gradients accumulate into `.grad` until zeroed; saved tensors are freed by `backward()` unless
//! the graph is retained; modifying a saved tensor in place is caught at `backward()`.
//!
//! This module is the engine and the public API; it sits above the ops, since running a graph
//! backward adds and copies gradients. The graph itself (what ops record) is `crate::graph`,
//! below the ops; the grad modes live with the tensor (`crate::tensor::mode`), as PyTorch keeps
//! `GradMode` in c10. See Note [Autograd graph] in `src/graph/mod.rs`.
//!
//! # What is here
//!
//! `engine.rs` is the backward engine (accumulation adds and copies gradients, hence above the
//! ops; a leaf's post-accumulate hooks run after its last contribution of the pass, and
//! `queue_callback`'s callbacks after the graph), with `backward`, `backward_with` and
//! `zero_grad`; `checkpoint.rs` is `checkpoint`; `offload.rs` is `save_on_cpu` (over the
//! graph's `saved_tensors_hooks`). Backward formulas live beside their forwards in
//! `src/ops/` (`grad.rs` for the elementwise family, `conv_grad.rs` for convolution and pooling,
//! `view.rs` for views).

mod checkpoint;
mod engine;
mod offload;

pub use checkpoint::checkpoint;
pub use engine::queue_callback;
pub use offload::{save_on_cpu, save_on_cpu_ahead, DEFAULT_AHEAD};

pub use crate::graph::{
    saved_tensors_hooks, set_backward_epilogues, Packed, RemovableHandle, SavedTensorsHooks,
};

pub use crate::tensor::mode::{
    enable_grad, inference_mode, is_grad_enabled, is_inference_mode_enabled, no_grad,
    set_grad_enabled, GradModeGuard, InferenceModeGuard,
};

use crate::base::lock;
use crate::tensor::Tensor;
use crate::{Error, Result};

impl Tensor {
    /// PyTorch's `zero_grad` for one tensor: drop the gradient (`set_to_none`) or zero it.
    pub fn zero_grad(&self, set_to_none: bool) -> Result<()> {
        if set_to_none {
            if let Some(meta) = self.meta() {
                *lock(&meta.grad) = None;
            }
            return Ok(());
        }
        match self.grad() {
            Some(g) => no_grad(|| g.zero_()),
            None => Ok(()),
        }
    }

    /// Computes the gradient of this one-element tensor with respect to the leaves of its graph,
    /// accumulating into their `.grad`; frees the graph's saved tensors.
    ///
    /// ```
    /// use kiln::{DType, Device, Tensor};
    /// # fn main() -> kiln::Result<()> {
    /// let dev = Device::cpu()?;
    /// let w = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], &dev)?.requires_grad_(true)?;
    /// let loss = w.mul(&w)?.sum_all()?; // sum(w^2)
    /// loss.backward()?;
    /// assert_eq!(w.grad().unwrap().to_vec::<f32>()?, [2.0, 4.0, 6.0]); // 2w
    /// // As in PyTorch, a second backward finds the graph's saved tensors freed.
    /// assert!(matches!(loss.backward(), Err(kiln::Error::Autograd { .. })));
    /// # Ok(())
    /// # }
    /// ```
    pub fn backward(&self) -> Result<()> {
        if self.numel() != 1 {
            return Err(Error::Autograd {
                op: "backward",
                msg: format!(
                    "grad can be implicitly created only for scalar outputs (shape {:?})",
                    self.shape()
                ),
            });
        }
        let ones = no_grad(|| self.detach().ones_like())?;
        engine::run(self, ones, false)
    }

    /// `backward` with an explicit output gradient and PyTorch's `retain_graph`.
    pub fn backward_with(&self, grad: &Tensor, retain_graph: bool) -> Result<()> {
        if grad.shape() != self.shape() || grad.dtype() != self.dtype() {
            return Err(Error::ShapeMismatch {
                op: "backward",
                lhs: self.shape().to_vec(),
                rhs: grad.shape().to_vec(),
            });
        }
        crate::ops::same_device("backward", self, grad)?;
        engine::run(self, grad.detach(), retain_graph)
    }
}
