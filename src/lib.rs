//! kiln: tensors and autograd as WGSL compute shaders through [wgpu], on any GPU wgpu reaches
//! (Vulkan, Metal, DX12, GL; NVIDIA datacenter GPUs included), with a caching allocator that
//! behaves like PyTorch's CUDA caching allocator: the same rounding, pools, block splitting,
//! statistics, `memory_summary`, snapshots and out-of-memory behaviour, so the memory tools a
//! PyTorch user knows give the same numbers on every GPU, from Rust.
//!
//! # Quickstart
//!
//! ```
//! use kiln::{DType, Device, Tensor};
//!
//! # fn main() -> kiln::Result<()> {
//! let dev = Device::best()?; // a GPU if there is one; KILN_DEVICE=vulkan:0|gl:0|cpu chooses
//! let x = Tensor::ones(&[1000, 1000], DType::F32, &dev)?;
//! assert_eq!(dev.memory_allocated(), 4_000_256); // 3.81 MiB rounded to 512 bytes, as PyTorch
//! assert_eq!(dev.memory_reserved(), 20 << 20); // one 20 MiB segment of the large pool
//! let y = (&x.t()? + &x)?.gelu()?.sum(&[1], false)?; // views, broadcasting, kernels
//! assert_eq!(y.shape(), &[1000]);
//! drop((x, y));
//! dev.empty_cache();
//! assert_eq!(dev.memory_reserved(), 0);
//! # Ok(())
//! # }
//! ```
//!
//! Training looks like PyTorch's loop, line for line (the `training_loop` example adds
//! autocast, `GradScaler` and a pinned `DataLoader`):
//!
//! ```
//! use kiln::nn::{cross_entropy, Linear, Module, Relu, Sequential};
//! use kiln::optim::{Optimizer, Sgd};
//! use kiln::{DType, Device, Tensor};
//!
//! # fn main() -> kiln::Result<()> {
//! let dev = Device::best()?;
//! dev.manual_seed(0);
//! let model = Sequential::new()
//!     .push(Linear::new(784, 128, true, &dev)?)
//!     .push(Relu)
//!     .push(Linear::new(128, 10, true, &dev)?);
//! let mut opt = Sgd::new(model.parameters(), 0.1)?.momentum(0.9)?;
//! let x = Tensor::randn(&[64, 784], DType::F32, &dev)?;
//! let y = Tensor::from_slice(&[3i32; 64], &[64], &dev)?;
//! let mut first = None;
//! for _ in 0..5 {
//!     opt.zero_grad(true)?; // optimizer.zero_grad(set_to_none=True)
//!     let loss = cross_entropy(&model.forward(&x)?, &y)?;
//!     loss.backward()?; // frees the graph's saved tensors, as PyTorch does
//!     opt.step()?;
//!     let value = loss.item::<f32>()?; // a number: the graph is not kept alive
//!     first.get_or_insert(value);
//!     assert!(value <= first.unwrap() + 1e-4);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # PyTorch's memory API and kiln's names
//!
//! | PyTorch | kiln |
//! |---|---|
//! | `torch.cuda.memory_allocated()`, `max_memory_allocated()` | [`Device::memory_allocated`], [`Device::max_memory_allocated`] |
//! | `torch.cuda.memory_reserved()`, `max_memory_reserved()` | [`Device::memory_reserved`], [`Device::max_memory_reserved`] |
//! | `torch.cuda.memory_stats()` (its 122 keys) | [`Device::memory_stats`] |
//! | `torch.cuda.memory_summary()` | [`Device::memory_summary`] |
//! | `torch.cuda.reset_peak_memory_stats()` | [`Device::reset_peak_memory_stats`] |
//! | `torch.cuda.empty_cache()` | [`Device::empty_cache`] |
//! | `torch.cuda.set_per_process_memory_fraction()` | [`Device::set_per_process_memory_fraction`], [`Device::set_memory_limit`] |
//! | `torch.cuda.mem_get_info()` | [`Device::mem_get_info`] |
//! | `PYTORCH_CUDA_ALLOC_CONF` (`expandable_segments`, `max_split_size_mb`, ...) | `KILN_ALLOC_CONF`, [`Device::set_allocator_settings`] |
//! | `torch.cuda.memory._record_memory_history()` | [`Device::record_memory_history`] |
//! | `torch.cuda.memory._snapshot()`, `_dump_snapshot()` | [`Device::memory_snapshot`], [`Device::dump_snapshot`] (PyTorch's pickle: memory_viz opens it) |
//! | `torch.cuda.OutOfMemoryError` | [`Error::OutOfMemory`], with the allocator's numbers |
//! | `tensor.pin_memory()`, `torch.empty(..., pin_memory=True)` | [`Tensor::pin_memory`], [`Tensor::empty_pinned`] |
//! | `tensor.to(device, non_blocking=True)` | [`Tensor::to_device_non_blocking`], [`Transfer`] |
//! | `torch.cuda.synchronize()`, `torch.cuda.Event` | [`Device::synchronize`], [`Event`] |
//! | the pinned-memory cache's statistics | [`Device::host_memory_stats`], [`Device::empty_host_cache`] |
//! | `torch.no_grad()`, `torch.inference_mode()` | [`no_grad`], [`inference_mode`] |
//! | `torch.utils.checkpoint.checkpoint` | [`checkpoint`] |
//! | `torch.autocast`, `torch.amp.GradScaler` | [`amp::autocast`], [`amp::GradScaler`] |
//! | `torch.profiler.profile`, `record_function` | [`profiler::profile`], [`profiler::record_function`] |
//!
//! Beyond PyTorch: [`viz`] draws a snapshot's memory timeline as SVG or PNG, [`debug`] lists
//! the live tensors and the graphs they keep alive, and [`training::Checkpoint`] saves and
//! restores a whole training state atomically.
//!
//! # The examples
//!
//! | example | what it shows |
//! |---|---|
//! | `quickstart` | the code above: tensors on the best device and PyTorch's memory numbers |
//! | `train` | the main example: an MLP or CNN trained with PyTorch's memory figures per epoch, `memory_summary`, AMP, checkpointing, snapshots, profiling, `--ddp` |
//! | `training_loop` | PyTorch's memory-efficient AMP training loop, line for line |
//! | `memory_leaks` | the usual memory pitfalls (gradients never zeroed, a loss kept with its graph, hidden states not detached, evaluation without `no_grad`) and their fixes |
//! | `resnet_memory` | the CUDA memory notebook's ResNet-50 scenario, beside PyTorch's figures |
//! | `fragmentation` | fragmenting training with and without expandable segments |
//! | `empty_cache`, `replay_trace` | `empty_cache`'s numbers; PyTorch's recorded allocator traces replayed |
//! | `adapters`, `autotune`, `shader_stats` | the adapters and their features; tuning ahead of time; what a driver made of each kernel |
//! | `bench`, `ddp_scaling` | the benchmarks behind `BENCHMARKS.md`; data-parallel scaling |
//!
//! # Errors
//!
//! Every public operation returns [`Result`]: a shape, dtype or device mismatch, an index out of
//! range, an in-place change to a tensor autograd needs, out of memory, all are an [`Error`]
//! that names the op and its operands and leaves the device, the allocator and every other
//! tensor as they were.
//!
//! ```
//! use kiln::{DType, Device, Error, Tensor};
//!
//! # fn main() -> kiln::Result<()> {
//! let dev = Device::cpu()?;
//! let a = Tensor::zeros(&[2, 3], DType::F32, &dev)?;
//! let b = Tensor::zeros(&[4, 5], DType::F32, &dev)?;
//! assert!(matches!(a.matmul(&b), Err(Error::ShapeMismatch { .. })));
//! # Ok(())
//! # }
//! ```
//!
//! `ARCHITECTURE.md` in the repository maps the layers; `BENCHMARKS.md` holds the figures.

// wgpu-core's types are deep: proving the bind-group cache (keyed by `wgpu::BindGroupLayout`) and
// the statics that reach it `Send`/`Sync` needs more than the default 128 levels in release builds.
#![recursion_limit = "256"]
#![warn(missing_docs)]

pub mod alloc;
pub mod amp;
pub mod autograd;
mod base;
mod cpu;
pub mod data;
pub mod debug;
pub mod device;
pub mod distributed;
mod graph;
pub mod host;
pub mod kernels;
pub mod nn;
pub mod ops;
pub mod optim;
pub mod profiler;
pub mod tensor;
pub mod training;
pub mod viz;

pub use autograd::checkpoint;
pub use base::{Error, Result};
pub use device::{
    adapters, AdapterInfo, Device, DeviceBlock, Event, PlanTarget, RngState, Transfer,
};
pub use host::{HostStats, PinnedKind};
pub use tensor::{enable_grad, inference_mode, no_grad};
pub use tensor::{DType, Element, Tensor};
