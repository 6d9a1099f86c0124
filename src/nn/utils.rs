//! `torch.nn.utils`: gradient clipping.

use crate::tensor::{DType, Tensor};
use crate::{no_grad, Error, Result};

/// Scales the gradients of `params` in place so that their joint `norm_type`-norm (2.0,
/// `f64::INFINITY`, or any p > 0) is at most `max_norm`, and returns that norm as a 0-d f32
/// tensor on the gradients' device, computed before clipping. Everything stays on the device (no
/// host read), as PyTorch's: the factor is `min(max_norm / (norm + 1e-6), 1)`. After a
/// `GradScaler`, call `scaler.unscale_(opt)` first so that the norm is the true one.
pub fn clip_grad_norm_(params: &[Tensor], max_norm: f64, norm_type: f64) -> Result<Tensor> {
    const OP: &str = "clip_grad_norm_";
    if norm_type.is_nan() || norm_type <= 0.0 || max_norm.is_nan() {
        return Err(Error::InvalidArgument {
            op: OP,
            msg: format!("norm_type {norm_type} must be > 0 and max_norm {max_norm} a number"),
        });
    }
    let grads: Vec<Tensor> = params.iter().filter_map(|p| p.grad()).collect();
    let Some(first) = grads.first() else {
        let cpu = crate::Device::cpu()?;
        return Tensor::zeros(&[], DType::F32, &cpu);
    };
    let device = first.device().clone();
    no_grad(|| {
        // Each gradient's norm in f32 (PyTorch's opmath), then the norm of the norms.
        let norm_of = |t: &Tensor| -> Result<Tensor> {
            let a = t.to_dtype(DType::F32)?.abs()?;
            if norm_type.is_infinite() {
                a.amax(&[], false)
            } else if norm_type == 2.0 {
                a.square()?.sum_all()?.sqrt()
            } else {
                a.pow_scalar(norm_type)?
                    .sum_all()?
                    .pow_scalar(1.0 / norm_type)
            }
        };
        let norms = grads
            .iter()
            .map(|g| norm_of(g)?.to_device(&device))
            .collect::<Result<Vec<_>>>()?;
        let total = norm_of(&Tensor::stack(&norms, 0)?)?;
        let coef = Tensor::full(&[], max_norm, DType::F32, &device)?
            .div(&total.add_scalar(1e-6)?)?
            .minimum_scalar(1.0)?;
        for g in &grads {
            let c = coef.to_device(g.device())?.to_dtype(g.dtype())?;
            g.mul_(&c)?;
        }
        Ok(total)
    })
}
