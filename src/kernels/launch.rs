//! The launch path: each kernel's pipeline and bind-group layout compiled once per device and
//! cached (`KernelCache`, with the tuner's choices in the same per-device state), the dispatch
//! grids, and the one function that encodes every dispatch (`launch_groups`). Which kernels
//! exist and what each binds is `Kernel`'s, in `mod.rs`.

use super::{tune, CoopTile, Kernel, WORKGROUP};
use crate::device::gpu::GpuDevice;
use crate::device::DeviceBlock;
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub(crate) struct Compiled {
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
}

/// What the launch path keeps per device: compiled pipelines and the tuned kernel choices.
pub(crate) struct LaunchState {
    pipelines: Mutex<KernelCache>,
    pub(super) tuner: Mutex<tune::Tuner>,
    /// The uniform buffer of `Kernel::uniform_binding` (made on first use).
    scratch: std::sync::OnceLock<wgpu::Buffer>,
    /// The arrival counters of `Kernel::counts_arrivals` (made zeroed on first use; Note
    /// [Folded finalize]).
    arrivals: std::sync::OnceLock<wgpu::Buffer>,
}

/// Arrival counters a device keeps (one per channel of a folded batch-norm finalize).
pub(crate) const ARRIVALS: usize = 4096;

/// The device's arrival counters (`Kernel::counts_arrivals`): zeroed when made, and every
/// launch that counts on them leaves them at zero.
fn arrivals(g: &GpuDevice) -> &wgpu::Buffer {
    launch_state(g).arrivals.get_or_init(|| {
        g.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("kiln arrival counters"),
            size: 4 * ARRIVALS as u64,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        })
    })
}

/// Bytes of the uniform scratch buffer: WebGPU's guaranteed uniform binding size.
pub(crate) const UNIFORM_SCRATCH: u64 = 64 * 1024;

/// The device's uniform scratch buffer: a kernel's uniform binding holds a copy of part of a
/// tensor, made just before its dispatch (`launch_groups_uniform`). Not a tensor and not the
/// allocator's: a fixed 64 KiB of the driver's, like the device-assert flag.
fn uniform_scratch(g: &GpuDevice) -> &wgpu::Buffer {
    launch_state(g).scratch.get_or_init(|| {
        g.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("kiln uniform scratch"),
            size: UNIFORM_SCRATCH,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    })
}

/// The device's launch state, in the slot the device keeps for the launch path (made on first
/// use, when the tuner reads the cache file; nothing else fills that slot).
fn launch_state(g: &GpuDevice) -> &LaunchState {
    launch_state_in(&g.launch_state, &g.info, None)
}

/// The launch state of a GPU or planning device (a planning device's holds only the tuner's
/// records for its target's adapter); `None` for the CPU device.
pub(super) fn launch_state_of(device: &crate::device::Device) -> Option<&LaunchState> {
    device
        .launch_slot()
        .map(|(slot, info, tuning)| launch_state_in(slot, info, tuning))
}

type Slot = std::sync::OnceLock<Box<dyn std::any::Any + Send + Sync>>;

fn launch_state_in<'a>(
    slot: &'a Slot,
    info: &crate::device::AdapterInfo,
    tuning: Option<&std::path::Path>,
) -> &'a LaunchState {
    slot.get_or_init(|| {
        Box::new(LaunchState {
            pipelines: Mutex::new(KernelCache::default()),
            tuner: Mutex::new(tune::Tuner::new(info, tuning)),
            scratch: std::sync::OnceLock::new(),
            arrivals: std::sync::OnceLock::new(),
        })
    })
    .downcast_ref()
    .expect("the launch-state slot holds the launch state")
}

/// The device's pipeline cache.
pub(crate) fn pipelines(g: &GpuDevice) -> &Mutex<KernelCache> {
    &launch_state(g).pipelines
}

/// Whether f16 products may run on tensor cores (the device opened cooperative matrices, or
/// a planning device's target has them, and the default tile's staging fits the adapter's
/// workgroup memory), with the adapter's info.
pub(crate) fn coop_f16(device: &crate::device::Device) -> Option<&crate::device::AdapterInfo> {
    device
        .coop_f16_target()
        .filter(|i| CoopTile::DEFAULT.valid(i.limits.max_compute_workgroup_storage_size))
}

/// Pipelines and layouts of one device, created on first use.
#[derive(Default)]
pub(crate) struct KernelCache {
    compiled: HashMap<Kernel, Arc<Compiled>>,
}

impl KernelCache {
    /// The kernel's pipeline, compiled on first use (on GL under the GL lock: the driver
    /// compiles and links there).
    pub fn get(&mut self, g: &GpuDevice, kernel: Kernel) -> Arc<Compiled> {
        self.compiled
            .entry(kernel)
            .or_insert_with(|| {
                let _gl = g.gl.guard();
                let software = g.info.device_type == wgpu::DeviceType::Cpu;
                Arc::new(compile(&g.device, &kernel, kernel.trusted(software)))
            })
            .clone()
    }
}

fn compile(device: &wgpu::Device, kernel: &Kernel, trusted: bool) -> Compiled {
    let name = kernel.name();
    let entries: Vec<wgpu::BindGroupLayoutEntry> = (0..kernel.bindings())
        .map(|binding| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                // read_write everywhere: tensors sub-allocated from one segment may meet in one
                // dispatch, and wgpu refuses read + read_write ranges of one buffer. (The
                // uniform binding is the scratch buffer, which no tensor shares.)
                ty: match kernel.uniform_binding() == Some(binding) {
                    true => wgpu::BufferBindingType::Uniform,
                    false => wgpu::BufferBindingType::Storage { read_only: false },
                },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        })
        .collect();
    let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some(&name),
        entries: &entries,
    });
    let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some(&name),
        bind_group_layouts: &[Some(&layout)],
        immediate_size: kernel.immediate_size(),
    });
    let desc = wgpu::ShaderModuleDescriptor {
        label: Some(&name),
        source: wgpu::ShaderSource::Wgsl(kernel.source()),
    };
    let module = if trusted {
        // SAFETY: a trusted kernel guards every index itself (tests cover ragged edges); the
        // driver's robustBufferAccess still bounds storage accesses. Without naga's clamps and
        // loop-bounding counters the compiler unrolls the inner loops into registers.
        unsafe { device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) }
    } else {
        device.create_shader_module(desc)
    };
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(&name),
        layout: Some(&pipeline_layout),
        module: &module,
        entry_point: Some(kernel.entry_point()),
        compilation_options: Default::default(),
        cache: None,
    });
    Compiled { pipeline, layout }
}

/// A dispatch grid for `n` invocations of `WORKGROUP` threads: x up to the per-dimension limit,
/// the rest in y (the shader folds them back with `num_workgroups`).
pub(crate) fn grid(n: u64, max_per_dim: u32) -> (u32, u32) {
    grid_of(n, WORKGROUP, max_per_dim)
}

/// `grid` for workgroups of `workgroup` invocations.
pub(crate) fn grid_of(n: u64, workgroup: u32, max_per_dim: u32) -> (u32, u32) {
    let groups = n.div_ceil(workgroup as u64).max(1);
    let x = groups.min(max_per_dim as u64);
    let y = groups.div_ceil(x);
    (x as u32, y as u32)
}

/// Launches `threads` invocations of a 1-D kernel (workgroups of `WORKGROUP`).
pub(crate) fn launch<'a, O: Operand<'a>>(
    kernel: Kernel,
    blocks: &[O],
    immediates: &[u32],
    threads: u64,
) -> Result<()> {
    launch_wg(kernel, blocks, immediates, threads, WORKGROUP)
}

/// The device a launch runs on: its first block's (kiln's ops launch only on GPU and
/// planning devices, with at least one block).
fn device_of<'a, O: Operand<'a>>(blocks: &[O]) -> &'a crate::device::Device {
    blocks
        .first()
        .expect("a kernel binds at least one block")
        .block()
        .device()
}

/// What a launch binds at one slot: a whole block (`&DeviceBlock`), or a `Window` of one.
pub(crate) trait Operand<'a>: Copy {
    fn block(&self) -> &'a DeviceBlock;
    /// Bytes `[start, start + len)` of the block, where not the whole of it.
    fn window(&self) -> Option<(u64, u64)>;
}

impl<'a> Operand<'a> for &'a DeviceBlock {
    fn block(&self) -> &'a DeviceBlock {
        self
    }
    fn window(&self) -> Option<(u64, u64)> {
        None
    }
}

/// Part of a block bound as one storage binding: an operand larger than the device's binding
/// limit whose kernel touches only a range of it (a chunk of a cast, the rows of a loss, the
/// records at a gradient's start; Note [Windows]). Made by `window_covering`.
#[derive(Clone, Copy)]
pub(crate) struct Window<'a> {
    block: &'a DeviceBlock,
    start: u64,
    len: u64,
}

impl<'a> Operand<'a> for Window<'a> {
    fn block(&self) -> &'a DeviceBlock {
        self.block
    }
    fn window(&self) -> Option<(u64, u64)> {
        Some((self.start, self.len))
    }
}

// Note [Windows]
// A tensor may be larger than one storage binding (2 GiB - 4 bytes on NVIDIA's Vulkan, 128 MiB
// on lavapipe) while its buffer is not (4 GiB on NVIDIA). GPT-2's autocast loss makes such
// tensors from batch 11 at T1024: the f32 copy of the [B*T, 50257] log-probabilities and
// nll_loss's f32 gradient. The kernels that touch them bind windows instead of the whole block:
// - a contiguous cast runs in chunks, each binding the part of both operands it converts
//   (`ops::predicate::cast_into`);
// - nll_loss's forward runs over windows of rows, each launch adding its part of the sums
//   (`ops::loss`, `shaders/nll_common.wgsl`'s `finish`);
// - nll_loss's records under autocast lie at the start of the gradient's block, and every kernel
//   that reads or writes them binds just those bytes.
// From batch 21 the f16 logits pass one binding too, and the kernels of GPT-2's head take
// windows of rows (`aligned_rows`: each window of a fresh output starts at a row on the
// alignment, so whole 16-byte stores stay whole):
// - the tensor-core product writing them, or reading them as a row-major A, over windows of M
//   (`ops::matmul_windows::coop_rows`), and reading them as a transposed A over windows of K into
//   f32 partials (`ops::matmul_windows::coop_k_windows`);
// - the row copies between the padded and the ragged widths (`ops::copies`), log_softmax's
//   forward (`ops::softmax`) and cross_entropy's fused backward (`ops::loss::launch_words`);
// - and, for a user's code on such tensors, contiguous elementwise ops in whole vectors
//   (`ops::elementwise_windows`).
// In f32 the logits pass one binding from batch 11, and the head's products run on the SIMT
// kernels over the same windows of M or K (`ops::matmul_windows::simt_windows`; the products
// of K's windows added), so f32 GPT-2 too is bound by memory (67 at T1024 in an H100's 80 GB).
// What a user's code does with such logits takes windows too (`ops::views`): a kernel that is
// given a view's offset binds the window covering the view (a row of the logits, a narrowed
// view); reductions over rows (argmax, max, sum, mean) run over windows of rows, a whole sum in
// chunks, reductions over the leading dim over windows of it; elementwise ops on misaligned or
// strided views over windows of their outermost dim, or, where one index of it spans more than
// a window (a transposed view), in place over blocks of two dims (a fresh output being the view
// copied in place first).
// With expandable segments such tensors exist past NVIDIA's 4 GiB buffer (one sparse range
// holds them), so memory, not bindings, bounds GPT-2's batch (95 at T1024 in an H100's 80 GB).
// A window starts at the device's storage-offset alignment, so each launch passes the offset
// of its first element inside the window. The allocations are the same as with whole
// bindings (but for the partials that windows of K or of a reduction add, which a dry run
// makes too), so a dry run plans them alike; a kernel
// that would need the whole of a block in one binding (an elementwise op over a view permuted
// in three dims, a product of a strided or batched operand) still fails with a `TooLarge`
// error.

/// The window of `block` holding its bytes `[first, end)`: its start aligned down to the
/// device's storage-offset alignment and its length up to whole words. Returns the window and
/// how many bytes it starts before `first`.
pub(crate) fn window_covering(
    block: &DeviceBlock,
    first: u64,
    end: u64,
) -> Result<(Window<'_>, u64)> {
    let align = offset_alignment(block.device());
    let absolute = block.offset() + first;
    let before = absolute % align;
    if before > first || end < first || end > block.block_size() {
        return Err(Error::InvalidArgument {
            op: "bind",
            msg: format!(
                "bytes {first}..{end} of a block of {} at offset {} have no aligned window",
                block.block_size(),
                block.offset()
            ),
        });
    }
    let start = first - before;
    let len = (end - start)
        .next_multiple_of(4)
        .min(block.block_size() - start);
    Ok((Window { block, start, len }, before))
}

/// The window of `block` that starts at its byte `first` exactly, to `end`: where a kernel
/// writes a fresh output from its binding's first element, which the windows' spans start on
/// the alignment (`aligned_rows`). `op` names the launch in the error where it is not.
pub(crate) fn window_from<'b>(
    block: &'b DeviceBlock,
    first: u64,
    end: u64,
    op: &'static str,
) -> Result<Window<'b>> {
    match window_covering(block, first, end)? {
        (w, 0) => Ok(w),
        _ => Err(Error::InvalidArgument {
            op,
            msg: format!("byte {first} of the output starts off the binding alignment"),
        }),
    }
}

/// Whether `block` is larger than one window (Note [Windows]): its kernels must bind windows
/// of it. Never on the CPU device.
pub(crate) fn past_one_binding(block: &DeviceBlock) -> bool {
    block.device().adapter_info().is_some() && block.block_size() > window_bytes(block.device())
}

/// All of `block` as a `Window`, beside windows of other blocks in one launch.
pub(crate) fn whole(block: &DeviceBlock) -> Window<'_> {
    Window {
        block,
        start: 0,
        len: block.block_size(),
    }
}

/// The most bytes one window may hold on `device` such that a window of that many bytes from
/// any start fits one binding (its start aligned down adds up to an alignment less four).
pub(crate) fn window_bytes(device: &crate::device::Device) -> u64 {
    let limit = device
        .adapter_info()
        .expect("windows are for GPU and planning devices")
        .limits
        .max_storage_buffer_binding_size;
    (limit / 4 * 4).saturating_sub(offset_alignment(device))
}

/// The alignment of a storage binding's offset on `device`, in bytes (at least a word).
fn offset_alignment(device: &crate::device::Device) -> u64 {
    device
        .adapter_info()
        .map_or(256, |i| i.limits.min_storage_buffer_offset_alignment as u64)
        .max(4)
}

/// How many rows one window of rows holds on `device` (Note [Windows]) where the output's rows
/// are `row_bytes` and the widest operand's rows (an input's row stride) `widest` bytes: a
/// multiple of the rows after which an output row's first byte is again on the binding
/// alignment, so that every window of a fresh output starts at its first row's first byte
/// (kernels that store whole 16-byte vectors need that). Bytes are left for a last vector's
/// overrun.
pub(crate) fn aligned_rows(
    device: &crate::device::Device,
    row_bytes: usize,
    widest: usize,
) -> Result<usize> {
    let align = offset_alignment(device) as usize;
    let step = align / gcd(row_bytes, align);
    let window = window_bytes(device) as usize;
    let widest = widest.max(row_bytes).max(1);
    let rows = window.saturating_sub(16) / widest / step * step;
    if rows == 0 {
        return Err(Error::TooLarge {
            op: "bind",
            size_bytes: (step * widest) as u64,
            limit_bytes: window as u64,
            what: "bytes of the rows one window must hold (one storage binding)",
        });
    }
    Ok(rows)
}

fn gcd(a: usize, b: usize) -> usize {
    match b {
        0 => a,
        _ => gcd(b, a % b),
    }
}

/// The spans `[first, end)` of at most `per` items each that cover `0..n`, in order: the
/// windows' rows or elements, a launch each.
pub(crate) fn spans(n: usize, per: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n)
        .step_by(per.max(1))
        .map(move |first| (first, (first + per.max(1)).min(n)))
}

/// Launches `threads` invocations of a 1-D kernel whose workgroups have `workgroup`.
pub(crate) fn launch_wg<'a, O: Operand<'a>>(
    kernel: Kernel,
    blocks: &[O],
    immediates: &[u32],
    threads: u64,
    workgroup: u32,
) -> Result<()> {
    let max = device_of(blocks)
        .adapter_info()
        .expect("launch is for GPU and planning devices")
        .limits
        .max_compute_workgroups_per_dimension;
    let (x, y) = grid_of(threads, workgroup, max);
    launch_groups(kernel, blocks, immediates, (x, y, 1))
}

/// The one launch path: binds each operand (a block whole, with bind groups cached, or a
/// `Window` of one), sets the immediates and dispatches `groups` workgroups in the device's
/// open compute pass.
pub(crate) fn launch_groups<'a, O: Operand<'a>>(
    kernel: Kernel,
    blocks: &[O],
    immediates: &[u32],
    groups: (u32, u32, u32),
) -> Result<()> {
    launch_bound(kernel, None, blocks, immediates, groups)
}

/// `launch_groups` for a kernel with a uniform binding (`Kernel::uniform_binding`): copies
/// `bytes` of `src` from byte `offset` into the device's uniform scratch, then dispatches with
/// the scratch at that binding and `blocks` at the others, in order. The copy and the dispatch
/// are in stream order, so the next such launch's copy waits for this dispatch (wgpu's barrier
/// between the uniform read and the copy's write).
pub(crate) fn launch_groups_uniform(
    kernel: Kernel,
    (src, offset, bytes): (&DeviceBlock, u64, u64),
    blocks: &[&DeviceBlock],
    immediates: &[u32],
    groups: (u32, u32, u32),
) -> Result<()> {
    launch_bound(
        kernel,
        Some((src, offset, bytes)),
        blocks,
        immediates,
        groups,
    )
}

/// `check_bindable`'s error, naming the kernel and the operand: "cast_f16_f32_vec4: 2264924160
/// bytes of operand 0 (one storage binding) exceeds ..." rather than "bind: ...".
fn binding_too_large(e: Error, kernel: &Kernel, slot: usize) -> Error {
    const OPERAND: [&str; 8] = [
        "bytes of operand 0 (one storage binding)",
        "bytes of operand 1 (one storage binding)",
        "bytes of operand 2 (one storage binding)",
        "bytes of operand 3 (one storage binding)",
        "bytes of operand 4 (one storage binding)",
        "bytes of operand 5 (one storage binding)",
        "bytes of operand 6 (one storage binding)",
        "bytes of operand 7 (one storage binding)",
    ];
    match e {
        Error::TooLarge {
            size_bytes,
            limit_bytes,
            what,
            ..
        } => Error::TooLarge {
            op: static_name(kernel.name()),
            size_bytes,
            limit_bytes,
            what: OPERAND.get(slot).copied().unwrap_or(what),
        },
        e => e,
    }
}

/// A kernel's name as `Error::TooLarge`'s `&'static str` op. Names built at run time are
/// leaked once each; kiln's kernels are a bounded set.
fn static_name(name: std::borrow::Cow<'static, str>) -> &'static str {
    static NAMES: Mutex<std::collections::BTreeSet<&'static str>> =
        Mutex::new(std::collections::BTreeSet::new());
    match name {
        std::borrow::Cow::Borrowed(s) => s,
        std::borrow::Cow::Owned(s) => {
            let mut names = NAMES.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(&known) = names.get(s.as_str()) {
                return known;
            }
            let leaked: &'static str = Box::leak(s.into_boxed_str());
            names.insert(leaked);
            leaked
        }
    }
}

fn launch_bound<'a, O: Operand<'a>>(
    kernel: Kernel,
    uniform: Option<(&DeviceBlock, u64, u64)>,
    blocks: &[O],
    immediates: &[u32],
    groups: (u32, u32, u32),
) -> Result<()> {
    let device = device_of(blocks);
    let limits = &device
        .adapter_info()
        .expect("launch is for GPU and planning devices")
        .limits;
    let (x, y, z) = groups;
    if [x, y, z]
        .iter()
        .any(|&g| g > limits.max_compute_workgroups_per_dimension)
    {
        return Err(Error::TooLarge {
            op: "launch",
            size_bytes: x.max(y).max(z) as u64,
            limit_bytes: limits.max_compute_workgroups_per_dimension as u64,
            what: "workgroups in one dimension of a dispatch",
        });
    }
    // Each operand fits one storage binding, checked alike on a planning device and its target.
    let bound = blocks
        .iter()
        .map(|b| (b.block(), b.window()))
        .chain(uniform.as_ref().map(|u| (u.0, None)));
    for (slot, (b, window)) in bound.enumerate() {
        let bytes = window.map_or(b.block_size(), |w| w.1);
        b.check_bindable(bytes, limits.max_storage_buffer_binding_size)
            .map_err(|e| binding_too_large(e, &kernel, slot))?;
    }
    let Some(g) = device.gpu() else {
        // A dry run: the target's checks, and no dispatch (Note [Dry runs]).
        return Ok(());
    };
    g.check("launch")?;
    let mut bindings = blocks
        .iter()
        .map(|b| b.block().binding(b.window()))
        .collect::<Result<Vec<_>>>()?;
    let mut stream_copy = None;
    if let (Some(at), Some((src, offset, bytes))) = (kernel.uniform_binding(), uniform) {
        let source = src.binding(None)?;
        let fits = bytes <= UNIFORM_SCRATCH
            && offset + bytes <= src.block_size()
            && (source.offset + offset).is_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT)
            && bytes.is_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT);
        if !fits {
            return Err(Error::InvalidArgument {
                op: "launch",
                msg: format!(
                    "{}: {bytes} bytes from byte {offset} do not fit the uniform scratch",
                    kernel.name()
                ),
            });
        }
        let scratch = uniform_scratch(g);
        stream_copy = Some((source.buffer, source.offset + offset, scratch, bytes));
        bindings.insert(
            at as usize,
            wgpu::BufferBinding {
                buffer: scratch,
                offset: 0,
                size: None,
            },
        );
    }
    if kernel.counts_arrivals() {
        bindings.push(wgpu::BufferBinding {
            buffer: arrivals(g),
            offset: 0,
            size: None,
        });
    }
    if kernel.checks_input() {
        bindings.push(wgpu::BufferBinding {
            buffer: &g.assert_flag,
            offset: 0,
            size: None,
        });
        let mut pending = crate::device::lock(&g.pending_asserts);
        if !pending.contains(&kernel.op_name()) {
            pending.push(kernel.op_name());
        }
    }
    let compiled = crate::device::lock(pipelines(g)).get(g, kernel);
    let bind_group =
        crate::device::lock(&g.bind_groups).get_or_create(&g.device, &compiled.layout, &bindings);
    let mut timer = g.kernel_timer();
    let mut stream = crate::device::lock(&g.stream);
    if let Some((src, offset, scratch, bytes)) = stream_copy {
        stream
            .copy_encoder(&g.device)
            .copy_buffer_to_buffer(src, offset, scratch, 0, bytes);
    }
    let pass = stream.pass(&g.device);
    pass.set_pipeline(&compiled.pipeline);
    pass.set_bind_group(0, &bind_group, &[]);
    pass.set_immediates(0, bytemuck::cast_slice(immediates));
    match timer.as_mut().and_then(|t| t.as_mut()) {
        Some(t) => t.dispatch(&g.device, pass, kernel.name().into_owned(), |p| {
            p.dispatch_workgroups(x, y, z)
        }),
        None => pass.dispatch_workgroups(x, y, z),
    }
    drop(timer);
    stream.recorded(&g.queue);
    Ok(())
}
