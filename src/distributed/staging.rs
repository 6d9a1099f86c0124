//! How tensors reach the transport. A GPU tensor travels through kiln's pinned pool in chunks:
//! device to pinned memory, the transport on the pinned memory, pinned memory to device, with
//! `SLOTS` chunks in flight so that the copies of one chunk overlap the exchange of another.
//! Never through pageable memory. CPU tensors lend their own memory.

use crate::device::Device;
use crate::host::PinnedKind;
use crate::tensor::{DType, Tensor};
use crate::Result;

/// Bytes per chunk: large enough that a copy's fixed cost (a submission, a map) is small beside
/// it, small enough that three in flight stay a few MiB of pinned memory.
pub(super) const CHUNK_BYTES: usize = 4 << 20;
const SLOTS: usize = 3;

/// What moves through one collective: `src` (flat, contiguous; `None` where this rank sends
/// nothing, as a broadcast's receivers) goes to the host; `exchange(send, recv)` fills `recv`,
/// `parts` pieces as long as the chunk; piece `i` lands in `dsts[i]` (flat, contiguous, as long
/// as the tensor). Every tensor is on `device` with `dtype`.
pub(super) struct Staged<'a> {
    pub device: &'a Device,
    pub dtype: DType,
    pub numel: usize,
    pub src: Option<&'a Tensor>,
    pub dsts: &'a [Tensor],
    pub parts: usize,
}

impl Staged<'_> {
    pub fn run(&self, exchange: impl FnMut(&[u8], &mut [u8]) -> Result<()>) -> Result<()> {
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

    fn run_pinned(&self, mut exchange: impl FnMut(&[u8], &mut [u8]) -> Result<()>) -> Result<()> {
        let ce = (CHUNK_BYTES / self.dtype.size_bytes()).min(self.numel);
        let chunks: Vec<(usize, usize)> = (0..self.numel)
            .step_by(ce)
            .map(|a| (a, (self.numel - a).min(ce)))
            .collect();
        let slots = SLOTS.min(chunks.len());
        let pinned = |n: usize, kind| Tensor::empty_pinned(&[n], self.dtype, self.device, kind);
        let down = match self.src {
            Some(_) => (0..slots)
                .map(|_| pinned(ce, PinnedKind::Download))
                .collect::<Result<Vec<_>>>()?,
            None => Vec::new(),
        };
        let up = (0..slots)
            .map(|_| pinned(self.parts * ce, PinnedKind::Upload))
            .collect::<Result<Vec<_>>>()?;
        // Queues chunk c's copy to the host (non-blocking: the GPU runs it in order with the
        // work queued before, the host waits only when it reads the chunk).
        let fetch = |c: usize| -> Result<()> {
            if let Some(src) = self.src {
                let (a, l) = chunks[c];
                down[c % slots]
                    .narrow(0, 0, l)?
                    .copy_non_blocking_(&src.narrow(0, a, l)?)?;
            }
            Ok(())
        };
        (0..slots).try_for_each(fetch)?;
        for (c, &(a, l)) in chunks.iter().enumerate() {
            let slot = c % slots;
            // Host access waits for this slot's copies in flight (its last upload included).
            let recv = up[slot].narrow(0, 0, self.parts * l)?;
            match self.src {
                Some(_) => {
                    let send = down[slot].narrow(0, 0, l)?;
                    send.with_host_bytes(|s| recv.with_host_bytes_mut(|r| exchange(s, r))?)?
                }
                None => recv.with_host_bytes_mut(|r| exchange(&[], r))??,
            }
            for (i, d) in self.dsts.iter().enumerate() {
                d.narrow(0, a, l)?
                    .copy_non_blocking_(&recv.narrow(0, i * l, l)?)?;
            }
            if c + slots < chunks.len() {
                fetch(c + slots)?;
            }
        }
        Ok(())
    }
}
