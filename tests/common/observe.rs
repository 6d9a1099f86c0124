//! What tests observe of a run besides its values: the allocator statistics it leaves and the
//! kernels it launches (the fused-backward and product tests compare both with the kernels a
//! fusion replaces). Each test file takes what it needs.
#![allow(dead_code)]

use kiln::Device;
use std::collections::BTreeMap;

/// The allocator's statistics of allocations and bytes from `before` to `after` (peaks as they
/// are: the caller resets them at `before`; reserved memory and segments left out, the cache
/// decides those).
pub fn allocation_delta(
    before: &BTreeMap<String, i64>,
    after: &BTreeMap<String, i64>,
) -> Vec<(String, i64)> {
    after
        .iter()
        .filter(|(key, _)| key.starts_with("allocation") || key.contains("bytes"))
        .filter(|(key, _)| !key.contains("reserved") && !key.contains("segment"))
        .map(|(key, v)| {
            let base = if key.ends_with(".peak") {
                0
            } else {
                before[key]
            };
            (key.clone(), v - base)
        })
        .collect()
}

/// What one run of `work` does to `dev`'s allocator statistics (`allocation_delta`), after a
/// first run has warmed the cache.
pub fn stats_delta<T>(dev: &Device, mut work: impl FnMut() -> T) -> (T, Vec<(String, i64)>) {
    work();
    dev.synchronize().unwrap();
    let before = dev.memory_stats();
    dev.reset_peak_memory_stats();
    let out = work();
    dev.synchronize().unwrap();
    (out, allocation_delta(&before, &dev.memory_stats()))
}

/// The profiler's trace of `work` on `dev` (which kernels ran).
pub fn kernel_trace<T>(dev: &Device, work: impl FnOnce() -> kiln::Result<T>) -> String {
    let options = kiln::profiler::ProfileOptions {
        devices: vec![dev.clone()],
        profile_memory: false,
    };
    let (_, prof) = kiln::profiler::profile(&options, || {
        work()?;
        dev.synchronize()
    })
    .unwrap();
    prof.chrome_trace_json()
}
