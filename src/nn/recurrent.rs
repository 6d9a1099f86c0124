//! An LSTM cell (PyTorch's `nn.LSTMCell`): the caller carries `(h, c)` between steps, and must
//! `detach()` them between batches (truncated backpropagation) or the graph, and its memory,
//! grows with every step, exactly as in PyTorch.

use super::{Module, Tensor};
use crate::tensor::DType;
use crate::{Device, Result};

/// `nn.LSTMCell`: one step of an LSTM, with PyTorch's gate order (input, forget, cell, output).
pub struct LstmCell {
    /// `[4 * hidden, input]`.
    pub weight_ih: Tensor,
    /// `[4 * hidden, hidden]`.
    pub weight_hh: Tensor,
    /// `[4 * hidden]`.
    pub bias_ih: Tensor,
    /// `[4 * hidden]`.
    pub bias_hh: Tensor,
    /// The hidden state's size.
    pub hidden: usize,
}

impl LstmCell {
    /// Every weight uniform in ±1/sqrt(hidden), as PyTorch initialises it.
    pub fn new(input: usize, hidden: usize, device: &Device) -> Result<Self> {
        let b = 1.0 / (hidden.max(1) as f64).sqrt();
        let u = |shape: &[usize]| -> Result<Tensor> {
            Tensor::uniform(shape, -b, b, DType::F32, device)?.requires_grad_(true)
        };
        Ok(LstmCell {
            weight_ih: u(&[4 * hidden, input])?,
            weight_hh: u(&[4 * hidden, hidden])?,
            bias_ih: u(&[4 * hidden])?,
            bias_hh: u(&[4 * hidden])?,
            hidden,
        })
    }

    /// One step: `(h', c')` from input `x` [N, input] and state `(h, c)` [N, hidden].
    pub fn step(&self, x: &Tensor, state: (&Tensor, &Tensor)) -> Result<(Tensor, Tensor)> {
        let (h, c) = state;
        let gates = x
            .matmul(&self.weight_ih.t()?)?
            .add(&self.bias_ih)?
            .add(&h.matmul(&self.weight_hh.t()?)?.add(&self.bias_hh)?)?;
        let g = gates.chunk(4, 1)?;
        let (i, f, cell, o) = (
            g[0].sigmoid()?,
            g[1].sigmoid()?,
            g[2].tanh()?,
            g[3].sigmoid()?,
        );
        let c2 = f.mul(c)?.add(&i.mul(&cell)?)?;
        let h2 = o.mul(&c2.tanh()?)?;
        Ok((h2, c2))
    }

    /// A zero state for a batch of `n`.
    pub fn zero_state(&self, n: usize) -> Result<(Tensor, Tensor)> {
        let d = self.weight_ih.device();
        Ok((
            Tensor::zeros(&[n, self.hidden], DType::F32, d)?,
            Tensor::zeros(&[n, self.hidden], DType::F32, d)?,
        ))
    }
}

impl Module for LstmCell {
    /// One step from a zero state; returns `h'`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (h, c) = self.zero_state(x.shape().first().copied().unwrap_or(0))?;
        Ok(self.step(x, (&h, &c))?.0)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        vec![
            ("weight_ih".into(), self.weight_ih.clone()),
            ("weight_hh".into(), self.weight_hh.clone()),
            ("bias_ih".into(), self.bias_ih.clone()),
            ("bias_hh".into(), self.bias_hh.clone()),
        ]
    }
    fn tensors_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        vec![
            ("weight_ih".into(), &mut self.weight_ih),
            ("weight_hh".into(), &mut self.weight_hh),
            ("bias_ih".into(), &mut self.bias_ih),
            ("bias_hh".into(), &mut self.bias_hh),
        ]
    }
}
