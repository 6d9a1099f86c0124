//! What the tests that compare a fused backward with the kernels it replaces look at: the
//! allocator statistics one run leaves, and the kernels a run launches.

use kiln::Device;

/// What one run of `work` does to `dev`'s allocator statistics, after a first run has warmed
/// the cache: the change of every allocation and active/allocated/requested byte counter, and
/// the peaks of the second run (reserved memory and segments left out: the cache decides those).
pub fn stats_delta<T>(dev: &Device, mut work: impl FnMut() -> T) -> (T, Vec<(String, i64)>) {
    work();
    dev.synchronize().unwrap();
    let before = dev.memory_stats();
    dev.reset_peak_memory_stats();
    let out = work();
    dev.synchronize().unwrap();
    let after = dev.memory_stats();
    let delta = after
        .iter()
        .filter(|(k, _)| k.starts_with("allocation") || k.contains("bytes"))
        .filter(|(k, _)| !k.contains("reserved") && !k.contains("segment"))
        .map(|(k, v)| {
            let base = if k.ends_with(".peak") { 0 } else { before[k] };
            (k.clone(), v - base)
        })
        .collect();
    (out, delta)
}

/// The profiler's chrome trace of `work` on `dev` (kernel names among its events).
pub fn trace_of<T>(dev: &Device, work: impl FnOnce() -> T) -> String {
    let options = kiln::profiler::ProfileOptions {
        devices: vec![dev.clone()],
        profile_memory: false,
    };
    let (_, prof) = kiln::profiler::profile(&options, || {
        work();
        dev.synchronize()
    })
    .unwrap();
    prof.chrome_trace_json()
}
