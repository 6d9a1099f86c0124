//! nll_loss as PyTorch's one op (`NllLossBackward0`) rather than a gather, a mean and a
//! negation: one kernel forward, one backward (`shaders/nll.wgsl`), on the device's assert flag
//! for a bad target as CUDA's device-side assert, and PyTorch's `ignore_index` (-100): rows
//! whose target is it count for nothing, and the mean is over the rest. The CPU device computes
//! the same sums on the host, where a bad target is an error at once.

use super::u32_of;
use crate::kernels::{launch, Kernel};
use crate::tensor::{DType, Tensor};
use crate::{Error, Result};

/// PyTorch's default `ignore_index`.
pub const IGNORE_INDEX: i32 = -100;

const OP: &str = "nll_loss";

/// The mean of `-log_probs[i, target[i]]` over the rows whose target is not `ignore_index`
/// (`log_probs` [N, C] of a float dtype, `target` [N] i32; checked by the caller).
pub fn nll_loss(log_probs: &Tensor, target: &Tensor, ignore_index: i32) -> Result<Tensor> {
    super::same_device(OP, log_probs, target)?;
    let total: std::cell::RefCell<Option<Tensor>> = std::cell::RefCell::new(None);
    crate::graph::record(
        "NllLossBackward0",
        &[log_probs, target],
        || {
            let (loss, tw) = forward(log_probs, target, ignore_index)?;
            *total.borrow_mut() = Some(tw);
            Ok(loss)
        },
        |_| {
            // `record` builds the node only after the forward succeeded.
            let tw = total.take().ok_or_else(|| Error::InvalidArgument {
                op: OP,
                msg: "the backward node was built without a forward".into(),
            })?;
            let saved = crate::graph::save(target)?;
            let (shape, dtype) = (log_probs.shape().to_vec(), log_probs.dtype());
            let f: crate::graph::BackwardFn = Box::new(move |g, _| {
                let grad = backward(g, &saved.get()?, &tw, &shape, dtype, ignore_index)?;
                Ok(vec![Some(grad), None])
            });
            Ok(f)
        },
    )
}

/// The loss (0-d, the input's dtype) and total_weight (0-d f32: the rows counted).
fn forward(lp: &Tensor, target: &Tensor, ignore: i32) -> Result<(Tensor, Tensor)> {
    let (n, c) = (lp.shape()[0], lp.shape()[1]);
    if lp.device().is_cpu() {
        let (values, targets) = (lp.to_f64_vec()?, target.contiguous()?.to_vec::<i32>()?);
        let (mut sum, mut count) = (0.0f64, 0usize);
        for (i, &t) in targets.iter().enumerate() {
            if t == ignore {
                continue;
            }
            if t < 0 || t as usize >= c {
                return Err(Error::IndexOutOfRange {
                    op: OP,
                    index: t as i64,
                    size: c,
                    what: "target",
                });
            }
            // f32 sums, as the kernel's.
            sum = (sum as f32 - values[i * c + t as usize] as f32) as f64;
            count += 1;
        }
        let loss = (sum as f32 / count as f32) as f64;
        return Ok((
            Tensor::from_f64_slice(&[loss], &[], lp.dtype(), lp.device())?,
            Tensor::from_f64_slice(&[count as f64], &[], DType::F32, lp.device())?,
        ));
    }
    let loss = Tensor::empty(&[], lp.dtype(), lp.device())?;
    let total = Tensor::empty(&[], DType::F32, lp.device())?;
    let imm = [
        u32_of(OP, n)?,
        u32_of(OP, c)?,
        u32_of(OP, lp.layout().offset)?,
        u32_of(OP, lp.strides()[0])?,
        u32_of(OP, lp.strides()[1])?,
        u32_of(OP, target.layout().offset)?,
        u32_of(OP, target.strides()[0])?,
        u32_of(OP, loss.layout().offset)?,
        u32_of(OP, total.layout().offset)?,
        ignore as u32,
        0,
        0,
    ];
    u32_of(OP, super::end(lp))?;
    launch(
        Kernel::Nll(lp.dtype(), false),
        &[
            &lp.storage.block,
            &target.storage.block,
            &loss.storage.block,
            &total.storage.block,
        ],
        &imm,
        256,
    )?;
    Ok((loss, total))
}

/// The gradient of the input [N, C]: `-g / total_weight` at each counted row's target.
fn backward(
    g: &Tensor,
    target: &Tensor,
    total: &Tensor,
    shape: &[usize],
    dtype: DType,
    ignore: i32,
) -> Result<Tensor> {
    let (n, c) = (shape[0], shape[1]);
    let g = if g.dtype() == dtype {
        g.clone()
    } else {
        super::to_dtype(g, dtype)?
    };
    if g.device().is_cpu() {
        let scale = -(g.to_f64_vec()?[0] as f32) / total.item::<f32>()?;
        let mut values = vec![0.0f64; n * c];
        for (i, &t) in target.contiguous()?.to_vec::<i32>()?.iter().enumerate() {
            if t != ignore {
                values[i * c + t as usize] = scale as f64;
            }
        }
        return Tensor::from_f64_slice(&values, shape, dtype, g.device());
    }
    let out = Tensor::empty(shape, dtype, g.device())?;
    if out.numel() == 0 {
        return Ok(out);
    }
    let numel = u32_of(OP, n * c)?;
    let imm = [
        u32_of(OP, n)?,
        u32_of(OP, c)?,
        u32_of(OP, g.layout().offset)?,
        0,
        0,
        u32_of(OP, target.layout().offset)?,
        u32_of(OP, target.strides()[0])?,
        u32_of(OP, out.layout().offset)?,
        u32_of(OP, total.layout().offset)?,
        ignore as u32,
        0,
        0,
    ];
    launch(
        Kernel::Nll(dtype, true),
        &[
            &g.storage.block,
            &target.storage.block,
            &out.storage.block,
            &total.storage.block,
        ],
        &imm,
        numel as u64,
    )?;
    Ok(out)
}
