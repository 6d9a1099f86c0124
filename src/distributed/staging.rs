//! How tensors reach the transport. A GPU tensor travels through kiln's pinned pool in chunks:
//! device to pinned memory, the transport on the pinned memory, pinned memory to device, the
//! copies of one chunk overlapping the exchange of another (see Note [Receive blocks]; on the
//! device's side queue where it has one, Note [Side queue] in `device/side_queue.rs`). Never
//! through pageable memory. CPU tensors lend their own memory.

// Note [Receive blocks]
// ~~~~~~~~~~~~~~~~~~~~~
// kiln has one in-order stream, and the communication thread queues a chunk's upload (pinned
// to device) when its exchange is done: behind everything the main thread has recorded by
// then. Under DDP that is the rest of the backward pass, which the host records far ahead of
// the GPU (ResNet-50: the whole backward recorded in 4 ms, run in 33). The receive side once
// went round `SLOTS` blocks, so the fourth chunk of a bucket waited for the first chunk's
// upload to finish before the host could write the block again: for the whole backward. On
// two H200s every bucket after the first waited 31-33 ms that way and no exchange overlapped
// the backward (ResNet-50 at 2 ranks: all-reduce added 13.4 ms a step against a bare
// all-reduce of 8.6). Each chunk now receives into a block of its own; the host allocator
// takes it back only once its upload's event completes (PyTorch's `record_event` rule), so
// the host never waits on an upload, and a steady loop finds the blocks in its cache. The
// send side has no such wait: its downloads are queued in order as the data is produced
// (`prefetch`), or, without a prefetch, by a caller that waits for the collective.

use crate::device::Device;
use crate::host::PinnedKind;
use crate::ops::SideCopy;
use crate::tensor::{DType, Tensor};
use crate::Result;
use std::time::{Duration, Instant};

/// Bytes per chunk (`KILN_DIST_CHUNK_MB` overrides it): large enough that a copy's fixed cost (a
/// submission, a map) and MPI's per-call cost are small beside it, small enough that three in
/// flight stay a few MiB of pinned memory.
fn chunk_bytes() -> usize {
    static BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| {
        std::env::var("KILN_DIST_CHUNK_MB")
            .ok()
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|mb| mb.is_finite() && *mb >= 0.0625)
            .map_or(4 << 20, |mb| {
                ((mb * (1 << 20) as f64) as usize).next_multiple_of(4)
            })
    })
}
const SLOTS: usize = 3;

/// `KILN_DIST_PROFILE=1`: each staged collective, and each DDP bucket and backward's end,
/// prints where its time went and when (stderr).
pub(super) fn profiling() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("KILN_DIST_PROFILE").is_ok_and(|v| v == "1"))
}

/// Milliseconds since the first call in this process: the profile's clock.
pub(super) fn clock_ms() -> f64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_secs_f64() * 1e3
}

/// What moves through one collective: `src` (flat, contiguous; `None` where this rank sends
/// nothing, as a broadcast's receivers) goes to the host; `exchange(send, recv)` fills `recv`,
/// `parts` pieces as long as the chunk; piece `i` lands in `dsts[i]` (flat, contiguous, as long
/// as the tensor). Every tensor is on `device` with `dtype`.
pub(super) struct Staged<'a> {
    pub device: &'a Device,
    pub dtype: DType,
    pub numel: usize,
    pub src: Option<&'a Tensor>,
    /// `src` already on its way to pinned memory (`prefetch`: one `Download` block per chunk,
    /// each copy queued by the caller): chunks are read from them instead of copied here, and
    /// with a side queue's gate the uploads go there too.
    pub prefetched: Option<Prefetched>,
    pub dsts: &'a [Tensor],
    pub parts: usize,
}

/// The chunks of `numel` elements of `dtype`: (start, length).
fn chunks(numel: usize, dtype: DType) -> Vec<(usize, usize)> {
    let ce = (chunk_bytes() / dtype.size_bytes()).min(numel).max(1);
    (0..numel)
        .step_by(ce)
        .map(|a| (a, (numel - a).min(ce)))
        .collect()
}

/// A tensor on its way to pinned memory (`prefetch`): one `Download` block per chunk, each
/// with its side-queue copy to wait for where the device has a side queue, and the gate every
/// later copy of the same collective waits for (Note [Side queue]).
pub(crate) struct Prefetched {
    /// (copy, block): the copy first, so that it is waited for (in its drop, at worst) before
    /// its block is freed.
    chunks: Vec<(Option<SideCopy>, Tensor)>,
    gate: Option<u64>,
}

/// Queues `dst.copy_(src)` between a GPU tensor and pinned memory: on the side queue after
/// `gate` where there is one and the copy can go there (its copy comes back, to be waited for
/// before either tensor is touched), else non-blocking on the stream.
fn queue_copy(dst: &Tensor, src: &Tensor, gate: Option<u64>) -> Result<Option<SideCopy>> {
    let side = match gate {
        Some(gate) => dst.copy_side_(src, gate)?,
        None => None,
    };
    if side.is_none() {
        dst.copy_non_blocking_(src)?;
    }
    Ok(side)
}

/// Queues the copy of a whole GPU tensor into new pinned `Download` blocks now, on the
/// caller's thread, so that it runs right after the kernels queued before it: a copy that the
/// communication thread queued later would wait behind everything queued since (one in-order
/// queue), e.g. the rest of a backward pass. One block per chunk, each copy its own
/// submission: the exchange of the first chunk starts when that chunk has landed, not the
/// whole tensor (the host maps a block only when every copy into it is done). Where the device
/// has a side queue the copies run there, beside the kernels, after a gate taken here.
pub(super) fn prefetch(src: &Tensor) -> Result<Option<Prefetched>> {
    if src.device().is_cpu() || src.numel() == 0 {
        return Ok(None);
    }
    let gate = Tensor::side_gate(src.device());
    let chunks = chunks(src.numel(), src.dtype())
        .into_iter()
        .map(|(a, l)| {
            let block =
                Tensor::empty_pinned(&[l], src.dtype(), src.device(), PinnedKind::Download)?;
            Ok((queue_copy(&block, &src.narrow(0, a, l)?, gate)?, block))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Some(Prefetched { chunks, gate }))
}

impl Staged<'_> {
    pub fn run(self, exchange: impl FnMut(&[u8], &mut [u8]) -> Result<()>) -> Result<()> {
        if self.numel == 0 {
            return Ok(());
        }
        if self.device.is_cpu() {
            self.run_host(exchange)
        } else {
            self.run_pinned(exchange)
        }
    }

    fn run_host(&self, mut exchange: impl FnMut(&[u8], &mut [u8]) -> Result<()>) -> Result<()> {
        let send = match self.src {
            Some(s) => s.to_le_bytes()?,
            None => Vec::new(),
        };
        let piece = self.numel * self.dtype.size_bytes();
        let mut recv = vec![0u8; self.parts * piece];
        exchange(&send, &mut recv)?;
        for (d, part) in self.dsts.iter().zip(recv.chunks_exact(piece)) {
            d.with_host_bytes_mut(|bytes| bytes.copy_from_slice(part))?;
        }
        Ok(())
    }

    fn run_pinned(self, mut exchange: impl FnMut(&[u8], &mut [u8]) -> Result<()>) -> Result<()> {
        let chunks = chunks(self.numel, self.dtype);
        let ce = chunks[0].1;
        let slots = SLOTS.min(chunks.len());
        let pinned = |n: usize, kind| Tensor::empty_pinned(&[n], self.dtype, self.device, kind);
        let (mut sent, gate) = match self.prefetched {
            Some(p) => (Some(p.chunks), p.gate),
            None => (None, None),
        };
        let prefetched = sent.is_some();
        let down = match (self.src, prefetched) {
            (Some(_), false) => (0..slots)
                .map(|_| pinned(ce, PinnedKind::Download))
                .collect::<Result<Vec<_>>>()?,
            _ => Vec::new(),
        };
        // Queues chunk c's copy to the host (non-blocking: the GPU runs it in order with the
        // work queued before, the host waits only when it reads the chunk).
        let fetch = |c: usize| -> Result<()> {
            if let (Some(src), false) = (self.src, prefetched) {
                let (a, l) = chunks[c];
                down[c % slots]
                    .narrow(0, 0, l)?
                    .copy_non_blocking_(&src.narrow(0, a, l)?)?;
            }
            Ok(())
        };
        let start = Instant::now();
        let began = clock_ms();
        let mut times = [Duration::ZERO; 3];
        // Uploads on the side queue, with their blocks: waited for before this returns, so
        // that the collective is complete for its caller (and the blocks free to reuse).
        let mut uploads = Vec::new();
        (0..slots).try_for_each(fetch)?;
        for (c, &(a, l)) in chunks.iter().enumerate() {
            let slot = c % slots;
            // Each chunk is received into a block of its own, not one of `SLOTS` blocks in
            // turn: a block's upload is queued behind everything recorded so far, the rest of
            // a backward pass included, and reusing the block would make the host wait for all
            // of it (see Note [Receive blocks]). The host allocator hands the block back once
            // its upload's event has completed, so in a steady loop the blocks come from its
            // cache.
            let recv = pinned(self.parts * l, PinnedKind::Upload)?;
            let t0 = Instant::now();
            let mut exchange = |s: &[u8], r: &mut [u8]| {
                let t1 = Instant::now();
                times[0] += t1 - t0;
                let done = exchange(s, r);
                times[1] += t1.elapsed();
                done
            };
            match self.src {
                Some(_) => {
                    let send = match sent.as_mut() {
                        Some(p) => {
                            let (copy, block) = &mut p[c];
                            if let Some(copy) = copy.take() {
                                copy.wait()?;
                            }
                            block.clone()
                        }
                        None => down[slot].narrow(0, 0, l)?,
                    };
                    send.with_host_bytes(|s| recv.with_host_bytes_mut(|r| exchange(s, r))?)?
                }
                None => recv.with_host_bytes_mut(|r| exchange(&[], r))??,
            }
            let t2 = Instant::now();
            for (i, d) in self.dsts.iter().enumerate() {
                let part = recv.narrow(0, i * l, l)?;
                if let Some(copy) = queue_copy(&d.narrow(0, a, l)?, &part, gate)? {
                    // The block stays alive until its copy has been waited for.
                    uploads.push((copy, recv.clone()));
                }
            }
            if c + slots < chunks.len() {
                fetch(c + slots)?;
            }
            times[2] += t2.elapsed();
        }
        let t3 = Instant::now();
        for (copy, _block) in uploads {
            copy.wait()?;
        }
        times[0] += t3.elapsed();
        if profiling() {
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            eprintln!(
                "kiln distributed: at {began:.1} ms: {} bytes in {} chunks: {:.2} ms (waiting for \
                 copies {:.2}, exchange {:.2}, queueing copies {:.2})",
                self.numel * self.dtype.size_bytes(),
                chunks.len(),
                ms(start.elapsed()),
                ms(times[0]),
                ms(times[1]),
                ms(times[2])
            );
        }
        Ok(())
    }
}
