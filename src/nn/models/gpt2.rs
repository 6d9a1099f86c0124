//! GPT-2 (Radford et al. 2019) with the layout and parameter names of the checkpoints people
//! download: Hugging Face's `GPT2LMHeadModel` (`transformer.h.0.attn.c_attn.weight`, ...,
//! `transformer.ln_f.bias`), whose `Conv1D` layers store their weights `[in, out]`, with
//! `lm_head` tied to `transformer.wte` (one tensor, listed once, as PyTorch's
//! `named_parameters` lists it). nanoGPT uses the same names. Pre-norm blocks: x + attn(ln_1(x)),
//! then x + mlp(ln_2(x)); causal `scaled_dot_product_attention`; GELU with the tanh
//! approximation; initialisation as GPT-2's (normal 0.02, the residual projections 0.02 /
//! sqrt(2 n_layer), biases zero).

use crate::nn::{prefixed, Dropout, Embedding, Module};
use crate::tensor::{DType, Tensor};
use crate::{Device, Error, Result};
use std::path::Path;

/// GPT-2's hyperparameters (Hugging Face's `GPT2Config`: `vocab_size`, `n_positions`,
/// `n_layer`, `n_head`, `n_embd`, the dropouts and `layer_norm_epsilon`).
#[derive(Clone, Debug, PartialEq)]
pub struct GptConfig {
    /// Tokens in the vocabulary (50257 for GPT-2's BPE).
    pub vocab_size: usize,
    /// The longest sequence (`n_positions`, nanoGPT's `block_size`).
    pub block_size: usize,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Attention heads per block.
    pub n_head: usize,
    /// The embedding width.
    pub n_embd: usize,
    /// Dropout on embeddings, attention probabilities and residual branches (GPT-2: 0.1 in
    /// pre-training; 0 here, as nanoGPT's default).
    pub dropout: f64,
    /// LayerNorm's epsilon (1e-5).
    pub layer_norm_eps: f64,
}

impl GptConfig {
    /// GPT-2 small, 124,439,808 parameters: 12 layers, 12 heads, 768 wide, 1024 positions.
    pub fn gpt2() -> GptConfig {
        GptConfig {
            vocab_size: 50257,
            block_size: 1024,
            n_layer: 12,
            n_head: 12,
            n_embd: 768,
            dropout: 0.0,
            layer_norm_eps: 1e-5,
        }
    }

    /// A small model for tests and CPU adapters: 2 layers, 2 heads, 64 wide, 64 positions.
    pub fn tiny(vocab_size: usize) -> GptConfig {
        GptConfig {
            vocab_size,
            block_size: 64,
            n_layer: 2,
            n_head: 2,
            n_embd: 64,
            ..GptConfig::gpt2()
        }
    }

    /// The head width.
    pub fn head_dim(&self) -> usize {
        self.n_embd / self.n_head.max(1)
    }

    fn check(&self) -> Result<()> {
        let sizes = [
            self.vocab_size,
            self.block_size,
            self.n_layer,
            self.n_head,
            self.n_embd,
        ];
        if sizes.contains(&0) || !self.n_embd.is_multiple_of(self.n_head) {
            return Err(Error::InvalidArgument {
                op: "gpt2",
                msg: format!("every size positive and n_embd a multiple of n_head: {self:?}"),
            });
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(Error::InvalidArgument {
                op: "gpt2",
                msg: format!(
                    "dropout probability has to be in [0, 1), got {}",
                    self.dropout
                ),
            });
        }
        Ok(())
    }
}

fn normal(shape: &[usize], std: f64, device: &Device) -> Result<Tensor> {
    Tensor::normal(shape, 0.0, std, DType::F32, device)?.requires_grad_(true)
}

/// A layer's `weight` and `bias`, named as the checkpoints name them.
fn weight_and_bias(weight: &Tensor, bias: &Tensor) -> Vec<(String, Tensor)> {
    vec![
        ("weight".into(), weight.clone()),
        ("bias".into(), bias.clone()),
    ]
}

fn weight_and_bias_mut<'a>(
    weight: &'a mut Tensor,
    bias: &'a mut Tensor,
) -> Vec<(String, &'a mut Tensor)> {
    vec![("weight".into(), weight), ("bias".into(), bias)]
}

/// GPT-2's `Conv1D`: `x W + b` with `W` stored `[in, out]`, as the checkpoints store it.
#[derive(Clone)]
pub(super) struct Conv1D {
    pub weight: Tensor,
    pub bias: Tensor,
}

impl Conv1D {
    fn new(n_in: usize, n_out: usize, std: f64, device: &Device) -> Result<Conv1D> {
        Ok(Conv1D {
            weight: normal(&[n_in, n_out], std, device)?,
            bias: Tensor::zeros(&[n_out], DType::F32, device)?.requires_grad_(true)?,
        })
    }

    /// Over the last dim of `[..., in]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // Under autocast the weight is cast as it is stored, `[in, out]` (a leaf: the cast is
        // cached, as for Hugging Face's `addmm(bias, x, weight)`), and the product reads the
        // cast's transpose in place. Cast as `weight.t()`, it took the strided cast kernel and
        // its gradient a transposing copy back: 1.7 ms of GPT-2's AMP step on the H200.
        let inputs = [x, &self.weight, &self.bias];
        if let Some(v) = crate::ops::autocast::lower("linear", &inputs)? {
            return crate::ops::autocast::suspended(|| Self::apply(&v[0], &v[1], &v[2]));
        }
        Self::apply(x, &self.weight, &self.bias)
    }

    /// `x W + b` over the last dim of `x`, as `linear(x, W^T, b)`.
    fn apply(x: &Tensor, weight: &Tensor, bias: &Tensor) -> Result<Tensor> {
        let shape = x.shape().to_vec();
        let (n_in, n_out) = (weight.shape()[0], weight.shape()[1]);
        let rows = x.numel() / n_in.max(1);
        let y = crate::ops::linear(
            &x.reshape(&[rows as isize, n_in as isize])?,
            &weight.t()?,
            Some(bias),
        )?;
        let mut out: Vec<isize> = shape[..shape.len() - 1]
            .iter()
            .map(|&d| d as isize)
            .collect();
        out.push(n_out as isize);
        y.reshape(&out)
    }

    fn named(&self) -> Vec<(String, Tensor)> {
        weight_and_bias(&self.weight, &self.bias)
    }

    fn named_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        weight_and_bias_mut(&mut self.weight, &mut self.bias)
    }
}

/// One transformer block: `ln_1`, `attn` (`c_attn`, `c_proj`), `ln_2`, `mlp` (`c_fc`, `c_proj`).
#[derive(Clone)]
pub(super) struct GptBlock {
    pub ln_1: LnParams,
    pub c_attn: Conv1D,
    pub attn_proj: Conv1D,
    pub ln_2: LnParams,
    pub c_fc: Conv1D,
    pub mlp_proj: Conv1D,
    pub n_head: usize,
    pub dropout: f64,
    pub training: bool,
}

/// A LayerNorm's weight and bias (cloneable handles, for checkpointed blocks).
#[derive(Clone)]
pub(super) struct LnParams {
    pub weight: Tensor,
    pub bias: Tensor,
    pub eps: f64,
}

impl LnParams {
    fn new(n: usize, eps: f64, device: &Device) -> Result<LnParams> {
        Ok(LnParams {
            weight: Tensor::ones(&[n], DType::F32, device)?.requires_grad_(true)?,
            bias: Tensor::zeros(&[n], DType::F32, device)?.requires_grad_(true)?,
            eps,
        })
    }

    fn named(&self) -> Vec<(String, Tensor)> {
        weight_and_bias(&self.weight, &self.bias)
    }

    fn named_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        weight_and_bias_mut(&mut self.weight, &mut self.bias)
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let n = self.weight.shape()[0];
        crate::ops::layer_norm(x, &[n], Some(&self.weight), Some(&self.bias), self.eps)
    }
}

/// The key and value views a block's attention reads when generating: the cache's first
/// `pos + new` positions, after the new ones are written at `pos`.
pub(super) struct CacheSlot<'a> {
    pub k: &'a Tensor,
    pub v: &'a Tensor,
    pub pos: usize,
}

impl GptBlock {
    fn new(c: &GptConfig, device: &Device) -> Result<GptBlock> {
        let (n, std) = (c.n_embd, 0.02);
        let proj_std = 0.02 / (2.0 * c.n_layer as f64).sqrt();
        Ok(GptBlock {
            ln_1: LnParams::new(n, c.layer_norm_eps, device)?,
            c_attn: Conv1D::new(n, 3 * n, std, device)?,
            attn_proj: Conv1D::new(n, n, proj_std, device)?,
            ln_2: LnParams::new(n, c.layer_norm_eps, device)?,
            c_fc: Conv1D::new(n, 4 * n, std, device)?,
            mlp_proj: Conv1D::new(4 * n, n, proj_std, device)?,
            n_head: c.n_head,
            dropout: c.dropout,
            training: true,
        })
    }

    fn dropout(&self, x: Tensor) -> Result<Tensor> {
        if !self.training || self.dropout == 0.0 {
            return Ok(x);
        }
        Dropout::new(self.dropout)?.forward(&x)
    }

    /// Causal self-attention over `[B, T, C]`; with a cache, the new keys and values are
    /// written into it and the queries see every cached position up to their own.
    pub fn attn(&self, x: &Tensor, cache: Option<CacheSlot>) -> Result<Tensor> {
        let (b, t, c) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        let (h, d) = (self.n_head, c / self.n_head);
        let qkv = self.c_attn.forward(x)?;
        // Views of [B, T, 3C] as [B, H, T, D] (the kernels read them through their strides).
        let head = |i: usize| -> Result<Tensor> {
            qkv.narrow(2, i * c, c)?
                .reshape(&[b as isize, t as isize, h as isize, d as isize])?
                .transpose(1, 2)
        };
        let (q, k, v) = (head(0)?, head(1)?, head(2)?);
        let p = if self.training { self.dropout } else { 0.0 };
        let y = match cache {
            None => crate::ops::scaled_dot_product_attention(&q, &k, &v, None, p, true, None)?,
            Some(slot) => {
                crate::no_grad(|| -> Result<()> {
                    slot.k.narrow(2, slot.pos, t)?.copy_(&k)?;
                    slot.v.narrow(2, slot.pos, t)?.copy_(&v)
                })?;
                let end = slot.pos + t;
                let (ks, vs) = (slot.k.narrow(2, 0, end)?, slot.v.narrow(2, 0, end)?);
                // A prompt from position 0 is causal as it stands, a single new token sees every
                // cached key, and new tokens after cached ones need the shifted mask.
                let causal = slot.pos == 0 && t > 1;
                let mask = (slot.pos > 0 && t > 1)
                    .then(|| cached_mask(slot.pos, t, x.device()))
                    .transpose()?;
                crate::ops::scaled_dot_product_attention(
                    &q,
                    &ks,
                    &vs,
                    mask.as_ref(),
                    0.0,
                    causal,
                    None,
                )?
            }
        };
        let y = y
            .transpose(1, 2)?
            .reshape(&[b as isize, t as isize, c as isize])?;
        self.dropout(self.attn_proj.forward(&y)?)
    }

    pub fn mlp(&self, x: &Tensor) -> Result<Tensor> {
        let hidden = self.c_fc.forward(x)?.gelu_tanh()?;
        self.dropout(self.mlp_proj.forward(&hidden)?)
    }

    pub fn forward_cached(&self, x: &Tensor, cache: Option<CacheSlot>) -> Result<Tensor> {
        let x = x.add(&self.attn(&self.ln_1.forward(x)?, cache)?)?;
        x.add(&self.mlp(&self.ln_2.forward(&x)?)?)
    }

    fn named(&self) -> Vec<(String, Tensor)> {
        [
            prefixed("ln_1", self.ln_1.named()),
            prefixed("attn.c_attn", self.c_attn.named()),
            prefixed("attn.c_proj", self.attn_proj.named()),
            prefixed("ln_2", self.ln_2.named()),
            prefixed("mlp.c_fc", self.c_fc.named()),
            prefixed("mlp.c_proj", self.mlp_proj.named()),
        ]
        .concat()
    }

    fn named_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        [
            prefixed("ln_1", self.ln_1.named_mut()),
            prefixed("attn.c_attn", self.c_attn.named_mut()),
            prefixed("attn.c_proj", self.attn_proj.named_mut()),
            prefixed("ln_2", self.ln_2.named_mut()),
            prefixed("mlp.c_fc", self.c_fc.named_mut()),
            prefixed("mlp.c_proj", self.mlp_proj.named_mut()),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// Query `pos + i` sees key `j` when `j <= pos + i`: the mask of `t` new queries after `pos`
/// cached positions.
fn cached_mask(pos: usize, t: usize, device: &Device) -> Result<Tensor> {
    let keys = pos + t;
    let bits: Vec<f32> = (0..t)
        .flat_map(|i| (0..keys).map(move |j| if j <= pos + i { 1.0 } else { 0.0 }))
        .collect();
    Tensor::from_slice(&bits, &[t, keys], device)?.to_dtype(DType::Bool)
}

/// GPT-2: token and position embeddings, `n_layer` blocks, a final LayerNorm and the tied
/// language-model head. `forward` takes i32 token ids `[B, T]` and gives logits `[B, T, vocab]`.
pub struct Gpt {
    /// The hyperparameters.
    pub config: GptConfig,
    /// `transformer.wte`: token embeddings, also the head's weight.
    pub wte: Embedding,
    /// `transformer.wpe`: position embeddings.
    pub wpe: Embedding,
    pub(super) blocks: Vec<GptBlock>,
    pub(super) ln_f: LnParams,
    /// Runs each block under `checkpoint` while training (activations recomputed in
    /// backward, PyTorch's `torch.utils.checkpoint` per block).
    pub checkpoint_blocks: bool,
    training: bool,
}

/// `Gpt::new(config, device)`.
pub fn gpt2(config: GptConfig, device: &Device) -> Result<Gpt> {
    Gpt::new(config, device)
}

impl Gpt {
    /// A freshly initialised model on `device` (f32 parameters).
    pub fn new(config: GptConfig, device: &Device) -> Result<Gpt> {
        config.check()?;
        let c = &config;
        let wte = Embedding {
            weight: normal(&[c.vocab_size, c.n_embd], 0.02, device)?,
        };
        let wpe = Embedding {
            weight: normal(&[c.block_size, c.n_embd], 0.02, device)?,
        };
        let blocks = (0..c.n_layer)
            .map(|_| GptBlock::new(c, device))
            .collect::<Result<_>>()?;
        let ln_f = LnParams::new(c.n_embd, c.layer_norm_eps, device)?;
        Ok(Gpt {
            config,
            wte,
            wpe,
            blocks,
            ln_f,
            checkpoint_blocks: false,
            training: true,
        })
    }

    /// Every parameter's element count (the tied head counted once, as PyTorch counts).
    pub fn num_parameters(&self) -> usize {
        self.parameters().iter().map(|p| p.numel()).sum()
    }

    fn check_ids(&self, ids: &Tensor, pos: usize) -> Result<(usize, usize)> {
        if ids.rank() != 2 || ids.dtype() != DType::I32 {
            return Err(Error::InvalidArgument {
                op: "gpt2",
                msg: format!(
                    "expected i32 token ids [B, T], got {} of shape {:?}",
                    ids.dtype(),
                    ids.shape()
                ),
            });
        }
        let (b, t) = (ids.shape()[0], ids.shape()[1]);
        if pos + t > self.config.block_size || t == 0 {
            return Err(Error::InvalidArgument {
                op: "gpt2",
                msg: format!(
                    "Cannot forward sequence of length {}, block size is only {}",
                    pos + t,
                    self.config.block_size
                ),
            });
        }
        Ok((b, t))
    }

    /// The embeddings of `ids` at positions `pos..pos + T`.
    pub(super) fn embed(&self, ids: &Tensor, pos: usize) -> Result<Tensor> {
        let (_, t) = self.check_ids(ids, pos)?;
        let positions =
            Tensor::arange(pos as f64, (pos + t) as f64, 1.0, DType::I32, ids.device())?;
        let x = self.wte.forward(ids)?.add(&self.wpe.forward(&positions)?)?;
        match self.training && self.config.dropout > 0.0 {
            true => Dropout::new(self.config.dropout)?.forward(&x),
            false => Ok(x),
        }
    }

    /// The final LayerNorm and the tied head: logits `[B, T, vocab]`.
    pub(super) fn head(&self, x: &Tensor) -> Result<Tensor> {
        let x = self.ln_f.forward(x)?;
        let (b, t, c) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        let logits = crate::ops::linear(
            &x.reshape(&[(b * t) as isize, c as isize])?,
            &self.wte.weight,
            None,
        )?;
        logits.reshape(&[b as isize, t as isize, self.config.vocab_size as isize])
    }

    /// The mean cross-entropy of next-token prediction: `logits` of `ids` against `targets`
    /// (i32 `[B, T]`), as nanoGPT's `model(idx, targets)`.
    pub fn loss(&self, ids: &Tensor, targets: &Tensor) -> Result<Tensor> {
        let logits = self.forward(ids)?;
        let v = self.config.vocab_size as isize;
        crate::nn::cross_entropy(&logits.reshape(&[-1, v])?, &targets.reshape(&[-1])?)
    }

    /// Reads a GPT-2 checkpoint saved as safetensors (Hugging Face's `model.safetensors`, with
    /// or without the `transformer.` prefix; nanoGPT's; kiln's own) into this model by name.
    /// The attention's mask buffers (`attn.bias`, `attn.masked_bias`) and a stored
    /// `lm_head.weight` (tied to `wte`) are skipped; BF16, F16 and F32 tensors are converted to
    /// the parameters' dtype. Strict otherwise: a missing or unexpected name, or a shape that
    /// differs, is an error and leaves the model unchanged.
    pub fn load_safetensors(&mut self, path: &Path) -> Result<()> {
        let skip = |n: &str| {
            n.ends_with(".attn.bias") || n.ends_with(".attn.masked_bias") || n == "lm_head.weight"
        };
        let state = crate::nn::state::load_safetensors_where(path, &Device::cpu()?, &|n| !skip(n))?;
        let state: Vec<(String, Tensor)> = state
            .into_iter()
            .map(|(n, t)| match n.starts_with("transformer.") {
                true => (n, t),
                false => (format!("transformer.{n}"), t),
            })
            .collect();
        crate::nn::load_state_dict(self, &state)
    }

    /// Runs the blocks over the embeddings `x`, checkpointed when asked and training.
    fn blocks_forward(&self, mut x: Tensor) -> Result<Tensor> {
        for (i, block) in self.blocks.iter().enumerate() {
            let _scope = crate::alloc::kiln_scope(|| format!("transformer.h.{i}"), "kiln nn");
            x = match self.checkpoint_blocks && self.training && crate::tensor::is_grad_enabled() {
                true => {
                    let block = block.clone();
                    crate::autograd::checkpoint(
                        move |xs: &[Tensor]| block.forward_cached(&xs[0], None),
                        &[x],
                    )?
                }
                false => block.forward_cached(&x, None)?,
            };
        }
        Ok(x)
    }
}

impl Module for Gpt {
    /// Logits `[B, T, vocab]` of i32 token ids `[B, T]`.
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let x = self.embed(ids, 0)?;
        let x = self.blocks_forward(x)?;
        self.head(&x)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![
            (
                "transformer.wte.weight".to_string(),
                self.wte.weight.clone(),
            ),
            (
                "transformer.wpe.weight".to_string(),
                self.wpe.weight.clone(),
            ),
        ];
        for (i, b) in self.blocks.iter().enumerate() {
            out.extend(prefixed(&format!("transformer.h.{i}"), b.named()));
        }
        out.extend(prefixed("transformer.ln_f", self.ln_f.named()));
        out
    }

    fn tensors_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        let mut out = vec![
            ("transformer.wte.weight".to_string(), &mut self.wte.weight),
            ("transformer.wpe.weight".to_string(), &mut self.wpe.weight),
        ];
        for (i, b) in self.blocks.iter_mut().enumerate() {
            out.extend(prefixed(&format!("transformer.h.{i}"), b.named_mut()));
        }
        out.extend(prefixed("transformer.ln_f", self.ln_f.named_mut()));
        out
    }

    fn train(&mut self, mode: bool) {
        self.training = mode;
        for b in &mut self.blocks {
            b.training = mode;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::MultiheadAttention;

    /// A block's attention (q, k, v as strided views of one projection) against
    /// `MultiheadAttention` (separate projections, checked against PyTorch's definition) with the
    /// same weights, causal.
    #[test]
    fn block_attention_matches_multihead_attention() {
        let dev = Device::cpu().unwrap();
        let c = GptConfig {
            n_embd: 16,
            n_head: 4,
            ..GptConfig::tiny(10)
        };
        let mut block = GptBlock::new(&c, &dev).unwrap();
        block.c_attn.bias = Tensor::randn(&[48], DType::F32, &dev).unwrap();
        let mut mha = MultiheadAttention::with_options(16, 4, 0.0, true, true, &dev).unwrap();
        mha.in_proj_weight = block.c_attn.weight.t().unwrap().contiguous().unwrap();
        mha.in_proj_bias = Some(block.c_attn.bias.clone());
        mha.out_proj.weight = block.attn_proj.weight.t().unwrap().contiguous().unwrap();
        mha.out_proj.bias = Some(block.attn_proj.bias.clone());
        let x = Tensor::randn(&[2, 7, 16], DType::F32, &dev).unwrap();
        let got = block.attn(&x, None).unwrap().to_vec::<f32>().unwrap();
        let want = mha
            .attend(&x, &x, &x, None, true)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-5, "{worst}");
    }
}
