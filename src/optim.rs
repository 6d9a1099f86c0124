//! Optimizers in the image of `torch.optim`: SGD (momentum, dampening, nesterov, weight decay)
//! and Adam/AdamW. State (momentum buffers, Adam's moments) is created on the first `step`, so
//! it shows up in the memory timeline there, as in PyTorch. On a GPU each parameter is updated
//! by one fused kernel (`shaders/optim.wgsl`), and SGD steps up to five parameters of whole
//! vec4s in one launch (`shaders/optim_multi.wgsl`, PyTorch's foreach step); the CPU device
//! composes the same formulas from tensor ops, which makes it the reference the fused kernels
//! are tested against.

use crate::alloc::MemoryCategory;
use crate::kernels::{launch, Kernel, OptimKernel, SGD_MULTI, SGD_MULTI_IMMEDIATES};
use crate::nn::StateDict;
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
    fn state_tensors(&self) -> Vec<(String, Tensor)> {
        self.state_dict().tensors
    }

    /// `optimizer.state_dict()`: the state tensors by PyTorch's names (handles, not copies) and
    /// PyTorch's `param_groups` as metadata: `type`, `param_groups.0.params` (`[0, 1, ...]`)
    /// and every hyperparameter as `param_groups.0.{name}`, each float written so that it
    /// parses back to the same bits.
    fn state_dict(&self) -> StateDict;

    /// `optimizer.load_state_dict(state)`: hyperparameters and state tensors (copied onto each
    /// parameter's device and dtype). Everything is checked and staged first (the optimizer
    /// type, the parameter count, every key, shape and hyperparameter): on any error the
    /// optimizer is left exactly as it was.
    fn load_state_dict(&mut self, state: &StateDict) -> Result<()>;
}

/// A hyperparameter check of `torch.optim` (which raises `ValueError`), stricter in one way:
/// values must also be finite, since an infinite or NaN rate silently destroys every parameter.
fn check_hyper(op: &'static str, what: &str, value: f64, ok: bool) -> Result<()> {
    if ok && value.is_finite() {
        return Ok(());
    }
    Err(Error::InvalidArgument {
        op,
        msg: format!("Invalid {what}: {value:?}"),
    })
}

fn invalid(op: &'static str, msg: String) -> Error {
    Error::InvalidArgument { op, msg }
}

/// Writes `x` so that `parse::<f64>()` gives back the same bits (`{:?}` is the shortest
/// round-tripping form).
fn float_text(x: f64) -> String {
    format!("{x:?}")
}

/// The metadata value `param_groups.0.{key}`, parsed.
fn group_value<T: std::str::FromStr>(op: &'static str, state: &StateDict, key: &str) -> Result<T> {
    let full = format!("param_groups.0.{key}");
    let text = state
        .metadata
        .get(&full)
        .ok_or_else(|| invalid(op, format!("missing key {full:?}")))?;
    text.trim()
        .parse()
        .map_err(|_| invalid(op, format!("{full}: cannot parse {text:?}")))
}

/// `[a, b, ...]` of numbers.
fn parse_list<T: std::str::FromStr>(op: &'static str, key: &str, text: &str) -> Result<Vec<T>> {
    let inner = text
        .trim()
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .ok_or_else(|| invalid(op, format!("{key}: expected a list, got {text:?}")))?;
    inner
        .split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(|x| {
            x.parse()
                .map_err(|_| invalid(op, format!("{key}: cannot parse {x:?}")))
        })
        .collect()
}

fn list_text(values: impl IntoIterator<Item = String>) -> String {
    format!("[{}]", values.into_iter().collect::<Vec<_>>().join(", "))
}

/// The checks every optimizer's `load_state_dict` starts with: the type, and one parameter
/// group holding as many parameters as the optimizer has (PyTorch's wording).
fn check_groups(op: &'static str, state: &StateDict, kind: &str, params: usize) -> Result<()> {
    match state.metadata.get("type") {
        Some(t) if t == kind => {}
        Some(t) => {
            return Err(invalid(
                op,
                format!("the state dict is of a {t} optimizer, this one is {kind}"),
            ))
        }
        None => return Err(invalid(op, "missing key \"type\"".into())),
    }
    let ids: Vec<usize> = parse_list(
        op,
        "param_groups.0.params",
        &group_value::<String>(op, state, "params")?,
    )?;
    if ids != (0..params).collect::<Vec<_>>() {
        return Err(invalid(
            op,
            format!("loaded state dict contains a parameter group that doesn't match the size of optimizer's group ({} parameters saved, {params} here)", ids.len()),
        ));
    }
    if let Some(k) = state
        .metadata
        .keys()
        .find(|k| *k != "type" && !k.starts_with("param_groups.0."))
    {
        return Err(invalid(op, format!("unexpected key {k:?}")));
    }
    Ok(())
}

/// Per state name, per parameter, the staged tensor; per parameter, the step count.
type Staged = (Vec<Vec<Option<Tensor>>>, Vec<Option<u64>>);

/// The state tensors of `state`, staged: `slots[name][i]` is a fresh tensor on parameter i's
/// device and dtype. Every key must be `state.{i}.{name}` for a parameter i and one of `names`,
/// with parameter i's shape (`step` entries, 0-d, are returned apart as whole numbers).
fn stage_state(
    op: &'static str,
    state: &StateDict,
    params: &[Tensor],
    names: &[&str],
) -> Result<Staged> {
    let mut slots = vec![vec![None; params.len()]; names.len()];
    let mut steps = vec![None; params.len()];
    for (key, t) in &state.tensors {
        let parsed = key
            .strip_prefix("state.")
            .and_then(|r| r.split_once('.'))
            .and_then(|(i, n)| Some((i.parse::<usize>().ok()?, n)));
        let Some((i, name)) = parsed else {
            return Err(invalid(op, format!("unexpected key {key:?}")));
        };
        let p = params
            .get(i)
            .ok_or_else(|| invalid(op, format!("{key}: there is no parameter {i}")))?;
        if !t.dtype().is_float() {
            return Err(invalid(
                op,
                format!("{key}: expected a float tensor, got {}", t.dtype()),
            ));
        }
        if name == "step" {
            let v = match t.shape() {
                [] | [1] => t.to_f64_vec()?[0],
                s => {
                    return Err(invalid(
                        op,
                        format!("{key}: expected a scalar, got shape {s:?}"),
                    ))
                }
            };
            if !(v >= 0.0 && v.fract() == 0.0 && v < 2f64.powi(53)) {
                return Err(invalid(op, format!("{key}: {v} is not a step count")));
            }
            steps[i] = Some(v as u64);
            continue;
        }
        let Some(slot) = names.iter().position(|n| *n == name) else {
            return Err(invalid(op, format!("unexpected key {key:?}")));
        };
        if t.shape() != p.shape() {
            return Err(invalid(
                op,
                format!(
                    "{key}: shape {:?} does not match the parameter's {:?}",
                    t.shape(),
                    p.shape()
                ),
            ));
        }
        // A fresh tensor, never an alias of the state dict's (the caller may reuse it).
        let staged = no_grad(|| crate::ops::copy(&t.to_device(p.device())?.to_dtype(p.dtype())?))?;
        staged.mark(MemoryCategory::OptimizerState);
        slots[slot][i] = Some(staged);
    }
    Ok((slots, steps))
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

    pub fn dampening(mut self, dampening: f64) -> Result<Self> {
        self.dampening = dampening;
        self.check().map(|()| self)
    }

    pub fn nesterov(mut self, nesterov: bool) -> Result<Self> {
        self.nesterov = nesterov;
        self.check().map(|()| self)
    }

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

    /// Up to `SGD_MULTI` updates (`multi_eligible`, one device and dtype) in one launch of
    /// `shaders/optim_multi.wgsl`; a single one on the one-parameter kernel.
    fn step_many(&self, batch: &mut Vec<SgdWork>) -> Result<()> {
        if batch.len() <= 1 {
            return batch.pop().map_or(Ok(()), |w| self.step_one(w));
        }
        let first = &batch[0];
        let mut imm = Vec::with_capacity(SGD_MULTI_IMMEDIATES);
        let mut blocks = Vec::with_capacity(3 * SGD_MULTI);
        let mut flags = self.flags(false);
        let mut groups = 0u64;
        for j in 0..SGD_MULTI {
            // An unused slot binds the first parameter again, with nothing to do.
            let w = batch.get(j);
            let n = w.map_or(0, |w| w.p.numel() / 4);
            let vec4_off = |t: &Tensor| (t.layout().offset / 4) as u32;
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
            flags |= (w.first && j < batch.len()) as u32 * (256 << j);
            groups += (n as u64).div_ceil(256);
        }
        imm.push(flags);
        imm.extend(
            [self.lr, self.weight_decay, self.momentum, self.dampening]
                .map(|x| (x as f32).to_bits()),
        );
        imm.resize(
            Kernel::SgdMulti(first.p.dtype()).immediate_size() as usize / 4,
            0,
        );
        launch(
            Kernel::SgdMulti(first.p.dtype()),
            &blocks,
            &imm,
            groups * 256,
        )?;
        for w in batch.drain(..) {
            w.p.bump_version();
        }
        Ok(())
    }
}

/// One parameter's SGD update: the detached parameter, its gradient, its momentum buffer.
struct SgdWork {
    p: Tensor,
    g: Tensor,
    buf: Option<Tensor>,
    first: bool,
}

/// Whether `w` can join a multi-parameter launch (`Kernel::SgdMulti`): whole vec4s of one
/// float dtype, contiguous, on an adapter with the kernel's bindings and immediates.
fn multi_eligible(w: &SgdWork) -> bool {
    let tensors: Vec<&Tensor> = [&w.p, &w.g].into_iter().chain(w.buf.as_ref()).collect();
    let fits = w.p.device().adapter_info().is_some_and(|i| {
        i.limits.max_storage_buffers_per_shader_stage >= 3 * SGD_MULTI as u32
            && i.limits.max_immediate_size >= Kernel::SgdMulti(DType::F32).immediate_size()
    });
    fits && fusable(&tensors)
        && w.p.numel().is_multiple_of(4)
        && tensors.iter().all(|t| t.layout().offset.is_multiple_of(4))
}

impl Optimizer for Sgd {
    fn step(&mut self) -> Result<()> {
        self.check()?;
        let _scope = crate::alloc::kiln_scope(|| "SGD.step".into(), "kiln optim");
        // One op: what the step allocates and frees is a temporary.
        let _op = crate::alloc::op_scope();
        // PyTorch's foreach step: the parameters that allow it go `SGD_MULTI` to a launch, in
        // order (so their momentum buffers are created in order, as before).
        no_grad(|| {
            let mut batch: Vec<SgdWork> = Vec::with_capacity(SGD_MULTI);
            for i in 0..self.params.len() {
                let Some(w) = self.prepare(i)? else {
                    continue;
                };
                if !multi_eligible(&w) {
                    self.step_one(w)?;
                    continue;
                }
                let joins = batch
                    .first()
                    .is_none_or(|b| b.p.device() == w.p.device() && b.p.dtype() == w.p.dtype());
                if !joins {
                    self.step_many(&mut batch)?;
                }
                batch.push(w);
                if batch.len() == SGD_MULTI {
                    self.step_many(&mut batch)?;
                }
            }
            self.step_many(&mut batch)
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

/// `type` and `param_groups.0.*` for one group holding every parameter.
fn group_metadata<const N: usize>(
    kind: &str,
    params: usize,
    group: [(&str, String); N],
) -> std::collections::BTreeMap<String, String> {
    let mut m: std::collections::BTreeMap<String, String> = group
        .into_iter()
        .map(|(k, v)| (format!("param_groups.0.{k}"), v))
        .collect();
    m.insert("type".into(), kind.into());
    m.insert(
        "param_groups.0.params".into(),
        list_text((0..params).map(|i| i.to_string())),
    );
    m
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
        let adam = Adam {
            params,
            lr,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: false,
            exp_avg: vec![None; n],
            exp_avg_sq: vec![None; n],
            steps: vec![0; n],
        };
        adam.check()?;
        Ok(adam)
    }

    /// AdamW with PyTorch's default weight decay of 0.01.
    pub fn adamw(params: Vec<Tensor>, lr: f64) -> Result<Self> {
        let mut a = Self::new(params, lr)?;
        a.decoupled = true;
        a.weight_decay = 0.01;
        Ok(a)
    }

    pub fn weight_decay(mut self, weight_decay: f64) -> Result<Self> {
        self.weight_decay = weight_decay;
        self.check().map(|()| self)
    }

    pub fn betas(mut self, beta1: f64, beta2: f64) -> Result<Self> {
        self.betas = (beta1, beta2);
        self.check().map(|()| self)
    }

    pub fn eps(mut self, eps: f64) -> Result<Self> {
        self.eps = eps;
        self.check().map(|()| self)
    }

    fn kind(&self) -> &'static str {
        if self.decoupled {
            "AdamW"
        } else {
            "Adam"
        }
    }

    /// `torch.optim.Adam`'s checks (betas in [0, 1), non-negative lr, eps and weight decay, all
    /// finite), at construction, at every setter and at every step.
    pub fn check(&self) -> Result<()> {
        let op = self.kind();
        let (b1, b2) = self.betas;
        check_hyper(op, "learning rate", self.lr, self.lr >= 0.0)?;
        check_hyper(op, "epsilon value", self.eps, self.eps >= 0.0)?;
        check_hyper(
            op,
            "beta parameter at index 0",
            b1,
            (0.0..1.0).contains(&b1),
        )?;
        check_hyper(
            op,
            "beta parameter at index 1",
            b2,
            (0.0..1.0).contains(&b2),
        )?;
        check_hyper(
            op,
            "weight_decay value",
            self.weight_decay,
            self.weight_decay >= 0.0,
        )
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
        self.check()?;
        let _scope = crate::alloc::kiln_scope(|| "Adam.step".into(), "kiln optim");
        // One op: what the step allocates and frees is a temporary.
        let _op = crate::alloc::op_scope();
        no_grad(|| (0..self.params.len()).try_for_each(|i| self.step_one(i)))
    }
    fn params(&self) -> &[Tensor] {
        &self.params
    }
    fn state_dict(&self) -> StateDict {
        let mut tensors = Vec::new();
        for i in 0..self.params.len() {
            if let (Some(m), Some(s)) = (&self.exp_avg[i], &self.exp_avg_sq[i]) {
                // PyTorch keeps `step` as a 0-d CPU float tensor; kiln's is f64, exact for any
                // step count a run reaches (f32 stops counting at 2^24).
                let step = crate::Device::cpu()
                    .and_then(|cpu| Tensor::full(&[], self.steps[i] as f64, DType::F64, &cpu));
                if let Ok(step) = step {
                    tensors.push((format!("state.{i}.step"), step));
                }
                tensors.push((format!("state.{i}.exp_avg"), m.clone()));
                tensors.push((format!("state.{i}.exp_avg_sq"), s.clone()));
            }
        }
        let group = [
            ("lr", float_text(self.lr)),
            (
                "betas",
                list_text([float_text(self.betas.0), float_text(self.betas.1)]),
            ),
            ("eps", float_text(self.eps)),
            ("weight_decay", float_text(self.weight_decay)),
            ("amsgrad", "false".into()),
        ];
        StateDict {
            tensors,
            metadata: group_metadata(self.kind(), self.params.len(), group),
        }
    }

    fn load_state_dict(&mut self, state: &StateDict) -> Result<()> {
        let op = if self.decoupled {
            "AdamW.load_state_dict"
        } else {
            "Adam.load_state_dict"
        };
        check_groups(op, state, self.kind(), self.params.len())?;
        let betas: Vec<f64> = parse_list(
            op,
            "param_groups.0.betas",
            &group_value::<String>(op, state, "betas")?,
        )?;
        let [b1, b2] = betas[..] else {
            return Err(invalid(
                op,
                format!("param_groups.0.betas: two values, got {betas:?}"),
            ));
        };
        if group_value::<bool>(op, state, "amsgrad")? {
            return Err(invalid(op, "amsgrad is not implemented in kiln".into()));
        }
        let n = self.params.len();
        let mut next = Adam {
            params: Vec::new(),
            lr: group_value(op, state, "lr")?,
            betas: (b1, b2),
            eps: group_value(op, state, "eps")?,
            weight_decay: group_value(op, state, "weight_decay")?,
            decoupled: self.decoupled,
            exp_avg: Vec::new(),
            exp_avg_sq: Vec::new(),
            steps: vec![0; n],
        };
        next.check()?;
        let (mut slots, steps) = stage_state(op, state, &self.params, &["exp_avg", "exp_avg_sq"])?;
        for i in 0..n {
            let present = [
                slots[0][i].is_some(),
                slots[1][i].is_some(),
                steps[i].is_some(),
            ];
            if present.iter().any(|&p| p) && !present.iter().all(|&p| p) {
                return Err(invalid(
                    op,
                    format!("state.{i}: step, exp_avg and exp_avg_sq come together"),
                ));
            }
            next.steps[i] = steps[i].unwrap_or(0);
        }
        next.exp_avg_sq = slots.remove(1);
        next.exp_avg = slots.remove(0);
        next.params = std::mem::take(&mut self.params);
        *self = next;
        Ok(())
    }
}
