//! Models with the module trees and parameter names of the checkpoints people download, so
//! that a published state dict saved as safetensors loads by name: torchvision's ResNets
//! (`resnet.rs`) and GPT-2 (`gpt2.rs`, Hugging Face's and nanoGPT's names).

mod gpt2;
mod gpt2_generate;
mod resnet;

pub use gpt2::{gpt2, Gpt, GptConfig};
pub use gpt2_generate::{KvCache, Sampling};
pub use resnet::{resnet18, resnet50, ResNet};
