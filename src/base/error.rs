//! kiln's one error type: every public operation returns `kiln::Result`.

use super::{DType, OutOfMemory};

/// The result of every public kiln operation.
pub type Result<T> = std::result::Result<T, Error>;

/// What went wrong, with the op and the operands named.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The caching allocator could not find or create memory; carries PyTorch's numbers.
    #[error("{0}")]
    OutOfMemory(Box<OutOfMemory>),

    /// A request larger than the device takes: a buffer, a binding, a dispatch's workgroups,
    /// or 32-bit indexing. `what` names the unit and the limit ("bytes of ...", "workgroups
    /// ...").
    #[error("{op}: {size_bytes} {what} exceeds the device's limit of {limit_bytes}")]
    TooLarge {
        /// The op that failed, as PyTorch names it.
        op: &'static str,
        /// The size asked for, in bytes unless `what` names another unit.
        size_bytes: u64,
        /// The device's limit, in the same unit.
        limit_bytes: u64,
        /// The unit and what it counts (read after the size: "bytes of a tensor larger than
        /// one storage binding").
        what: &'static str,
    },

    /// A `KILN_ALLOC_CONF` string or typed allocator setting that is not valid.
    #[error("allocator config: {0}")]
    AllocConfig(String),

    /// Freeing or touching a block the allocator does not own.
    #[error("{op}: invalid device pointer {addr:#x}")]
    InvalidPointer {
        /// The op that failed, as PyTorch names it.
        op: &'static str,
        /// The address given.
        addr: u64,
    },

    /// Operands on different devices.
    #[error("{op}: expected a tensor on {expected}, got one on {got}")]
    DeviceMismatch {
        /// The op that failed, as PyTorch names it.
        op: &'static str,
        /// The device the op expected.
        expected: String,
        /// The device the operand is on.
        got: String,
    },

    /// Shapes that do not fit together (broadcasting, views, concatenation).
    #[error("{op}: shapes {lhs:?} and {rhs:?} do not match")]
    ShapeMismatch {
        /// The op that failed, as PyTorch names it.
        op: &'static str,
        /// The first operand's shape.
        lhs: Vec<usize>,
        /// The second operand's shape.
        rhs: Vec<usize>,
    },

    /// An element type the op does not take.
    #[error("{op}: expected dtype {expected}, got {got}")]
    DTypeMismatch {
        /// The op that failed, as PyTorch names it.
        op: &'static str,
        /// The dtype the op expected.
        expected: DType,
        /// The dtype it got.
        got: DType,
    },

    /// A dtype the device or op does not support (e.g. f16 without shader-f16).
    #[error("{op}: dtype {dtype} is not supported {why}")]
    UnsupportedDType {
        /// The op that failed, as PyTorch names it.
        op: &'static str,
        /// The dtype asked for.
        dtype: DType,
        /// Why it is not supported there.
        why: String,
    },

    /// An index outside its dimension.
    #[error("{op}: {what} {index} out of range for size {size}")]
    IndexOutOfRange {
        /// The op that failed, as PyTorch names it.
        op: &'static str,
        /// The index given.
        index: i64,
        /// The size of the dimension.
        size: usize,
        /// What the size or index is of.
        what: &'static str,
    },

    /// A value outside the range an op accepts.
    #[error("{op}: {msg}")]
    InvalidArgument {
        /// The op that failed, as PyTorch names it.
        op: &'static str,
        /// What went wrong, in words.
        msg: String,
    },

    /// No adapter matches a device request (`KILN_DEVICE`, `Device::from_spec`).
    #[error("device {spec:?}: {msg}")]
    NoSuchDevice {
        /// The device spec asked for.
        spec: String,
        /// What went wrong, in words.
        msg: String,
    },

    /// The adapter refused the device request.
    #[error("request_device on {adapter}: {msg}")]
    RequestDevice {
        /// The adapter's name.
        adapter: String,
        /// What went wrong, in words.
        msg: String,
    },

    /// A wgpu validation or internal error, caught by an error scope or the uncaptured handler.
    #[error("wgpu error in {op}: {msg}")]
    Wgpu {
        /// The op that failed, as PyTorch names it.
        op: &'static str,
        /// What went wrong, in words.
        msg: String,
    },

    /// The device was lost (driver reset, `destroy`); it cannot be used any more.
    #[error("device lost ({reason}): {msg}")]
    DeviceLost {
        /// wgpu's reason.
        reason: String,
        /// What went wrong, in words.
        msg: String,
    },

    /// A kernel found bad input while it ran (an index out of range), reported at the next sync
    /// point as CUDA reports a device-side assert; the offending elements were written as 0.
    /// Unlike CUDA's, the device stays usable.
    #[error("{ops}: {msg} (detected on the device; reported at this sync point)")]
    DeviceAssert {
        /// The ops whose kernels found the bad input.
        ops: String,
        /// What went wrong, in words.
        msg: String,
    },

    /// Autograd misuse, with PyTorch's wording (backward through a freed graph, in-place on a
    /// leaf that requires grad, inference tensors saved for backward, ...).
    #[error("{op}: {msg}")]
    Autograd {
        /// The op that failed, as PyTorch names it.
        op: &'static str,
        /// What went wrong, in words.
        msg: String,
    },

    /// A collective or process-group failure (`kiln::distributed`): MPI missing or failing, a
    /// rank that did not answer within the group's timeout, a group broken by an earlier
    /// timeout, or ranks that disagree on a tensor's size.
    #[error("{op}: {msg}")]
    Distributed {
        /// The op that failed, as PyTorch names it.
        op: &'static str,
        /// What went wrong, in words.
        msg: String,
    },

    /// A tensor saved for backward was modified in place before `backward()` (PyTorch's
    /// "modified by an inplace operation").
    #[error("one of the variables needed for gradient computation has been modified by an inplace operation: [{dtype} {shape:?}]{}, is at version {version}; expected version {expected} instead. Hint: the backtrace further above can point to the operation that failed to compute its gradient; find where this tensor was modified in place (an `_` op) and use the out-of-place op, or clone it first.", creator.map(|c| format!(", which is output 0 of {c}")).unwrap_or_default())]
    ModifiedInplace {
        /// The saved tensor's shape.
        shape: Vec<usize>,
        /// The saved tensor's dtype.
        dtype: DType,
        /// The op whose output it was, if any.
        creator: Option<&'static str>,
        /// Its version now.
        version: u64,
        /// The version backward expected (the one it was saved at).
        expected: u64,
    },

    /// Reading or writing a file failed (the OS's reason).
    #[error("{op}: {path}: {msg}")]
    Io {
        /// The op that failed, as PyTorch names it.
        op: &'static str,
        /// The file.
        path: String,
        /// What went wrong, in words.
        msg: String,
    },

    /// A file that is not what it claims to be: truncated, corrupted, a header that does not
    /// match its data, or one that does not fit what it is loaded into (the key is named).
    #[error("{op}: {path}: {msg}")]
    InvalidFile {
        /// The op that failed, as PyTorch names it.
        op: &'static str,
        /// The file.
        path: String,
        /// What went wrong, in words.
        msg: String,
    },

    /// A value read on a planning device, where nothing is computed (Note [Dry runs]).
    #[error("{op}: a dry run computes no values, so {what} cannot be read (read values on a real device; a dry run plans memory)")]
    DryRun {
        /// The op that read.
        op: &'static str,
        /// What it read.
        what: String,
    },

    /// `KILN_REQUIRE_GPU=1` is set and no GPU adapter (software ones count) was found.
    #[error("KILN_REQUIRE_GPU is set but wgpu found no GPU adapter")]
    GpuRequired,
}
