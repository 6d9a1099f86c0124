//! kiln's profiler (PyTorch's `torch.profiler`): `profile(options, || ...)` records every scope
//! (kiln's ops, backward ops, modules, optimizer steps and the user's `record_function` scopes)
//! with its CPU time and input shapes, every kernel and copy with its GPU time (timestamp
//! queries inside passes and encoders; where the adapter has none, CPU times only and the table
//! says so), and every allocation and free of the profiled devices. `key_averages().table()`
//! prints PyTorch's table; `export_chrome_trace` writes a trace Perfetto and chrome://tracing
//! load.
//!
//! Memory events come from the devices' allocator history: an ongoing `record_memory_history`
//! is read and left running; otherwise profiling turns it on and, at the end, off.

mod memory;
mod report;

pub use memory::{peak_by_category, MemoryRecord, MemoryTimeline};
pub use report::{Averages, KeyAverages};

use crate::alloc::{push_scope, HistoryContext, HistoryEnabled, HistoryStacks, ScopeGuard};
use crate::alloc::{ScopeRecord, TraceAction};
use crate::device::{Device, KernelEntry};
use std::time::Instant;

/// A named scope until dropped (`with record_function("## forward ##"):`). The frame records
/// the caller's file and line.
#[must_use = "the scope ends when the guard drops"]
pub struct RecordFunction {
    _scope: ScopeGuard,
}

impl RecordFunction {
    /// Opens a scope named `name` until the guard is dropped (`torch.profiler.record_function`).
    #[track_caller]
    pub fn new(name: &str) -> RecordFunction {
        let at = std::panic::Location::caller();
        RecordFunction {
            _scope: push_scope(name, at.file(), at.line()),
        }
    }
}

/// Runs `f` inside the scope `name`: allocations carry it as a frame in memory history, and the
/// profiler shows it as a range.
#[track_caller]
pub fn record_function<R>(name: &str, f: impl FnOnce() -> R) -> R {
    let _scope = RecordFunction::new(name);
    f()
}

/// What to profile.
#[derive(Clone, Debug, Default)]
pub struct ProfileOptions {
    /// Devices whose kernels, copies and allocations are recorded (PyTorch's
    /// `activities=[CUDA]`); scopes are always recorded.
    pub devices: Vec<Device>,
    /// Record allocations and frees (`profile_memory=True`).
    pub profile_memory: bool,
}

/// What an event is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// kiln's op, backward op, module or optimizer scope.
    Scope,
    /// The user's `record_function` scope.
    UserScope,
    /// A compute kernel.
    Kernel,
    /// A copy between buffers or with host memory.
    Copy,
    /// An allocation (`bytes > 0`) or free (`bytes < 0`).
    Memory,
}

/// One recorded event, with what is attributed to it.
#[derive(Clone, Debug)]
pub struct ProfEvent {
    /// The scope's, kernel's or copy's name.
    pub name: String,
    /// What it is.
    pub kind: EventKind,
    /// Index into `Profile::devices` (kernels, copies, memory).
    pub device: Option<usize>,
    /// The host thread.
    pub thread: u64,
    /// Microseconds since the profile started.
    pub cpu_start_us: f64,
    /// CPU time from its start to its end, in microseconds.
    pub cpu_dur_us: f64,
    /// GPU start on the CPU's time axis (aligned so no kernel starts before its launch).
    pub gpu_start_us: Option<f64>,
    /// CPU time outside its child scopes.
    pub self_cpu_us: f64,
    /// GPU time of its own kernels.
    pub self_gpu_us: f64,
    /// GPU time of its kernels and its children's.
    pub gpu_total_us: f64,
    /// Host memory allocated in it, children excluded.
    pub self_cpu_mem: i64,
    /// Host memory allocated in it.
    pub cpu_mem: i64,
    /// Device memory allocated in it, children excluded.
    pub self_gpu_mem: i64,
    /// Device memory allocated in it.
    pub gpu_mem: i64,
    /// Bytes copied (copies) or allocated / freed (memory).
    pub bytes: i64,
    /// Input shapes (op scopes).
    pub shapes: String,
}

impl ProfEvent {
    fn new(name: String, kind: EventKind, thread: u64, start: f64, dur: f64) -> ProfEvent {
        ProfEvent {
            name,
            kind,
            device: None,
            thread,
            cpu_start_us: start,
            cpu_dur_us: dur,
            gpu_start_us: None,
            self_cpu_us: dur,
            self_gpu_us: 0.0,
            gpu_total_us: 0.0,
            self_cpu_mem: 0,
            cpu_mem: 0,
            self_gpu_mem: 0,
            gpu_mem: 0,
            bytes: 0,
            shapes: String::new(),
        }
    }
}

/// The result of `profile`.
pub struct Profile {
    /// Every event, in order of their start.
    pub events: Vec<ProfEvent>,
    /// Names of the profiled devices.
    pub devices: Vec<String>,
    /// Whether kernel GPU times were measured (timestamp queries inside passes).
    pub gpu_measured: bool,
    /// Memory by category (`profile_memory`), in time order per device: `memory_timeline`.
    pub memory: Vec<MemoryRecord>,
}

/// Runs `f` under the profiler.
pub fn profile<R>(
    options: &ProfileOptions,
    f: impl FnOnce() -> crate::Result<R>,
) -> crate::Result<(R, Profile)> {
    let recording: Vec<bool> = options
        .devices
        .iter()
        .map(Device::is_recording_memory_history)
        .collect();
    for (d, &was) in options.devices.iter().zip(&recording) {
        d.synchronize()?;
        if let Some(g) = d.gpu() {
            g.start_kernel_timer();
        }
        if options.profile_memory && !was {
            d.record_memory_history(
                Some(HistoryEnabled::All),
                HistoryContext::None,
                HistoryStacks::Kiln,
                1 << 22,
            );
        }
    }
    let t0_unix = crate::alloc::now_us() as f64;
    // What each device holds as profiling starts (PyTorch's pre-existing allocations).
    let start_blocks: Vec<_> = options
        .devices
        .iter()
        .map(|d| match options.profile_memory {
            true => memory::live_blocks(&d.memory_snapshot()),
            false => Default::default(),
        })
        .collect();
    let t0 = Instant::now();
    let thread = crate::alloc::thread_number();
    crate::alloc::start_scope_log();
    let result = f();
    let scopes = crate::alloc::take_scope_log();
    let end = Instant::now();
    let mut kernels: Vec<(usize, KernelEntry)> = Vec::new();
    let mut memory: Vec<(usize, f64, i64)> = Vec::new();
    let mut categorised: Vec<MemoryRecord> = Vec::new();
    let mut gpu_measured = false;
    for (i, d) in options.devices.iter().enumerate() {
        if let Some(g) = d.gpu() {
            let (entries, measured) = g.take_kernel_times()?;
            gpu_measured |= measured && !entries.is_empty();
            kernels.extend(entries.into_iter().map(|e| (i, e)));
        }
        if options.profile_memory {
            let snap = d.memory_snapshot();
            categorised.extend(memory::records(i, &start_blocks[i], t0_unix as i64, &snap));
            for e in snap.device_traces.iter().flatten() {
                let bytes = match e.action {
                    TraceAction::Alloc => e.size as i64,
                    TraceAction::FreeCompleted => -(e.size as i64),
                    _ => continue,
                };
                let t = e.time_us as f64 - t0_unix;
                if t >= 0.0 {
                    memory.push((i, t, bytes));
                }
            }
            if !recording[i] {
                d.record_memory_history(None, HistoryContext::None, HistoryStacks::Kiln, 0);
            }
        }
    }
    let r = result?;
    let us = |t: Instant| t.saturating_duration_since(t0).as_secs_f64() * 1e6;
    let mut profile = build(
        options,
        &scopes,
        &kernels,
        &memory,
        (us, us(end), thread),
        gpu_measured,
    );
    profile.memory = categorised;
    Ok((r, profile))
}

/// Events with times, then attribution: each kernel, copy and memory event to the innermost
/// scope open on its thread at that time; scope totals bottom-up.
fn build(
    options: &ProfileOptions,
    scopes: &[ScopeRecord],
    kernels: &[(usize, KernelEntry)],
    memory: &[(usize, f64, i64)],
    (us, end_us, main_thread): (impl Fn(Instant) -> f64, f64, u64),
    gpu_measured: bool,
) -> Profile {
    let mut events: Vec<ProfEvent> = Vec::new();
    for s in scopes {
        let kind = if s.filename.starts_with("kiln") {
            EventKind::Scope
        } else {
            EventKind::UserScope
        };
        let start = us(s.start);
        let dur = s.end.map_or(end_us, &us) - start;
        let mut e = ProfEvent::new(s.name.clone(), kind, s.thread, start, dur.max(0.0));
        e.shapes = s.shapes.clone();
        events.push(e);
    }
    let n_scopes = events.len();
    // GPU clocks to the CPU axis, per device: no kernel may start before its launch.
    let mut offset = vec![f64::NEG_INFINITY; options.devices.len()];
    for (d, k) in kernels {
        if let Some((a, _)) = k.gpu_ns {
            offset[*d] = offset[*d].max(us(k.cpu_start) - a / 1e3);
        }
    }
    for (d, k) in kernels {
        let kind = if k.is_copy {
            EventKind::Copy
        } else {
            EventKind::Kernel
        };
        let start = us(k.cpu_start);
        let mut e = ProfEvent::new(k.name.clone(), kind, k.thread, start, us(k.cpu_end) - start);
        e.device = Some(*d);
        e.bytes = k.bytes as i64;
        if let Some((a, b)) = k.gpu_ns {
            e.gpu_start_us = Some(a / 1e3 + offset[*d]);
            e.self_gpu_us = (b - a) / 1e3;
            e.gpu_total_us = e.self_gpu_us;
        }
        events.push(e);
    }
    for &(d, t, bytes) in memory {
        let name = if bytes >= 0 {
            "[memory] alloc"
        } else {
            "[memory] free"
        };
        let mut e = ProfEvent::new(name.into(), EventKind::Memory, main_thread, t, 0.0);
        e.device = Some(d);
        e.bytes = bytes;
        events.push(e);
    }
    // Sweep each thread's timeline: scopes open and close, point events land in the innermost.
    let mut parent: Vec<Option<usize>> = vec![None; events.len()];
    let mut threads: Vec<u64> = events.iter().map(|e| e.thread).collect();
    threads.sort_unstable();
    threads.dedup();
    for th in threads {
        // (time, order, index): closes before opens at equal times, opens before points.
        let mut marks: Vec<(f64, u8, usize)> = Vec::new();
        for (i, e) in events.iter().enumerate().filter(|(_, e)| e.thread == th) {
            if i < n_scopes {
                marks.push((e.cpu_start_us, 1, i));
                marks.push((e.cpu_start_us + e.cpu_dur_us, 0, i));
            } else {
                marks.push((e.cpu_start_us, 2, i));
            }
        }
        marks.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut open: Vec<usize> = Vec::new();
        for (_, kind, i) in marks {
            match kind {
                1 => {
                    parent[i] = open.last().copied();
                    open.push(i);
                }
                0 => {
                    if let Some(p) = open.iter().rposition(|&o| o == i) {
                        open.remove(p);
                    }
                }
                _ => parent[i] = open.last().copied(),
            }
        }
    }
    let is_cpu = |d: Option<usize>| d.is_some_and(|d| options.devices[d].is_cpu());
    // Direct contributions, then totals bottom-up (children start after their parents).
    for i in n_scopes..events.len() {
        let Some(p) = parent[i] else { continue };
        let (kind, gpu, bytes, dev, cpu) = {
            let e = &events[i];
            (e.kind, e.self_gpu_us, e.bytes, e.device, e.cpu_dur_us)
        };
        let pe = &mut events[p];
        match kind {
            EventKind::Memory if is_cpu(dev) => pe.self_cpu_mem += bytes,
            EventKind::Memory => pe.self_gpu_mem += bytes,
            _ => {
                pe.self_gpu_us += gpu;
                pe.self_cpu_us -= cpu;
            }
        }
    }
    for e in events.iter_mut().take(n_scopes) {
        e.gpu_total_us = e.self_gpu_us;
        e.cpu_mem = e.self_cpu_mem;
        e.gpu_mem = e.self_gpu_mem;
    }
    let mut order: Vec<usize> = (0..n_scopes).collect();
    order.sort_by(|&a, &b| events[b].cpu_start_us.total_cmp(&events[a].cpu_start_us));
    for i in order {
        if let Some(p) = parent[i] {
            let (dur, gpu, cm, gm) = {
                let e = &events[i];
                (e.cpu_dur_us, e.gpu_total_us, e.cpu_mem, e.gpu_mem)
            };
            let pe = &mut events[p];
            pe.self_cpu_us -= dur;
            pe.gpu_total_us += gpu;
            pe.cpu_mem += cm;
            pe.gpu_mem += gm;
        }
    }
    for e in &mut events {
        e.self_cpu_us = e.self_cpu_us.max(0.0);
    }
    Profile {
        events,
        devices: options
            .devices
            .iter()
            .map(|d| d.spec().to_string())
            .collect(),
        gpu_measured,
        memory: Vec::new(),
    }
}
