//! Host staging memory: the policy of PyTorch's `CachingHostAllocator`, knowing nothing of wgpu.
//! The GPU device plugs in a source of mapped staging buffers (`device/pinned.rs`); the tests a
//! simulated one.

mod caching;

pub use caching::{
    CachingHostAllocator, DurationStat, HostBlock, HostStats, PinnedKind, PinnedSource,
    SimulatedPinnedSource,
};
