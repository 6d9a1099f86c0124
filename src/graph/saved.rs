//! Tensors saved for backward (PyTorch's `SavedVariable`) and the hooks that pack and unpack
//! them (`saved_tensors_hooks`, PyTorch's `torch.autograd.graph.saved_tensors_hooks`).
//!
//! An op saves a tensor through `Saved::new`. With hooks in force on the thread, the pack hook
//! runs then, on the tensor, and what it returns is kept instead of the tensor (so the tensor's
//! memory goes when the forward drops it); the unpack hook runs each time backward reads the
//! saved value. The version counter is kept either way: an in-place write to the tensor before
//! backward reads it is the same `ModifiedInplace` error with hooks as without.

use super::SAVED_FOR_NODE;
use crate::tensor::mode::GradModeGuard;
use crate::tensor::{DType, Tensor};
use crate::{Error, Result};
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What a pack hook makes of a saved tensor: any value, handed back to the unpack hook.
pub type Packed = Box<dyn std::any::Any + Send + Sync>;

type PackFn = dyn Fn(&Tensor) -> Result<Packed> + Send + Sync;
type UnpackFn = dyn Fn(&Packed) -> Result<Tensor> + Send + Sync;

#[derive(Clone)]
struct Hooks {
    pack: Arc<PackFn>,
    unpack: Arc<UnpackFn>,
}

thread_local! {
    /// The hooks in force, innermost last.
    static HOOKS: RefCell<Vec<Hooks>> = const { RefCell::new(Vec::new()) };
    /// Inside a pack or unpack hook: what the hook itself saves is kept as it is.
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// The guard `saved_tensors_hooks` returns: its hooks are in force on this thread until it is
/// dropped (PyTorch's context manager). Guards nest; the innermost hooks apply.
#[must_use = "the hooks apply only while the guard lives"]
pub struct SavedTensorsHooks {
    depth: usize,
    /// Thread-local: the guard stays on the thread that made it.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for SavedTensorsHooks {
    fn drop(&mut self) {
        HOOKS.with(|h| h.borrow_mut().truncate(self.depth));
    }
}

/// `torch.autograd.graph.saved_tensors_hooks(pack_hook, unpack_hook)`: while the guard lives,
/// every tensor an op saves for backward on this thread is passed to `pack`, and what `pack`
/// returns is kept in its place; backward gets the tensor back from `unpack`, which must return
/// one of the saved tensor's shape and dtype on its device. The hooks run with grad mode off,
/// and a tensor saved inside a hook is kept as it is.
///
/// ```
/// use kiln::autograd::{saved_tensors_hooks, Packed};
/// use kiln::{DType, Device, Tensor};
/// # fn main() -> kiln::Result<()> {
/// let dev = Device::cpu()?;
/// let x = Tensor::randn(&[4], DType::F32, &dev)?.requires_grad_(true)?;
/// let y = {
///     // Keep saved tensors as host vectors (as a PyTorch hook might keep them on disk).
///     let _hooks = saved_tensors_hooks(
///         |t: &Tensor| -> kiln::Result<Packed> { Ok(Box::new((t.to_vec::<f32>()?, t.device().clone()))) },
///         |p: &Packed| -> kiln::Result<Tensor> {
///             let (v, dev) = p.downcast_ref::<(Vec<f32>, Device)>().expect("what pack made");
///             Tensor::from_slice(v, &[v.len()], dev)
///         },
///     );
///     x.mul(&x)?.sum_all()?
/// };
/// y.backward()?;
/// let (g, want) = (x.grad().unwrap().to_vec::<f32>()?, x.to_vec::<f32>()?);
/// assert!(g.iter().zip(&want).all(|(g, x)| (g - 2.0 * x).abs() < 1e-6));
/// # Ok(())
/// # }
/// ```
pub fn saved_tensors_hooks(
    pack: impl Fn(&Tensor) -> Result<Packed> + Send + Sync + 'static,
    unpack: impl Fn(&Packed) -> Result<Tensor> + Send + Sync + 'static,
) -> SavedTensorsHooks {
    let depth = HOOKS.with(|h| {
        let mut h = h.borrow_mut();
        h.push(Hooks {
            pack: Arc::new(pack),
            unpack: Arc::new(unpack),
        });
        h.len() - 1
    });
    SavedTensorsHooks {
        depth,
        _not_send: std::marker::PhantomData,
    }
}

/// Whether a tensor saved now goes through a pack hook. An op that saves a tensor before its
/// kernel writes it (the fused cross entropy writes log_softmax's saved output in the loss's
/// kernel) must not, while this holds: the hook would pack what is not written yet.
pub(crate) fn packing() -> bool {
    !IN_HOOK.get() && HOOKS.with(|h| !h.borrow().is_empty())
}

/// Runs a hook with grad mode off and the hooks themselves out of force.
fn in_hook<T>(f: impl FnOnce() -> T) -> T {
    struct Leave(bool);
    impl Drop for Leave {
        fn drop(&mut self) {
            IN_HOOK.set(self.0);
        }
    }
    let _leave = Leave(IN_HOOK.replace(true));
    let _grad = GradModeGuard::new(false);
    f()
}

/// What a saved tensor holds: the tensor, or what the pack hook made of it.
enum Value {
    Kept(Tensor),
    Packed(Packed, Arc<UnpackFn>),
}

/// A tensor saved for backward, with the version it had then (PyTorch's SavedVariable).
pub(crate) struct Saved {
    value: Value,
    version: u64,
    /// The tensor's version counter, which outlives its memory when a hook packed it.
    counter: Arc<AtomicU64>,
    shape: Vec<usize>,
    dtype: DType,
    /// The grad_fn of the saved tensor (for the error message), if it had one.
    creator: Option<&'static str>,
}

impl Saved {
    /// Saves `t` (an input or an output of the op named in errors as `op`), through the pack
    /// hook where one is in force.
    pub(crate) fn new(t: &Tensor, creator: Option<&'static str>) -> Result<Saved> {
        if t.storage.inference {
            return Err(Error::Autograd {
                op: "save_for_backward",
                msg: "Inference tensors cannot be saved for backward. To work around you can make a clone to get a normal tensor and use it in autograd.".into(),
            });
        }
        SAVED_FOR_NODE.with(|v| v.borrow_mut().push(Arc::downgrade(&t.storage)));
        t.storage
            .block
            .set_category(crate::alloc::MemoryCategory::Activation);
        let hooks = match IN_HOOK.get() {
            true => None,
            false => HOOKS.with(|h| h.borrow().last().cloned()),
        };
        let value = match hooks {
            Some(h) => Value::Packed(in_hook(|| (h.pack)(t))?, h.unpack),
            None => Value::Kept(t.detach()),
        };
        Ok(Saved {
            value,
            version: t.version(),
            counter: t.version_counter(),
            shape: t.shape().to_vec(),
            dtype: t.dtype(),
            creator: creator.or_else(|| t.grad_fn_name()),
        })
    }

    /// Whether a pack hook holds the tensor (getting it runs the unpack hook).
    pub(crate) fn is_packed(&self) -> bool {
        matches!(self.value, Value::Packed(..))
    }

    /// The saved tensor (unpacked where a hook packed it), checked against in-place
    /// modification since it was saved.
    pub(crate) fn get(&self) -> Result<Tensor> {
        let now = self.counter.load(Ordering::Acquire);
        if now != self.version {
            return Err(Error::ModifiedInplace {
                shape: self.shape.clone(),
                dtype: self.dtype,
                creator: self.creator,
                version: now,
                expected: self.version,
            });
        }
        match &self.value {
            Value::Kept(t) => Ok(t.clone()),
            Value::Packed(packed, unpack) => {
                let t = in_hook(|| unpack(packed))?;
                if t.shape() != self.shape.as_slice() || t.dtype() != self.dtype {
                    return Err(Error::Autograd {
                        op: "unpack_hook",
                        msg: format!(
                            "the unpack hook returned a {} tensor of shape {:?} for a saved {} tensor of shape {:?}",
                            t.dtype(),
                            t.shape(),
                            self.dtype,
                            self.shape
                        ),
                    });
                }
                Ok(t.detach())
            }
        }
    }
}

/// Saves an input of an op (its creator is the input's own grad_fn).
pub(crate) fn save(t: &Tensor) -> Result<Saved> {
    Saved::new(t, None)
}

/// Saves the output `out` of the op whose node will be named `name`.
pub(crate) fn save_output(out: &Tensor, name: &'static str) -> Result<Saved> {
    Saved::new(out, Some(name))
}
