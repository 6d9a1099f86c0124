//! Serialisation of kiln's wgpu calls on GL devices.
//!
//! wgpu's GL backend has one GL context per adapter behind a lock that gives up after six
//! seconds with a panic ("Could not lock adapter context"). A call holds it for as long as
//! the driver works: a blocking poll for a long job, or a submit whose first dispatch makes
//! llvmpipe compile a shader (~90 s cold for a 128-tile matmul). So a second thread that
//! touches the same device meanwhile (allocates, creates a pipeline, polls) panicked:
//! measured with two threads on llvmpipe's GL, a 2048^2 matmul in one and `Tensor::full` in
//! the other. Every wgpu call kiln makes on a GL device first takes this lock, which waits
//! without a time limit, so the other threads queue in kiln and wgpu's lock is never
//! contended. Vulkan, Metal and DX12 devices skip it (`GlSerial::off`).
//!
//! The lock is re-entrant per thread and is always taken last: code holding it takes no
//! other kiln lock, so it cannot join a lock-order cycle. One lock serves every GL device
//! of the process (GL devices of one adapter may share a context).

use std::sync::{Condvar, Mutex};
use std::thread::ThreadId;

struct Reentrant {
    /// The owning thread and its depth.
    state: Mutex<(Option<ThreadId>, usize)>,
    released: Condvar,
}

static GL: Reentrant = Reentrant {
    state: Mutex::new((None, 0)),
    released: Condvar::new(),
};

/// Whether a device's wgpu calls go through the GL lock.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct GlSerial {
    on: bool,
}

impl GlSerial {
    pub fn for_backend(backend: wgpu::Backend) -> Self {
        GlSerial {
            on: backend == wgpu::Backend::Gl,
        }
    }

    #[cfg(test)]
    pub fn on() -> Self {
        GlSerial { on: true }
    }

    /// Holds the GL lock until the guard drops (nothing on other backends).
    #[must_use]
    pub fn guard(self) -> Option<GlGuard> {
        if !self.on {
            return None;
        }
        let me = std::thread::current().id();
        let mut s = super::lock(&GL.state);
        loop {
            match s.0 {
                None => {
                    *s = (Some(me), 1);
                    break;
                }
                Some(owner) if owner == me => {
                    s.1 += 1;
                    break;
                }
                Some(_) => s = GL.released.wait(s).unwrap_or_else(|e| e.into_inner()),
            }
        }
        Some(GlGuard(()))
    }
}

pub(crate) struct GlGuard(());

impl Drop for GlGuard {
    fn drop(&mut self) {
        let mut s = super::lock(&GL.state);
        s.1 -= 1;
        if s.1 == 0 {
            s.0 = None;
            GL.released.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn excludes_other_threads_and_reenters_in_one() {
        let inside = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let inside = inside.clone();
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        let _outer = GlSerial::on().guard();
                        let _inner = GlSerial::on().guard();
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                        std::thread::yield_now();
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(GlSerial::default().guard().is_none());
    }
}
