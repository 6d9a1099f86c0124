//! The communication thread: one thread per process owns the transport (MPI is initialised,
//! called and finalised on it alone, so MPI's `FUNNELED` threading level is all kiln needs), and
//! runs the collectives callers hand it, in the order they were handed in. Every rank hands the
//! same collectives in the same order (DDP launches its buckets in index order), which is what
//! MPI asks. A caller waits for its answer at most the group's timeout; after a timeout the
//! group is broken (its thread may be stuck in MPI for good) and every later call fails at once.

use super::ReduceOp;
use crate::base::lock;
use crate::tensor::DType;
use crate::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What a transport does with host bytes: kiln's collectives in MPI's terms.
pub(super) trait Transport {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Rank among the processes of this host (picks the adapter).
    fn local_rank(&self) -> usize;
    /// `recv = op(send of every rank)`, elementwise in `dtype` (`Avg`: the sum times the f32 of
    /// 1/size); `send` and `recv` are as long.
    fn all_reduce(&self, dtype: DType, op: ReduceOp, send: &[u8], recv: &mut [u8]) -> Result<()>;
    /// Root's `buf` into every rank's.
    fn broadcast(&self, buf: &mut [u8], root: usize) -> Result<()>;
    /// Every rank's `send`, in rank order, into `recv` (`size()` times as long).
    fn all_gather(&self, send: &[u8], recv: &mut [u8]) -> Result<()>;
    fn barrier(&self) -> Result<()>;
    /// "MPI (Open MPI 4.1.4)" and the like, for messages.
    fn name(&self) -> String;
}

/// The transport of a group of one process (no MPI launch): every collective is a copy.
pub(super) struct SelfTransport;

impl Transport for SelfTransport {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn local_rank(&self) -> usize {
        0
    }
    fn all_reduce(&self, _: DType, _: ReduceOp, send: &[u8], recv: &mut [u8]) -> Result<()> {
        recv.copy_from_slice(send);
        Ok(())
    }
    fn broadcast(&self, _: &mut [u8], _: usize) -> Result<()> {
        Ok(())
    }
    fn all_gather(&self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        recv.copy_from_slice(send);
        Ok(())
    }
    fn barrier(&self) -> Result<()> {
        Ok(())
    }
    fn name(&self) -> String {
        "a single process (no MPI launch)".into()
    }
}

type Job = Box<dyn FnOnce(&dyn Transport) + Send>;
type Finish = Box<dyn FnOnce() -> Result<()> + Send>;

/// The handle to the communication thread.
pub(super) struct Comm {
    jobs: Mutex<Option<Sender<Job>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    broken: Arc<AtomicBool>,
    pub timeout: Duration,
    pub rank: usize,
    pub size: usize,
    pub local_rank: usize,
    pub transport: String,
}

/// A collective handed to the communication thread (PyTorch's `Work`): `wait` for its result.
pub struct Work<R> {
    op: &'static str,
    /// Run by `wait` once the result is in (a NCCL collective: order kiln's queue after it).
    finish: Option<Finish>,
    rx: Receiver<Result<R>>,
    timeout: Duration,
    broken: Arc<AtomicBool>,
    rank: usize,
}

impl<R> Work<R> {
    /// Waits for the collective, at most the group's timeout.
    pub fn wait(self) -> Result<R> {
        match self.rx.recv_timeout(self.timeout) {
            Ok(r) => {
                let r = r?;
                if let Some(finish) = self.finish {
                    finish()?;
                }
                Ok(r)
            }
            Err(RecvTimeoutError::Timeout) => {
                self.broken.store(true, Ordering::Release);
                Err(Error::Distributed {
                    op: self.op,
                    msg: format!(
                        "rank {}: timed out after {:.1} s: another rank failed or did not call \
                         {} (collectives must be called by every rank, in the same order). The \
                         process group cannot be used any more; exit and relaunch.",
                        self.rank,
                        self.timeout.as_secs_f64(),
                        self.op
                    ),
                })
            }
            Err(RecvTimeoutError::Disconnected) => Err(Error::Distributed {
                op: self.op,
                msg: "the communication thread ended (it panicked in the transport)".into(),
            }),
        }
    }
}

impl Comm {
    /// Starts the thread and its transport (made on the thread by `make`).
    pub fn start(
        timeout: Duration,
        make: impl FnOnce() -> Result<Box<dyn Transport>> + Send + 'static,
    ) -> Result<Comm> {
        let (jobs_tx, jobs_rx) = channel::<Job>();
        let (ready_tx, ready_rx) = channel::<Result<(usize, usize, usize, String)>>();
        let thread = std::thread::Builder::new()
            .name("kiln-comm".into())
            .spawn(move || {
                let transport = match make() {
                    Ok(t) => t,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let t = transport.as_ref();
                let _ = ready_tx.send(Ok((t.rank(), t.size(), t.local_rank(), t.name())));
                for job in jobs_rx {
                    job(t);
                }
                // The channel closed: the group is being destroyed; the transport's drop
                // finalises MPI here, on the thread that initialised it.
                drop(transport);
            })
            .map_err(|e| Error::Distributed {
                op: "init_process_group",
                msg: format!("cannot start the communication thread: {e}"),
            })?;
        let (rank, size, local_rank, transport) =
            ready_rx.recv().map_err(|_| Error::Distributed {
                op: "init_process_group",
                msg: "the communication thread ended while starting the transport".into(),
            })??;
        Ok(Comm {
            jobs: Mutex::new(Some(jobs_tx)),
            thread: Mutex::new(Some(thread)),
            broken: Arc::new(AtomicBool::new(false)),
            timeout,
            rank,
            size,
            local_rank,
            transport,
        })
    }

    pub fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Acquire)
    }

    /// Hands `f` to the thread; the result comes back through the returned `Work`.
    pub fn submit<R: Send + 'static>(
        &self,
        op: &'static str,
        f: impl FnOnce(&dyn Transport) -> Result<R> + Send + 'static,
    ) -> Result<Work<R>> {
        if self.is_broken() {
            return Err(Error::Distributed {
                op,
                msg: "the process group is broken by an earlier timeout; exit and relaunch".into(),
            });
        }
        let (tx, rx) = channel();
        let job: Job = Box::new(move |t| {
            let r = crate::no_grad(|| f(t));
            let _ = tx.send(r);
        });
        let sent = lock(&self.jobs).as_ref().map(|s| s.send(job).is_ok());
        if sent != Some(true) {
            return Err(Error::Distributed {
                op,
                msg: "the process group was destroyed".into(),
            });
        }
        Ok(self.work(op, rx))
    }

    /// A `Work` that is already done (a collective with nothing to exchange).
    pub fn done<R: Send + 'static>(&self, op: &'static str, value: R) -> Work<R> {
        let (tx, rx) = channel();
        let _ = tx.send(Ok(value));
        self.work(op, rx)
    }

    /// A `Work` whose collective is already queued elsewhere (on NCCL's stream): its `wait`
    /// runs `finish`.
    #[cfg(feature = "nccl")]
    pub fn queued<R: Send + 'static>(
        &self,
        op: &'static str,
        value: R,
        finish: impl FnOnce() -> Result<()> + Send + 'static,
    ) -> Work<R> {
        let mut work = self.done(op, value);
        work.finish = Some(Box::new(finish));
        work
    }

    fn work<R>(&self, op: &'static str, rx: Receiver<Result<R>>) -> Work<R> {
        Work {
            op,
            finish: None,
            rx,
            timeout: self.timeout,
            broken: self.broken.clone(),
            rank: self.rank,
        }
    }

    /// `submit` and wait.
    pub fn call<R: Send + 'static>(
        &self,
        op: &'static str,
        f: impl FnOnce(&dyn Transport) -> Result<R> + Send + 'static,
    ) -> Result<R> {
        self.submit(op, f)?.wait()
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        drop(lock(&self.jobs).take());
        let thread = lock(&self.thread).take();
        // A broken group's thread may wait in MPI forever: leave it (the process is about to
        // report the error and exit; the launcher then ends the other ranks).
        if let (Some(t), false) = (thread, self.is_broken()) {
            let _ = t.join();
        }
    }
}
