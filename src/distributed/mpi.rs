//! The MPI transport (cargo feature `mpi`): the `mpi` crate over the system's MPI library
//! (Open MPI on Debian). Initialised with `MPI_THREAD_FUNNELED` on the communication thread,
//! which is the only thread that ever calls MPI, and finalised there when the group goes.
//!
//! MPI reduces f32, i32 and u32 with its own operations. It has no half type (MPI 4.1 has
//! none; `MPIX_C_FLOAT16` is an Open MPI 5 extension), so f16 travels as 16-bit words reduced
//! by kiln's user operations below, which round each partial result to f16 as NCCL does.

use super::comm::Transport;
use super::shm::{self, ShmReduce};
use super::ReduceOp;
use crate::tensor::DType;
use crate::{Error, Result};
use half::f16;
use mpi::collective::{SystemOperation, UnsafeUserOperation};
use mpi::environment::Universe;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::*;
use mpi::Threading;
use std::os::raw::{c_int, c_void};

pub(super) struct MpiTransport {
    world: SimpleCommunicator,
    local_rank: usize,
    /// The same-host all-reduce (`shm.rs`), where every rank runs on this host. Dropped before
    /// `node`, whose window it frees.
    shm: Option<ShmReduce>,
    /// The ranks of this host: kept only so that its handle outlives `shm`'s use of it.
    _node: SimpleCommunicator,
    /// f16 sum, product, min, max.
    half_ops: [UnsafeUserOperation; 4],
    /// Dropped last: finalises MPI.
    _universe: Universe,
}

/// Applies `f` to each pair of f16 words: `inout[i] = f(in[i], inout[i])`.
///
/// # Safety
/// MPI passes `len` elements of 16-bit words in both vectors.
unsafe fn half_op(a: *mut c_void, b: *mut c_void, len: *mut c_int, f: fn(f32, f32) -> f32) {
    let n = *len as usize;
    let a = std::slice::from_raw_parts(a as *const u16, n);
    let b = std::slice::from_raw_parts_mut(b as *mut u16, n);
    for (x, y) in a.iter().zip(b.iter_mut()) {
        let r = f(f16::from_bits(*x).to_f32(), f16::from_bits(*y).to_f32());
        *y = f16::from_f32(r).to_bits();
    }
}

unsafe extern "C" fn half_sum(
    a: *mut c_void,
    b: *mut c_void,
    n: *mut c_int,
    _: *mut mpi::ffi::MPI_Datatype,
) {
    half_op(a, b, n, |x, y| x + y)
}
unsafe extern "C" fn half_prod(
    a: *mut c_void,
    b: *mut c_void,
    n: *mut c_int,
    _: *mut mpi::ffi::MPI_Datatype,
) {
    half_op(a, b, n, |x, y| x * y)
}
unsafe extern "C" fn half_min(
    a: *mut c_void,
    b: *mut c_void,
    n: *mut c_int,
    _: *mut mpi::ffi::MPI_Datatype,
) {
    half_op(a, b, n, |x, y| if x.is_nan() || x < y { x } else { y })
}
unsafe extern "C" fn half_max(
    a: *mut c_void,
    b: *mut c_void,
    n: *mut c_int,
    _: *mut mpi::ffi::MPI_Datatype,
) {
    half_op(a, b, n, |x, y| if x.is_nan() || x > y { x } else { y })
}

/// Multiplies host elements by `factor` (an average's division).
fn scale_host(dtype: DType, bytes: &mut [u8], factor: f64) {
    match dtype {
        DType::F32 => {
            for x in bytes.chunks_exact_mut(4) {
                let v = f32::from_le_bytes([x[0], x[1], x[2], x[3]]) * factor as f32;
                x.copy_from_slice(&v.to_le_bytes());
            }
        }
        DType::F16 => {
            for x in bytes.chunks_exact_mut(2) {
                let v = half::f16::from_le_bytes([x[0], x[1]]).to_f32() * factor as f32;
                x.copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
            }
        }
        _ => {}
    }
}

fn system_op(op: ReduceOp) -> SystemOperation {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => SystemOperation::sum(),
        ReduceOp::Product => SystemOperation::product(),
        ReduceOp::Min => SystemOperation::min(),
        ReduceOp::Max => SystemOperation::max(),
    }
}

fn cast<T: bytemuck::Pod>(bytes: &[u8]) -> Result<&[T]> {
    bytemuck::try_cast_slice(bytes).map_err(|e| misaligned(e, bytes.len()))
}

fn cast_mut<T: bytemuck::Pod>(bytes: &mut [u8]) -> Result<&mut [T]> {
    let n = bytes.len();
    bytemuck::try_cast_slice_mut(bytes).map_err(|e| misaligned(e, n))
}

fn misaligned(e: bytemuck::PodCastError, len: usize) -> Error {
    Error::Distributed {
        op: "all_reduce",
        msg: format!("a {len}-byte buffer does not hold whole aligned elements: {e:?}"),
    }
}

impl MpiTransport {
    /// Initialises MPI; an error if it already was (one group per process, as in PyTorch).
    pub(super) fn init() -> Result<MpiTransport> {
        let Some((universe, _provided)) = mpi::initialize_with_threading(Threading::Funneled)
        else {
            return Err(Error::Distributed {
                op: "init_process_group",
                msg: "MPI is already initialised in this process (one process group per \
                      process; a destroyed group cannot be initialised again)"
                    .into(),
            });
        };
        let world = universe.world();
        let node = world.split_shared(world.rank());
        let local_rank = node.rank() as usize;
        let shm = if shm::enabled() && node.size() == world.size() && world.size() > 1 {
            // SAFETY: `node` is valid and outlives `shm` (field order); MPI runs on this
            // thread alone. Every rank takes this branch alike (same size, same environment).
            Some(unsafe { ShmReduce::new(node.as_raw(), local_rank, node.size() as usize)? })
        } else {
            None
        };
        // SAFETY: the functions read and write `len` 16-bit words, which is what the f16
        // collectives below pass them (MPI_UINT16_T buffers).
        let half_ops = unsafe {
            [
                UnsafeUserOperation::commutative(half_sum),
                UnsafeUserOperation::commutative(half_prod),
                UnsafeUserOperation::commutative(half_min),
                UnsafeUserOperation::commutative(half_max),
            ]
        };
        Ok(MpiTransport {
            world,
            local_rank,
            shm,
            _node: node,
            half_ops,
            _universe: universe,
        })
    }
}

impl Transport for MpiTransport {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    fn size(&self) -> usize {
        self.world.size() as usize
    }

    fn local_rank(&self) -> usize {
        self.local_rank
    }

    fn all_reduce(&self, dtype: DType, op: ReduceOp, send: &[u8], recv: &mut [u8]) -> Result<()> {
        if let Some(shm) = &self.shm {
            return shm.all_reduce(dtype, op, send, recv);
        }
        // MPI works on the pinned mapping itself. Copying to heap memory first was no faster on
        // the H100 machine: five times slower with fresh pages per chunk, the same (1.4-1.8
        // GB/s) with persistent buffers; MPI's shared-memory transport is the bound there.
        self.all_reduce_mapped(dtype, op, send, recv)?;
        if op == ReduceOp::Avg {
            scale_host(dtype, recv, 1.0 / self.world.size() as f64);
        }
        Ok(())
    }

    fn broadcast(&self, buf: &mut [u8], root: usize) -> Result<()> {
        self.world.process_at_rank(root as i32).broadcast_into(buf);
        Ok(())
    }

    fn all_gather(&self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        self.world.all_gather_into(send, recv);
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        self.world.barrier();
        Ok(())
    }

    fn name(&self) -> String {
        let v = mpi::environment::library_version().unwrap_or_default();
        let first = v.split([',', '\n']).next().unwrap_or("").trim();
        match &self.shm {
            Some(s) => format!(
                "MPI ({first}), all-reduce through shared memory ({} threads a rank)",
                s.threads()
            ),
            None => format!("MPI ({first})"),
        }
    }
}

impl MpiTransport {
    fn all_reduce_mapped(
        &self,
        dtype: DType,
        op: ReduceOp,
        send: &[u8],
        recv: &mut [u8],
    ) -> Result<()> {
        let w = &self.world;
        match dtype {
            DType::F32 => {
                w.all_reduce_into(cast::<f32>(send)?, cast_mut::<f32>(recv)?, system_op(op))
            }
            DType::I32 => {
                w.all_reduce_into(cast::<i32>(send)?, cast_mut::<i32>(recv)?, system_op(op))
            }
            DType::U32 => {
                w.all_reduce_into(cast::<u32>(send)?, cast_mut::<u32>(recv)?, system_op(op))
            }
            DType::F16 => {
                let f = &self.half_ops[match op {
                    ReduceOp::Sum | ReduceOp::Avg => 0,
                    ReduceOp::Product => 1,
                    ReduceOp::Min => 2,
                    ReduceOp::Max => 3,
                }];
                w.all_reduce_into(cast::<u16>(send)?, cast_mut::<u16>(recv)?, f)
            }
            other => {
                return Err(Error::UnsupportedDType {
                    op: "all_reduce",
                    dtype: other,
                    why: "MPI reduces f32, f16, i32 and u32 tensors".into(),
                })
            }
        }
        Ok(())
    }
}
