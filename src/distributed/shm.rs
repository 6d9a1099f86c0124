//! The same-host all-reduce (cargo feature `mpi`): when every rank runs on one host, ranks
//! reduce through an MPI-3 shared-memory window instead of MPI's point-to-point copies.
//!
//! Note [Shared-memory all-reduce]: Open MPI's same-host transports moved a 76 MiB all-reduce
//! at 1.6-2.8 GB/s on the two-H200 machine (vader with or without CMA, the ring algorithm, TCP),
//! which made the all-reduce the whole of a DDP step (`docs/lab/data-parallel.md`): its copies go
//! through small fragments on one thread. Here each rank allocates a region in one window
//! (`MPI_Win_allocate_shared`), which every rank of the host maps. A piece of the buffer is cut
//! into one segment per rank, and takes two barriers:
//!   1. each rank copies the segments the other ranks own into its region's input area;
//!      barrier;
//!   2. rank r reduces segment r, in rank order, from its own buffer and every other rank's
//!      input area, into its result and its region's output area; barrier;
//!   3. each rank copies the other ranks' segments from their output areas into its result.
//!
//! That is 5 - 2/size bytes of host memory traffic per byte reduced (4 for two ranks; copying
//! the whole piece in and summing it whole took 5). Every byte is reduced once, by one rank, so
//! every rank ends with the same bits (what DDP's replicas need). Pieces alternate between two
//! slots of each region: piece k + 2 overwrites slot k % 2 only after the barriers of piece
//! k + 1, by which every rank has finished reading piece k. Each step runs on `threads`
//! threads of this process (`Pool`), so that the copies use the host's memory bandwidth, not
//! one core's. MPI itself is called on the communication thread only (barriers and
//! `MPI_Win_sync`, the memory fence MPI's shared-memory model asks for around them).
//!
//! The reduction follows what the MPI path computes: f32, i32 and u32 in their own arithmetic
//! (integers wrap), f16 rounded to f16 after each partial result as NCCL does, min and max
//! propagating NaN, and `Avg` the f32 (or f16) sum times the f32 of 1/size.

use super::ReduceOp;
use crate::tensor::DType;
use crate::{Error, Result};
use half::f16;
use mpi::ffi;
use std::cell::Cell;
use std::os::raw::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// Segments start on cache lines, so that two ranks never write one line.
const ALIGN: usize = 64;

/// `KILN_DIST_SHM=0` turns the shared-memory path off (MPI's own all-reduce then runs).
pub(super) fn enabled() -> bool {
    std::env::var("KILN_DIST_SHM").map_or(true, |v| v.trim() != "0")
}

/// Threads per rank: the host's cores shared among its ranks, less two for the rank's own
/// threads (the caller's, the driver's), at most 8; or `KILN_DIST_THREADS`. Threads that spin
/// while another rank's are descheduled slow both: on the 16-core H100 machine, 8 threads a
/// rank for two ranks gave 20-31 ms for 76 MiB from one run to the next.
fn threads(local_size: usize) -> usize {
    let env = std::env::var("KILN_DIST_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    env.unwrap_or((cores / local_size.max(1)).saturating_sub(2).min(8))
        .max(1)
}

fn mpi_error(what: &str, code: i32) -> Error {
    Error::Distributed {
        op: "init_process_group",
        msg: format!("{what} failed (MPI error {code})"),
    }
}

pub(super) struct ShmReduce {
    /// The host's communicator (every rank of the group), owned by the transport.
    comm: ffi::MPI_Comm,
    win: ffi::MPI_Win,
    /// Each rank's region: two slots of `2 * cap` bytes, an input area then an output area.
    regions: Vec<usize>,
    cap: usize,
    rank: usize,
    size: usize,
    /// Pieces reduced so far: picks the slot.
    pieces: Cell<u64>,
    pool: Pool,
}

impl ShmReduce {
    /// Collective over `comm` (every rank of the host calls it): allocates the window.
    ///
    /// # Safety
    /// `comm` is a valid communicator that outlives the returned value; MPI is initialised and
    /// called on this thread only.
    pub(super) unsafe fn new(comm: ffi::MPI_Comm, rank: usize, size: usize) -> Result<ShmReduce> {
        let cap: usize = 8 << 20;
        let mut base: *mut u8 = std::ptr::null_mut();
        let mut win: ffi::MPI_Win = ffi::RSMPI_WIN_NULL;
        let code = ffi::MPI_Win_allocate_shared(
            (4 * cap) as ffi::MPI_Aint,
            1,
            ffi::RSMPI_INFO_NULL,
            comm,
            &mut base as *mut *mut u8 as *mut c_void,
            &mut win,
        );
        if code != 0 {
            return Err(mpi_error("MPI_Win_allocate_shared", code));
        }
        let mut regions = Vec::with_capacity(size);
        for r in 0..size {
            let (mut bytes, mut unit, mut ptr): (ffi::MPI_Aint, i32, *mut u8) =
                (0, 0, std::ptr::null_mut());
            let code = ffi::MPI_Win_shared_query(
                win,
                r as i32,
                &mut bytes,
                &mut unit,
                &mut ptr as *mut *mut u8 as *mut c_void,
            );
            if code != 0 || ptr.is_null() || (bytes as usize) < 4 * cap {
                ffi::MPI_Win_free(&mut win);
                return Err(mpi_error("MPI_Win_shared_query", code));
            }
            regions.push(ptr as usize);
        }
        // One passive epoch for the window's life: `MPI_Win_sync` then orders this process's
        // loads and stores with the barriers.
        ffi::MPI_Win_lock_all(ffi::MPI_MODE_NOCHECK as i32, win);
        Ok(ShmReduce {
            comm,
            win,
            regions,
            cap,
            rank,
            size,
            pieces: Cell::new(0),
            pool: Pool::new(threads(size)),
        })
    }

    pub(super) fn threads(&self) -> usize {
        self.pool.threads()
    }

    fn barrier(&self) {
        // SAFETY: the window and communicator live as long as `self`; this is the MPI thread.
        unsafe {
            ffi::MPI_Win_sync(self.win);
            ffi::MPI_Barrier(self.comm);
            ffi::MPI_Win_sync(self.win);
        }
    }

    /// `recv = op(every rank's send)`; `send` and `recv` are as long, whole elements of `dtype`.
    pub(super) fn all_reduce(
        &self,
        dtype: DType,
        op: ReduceOp,
        send: &[u8],
        recv: &mut [u8],
    ) -> Result<()> {
        let e = dtype.size_bytes();
        if !matches!(dtype, DType::F32 | DType::F16 | DType::I32 | DType::U32)
            || send.len() != recv.len()
            || !send.len().is_multiple_of(e)
        {
            return Err(Error::Distributed {
                op: "all_reduce",
                msg: format!(
                    "the shared-memory all-reduce takes f32, f16, i32 and u32 buffers of one \
                     length (got {dtype}, {} and {} bytes)",
                    send.len(),
                    recv.len()
                ),
            });
        }
        let (send_at, recv_at) = (send.as_ptr() as usize, recv.as_mut_ptr() as usize);
        let (regions, cap, rank, size) = (&self.regions, self.cap, self.rank, self.size);
        let threads = self.pool.threads();
        let mut at = 0;
        while at < send.len() {
            let p = (send.len() - at).min(cap);
            let slot = (self.pieces.get() % 2) as usize * 2 * cap;
            self.pieces.set(self.pieces.get() + 1);
            let input = |r: usize| regions[r] + slot;
            let output = |r: usize| regions[r] + slot + cap;
            // Segment r of the piece: [r q, (r + 1) q) clipped to the piece.
            let q = p.div_ceil(size).next_multiple_of(ALIGN);
            let segment = |r: usize| ((r * q).min(p), ((r + 1) * q).min(p));
            // Thread t's share of every segment but this rank's: `copy(r, a, b)` for each.
            let others = |t: usize, copy: &dyn Fn(usize, usize, usize)| {
                for r in (0..size).filter(|&r| r != rank) {
                    let (s0, s1) = segment(r);
                    let (a, b) = part(s1 - s0, threads, t);
                    copy(r, s0 + a, b - a);
                }
            };

            // 1. The segments the other ranks reduce, into this rank's input area.
            self.pool.run(&|t| {
                others(t, &|_, a, len| {
                    // SAFETY: [a, a + len) lies in the piece, in `send` and in this rank's
                    // input area (`p <= cap`); no other thread or rank writes it now.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            (send_at + at + a) as *const u8,
                            (input(rank) + a) as *mut u8,
                            len,
                        )
                    }
                })
            });
            self.barrier();
            // 2. This rank's segment, from its own buffer and every other rank's input area,
            // into its output area (for the others) and its result.
            let (s0, s1) = segment(rank);
            self.pool.run(&|t| {
                let (a, b) = part(s1 - s0, threads, t);
                let a = s0 + a;
                let ins: Vec<*const u8> = (0..size)
                    .map(|r| match r == rank {
                        true => (send_at + at + a) as *const u8,
                        false => (input(r) + a) as *const u8,
                    })
                    .collect();
                // SAFETY: every input area is complete (barrier) and unwritten until two
                // barriers later; [a, s0 + b) of this rank's output area and of the result is
                // this thread's alone.
                unsafe {
                    let outs = [(output(rank) + a) as *mut u8, (recv_at + at + a) as *mut u8];
                    reduce(dtype, op, &ins, outs, s0 + b - a)
                }
            });
            self.barrier();
            // 3. The other ranks' segments, from their output areas into the result.
            self.pool.run(&|t| {
                others(t, &|r, a, len| {
                    // SAFETY: rank r finished its segment before the barrier and does not
                    // write its output area again until the next piece's first barrier has
                    // passed, and then into the other slot; [a, a + len) of the result is
                    // this thread's alone.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            (output(r) + a) as *const u8,
                            (recv_at + at + a) as *mut u8,
                            len,
                        )
                    }
                })
            });
            at += p;
        }
        Ok(())
    }
}

impl Drop for ShmReduce {
    fn drop(&mut self) {
        // SAFETY: collective, as the group's teardown is on every rank; this is the MPI thread.
        unsafe {
            ffi::MPI_Win_unlock_all(self.win);
            ffi::MPI_Win_free(&mut self.win);
        }
    }
}

/// Thread `t`'s share of `len` bytes among `threads`: cache-line multiples, the last one ragged.
fn part(len: usize, threads: usize, t: usize) -> (usize, usize) {
    let share = len.div_ceil(threads).next_multiple_of(ALIGN);
    ((t * share).min(len), ((t + 1) * share).min(len))
}

/// Elements reduced at a time: the block of the result stays in the L1 cache while every
/// input passes over it.
const BLOCK: usize = 1024;

/// `out[i] = op(ins[0][i], ..., ins[n-1][i])` over `bytes` bytes, in rank order, into both
/// `outs` (each block is computed in the first and copied to the second while in cache: the
/// second may be write-combined pinned memory, which must not be read back).
///
/// # Safety
/// Each of `ins` and `outs` points to `bytes` readable (writable) bytes, aligned for `dtype`.
unsafe fn reduce(dtype: DType, op: ReduceOp, ins: &[*const u8], outs: [*mut u8; 2], bytes: usize) {
    // One input per rank: `Avg` multiplies by the f32 of 1/size.
    let inv = (1.0 / ins.len() as f64) as f32;
    // Each arm is its own instance of `blocks`, so the operation inlines and the loop
    // vectorises (a function pointer per element would not).
    macro_rules! arms {
        ($t:ty, $sum:expr, $mul:expr, $min:expr, $max:expr, $avg:expr) => {
            match op {
                ReduceOp::Sum => blocks::<$t>(ins, outs, bytes, $sum, |a| a),
                ReduceOp::Avg => blocks::<$t>(ins, outs, bytes, $sum, $avg),
                ReduceOp::Product => blocks::<$t>(ins, outs, bytes, $mul, |a| a),
                ReduceOp::Min => blocks::<$t>(ins, outs, bytes, $min, |a| a),
                ReduceOp::Max => blocks::<$t>(ins, outs, bytes, $max, |a| a),
            }
        };
    }
    macro_rules! ints {
        ($t:ty) => {
            arms!(
                $t,
                <$t>::wrapping_add,
                <$t>::wrapping_mul,
                std::cmp::min,
                std::cmp::max,
                |a| a
            )
        };
    }
    let h = |x: u16| f16::from_bits(x).to_f32();
    let b = |x: f32| f16::from_f32(x).to_bits();
    match dtype {
        DType::F32 => arms!(
            f32,
            |a, b| a + b,
            |a, b| a * b,
            |a: f32, b| if a.is_nan() || a < b { a } else { b },
            |a: f32, b| if a.is_nan() || a > b { a } else { b },
            |a| a * inv
        ),
        DType::F16 => arms!(
            u16,
            |x, y| b(h(x) + h(y)),
            |x, y| b(h(x) * h(y)),
            |x, y| if h(x).is_nan() || h(x) < h(y) { x } else { y },
            |x, y| if h(x).is_nan() || h(x) > h(y) { x } else { y },
            |x| b(h(x) * inv)
        ),
        DType::I32 => ints!(i32),
        DType::U32 => ints!(u32),
        _ => {}
    }
}

/// # Safety
/// As `reduce`'s, with `T` the element type.
unsafe fn blocks<T: Copy>(
    ins: &[*const u8],
    [out, copy]: [*mut u8; 2],
    bytes: usize,
    f: impl Fn(T, T) -> T,
    fin: impl Fn(T) -> T,
) {
    let n = bytes / std::mem::size_of::<T>();
    let out = std::slice::from_raw_parts_mut(out as *mut T, n);
    let copy = std::slice::from_raw_parts_mut(copy as *mut T, n);
    let ins: Vec<&[T]> = ins
        .iter()
        .map(|&p| std::slice::from_raw_parts(p as *const T, n))
        .collect();
    for (b, o) in out.chunks_mut(BLOCK).enumerate() {
        let at = b * BLOCK;
        match ins.as_slice() {
            [x, y] => {
                for ((o, x), y) in o.iter_mut().zip(&x[at..]).zip(&y[at..]) {
                    *o = fin(f(*x, *y));
                }
            }
            [first, rest @ ..] => {
                o.copy_from_slice(&first[at..at + o.len()]);
                for x in rest {
                    for (o, x) in o.iter_mut().zip(&x[at..]) {
                        *o = f(*o, *x);
                    }
                }
                for o in o.iter_mut() {
                    *o = fin(*o);
                }
            }
            [] => {}
        }
        copy[at..at + o.len()].copy_from_slice(o);
    }
}

/// A fork-join pool of `threads - 1` workers plus the caller: `run(job)` calls `job(t)` for
/// every `t` in `0..threads` (the caller takes 0) and returns when all have returned. Workers
/// spin briefly for the next job before they sleep, since a collective hands them three jobs
/// per piece, microseconds apart. (Not `device::transfer::par_copy`, which spawns its threads
/// for each copy: tens of microseconds, three times a piece.)
struct Pool {
    shared: Arc<PoolShared>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

#[derive(Clone, Copy)]
struct JobPtr(*const (dyn Fn(usize) + Sync));
// SAFETY: the job is `Sync`, and `run` keeps it alive until every worker is done with it.
unsafe impl Send for JobPtr {}

struct PoolShared {
    /// Bumped once per job; workers compare it with the last one they ran.
    generation: AtomicU64,
    /// Workers still running the current job.
    left: AtomicU64,
    quit: AtomicBool,
    job: Mutex<Option<JobPtr>>,
    wake: Condvar,
}

impl Pool {
    fn new(threads: usize) -> Pool {
        let shared = Arc::new(PoolShared {
            generation: AtomicU64::new(0),
            left: AtomicU64::new(0),
            quit: AtomicBool::new(false),
            job: Mutex::new(None),
            wake: Condvar::new(),
        });
        let workers = (1..threads)
            .filter_map(|t| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("kiln-shm-{t}"))
                    .spawn(move || worker(&shared, t))
                    .ok()
            })
            .collect();
        Pool { shared, workers }
    }

    fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    fn run(&self, job: &(dyn Fn(usize) + Sync)) {
        if self.workers.is_empty() {
            return job(0);
        }
        // SAFETY: only the lifetime is erased; this function does not return before every
        // worker has finished with the job (`left` back to zero).
        let ptr = JobPtr(unsafe {
            std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static (dyn Fn(usize) + Sync)>(job)
        });
        let s = &*self.shared;
        {
            let mut slot = crate::base::lock(&s.job);
            *slot = Some(ptr);
            s.left.store(self.workers.len() as u64, Ordering::Release);
            s.generation.fetch_add(1, Ordering::AcqRel);
            s.wake.notify_all();
        }
        let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(0)));
        while s.left.load(Ordering::Acquire) != 0 {
            std::hint::spin_loop();
        }
        *crate::base::lock(&s.job) = None;
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
    }
}

fn worker(s: &PoolShared, t: usize) {
    let mut seen = 0u64;
    loop {
        // Spin a little (some microseconds) for the next job, then sleep on the condition
        // variable: a collective's jobs come microseconds apart, and a spinning thread takes a
        // core from the other ranks.
        let mut spins = 0u32;
        while s.generation.load(Ordering::Acquire) == seen && !s.quit.load(Ordering::Acquire) {
            if spins < 2_000 {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            let slot = crate::base::lock(&s.job);
            if s.generation.load(Ordering::Acquire) == seen && !s.quit.load(Ordering::Acquire) {
                drop(s.wake.wait(slot));
            }
        }
        if s.quit.load(Ordering::Acquire) {
            return;
        }
        seen = s.generation.load(Ordering::Acquire);
        let job = *crate::base::lock(&s.job);
        if let Some(job) = job {
            // SAFETY: `run` keeps the job alive until `left` reaches zero. A panic is caught
            // so that `run` is not left waiting; the caller's own share reports the bug.
            let _ =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { (*job.0)(t) }));
        }
        s.left.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.quit.store(true, Ordering::Release);
        {
            let _slot = crate::base::lock(&self.shared.job);
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}
