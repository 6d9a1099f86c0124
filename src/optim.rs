//! Optimizers in the image of `torch.optim`: SGD (momentum, dampening, nesterov, weight decay)
//! and Adam/AdamW. State (momentum buffers, Adam's moments) is created on the first `step`, so
//! it shows up in the memory timeline there, as in PyTorch. On a GPU each parameter is updated
//! by one fused kernel (`shaders/optim.wgsl`); the CPU device composes the same formulas from
//! tensor ops, which makes it the reference the fused kernels are tested against.

use crate::alloc::MemoryCategory;
use crate::kernels::{launch, Kernel, OptimKernel};
use crate::tensor::{DType, Tensor};
use crate::{no_grad, Error, Result};

/// What every optimizer offers.
pub trait Optimizer {
    /// One update of every parameter that has a gradient.
    fn step(&mut self) -> Result<()>;

    /// The parameters it updates.
    fn params(&self) -> &[Tensor];

    /// Drops (`set_to_none`, PyTorch's default since 2.0) or zeroes every gradient.
    fn zero_grad(&self, set_to_none: bool) -> Result<()> {
        for p in self.params() {
            p.zero_grad(set_to_none)?;
        }
        Ok(())
    }

    /// The state tensors with PyTorch's names (`state.{i}.momentum_buffer`, `exp_avg`, ...).
    fn state_tensors(&self) -> Vec<(String, Tensor)>;

    /// Replaces state tensors by name (shapes must match); unknown names are an error.
    fn load_state_tensors(&mut self, state: Vec<(String, Tensor)>) -> Result<()>;
}

/// Whether the fused kernel can run: every tensor of one float dtype (f32, or f16 with the math
/// in f32), contiguous, on a GPU, 32-bit sized.
fn fusable(tensors: &[&Tensor]) -> bool {
    let dtype = tensors.first().map(|t| t.dtype());
    tensors.iter().all(|t| {
        Some(t.dtype()) == dtype
            && matches!(t.dtype(), DType::F32 | DType::F16)
            && t.is_contiguous()
            && !t.device().is_cpu()
            && t.numel() < u32::MAX as usize
            && t.layout().offset < u32::MAX as usize
    })
}

#[allow(clippy::too_many_arguments)]
fn fused(
    kind: OptimKernel,
    p: &Tensor,
    g: &Tensor,
    m: Option<&Tensor>,
    v: Option<&Tensor>,
    flags: u32,
    floats: [f32; 7],
) -> Result<()> {
    // Four elements per invocation where every count and offset allows vec4 loads.
    let all = [Some(p), Some(g), m, v];
    let vec4 = p.numel().is_multiple_of(4)
        && all
            .iter()
            .flatten()
            .all(|t| t.layout().offset.is_multiple_of(4));
    let (kind, w) = match (kind, vec4) {
        (OptimKernel::Sgd, true) => (OptimKernel::Sgd4, 4),
        (OptimKernel::Adam, true) => (OptimKernel::Adam4, 4),
        (k, _) => (k, 1),
    };
    let off = |t: Option<&Tensor>| t.map_or(0, |t| (t.layout().offset / w) as u32);
    let mut imm = vec![
        (p.numel() / w) as u32,
        (p.layout().offset / w) as u32,
        (g.layout().offset / w) as u32,
        off(m),
        off(v),
        flags,
    ];
    imm.extend(floats.iter().map(|f| f.to_bits()));
    imm.extend([0, 0, 0]);
    let pb = &p.storage.block;
    let mb = m.map_or(pb, |t| &t.storage.block);
    let vb = v.map_or(pb, |t| &t.storage.block);
    launch(
        Kernel::Optim(kind, p.dtype()),
        &[pb, &g.storage.block, mb, vb],
        &imm,
        (p.numel() / w) as u64,
    )?;
    p.bump_version();
    Ok(())
}

fn check_params(op: &'static str, params: &[Tensor]) -> Result<()> {
    for p in params {
        if !p.requires_grad() || !p.is_leaf() {
            return Err(Error::InvalidArgument {
                op,
                msg: format!(
                    "can't optimize a non-leaf Tensor or one that does not require grad ({:?})",
                    p.shape()
                ),
            });
        }
    }
    Ok(())
}

fn load_into(
    slots: &mut [Option<Tensor>],
    params: &[Tensor],
    name: &str,
    key: &str,
    t: Tensor,
) -> Result<bool> {
    let Some(rest) = key.strip_prefix("state.") else {
        return Ok(false);
    };
    let Some((i, n)) = rest.split_once('.') else {
        return Ok(false);
    };
    let (Ok(i), true) = (i.parse::<usize>(), n == name) else {
        return Ok(false);
    };
    let p = params.get(i).ok_or_else(|| Error::InvalidArgument {
        op: "load_state_dict",
        msg: format!("{key}: no parameter {i}"),
    })?;
    if t.shape() != p.shape() {
        return Err(Error::ShapeMismatch {
            op: "load_state_dict",
            lhs: p.shape().to_vec(),
            rhs: t.shape().to_vec(),
        });
    }
    let t = t.to_device(p.device())?.to_dtype(p.dtype())?;
    t.mark(MemoryCategory::OptimizerState);
    slots[i] = Some(t);
    Ok(true)
}

/// Stochastic gradient descent, PyTorch's formulas.
pub struct Sgd {
    params: Vec<Tensor>,
    pub lr: f64,
    pub momentum: f64,
    pub dampening: f64,
    pub weight_decay: f64,
    pub nesterov: bool,
    buffers: Vec<Option<Tensor>>,
}

impl Sgd {
    pub fn new(params: Vec<Tensor>, lr: f64) -> Result<Self> {
        check_params("SGD", &params)?;
        let n = params.len();
        Ok(Sgd {
            params,
            lr,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            buffers: vec![None; n],
        })
    }

    pub fn momentum(mut self, momentum: f64) -> Self {
        self.momentum = momentum;
        self
    }

    pub fn nesterov(mut self, nesterov: bool) -> Self {
        self.nesterov = nesterov;
        self
    }

    pub fn weight_decay(mut self, weight_decay: f64) -> Self {
        self.weight_decay = weight_decay;
        self
    }

    fn step_one(&mut self, i: usize) -> Result<()> {
        let p = &self.params[i];
        let Some(g) = p.grad() else {
            return Ok(());
        };
        let first = self.buffers[i].is_none();
        if self.momentum != 0.0 && first {
            // PyTorch clones d_p into the buffer; the fused kernel writes it.
            let buf = Tensor::empty(p.shape(), p.dtype(), p.device())?;
            buf.mark(MemoryCategory::OptimizerState);
            self.buffers[i] = Some(buf);
        }
        let buf = self.buffers[i].as_ref();
        let p = p.detach();
        if fusable(&[&p, &g]) && buf.is_none_or(|b| fusable(&[b])) {
            let flags =
                self.nesterov as u32 | (first as u32) << 1 | ((self.momentum != 0.0) as u32) << 2;
            let f = [
                self.lr,
                self.weight_decay,
                self.momentum,
                self.dampening,
                0.0,
                0.0,
                0.0,
            ];
            return fused(
                OptimKernel::Sgd,
                &p,
                &g,
                buf,
                None,
                flags,
                f.map(|x| x as f32),
            );
        }
        let mut d = g.clone();
        if self.weight_decay != 0.0 {
            d = d.add(&p.mul_scalar(self.weight_decay)?)?;
        }
        if let Some(buf) = buf {
            if first {
                buf.copy_(&d)?;
            } else {
                buf.mul_scalar_(self.momentum)?;
                buf.add_(&d.mul_scalar(1.0 - self.dampening)?)?;
            }
            d = if self.nesterov {
                d.add(&buf.mul_scalar(self.momentum)?)?
            } else {
                buf.clone()
            };
        }
        p.sub_(&d.mul_scalar(self.lr)?)
    }
}

impl Optimizer for Sgd {
    fn step(&mut self) -> Result<()> {
        let _scope = crate::alloc::kiln_scope(|| "SGD.step".into(), "kiln optim");
        // One op: what the step allocates and frees is a temporary.
        let _op = crate::alloc::op_scope();
        no_grad(|| (0..self.params.len()).try_for_each(|i| self.step_one(i)))
    }
    fn params(&self) -> &[Tensor] {
        &self.params
    }
    fn state_tensors(&self) -> Vec<(String, Tensor)> {
        self.buffers
            .iter()
            .enumerate()
            .filter_map(|(i, b)| Some((format!("state.{i}.momentum_buffer"), b.clone()?)))
            .collect()
    }
    fn load_state_tensors(&mut self, state: Vec<(String, Tensor)>) -> Result<()> {
        for (key, t) in state {
            if !load_into(&mut self.buffers, &self.params, "momentum_buffer", &key, t)? {
                return Err(Error::InvalidArgument {
                    op: "load_state_dict",
                    msg: format!("SGD has no state {key:?}"),
                });
            }
        }
        Ok(())
    }
}

/// Adam (and AdamW with `decoupled`), PyTorch's formulas without amsgrad.
pub struct Adam {
    params: Vec<Tensor>,
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
    /// AdamW: weight decay applied to the parameter, not added to the gradient.
    pub decoupled: bool,
    exp_avg: Vec<Option<Tensor>>,
    exp_avg_sq: Vec<Option<Tensor>>,
    steps: Vec<u64>,
}

impl Adam {
    pub fn new(params: Vec<Tensor>, lr: f64) -> Result<Self> {
        check_params("Adam", &params)?;
        let n = params.len();
        Ok(Adam {
            params,
            lr,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: false,
            exp_avg: vec![None; n],
            exp_avg_sq: vec![None; n],
            steps: vec![0; n],
        })
    }

    /// AdamW with PyTorch's default weight decay of 0.01.
    pub fn adamw(params: Vec<Tensor>, lr: f64) -> Result<Self> {
        let mut a = Self::new(params, lr)?;
        a.decoupled = true;
        a.weight_decay = 0.01;
        Ok(a)
    }

    pub fn weight_decay(mut self, weight_decay: f64) -> Self {
        self.weight_decay = weight_decay;
        self
    }

    fn step_one(&mut self, i: usize) -> Result<()> {
        let p = self.params[i].detach();
        let Some(g) = self.params[i].grad() else {
            return Ok(());
        };
        if self.exp_avg[i].is_none() {
            for slot in [&mut self.exp_avg[i], &mut self.exp_avg_sq[i]] {
                let t = p.zeros_like()?;
                t.mark(MemoryCategory::OptimizerState);
                *slot = Some(t);
            }
        }
        self.steps[i] += 1;
        let (m, v) = (
            self.exp_avg[i].as_ref().expect("made above"),
            self.exp_avg_sq[i].as_ref().expect("made above"),
        );
        let (b1, b2) = self.betas;
        let t = self.steps[i] as i32;
        let bias1 = 1.0 - b1.powi(t);
        let bias2_sqrt = (1.0 - b2.powi(t)).sqrt();
        if fusable(&[&p, &g, m, v]) {
            let f = [
                self.lr,
                self.weight_decay,
                b1,
                b2,
                self.eps,
                bias1,
                bias2_sqrt,
            ];
            return fused(
                OptimKernel::Adam,
                &p,
                &g,
                Some(m),
                Some(v),
                self.decoupled as u32,
                f.map(|x| x as f32),
            );
        }
        let mut g = g;
        if self.decoupled {
            p.mul_scalar_(1.0 - self.lr * self.weight_decay)?;
        } else if self.weight_decay != 0.0 {
            g = g.add(&p.mul_scalar(self.weight_decay)?)?;
        }
        m.mul_scalar_(b1)?;
        m.add_(&g.mul_scalar(1.0 - b1)?)?;
        v.mul_scalar_(b2)?;
        v.add_(&g.square()?.mul_scalar(1.0 - b2)?)?;
        let denom = v.sqrt()?.div_scalar(bias2_sqrt)?.add_scalar(self.eps)?;
        p.sub_(&m.div(&denom)?.mul_scalar(self.lr / bias1)?)
    }
}

impl Optimizer for Adam {
    fn step(&mut self) -> Result<()> {
        let _scope = crate::alloc::kiln_scope(|| "Adam.step".into(), "kiln optim");
        // One op: what the step allocates and frees is a temporary.
        let _op = crate::alloc::op_scope();
        no_grad(|| (0..self.params.len()).try_for_each(|i| self.step_one(i)))
    }
    fn params(&self) -> &[Tensor] {
        &self.params
    }
    fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let mut v = Vec::new();
        for i in 0..self.params.len() {
            if let (Some(m), Some(s)) = (&self.exp_avg[i], &self.exp_avg_sq[i]) {
                // PyTorch keeps `step` as a CPU tensor.
                let step = crate::Device::cpu()
                    .and_then(|cpu| Tensor::full(&[], self.steps[i] as f64, DType::F32, &cpu));
                if let Ok(step) = step {
                    v.push((format!("state.{i}.step"), step));
                }
                v.push((format!("state.{i}.exp_avg"), m.clone()));
                v.push((format!("state.{i}.exp_avg_sq"), s.clone()));
            }
        }
        v
    }
    fn load_state_tensors(&mut self, state: Vec<(String, Tensor)>) -> Result<()> {
        for (key, t) in state {
            if key.ends_with(".step") {
                let i = key
                    .trim_start_matches("state.")
                    .trim_end_matches(".step")
                    .parse::<usize>()
                    .ok()
                    .filter(|&i| i < self.steps.len())
                    .ok_or_else(|| Error::InvalidArgument {
                        op: "load_state_dict",
                        msg: format!("{key}: no such parameter"),
                    })?;
                self.steps[i] = t.to_f64_vec()?.first().copied().unwrap_or(0.0) as u64;
                continue;
            }
            let loaded = load_into(&mut self.exp_avg, &self.params, "exp_avg", &key, t.clone())?
                || load_into(&mut self.exp_avg_sq, &self.params, "exp_avg_sq", &key, t)?;
            if !loaded {
                return Err(Error::InvalidArgument {
                    op: "load_state_dict",
                    msg: format!("Adam has no state {key:?}"),
                });
            }
        }
        Ok(())
    }
}
