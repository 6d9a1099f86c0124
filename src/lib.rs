//! kiln: tensors and autograd as WGSL compute shaders through wgpu, with a caching allocator
//! that behaves like PyTorch's CUDA caching allocator. See ARCHITECTURE.md for the layers.

pub mod alloc;
pub mod device;
mod error;
pub mod kernels;

pub use device::{adapters, AdapterInfo, Device, DeviceBlock};
pub use error::{Error, Result};
