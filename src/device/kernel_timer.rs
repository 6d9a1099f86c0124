//! GPU time per kernel and per copy for the profiler: timestamp queries written around each
//! dispatch inside the open compute pass (and around copies in the encoder), resolved when the
//! profile ends. Where the adapter has no timestamps inside passes, entries carry CPU times only.

use super::gpu::GpuDevice;
use super::lock;
use super::serial::GlSerial;
use crate::Result;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
use std::time::Instant;

const QUERIES_PER_SET: u32 = 4096;

/// One timed dispatch or copy.
#[derive(Clone, Debug)]
pub struct KernelEntry {
    /// The kernel's or copy's name.
    pub name: String,
    /// Bytes moved (copies).
    pub bytes: u64,
    /// Whether it is a copy rather than a kernel.
    pub is_copy: bool,
    /// The host thread that recorded it.
    pub thread: u64,
    /// When the host recorded it.
    pub cpu_start: Instant,
    /// When the host finished recording it.
    pub cpu_end: Instant,
    slot: Option<(usize, u32)>,
    /// GPU start and end in nanoseconds of the device's clock, once resolved.
    pub gpu_ns: Option<(f64, f64)>,
}

pub(crate) struct KernelTimer {
    sets: Vec<wgpu::QuerySet>,
    used: u32,
    inside_passes: bool,
    inside_encoders: bool,
    pub entries: Vec<KernelEntry>,
    gl: GlSerial,
}

impl Drop for KernelTimer {
    fn drop(&mut self) {
        let _gl = self.gl.guard();
        self.sets.clear();
    }
}

impl KernelTimer {
    pub fn new(device: &wgpu::Device, gl: GlSerial) -> KernelTimer {
        let f = device.features();
        KernelTimer {
            gl,
            sets: Vec::new(),
            used: QUERIES_PER_SET,
            inside_passes: f.contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES),
            inside_encoders: f.contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS),
            entries: Vec::new(),
        }
    }

    /// A pair of query slots, or `None` where `usable` is false.
    fn slot(&mut self, device: &wgpu::Device, usable: bool) -> Option<(usize, u32)> {
        if !usable {
            return None;
        }
        if self.used + 2 > QUERIES_PER_SET {
            let _gl = self.gl.guard();
            self.sets
                .push(device.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("kiln profiler"),
                    ty: wgpu::QueryType::Timestamp,
                    count: QUERIES_PER_SET,
                }));
            self.used = 0;
        }
        self.used += 2;
        Some((self.sets.len() - 1, self.used - 2))
    }

    /// Times a dispatch recorded by `dispatch` in `pass`.
    pub fn dispatch(
        &mut self,
        device: &wgpu::Device,
        pass: &mut wgpu::ComputePass<'static>,
        name: String,
        dispatch: impl FnOnce(&mut wgpu::ComputePass<'static>),
    ) {
        let cpu_start = Instant::now();
        let slot = self.slot(device, self.inside_passes);
        if let Some((s, i)) = slot {
            pass.write_timestamp(&self.sets[s], i);
        }
        dispatch(pass);
        if let Some((s, i)) = slot {
            pass.write_timestamp(&self.sets[s], i + 1);
        }
        self.entries.push(KernelEntry {
            name,
            bytes: 0,
            is_copy: false,
            thread: crate::alloc::thread_number(),
            cpu_start,
            cpu_end: Instant::now(),
            slot,
            gpu_ns: None,
        });
    }

    /// Times a copy recorded by `copy` in `encoder`.
    pub fn copy(
        &mut self,
        device: &wgpu::Device,
        encoder: &mut wgpu::CommandEncoder,
        name: &'static str,
        bytes: u64,
        copy: impl FnOnce(&mut wgpu::CommandEncoder),
    ) {
        let cpu_start = Instant::now();
        let slot = self.slot(device, self.inside_encoders);
        if let Some((s, i)) = slot {
            encoder.write_timestamp(&self.sets[s], i);
        }
        copy(encoder);
        if let Some((s, i)) = slot {
            encoder.write_timestamp(&self.sets[s], i + 1);
        }
        self.entries.push(KernelEntry {
            name: name.to_string(),
            bytes,
            is_copy: true,
            thread: crate::alloc::thread_number(),
            cpu_start,
            cpu_end: Instant::now(),
            slot,
            gpu_ns: None,
        });
    }
}

impl GpuDevice {
    /// Starts timing kernels and copies.
    pub fn start_kernel_timer(&self) {
        *lock(&self.timer) = Some(KernelTimer::new(&self.device, self.gl));
        self.timing.store(true, Ordering::Release);
    }

    /// The timer while a profile runs (one atomic load otherwise: dispatches call this).
    pub fn kernel_timer(&self) -> Option<MutexGuard<'_, Option<KernelTimer>>> {
        self.timing
            .load(Ordering::Acquire)
            .then(|| lock(&self.timer))
    }

    /// Stops timing and returns the entries with their GPU times resolved (a sync point), and
    /// whether kernels were measured on the GPU.
    pub fn take_kernel_times(&self) -> Result<(Vec<KernelEntry>, bool)> {
        self.timing.store(false, Ordering::Release);
        let Some(mut timer) = lock(&self.timer).take() else {
            return Ok((Vec::new(), false));
        };
        self.synchronize()?;
        let period = self.queue.get_timestamp_period() as f64;
        let mut ticks: Vec<Vec<u64>> = Vec::new();
        for (i, set) in timer.sets.iter().enumerate() {
            let count = if i + 1 == timer.sets.len() {
                timer.used
            } else {
                QUERIES_PER_SET
            };
            let bytes = count as u64 * 8;
            let gl = self.gl.guard();
            let resolve = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("kiln profiler resolve"),
                size: bytes.max(8),
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            });
            drop(gl);
            let view = self.read_back("profiler", bytes, |enc, readback| {
                if count > 0 {
                    enc.resolve_query_set(set, 0..count, &resolve, 0);
                    enc.copy_buffer_to_buffer(&resolve, 0, readback, 0, bytes);
                }
            })?;
            ticks.push(bytemuck::pod_collect_to_vec(&view));
            let _gl = self.gl.guard();
            drop(resolve);
        }
        for e in &mut timer.entries {
            if let Some((s, i)) = e.slot {
                let t = &ticks[s];
                let (a, b) = (
                    t[i as usize] as f64 * period,
                    t[i as usize + 1] as f64 * period,
                );
                e.gpu_ns = Some((a, b.max(a)));
            }
        }
        Ok((std::mem::take(&mut timer.entries), timer.inside_passes))
    }
}
