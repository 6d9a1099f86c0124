//! `DistributedDataParallel`, after PyTorch's `torch/nn/parallel/distributed.py` and its C++
//! `Reducer` (`torch/csrc/distributed/c10d/reducer.cpp`): parameters in buckets (reverse
//! registration order, one dtype each, the first capped at 1 MiB so that communication starts
//! early and the rest at 25 MiB); a post-accumulate-grad hook per parameter copies its gradient,
//! scaled by 1/world, into its bucket; a full bucket is all-reduced on the communication thread
//! while backward goes on, buckets always launched in index order so that every rank issues the
//! same collectives in the same order; a callback at the end of backward waits for them and
//! copies the averaged gradients back into `.grad`. Under NCCL the buckets, assigned the same
//! way, are launched together at the end of backward (Note [NCCL] in `nccl.rs`).

use super::{ProcessGroup, ReduceOp, Work};
use crate::autograd::{queue_callback, RemovableHandle};
use crate::base::lock;
use crate::nn::Module;
use crate::ops::isize_shape;
use crate::tensor::{DType, Tensor};
use crate::{Device, Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// `DistributedDataParallel`'s arguments that kiln has.
#[derive(Clone, Debug)]
pub struct DdpOptions {
    /// Bucket size in MiB (PyTorch's `bucket_cap_mb`, 25).
    pub bucket_cap_mb: f64,
    /// Broadcast rank 0's buffers (BatchNorm's running statistics) before each forward.
    pub broadcast_buffers: bool,
    /// PyTorch's `gradient_as_bucket_view`: each parameter's `.grad` becomes a view of its
    /// place in its bucket, so that the averages land in `.grad` without a copy back and the
    /// gradients take no memory beside the buckets (ResNet-50: 97.5 MiB a rank). A gradient
    /// that `zero_grad(set_to_none=false)` zeroed in place is accumulated straight into the
    /// bucket; one made afresh (after `set_to_none`) is copied in once, and `.grad` then points
    /// at the bucket. As in PyTorch, `.grad` must then not be detached or replaced while the
    /// module trains. In a group of one nothing is reduced and `.grad` is left alone.
    pub gradient_as_bucket_view: bool,
}

impl Default for DdpOptions {
    fn default() -> Self {
        DdpOptions {
            bucket_cap_mb: 25.0,
            broadcast_buffers: true,
            gradient_as_bucket_view: false,
        }
    }
}

/// PyTorch's `_DEFAULT_FIRST_BUCKET_BYTES`: the first bucket (the last layers' gradients, which
/// backward produces first) is small so that the first all-reduce starts early.
const FIRST_BUCKET_BYTES: usize = 1 << 20;

/// One bucket: its parameters (indices into the reducer's), where each starts in `flat`, and
/// the flat buffer the reduction runs on.
struct Bucket {
    params: Vec<usize>,
    offsets: Vec<usize>,
    flat: Tensor,
}

/// The state of one backward pass.
struct Pass {
    /// Whether this pass reduces (`no_sync` was off at the forward).
    sync: bool,
    ready: Vec<bool>,
    /// Parameters each bucket still waits for.
    pending: Vec<usize>,
    /// The next bucket to launch.
    next: usize,
    work: Vec<Option<Work<()>>>,
    finalize_queued: bool,
}

struct Reducer {
    group: ProcessGroup,
    params: Vec<Tensor>,
    buckets: Vec<Bucket>,
    /// Each parameter's (bucket, position in the bucket).
    slot: Vec<(usize, usize)>,
    pass: Mutex<Pass>,
    /// Cleared inside `no_sync`.
    require_sync: AtomicBool,
    /// `DdpOptions::gradient_as_bucket_view`.
    as_view: bool,
    /// Rank 0's buffers as its last forward left them (Note [Buffers' broadcast]).
    buffer_prefetch: Mutex<Option<BufferPrefetch>>,
}

/// PyTorch's `DistributedDataParallel`: wraps a module whose parameters are on this rank's
/// device; after `backward()` every parameter's `.grad` holds the average over ranks.
///
/// Construct it after moving the module to its device and before building the optimizer, as in
/// PyTorch (its parameters' hooks are registered on the tensors it finds). Its parameter names
/// carry PyTorch's `module.` prefix; `module()` reaches the wrapped model.
pub struct DistributedDataParallel<M: Module> {
    module: M,
    reducer: Arc<Reducer>,
    hooks: Vec<RemovableHandle>,
    options: DdpOptions,
}

fn bytes_of(t: &Tensor) -> usize {
    t.numel() * t.dtype().size_bytes()
}

/// Parameter indices per bucket: reverse order, one dtype per bucket, the first capped at 1 MiB
/// and the others at `cap` bytes (PyTorch's `compute_bucket_assignment_by_size`).
fn assign_buckets(params: &[Tensor], cap: usize) -> Vec<Vec<usize>> {
    let mut done: Vec<Vec<usize>> = Vec::new();
    let mut open: Vec<(DType, Vec<usize>, usize)> = Vec::new();
    for i in (0..params.len()).rev() {
        let dtype = params[i].dtype();
        let limit = if done.is_empty() {
            FIRST_BUCKET_BYTES.min(cap)
        } else {
            cap
        };
        let at = match open.iter().position(|(d, _, _)| *d == dtype) {
            Some(at) => at,
            None => {
                open.push((dtype, Vec::new(), 0));
                open.len() - 1
            }
        };
        let entry = &mut open[at];
        entry.1.push(i);
        entry.2 += bytes_of(&params[i]);
        if entry.2 >= limit {
            done.push(std::mem::take(&mut entry.1));
            entry.2 = 0;
        }
    }
    done.extend(
        open.into_iter()
            .map(|(_, b, _)| b)
            .filter(|b| !b.is_empty()),
    );
    done
}

impl Reducer {
    fn new(
        group: &ProcessGroup,
        params: Vec<Tensor>,
        cap: usize,
        as_view: bool,
    ) -> Result<Reducer> {
        let _scope = crate::alloc::kiln_scope(
            || "DistributedDataParallel.bucket".into(),
            "kiln distributed",
        );
        let mut slot = vec![(0, 0); params.len()];
        let mut buckets = Vec::new();
        for (b, idx) in assign_buckets(&params, cap).into_iter().enumerate() {
            let mut offsets = Vec::with_capacity(idx.len());
            let mut n = 0;
            for (k, &i) in idx.iter().enumerate() {
                slot[i] = (b, k);
                offsets.push(n);
                n += params[i].numel();
            }
            // In memory NCCL reads and writes in place where the group uses it.
            let flat = group.empty_for_collectives(&[n], params[idx[0]].dtype())?;
            buckets.push(Bucket {
                params: idx,
                offsets,
                flat,
            });
        }
        let pass = Pass {
            sync: true,
            ready: vec![false; params.len()],
            pending: buckets.iter().map(|b| b.params.len()).collect(),
            next: 0,
            work: buckets.iter().map(|_| None).collect(),
            finalize_queued: false,
        };
        Ok(Reducer {
            group: group.clone(),
            params,
            buckets,
            slot,
            pass: Mutex::new(pass),
            require_sync: AtomicBool::new(true),
            as_view,
            buffer_prefetch: Mutex::new(None),
        })
    }

    /// `view(i)` in the parameter's shape: its `.grad` under `gradient_as_bucket_view`.
    fn grad_view(&self, i: usize) -> Result<Tensor> {
        self.view(i)?.reshape(&isize_shape(self.params[i].shape()))
    }

    /// Whether `g` is parameter `i`'s place in its bucket (its `.grad` from an earlier pass,
    /// accumulated into in place).
    fn is_grad_view(&self, i: usize, g: &Tensor) -> bool {
        let (b, k) = self.slot[i];
        let flat = &self.buckets[b].flat;
        g.shares_storage(flat)
            && g.is_contiguous()
            && g.layout().offset == flat.layout().offset + self.buckets[b].offsets[k]
            && g.shape() == self.params[i].shape()
    }

    /// Parameter `i`'s place in its bucket's buffer.
    fn view(&self, i: usize) -> Result<Tensor> {
        let (b, k) = self.slot[i];
        let bucket = &self.buckets[b];
        bucket
            .flat
            .narrow(0, bucket.offsets[k], self.params[i].numel())
    }

    /// Rank 0's parameters and buffers everywhere (PyTorch's `_sync_module_states`), a bucket
    /// per broadcast.
    fn sync_states(&self, buffers: &[Tensor]) -> Result<()> {
        if self.group.world_size() == 1 {
            return Ok(());
        }
        crate::no_grad(|| {
            for bucket in &self.buckets {
                for &i in &bucket.params {
                    self.view(i)?.copy_(&self.params[i].reshape(&[-1])?)?;
                }
                self.group.broadcast(&bucket.flat, 0)?;
                for &i in &bucket.params {
                    self.params[i].copy_(
                        &self
                            .view(i)?
                            .reshape(&isize_shape(self.params[i].shape()))?,
                    )?;
                }
            }
            broadcast_buffers(&self.group, buffers, None)
        })
    }

    /// A parameter's gradient is complete for this pass (its hook).
    fn mark_ready(self: &Arc<Self>, i: usize, grad: &Tensor) -> Result<()> {
        let mut pass = lock(&self.pass);
        // In a group of one, the average is the gradient: nothing to copy or wait for (unless
        // NCCL was asked for by name, where buckets are reduced as in PyTorch's world of one).
        if !pass.sync || (self.group.world_size() == 1 && !self.group.uses_nccl()) {
            return Ok(());
        }
        if pass.ready[i] {
            return Err(Error::Autograd {
                op: "DistributedDataParallel",
                msg: format!(
                    "Expected to mark a variable ready only once (parameter {i} got its \
                     gradient twice in one backward pass; reentrant backward or a parameter \
                     used in two graphs)"
                ),
            });
        }
        if !pass.finalize_queued {
            let weak = Arc::downgrade(self);
            queue_callback(move || finalize(&weak))?;
            pass.finalize_queued = true;
        }
        pass.ready[i] = true;
        if !(self.as_view && self.is_grad_view(i, grad)) {
            self.view(i)?.copy_(&grad.reshape(&[-1])?)?;
            if self.as_view {
                self.params[i].set_grad(Some(self.grad_view(i)?))?;
            }
        }
        let b = self.slot[i].0;
        pass.pending[b] -= 1;
        self.launch_ready(&mut pass)
    }

    /// Whether buckets wait for the end of backward and go to NCCL together, in one group
    /// after one hand-off: under NCCL unless `KILN_DDP_LAUNCH=each` (Note [NCCL]: each launch
    /// costs the GPU a hand-off between its Vulkan and CUDA contexts, more than overlapping
    /// the reduction with backward saves).
    fn launch_at_end(&self) -> bool {
        static EACH: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        self.group.uses_nccl()
            && !*EACH.get_or_init(|| std::env::var("KILN_DDP_LAUNCH").is_ok_and(|v| v == "each"))
    }

    /// Launches the complete buckets at the head of the order (at the end of backward, all of
    /// them together where `launch_at_end`).
    fn launch_ready(&self, pass: &mut Pass) -> Result<()> {
        if self.launch_at_end() {
            return Ok(());
        }
        while pass.next < self.buckets.len() && pass.pending[pass.next] == 0 {
            let flat = &self.buckets[pass.next].flat;
            let world = self.group.world_size();
            // NCCL averages in the collective (ncclAvg: the sum times 1/world, in f32); MPI
            // sums what each rank scaled first, as PyTorch's DDP does. For two ranks both give
            // the same bits (scaling by 1/2 is exact).
            let op = if self.group.uses_nccl() {
                ReduceOp::Avg
            } else {
                if world > 1 {
                    flat.mul_scalar_(1.0 / world as f64)?;
                }
                ReduceOp::Sum
            };
            pass.work[pass.next] = Some(self.group.all_reduce_async(flat, op)?);
            if super::staging::profiling() {
                eprintln!(
                    "kiln distributed: at {:.1} ms: bucket {} ({} bytes) launched",
                    super::staging::clock_ms(),
                    pass.next,
                    flat.numel() * flat.dtype().size_bytes()
                );
            }
            pass.next += 1;
        }
        Ok(())
    }

    /// Back to the start of a pass; returns the work still in flight, with its bucket.
    fn reset(&self, pass: &mut Pass) -> Vec<(usize, Work<()>)> {
        pass.ready.iter_mut().for_each(|r| *r = false);
        for (p, b) in pass.pending.iter_mut().zip(&self.buckets) {
            *p = b.params.len();
        }
        pass.next = 0;
        pass.finalize_queued = false;
        pass.work
            .iter_mut()
            .enumerate()
            .filter_map(|(b, w)| Some((b, w.take()?)))
            .collect()
    }
}

/// At the end of backward: buckets whose parameters got no gradient in this pass are reduced
/// with zeros in their place (every rank launches every bucket, in order); then waits for every
/// reduction and copies the averages back into `.grad`.
fn finalize(reducer: &Weak<Reducer>) -> Result<()> {
    let Some(r) = reducer.upgrade() else {
        return Ok(());
    };
    let work = {
        let mut pass = lock(&r.pass);
        for b in pass.next..r.buckets.len() {
            for &i in &r.buckets[b].params {
                if !pass.ready[i] {
                    r.view(i)?.zero_()?;
                    pass.ready[i] = true;
                }
            }
            pass.pending[b] = 0;
        }
        if r.launch_at_end() && pass.next < r.buckets.len() {
            let flats: Vec<Tensor> = r.buckets[pass.next..]
                .iter()
                .map(|b| b.flat.clone())
                .collect();
            let last = r.buckets.len() - 1;
            pass.work[last] = Some(r.group.all_reduce_coalesced(&flats, ReduceOp::Avg)?);
            pass.next = r.buckets.len();
        }
        r.launch_ready(&mut pass)?;
        r.reset(&mut pass)
    };
    let waiting = super::staging::clock_ms();
    // Each bucket's averages go back into `.grad` as soon as its reduction is done, while the
    // later buckets are still exchanged: the host records those copies (one per parameter,
    // 161 for ResNet-50) in the wait instead of after the last bucket, where nothing else
    // hides them. The copies follow the bucket's uploads in the one stream.
    // (Under `gradient_as_bucket_view` the averages are `.grad` already; a parameter that got
    // no gradient in this pass gets its view, zeros or the other ranks' average.)
    let copy_back = |b: usize| -> Result<()> {
        for &i in &r.buckets[b].params {
            let p = &r.params[i];
            let avg = r.grad_view(i)?;
            match p.grad() {
                Some(g) if r.as_view && r.is_grad_view(i, &g) => {}
                _ if r.as_view => p.set_grad(Some(avg))?,
                Some(g) => g.copy_(&avg)?,
                None => p.set_grad(Some(crate::ops::copy(&avg)?))?,
            }
        }
        Ok(())
    };
    if r.group.uses_nccl() {
        // NCCL's stream runs the buckets in order and a wait returns at once: every wait first,
        // so that kiln's queue waits for NCCL in one submission. Copies recorded between the
        // waits made one submission per bucket, each waiting on the cross-API hand-off in
        // turn: about 0.55 ms a bucket on two H200s (Note [NCCL]).
        // Every bucket was launched in this pass (some together, under one `Work`).
        work.into_iter().try_for_each(|(_, w)| w.wait())?;
        (0..r.buckets.len()).try_for_each(copy_back)?;
    } else {
        for (b, w) in work {
            w.wait()?;
            copy_back(b)?;
        }
    }
    if super::staging::profiling() {
        eprintln!(
            "kiln distributed: at {waiting:.1} ms: backward's graph done; waited {:.1} ms for the \
             buckets",
            super::staging::clock_ms() - waiting
        );
    }
    Ok(())
}

/// Rank 0's buffers, packed per dtype and already on their way to the host: queued at the end
/// of rank 0's forward, right after the kernels that last wrote them (BatchNorm's running
/// statistics), so that the next forward's broadcast need not wait for the GPU to finish the
/// backward and the optimizer step queued since (see Note [Buffers' broadcast]).
struct BufferPrefetch {
    /// The buffers and their versions when packed: the prefetch stands for them only while
    /// every one is the same tensor at the same version.
    buffers: Vec<(Tensor, u64)>,
    /// Per dtype, in `dtype_groups` order: the packed tensor and its pinned chunks.
    packed: Vec<(Tensor, Option<super::staging::Prefetched>)>,
}

impl BufferPrefetch {
    fn stands_for(&self, buffers: &[Tensor]) -> bool {
        self.buffers.len() == buffers.len()
            && self
                .buffers
                .iter()
                .zip(buffers)
                .all(|((b, v), now)| b.shares_storage(now) && b.version() == *v)
    }
}

// Note [Buffers' broadcast]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// PyTorch broadcasts rank 0's buffers before every forward on NCCL's stream: nothing on the host
// waits. kiln's broadcast goes through the host, and rank 0's download of its buffers, queued at
// the forward, ran after everything queued before it: the previous step's backward and
// optimizer. Every forward began with both GPUs drained and idle while the buffers crossed
// (ResNet-50 on two H200s: a `no_sync` step 2-3 ms slower than one rank's). Rank 0 now packs
// and prefetches its buffers right after its forward, when they were last written, and the next
// forward sends that copy if every buffer is still the same tensor at the same version (an
// in-place write bumps the version; `load_state_dict` copies in place); else it packs afresh.
// The bytes sent are the ones PyTorch sends.

/// The buffers grouped by dtype (one broadcast each), in a fixed order.
fn dtype_groups(buffers: &[Tensor]) -> Vec<(DType, Vec<&Tensor>)> {
    let mut dtypes: Vec<DType> = buffers.iter().map(Tensor::dtype).collect();
    dtypes.sort_by_key(|d| format!("{d:?}"));
    dtypes.dedup();
    dtypes
        .into_iter()
        .map(|d| (d, buffers.iter().filter(|b| b.dtype() == d).collect()))
        .collect()
}

/// One dtype's buffers packed into a new flat tensor.
fn pack(group_of: &[&Tensor]) -> Result<Option<Tensor>> {
    let n: usize = group_of.iter().map(|b| b.numel()).sum();
    let Some(first) = group_of.first() else {
        return Ok(None);
    };
    let flat = Tensor::empty(&[n], first.dtype(), first.device())?;
    let mut at = 0;
    for b in group_of {
        flat.narrow(0, at, b.numel())?.copy_(&b.reshape(&[-1])?)?;
        at += b.numel();
    }
    Ok(Some(flat))
}

/// Rank 0's packed buffers, prefetched for the next forward's broadcast.
fn prefetch_buffers(group: &ProcessGroup, buffers: &[Tensor]) -> Result<BufferPrefetch> {
    // Held until the next forward: snapshots name it, as they name the buckets.
    let _scope = crate::alloc::kiln_scope(
        || "DistributedDataParallel.buffers".into(),
        "kiln distributed",
    );
    let mut packed = Vec::new();
    for (_, group_of) in dtype_groups(buffers) {
        if let Some(flat) = pack(&group_of)? {
            let blocks = group.prefetch(&flat)?;
            packed.push((flat, blocks));
        }
    }
    Ok(BufferPrefetch {
        buffers: buffers.iter().map(|b| (b.clone(), b.version())).collect(),
        packed,
    })
}

/// Rank 0's buffers everywhere, one broadcast per dtype (PyTorch's coalesced broadcast): a
/// ResNet's BatchNorm statistics are a hundred small tensors, each a collective otherwise.
/// Rank 0 only sends and the others only receive: each packs or unpacks, not both. Rank 0
/// sends `prefetched` where it still stands for the buffers.
fn broadcast_buffers(
    group: &ProcessGroup,
    buffers: &[Tensor],
    prefetched: Option<BufferPrefetch>,
) -> Result<()> {
    let root = group.rank() == 0;
    let mut prefetched = prefetched
        .filter(|p| root && p.stands_for(buffers))
        .map(|p| p.packed.into_iter());
    for (dtype, group_of) in dtype_groups(buffers) {
        if root {
            let (flat, blocks) = match prefetched.as_mut().and_then(Iterator::next) {
                Some((flat, blocks)) => (flat, blocks),
                None => match pack(&group_of)? {
                    Some(flat) => (flat, None),
                    None => continue,
                },
            };
            group.broadcast_staged(&flat, 0, blocks)?;
            continue;
        }
        let n: usize = group_of.iter().map(|b| b.numel()).sum();
        let Some(first) = group_of.first() else {
            continue;
        };
        let flat = Tensor::empty(&[n], dtype, first.device())?;
        group.broadcast(&flat, 0)?;
        let mut at = 0;
        for b in &group_of {
            b.copy_(
                &flat
                    .narrow(0, at, b.numel())?
                    .reshape(&isize_shape(b.shape()))?,
            )?;
            at += b.numel();
        }
    }
    Ok(())
}

impl<M: Module> DistributedDataParallel<M> {
    /// Wraps `module` with the default options: rank 0's parameters and buffers are broadcast
    /// to every rank, buckets are allocated, hooks registered.
    pub fn new(module: M, group: &ProcessGroup) -> Result<Self> {
        Self::with_options(module, group, DdpOptions::default())
    }

    /// Wraps `module` for data-parallel training in `group` with `options` (bucket size, `gradient_as_bucket_view`, ...), broadcasting rank 0's parameters and buffers first.
    pub fn with_options(module: M, group: &ProcessGroup, options: DdpOptions) -> Result<Self> {
        let bad = |msg: String| Error::InvalidArgument {
            op: "DistributedDataParallel",
            msg,
        };
        if !(options.bucket_cap_mb > 0.0 && options.bucket_cap_mb.is_finite()) {
            return Err(bad(format!(
                "bucket_cap_mb must be positive, got {}",
                options.bucket_cap_mb
            )));
        }
        let named = module.named_parameters();
        let params: Vec<Tensor> = named
            .iter()
            .filter(|(_, p)| p.requires_grad())
            .map(|(_, p)| p.clone())
            .collect();
        if params.is_empty() {
            return Err(bad(
                "DistributedDataParallel is not needed when a module doesn't have any \
                 parameter that requires a gradient."
                    .into(),
            ));
        }
        let device: &Device = group.device();
        if let Some((name, p)) = named.iter().find(|(_, p)| p.device() != device) {
            return Err(Error::DeviceMismatch {
                op: "DistributedDataParallel",
                expected: format!("rank {}'s device {}", group.rank(), device.name()),
                got: format!("parameter {name} on {}", p.device().name()),
            });
        }
        let cap = (options.bucket_cap_mb * (1 << 20) as f64) as usize;
        let reducer = Arc::new(Reducer::new(
            group,
            params,
            cap.max(1),
            options.gradient_as_bucket_view,
        )?);
        let buffers: Vec<Tensor> = module.named_buffers().into_iter().map(|(_, b)| b).collect();
        reducer.sync_states(&buffers)?;
        let mut hooks = Vec::new();
        for (i, p) in reducer.params.iter().enumerate() {
            let weak = Arc::downgrade(&reducer);
            hooks.push(
                p.register_post_accumulate_grad_hook(move |g| match weak.upgrade() {
                    Some(r) => r.mark_ready(i, g),
                    None => Ok(()),
                })?,
            );
        }
        Ok(DistributedDataParallel {
            module,
            reducer,
            hooks,
            options,
        })
    }

    /// The wrapped module (PyTorch's `ddp.module`).
    pub fn module(&self) -> &M {
        &self.module
    }

    /// The wrapped module, mutably.
    pub fn module_mut(&mut self) -> &mut M {
        &mut self.module
    }

    /// The process group its buckets are reduced in.
    pub fn process_group(&self) -> &ProcessGroup {
        &self.reducer.group
    }

    /// Bytes of each bucket, in launch order.
    pub fn bucket_sizes(&self) -> Vec<usize> {
        self.reducer
            .buckets
            .iter()
            .map(|b| bytes_of(&b.flat))
            .collect()
    }

    /// Runs `f` (forward and backward passes) without reducing gradients: they accumulate
    /// locally until a pass outside `no_sync` reduces the total (gradient accumulation).
    /// As in PyTorch, what counts is whether the forward ran inside.
    pub fn no_sync<R>(&self, f: impl FnOnce() -> Result<R>) -> Result<R> {
        struct Restore<'a>(&'a AtomicBool, bool);
        impl Drop for Restore<'_> {
            fn drop(&mut self) {
                self.0.store(self.1, Ordering::Release);
            }
        }
        let flag = &self.reducer.require_sync;
        let _restore = Restore(flag, flag.swap(false, Ordering::AcqRel));
        f()
    }
}

impl<M: Module> Drop for DistributedDataParallel<M> {
    fn drop(&mut self) {
        self.hooks.iter().for_each(RemovableHandle::remove);
    }
}

impl<M: Module> Module for DistributedDataParallel<M> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let r = &self.reducer;
        let stale = {
            let mut pass = lock(&r.pass);
            // A backward that failed half way leaves launched buckets: finish them, so that
            // every rank's collectives stay in step, and start over.
            let stale = if pass.next > 0 || pass.finalize_queued {
                r.reset(&mut pass)
            } else {
                Vec::new()
            };
            pass.sync = r.require_sync.load(Ordering::Acquire);
            stale
        };
        for (_, w) in stale {
            w.wait()?;
        }
        if self.options.broadcast_buffers && r.group.world_size() > 1 {
            let buffers: Vec<Tensor> = self
                .module
                .named_buffers()
                .into_iter()
                .map(|(_, b)| b)
                .collect();
            let prefetched = lock(&r.buffer_prefetch).take();
            crate::no_grad(|| broadcast_buffers(&r.group, &buffers, prefetched))?;
            let y = self.module.forward(x)?;
            if r.group.rank() == 0 && !buffers.is_empty() {
                let next = crate::no_grad(|| prefetch_buffers(&r.group, &buffers))?;
                *lock(&r.buffer_prefetch) = Some(next);
            }
            return Ok(y);
        }
        self.module.forward(x)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        crate::nn::prefixed("module", self.module.named_parameters())
    }

    fn tensors_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        crate::nn::prefixed("module", self.module.tensors_mut())
    }

    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        crate::nn::prefixed("module", self.module.named_buffers())
    }

    fn train(&mut self, mode: bool) {
        self.module.train(mode)
    }

    /// Moving would replace the parameters that the reducer and its hooks hold: as in
    /// PyTorch, move the module before wrapping it. A move to the device it is on is a no-op.
    fn to_device(&mut self, device: &Device) -> Result<()> {
        if device == self.reducer.group.device() {
            return Ok(());
        }
        Err(Error::InvalidArgument {
            op: "DistributedDataParallel.to",
            msg: format!(
                "the module is on rank {}'s device {}; move it to {} before wrapping it in \
                 DistributedDataParallel",
                self.reducer.group.rank(),
                self.reducer.group.device().name(),
                device.name()
            ),
        })
    }
}
