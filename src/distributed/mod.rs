//! Data parallelism in the image of `torch.distributed`: one process per GPU, a process group
//! over MPI, collectives on tensors, and `DistributedDataParallel`.
//!
//! Note \[Distributed\]: wgpu has no collectives and no peer access between devices, so kiln
//! leaves the wire to MPI, which runs on every cluster and on one host alike. A GPU tensor
//! travels through kiln's pinned pool: chunks are copied device to pinned memory, the transport
//! works on the pinned memory in place, and the result is copied back, several chunks in flight
//! (`staging.rs`). MPI is called from one thread only, the communication thread (`comm.rs`):
//! collectives are handed to it in order, so that DDP's bucket reductions run while backward
//! goes on on the caller's thread, and every wait has the group's timeout, so that a rank that
//! fails makes the others fail instead of hang. When every rank runs on one host, all-reduce
//! goes through an MPI-3 shared-memory window instead of MPI's copies (`shm.rs`, Note
//! [Shared-memory all-reduce]). Across hosts nothing in kiln changes: MPI picks
//! the network; the host staging bandwidth (GPU to pinned memory and back) then bounds the
//! collectives. See ARCHITECTURE.md.
//!
//! With the `nccl` feature, on NVIDIA GPUs with the CUDA driver and NCCL installed, GPU
//! tensors' collectives go GPU to GPU through NCCL instead (NVLink or PCIe, as NCCL finds
//! them): DDP's buckets live in Vulkan memory CUDA imports, and the two APIs' queues are
//! ordered by shared timeline semaphores (Note \[NCCL\] in `nccl.rs`). MPI still starts the
//! group. `KILN_DIST_BACKEND=nccl|mpi|auto` chooses; `auto`, the default, takes NCCL where
//! every rank can open it and MPI elsewhere, and `ProcessGroup::backend()` says which.
//!
//! Launch with `mpirun -n 2 cargo run --release --features mpi --example train -- --ddp`.
//! Without the `mpi` feature, or run without `mpirun`, a group has one process and every
//! collective is a copy (PyTorch's world of one).
//!
//! # What is here
//!
//! Without the `mpi` feature, or outside `mpirun`, the group is one process.
//! - `mod.rs`: the process group and its collectives (`init_process_group`, `all_reduce`,
//!   `broadcast`, `all_gather`, `barrier`); re-exports `data`'s `DistributedSampler`.
//! - `comm.rs`: the communication thread, which alone calls MPI and times every wait out.
//! - `nccl.rs`: GPU tensors' collectives through NCCL (feature `nccl`), with CUDA's imports
//!   of kiln's exportable memory and semaphores (`device/external.rs`).
//! - `mpi.rs`: the transport over MPI; `shm.rs`: the same-host all-reduce through an MPI-3
//!   shared-memory window; `staging.rs`: GPU tensors staged chunk by chunk through the pinned pool.
//! - `ddp.rs`: `DistributedDataParallel` and its bucket reducer.

mod comm;
mod ddp;
#[cfg(feature = "mpi")]
mod mpi;
#[cfg(feature = "nccl")]
mod nccl;
// CUDA imports Vulkan's memory and semaphores as POSIX file descriptors (Note [NCCL]).
#[cfg(all(feature = "nccl", not(all(unix, not(target_vendor = "apple")))))]
compile_error!("kiln's `nccl` feature needs Linux: CUDA imports Vulkan memory as file descriptors");
#[cfg(feature = "mpi")]
mod shm;
mod staging;

pub use crate::data::DistributedSampler;
pub use comm::Work;
pub use ddp::{DdpOptions, DistributedDataParallel};

use crate::base::lock;
use crate::device::Device;
use crate::tensor::{DType, Tensor};
use crate::{Error, Result};
use comm::{Comm, Transport};
use staging::Staged;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// `torch.distributed.ReduceOp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Elementwise sum.
    Sum,
    /// The sum divided by the world size (floating-point tensors).
    Avg,
    /// Elementwise product.
    Product,
    /// Elementwise minimum.
    Min,
    /// Elementwise maximum.
    Max,
}

/// `init_process_group`'s arguments.
#[derive(Clone, Debug)]
pub struct InitOptions {
    /// How long a collective may wait for the other ranks before it fails and breaks the group
    /// (PyTorch's `timeout`; default 600 s, or `KILN_DIST_TIMEOUT` seconds).
    pub timeout: Duration,
    /// This rank's device; by default `KILN_DEVICE`, else the local rank's adapter among this
    /// host's best ones (PyTorch's `torch.cuda.set_device(local_rank)`).
    pub device: Option<Device>,
}

impl Default for InitOptions {
    fn default() -> Self {
        let secs = std::env::var("KILN_DIST_TIMEOUT")
            .ok()
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0)
            .unwrap_or(600.0);
        InitOptions {
            timeout: Duration::from_secs_f64(secs),
            device: None,
        }
    }
}

/// The processes training together (PyTorch's default process group). Clones share it; when
/// the last goes, MPI is finalised (PyTorch's `destroy_process_group`). One per process. Keep
/// it in `main`, not in a static: a rank that exits without finalising MPI is reported by
/// `mpirun` as a failure.
#[derive(Clone)]
pub struct ProcessGroup(Arc<Group>);

struct Group {
    /// GPU tensors' collectives through NCCL (Note [NCCL]), where every rank opened it. First:
    /// the communicator is destroyed before the communication thread finalises MPI.
    #[cfg(feature = "nccl")]
    nccl: Option<nccl::Nccl>,
    comm: Comm,
    device: Device,
    /// What carries the collectives, for `backend()`.
    backend: String,
}

/// How `KILN_DIST_BACKEND` (`nccl`, `mpi` or `auto`) asks for the transport of GPU tensors.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Want {
    /// NCCL where every rank can open it, else MPI (the default).
    Auto,
    Nccl,
    Mpi,
}

fn wanted() -> Result<Want> {
    match std::env::var("KILN_DIST_BACKEND").as_deref() {
        Err(_) | Ok("") | Ok("auto") => Ok(Want::Auto),
        Ok("nccl") => Ok(Want::Nccl),
        Ok("mpi") => Ok(Want::Mpi),
        Ok(other) => Err(Error::InvalidArgument {
            op: "init_process_group",
            msg: format!("KILN_DIST_BACKEND must be nccl, mpi or auto, got {other:?}"),
        }),
    }
}

/// The group `init_process_group` made, for the free functions (weak: the user's handles own
/// it).
static DEFAULT: Mutex<Weak<Group>> = Mutex::new(Weak::new());

/// Initialises the process group from MPI's environment (`mpirun` sets rank and size; the
/// local rank picks the adapter), with the default options.
pub fn init_process_group() -> Result<ProcessGroup> {
    init_process_group_with(InitOptions::default())
}

/// `init_process_group` with options.
pub fn init_process_group_with(options: InitOptions) -> Result<ProcessGroup> {
    let mut default = lock(&DEFAULT);
    if default.upgrade().is_some() {
        return Err(Error::Distributed {
            op: "init_process_group",
            msg: "trying to initialize the default process group twice!".into(),
        });
    }
    let comm = Comm::start(options.timeout, make_transport)?;
    let device = match options.device {
        Some(d) => d,
        None => device_for_local_rank(comm.local_rank)?,
    };
    let want = wanted()?;
    let transport = comm.transport.clone();
    #[cfg(feature = "nccl")]
    // A group of one opens NCCL only when asked by name (as PyTorch's world of one on NCCL):
    // every collective is the identity there.
    let (nccl, backend) = if comm.size > 1 || want == Want::Nccl {
        let d = device.clone();
        match comm.call("init_process_group", move |tr| {
            nccl::Nccl::open(&d, tr, want)
        })? {
            Ok(n) => {
                let backend = format!("{} over {transport}", n.name);
                (Some(n), backend)
            }
            Err(why) => (
                None,
                format!("{transport} (GPU tensors staged through the host: {why})"),
            ),
        }
    } else {
        (None, transport)
    };
    #[cfg(not(feature = "nccl"))]
    let backend = transport;
    #[cfg(not(feature = "nccl"))]
    if want == Want::Nccl {
        return Err(Error::Distributed {
            op: "init_process_group",
            msg: "KILN_DIST_BACKEND=nccl, but kiln was built without its `nccl` feature: \
                  build with `--features nccl`"
                .into(),
        });
    }
    let group = Arc::new(Group {
        #[cfg(feature = "nccl")]
        nccl,
        comm,
        device,
        backend,
    });
    *default = Arc::downgrade(&group);
    Ok(ProcessGroup(group))
}

/// MPI when `mpirun` (or another MPI launcher) started this process, else a group of one (MPI
/// is not initialised then: a singleton MPI start needs a launcher daemon that a bare process
/// may not have).
fn make_transport() -> Result<Box<dyn Transport>> {
    let launched = [
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "PMIX_SIZE",
        "MPI_LOCALNRANKS",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok()?.parse::<usize>().ok());
    #[cfg(feature = "mpi")]
    if launched.is_some() {
        return Ok(Box::new(mpi::MpiTransport::init()?));
    }
    match launched {
        Some(n) if n > 1 => Err(Error::Distributed {
            op: "init_process_group",
            msg: format!(
                "launched as one of {n} MPI ranks, but kiln was built without its `mpi` \
                 feature: build with `--features mpi` (needs Open MPI: libopenmpi-dev)"
            ),
        }),
        _ => Ok(Box::new(comm::SelfTransport)),
    }
}

/// `KILN_DEVICE`, else adapter `local_rank` (modulo their number) among this host's best
/// adapters: discrete GPUs if any, else integrated, ..., GL only where nothing else drives them.
/// Several ranks share an adapter when there are fewer (a software adapter in tests).
fn device_for_local_rank(local_rank: usize) -> Result<Device> {
    if let Ok(spec) = std::env::var("KILN_DEVICE") {
        return Device::from_spec(&spec);
    }
    let all = crate::device::adapters();
    let native: Vec<_> = all
        .iter()
        .filter(|a| a.backend != wgpu::Backend::Gl)
        .collect();
    let pool = if native.is_empty() {
        all.iter().collect()
    } else {
        native
    };
    let Some(best) = pool.iter().map(|a| a.rank().0).min() else {
        return Device::cpu();
    };
    let candidates: Vec<_> = pool.into_iter().filter(|a| a.rank().0 == best).collect();
    Device::from_spec(&candidates[local_rank % candidates.len()].spec)
}

/// The group `init_process_group` made, while some handle keeps it.
pub fn default_group() -> Result<ProcessGroup> {
    lock(&DEFAULT)
        .upgrade()
        .map(ProcessGroup)
        .ok_or_else(|| Error::Distributed {
            op: "default_group",
            msg: "Default process group has not been initialized, please make sure to call \
                  init_process_group."
                .into(),
        })
}

/// Whether a process group is alive.
pub fn is_initialized() -> bool {
    lock(&DEFAULT).strong_count() > 0
}

/// `all_reduce` on the default group.
pub fn all_reduce(t: &Tensor, op: ReduceOp) -> Result<()> {
    default_group()?.all_reduce(t, op)
}

/// `broadcast` on the default group.
pub fn broadcast(t: &Tensor, src: usize) -> Result<()> {
    default_group()?.broadcast(t, src)
}

/// `all_gather` on the default group.
pub fn all_gather(t: &Tensor) -> Result<Vec<Tensor>> {
    default_group()?.all_gather(t)
}

/// `barrier` on the default group.
pub fn barrier() -> Result<()> {
    default_group()?.barrier()
}

/// This process's rank in the default group.
pub fn get_rank() -> Result<usize> {
    Ok(default_group()?.rank())
}

/// The default group's size.
pub fn get_world_size() -> Result<usize> {
    Ok(default_group()?.world_size())
}

impl ProcessGroup {
    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.0.comm.rank
    }

    /// The number of processes.
    pub fn world_size(&self) -> usize {
        self.0.comm.size
    }

    /// Rank among the processes on this host.
    pub fn local_rank(&self) -> usize {
        self.0.comm.local_rank
    }

    /// This rank's device (see `InitOptions::device`).
    pub fn device(&self) -> &Device {
        &self.0.device
    }

    /// What carries the collectives: "NCCL 2.27.3 over MPI (Open MPI v4.1.4)", "MPI (Open MPI
    /// v4.1.4)" with the reason NCCL was not used, or a single process.
    pub fn backend(&self) -> &str {
        &self.0.backend
    }

    /// Whether collectives on GPU tensors go GPU to GPU through NCCL (Note \[NCCL\]).
    pub fn uses_nccl(&self) -> bool {
        #[cfg(feature = "nccl")]
        return self.0.nccl.is_some();
        #[cfg(not(feature = "nccl"))]
        false
    }

    /// An uninitialised tensor on this rank's device for collectives to work on in place: in
    /// memory NCCL reads and writes directly where the group uses it (DDP's buckets are made
    /// so), else an ordinary one. A collective on any other GPU tensor goes through such a
    /// tensor: a copy in and, for results, a copy back, both on the GPU.
    pub fn empty_for_collectives(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        if self.uses_nccl() {
            Tensor::empty_external(shape, dtype, self.device())
        } else {
            Tensor::empty(shape, dtype, self.device())
        }
    }

    /// How long a collective waits for the other ranks before it fails.
    pub fn timeout(&self) -> Duration {
        self.0.comm.timeout
    }

    /// A sampler that gives this rank its share of each epoch.
    pub fn sampler(&self) -> DistributedSampler {
        DistributedSampler {
            num_replicas: self.world_size(),
            rank: self.rank(),
            drop_last: false,
        }
    }

    /// A contiguous, flat handle on `t` for the collectives (a view: it shares `t`'s memory).
    fn flat(op: &'static str, t: &Tensor) -> Result<Tensor> {
        if !t.is_contiguous() {
            return Err(Error::InvalidArgument {
                op,
                msg: format!(
                    "Tensors must be contiguous (got shape {:?}, strides {:?})",
                    t.shape(),
                    t.strides()
                ),
            });
        }
        crate::no_grad(|| t.detach().reshape(&[-1]))
    }

    fn check_dtype(op: &'static str, dtype: DType, reduce: Option<ReduceOp>) -> Result<()> {
        let ok = match reduce {
            Some(ReduceOp::Avg) => matches!(dtype, DType::F32 | DType::F16),
            Some(_) => matches!(dtype, DType::F32 | DType::F16 | DType::I32 | DType::U32),
            None => dtype != DType::F64,
        };
        if ok {
            return Ok(());
        }
        Err(Error::UnsupportedDType {
            op,
            dtype,
            why: match reduce {
                Some(ReduceOp::Avg) => "ReduceOp::Avg averages f32 and f16 tensors".into(),
                Some(_) => "reductions take f32, f16, i32 and u32 tensors".into(),
                None => "f64 exists on the CPU device only; collectives move GPU dtypes".into(),
            },
        })
    }

    /// Reduces `t` across ranks in place (every rank ends with the result), returning at once
    /// with the `Work` to wait on.
    pub fn all_reduce_async(&self, t: &Tensor, op: ReduceOp) -> Result<Work<()>> {
        Self::check_dtype("all_reduce", t.dtype(), Some(op))?;
        let flat = Self::flat("all_reduce", t)?;
        #[cfg(feature = "nccl")]
        if let Some(n) = self.nccl_for(&flat) {
            return self.all_reduce_nccl(n, flat, op);
        }
        if self.world_size() == 1 {
            // Every op of one operand is the operand: nothing to move.
            return Ok(self.0.comm.done("all_reduce", ()));
        }
        self.all_reduce_through_host(&flat, op)
    }

    /// NCCL, where the group has it and `t` is on this rank's GPU; CPU tensors (and other
    /// devices') take the host path, as PyTorch's `cpu:gloo,cuda:nccl` groups do.
    #[cfg(feature = "nccl")]
    fn nccl_for(&self, t: &Tensor) -> Option<&nccl::Nccl> {
        self.0
            .nccl
            .as_ref()
            .filter(|_| t.device() == self.device() && !t.device().is_cpu())
    }

    /// `all_reduce_async` through NCCL: in place where `flat` is exportable, else through an
    /// exportable copy made and read back on the GPU.
    #[cfg(feature = "nccl")]
    fn all_reduce_nccl(&self, n: &nccl::Nccl, flat: Tensor, op: ReduceOp) -> Result<Work<()>> {
        let staged = self.staged_for_nccl(n, &flat, true)?;
        let done = n.all_reduce(staged.as_ref().unwrap_or(&flat), op)?;
        Ok(self.nccl_work(done, move || match staged {
            Some(s) => crate::no_grad(|| flat.copy_(&s).map(|_| ())),
            None => Ok(()),
        }))
    }

    /// `None` where NCCL can work on `t` in place (exportable memory), else an exportable
    /// tensor of its shape (holding a copy of `t` with `copy_in`) for NCCL to work on instead.
    #[cfg(feature = "nccl")]
    fn staged_for_nccl(&self, n: &nccl::Nccl, t: &Tensor, copy_in: bool) -> Result<Option<Tensor>> {
        if n.is_external(t) {
            return Ok(None);
        }
        let staged = Tensor::empty_external(t.shape(), t.dtype(), self.device())?;
        if copy_in {
            staged.copy_(t)?;
        }
        Ok(Some(staged))
    }

    /// The `Work` of NCCL collective `done`: its wait orders kiln's queue after it, then runs
    /// `then` (a copy back from a staged tensor).
    #[cfg(feature = "nccl")]
    fn nccl_work(&self, done: u64, then: impl FnOnce() -> Result<()> + Send + 'static) -> Work<()> {
        let group = self.0.clone();
        self.0.comm.queued("all_reduce", (), move || {
            if let Some(n) = &group.nccl {
                n.order_after(done);
            }
            then()
        })
    }

    /// `all_reduce_async` of several tensors in memory NCCL works on in place
    /// (`empty_for_collectives`), launched together: one hand-off between kiln's queue and
    /// NCCL's stream for all of them (DDP's buckets at the end of backward). Without NCCL,
    /// one collective each, waited for here.
    pub(crate) fn all_reduce_coalesced(&self, ts: &[Tensor], op: ReduceOp) -> Result<Work<()>> {
        #[cfg(feature = "nccl")]
        if let Some(n) = ts.first().and_then(|t| self.nccl_for(t)) {
            if ts.iter().all(|t| n.is_external(t) && t.is_contiguous()) {
                for t in ts {
                    Self::check_dtype("all_reduce", t.dtype(), Some(op))?;
                }
                let done = n.all_reduce_many(ts, op)?;
                return Ok(self.nccl_work(done, || Ok(())));
            }
        }
        let works = ts
            .iter()
            .map(|t| self.all_reduce_async(t, op))
            .collect::<Result<Vec<_>>>()?;
        works.into_iter().try_for_each(Work::wait)?;
        Ok(self.0.comm.done("all_reduce", ()))
    }

    /// `all_reduce_async` through the host (MPI), whatever the group's backend: what the
    /// tests compare NCCL's results with.
    #[doc(hidden)]
    pub fn all_reduce_through_host(&self, t: &Tensor, op: ReduceOp) -> Result<Work<()>> {
        Self::check_dtype("all_reduce", t.dtype(), Some(op))?;
        let flat = Self::flat("all_reduce", t)?;
        if self.world_size() == 1 {
            return Ok(self.0.comm.done("all_reduce", ()));
        }
        let prefetched = staging::prefetch(&flat)?;
        self.0.comm.submit("all_reduce", move |tr| {
            let dtype = flat.dtype();
            Staged {
                device: flat.device(),
                dtype,
                numel: flat.numel(),
                src: Some(&flat),
                prefetched,
                dsts: std::slice::from_ref(&flat),
                parts: 1,
            }
            .run(|s, r| tr.all_reduce(dtype, op, s, r))
        })
    }

    /// `torch.distributed.all_reduce`: `t` becomes `op` over every rank's `t`.
    pub fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<()> {
        self.all_reduce_async(t, op)?.wait()
    }

    /// `torch.distributed.broadcast`: every rank's `t` becomes rank `src`'s.
    pub fn broadcast(&self, t: &Tensor, src: usize) -> Result<()> {
        if src >= self.world_size() {
            return Err(Error::InvalidArgument {
                op: "broadcast",
                msg: format!(
                    "Invalid rank {src}, rank should be in the interval [0, {}]",
                    self.world_size() - 1
                ),
            });
        }
        self.broadcast_staged(t, src, None)
    }

    /// Prefetches `t` for a later `broadcast_staged` from this rank: its download is queued
    /// now, in stream order after the work that wrote it, so that the broadcast need not wait
    /// for the work queued in between. `t` must not change before that broadcast.
    pub(crate) fn prefetch(&self, t: &Tensor) -> Result<Option<staging::Prefetched>> {
        if self.uses_nccl() && t.device() == self.device() {
            // NCCL sends from GPU memory: nothing goes to the host.
            return Ok(None);
        }
        staging::prefetch(&Self::flat("broadcast", t)?)
    }

    /// `broadcast`, with the root's data already on its way to the host (`prefetch` of a
    /// tensor equal to `t`) where `prefetched` is given. Other ranks ignore it.
    pub(crate) fn broadcast_staged(
        &self,
        t: &Tensor,
        src: usize,
        prefetched: Option<staging::Prefetched>,
    ) -> Result<()> {
        Self::check_dtype("broadcast", t.dtype(), None)?;
        let flat = Self::flat("broadcast", t)?;
        if self.world_size() == 1 {
            return Ok(());
        }
        #[cfg(feature = "nccl")]
        if let Some(n) = self.nccl_for(&flat) {
            return self.broadcast_nccl(n, &flat, src);
        }
        let root = self.rank() == src;
        let prefetched = prefetched.filter(|_| root);
        self.0.comm.call("broadcast", move |tr| {
            let dsts = if root { Vec::new() } else { vec![flat.clone()] };
            Staged {
                device: flat.device(),
                dtype: flat.dtype(),
                numel: flat.numel(),
                src: root.then_some(&flat),
                prefetched,
                dsts: &dsts,
                parts: 1,
            }
            .run(|s, r| {
                if root {
                    r.copy_from_slice(s);
                }
                tr.broadcast(r, src)
            })
        })
    }

    /// `broadcast` through NCCL, in place where `flat` is exportable.
    #[cfg(feature = "nccl")]
    fn broadcast_nccl(&self, n: &nccl::Nccl, flat: &Tensor, src: usize) -> Result<()> {
        let root = self.rank() == src;
        let staged = self.staged_for_nccl(n, flat, root)?;
        let done = n.broadcast(staged.as_ref().unwrap_or(flat), src)?;
        n.order_after(done);
        match staged {
            Some(s) if !root => flat.copy_(&s).map(|_| ()),
            _ => Ok(()),
        }
    }

    /// `torch.distributed.all_gather`: every rank's `t`, in rank order (views of one new
    /// tensor on `t`'s device).
    pub fn all_gather(&self, t: &Tensor) -> Result<Vec<Tensor>> {
        Self::check_dtype("all_gather", t.dtype(), None)?;
        let flat = Self::flat("all_gather", t)?;
        let world = self.world_size();
        let n = flat.numel();
        #[cfg(feature = "nccl")]
        let nccl = self.nccl_for(&flat);
        #[cfg(not(feature = "nccl"))]
        let nccl: Option<()> = None;
        let out = match nccl {
            Some(_) => Tensor::empty_external(&[world * n], t.dtype(), t.device())?,
            None => Tensor::empty(&[world * n], t.dtype(), t.device())?,
        };
        let parts = (0..world)
            .map(|r| out.narrow(0, r * n, n))
            .collect::<Result<Vec<_>>>()?;
        let shape = crate::ops::isize_shape(t.shape());
        #[cfg(feature = "nccl")]
        if let Some(nc) = nccl {
            let staged = self.staged_for_nccl(nc, &flat, true)?;
            let done = nc.all_gather(staged.as_ref().unwrap_or(&flat), &out)?;
            nc.order_after(done);
            return parts.iter().map(|p| p.reshape(&shape)).collect();
        }
        let dsts = parts.clone();
        self.0.comm.call("all_gather", move |tr| {
            Staged {
                device: flat.device(),
                dtype: flat.dtype(),
                numel: n,
                src: Some(&flat),
                prefetched: None,
                dsts: &dsts,
                parts: world,
            }
            .run(|s, r| tr.all_gather(s, r))
        })?;
        parts.iter().map(|p| p.reshape(&shape)).collect()
    }

    /// `torch.distributed.barrier`: returns when every rank has called it.
    pub fn barrier(&self) -> Result<()> {
        self.0.comm.call("barrier", |tr| tr.barrier())
    }
}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ProcessGroup(rank {} of {}, local rank {}, {}, on {})",
            self.rank(),
            self.world_size(),
            self.local_rank(),
            self.backend(),
            self.device().name()
        )
    }
}
