//! kiln: tensors and autograd as WGSL compute shaders through wgpu, with a caching allocator
//! that behaves like PyTorch's CUDA caching allocator. See ARCHITECTURE.md for the layers.

// wgpu-core's types are deep: proving the bind-group cache (keyed by `wgpu::BindGroupLayout`) and
// the statics that reach it `Send`/`Sync` needs more than the default 128 levels in release builds.
#![recursion_limit = "256"]

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
pub use device::{adapters, AdapterInfo, Device, DeviceBlock, Event, RngState, Transfer};
pub use host::{HostStats, PinnedKind};
pub use tensor::{enable_grad, inference_mode, no_grad};
pub use tensor::{DType, Element, Tensor};
