//! kiln's virtual address space for segments. wgpu buffers have no device addresses, yet
//! PyTorch's policy orders free blocks by address and snapshots report addresses, so each
//! segment gets a range here: the lowest free range that fits, as a driver's allocator would.

use std::collections::BTreeMap;

/// Where the first segment starts: a CUDA-like address, so snapshots read familiarly.
const BASE: u64 = 0x7f00_0000_0000;
/// Segments are multiples of 2 MiB; ranges are kept at that granularity.
const GRANULE: u64 = 2 * 1024 * 1024;

#[derive(Debug)]
pub(crate) struct VaSpace {
    /// Free ranges below `top`: start -> length.
    free: BTreeMap<u64, u64>,
    top: u64,
}

impl VaSpace {
    pub fn new() -> Self {
        VaSpace {
            free: BTreeMap::new(),
            top: BASE,
        }
    }

    /// Reserves `size` bytes at the lowest free address.
    pub fn reserve(&mut self, size: u64) -> u64 {
        let size = size.div_ceil(GRANULE) * GRANULE;
        let fit = self
            .free
            .iter()
            .find(|(_, &len)| len >= size)
            .map(|(&a, &l)| (a, l));
        if let Some((start, len)) = fit {
            self.free.remove(&start);
            if len > size {
                self.free.insert(start + size, len - size);
            }
            return start;
        }
        let start = self.top;
        self.top += size;
        start
    }

    /// Returns a range, merging it with free neighbours (and with the top).
    pub fn release(&mut self, start: u64, size: u64) {
        let (mut start, mut size) = (start, size.div_ceil(GRANULE) * GRANULE);
        if let Some((&prev, &len)) = self.free.range(..start).next_back() {
            if prev + len == start {
                self.free.remove(&prev);
                start = prev;
                size += len;
            }
        }
        if let Some(&len) = self.free.get(&(start + size)) {
            self.free.remove(&(start + size));
            size += len;
        }
        if start + size == self.top {
            self.top = start;
        } else {
            self.free.insert(start, size);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_lowest_fitting_range_and_coalesces() {
        let mut va = VaSpace::new();
        let a = va.reserve(GRANULE);
        let b = va.reserve(10 * GRANULE);
        let c = va.reserve(GRANULE);
        assert_eq!((b - a, c - b), (GRANULE, 10 * GRANULE));
        va.release(b, 10 * GRANULE);
        assert_eq!(va.reserve(2 * GRANULE), b);
        va.release(a, GRANULE);
        va.release(b, 2 * GRANULE);
        assert_eq!(va.reserve(11 * GRANULE), a);
        va.release(a, 11 * GRANULE);
        va.release(c, GRANULE);
        assert_eq!(va.reserve(GRANULE), BASE);
    }
}
