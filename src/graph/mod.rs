//! The autograd graph, below the ops that record it: what a tensor that requires grad carries
//! (`AutogradMeta`), the nodes ops record (`record`, `attach`), the tensors they save with their
//! versions (`Saved`), and the per-tensor autograd API (`requires_grad_`, `.grad`, `detach`,
//! `retain_grad`). The engine that runs a graph backward, and `checkpoint`, sit above the ops in
//! `crate::autograd`, since backward needs tensor arithmetic.
//!
//! Note [Autograd graph]: a tensor that requires grad carries an `AutogradMeta` (shared by its
//! clones, which are the same tensor, as Python references are). A leaf's meta holds its `.grad`;
//! a non-leaf's holds its `grad_fn`, a `Node` that owns the op's backward closure (with the
//! tensors it saved) and one edge per input: to the input's own node, or to the input leaf's
//! meta (PyTorch's AccumulateGrad). Nodes are reference-counted, so the graph lives exactly as
//! long as some tensor (or a retained node) reaches it. Backward formulas are written with tensor
//! ops and run with grad mode off, so they run on the same device as the forward. The tensor
//! holds its meta as an opaque slot (`tensor::AutogradSlot`) that only this module reads back.

mod saved;

pub(crate) use saved::{packing, save, save_output, Saved};
pub use saved::{saved_tensors_hooks, Packed, SavedTensorsHooks};

use crate::base::lock;
use crate::tensor::mode::{is_grad_enabled, is_inference_mode_enabled, GradModeGuard};
use crate::tensor::{DType, Tensor};
use crate::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// A backward closure: given the gradient of the node's output and which inputs need a
/// gradient, one gradient (or none) per input, in the order of the inputs given to `record`.
pub(crate) type BackwardFn =
    Box<dyn FnMut(&Tensor, &[bool]) -> Result<Vec<Option<Tensor>>> + Send + Sync>;

/// A hook that runs after a leaf's gradient has been accumulated in a backward pass (PyTorch's
/// `register_post_accumulate_grad_hook`); it receives the leaf's `.grad`.
pub(crate) type PostAccumulateHook = Arc<dyn Fn(&Tensor) -> Result<()> + Send + Sync>;

/// The autograd state of a tensor that requires grad.
pub(crate) struct AutogradMeta {
    /// `None` for a leaf.
    pub(crate) grad_fn: Option<Arc<Node>>,
    pub(crate) grad: Mutex<Option<Tensor>>,
    retains_grad: AtomicBool,
    /// Post-accumulate-grad hooks of a leaf, with the ids their handles remove them by.
    pub(crate) hooks: Mutex<Vec<(u64, PostAccumulateHook)>>,
}

impl AutogradMeta {
    fn new(grad_fn: Option<Arc<Node>>) -> AutogradMeta {
        AutogradMeta {
            grad_fn,
            grad: Mutex::new(None),
            retains_grad: AtomicBool::new(false),
            hooks: Mutex::new(Vec::new()),
        }
    }

    /// The leaf's post-accumulate hooks, in registration order (cloned: a hook may register or
    /// remove hooks).
    pub(crate) fn post_accumulate_hooks(&self) -> Vec<PostAccumulateHook> {
        lock(&self.hooks).iter().map(|(_, h)| h.clone()).collect()
    }
}

/// Removes the hook it was returned for (PyTorch's `RemovableHandle`); dropping it keeps the
/// hook.
pub struct RemovableHandle {
    meta: Weak<AutogradMeta>,
    id: u64,
}

impl RemovableHandle {
    /// Removes the hook; later accumulations no longer call it.
    pub fn remove(&self) {
        if let Some(meta) = self.meta.upgrade() {
            lock(&meta.hooks).retain(|(id, _)| *id != self.id);
        }
    }
}

static NEXT_HOOK: AtomicU64 = AtomicU64::new(0);

/// Where a gradient flows: into another node, or into a leaf's `.grad`.
#[derive(Clone)]
pub(crate) enum Edge {
    Node(Arc<Node>),
    Leaf(Arc<AutogradMeta>),
}

/// One recorded op (PyTorch's `grad_fn`).
pub(crate) struct Node {
    pub(crate) name: &'static str,
    /// Creation order: the engine runs later nodes first, as PyTorch does.
    pub(crate) seq: u64,
    /// One per input; `None` where the input needs no gradient.
    pub(crate) edges: Vec<Option<Edge>>,
    /// Taken (and the saved tensors dropped) after backward unless the graph is retained.
    pub(crate) backward: Mutex<Option<BackwardFn>>,
    /// The output's meta when `retain_grad()` was called on it.
    pub(crate) retained: Mutex<Option<Weak<AutogradMeta>>>,
    /// The output's shape and dtype, to check and to create implicit gradients.
    pub(crate) shape: Vec<usize>,
    pub(crate) dtype: DType,
    /// The storages the backward closure saved (for `kiln::debug`'s graph sizes).
    pub(crate) saved: Vec<Weak<crate::tensor::Storage>>,
    /// What this node's backward can hand to the kernel of the node before it (Note [Backward
    /// epilogues]).
    pub(crate) fusable: Option<Fusable>,
}

// Note [Backward epilogues]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Some backward formulas are one cheap elementwise pass over the gradient they receive:
// ReLU's keeps it where the saved output is not <= 0. When that gradient comes whole from one
// other node (a Linear's input gradient, `g @ W`), the product's kernel can apply the formula
// in its epilogue and the pass leaves the step (on the H100's f32 MLP step: two launches of
// 13 us). The engine arranges it without changing the graph PyTorch would record:
// - A node whose formula can be fused says so when it is recorded (`offer_fusion`, kept as
//   `Node::fusable`).
// - Before running a node N, the engine offers N, for each of its edges into such a node M,
//   M's `Epilogue`, where N's gradient is the only one M will receive (M's dependency count
//   is 1), M's output does not retain its gradient (`retain_grad` would see the gradient
//   before the formula), and M's backward is still there to run.
// - N's backward reads the offer (`offered`) and, where the kernel that computes that input's
//   gradient applied it, says so (`accept`). A kernel that cannot apply it just leaves it.
// - When M's turn comes and its formula was applied, the engine passes the gradient through
//   along M's edge instead of calling M's backward (dropped as it would have been). For
//   PyTorch's allocator statistics, M's output is allocated and freed there, unwritten, as
//   `linear_relu` does with the linear's output: the same sizes are live at every point as in
//   PyTorch's backward (its output and its input gradient both, then one).
// - Through a cast: where M is a float cast's `ToCopyBackward0` that offers nothing itself,
//   fed only by N, and the node L before it (M's only edge) offers an epilogue and is fed only
//   by M, N is offered `CastThen(M's input dtype, L's epilogue)`. PyTorch's three backwards
//   allocate N's gradient, then M's beside it, free N's (N's saved tensors went between),
//   then L's beside M's, and free M's. So N, accepting, allocates only its own gradient and
//   writes there the little the rest needs (a record a row), and leaves a `Finish` to each of
//   M's and L's steps (`accept_with`): M's allocates its output and copies the records there,
//   L's allocates its output and writes L's input gradient in one kernel from them. Every
//   block the three allocate is the one PyTorch's would, in its order; none but the last is
//   written whole. Under autocast this is nll_loss's backward through the f32 copy of f16
//   log-probabilities into log_softmax's (GPT-2's AMP step: passes over an f32 and an f16
//   [8192, 50257] gone).
// The offers are per backward call (a checkpoint's backward runs a nested pass inside one).

/// A formula a node's backward can hand to the kernel that produces its incoming gradient.
/// It holds its saved tensor weakly: the node's backward closure owns it, and a saved tensor
/// lives no longer than that closure (dropped when the node has run, unless the graph is
/// retained), whatever the node offers.
pub(crate) enum Fusable {
    /// `ReluBackward0`: zero where the saved output is <= 0, the gradient elsewhere (PyTorch's
    /// threshold_backward: a NaN output passes it).
    ReluMask(Weak<Saved>),
    /// `LogSoftmaxBackward0` over the rows of a matrix: the gradient minus exp(output) times
    /// the gradient's row sums.
    LogSoftmaxRows(Weak<Saved>),
    /// `ToCopyBackward0` of a float cast from this dtype: the gradient cast back. Never offered
    /// alone (a cast costs its producer's kernel as much as its own); offered with the formula
    /// of the node before it, where that node's gradient comes only from the cast
    /// (`Epilogue::CastThen`).
    Cast(DType),
    /// `NarrowBackward0` of this dim from this start: the gradient goes into that slice of the
    /// input's gradient (never an epilogue; the engine writes it into a buffer it owns where
    /// the input receives several gradients, `autograd/engine.rs`'s `slice_into`).
    Slice(usize, usize),
}

/// A `Fusable` made ready for one backward call: the tensors it reads, version-checked.
#[derive(Clone)]
pub(crate) enum Epilogue {
    /// Zero the gradient where this tensor (of the gradient's shape and dtype) is <= 0.
    ReluMask(Tensor),
    /// log_softmax's backward along dim 1, given its output (a matrix).
    LogSoftmaxRows(Tensor),
    /// The gradient cast to this dtype (a `ToCopyBackward0`), then the epilogue of the node
    /// before the cast.
    CastThen(DType, Box<Epilogue>),
}

impl Fusable {
    /// The epilogue, or `None` where a saved tensor was modified in place (the node's own
    /// backward then raises the error as it would have) or a pack hook holds it: unpacked for
    /// an offer, it would come back to the device before the node's own backward, where
    /// PyTorch unpacks it (under `save_on_cpu`, GPT-2's AMP step peaked 712 MiB higher).
    fn epilogue(&self) -> Option<Epilogue> {
        let kept = |saved: &Weak<Saved>| {
            let saved = saved.upgrade()?;
            match saved.is_packed() {
                true => None,
                false => saved.get().ok(),
            }
        };
        match self {
            Fusable::ReluMask(saved) => kept(saved).map(Epilogue::ReluMask),
            Fusable::LogSoftmaxRows(saved) => kept(saved).map(Epilogue::LogSoftmaxRows),
            Fusable::Cast(_) | Fusable::Slice(..) => None,
        }
    }
}

/// What a node's backward that accepted an epilogue leaves to the step of a node it passes
/// through: the gradient that node receives in, the gradient it passes on out (Note [Backward
/// epilogues]).
pub(crate) type Finish = Box<dyn FnOnce(Tensor) -> Result<Tensor>>;

/// An offer of the backward call running now: its edge, its epilogue, and whether it was
/// accepted (with what is left to the steps of the nodes passed through, in their order).
struct Offer {
    edge: usize,
    epilogue: Epilogue,
    accepted: Option<Vec<Finish>>,
}

type Offers = Vec<Offer>;

thread_local! {
    /// The fusable formula of the node being built (set by its backward builder).
    static FUSABLE_FOR_NODE: std::cell::RefCell<Option<Fusable>> =
        const { std::cell::RefCell::new(None) };
    static OFFERS: std::cell::RefCell<Offers> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Called while building a node's backward: the node can hand `f` to its producer's kernel.
pub(crate) fn offer_fusion(f: Fusable) {
    FUSABLE_FOR_NODE.with(|v| *v.borrow_mut() = Some(f));
}

/// The epilogue offered for the gradient along edge `edge` of the node whose backward runs now.
pub(crate) fn offered(edge: usize) -> Option<Epilogue> {
    OFFERS.with(|o| {
        o.borrow()
            .iter()
            .find(|x| x.edge == edge)
            .map(|x| x.epilogue.clone())
    })
}

/// Says that the gradient along `edge` was computed with its offered epilogue applied.
pub(crate) fn accept(edge: usize) {
    accept_with(edge, Vec::new());
}

/// Says that the offered epilogue along `edge` was taken on, `finishes` being left to the steps
/// of the nodes it passes through, in their order (an `Epilogue::CastThen`: the cast's, then
/// the node's before it).
pub(crate) fn accept_with(edge: usize, finishes: Vec<Finish>) {
    OFFERS.with(|o| {
        if let Some(entry) = o.borrow_mut().iter_mut().find(|x| x.edge == edge) {
            entry.accepted = Some(finishes);
        }
    });
}

/// Runs `f` (a node's backward) with `offers` in place, restoring the enclosing call's after;
/// returns `f`'s result and the edges whose epilogue was applied, with what each left to the
/// nodes it passes through.
pub(crate) fn with_offers<R>(
    offers: Vec<(usize, Epilogue)>,
    f: impl FnOnce() -> R,
) -> (R, Vec<(usize, Vec<Finish>)>) {
    let mine: Offers = offers
        .into_iter()
        .map(|(edge, epilogue)| Offer {
            edge,
            epilogue,
            accepted: None,
        })
        .collect();
    let outer = OFFERS.with(|o| std::mem::replace(&mut *o.borrow_mut(), mine));
    let r = f();
    let mine = OFFERS.with(|o| std::mem::replace(&mut *o.borrow_mut(), outer));
    let accepted = mine
        .into_iter()
        .filter_map(|x| x.accepted.map(|f| (x.edge, f)))
        .collect();
    (r, accepted)
}

/// 0: not yet read from `KILN_BACKWARD_EPILOGUES`; 1: off; 2: on.
static EPILOGUES: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Whether the engine offers backward epilogues (Note [Backward epilogues]): on unless
/// `KILN_BACKWARD_EPILOGUES=off` or `set_backward_epilogues(false)`.
pub(crate) fn backward_epilogues() -> bool {
    match EPILOGUES.load(Ordering::Relaxed) {
        0 => {
            let on = std::env::var("KILN_BACKWARD_EPILOGUES").map_or(true, |v| v != "off");
            EPILOGUES.store(1 + on as u8, Ordering::Relaxed);
            on
        }
        v => v == 2,
    }
}

/// Turns backward epilogues on or off (for comparisons in tests and benchmarks; the results
/// agree either way up to the rounding of the kernels that run).
pub fn set_backward_epilogues(on: bool) {
    EPILOGUES.store(1 + on as u8, Ordering::Relaxed);
}

impl Node {
    /// The epilogue this node can hand to its producer now, if any.
    pub(crate) fn epilogue(&self) -> Option<Epilogue> {
        // (Most nodes offer nothing: no lock is taken for them.)
        let fusable = self.fusable.as_ref()?;
        if !self.can_fuse() {
            return None;
        }
        fusable.epilogue()
    }

    /// The dtype a float cast's backward casts its gradient back to, where this node is such a
    /// cast that can be fused now.
    pub(crate) fn cast_from(&self) -> Option<DType> {
        match self.fusable.as_ref()? {
            Fusable::Cast(from) if self.can_fuse() => Some(*from),
            _ => None,
        }
    }

    /// The dim and start of a narrow's slice, where this node is a `NarrowBackward0` whose
    /// gradient the engine may write into its input's gradient directly now.
    pub(crate) fn slice_of(&self) -> Option<(usize, usize)> {
        match self.fusable.as_ref()? {
            Fusable::Slice(d, start) if self.can_fuse() => Some((*d, *start)),
            _ => None,
        }
    }

    /// Whether the engine may apply this node's formula in its producer's kernel: epilogues on,
    /// the output not retaining its gradient, the backward not yet run.
    fn can_fuse(&self) -> bool {
        backward_epilogues() && lock(&self.retained).is_none() && lock(&self.backward).is_some()
    }
}

thread_local! {
    /// Storages saved since the last node was attached on this thread.
    pub(super) static SAVED_FOR_NODE: std::cell::RefCell<Vec<Weak<crate::tensor::Storage>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

impl Node {
    /// Nodes reachable from this one (itself included) and the bytes of the distinct storages
    /// their pending backward closures hold.
    pub(crate) fn graph_size(self: &Arc<Node>) -> (usize, u64) {
        let mut seen_nodes = std::collections::HashSet::new();
        let mut seen_storage = std::collections::HashSet::new();
        let mut stack = vec![self.clone()];
        let mut bytes = 0u64;
        while let Some(n) = stack.pop() {
            if !seen_nodes.insert(Arc::as_ptr(&n) as usize) {
                continue;
            }
            if lock(&n.backward).is_some() {
                for s in n.saved.iter().filter_map(Weak::upgrade) {
                    if seen_storage.insert(Arc::as_ptr(&s) as usize) {
                        bytes += s.block.block_size();
                    }
                }
            }
            for e in n.edges.iter().flatten() {
                if let Edge::Node(next) = e {
                    stack.push(next.clone());
                }
            }
        }
        (seen_nodes.len(), bytes)
    }
}

static NEXT_SEQ: AtomicU64 = AtomicU64::new(0);

/// Whether an op over `inputs` records a node now.
pub(crate) fn needs_grad(inputs: &[&Tensor]) -> bool {
    is_grad_enabled() && inputs.iter().any(|t| t.requires_grad())
}

/// Runs `forward` with grad mode off (its internals record nothing), then, when an input requires
/// grad and grad mode is on, gives the output a node named `name`. `backward` builds the closure
/// from the output (for ops that save it); it only runs when a node is recorded.
pub(crate) fn record(
    name: &'static str,
    inputs: &[&Tensor],
    forward: impl FnOnce() -> Result<Tensor>,
    backward: impl FnOnce(&Tensor) -> Result<BackwardFn>,
) -> Result<Tensor> {
    let needed = needs_grad(inputs);
    let mut out = {
        let _scope = crate::alloc::kiln_scope(|| crate::alloc::op_frame_name(name, false), "kiln");
        crate::alloc::annotate_scope(|| {
            let shapes: Vec<String> = inputs.iter().map(|t| format!("{:?}", t.shape())).collect();
            format!("[{}]", shapes.join(", "))
        });
        let _guard = GradModeGuard::new(false);
        let _op = crate::alloc::op_scope();
        forward()?
    };
    out.autograd = None;
    if needed {
        SAVED_FOR_NODE.with(|v| v.borrow_mut().clear());
        FUSABLE_FOR_NODE.with(|v| v.borrow_mut().take());
        let f = backward(&out)?;
        attach(&mut out, name, inputs, f);
    }
    Ok(out)
}

/// The error of a backward builder that `record` must never call (its op is recorded only
/// where no input needs a gradient).
pub(crate) fn no_node(op: &'static str) -> Error {
    Error::Autograd {
        op,
        msg: "this op records no backward node".into(),
    }
}

/// Makes `out` the output of a new node over `inputs`.
pub(crate) fn attach(out: &mut Tensor, name: &'static str, inputs: &[&Tensor], f: BackwardFn) {
    let edges = inputs.iter().map(|t| t.edge()).collect();
    let node = Arc::new(Node {
        name,
        seq: NEXT_SEQ.fetch_add(1, Ordering::Relaxed),
        edges,
        backward: Mutex::new(Some(f)),
        retained: Mutex::new(None),
        shape: out.shape().to_vec(),
        dtype: out.dtype(),
        saved: SAVED_FOR_NODE.with(|v| std::mem::take(&mut *v.borrow_mut())),
        fusable: FUSABLE_FOR_NODE.with(|v| v.borrow_mut().take()),
    });
    let meta = Arc::new(AutogradMeta::new(Some(node)));
    register_graph(&meta, out);
    out.autograd = Some(meta);
}

/// Non-leaf tensors' metas (each holds a graph) and their outputs' storages, noted while tensor
/// tracking is on, for `kiln::debug`'s leak report.
type GraphEntry = (Weak<AutogradMeta>, Weak<crate::tensor::Storage>);
static GRAPHS: Mutex<Vec<GraphEntry>> = Mutex::new(Vec::new());

fn register_graph(meta: &Arc<AutogradMeta>, out: &Tensor) {
    if !crate::alloc::tensor_tracking() {
        return;
    }
    let mut v = lock(&GRAPHS);
    if v.len() >= 4096 && v.len().is_power_of_two() {
        v.retain(|(m, _)| m.strong_count() > 0);
    }
    v.push((Arc::downgrade(meta), Arc::downgrade(&out.storage)));
}

/// The graphs noted while tracking was on that are still alive.
pub(crate) fn live_graphs() -> Vec<(Arc<AutogradMeta>, Weak<crate::tensor::Storage>)> {
    lock(&GRAPHS)
        .iter()
        .filter_map(|(m, s)| m.upgrade().map(|m| (m, s.clone())))
        .collect()
}

/// Forgets the noted graphs (tracking turned off).
pub(crate) fn forget_graphs() {
    lock(&GRAPHS).clear();
}

impl Tensor {
    /// This tensor's autograd state, read back from its opaque slot.
    pub(crate) fn meta(&self) -> Option<&AutogradMeta> {
        self.autograd.as_deref()?.downcast_ref()
    }

    /// The same, as a shared handle (for edges and weak references).
    pub(crate) fn meta_arc(&self) -> Option<Arc<AutogradMeta>> {
        self.autograd.clone()?.downcast().ok()
    }

    /// Whether autograd tracks this tensor (a leaf that asked for it, or the result of an op on
    /// one, recorded with grad mode on).
    pub fn requires_grad(&self) -> bool {
        self.meta().is_some()
    }

    /// Sets `requires_grad` on a leaf (PyTorch's `requires_grad_`); floats only.
    pub fn requires_grad_(mut self, requires: bool) -> Result<Tensor> {
        if !self.is_leaf() {
            if requires {
                return Ok(self);
            }
            return Err(Error::Autograd {
                op: "requires_grad_",
                msg: "you can only change requires_grad flags of leaf variables. If you want to use a computed variable in a subgraph that doesn't require differentiation use var_no_grad = var.detach().".into(),
            });
        }
        if requires && !self.dtype.is_float() {
            return Err(Error::Autograd {
                op: "requires_grad_",
                msg: format!(
                    "only Tensors of floating point dtype can require gradients, not {}",
                    self.dtype
                ),
            });
        }
        if requires && self.storage.inference && !is_inference_mode_enabled() {
            return Err(Error::Autograd {
                op: "requires_grad_",
                msg: "Setting requires_grad=True on inference tensor outside InferenceMode is not allowed.".into(),
            });
        }
        self.autograd = match (requires, self.autograd.take()) {
            (true, Some(slot)) => Some(slot),
            (true, None) => {
                self.storage
                    .block
                    .set_category(crate::alloc::MemoryCategory::Parameter);
                self.storage
                    .leaf_requires_grad
                    .store(true, Ordering::Relaxed);
                Some(Arc::new(AutogradMeta::new(None)))
            }
            (false, _) => None,
        };
        Ok(self)
    }

    /// A leaf: made by the user, not by a recorded op (every tensor that does not require grad is
    /// one, as in PyTorch).
    pub fn is_leaf(&self) -> bool {
        self.meta().is_none_or(|m| m.grad_fn.is_none())
    }

    /// Registers `hook` to run each time a backward pass has finished accumulating this leaf's
    /// gradient (PyTorch's `register_post_accumulate_grad_hook`): once per backward, after every
    /// contribution of that pass has been added, on the thread running backward. The hook gets
    /// the leaf's `.grad` (PyTorch passes the leaf itself, whose `.grad` is the same tensor); an
    /// error it returns ends the backward pass with that error.
    pub fn register_post_accumulate_grad_hook(
        &self,
        hook: impl Fn(&Tensor) -> Result<()> + Send + Sync + 'static,
    ) -> Result<RemovableHandle> {
        let meta = match self.meta_arc() {
            Some(m) if m.grad_fn.is_none() => m,
            _ => {
                return Err(Error::Autograd {
                    op: "register_post_accumulate_grad_hook",
                    msg: if self.requires_grad() {
                        "post accumulate grad hooks cannot be registered on non-leaf tensors".into()
                    } else {
                        "cannot register a hook on a tensor that doesn't require gradient".into()
                    },
                })
            }
        };
        let id = NEXT_HOOK.fetch_add(1, Ordering::Relaxed);
        lock(&meta.hooks).push((id, Arc::new(hook)));
        Ok(RemovableHandle {
            meta: Arc::downgrade(&meta),
            id,
        })
    }

    /// The accumulated gradient of a leaf (or of a non-leaf after `retain_grad()`).
    pub fn grad(&self) -> Option<Tensor> {
        self.meta().and_then(|m| lock(&m.grad).clone())
    }

    /// Replaces (or with `None` drops, freeing its memory) the gradient.
    pub fn set_grad(&self, grad: Option<Tensor>) -> Result<()> {
        let Some(meta) = self.meta() else {
            return Err(Error::Autograd {
                op: "set_grad",
                msg: "the tensor does not require grad".into(),
            });
        };
        if let Some(g) = &grad {
            if g.shape() != self.shape() || g.dtype() != self.dtype() {
                return Err(Error::ShapeMismatch {
                    op: "set_grad",
                    lhs: self.shape().to_vec(),
                    rhs: g.shape().to_vec(),
                });
            }
        }
        if let Some(g) = &grad {
            g.storage
                .block
                .set_category(crate::alloc::MemoryCategory::Gradient);
        }
        *lock(&meta.grad) = grad.map(|g| g.detach());
        Ok(())
    }

    /// The same storage, cut from the graph (PyTorch's `detach`): shares memory and version.
    pub fn detach(&self) -> Tensor {
        Tensor {
            storage: self.storage.clone(),
            layout: self.layout.clone(),
            dtype: self.dtype,
            autograd: None,
        }
    }

    /// Keep the gradient of this non-leaf in `.grad` at the next `backward()`.
    pub fn retain_grad(&self) -> Result<()> {
        let Some(meta) = self.meta_arc() else {
            return Err(Error::Autograd {
                op: "retain_grad",
                msg: "can't retain_grad on Tensor that has requires_grad=False".into(),
            });
        };
        if let Some(node) = &meta.grad_fn {
            meta.retains_grad.store(true, Ordering::Relaxed);
            *lock(&node.retained) = Some(Arc::downgrade(&meta));
        }
        Ok(())
    }

    /// The name of the op that made this tensor (`MulBackward0`), if autograd recorded one.
    pub fn grad_fn_name(&self) -> Option<&'static str> {
        self.grad_fn().map(|n| n.name)
    }

    pub(crate) fn grad_fn(&self) -> Option<&Arc<Node>> {
        self.meta().and_then(|m| m.grad_fn.as_ref())
    }

    /// The edge a gradient for this tensor flows along, if it needs one.
    fn edge(&self) -> Option<Edge> {
        let meta = self.meta_arc()?;
        Some(match &meta.grad_fn {
            Some(node) => Edge::Node(node.clone()),
            None => Edge::Leaf(meta.clone()),
        })
    }

    /// Checks that an in-place write to this tensor is allowed with grad mode as it is now.
    pub(crate) fn check_inplace(&self, op: &'static str) -> Result<()> {
        if self.storage.inference && !is_inference_mode_enabled() {
            return Err(Error::Autograd {
                op,
                msg: "Inplace update to inference tensor outside InferenceMode is not allowed."
                    .into(),
            });
        }
        if !is_grad_enabled() || !self.requires_grad() {
            return Ok(());
        }
        if self.is_leaf() {
            return Err(Error::Autograd {
                op,
                msg: "a leaf Variable that requires grad is being used in an in-place operation."
                    .into(),
            });
        }
        // Decision: kiln does not rebase the history of a non-leaf written in place (PyTorch's
        // CopySlices); refusing is explicit, where recording it half-way would give wrong
        // gradients. Use the out-of-place op, or write under `no_grad`.
        Err(Error::Autograd {
            op,
            msg: format!(
                "in-place write to a tensor that requires grad (output of {}): kiln records no in-place ops in the graph; use the out-of-place op",
                self.grad_fn_name().unwrap_or("?")
            ),
        })
    }
}
