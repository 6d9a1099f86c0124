//! `nn.MultiheadAttention`: PyTorch's parameters (`in_proj_weight` `[3E, E]`, `in_proj_bias`,
//! `out_proj.weight`, `out_proj.bias`) and initialisation (Xavier-uniform projections, zero
//! biases), `batch_first`, and its masks (a bool `attn_mask` is True where attention is *not*
//! allowed, the opposite of `scaled_dot_product_attention`'s; a float mask is added), over the
//! fused attention. It returns the output only, as PyTorch's `need_weights=False` (the fast
//! path); the averaged attention weights would need the score matrix that the kernels never
//! hold.

use super::{Linear, Module};
use crate::tensor::{DType, Tensor};
use crate::{Device, Error, Result};

/// `nn.MultiheadAttention(embed_dim, num_heads, dropout, bias, batch_first)`, with queries,
/// keys and values of one width.
pub struct MultiheadAttention {
    /// The query, key and value projections stacked: `[3 E, E]`.
    pub in_proj_weight: Tensor,
    /// `[3 E]`, with `bias`.
    pub in_proj_bias: Option<Tensor>,
    /// The output projection `[E, E]` (`out_proj.weight`, `out_proj.bias`).
    pub out_proj: Linear,
    /// Heads; `E` divides by it.
    pub num_heads: usize,
    /// Inputs `[B, T, E]` (`true`) or `[T, B, E]` (PyTorch's default).
    pub batch_first: bool,
    /// Dropout on the attention probabilities while training.
    pub dropout: f64,
    training: bool,
}

impl MultiheadAttention {
    /// `nn.MultiheadAttention(embed_dim, num_heads)`: biases, no dropout, `[T, B, E]` inputs.
    pub fn new(embed_dim: usize, num_heads: usize, device: &Device) -> Result<Self> {
        Self::with_options(embed_dim, num_heads, 0.0, true, false, device)
    }

    /// Every option of PyTorch's constructor that kiln takes.
    pub fn with_options(
        embed_dim: usize,
        num_heads: usize,
        dropout: f64,
        bias: bool,
        batch_first: bool,
        device: &Device,
    ) -> Result<Self> {
        if num_heads == 0 || !embed_dim.is_multiple_of(num_heads) || embed_dim == 0 {
            return Err(Error::InvalidArgument {
                op: "MultiheadAttention",
                msg: format!("embed_dim must be divisible by num_heads ({embed_dim}, {num_heads})"),
            });
        }
        if !(0.0..1.0).contains(&dropout) {
            return Err(Error::InvalidArgument {
                op: "MultiheadAttention",
                msg: format!("dropout probability has to be in [0, 1), got {dropout}"),
            });
        }
        let e = embed_dim;
        let w = super::init::xavier_uniform(&[3 * e, e], 1.0, DType::F32, device)?;
        let zeros = |n: usize| Tensor::zeros(&[n], DType::F32, device)?.requires_grad_(true);
        let mut out_proj = Linear::new(e, e, bias, device)?;
        if bias {
            out_proj.bias = Some(zeros(e)?);
        }
        Ok(MultiheadAttention {
            in_proj_weight: w.requires_grad_(true)?,
            in_proj_bias: if bias { Some(zeros(3 * e)?) } else { None },
            out_proj,
            num_heads,
            batch_first,
            dropout,
            training: true,
        })
    }

    /// `mha(query, key, value, attn_mask=..., need_weights=False, is_causal=...)[0]`. Masks are
    /// `[L, S]` or `[B * heads, L, S]`, bool (True: not allowed) or float (added).
    pub fn attend(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        attn_mask: Option<&Tensor>,
        is_causal: bool,
    ) -> Result<Tensor> {
        let batch = |t: &Tensor| -> Result<Tensor> {
            if t.rank() != 3 {
                return Err(Error::InvalidArgument {
                    op: "MultiheadAttention",
                    msg: format!("expected 3-D inputs, got shape {:?}", t.shape()),
                });
            }
            match self.batch_first {
                true => Ok(t.clone()),
                false => t.transpose(0, 1),
            }
        };
        let (q, k, v) = (batch(query)?, batch(key)?, batch(value)?);
        let e = self.in_proj_weight.shape()[1];
        let (b, l, s) = (q.shape()[0], q.shape()[1], k.shape()[1]);
        let h = self.num_heads;
        let project = |x: &Tensor, i: usize, len: usize| -> Result<Tensor> {
            let w = self.in_proj_weight.narrow(0, i * e, e)?;
            let bias = self
                .in_proj_bias
                .as_ref()
                .map(|b| b.narrow(0, i * e, e))
                .transpose()?;
            let y = crate::ops::linear(x, &w, bias.as_ref())?;
            y.reshape(&[b as isize, len as isize, h as isize, (e / h) as isize])?
                .transpose(1, 2)
        };
        let (qh, kh, vh) = (project(&q, 0, l)?, project(&k, 1, s)?, project(&v, 2, s)?);
        let mask = attn_mask
            .map(|m| -> Result<Tensor> {
                let m = match m.rank() {
                    3 => m.reshape(&[b as isize, h as isize, l as isize, s as isize])?,
                    _ => m.clone(),
                };
                match m.dtype() {
                    // PyTorch's MHA: True hides; SDPA: True shows.
                    DType::Bool => Tensor::zeros(m.shape(), q.dtype(), q.device())?
                        .masked_fill(&m, f64::NEG_INFINITY),
                    _ => Ok(m),
                }
            })
            .transpose()?;
        let p = if self.training { self.dropout } else { 0.0 };
        let causal = is_causal && mask.is_none();
        let y = crate::ops::scaled_dot_product_attention(
            &qh,
            &kh,
            &vh,
            mask.as_ref(),
            p,
            causal,
            None,
        )?;
        let y = y
            .transpose(1, 2)?
            .reshape(&[b as isize, l as isize, e as isize])?;
        let out = self.out_proj.forward(&y)?;
        match self.batch_first {
            true => Ok(out),
            false => out.transpose(0, 1),
        }
    }
}

impl Module for MultiheadAttention {
    /// Self-attention: `attend(x, x, x, None, false)`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.attend(x, x, x, None, false)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![("in_proj_weight".to_string(), self.in_proj_weight.clone())];
        out.extend(
            self.in_proj_bias
                .iter()
                .map(|b| ("in_proj_bias".to_string(), b.clone())),
        );
        out.extend(super::prefixed(
            "out_proj",
            self.out_proj.named_parameters(),
        ));
        out
    }
    fn tensors_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        let mut out = vec![("in_proj_weight".to_string(), &mut self.in_proj_weight)];
        out.extend(
            self.in_proj_bias
                .iter_mut()
                .map(|b| ("in_proj_bias".to_string(), b)),
        );
        out.extend(super::prefixed("out_proj", self.out_proj.tensors_mut()));
        out
    }
    fn train(&mut self, mode: bool) {
        self.training = mode;
    }
}
