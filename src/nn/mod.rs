//! Modules, losses and initialisers in the image of `torch.nn`. Parameters are tensors that
//! require grad; a module owns them, and `parameters()` hands out handles that share their
//! storage and `.grad` (clones of a tensor are the same tensor), which is what an optimizer keeps.
//!
//! # What is here
//!
//! - `layers.rs`: `Module` and the layers. `Sequential` hands a `Relu` to the layer before it
//!   (`Module::forward_then_relu`), which `Linear` runs as `ops::linear_relu`: PyTorch's two
//!   nodes and allocations, one pass where the f32 vec4 kernel takes the product.
//! - `recurrent.rs`: the LSTM cell; `loss.rs`: losses (nll_loss is one op, `ops/loss.rs`, as
//!   PyTorch's); `init.rs`: initialisers; `models.rs`: the ResNets with torchvision's names.
//! - `utils.rs`: `clip_grad_norm_`, on the device, with no host read.
//! - `state.rs`: state dicts and `StateDict` (tensors plus string metadata) in safetensors files,
//!   read and validated in host memory before anything is allocated, written atomically.

mod attention;
pub mod init;
mod layers;
mod loss;
pub mod models;
mod recurrent;
mod state;
mod utils;

/// `torch.nn.functional.scaled_dot_product_attention` and `layer_norm`, where PyTorch users
/// look for them.
pub use crate::ops::{layer_norm, scaled_dot_product_attention};
pub use attention::MultiheadAttention;
pub use layers::{
    AdaptiveAvgPool2d, BatchNorm, BatchNorm2d, Conv2d, Dropout, Embedding, Flatten, Gelu,
    LayerNorm, Linear, MaxPool2d, Relu, ReluInplace, Sequential, Sigmoid, Silu, Tanh,
};
pub use loss::{cross_entropy, mse_loss, nll_loss};
pub use recurrent::LstmCell;
pub(crate) use state::stage_strict;
pub use state::{load_safetensors, load_state_dict, save_safetensors, state_dict, StateDict};
pub use utils::clip_grad_norm_;

use crate::tensor::Tensor;
use crate::{Device, Result};

/// A layer or a model (PyTorch's `nn.Module`).
pub trait Module: Send + Sync {
    /// The layer's output for `x`.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;

    /// `relu(self.forward(x))`, which a layer with a fused kernel overrides (`BatchNorm`: the
    /// ReLU inside its own passes, one autograd node). A model calls it where PyTorch's would
    /// follow the layer with `nn.ReLU`; the values are the same.
    fn forward_relu(&self, x: &Tensor) -> Result<Tensor> {
        self.forward(x)?.relu()
    }

    /// `relu(self.forward(x))` with the graph and every allocation of the two ops unchanged,
    /// which a layer overrides where it can apply the ReLU in its own kernel (`Linear`:
    /// `ops::linear_relu`). `Sequential` calls it for a layer followed by `Relu`.
    fn forward_then_relu(&self, x: &Tensor) -> Result<Tensor> {
        self.forward(x)?.relu()
    }

    /// Whether this is `Relu` (out of place), which `Sequential` hands to the layer before it
    /// (`forward_then_relu`).
    fn is_relu(&self) -> bool {
        false
    }

    /// Parameters with their dotted paths (`0.weight`), in registration order.
    fn named_parameters(&self) -> Vec<(String, Tensor)>;

    /// Every parameter and buffer, mutably, with its path (for moving and loading).
    fn tensors_mut(&mut self) -> Vec<(String, &mut Tensor)>;

    /// Non-trainable state (BatchNorm's running statistics).
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }

    /// Training (`true`) or evaluation mode: Dropout and BatchNorm behave differently.
    fn train(&mut self, mode: bool) {
        let _ = mode;
    }

    /// Evaluation mode (`train(false)`).
    fn eval(&mut self) {
        self.train(false);
    }

    /// The parameters, in `named_parameters`' order: handles that share their storage and `.grad`.
    fn parameters(&self) -> Vec<Tensor> {
        self.named_parameters()
            .into_iter()
            .map(|(_, t)| t)
            .collect()
    }

    /// Drops (`set_to_none`, PyTorch's default) or zeroes every parameter's gradient.
    fn zero_grad(&self, set_to_none: bool) -> Result<()> {
        for p in self.parameters() {
            p.zero_grad(set_to_none)?;
        }
        Ok(())
    }

    /// Moves every parameter and buffer to `device` (parameters stay leaves that require grad).
    fn to_device(&mut self, device: &Device) -> Result<()> {
        for (_, t) in self.tensors_mut() {
            if t.device() != device {
                let requires = t.requires_grad();
                *t = crate::no_grad(|| t.to_device(device))?.requires_grad_(requires)?;
            }
        }
        Ok(())
    }
}

/// Prefixes child paths: `prefix.name`.
pub(crate) fn prefixed<T>(prefix: &str, items: Vec<(String, T)>) -> Vec<(String, T)> {
    items
        .into_iter()
        .map(|(n, t)| (format!("{prefix}.{n}"), t))
        .collect()
}
