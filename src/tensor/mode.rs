//! Grad modes, thread-local as in PyTorch: `no_grad`, `enable_grad`, `inference_mode`, each as a
//! closure and as a guard that restores the previous mode when dropped.

use std::cell::Cell;

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
    static INFERENCE: Cell<bool> = const { Cell::new(false) };
}

/// Whether ops record a graph on this thread.
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(|g| g.get())
}

/// `torch.set_grad_enabled`: turns graph recording on or off on this thread.
pub fn set_grad_enabled(enabled: bool) {
    GRAD_ENABLED.with(|g| g.set(enabled));
}

/// Whether tensors made now are inference tensors.
pub fn is_inference_mode_enabled() -> bool {
    INFERENCE.with(|g| g.get())
}

/// Sets grad mode until dropped (`torch.set_grad_enabled` as a context manager).
#[must_use = "the mode ends when the guard is dropped"]
pub struct GradModeGuard {
    previous: bool,
}

impl GradModeGuard {
    /// Sets grad mode to `enabled` until dropped.
    pub fn new(enabled: bool) -> GradModeGuard {
        let previous = is_grad_enabled();
        set_grad_enabled(enabled);
        GradModeGuard { previous }
    }
    /// `torch.no_grad()` as a guard.
    pub fn no_grad() -> GradModeGuard {
        GradModeGuard::new(false)
    }
}

impl Drop for GradModeGuard {
    fn drop(&mut self) {
        set_grad_enabled(self.previous);
    }
}

/// Inference mode until dropped: no graph, and tensors made meanwhile are inference tensors,
/// which autograd later refuses to save (PyTorch's `inference_mode`).
#[must_use = "the mode ends when the guard is dropped"]
pub struct InferenceModeGuard {
    grad: GradModeGuard,
    previous: bool,
}

impl InferenceModeGuard {
    /// Inference mode until dropped.
    pub fn new() -> InferenceModeGuard {
        let previous = is_inference_mode_enabled();
        INFERENCE.with(|g| g.set(true));
        InferenceModeGuard {
            grad: GradModeGuard::new(false),
            previous,
        }
    }
}

impl Default for InferenceModeGuard {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for InferenceModeGuard {
    fn drop(&mut self) {
        INFERENCE.with(|g| g.set(self.previous));
        let _ = &self.grad;
    }
}

/// Runs `f` without recording a graph.
///
/// ```
/// use kiln::{no_grad, DType, Device, Tensor};
/// # fn main() -> kiln::Result<()> {
/// let dev = Device::cpu()?;
/// let w = Tensor::ones(&[4], DType::F32, &dev)?.requires_grad_(true)?;
/// let y = no_grad(|| w.mul_scalar(2.0))?; // evaluation: no graph, nothing saved
/// assert!(!y.requires_grad());
/// # Ok(())
/// # }
/// ```
pub fn no_grad<T>(f: impl FnOnce() -> T) -> T {
    let _guard = GradModeGuard::new(false);
    f()
}

/// Runs `f` recording a graph, also inside `no_grad`.
pub fn enable_grad<T>(f: impl FnOnce() -> T) -> T {
    let _guard = GradModeGuard::new(true);
    f()
}

/// Runs `f` in inference mode.
pub fn inference_mode<T>(f: impl FnOnce() -> T) -> T {
    let _guard = InferenceModeGuard::new();
    f()
}
