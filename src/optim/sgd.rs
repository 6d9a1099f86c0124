//! `torch.optim.SGD`: momentum, dampening, nesterov, weight decay; on a GPU the parameters
//! that allow it up to six to a launch (`shaders/optim_multi.wgsl`), the others one to a
//! launch; on a CPU adapter every parameter one to a launch (`on_cpu_adapter`).

use super::*;
use crate::kernels::{sgd_multi_immediates, sgd_multi_slots};

/// Stochastic gradient descent, PyTorch's formulas.
pub struct Sgd {
    params: Vec<Tensor>,
    /// The learning rate.
    pub lr: f64,
    /// The momentum factor (0: none).
    pub momentum: f64,
    /// Dampening of the momentum.
    pub dampening: f64,
    /// L2 penalty.
    pub weight_decay: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
    buffers: Vec<Option<Tensor>>,
}

impl Sgd {
    /// SGD over `params` with learning rate `lr` and no momentum.
    pub fn new(params: Vec<Tensor>, lr: f64) -> Result<Self> {
        check_params("SGD", &params)?;
        let n = params.len();
        let sgd = Sgd {
            params,
            lr,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            buffers: vec![None; n],
        };
        sgd.check()?;
        Ok(sgd)
    }

    /// Each setter checks the whole set, as PyTorch's constructor does (so `momentum` comes
    /// before `nesterov(true)`, which needs it).
    pub fn momentum(mut self, momentum: f64) -> Result<Self> {
        self.momentum = momentum;
        self.check().map(|()| self)
    }

    /// Sets the dampening, checked as `torch.optim.SGD` checks it.
    pub fn dampening(mut self, dampening: f64) -> Result<Self> {
        self.dampening = dampening;
        self.check().map(|()| self)
    }

    /// Sets Nesterov momentum (which needs momentum and no dampening, as in PyTorch).
    pub fn nesterov(mut self, nesterov: bool) -> Result<Self> {
        self.nesterov = nesterov;
        self.check().map(|()| self)
    }

    /// Sets the weight decay, checked as `torch.optim.SGD` checks it.
    pub fn weight_decay(mut self, weight_decay: f64) -> Result<Self> {
        self.weight_decay = weight_decay;
        self.check().map(|()| self)
    }

    /// `torch.optim.SGD`'s checks, on the public fields: at construction, at every setter and
    /// at every step (a field changed in between is caught before it touches a parameter).
    pub fn check(&self) -> Result<()> {
        const OP: &str = "SGD";
        check_hyper(OP, "learning rate", self.lr, self.lr >= 0.0)?;
        check_hyper(OP, "momentum value", self.momentum, self.momentum >= 0.0)?;
        check_hyper(OP, "dampening value", self.dampening, true)?;
        check_hyper(
            OP,
            "weight_decay value",
            self.weight_decay,
            self.weight_decay >= 0.0,
        )?;
        if self.nesterov && (self.momentum <= 0.0 || self.dampening != 0.0) {
            return Err(invalid(
                OP,
                "Nesterov momentum requires a momentum and zero dampening".into(),
            ));
        }
        Ok(())
    }

    /// Parameter `i`'s update, with its momentum buffer created on its first step (PyTorch
    /// clones the gradient into it; the kernel writes it); `None` without a gradient.
    fn prepare(&mut self, i: usize) -> Result<Option<SgdWork>> {
        let p = &self.params[i];
        let Some(g) = p.grad() else {
            return Ok(None);
        };
        let first = self.buffers[i].is_none();
        if self.momentum != 0.0 && first {
            let buf = Tensor::empty(p.shape(), p.dtype(), p.device())?;
            buf.mark(MemoryCategory::OptimizerState);
            self.buffers[i] = Some(buf);
        }
        Ok(Some(SgdWork {
            p: p.detach(),
            g,
            buf: self.buffers[i].clone(),
            first,
        }))
    }

    /// Bit 0 nesterov, bit 1 first step, bit 2 momentum in use (`shaders/optim*.wgsl`).
    fn flags(&self, first: bool) -> u32 {
        self.nesterov as u32 | (first as u32) << 1 | ((self.momentum != 0.0) as u32) << 2
    }

    fn step_one(&self, w: SgdWork) -> Result<()> {
        let SgdWork { p, g, buf, first } = w;
        let buf = buf.as_ref();
        if fusable(&[&p, &g]) && buf.is_none_or(|b| fusable(&[b])) {
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
                self.flags(first),
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

    /// Up to `slots` updates (`multi_eligible`, one device and dtype) in one launch of
    /// `shaders/optim_multi.wgsl`; a single one on the one-parameter kernel.
    fn step_many(&self, batch: &mut Vec<SgdWork>, slots: usize) -> Result<()> {
        if batch.len() <= 1 {
            return batch.pop().map_or(Ok(()), |w| self.step_one(w));
        }
        let first = &batch[0];
        let kernel = Kernel::SgdMulti(first.p.dtype(), slots);
        let mut imm = Vec::with_capacity(sgd_multi_immediates(slots));
        let mut blocks = Vec::with_capacity(3 * slots);
        let mut flags = self.flags(false);
        let mut groups = 0u64;
        let vec4_off = |t: &Tensor| (t.layout().offset / 4) as u32;
        for j in 0..slots {
            // An unused slot binds the first parameter again, with nothing to do.
            let w = batch.get(j);
            let numel = w.map_or(0, |w| w.p.numel());
            let n = numel.div_ceil(4);
            flags |= w.is_some_and(|w| w.first) as u32 * (256 << j);
            flags |= ((numel % 4) as u32) << (16 + 2 * j);
            imm.extend([
                n as u32,
                w.map_or(0, |w| vec4_off(&w.p)),
                w.map_or(0, |w| vec4_off(&w.g)),
                w.and_then(|w| w.buf.as_ref()).map_or(0, vec4_off),
            ]);
            let w = w.unwrap_or(first);
            blocks.push(&w.p.storage.block);
            blocks.push(&w.g.storage.block);
            blocks.push(
                w.buf
                    .as_ref()
                    .map_or(&w.p.storage.block, |b| &b.storage.block),
            );
            groups += (n as u64).div_ceil(256);
        }
        imm.push(flags);
        imm.extend(
            [self.lr, self.weight_decay, self.momentum, self.dampening]
                .map(|x| (x as f32).to_bits()),
        );
        imm.resize(kernel.immediate_size() as usize / 4, 0);
        launch(kernel, &blocks, &imm, groups * 256)?;
        for w in batch.drain(..) {
            w.p.bump_version();
        }
        Ok(())
    }
}

/// How SGD launches the parameters of `p`'s device: up to six to a launch, as PyTorch's
/// foreach step (`multi`, the default), or one to a launch (`per_parameter`, the default on a
/// CPU adapter: `on_cpu_adapter`). `force_variant("sgd", ..)` picks either (the tests run the
/// multi-parameter kernel on lavapipe so).
fn batched(p: &Tensor) -> bool {
    let mut candidates = [(true, "multi"), (false, "per_parameter")];
    if on_cpu_adapter(p) {
        candidates.reverse();
    }
    crate::kernels::tune::remembered(p.device(), "sgd", || "launch".into(), &candidates)
}

/// One parameter's SGD update: the detached parameter, its gradient, its momentum buffer.
struct SgdWork {
    p: Tensor,
    g: Tensor,
    buf: Option<Tensor>,
    first: bool,
}

/// Whether `w` can join a multi-parameter launch (`Kernel::SgdMulti`): vec4s of one float
/// dtype, contiguous, on an adapter with the kernel's bindings and immediates. A count that is
/// not a multiple of 4 is taken where each tensor's block holds its last vec4 whole (the
/// allocator's 512-byte rounding gives that to any fresh tensor): the kernel reads those
/// elements and writes them back unchanged.
fn multi_eligible(w: &SgdWork) -> Option<usize> {
    let tensors: Vec<&Tensor> = [&w.p, &w.g].into_iter().chain(w.buf.as_ref()).collect();
    let slots = w.p.device().adapter_info().and_then(|i| {
        sgd_multi_slots(
            i.limits.max_storage_buffers_per_shader_stage,
            i.limits.max_immediate_size,
        )
    })?;
    let whole = w.p.numel().next_multiple_of(4);
    let fits = tensors.iter().all(|t| {
        let end = (t.layout().offset + whole) * t.dtype().size_bytes();
        t.layout().offset.is_multiple_of(4) && end as u64 <= t.storage.block.block_size()
    });
    (fusable(&tensors) && fits).then_some(slots)
}

impl Optimizer for Sgd {
    fn step(&mut self) -> Result<()> {
        self.check()?;
        let _scope = crate::alloc::kiln_scope(|| "SGD.step".into(), "kiln optim");
        // One op: what the step allocates and frees is a temporary.
        let _op = crate::alloc::op_scope();
        // PyTorch's foreach step: the parameters that allow it go as many to a launch as the
        // adapter's kernel takes (`SGD_MULTI`), in order (so their momentum buffers are created
        // in order, as before).
        no_grad(|| {
            let mut batch: Vec<SgdWork> = Vec::new();
            let mut slots = 0;
            // `batched` for the last parameter's device (asked once per device, not per
            // parameter).
            let mut launch: Option<(crate::Device, bool)> = None;
            for i in 0..self.params.len() {
                let Some(w) = self.prepare(i)? else {
                    continue;
                };
                let together = match &launch {
                    Some((d, b)) if d == w.p.device() => *b,
                    _ => {
                        let b = batched(&w.p);
                        launch = Some((w.p.device().clone(), b));
                        b
                    }
                };
                let Some(n) = multi_eligible(&w).filter(|_| together) else {
                    self.step_one(w)?;
                    continue;
                };
                let joins = batch
                    .first()
                    .is_none_or(|b| b.p.device() == w.p.device() && b.p.dtype() == w.p.dtype());
                if !joins {
                    self.step_many(&mut batch, slots)?;
                }
                slots = n;
                batch.push(w);
                if batch.len() == slots {
                    self.step_many(&mut batch, slots)?;
                }
            }
            self.step_many(&mut batch, slots)
        })
    }
    fn params(&self) -> &[Tensor] {
        &self.params
    }
    fn state_dict(&self) -> StateDict {
        let tensors = self
            .buffers
            .iter()
            .enumerate()
            .filter_map(|(i, b)| Some((format!("state.{i}.momentum_buffer"), b.clone()?)))
            .collect();
        let group = [
            ("lr", float_text(self.lr)),
            ("momentum", float_text(self.momentum)),
            ("dampening", float_text(self.dampening)),
            ("weight_decay", float_text(self.weight_decay)),
            ("nesterov", self.nesterov.to_string()),
        ];
        StateDict {
            tensors,
            metadata: group_metadata("SGD", self.params.len(), group),
        }
    }

    fn load_state_dict(&mut self, state: &StateDict) -> Result<()> {
        const OP: &str = "SGD.load_state_dict";
        check_groups(OP, state, "SGD", self.params.len())?;
        let mut hyper = Sgd {
            params: Vec::new(),
            lr: group_value(OP, state, "lr")?,
            momentum: group_value(OP, state, "momentum")?,
            dampening: group_value(OP, state, "dampening")?,
            weight_decay: group_value(OP, state, "weight_decay")?,
            nesterov: group_value(OP, state, "nesterov")?,
            buffers: Vec::new(),
        };
        hyper.check()?;
        let (mut slots, steps) = stage_state(OP, state, &self.params, &["momentum_buffer"])?;
        if let Some(i) = steps.iter().position(Option::is_some) {
            return Err(invalid(OP, format!("unexpected key \"state.{i}.step\"")));
        }
        hyper.params = std::mem::take(&mut self.params);
        hyper.buffers = slots.remove(0);
        *self = hyper;
        Ok(())
    }
}
