//! `DataLoader`: PyTorch's loader with `pin_memory=True` and prefetching. A worker thread
//! assembles each batch straight into pinned memory; the iterator keeps `prefetch` batches
//! uploaded ahead with non-blocking copies, so batch assembly and uploads overlap the training
//! step that runs on the batch before. See Note [Pinned host memory] in ARCHITECTURE.md.

use super::ImageSet;
use crate::device::Device;
use crate::host::PinnedKind;
use crate::tensor::{DType, Tensor};
use crate::{Error, Result};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;

/// A map-style dataset (PyTorch's `Dataset`): samples of one shape with class labels.
pub trait Dataset: Send + Sync + 'static {
    /// The number of samples.
    fn len(&self) -> usize;
    /// Whether there are no samples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The shape of one sample's features.
    fn sample_shape(&self) -> Vec<usize>;
    /// Writes sample `index` into `out` (as many f32 as the sample shape holds); its label.
    fn get(&self, index: usize, out: &mut [f32]) -> i32;
}

impl Dataset for ImageSet {
    fn len(&self) -> usize {
        self.labels.len()
    }
    fn sample_shape(&self) -> Vec<usize> {
        vec![1, self.side, self.side]
    }
    fn get(&self, index: usize, out: &mut [f32]) -> i32 {
        out.copy_from_slice(self.image(index));
        self.labels[index]
    }
}

/// PyTorch's `DataLoader` arguments that kiln has.
#[derive(Clone, Debug)]
pub struct LoaderOptions {
    /// Samples per batch.
    pub batch_size: usize,
    /// A fresh permutation each epoch (seeded: the same order on every run).
    pub shuffle: bool,
    /// Drop the last batch if it is smaller than `batch_size`.
    pub drop_last: bool,
    /// Assemble batches in pinned memory and upload them with non-blocking copies (GPU
    /// devices); otherwise batches are built in pageable memory and copied on the main thread.
    pub pin_memory: bool,
    /// Batches uploaded ahead of the one being used (PyTorch's `prefetch_factor`, per loader).
    pub prefetch: usize,
    /// Threads that assemble each batch (PyTorch's `num_workers`, which kiln spends within a
    /// batch: one loader thread hands batches out in order, its helpers split the samples).
    pub num_workers: usize,
    /// The seed of the shuffle (each epoch's permutation follows from it and the epoch).
    pub seed: u64,
    /// This process's share of each epoch (PyTorch's `sampler=DistributedSampler(...)`); `None`:
    /// every sample.
    pub sampler: Option<DistributedSampler>,
}

/// PyTorch's `DistributedSampler`: rank `rank` of `num_replicas` takes every
/// `num_replicas`-th sample of the epoch's order, starting at its rank. The order is the
/// loader's (shuffled with its seed and epoch when `shuffle` is on, so every rank draws the same
/// permutation and the shards are disjoint); it is padded by repeating its first samples until
/// every rank gets `ceil(n / num_replicas)` samples, or with `drop_last` cut so every rank gets
/// the same whole number. The loader counts its epochs itself, so there is no `set_epoch` to
/// forget: each epoch's shuffle differs as it does after PyTorch's `sampler.set_epoch(epoch)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DistributedSampler {
    /// Processes taking part (the world size).
    pub num_replicas: usize,
    /// This process's rank, below `num_replicas`.
    pub rank: usize,
    /// Cut the epoch so every rank gets the same whole number of samples, instead of padding it.
    pub drop_last: bool,
}

impl DistributedSampler {
    /// Rank `rank` of `num_replicas`, padding the epoch (PyTorch's defaults).
    pub fn new(num_replicas: usize, rank: usize) -> Result<DistributedSampler> {
        if num_replicas == 0 || rank >= num_replicas {
            return Err(Error::InvalidArgument {
                op: "DistributedSampler",
                msg: format!(
                    "Invalid rank {rank}, rank should be in the interval [0, {}]",
                    num_replicas as i64 - 1
                ),
            });
        }
        Ok(DistributedSampler {
            num_replicas,
            rank,
            drop_last: false,
        })
    }

    /// Samples this rank draws from a dataset of `len` per epoch (PyTorch's `num_samples`).
    pub fn num_samples(&self, len: usize) -> usize {
        let r = self.num_replicas;
        if self.drop_last && !len.is_multiple_of(r) {
            len.saturating_sub(r).div_ceil(r)
        } else {
            len.div_ceil(r)
        }
    }

    /// This rank's indices out of one epoch's `order` of the whole dataset.
    pub fn shard(&self, order: &[usize]) -> Vec<usize> {
        let total = self.num_samples(order.len()) * self.num_replicas;
        let mut all: Vec<usize> = order.iter().copied().take(total).collect();
        while all.len() < total && !order.is_empty() {
            let more = (total - all.len()).min(order.len());
            all.extend_from_slice(&order[..more]);
        }
        all.into_iter()
            .skip(self.rank)
            .step_by(self.num_replicas)
            .collect()
    }
}

impl Default for LoaderOptions {
    fn default() -> Self {
        LoaderOptions {
            batch_size: 64,
            shuffle: false,
            drop_last: false,
            pin_memory: true,
            prefetch: 2,
            num_workers: 1,
            seed: 0x5EED,
            sampler: None,
        }
    }
}

/// PyTorch's `DataLoader`: batches of a dataset on a device, assembled in pinned memory on a worker thread and uploaded ahead with non-blocking copies (see `LoaderOptions`).
pub struct DataLoader<D: Dataset> {
    dataset: Arc<D>,
    device: Device,
    options: LoaderOptions,
    /// Epochs started (the next `iter` draws epoch `epoch`'s order).
    epoch: u64,
    /// Batches the last `iter` handed out, shared with it, and how many it holds.
    handed_out: Arc<AtomicUsize>,
    in_flight: usize,
    /// Batches of the next epoch to skip: a resumed run continues mid-epoch.
    resume_at: usize,
}

/// Where a loader is (torchdata's `StatefulDataLoader.state_dict()`): the epoch whose batches
/// are being handed out and how many of them were handed out, with what fixes the order. A
/// loader restored from it hands out exactly the batches the saved one would have next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoaderState {
    /// The epoch being handed out.
    pub epoch: u64,
    /// Batches of it handed out.
    pub position: usize,
    /// The shuffle's seed.
    pub seed: u64,
    /// Samples per batch.
    pub batch_size: usize,
    /// Samples in the dataset.
    pub dataset_len: usize,
}

/// A loader whose position a training checkpoint saves and restores (object safe, so that one
/// checkpoint call takes any `DataLoader<D>`).
pub trait Resumable {
    /// Where the loader is now.
    fn loader_state(&self) -> LoaderState;
    /// Checks that `state` fits this loader (same dataset size and batch size, a position
    /// within the epoch) without changing anything.
    fn check_loader_state(&self, state: &LoaderState) -> Result<()>;
    /// Restores `state` (checked first): the next `iter` resumes there.
    fn load_loader_state(&mut self, state: &LoaderState) -> Result<()>;
}

impl<D: Dataset> Resumable for DataLoader<D> {
    fn loader_state(&self) -> LoaderState {
        let done = self.handed_out.load(Ordering::Acquire);
        let (epoch, position) = if self.epoch > 0 && done < self.in_flight {
            (self.epoch - 1, done)
        } else {
            (self.epoch, self.resume_at)
        };
        LoaderState {
            epoch,
            position,
            seed: self.options.seed,
            batch_size: self.options.batch_size,
            dataset_len: self.dataset.len(),
        }
    }

    fn check_loader_state(&self, state: &LoaderState) -> Result<()> {
        let bad = |msg: String| {
            Err(Error::InvalidArgument {
                op: "DataLoader.load_state_dict",
                msg,
            })
        };
        if state.batch_size != self.options.batch_size || state.dataset_len != self.dataset.len() {
            return bad(format!(
                "saved for {} samples in batches of {}, this loader has {} in batches of {}",
                state.dataset_len,
                state.batch_size,
                self.dataset.len(),
                self.options.batch_size
            ));
        }
        if state.position > self.len() {
            return bad(format!(
                "position {} is past the {} batches of an epoch",
                state.position,
                self.len()
            ));
        }
        Ok(())
    }

    fn load_loader_state(&mut self, state: &LoaderState) -> Result<()> {
        self.check_loader_state(state)?;
        self.epoch = state.epoch;
        self.resume_at = state.position;
        self.options.seed = state.seed;
        self.handed_out = Arc::new(AtomicUsize::new(0));
        self.in_flight = 0;
        Ok(())
    }
}

/// One batch on the device: features [n, ...sample_shape] (f32) and labels `[n]` (i32).
pub type Batch = (Tensor, Tensor);

impl<D: Dataset> DataLoader<D> {
    /// A loader over `dataset` that puts batches on `device`.
    pub fn new(dataset: Arc<D>, device: &Device, options: LoaderOptions) -> Result<Self> {
        if options.batch_size == 0 {
            return Err(Error::InvalidArgument {
                op: "DataLoader",
                msg: "batch_size must be at least 1".into(),
            });
        }
        Ok(DataLoader {
            dataset,
            device: device.clone(),
            options,
            epoch: 0,
            handed_out: Arc::new(AtomicUsize::new(0)),
            in_flight: 0,
            resume_at: 0,
        })
    }

    /// Samples this process draws per epoch (its sampler's share).
    fn samples_per_epoch(&self) -> usize {
        let n = self.dataset.len();
        self.options.sampler.map_or(n, |s| s.num_samples(n))
    }

    /// Batches per epoch.
    pub fn len(&self) -> usize {
        let (n, b) = (self.samples_per_epoch(), self.options.batch_size);
        if self.options.drop_last {
            n / b
        } else {
            n.div_ceil(b)
        }
    }

    /// Whether an epoch has no batches.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The sample order of the next epoch.
    fn order(&mut self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.dataset.len()).collect();
        if self.options.shuffle {
            let mut s = self.options.seed ^ self.epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            for i in (1..order.len()).rev() {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                order.swap(i, (s % (i as u64 + 1)) as usize);
            }
        }
        self.epoch += 1;
        match self.options.sampler {
            Some(s) => s.shard(&order),
            None => order,
        }
    }

    /// One epoch's batches, in order, on the device (after `load_loader_state`, the rest of
    /// the saved epoch).
    pub fn iter(&mut self) -> Batches {
        let order = self.order();
        let b = self.options.batch_size;
        let mut batches: Vec<Vec<usize>> = order.chunks(b).map(<[usize]>::to_vec).collect();
        if self.options.drop_last && batches.last().is_some_and(|l| l.len() < b) {
            batches.pop();
        }
        let skip = std::mem::take(&mut self.resume_at).min(batches.len());
        self.in_flight = batches.len();
        self.handed_out = Arc::new(AtomicUsize::new(skip));
        let batches: Vec<Vec<usize>> = batches.split_off(skip);
        let pinned = self.options.pin_memory && !self.device.is_cpu();
        let depth = self.options.prefetch.max(1);
        let (tx, rx) = sync_channel(depth);
        let dataset = self.dataset.clone();
        let gpu = self.device.clone();
        let threads = self.options.num_workers.max(1);
        let worker = std::thread::spawn(move || {
            for idx in batches {
                let batch = assemble(dataset.as_ref(), &idx, pinned.then_some(&gpu), threads);
                if tx.send(batch).is_err() {
                    return; // the iterator was dropped
                }
            }
        });
        Batches {
            handed_out: self.handed_out.clone(),
            rx,
            ready: VecDeque::new(),
            device: self.device.clone(),
            depth,
            pinned,
            worker: Some(worker),
        }
    }
}

/// A batch in host memory: pinned on `gpu` (written in place) or on the CPU device.
fn assemble<D: Dataset>(
    dataset: &D,
    idx: &[usize],
    gpu: Option<&Device>,
    threads: usize,
) -> Result<Batch> {
    let shape = dataset.sample_shape();
    let per: usize = shape.iter().product();
    let mut full = vec![idx.len()];
    full.extend_from_slice(&shape);
    let (x, y) = match gpu {
        Some(g) => (
            Tensor::empty_pinned(&full, DType::F32, g, PinnedKind::Upload)?,
            Tensor::empty_pinned(&[idx.len()], DType::I32, g, PinnedKind::Upload)?,
        ),
        None => {
            let cpu = Device::cpu()?;
            (
                Tensor::empty(&full, DType::F32, &cpu)?,
                Tensor::empty(&[idx.len()], DType::I32, &cpu)?,
            )
        }
    };
    let fill = |idx: &[usize], xs: &mut [f32]| -> Vec<i32> {
        idx.iter()
            .zip(xs.chunks_exact_mut(per.max(1)))
            .map(|(&i, out)| dataset.get(i, out))
            .collect()
    };
    let labels = x.with_host_data_mut(|xs: &mut [f32]| {
        if threads < 2 || idx.len() < 2 * threads {
            return fill(idx, xs);
        }
        let rows = idx.len().div_ceil(threads);
        std::thread::scope(|s| {
            let parts: Vec<_> = idx
                .chunks(rows)
                .zip(xs.chunks_mut(rows * per.max(1)))
                .map(|(i, x)| s.spawn(move || fill(i, x)))
                .collect();
            parts
                .into_iter()
                .flat_map(|p| p.join().unwrap_or_default())
                .collect()
        })
    })?;
    if labels.len() != idx.len() {
        return Err(Error::InvalidArgument {
            op: "DataLoader",
            msg: "a dataset's get panicked on a worker thread".into(),
        });
    }
    y.with_host_data_mut(|ys: &mut [i32]| ys.copy_from_slice(&labels))?;
    Ok((x, y))
}

/// An epoch in flight: `next` hands out batch k while batches k+1.. are being assembled by the
/// worker and uploaded.
pub struct Batches {
    /// Counts the batches `next` returned, for the loader's `loader_state`.
    handed_out: Arc<AtomicUsize>,
    rx: Receiver<Result<Batch>>,
    ready: VecDeque<Batch>,
    device: Device,
    depth: usize,
    pinned: bool,
    worker: Option<std::thread::JoinHandle<()>>,
}

impl Batches {
    /// Moves the next assembled batch to the device (non-blocking from pinned memory).
    fn upload_one(&mut self) -> Option<Result<()>> {
        let (x, y) = match self.rx.recv() {
            Ok(Ok(b)) => b,
            Ok(Err(e)) => return Some(Err(e)),
            Err(_) => return None, // the worker is done
        };
        let _scope = crate::alloc::kiln_scope(|| "DataLoader.__next__".into(), "kiln data");
        let up = |t: &Tensor| {
            if self.pinned {
                t.to_device_non_blocking(&self.device)
            } else {
                t.to_device(&self.device)
            }
        };
        Some(
            up(&x)
                .and_then(|gx| Ok((gx, up(&y)?)))
                .map(|b| self.ready.push_back(b)),
        )
    }
}

impl Iterator for Batches {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        // Keep `depth` batches uploaded beyond the one handed out.
        while self.ready.len() <= self.depth {
            match self.upload_one() {
                Some(Ok(())) => {}
                Some(Err(e)) => return Some(Err(e)),
                None => break,
            }
        }
        let batch = self.ready.pop_front()?;
        self.handed_out.fetch_add(1, Ordering::AcqRel);
        Some(Ok(batch))
    }
}

impl Drop for Batches {
    fn drop(&mut self) {
        // Unblock the worker (its sends fail once the receiver is gone), then join it.
        let (_, dead) = sync_channel(1);
        drop(std::mem::replace(&mut self.rx, dead));
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}
