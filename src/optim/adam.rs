//! `torch.optim.Adam` and `AdamW`, without amsgrad: one fused launch per parameter on a GPU.

use super::*;

/// Adam (and AdamW with `decoupled`), PyTorch's formulas without amsgrad.
pub struct Adam {
    params: Vec<Tensor>,
    /// The learning rate.
    pub lr: f64,
    /// The moments' decay rates (0.9, 0.999).
    pub betas: (f64, f64),
    /// Added to the denominator (1e-8).
    pub eps: f64,
    /// L2 penalty (Adam) or decoupled decay (AdamW).
    pub weight_decay: f64,
    /// AdamW: weight decay applied to the parameter, not added to the gradient.
    pub decoupled: bool,
    exp_avg: Vec<Option<Tensor>>,
    exp_avg_sq: Vec<Option<Tensor>>,
    steps: Vec<u64>,
}

impl Adam {
    /// Adam over `params` with learning rate `lr` and PyTorch's defaults.
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

    /// Sets the weight decay, checked as `torch.optim.Adam` checks it.
    pub fn weight_decay(mut self, weight_decay: f64) -> Result<Self> {
        self.weight_decay = weight_decay;
        self.check().map(|()| self)
    }

    /// Sets the betas, checked as `torch.optim.Adam` checks them.
    pub fn betas(mut self, beta1: f64, beta2: f64) -> Result<Self> {
        self.betas = (beta1, beta2);
        self.check().map(|()| self)
    }

    /// Sets eps, checked as `torch.optim.Adam` checks it.
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
