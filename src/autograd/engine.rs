//! The backward pass: counts how many gradients each node waits for, then runs nodes whose
//! gradients are complete, latest-created first (PyTorch's order on one device). A node's input
//! gradient buffer is dropped as soon as the node has run, so memory during backward falls as it
//! does in PyTorch.

use crate::alloc::MemoryCategory;
use crate::base::lock;
use crate::graph::{AutogradMeta, Edge, Epilogue, Finish, Node};
use crate::tensor::GradModeGuard;
use crate::tensor::Tensor;
use crate::{Error, Result};
use std::cell::RefCell;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::Arc;

/// Work queued to run when the current backward pass has finished its graph.
type Callback = Box<dyn FnOnce() -> Result<()> + Send>;

thread_local! {
    /// One frame per backward pass running on this thread (a checkpoint's backward runs one
    /// inside another); `queue_callback` adds to the innermost.
    static CALLBACKS: RefCell<Vec<Vec<Callback>>> = const { RefCell::new(Vec::new()) };
}

/// Queues `f` to run once the backward pass running on this thread has finished its graph
/// (PyTorch's `Variable._execution_engine.queue_callback`, which DistributedDataParallel uses to
/// wait for its last buckets). Only valid while a backward pass runs (from a hook or a backward
/// formula); an error `f` returns is the error of `backward()`.
pub fn queue_callback(f: impl FnOnce() -> Result<()> + Send + 'static) -> Result<()> {
    CALLBACKS.with(|c| match c.borrow_mut().last_mut() {
        Some(frame) => {
            frame.push(Box::new(f));
            Ok(())
        }
        None => Err(Error::Autograd {
            op: "queue_callback",
            msg: "Final callbacks can only be installed during backward pass.".into(),
        }),
    })
}

/// Pops this pass's callback frame however the pass ends.
struct CallbackFrame;

impl CallbackFrame {
    fn push() -> CallbackFrame {
        CALLBACKS.with(|c| c.borrow_mut().push(Vec::new()));
        CallbackFrame
    }

    /// Runs the queued callbacks in order, and any they queue.
    fn run(&self) -> Result<()> {
        loop {
            let next = CALLBACKS.with(|c| {
                let mut c = c.borrow_mut();
                let frame = c.last_mut()?;
                (!frame.is_empty()).then(|| frame.remove(0))
            });
            match next {
                Some(f) => f()?,
                None => return Ok(()),
            }
        }
    }
}

impl Drop for CallbackFrame {
    fn drop(&mut self) {
        let frame = CALLBACKS.with(|c| c.borrow_mut().pop());
        drop(frame);
    }
}

/// Heap entry: the node with the highest sequence number runs first.
struct Ready(Arc<Node>);

impl PartialEq for Ready {
    fn eq(&self, other: &Self) -> bool {
        self.0.seq == other.0.seq
    }
}
impl Eq for Ready {}
impl PartialOrd for Ready {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Ready {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.seq.cmp(&other.0.seq)
    }
}

fn key(node: &Arc<Node>) -> usize {
    Arc::as_ptr(node) as usize
}

/// Adds `g` into a leaf's `.grad`: the first gradient is stored (copied unless nothing else holds
/// it), later ones are added in place, as PyTorch's AccumulateGrad does.
fn accumulate(meta: &AutogradMeta, g: Tensor) -> Result<()> {
    let mut slot = lock(&meta.grad);
    match slot.as_ref() {
        Some(existing) => existing.add_(&g)?,
        None => {
            let unique = Arc::strong_count(&g.storage) == 1 && g.is_contiguous();
            let g = if unique { g } else { crate::ops::copy(&g)? };
            g.storage.block.set_category(MemoryCategory::Gradient);
            *slot = Some(g);
        }
    }
    Ok(())
}

/// Runs a leaf's post-accumulate hooks on its `.grad`.
fn run_hooks(meta: &AutogradMeta) -> Result<()> {
    let hooks = meta.post_accumulate_hooks();
    if hooks.is_empty() {
        return Ok(());
    }
    let Some(grad) = lock(&meta.grad).clone() else {
        return Ok(());
    };
    hooks.iter().try_for_each(|h| h(&grad))
}

/// Adds `g` to a node's pending input gradient.
fn add_pending(
    pending: &mut HashMap<usize, Tensor>,
    owned: &HashSet<usize>,
    node: &Arc<Node>,
    g: Tensor,
) -> Result<()> {
    let entry = pending.remove(&key(node));
    let sum = match entry {
        // (A buffer `slice_into` made: the engine's own, added to in place.)
        Some(prev) if owned.contains(&key(node)) => {
            crate::ops::binary_(&prev, &g, crate::base::BinaryOp::Add)?;
            prev
        }
        Some(prev) => prev.add(&g)?,
        None => g,
    };
    pending.insert(key(node), sum);
    Ok(())
}

/// A `NarrowBackward0` whose input receives gradients from several nodes (GPT-2's q, k and v,
/// narrowed from one projection): `g` goes straight into its slice of the input's pending
/// gradient, one zeroed buffer the engine owns (`owned`), instead of into a zeroed tensor of
/// its own, summed with the others after (three fills, three copies and two sums of the
/// [B, T, 3C] gradient a block where PyTorch's `SplitBackward0` writes one tensor). Returns
/// the input's node where it did; its closure is then dropped (unless `retain_graph`) as
/// after running.
fn slice_into(
    node: &Arc<Node>,
    g: &Tensor,
    senders: &HashMap<usize, usize>,
    (pending, owned): (&mut HashMap<usize, Tensor>, &mut HashSet<usize>),
    retain_graph: bool,
) -> Result<Option<Arc<Node>>> {
    let Some((d, start)) = node.slice_of() else {
        return Ok(None);
    };
    let [Some(Edge::Node(next))] = node.edges.as_slice() else {
        return Ok(None);
    };
    let k = key(next);
    let several = senders.get(&k).is_some_and(|&n| n >= 2);
    if !several || g.dtype() != next.dtype || (pending.contains_key(&k) && !owned.contains(&k)) {
        return Ok(None);
    }
    {
        let _scope = crate::alloc::kiln_scope(
            || crate::alloc::op_frame_name(node.name, true),
            "kiln autograd",
        );
        let _op = crate::alloc::op_scope();
        let len = g.shape()[d];
        match pending.get(&k) {
            Some(buf) => crate::ops::binary_(
                &buf.narrow(d as isize, start, len)?,
                g,
                crate::base::BinaryOp::Add,
            )?,
            None => {
                let buf = Tensor::zeros(&next.shape, g.dtype(), g.device())?;
                buf.narrow(d as isize, start, len)?.copy_(g)?;
                pending.insert(k, buf);
                owned.insert(k);
            }
        }
    }
    if !retain_graph {
        *lock(&node.backward) = None;
    }
    Ok(Some(next.clone()))
}

pub(super) fn run(root: &Tensor, grad: Tensor, retain_graph: bool) -> Result<()> {
    let _guard = GradModeGuard::new(false);
    let _backward = crate::alloc::backward_scope();
    let Some(meta) = root.meta() else {
        return Err(Error::Autograd {
            op: "backward",
            msg: "element 0 of tensors does not require grad and does not have a grad_fn".into(),
        });
    };
    let frame = CallbackFrame::push();
    let Some(root_node) = &meta.grad_fn else {
        accumulate(meta, grad)?;
        run_hooks(meta)?;
        return frame.run();
    };

    // How many gradients each node receives from nodes reachable from the root, and each leaf
    // (its hooks run after the last one, as after PyTorch's AccumulateGrad node).
    let mut deps: HashMap<usize, usize> = HashMap::new();
    let mut leaf_deps: HashMap<usize, (usize, bool)> = HashMap::new();
    let mut stack = vec![root_node.clone()];
    let mut seen = HashSet::from([key(root_node)]);
    while let Some(node) = stack.pop() {
        for edge in node.edges.iter().flatten() {
            match edge {
                Edge::Node(next) => {
                    *deps.entry(key(next)).or_insert(0) += 1;
                    if seen.insert(key(next)) {
                        stack.push(next.clone());
                    }
                }
                Edge::Leaf(leaf) => {
                    leaf_deps.entry(Arc::as_ptr(leaf) as usize).or_default().0 += 1;
                }
            }
        }
    }

    // Nodes whose formula a producer's kernel applied: their gradient passes through.
    let mut fused: HashMap<usize, Through> = HashMap::new();
    // How many nodes send each node a gradient; the pending gradients the engine made itself.
    let senders = deps.clone();
    let mut owned: HashSet<usize> = HashSet::new();
    let mut pending: HashMap<usize, Tensor> = HashMap::new();
    pending.insert(key(root_node), grad);
    let mut ready = BinaryHeap::from([Ready(root_node.clone())]);
    while let Some(Ready(node)) = ready.pop() {
        owned.remove(&key(&node));
        let Some(g) = pending.remove(&key(&node)) else {
            continue;
        };
        if g.shape() != node.shape.as_slice() || g.dtype() != node.dtype {
            return Err(Error::Autograd {
                op: "backward",
                msg: format!(
                    "{}: got a gradient of shape {:?} ({}) for an output of shape {:?} ({})",
                    node.name,
                    g.shape(),
                    g.dtype(),
                    node.shape,
                    node.dtype
                ),
            });
        }
        if let Some(out_meta) = lock(&node.retained).as_ref().and_then(|w| w.upgrade()) {
            accumulate(&out_meta, g.clone())?;
        }
        let sliced = match fused.contains_key(&key(&node)) {
            true => None,
            false => slice_into(
                &node,
                &g,
                &senders,
                (&mut pending, &mut owned),
                retain_graph,
            )?,
        };
        if let Some(next) = sliced {
            drop(g);
            let d = deps.get_mut(&key(&next)).expect("counted above");
            *d -= 1;
            if *d == 0 {
                ready.push(Ready(next));
            }
            continue;
        }
        let grads = match fused.remove(&key(&node)) {
            Some(through) => pass_through(&node, g.clone(), through, retain_graph)?,
            None => run_node(&node, &g, &deps, &mut fused, retain_graph)?,
        };
        drop(g);
        for (edge, grad) in node.edges.iter().zip(grads) {
            let Some(edge) = edge else {
                continue;
            };
            let Some(grad) = grad else {
                // No gradient flows along this edge: a leaf still counts it as arrived.
                if let Edge::Leaf(meta) = edge {
                    leaf_arrived(&mut leaf_deps, meta, false)?;
                }
                continue;
            };
            match edge {
                Edge::Leaf(meta) => {
                    accumulate(meta, grad)?;
                    leaf_arrived(&mut leaf_deps, meta, true)?;
                }
                Edge::Node(next) => {
                    add_pending(&mut pending, &owned, next, grad)?;
                    let d = deps.get_mut(&key(next)).expect("counted above");
                    *d -= 1;
                    if *d == 0 {
                        ready.push(Ready(next.clone()));
                    }
                }
            }
        }
    }
    frame.run()
}

/// Runs `node`'s backward on `g`, offering it the formulas of the nodes only it feeds (Note
/// [Backward epilogues]); the nodes whose formula it applied go into `fused` with what each
/// does at its own step. Its closure is dropped after, unless `retain_graph`.
fn run_node(
    node: &Arc<Node>,
    g: &Tensor,
    deps: &HashMap<usize, usize>,
    fused: &mut HashMap<usize, Through>,
    retain_graph: bool,
) -> Result<Vec<Option<Tensor>>> {
    let needs: Vec<bool> = node.edges.iter().map(|e| e.is_some()).collect();
    // The nodes each offer passes through.
    let mut passed: HashMap<usize, Vec<(usize, Pass)>> = HashMap::new();
    let offers: Vec<(usize, Epilogue)> = node
        .edges
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match e {
            Some(Edge::Node(next)) if deps.get(&key(next)) == Some(&1) => {
                let (ep, nodes) = offer(next, deps)?;
                passed.insert(i, nodes);
                Some((i, ep))
            }
            _ => None,
        })
        .collect();
    let mut slot = lock(&node.backward);
    let Some(f) = slot.as_mut() else {
        return Err(Error::Autograd {
            op: "backward",
            msg: format!("Trying to backward through the graph a second time (or directly access saved tensors after they have already been freed), through {}. Saved intermediate values of the graph are freed when you call backward(); specify retain_graph=true if you need to backward through the graph a second time.", node.name),
        });
    };
    let grads = {
        let _scope = crate::alloc::kiln_scope(
            || crate::alloc::op_frame_name(node.name, true),
            "kiln autograd",
        );
        let _op = crate::alloc::op_scope();
        let (grads, applied) =
            crate::graph::with_offers(offers, || crate::ops::autocast::suspended(|| f(g, &needs)));
        for (i, finishes) in applied {
            let mut finishes = finishes.into_iter();
            for (k, pass) in passed.remove(&i).into_iter().flatten() {
                let through = match (finishes.next(), pass) {
                    (Some(f), _) => Through::Finish(f),
                    (None, Pass::Twin) => Through::Twin,
                    (None, Pass::Cast) => {
                        return Err(Error::Autograd {
                            op: "backward",
                            msg: format!(
                                "{}: applied a cast's backward without leaving its step",
                                node.name
                            ),
                        })
                    }
                };
                fused.insert(k, through);
            }
        }
        grads?
    };
    if !retain_graph {
        *slot = None;
    }
    Ok(grads)
}

/// How a node whose formula its producer's kernel applied passes its gradient on.
#[derive(Clone, Copy)]
enum Pass {
    /// As its own backward would have allocated its output (a twin allocated and freed).
    Twin,
    /// A float cast (`Epilogue::CastThen`): its step runs the `Finish` its producer left.
    Cast,
}

/// What a node passed through does at its step: `Pass::Twin`'s twin, or the `Finish` its
/// producer left.
enum Through {
    Twin,
    Finish(Finish),
}

/// The epilogue `next` (fed only by the node offering) offers, and the nodes that pass their
/// gradient through when it is applied: `next`'s own, or, for a float cast that offers none,
/// the cast followed by the epilogue of the node before it, where that node is fed only by the
/// cast (Note [Backward epilogues]).
fn offer(next: &Arc<Node>, deps: &HashMap<usize, usize>) -> Option<(Epilogue, Vec<(usize, Pass)>)> {
    if let Some(ep) = next.epilogue() {
        return Some((ep, vec![(key(next), Pass::Twin)]));
    }
    let from = next.cast_from()?;
    let [Some(Edge::Node(before))] = next.edges.as_slice() else {
        return None;
    };
    if deps.get(&key(before)) != Some(&1) {
        return None;
    }
    let ep = before.epilogue()?;
    Some((
        Epilogue::CastThen(from, Box::new(ep)),
        vec![(key(next), Pass::Cast), (key(before), Pass::Twin)],
    ))
}

/// A node whose formula the producer of `g` applied in its kernel (Note [Backward epilogues]):
/// `g` goes on along its one edge. A twin of its own output, which PyTorch's backward would
/// allocate here, is allocated and freed unwritten (`Through::Twin`), so that the allocator
/// sees the same sizes live as PyTorch's (the output while the input gradient lives, then one
/// of them); where the producer left it a `Finish` (`Through::Finish`), that runs instead and
/// allocates the node's output.
fn pass_through(
    node: &Node,
    g: Tensor,
    through: Through,
    retain_graph: bool,
) -> Result<Vec<Option<Tensor>>> {
    let g = {
        let _scope = crate::alloc::kiln_scope(
            || crate::alloc::op_frame_name(node.name, true),
            "kiln autograd",
        );
        match through {
            Through::Twin => {
                drop(Tensor::empty(g.shape(), g.dtype(), g.device())?);
                g
            }
            Through::Finish(finish) => finish(g)?,
        }
    };
    if !retain_graph {
        *lock(&node.backward) = None;
    }
    Ok(node.edges.iter().map(|_| Some(g.clone())).collect())
}

/// Counts one more edge into a leaf (`added`: it carried a gradient); after its last one, the
/// leaf's hooks run if any of them carried a gradient.
fn leaf_arrived(
    leaf_deps: &mut HashMap<usize, (usize, bool)>,
    meta: &Arc<AutogradMeta>,
    added: bool,
) -> Result<()> {
    let (left, got) = leaf_deps
        .get_mut(&(Arc::as_ptr(meta) as usize))
        .expect("counted above");
    *left -= 1;
    *got |= added;
    if *left == 0 && *got {
        run_hooks(meta)?;
    }
    Ok(())
}
