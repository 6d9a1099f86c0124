//! Collectives on GPU tensors through NCCL (feature `nccl`): GPU to GPU, over NVLink or PCIe
//! as NCCL finds them, with no host copy and no host wait. See Note [NCCL].

// Note [NCCL]
// ~~~~~~~~~~~
// Vulkan has no path between two GPUs, CUDA has (NCCL), and both can share memory and
// semaphores through file descriptors (Note [Exported memory]). So where the GPUs are
// NVIDIA's and the CUDA driver and NCCL open at run time:
// - a tensor a collective works on lives in the allocator's `EXTERNAL_STREAM` (DDP's buckets
//   are made there; any other tensor is copied into such a tensor on the GPU and back). CUDA
//   imports each such segment once and NCCL reads and writes it in place;
// - the order between kiln's queue and NCCL's stream is kept on the GPUs by two exported
//   timeline semaphores. A collective's launch has wgpu's queue signal `to_cuda` with a
//   submission carrying everything recorded so far; NCCL's stream waits for that value, runs
//   the collective and signals `from_cuda`. `Work::wait` returns at once and has wgpu's next
//   submission wait for `from_cuda`: whatever reads the result is recorded after it, as a
//   PyTorch stream waits on NCCL's work event. Between the launch and the wait, nothing
//   recorded may touch the tensor (DDP touches a bucket only before its launch and after its
//   wait; PyTorch asks the same).
// - MPI stays the bootstrap: rank 0's NCCL unique id travels over it, and every rank says
//   over it whether it can open NCCL, so that all ranks take the same path.
// - each hand-off costs GPU time, measured on H200s (docs/lab/data-parallel.md): a 1 KiB
//   all-reduce waited for takes 0.35 ms, and a DDP step paid about 0.55 ms a bucket on two
//   GPUs and 0.15-0.6 ms on one (NCCL in a group of one, where nothing is exchanged). kiln's
//   Vulkan device and NCCL's CUDA context are two contexts on the GPU, which by those figures
//   it runs by turns rather than side by side (PyTorch's NCCL kernels share the compute
//   context), so each launch interrupts backward. DDP therefore launches its buckets together at the end of
//   backward, in one NCCL group after one hand-off (`KILN_DDP_LAUNCH=each` launches each as
//   PyTorch does): on one H200, ResNet-50's DDP step 49.7 -> 48.3 ms; on two, 53.1 -> 49.7 ms
//   (1.75x -> 1.87x the throughput of one GPU; PyTorch's DDP 1.85x on the same machine).
// kiln's collectives are issued in the same order on every rank (DDP launches buckets in
// index order), which NCCL needs as MPI does. They are issued from the caller's thread, not the
// communication thread: a launch only enqueues work on the two GPU queues.

use super::comm::Transport;
use super::{ReduceOp, Want};
use crate::base::lock;
use crate::device::external::ExportedTimeline;
use crate::device::Device;
use crate::tensor::{DType, Tensor};
use crate::{Error, Result};
use cudarc::driver::sys as cu;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::os::fd::IntoRawFd;
use std::sync::Mutex;

/// NCCL's entry points kiln calls, from `libnccl.so.2` (NCCL's runtime package) or
/// `libnccl.so`.
struct Lib {
    _lib: libloading::Library,
    version: unsafe extern "C" fn(*mut c_int) -> c_int,
    unique_id: unsafe extern "C" fn(*mut [u8; 128]) -> c_int,
    init_rank: unsafe extern "C" fn(*mut *mut c_void, c_int, [u8; 128], c_int) -> c_int,
    destroy: unsafe extern "C" fn(*mut c_void) -> c_int,
    error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    #[allow(clippy::type_complexity)]
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        *mut c_void,
        cu::CUstream,
    ) -> c_int,
    #[allow(clippy::type_complexity)]
    broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        *mut c_void,
        cu::CUstream,
    ) -> c_int,
    group_start: unsafe extern "C" fn() -> c_int,
    group_end: unsafe extern "C" fn() -> c_int,
    all_gather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        *mut c_void,
        cu::CUstream,
    ) -> c_int,
}

impl Lib {
    fn open() -> std::result::Result<Lib, String> {
        let mut tried = Vec::new();
        for name in ["libnccl.so.2", "libnccl.so"] {
            // SAFETY: NCCL's library runs no code of concern at load.
            match unsafe { libloading::Library::new(name) } {
                Ok(lib) => return Lib::bind(lib),
                Err(e) => tried.push(format!("{name}: {e}")),
            }
        }
        Err(format!("NCCL not found ({})", tried.join("; ")))
    }

    fn bind(lib: libloading::Library) -> std::result::Result<Lib, String> {
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the signature is NCCL's (nccl.h, stable since 2.0).
                *unsafe { lib.get($name) }.map_err(|e| {
                    format!("NCCL has no {}: {e}", { String::from_utf8_lossy($name) })
                })?
            };
        }
        Ok(Lib {
            version: sym!(b"ncclGetVersion"),
            unique_id: sym!(b"ncclGetUniqueId"),
            init_rank: sym!(b"ncclCommInitRank"),
            destroy: sym!(b"ncclCommDestroy"),
            error_string: sym!(b"ncclGetErrorString"),
            all_reduce: sym!(b"ncclAllReduce"),
            broadcast: sym!(b"ncclBroadcast"),
            all_gather: sym!(b"ncclAllGather"),
            group_start: sym!(b"ncclGroupStart"),
            group_end: sym!(b"ncclGroupEnd"),
            _lib: lib,
        })
    }

    fn check(&self, what: &str, r: c_int) -> std::result::Result<(), String> {
        if r == 0 {
            return Ok(());
        }
        // SAFETY: NCCL returns a static string for every result code.
        let msg = unsafe { CStr::from_ptr((self.error_string)(r)) };
        Err(format!("{what}: {} ({r})", msg.to_string_lossy()))
    }
}

fn cu_check(what: &str, r: cu::CUresult) -> std::result::Result<(), String> {
    if r == cu::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut s: *const c_char = std::ptr::null();
    // SAFETY: cuGetErrorString writes a static string or leaves null.
    unsafe { cu::cuGetErrorString(r, &mut s) };
    let name = if s.is_null() {
        format!("{r:?}")
    } else {
        // SAFETY: a static NUL-terminated string.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    };
    Err(format!("{what}: {name}"))
}

/// `ncclDataType_t`.
fn nccl_dtype(dtype: DType) -> Option<c_int> {
    Some(match dtype {
        DType::I32 => 2,
        DType::U32 => 3,
        DType::F16 => 6,
        DType::F32 => 7,
        _ => return None,
    })
}

/// `ncclRedOp_t`.
fn nccl_op(op: ReduceOp) -> c_int {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Product => 1,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
        ReduceOp::Avg => 4,
    }
}

/// One direction of ordering between the two queues: a timeline semaphore of the Vulkan device
/// imported into CUDA.
struct Link {
    vk: ExportedTimeline,
    cu: cu::CUexternalSemaphore,
    value: u64,
}

/// A segment imported into CUDA.
struct Import {
    memory: cu::CUexternalMemory,
    ptr: cu::CUdeviceptr,
}

struct State {
    ctx: cu::CUcontext,
    stream: cu::CUstream,
    comm: *mut c_void,
    to_cuda: Link,
    from_cuda: Link,
    /// By segment serial.
    imports: HashMap<u64, Import>,
}

/// A NCCL communicator over the process group, with its CUDA stream and the links to kiln's
/// queue.
pub(super) struct Nccl {
    lib: Lib,
    device: Device,
    cu_device: cu::CUdevice,
    state: Mutex<State>,
    /// "NCCL 2.27.3".
    pub name: String,
}

// SAFETY: CUDA and NCCL handles may be used from any thread with the context made current,
// which every use does, under `state`'s mutex.
unsafe impl Send for Nccl {}
unsafe impl Sync for Nccl {}

/// What this rank has before the group agrees: CUDA's side, ready for a communicator.
struct Local {
    lib: Lib,
    cu_device: cu::CUdevice,
    ctx: cu::CUcontext,
    stream: cu::CUstream,
    to_cuda: Link,
    from_cuda: Link,
}

/// An import's result: CUDA owns `fd` once the import succeeds; else it is closed here.
fn imported(what: &str, r: cu::CUresult, fd: c_int) -> std::result::Result<(), String> {
    if r != cu::CUresult::CUDA_SUCCESS {
        // SAFETY: CUDA did not take the descriptor, which nothing else owns.
        drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    }
    cu_check(what, r)
}

fn import_timeline(mut t: ExportedTimeline) -> std::result::Result<Link, String> {
    let fd = t.fd.take().ok_or("the semaphore's descriptor was taken")?;
    // Built whole: the handle type is an enum without a zero value.
    let desc = cu::CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC {
        type_:
            cu::CUexternalSemaphoreHandleType::CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_TIMELINE_SEMAPHORE_FD,
        handle: cu::CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC_st__bindgen_ty_1 {
            fd: fd.into_raw_fd(),
        },
        flags: 0,
        reserved: [0; 16],
    };
    let mut sem = std::ptr::null_mut();
    // SAFETY: a descriptor of an exported Vulkan timeline semaphore.
    let r = unsafe { cu::cuImportExternalSemaphore(&mut sem, &desc) };
    // SAFETY: the descriptor's fd, as `desc` was built.
    imported("cuImportExternalSemaphore", r, unsafe { desc.handle.fd })?;
    Ok(Link {
        vk: t,
        cu: sem,
        value: 0,
    })
}

impl Local {
    /// CUDA's device with `device`'s UUID, its primary context, a stream and the two links.
    fn open(device: &Device) -> std::result::Result<Local, String> {
        let g = device
            .gpu()
            .ok_or_else(|| format!("{} is not a GPU", device.name()))?;
        let uuid = g.with_external(|e| e.uuid).ok_or_else(|| {
            format!(
                "{} has no exportable memory (kiln's own Vulkan device with \
                 VK_KHR_external_memory_fd and VK_KHR_external_semaphore_fd)",
                device.name()
            )
        })?;
        // SAFETY: probing for the library loads nothing else.
        if !unsafe { cu::is_culib_present() } {
            return Err("the CUDA driver (libcuda.so.1) is not installed".into());
        }
        let lib = Lib::open()?;
        // SAFETY: plain CUDA driver calls with valid out-pointers.
        unsafe {
            cu_check("cuInit", cu::cuInit(0))?;
            let mut n = 0;
            cu_check("cuDeviceGetCount", cu::cuDeviceGetCount(&mut n))?;
            let mut found = None;
            for i in 0..n {
                let mut d = 0;
                cu_check("cuDeviceGet", cu::cuDeviceGet(&mut d, i))?;
                let mut id: cu::CUuuid = std::mem::zeroed();
                cu_check("cuDeviceGetUuid", cu::cuDeviceGetUuid(&mut id, d))?;
                if id.bytes.map(|b| b as u8) == uuid {
                    found = Some(d);
                }
            }
            let cu_device =
                found.ok_or_else(|| format!("no CUDA device has the UUID of {}", device.name()))?;
            let mut ctx = std::ptr::null_mut();
            cu_check(
                "cuDevicePrimaryCtxRetain",
                cu::cuDevicePrimaryCtxRetain(&mut ctx, cu_device),
            )?;
            cu_check("cuCtxSetCurrent", cu::cuCtxSetCurrent(ctx))?;
            let mut stream = std::ptr::null_mut();
            cu_check(
                "cuStreamCreate",
                cu::cuStreamCreate(
                    &mut stream,
                    cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                ),
            )?;
            let timeline = || {
                g.with_external(|e| e.exported_timeline())
                    .unwrap_or_else(|| Err("no exportable semaphores".into()))
            };
            let to_cuda = import_timeline(timeline()?)?;
            let from_cuda = import_timeline(timeline()?)?;
            Ok(Local {
                lib,
                cu_device,
                ctx,
                stream,
                to_cuda,
                from_cuda,
            })
        }
    }
}

impl Nccl {
    /// Opens NCCL on every rank or on none (run on the communication thread, all ranks
    /// together). `Ok(Err(why))`: the group stays on MPI, for that reason.
    pub(super) fn open(
        device: &Device,
        tr: &dyn Transport,
        want: Want,
    ) -> Result<std::result::Result<Nccl, String>> {
        let local = if want == Want::Mpi {
            Err("KILN_DIST_BACKEND=mpi".to_string())
        } else {
            Local::open(device)
        };
        let mine = [u8::from(local.is_ok()), 0, 0, 0];
        let mut all = [0u8; 4];
        tr.all_reduce(DType::U32, ReduceOp::Min, &mine, &mut all)?;
        let local = match (local, all[0] == 1) {
            (Ok(l), true) => l,
            (mine_result, _) => {
                let why = match mine_result {
                    Err(e) => e,
                    Ok(_) => "another rank cannot open NCCL".into(),
                };
                if want == Want::Nccl {
                    return Err(Error::Distributed {
                        op: "init_process_group",
                        msg: format!("KILN_DIST_BACKEND=nccl, but rank {}: {why}", tr.rank()),
                    });
                }
                return Ok(Err(why));
            }
        };
        let mut id = [0u8; 128];
        if tr.rank() == 0 {
            // SAFETY: a 128-byte ncclUniqueId.
            local
                .lib
                .check("ncclGetUniqueId", unsafe { (local.lib.unique_id)(&mut id) })
                .map_err(nccl_error("init_process_group"))?;
        }
        tr.broadcast(&mut id, 0)?;
        let mut comm = std::ptr::null_mut();
        let mut version = 0;
        // SAFETY: the context is current on this thread (`Local::open` ran here); every rank
        // calls with the same id and size.
        unsafe {
            cu_check("cuCtxSetCurrent", cu::cuCtxSetCurrent(local.ctx))
                .map_err(nccl_error("init_process_group"))?;
            let r = (local.lib.init_rank)(&mut comm, tr.size() as c_int, id, tr.rank() as c_int);
            local
                .lib
                .check("ncclCommInitRank", r)
                .map_err(nccl_error("init_process_group"))?;
            (local.lib.version)(&mut version);
        }
        let name = format!(
            "NCCL {}.{}.{}",
            version / 10000,
            version / 100 % 100,
            version % 100
        );
        Ok(Ok(Nccl {
            lib: local.lib,
            device: device.clone(),
            cu_device: local.cu_device,
            state: Mutex::new(State {
                ctx: local.ctx,
                stream: local.stream,
                comm,
                to_cuda: local.to_cuda,
                from_cuda: local.from_cuda,
                imports: HashMap::new(),
            }),
            name,
        }))
    }

    /// The state, with its CUDA context current on this thread (every CUDA call needs it;
    /// collectives come from whichever thread runs backward).
    fn state(&self, op: &'static str) -> Result<std::sync::MutexGuard<'_, State>> {
        let st = lock(&self.state);
        // SAFETY: the primary context this communicator retained.
        cu_check("cuCtxSetCurrent", unsafe { cu::cuCtxSetCurrent(st.ctx) })
            .map_err(nccl_error(op))?;
        Ok(st)
    }

    /// Whether `t` can be handed to NCCL as it is: in an exportable segment.
    pub(super) fn is_external(&self, t: &Tensor) -> bool {
        let (Some(g), Some((buffer, _))) = (self.device.gpu(), t.storage.block.gpu_range()) else {
            return false;
        };
        g.with_external(|e| e.serial_of(buffer).is_some())
            .unwrap_or(false)
    }

    /// `t`'s first element as a CUDA address (its segment imported on first use).
    fn address(&self, st: &mut State, t: &Tensor) -> std::result::Result<u64, String> {
        let g = self.device.gpu().ok_or("not a GPU")?;
        let (buffer, at) = t
            .storage
            .block
            .gpu_range()
            .ok_or("the tensor has no GPU memory")?;
        let serial = g
            .with_external(|e| e.serial_of(buffer))
            .flatten()
            .ok_or("the tensor is not in exportable memory")?;
        if !st.imports.contains_key(&serial) {
            self.forget_released(st, g)?;
            let seg = g
                .with_external(|e| e.export(buffer))
                .flatten()
                .ok_or("the segment is gone")??;
            let desc = cu::CUDA_EXTERNAL_MEMORY_HANDLE_DESC {
                type_: cu::CUexternalMemoryHandleType::CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD,
                handle: cu::CUDA_EXTERNAL_MEMORY_HANDLE_DESC_st__bindgen_ty_1 {
                    fd: seg.fd.into_raw_fd(),
                },
                size: seg.bytes,
                flags: cu::CUDA_EXTERNAL_MEMORY_DEDICATED,
                reserved: [0; 16],
            };
            let mut memory = std::ptr::null_mut();
            // SAFETY: a descriptor of a dedicated exportable allocation of `bytes`.
            let r = unsafe { cu::cuImportExternalMemory(&mut memory, &desc) };
            // SAFETY: the descriptor's fd, as `desc` was built.
            imported("cuImportExternalMemory", r, unsafe { desc.handle.fd })?;
            let mut buf: cu::CUDA_EXTERNAL_MEMORY_BUFFER_DESC = unsafe { std::mem::zeroed() };
            buf.size = seg.bytes;
            let mut ptr = 0;
            // SAFETY: the whole imported allocation.
            cu_check("cuExternalMemoryGetMappedBuffer", unsafe {
                cu::cuExternalMemoryGetMappedBuffer(&mut ptr, memory, &buf)
            })?;
            st.imports.insert(serial, Import { memory, ptr });
        }
        let base = st.imports[&serial].ptr;
        Ok(base + at + (t.layout().offset * t.dtype().size_bytes()) as u64)
    }

    /// Destroys the imports of segments the allocator released (after NCCL's stream is idle).
    fn forget_released(
        &self,
        st: &mut State,
        g: &crate::device::gpu::GpuDevice,
    ) -> std::result::Result<(), String> {
        let dead: Vec<u64> = g
            .with_external(|e| {
                st.imports
                    .keys()
                    .copied()
                    .filter(|s| !e.is_live(*s))
                    .collect()
            })
            .unwrap_or_else(|| st.imports.keys().copied().collect());
        if dead.is_empty() {
            return Ok(());
        }
        // SAFETY: the stream is ours; the imports are not used once it is idle.
        unsafe {
            cu_check("cuStreamSynchronize", cu::cuStreamSynchronize(st.stream))?;
            for s in dead {
                if let Some(i) = st.imports.remove(&s) {
                    cu::cuDestroyExternalMemory(i.memory);
                }
            }
        }
        Ok(())
    }

    /// Runs `f(stream, comm)` on NCCL's stream after everything recorded on kiln's stream;
    /// returns the `from_cuda` value that marks it done.
    fn launch(
        &self,
        op: &'static str,
        st: &mut State,
        f: impl FnOnce(&Lib, cu::CUstream, *mut c_void) -> c_int,
    ) -> Result<u64> {
        let g = self.device.gpu().ok_or_else(|| Error::Distributed {
            op,
            msg: "NCCL works on GPU tensors".into(),
        })?;
        st.to_cuda.value += 1;
        let gate = st.to_cuda.value;
        g.signal_when_done(st.to_cuda.vk.semaphore, gate);
        st.from_cuda.value += 1;
        let done = st.from_cuda.value;
        let mut wait: cu::CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS = unsafe { std::mem::zeroed() };
        wait.params.fence.value = gate;
        let mut signal: cu::CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS = unsafe { std::mem::zeroed() };
        signal.params.fence.value = done;
        // SAFETY: the context is current (`state`), the semaphores imported into it, the
        // stream its own.
        unsafe {
            cu_check(
                "cuWaitExternalSemaphoresAsync",
                cu::cuWaitExternalSemaphoresAsync(&st.to_cuda.cu, &wait, 1, st.stream),
            )
            .map_err(nccl_error(op))?;
            self.lib
                .check(op, f(&self.lib, st.stream, st.comm))
                .map_err(nccl_error(op))?;
            cu_check(
                "cuSignalExternalSemaphoresAsync",
                cu::cuSignalExternalSemaphoresAsync(&st.from_cuda.cu, &signal, 1, st.stream),
            )
            .map_err(nccl_error(op))?;
        }
        Ok(done)
    }

    /// What `Work::wait` does: kiln's next submission waits for collective `done`.
    pub(super) fn order_after(&self, done: u64) {
        if let Some(g) = self.device.gpu() {
            let st = lock(&self.state);
            g.wait_before_next(st.from_cuda.vk.semaphore, done);
        }
    }

    fn dtype_of(op: &'static str, t: &Tensor) -> Result<c_int> {
        nccl_dtype(t.dtype()).ok_or(Error::UnsupportedDType {
            op,
            dtype: t.dtype(),
            why: "NCCL collectives take f32, f16, i32 and u32 tensors".into(),
        })
    }

    /// `t = op(t of every rank)` in place; `t` is contiguous and exportable.
    pub(super) fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<u64> {
        let dt = Self::dtype_of("all_reduce", t)?;
        let mut st = self.state("all_reduce")?;
        let ptr = self.address(&mut st, t).map_err(nccl_error("all_reduce"))? as *mut c_void;
        let n = t.numel();
        self.launch("ncclAllReduce", &mut st, |lib, s, comm| {
            // SAFETY: `n` elements of `dt` at `ptr`, in place.
            unsafe { (lib.all_reduce)(ptr, ptr, n, dt, nccl_op(op), comm, s) }
        })
    }

    /// `all_reduce` of several exportable tensors after one gate, as one NCCL group (one
    /// kernel): one hand-off between the two APIs instead of one each (Note [NCCL]).
    pub(super) fn all_reduce_many(&self, ts: &[Tensor], op: ReduceOp) -> Result<u64> {
        let mut st = self.state("all_reduce")?;
        let mut calls = Vec::with_capacity(ts.len());
        for t in ts {
            let dt = Self::dtype_of("all_reduce", t)?;
            let ptr = self.address(&mut st, t).map_err(nccl_error("all_reduce"))? as *mut c_void;
            calls.push((ptr, t.numel(), dt));
        }
        self.launch("ncclAllReduce", &mut st, |lib, s, comm| {
            // SAFETY: each call's `n` elements of `dt` at `ptr`, in place, inside one group.
            unsafe {
                let r = (lib.group_start)();
                if r != 0 {
                    return r;
                }
                for &(ptr, n, dt) in &calls {
                    let r = (lib.all_reduce)(ptr, ptr, n, dt, nccl_op(op), comm, s);
                    if r != 0 {
                        (lib.group_end)();
                        return r;
                    }
                }
                (lib.group_end)()
            }
        })
    }

    /// Root's `t` into every rank's, in place.
    pub(super) fn broadcast(&self, t: &Tensor, root: usize) -> Result<u64> {
        let dt = Self::dtype_of("broadcast", t)?;
        let mut st = self.state("broadcast")?;
        let ptr = self.address(&mut st, t).map_err(nccl_error("broadcast"))? as *mut c_void;
        let n = t.numel();
        self.launch("ncclBroadcast", &mut st, |lib, s, comm| {
            // SAFETY: `n` elements of `dt` at `ptr`, in place.
            unsafe { (lib.broadcast)(ptr, ptr, n, dt, root as c_int, comm, s) }
        })
    }

    /// Every rank's `send`, in rank order, into `recv` (world times as long).
    pub(super) fn all_gather(&self, send: &Tensor, recv: &Tensor) -> Result<u64> {
        let dt = Self::dtype_of("all_gather", send)?;
        let mut st = self.state("all_gather")?;
        let s_ptr = self
            .address(&mut st, send)
            .map_err(nccl_error("all_gather"))?;
        let r_ptr = self
            .address(&mut st, recv)
            .map_err(nccl_error("all_gather"))?;
        let n = send.numel();
        self.launch("ncclAllGather", &mut st, |lib, s, comm| {
            // SAFETY: `n` elements at `s_ptr`, `n * world` at `r_ptr`.
            unsafe { (lib.all_gather)(s_ptr as _, r_ptr as _, n, dt, comm, s) }
        })
    }
}

fn nccl_error(op: &'static str) -> impl Fn(String) -> Error {
    move |msg| Error::Distributed { op, msg }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        // kiln's queue first (its submissions signal and wait on the links), then NCCL's.
        let _ = self.device.synchronize();
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        // SAFETY: everything queued on both sides is done; nothing uses these handles after.
        unsafe {
            cu::cuCtxSetCurrent(st.ctx);
            cu::cuStreamSynchronize(st.stream);
            for (_, i) in st.imports.drain() {
                cu::cuDestroyExternalMemory(i.memory);
            }
            cu::cuDestroyExternalSemaphore(st.to_cuda.cu);
            cu::cuDestroyExternalSemaphore(st.from_cuda.cu);
            (self.lib.destroy)(st.comm);
            cu::cuStreamDestroy_v2(st.stream);
            cu::cuDevicePrimaryCtxRelease_v2(self.cu_device);
        }
    }
}
