//! Two more Vulkan queues for copies between a GPU's memory and pinned memory, one each way:
//! CUDA's copy engines on a side stream. wgpu gives a device one queue, so its copies run in
//! the compute queue between kernels, behind full barriers; a copy on these runs while kernels
//! do.
//! See Note [Side queue].

// Note [Side queue]
// ~~~~~~~~~~~~~~~~~
// Data parallelism stages every gradient through pinned memory twice a step (ResNet-50: 97.5
// MiB each way, about 4.5 ms of the compute queue's time on an H200 at ~45 GB/s), where
// PyTorch's NCCL copies on the side. kiln opens its Vulkan device itself where the adapter
// has sparse binding (`sparse::open_device`) and asks there for two more queues, which wgpu
// never sees (one each way: a queue runs its submissions in order, and an upload queued
// behind a download whose gate is late waited for it; see `Way`). A copy on them:
// - waits for a *gate*: a value of kiln's own timeline semaphore that wgpu's queue signals
//   with a submission (wgpu-hal's `add_signal_semaphore`) carrying everything recorded on the
//   stream when the gate was taken, as a NCCL stream waits for the current stream at a
//   collective's launch; the caller promises that nothing recorded after the gate touches the
//   copy's memory until it has waited for the copy;
// - signals its queue's own timeline semaphore, which the host waits on
//   (`SideCopy::wait`); a wait for a copy into GPU memory also has wgpu's next submission
//   wait on it, so that the kernels that read the data are ordered after it on the device,
//   not only on the host.
// Each command buffer starts with a transfer barrier (ordering it after the side queue's
// earlier copies) and a copy into pinned memory ends with one that makes it visible to the
// host. No event is recorded with the host allocator: the caller holds the pinned block until
// it has waited, and an unwaited copy waits in its drop.
//
// Which queue, measured on two H200s (ResNet-50 DDP, 2 ranks; BENCHMARKS.md): a second and
// third queue of the family wgpu uses share its engine, time-sliced, so each copy waited
// 1.3-2.1 ms to run and the step got slower (64.8 against 59.4 ms without); the two queues of
// NVIDIA's transfer-only family (its copy engines) run beside the kernels (57.4-57.9 ms).
// But wgpu creates every buffer exclusive to its queue family, and Vulkan leaves a buffer's
// contents undefined when another family reads it without a queue-family ownership transfer
// (a release barrier in wgpu's command stream, an acquire on this queue, and back), which
// kiln does not record yet. NVIDIA's driver ignores ownership for buffers, and the MPI tests
// pass on two H200s with it, but that is one driver's behaviour, not the API's promise: so
// the side queue is opt-in, `KILN_COPY_QUEUE=transfer`, until the ownership transfers exist.
//
// Users: a collective's staging (`distributed/staging.rs`) and `save_on_cpu`'s pinned copies
// (Note [Offload ahead] in `autograd/offload.rs`). One hazard for any copy into GPU memory
// here: wgpu tracks which bytes of a buffer it has seen written and zero-fills the others when
// a kernel first binds them, and it never sees this queue's writes. Memory no wgpu command has
// written must be written through wgpu first (`Tensor::copy_beside_` clears it on the stream),
// or its first reader sees zeros. A collective's buckets are always written by kernels first.

use super::lock;
use ash::vk;
use std::collections::VecDeque;
use std::sync::Mutex;
use wgpu::hal::api::Vulkan;

/// `KILN_COPY_QUEUE_TRACE=1`: every host wait for a copy prints what it waited for (stderr).
fn trace() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("KILN_COPY_QUEUE_TRACE").is_ok_and(|v| v == "1"))
}

/// The queues to ask for, as (family, first index): two, one for each direction, of a
/// transfer-only family, and only with `KILN_COPY_QUEUE=transfer` (see Note [Side queue]).
pub(crate) fn choose(families: &[vk::QueueFamilyProperties]) -> Option<(u32, u32)> {
    if !super::copy_queue_requested() {
        return None;
    }
    families
        .iter()
        .position(|f| {
            f.queue_flags.contains(vk::QueueFlags::TRANSFER)
                && !f
                    .queue_flags
                    .intersects(vk::QueueFlags::GRAPHICS | vk::QueueFlags::COMPUTE)
                && f.queue_count >= 2
        })
        .map(|f| (f as u32, 0))
}

/// Which way a copy goes; each way has its own queue, so that a copy to the GPU never waits
/// behind a copy to the host whose gate the compute queue has not reached (a queue runs its
/// submissions in order: ResNet-50's first bucket's averages waited behind the last bucket's
/// gradients, for the whole backward, while the two shared one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Way {
    ToHost = 0,
    ToGpu = 1,
}

struct Lane {
    queue: vk::Queue,
    /// Signalled by this lane: its copy n sets it to n.
    done: vk::Semaphore,
    /// The last value `done` will reach for what is submitted.
    submitted: u64,
    /// Submitted command buffers and the value that marks them done, oldest first.
    in_flight: VecDeque<(u64, vk::CommandBuffer)>,
    /// Each copy in flight's gate (for `KILN_COPY_QUEUE_TRACE`).
    gates: VecDeque<(u64, u64)>,
}

struct State {
    pool: vk::CommandPool,
    lanes: [Lane; 2],
    /// Command buffers done and reset, for reuse.
    free: Vec<vk::CommandBuffer>,
    /// The last gate value handed to wgpu's queue.
    gate: u64,
}

pub(crate) struct SideQueue {
    device: ash::Device,
    /// The lanes' `done` semaphores (read without the state's lock).
    done: [vk::Semaphore; 2],
    /// Signalled by wgpu's queue (gates).
    gate: vk::Semaphore,
    state: Mutex<State>,
    /// Keeps the Vulkan device alive while this queue's objects exist.
    _wgpu: wgpu::Device,
}

// SAFETY: the Vulkan handles are plain identifiers; the pool and queue are used only under
// `state`'s mutex.
unsafe impl Send for SideQueue {}
unsafe impl Sync for SideQueue {}

fn timeline(device: &ash::Device) -> Option<vk::Semaphore> {
    let mut kind = vk::SemaphoreTypeCreateInfo::default()
        .semaphore_type(vk::SemaphoreType::TIMELINE)
        .initial_value(0);
    // SAFETY: wgpu-hal enables timeline semaphores where the device has them.
    unsafe {
        device.create_semaphore(
            &vk::SemaphoreCreateInfo::default().push_next(&mut kind),
            None,
        )
    }
    .ok()
}

impl SideQueue {
    /// Queues `(family, first)` and `(family, first + 1)` of `device`, which
    /// `sparse::open_device` created with them.
    pub(crate) fn new(device: &wgpu::Device, (family, first): (u32, u32)) -> Option<SideQueue> {
        // SAFETY: the raw handles are used for kiln's own calls while `_wgpu` keeps the device.
        let hal = unsafe { device.as_hal::<Vulkan>() }?;
        let raw = hal.raw_device().clone();
        drop(hal);
        let pool_info = vk::CommandPoolCreateInfo::default()
            .queue_family_index(family)
            .flags(
                vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER
                    | vk::CommandPoolCreateFlags::TRANSIENT,
            );
        // SAFETY: a pool on this device, destroyed in Drop.
        let pool = unsafe { raw.create_command_pool(&pool_info, None) }.ok()?;
        let sems = [timeline(&raw), timeline(&raw), timeline(&raw)];
        let [Some(down), Some(up), Some(gate)] = sems else {
            // SAFETY: created above, unused.
            unsafe {
                sems.into_iter()
                    .flatten()
                    .for_each(|s| raw.destroy_semaphore(s, None));
                raw.destroy_command_pool(pool, None);
            }
            return None;
        };
        let lane = |index: u32, done| Lane {
            // SAFETY: the device was created with this queue (`sparse::open_device`).
            queue: unsafe { raw.get_device_queue(family, index) },
            done,
            submitted: 0,
            in_flight: VecDeque::new(),
            gates: VecDeque::new(),
        };
        let lanes = [lane(first, down), lane(first + 1, up)];
        Some(SideQueue {
            device: raw,
            done: [down, up],
            gate,
            state: Mutex::new(State {
                pool,
                lanes,
                free: Vec::new(),
                gate: 0,
            }),
            _wgpu: device.clone(),
        })
    }

    /// A gate: a value wgpu's queue reaches once everything recorded on the stream so far
    /// has run. Submits the stream (an empty submission if nothing is recorded).
    pub(crate) fn gate(&self, g: &super::gpu::GpuDevice) -> u64 {
        let mut stream = lock(&g.stream);
        let value = {
            let mut state = lock(&self.state);
            state.gate += 1;
            state.gate
        };
        // SAFETY: only the signal list of the next submission is touched.
        if let Some(hal) = unsafe { g.queue.as_hal::<Vulkan>() } {
            hal.add_signal_semaphore(self.gate, Some(value));
        }
        if !stream.submit_if_recorded(&g.queue) {
            g.queue.submit([]);
        }
        value
    }

    /// Queues a copy of `size` bytes from `src` at `src_at` to `dst` at `dst_at` after `gate`,
    /// on the lane of `way` (`ToHost`: `dst` is pinned memory the host will read). Returns the
    /// copy's value on that lane.
    pub(crate) fn copy(
        &self,
        (src, src_at): (&wgpu::Buffer, u64),
        (dst, dst_at): (&wgpu::Buffer, u64),
        size: u64,
        gate: u64,
        way: Way,
    ) -> Result<u64, String> {
        // SAFETY: only the handles are read; the buffers outlive the copy (the caller waits).
        let raw =
            |b: &wgpu::Buffer| unsafe { b.as_hal::<Vulkan>() }.map(|h| unsafe { h.raw_handle() });
        let (Some(src), Some(dst)) = (raw(src), raw(dst)) else {
            return Err("not a Vulkan buffer".into());
        };
        let mut state = lock(&self.state);
        self.retire(&mut state);
        let cmd = match state.free.pop() {
            Some(c) => c,
            None => {
                let info = vk::CommandBufferAllocateInfo::default()
                    .command_pool(state.pool)
                    .level(vk::CommandBufferLevel::PRIMARY)
                    .command_buffer_count(1);
                // SAFETY: the pool is used under `state`'s lock.
                unsafe { self.device.allocate_command_buffers(&info) }
                    .map_err(|e| format!("vkAllocateCommandBuffers: {e}"))?[0]
            }
        };
        let d = &self.device;
        let barrier = |src_access, dst_stage, dst_access| {
            let m = [vk::MemoryBarrier::default()
                .src_access_mask(src_access)
                .dst_access_mask(dst_access)];
            // SAFETY: recording into `cmd`, which this thread owns under the lock.
            unsafe {
                d.cmd_pipeline_barrier(
                    cmd,
                    vk::PipelineStageFlags::TRANSFER,
                    dst_stage,
                    vk::DependencyFlags::empty(),
                    &m,
                    &[],
                    &[],
                )
            }
        };
        // SAFETY: `cmd` is free (reset or new); src and dst are live buffers of this device
        // with the copy usages (kiln's storage and pinned buffers have both).
        unsafe {
            d.begin_command_buffer(
                cmd,
                &vk::CommandBufferBeginInfo::default()
                    .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT),
            )
            .map_err(|e| format!("vkBeginCommandBuffer: {e}"))?;
            barrier(
                vk::AccessFlags::TRANSFER_WRITE | vk::AccessFlags::TRANSFER_READ,
                vk::PipelineStageFlags::TRANSFER,
                vk::AccessFlags::TRANSFER_WRITE | vk::AccessFlags::TRANSFER_READ,
            );
            d.cmd_copy_buffer(
                cmd,
                src,
                dst,
                &[vk::BufferCopy::default()
                    .src_offset(src_at)
                    .dst_offset(dst_at)
                    .size(size)],
            );
            if way == Way::ToHost {
                barrier(
                    vk::AccessFlags::TRANSFER_WRITE,
                    vk::PipelineStageFlags::HOST,
                    vk::AccessFlags::HOST_READ,
                );
            }
            d.end_command_buffer(cmd)
                .map_err(|e| format!("vkEndCommandBuffer: {e}"))?;
        }
        let lane = &mut state.lanes[way as usize];
        let value = lane.submitted + 1;
        let waits = [self.gate];
        let wait_values = [gate];
        let stages = [vk::PipelineStageFlags::TRANSFER];
        let signals = [lane.done];
        let signal_values = [value];
        let mut values = vk::TimelineSemaphoreSubmitInfo::default()
            .wait_semaphore_values(&wait_values)
            .signal_semaphore_values(&signal_values);
        let cmds = [cmd];
        let submit = vk::SubmitInfo::default()
            .wait_semaphores(&waits)
            .wait_dst_stage_mask(&stages)
            .command_buffers(&cmds)
            .signal_semaphores(&signals)
            .push_next(&mut values);
        // SAFETY: the queue is used under `state`'s lock; the semaphores are timelines of this
        // device and the gate's value is signalled by a submission already made.
        unsafe { d.queue_submit(lane.queue, &[submit], vk::Fence::null()) }
            .map_err(|e| format!("vkQueueSubmit on the copy queue: {e}"))?;
        lane.submitted = value;
        lane.in_flight.push_back((value, cmd));
        if trace() {
            lane.gates.push_back((value, gate));
            while lane.gates.len() > 256 {
                lane.gates.pop_front();
            }
        }
        Ok(value)
    }

    /// Blocks until copy `value` of the lane of `way` is done.
    pub(crate) fn wait(&self, way: Way, value: u64) -> Result<(), String> {
        let done = self.done[way as usize];
        // SAFETY: timeline semaphores of this device.
        let now = |s| unsafe { self.device.get_semaphore_counter_value(s) }.unwrap_or(0);
        let traced = trace().then(|| {
            let gate = lock(&self.state).lanes[way as usize]
                .gates
                .iter()
                .find(|(v, _)| *v == value)
                .map_or(0, |(_, g)| *g);
            (std::time::Instant::now(), gate, now(self.gate), now(done))
        });
        let sems = [done];
        let values = [value];
        // SAFETY: a timeline semaphore of this device.
        unsafe {
            self.device.wait_semaphores(
                &vk::SemaphoreWaitInfo::default()
                    .semaphores(&sems)
                    .values(&values),
                u64::MAX,
            )
        }
        .map_err(|e| format!("vkWaitSemaphores on the copy queue: {e}"))?;
        if let Some((t, gate, gate_then, done_then)) = traced {
            eprintln!(
                "kiln copy queue: {way:?} copy {value} (gate {gate}): waited {:.3} ms; at the \
                 wait's start gate {gate_then}, done {done_then}; gate now {}",
                t.elapsed().as_secs_f64() * 1e3,
                now(self.gate)
            );
        }
        Ok(())
    }

    /// Has wgpu's next submission wait for copy `value` of the `ToGpu` lane (already waited on
    /// the host), so that the kernels that read what it wrote are ordered after it on the
    /// device, not only on the host.
    pub(crate) fn order_stream_after(&self, g: &super::gpu::GpuDevice, value: u64) {
        let _stream = lock(&g.stream);
        // SAFETY: only the wait list of the next submission is touched.
        if let Some(hal) = unsafe { g.queue.as_hal::<Vulkan>() } {
            hal.add_wait_semaphore(
                self.done[Way::ToGpu as usize],
                Some(value),
                vk::PipelineStageFlags::ALL_COMMANDS,
            );
        }
    }

    /// Resets the command buffers whose copies are done.
    fn retire(&self, state: &mut State) {
        let State { lanes, free, .. } = state;
        for lane in lanes.iter_mut() {
            // SAFETY: a timeline semaphore of this device.
            let Ok(done) = (unsafe { self.device.get_semaphore_counter_value(lane.done) }) else {
                continue;
            };
            while lane.in_flight.front().is_some_and(|(v, _)| *v <= done) {
                let (_, cmd) = lane.in_flight.pop_front().expect("checked");
                // SAFETY: its submission is complete; the pool allows resetting one buffer.
                if unsafe {
                    self.device
                        .reset_command_buffer(cmd, vk::CommandBufferResetFlags::empty())
                }
                .is_ok()
                {
                    free.push(cmd);
                }
            }
        }
    }
}

impl Drop for SideQueue {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        // SAFETY: everything submitted completes first; then nothing uses these objects.
        unsafe {
            for lane in &state.lanes {
                let _ = self.device.queue_wait_idle(lane.queue);
                self.device.destroy_semaphore(lane.done, None);
            }
            self.device.destroy_command_pool(state.pool, None);
            self.device.destroy_semaphore(self.gate, None);
        }
    }
}
