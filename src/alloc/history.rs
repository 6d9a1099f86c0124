//! Memory history: `record_memory_history`'s settings, the bounded ring of trace entries, and
//! the allocation context (frames) that callers attach through a thread-local scope stack.

use serde::Serialize;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Allocators recording history with frames, process-wide: while none is, kiln's op and module
/// scopes cost one atomic load.
static RECORDING: AtomicUsize = AtomicUsize::new(0);

/// Whether `kiln::debug::track_tensors` is on: every tensor made then notes its frames. The flag
/// lives here, below the tensor layer that reads it and the debug tools that set it.
static TENSOR_TRACKING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub(crate) fn set_tensor_tracking(on: bool) {
    TENSOR_TRACKING.store(on, Ordering::Relaxed);
}

pub(crate) fn tensor_tracking() -> bool {
    TENSOR_TRACKING.load(Ordering::Relaxed)
}

/// Whether any device records allocation frames.
pub fn frames_wanted() -> bool {
    RECORDING.load(Ordering::Relaxed) > 0
        || TENSOR_TRACKING.load(Ordering::Relaxed)
        || SCOPE_LOG_ON.load(Ordering::Relaxed)
}

/// The scope log the profiler reads: every scope pushed while it is on, with its thread and
/// wall-clock span.
static SCOPE_LOG_ON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static SCOPE_LOG: std::sync::Mutex<Vec<ScopeRecord>> = std::sync::Mutex::new(Vec::new());

/// One logged scope.
#[derive(Clone, Debug)]
pub struct ScopeRecord {
    /// The scope's name (an op, a module, an optimizer step or a `record_function` label).
    pub name: String,
    /// The source file that opened it.
    pub filename: String,
    /// The line that opened it.
    pub line: u32,
    /// The thread it ran on.
    pub thread: u64,
    /// How many scopes enclosed it.
    pub depth: usize,
    /// When it opened.
    pub start: std::time::Instant,
    /// When it closed; `None` while open.
    pub end: Option<std::time::Instant>,
    /// Input shapes, for op scopes (`annotate_scope`).
    pub shapes: String,
}

fn scope_log() -> std::sync::MutexGuard<'static, Vec<ScopeRecord>> {
    crate::base::lock(&SCOPE_LOG)
}

/// Starts logging scopes (clearing the log).
pub fn start_scope_log() {
    scope_log().clear();
    SCOPE_LOG_ON.store(true, Ordering::Relaxed);
}

/// Stops logging and returns the log.
pub fn take_scope_log() -> Vec<ScopeRecord> {
    SCOPE_LOG_ON.store(false, Ordering::Relaxed);
    std::mem::take(&mut *scope_log())
}

/// Attaches the input shapes to this thread's innermost logged scope (ops call it).
pub fn annotate_scope(shapes: impl FnOnce() -> String) {
    if !SCOPE_LOG_ON.load(Ordering::Relaxed) {
        return;
    }
    if let Some(i) = OPEN_LOGGED.with(|o| o.borrow().last().copied()) {
        if let Some(r) = scope_log().get_mut(i) {
            r.shapes = shapes();
        }
    }
}

/// A small number per thread, for traces.
pub fn thread_number() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    thread_local! {
        static ID: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    ID.with(|i| *i)
}

/// kiln's frames of this thread now (innermost first), without a Rust backtrace.
pub fn current_kiln_frames() -> Frames {
    current_frames(HistoryStacks::Kiln)
}

/// One frame of where an allocation came from: kiln's op or scope, or a Rust frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Frame {
    /// The file of the frame (kiln's op scopes name their source file).
    pub filename: String,
    /// The line in `filename`.
    pub line: u32,
    /// The function, op or scope name.
    pub name: String,
}

/// The frames of one allocation, shared between its block and its trace entries.
pub type Frames = Arc<Vec<Frame>>;

/// `enabled` of `record_memory_history`: `None` stops recording and clears the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HistoryEnabled {
    /// Keep frames of live blocks only (the ring holds at most one entry, as in PyTorch).
    State,
    /// Also keep the alloc/free trace in a ring of `max_entries`.
    All,
}

/// `context` of `record_memory_history`: which events carry frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum HistoryContext {
    /// No frames.
    None,
    /// Frames of live allocations (shown in snapshots).
    State,
    /// Also on alloc trace entries.
    Alloc,
    /// Also capture the frames at free time.
    All,
}

/// `stacks` of `record_memory_history`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HistoryStacks {
    /// kiln's frames only: ops, modules and the user's named scopes (PyTorch's "python").
    Kiln,
    /// Plus the Rust backtrace (slow: symbolised at capture).
    All,
}

/// What a trace entry records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceAction {
    /// A block handed out.
    Alloc,
    /// A free asked for while work may still use the block (`record_stream`).
    FreeRequested,
    /// A block returned to its pool.
    FreeCompleted,
    /// A new segment reserved from the device.
    SegmentAlloc,
    /// A segment given back to the device.
    SegmentFree,
    /// Expandable segments: pages mapped into / unmapped from a reserved range.
    SegmentMap,
    /// Pages unmapped from an expandable segment.
    SegmentUnmap,
    /// An allocation that ran out of memory.
    Oom,
    /// A snapshot was taken.
    Snapshot,
}

/// One entry of `device_traces`, with PyTorch's keys.
#[derive(Clone, Debug, Serialize)]
pub struct TraceEntry {
    /// What happened.
    pub action: TraceAction,
    /// Absent for `oom`, which carries `device_free` instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addr: Option<u64>,
    /// Free device memory at an `oom`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_free: Option<u64>,
    /// Bytes of the block, segment or mapping.
    pub size: u64,
    /// The stream (kiln: the device's one queue, 0).
    pub stream: u64,
    /// Microseconds since the Unix epoch.
    pub time_us: u64,
    /// PyTorch's compile context; kiln has none and writes an empty string.
    pub compile_context: &'static str,
    /// PyTorch's user metadata string; empty in kiln.
    pub user_metadata: String,
    /// Where the allocation came from, when `record_memory_history` captures frames.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "ser_frames")]
    pub frames: Option<Frames>,
    /// kiln's: what the block held, on `alloc` (as allocated) and on the frees (as it ended).
    /// Not in PyTorch's snapshot files.
    #[serde(skip)]
    pub category: super::category::MemoryCategory,
}

fn ser_frames<S: serde::Serializer>(f: &Option<Frames>, s: S) -> Result<S::Ok, S::Error> {
    match f {
        Some(v) => v.as_slice().serialize(s),
        None => s.serialize_none(),
    }
}

/// The recorder's state inside the allocator.
#[derive(Debug)]
pub(crate) struct History {
    pub enabled: Option<HistoryEnabled>,
    pub context: HistoryContext,
    pub stacks: HistoryStacks,
    pub max_entries: usize,
    pub ring: VecDeque<TraceEntry>,
}

impl Default for History {
    fn default() -> Self {
        History {
            enabled: None,
            context: HistoryContext::None,
            stacks: HistoryStacks::Kiln,
            max_entries: 0,
            ring: VecDeque::new(),
        }
    }
}

impl Drop for History {
    fn drop(&mut self) {
        if self.wants_frames() {
            RECORDING.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Microseconds since the Unix epoch, the clock of trace entries.
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

impl History {
    /// Whether this recorder wants frames (for the process-wide count).
    pub fn wants_frames(&self) -> bool {
        self.enabled.is_some() && self.context != HistoryContext::None
    }

    /// Replaces the recorder, keeping the process-wide count of frame-recording allocators
    /// (the old one leaves the count when dropped).
    pub fn replace(&mut self, new: History) {
        if new.wants_frames() {
            RECORDING.fetch_add(1, Ordering::Relaxed);
        }
        *self = new;
    }

    /// Frames to keep on a block at allocation time, if recording wants them.
    pub fn gather(&self) -> Option<Frames> {
        if self.enabled.is_none() || self.context == HistoryContext::None {
            return None;
        }
        Some(current_frames(self.stacks))
    }

    pub fn record(&mut self, mut entry: TraceEntry) {
        if self.enabled != Some(HistoryEnabled::All) || self.max_entries == 0 {
            return;
        }
        let keep_frames = match entry.action {
            TraceAction::Alloc | TraceAction::SegmentAlloc => self.context >= HistoryContext::Alloc,
            TraceAction::FreeRequested | TraceAction::FreeCompleted => {
                if self.context == HistoryContext::All {
                    entry.frames = Some(current_frames(self.stacks));
                }
                self.context >= HistoryContext::Alloc
            }
            _ => false,
        };
        if !keep_frames {
            entry.frames = None;
        }
        if self.ring.len() == self.max_entries {
            self.ring.pop_front();
        }
        self.ring.push_back(entry);
    }
}

thread_local! {
    static SCOPES: RefCell<Vec<Frame>> = const { RefCell::new(Vec::new()) };
    static OPEN_LOGGED: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// Pops its frame from this thread's allocation context when dropped.
pub struct ScopeGuard {
    logged: Option<usize>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for ScopeGuard {
    fn drop(&mut self) {
        SCOPES.with(|s| s.borrow_mut().pop());
        if let Some(i) = self.logged {
            OPEN_LOGGED.with(|o| o.borrow_mut().pop());
            if let Some(r) = scope_log().get_mut(i) {
                r.end = Some(std::time::Instant::now());
            }
        }
    }
}

/// Pushes a named frame (an op, a module path, a user scope) onto this thread's allocation
/// context until the guard drops. Allocations made meanwhile carry it when history is recorded.
#[must_use = "the scope ends when the guard drops"]
pub fn push_scope(name: impl Into<String>, filename: impl Into<String>, line: u32) -> ScopeGuard {
    let frame = Frame {
        filename: filename.into(),
        line,
        name: name.into(),
    };
    let logged = SCOPE_LOG_ON.load(Ordering::Relaxed).then(|| {
        let depth = OPEN_LOGGED.with(|o| o.borrow().len());
        let mut log = scope_log();
        log.push(ScopeRecord {
            name: frame.name.clone(),
            filename: frame.filename.clone(),
            line,
            thread: thread_number(),
            depth,
            start: std::time::Instant::now(),
            end: None,
            shapes: String::new(),
        });
        let i = log.len() - 1;
        OPEN_LOGGED.with(|o| o.borrow_mut().push(i));
        i
    });
    SCOPES.with(|s| s.borrow_mut().push(frame));
    ScopeGuard {
        logged,
        _not_send: std::marker::PhantomData,
    }
}

/// A frame for kiln's own op, module or optimizer scope, only while some device records frames.
pub fn kiln_scope(name: impl FnOnce() -> String, filename: &'static str) -> Option<ScopeGuard> {
    frames_wanted().then(|| push_scope(name(), filename, 0))
}

/// `MmBackward0` -> `mm` (forward) or `mm_backward`; `MaxPool2DWithIndicesBackward0` ->
/// `max_pool2d_with_indices`: the op names frames carry.
pub fn op_frame_name(node: &str, backward: bool) -> String {
    let base = node
        .strip_suffix("Backward0")
        .or_else(|| node.strip_suffix("Backward1"))
        .unwrap_or(node);
    let chars: Vec<char> = base.chars().collect();
    let mut out = String::with_capacity(base.len() + 8);
    for (i, &c) in chars.iter().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            let prev = chars[i - 1];
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_ascii_lowercase());
            if prev.is_ascii_lowercase() || (prev.is_ascii_uppercase() && next_lower) {
                out.push('_');
            }
        }
        out.push(c.to_ascii_lowercase());
    }
    if backward {
        out.push_str("_backward");
    }
    out
}

/// The current frames, innermost first (PyTorch lists the innermost frame first).
fn current_frames(stacks: HistoryStacks) -> Frames {
    let mut frames: Vec<Frame> = SCOPES.with(|s| s.borrow().iter().rev().cloned().collect());
    if stacks == HistoryStacks::All {
        frames.extend(rust_backtrace());
    }
    Arc::new(frames)
}

fn rust_backtrace() -> Vec<Frame> {
    let bt = std::backtrace::Backtrace::force_capture().to_string();
    let mut out = Vec::new();
    let mut lines = bt.lines().peekable();
    while let Some(line) = lines.next() {
        let Some((_, name)) = line.trim().split_once(": ") else {
            continue;
        };
        let (mut filename, mut lineno) = (String::from("??"), 0);
        if let Some(at) = lines.peek().and_then(|l| l.trim().strip_prefix("at ")) {
            let mut parts = at.rsplitn(3, ':');
            let _col = parts.next();
            lineno = parts.next().and_then(|l| l.parse().ok()).unwrap_or(0);
            filename = parts.next().unwrap_or(at).to_string();
            lines.next();
        }
        out.push(Frame {
            filename,
            line: lineno,
            name: name.to_string(),
        });
    }
    out
}
