//! The GPU's one stream: a command encoder with one open compute pass for a run of dispatches,
//! submitted in batches. A submission's sequence number is kiln's CUDA event.
//! See Note [One stream, batched submits] in ARCHITECTURE.md.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::serial::GlSerial;

/// Dispatches recorded before the stream submits on its own (cubecl uses 32; a submit costs
/// about 8 us of CPU on the H100, so batches of this size keep it under 0.1 us per dispatch).
pub(crate) const DISPATCHES_PER_SUBMIT: usize = 128;

/// The first batch after the GPU was found drained (a wait on the latest submission): small,
/// so that the idle GPU gets work after a few dispatches instead of after the host has
/// recorded a whole batch of 128; each automatic submit then doubles the batch up to
/// `DISPATCHES_PER_SUBMIT` (TCP's slow start). See Note [One stream, batched submits].
const FIRST_BATCH: usize = 4;

/// How long a wait spins on non-blocking polls before it blocks, on an adapter of `kind`. On a
/// GPU 2 ms, as CUDA spins by default while the host has cores to spare
/// (`cudaDeviceScheduleAuto`): a blocked thread's wake-up leaves the GPU idle until the host
/// has recorded its next work, and it varies. On the H100, GradScaler's one read per AMP step
/// (MLP 784-4096-4096-10, batch 512) gave SGD 1.16-1.27 ms and Adam 1.12-1.47 with 50 us of
/// spinning, 0.97-1.07 and 1.02-1.08 with 2 ms. On a CPU adapter (lavapipe, llvmpipe) 50 us: a
/// spinning thread there takes a core from the driver's own threads, which run the shaders.
/// `KILN_WAIT_SPIN_US` sets it in microseconds for every adapter.
pub(crate) fn spin_before_wait(kind: wgpu::DeviceType) -> std::time::Duration {
    if let Some(us) = std::env::var("KILN_WAIT_SPIN_US")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        return std::time::Duration::from_micros(us);
    }
    match kind {
        wgpu::DeviceType::Cpu => std::time::Duration::from_micros(50),
        _ => std::time::Duration::from_millis(2),
    }
}

pub(crate) struct Stream {
    encoder: Option<wgpu::CommandEncoder>,
    pass: Option<wgpu::ComputePass<'static>>,
    recorded: usize,
    /// Dispatches the current batch may hold before it is submitted (slow start).
    batch: usize,
    /// Sequence number the next submission will carry (1-based; 0 = "nothing").
    next_event: u64,
    /// Submitted and maybe not yet complete, oldest first.
    in_flight: VecDeque<(u64, wgpu::SubmissionIndex)>,
    /// Highest sequence number known complete; written by `on_submitted_work_done` callbacks.
    completed: Arc<AtomicU64>,
    gl: GlSerial,
    /// `spin_before_wait` for the adapter.
    spin: std::time::Duration,
    /// Runs before the next submission: the host's wait for a queued sparse bind, which
    /// Vulkan does not order before later submissions (`sparse.rs`).
    before_submit: Option<Box<dyn FnOnce() + Send>>,
}

impl Stream {
    pub fn new(gl: GlSerial, spin: std::time::Duration) -> Self {
        Stream {
            gl,
            spin,
            encoder: None,
            pass: None,
            recorded: 0,
            batch: FIRST_BATCH,
            next_event: 1,
            in_flight: VecDeque::new(),
            completed: Arc::new(AtomicU64::new(0)),
            before_submit: None,
        }
    }

    /// Has `f` run before the next submission (replacing any earlier one, which `f` must
    /// cover).
    pub fn before_next_submit(&mut self, f: Box<dyn FnOnce() + Send>) {
        self.before_submit = Some(f);
    }

    /// The event the submission now being recorded will carry.
    pub fn pending_event(&self) -> u64 {
        self.next_event
    }

    fn encoder(&mut self, device: &wgpu::Device) -> &mut wgpu::CommandEncoder {
        self.encoder.get_or_insert_with(|| {
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("kiln"),
            })
        })
    }

    /// The open compute pass, begun if needed.
    pub fn pass(&mut self, device: &wgpu::Device) -> &mut wgpu::ComputePass<'static> {
        if self.pass.is_none() {
            let pass = self
                .encoder(device)
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("kiln"),
                    timestamp_writes: None,
                })
                .forget_lifetime();
            self.pass = Some(pass);
        }
        self.pass.as_mut().expect("pass was just opened")
    }

    /// The encoder outside any pass (for copies), ending the open pass.
    pub fn copy_encoder(&mut self, device: &wgpu::Device) -> &mut wgpu::CommandEncoder {
        self.pass = None;
        self.encoder(device)
    }

    /// Counts one recorded command; submits when the batch is full, and lets the next batch
    /// grow.
    pub fn recorded(&mut self, queue: &wgpu::Queue) {
        self.recorded += 1;
        if self.recorded >= self.batch {
            self.submit(queue);
            self.batch = (self.batch * 2).min(DISPATCHES_PER_SUBMIT);
        }
    }

    /// Submits what is recorded (if anything) and returns the event that covers all work so far.
    pub fn submit(&mut self, queue: &wgpu::Queue) -> u64 {
        self.pass = None;
        let Some(encoder) = self.encoder.take() else {
            return self.next_event - 1;
        };
        self.recorded = 0;
        if let Some(f) = self.before_submit.take() {
            f();
        }
        let event = self.next_event;
        self.next_event += 1;
        let index = {
            let _gl = self.gl.guard();
            queue.submit([encoder.finish()])
        };
        let completed = self.completed.clone();
        queue.on_submitted_work_done(move || {
            completed.fetch_max(event, Ordering::AcqRel);
        });
        self.in_flight.push_back((event, index));
        event
    }

    /// Submits what is recorded; false if nothing was.
    pub fn submit_if_recorded(&mut self, queue: &wgpu::Queue) -> bool {
        let recorded = self.encoder.is_some();
        self.submit(queue);
        recorded
    }

    /// Non-blocking: has `event` completed? Polls the device once if not yet known.
    pub fn query(&mut self, device: &wgpu::Device, event: u64) -> bool {
        if self.completed.load(Ordering::Acquire) >= event {
            return true;
        }
        {
            let _gl = self.gl.guard();
            let _ = device.poll(wgpu::PollType::Poll);
        }
        self.retire();
        self.completed.load(Ordering::Acquire) >= event
    }

    /// Blocks until `event` has completed, submitting it first if it is still being recorded.
    /// Holds the stream for the whole wait; `wait_unlocked` lets other threads record meanwhile.
    pub fn wait(
        &mut self,
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        event: u64,
    ) -> Result<(), wgpu::PollError> {
        match self.prepare_wait(queue, event) {
            None => Ok(()),
            Some(w) => {
                w.block(device)?;
                self.retire();
                Ok(())
            }
        }
    }

    /// What waiting for `event` takes, if it has not completed: submits it if it is still being
    /// recorded. The returned `Wait` blocks without the stream.
    pub fn prepare_wait(&mut self, queue: &wgpu::Queue, event: u64) -> Option<Wait> {
        if event >= self.next_event {
            self.submit(queue);
        }
        if event + 1 >= self.next_event {
            // The wait drains the GPU: start the next batches small again.
            self.batch = FIRST_BATCH;
        }
        if self.completed.load(Ordering::Acquire) >= event {
            return None;
        }
        let index = self
            .in_flight
            .iter()
            .find(|(e, _)| *e >= event)
            .map(|(_, i)| i.clone());
        Some(Wait {
            event,
            index,
            completed: self.completed.clone(),
            gl: self.gl,
            spin: self.spin,
        })
    }

    fn retire(&mut self) {
        let done = self.completed.load(Ordering::Acquire);
        while self.in_flight.front().is_some_and(|(e, _)| *e <= done) {
            self.in_flight.pop_front();
        }
    }
}

/// A wait for one event, taken from the stream so that it can block without holding it.
pub(crate) struct Wait {
    event: u64,
    index: Option<wgpu::SubmissionIndex>,
    completed: Arc<AtomicU64>,
    gl: GlSerial,
    spin: std::time::Duration,
}

impl Wait {
    pub fn block(self, device: &wgpu::Device) -> Result<(), wgpu::PollError> {
        // Spin on non-blocking polls first (`spin_before_wait`): a blocking wait costs a
        // semaphore wake-up (about 20 us on the H100, and more when the thread was descheduled)
        // that short jobs need not pay.
        let spin = std::time::Instant::now();
        while spin.elapsed() < self.spin {
            let polled = {
                let _gl = self.gl.guard();
                device.poll(wgpu::PollType::Poll)
            };
            polled?;
            if self.completed.load(Ordering::Acquire) >= self.event {
                return Ok(());
            }
            std::hint::spin_loop();
        }
        // On GL the whole wait holds the serial lock (wgpu holds the GL context through it).
        let _gl = self.gl.guard();
        device.poll(wgpu::PollType::Wait {
            submission_index: self.index,
            timeout: None,
        })?;
        self.completed.fetch_max(self.event, Ordering::AcqRel);
        Ok(())
    }
}

/// Blocks until `event` of `stream` has completed, holding the stream only to submit.
pub(crate) fn wait_unlocked(
    stream: &std::sync::Mutex<Stream>,
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    event: u64,
) -> Result<(), wgpu::PollError> {
    let wait = super::lock(stream).prepare_wait(queue, event);
    match wait {
        Some(w) => w.block(device),
        None => Ok(()),
    }
}
