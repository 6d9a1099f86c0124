//! `linear` and `linear_relu`: PyTorch's `nn.functional.linear` as one `AddmmBackward0` node
//! over the products of `matmul.rs`, and a Linear with the ReLU that follows it.

use super::matmul::{matmul_forward, matmul_impl, Extras, FusedRelu};
use super::matmul_grad::{matmul_grads, relu_mask};
use super::same_device;
use crate::base::UnaryOp;
use crate::tensor::Tensor;
use crate::{DType, Error, Result};

/// `x @ weight^T + bias`, PyTorch's `nn.functional.linear`: one node (`AddmmBackward0`) whose
/// bias is added in the matmul kernel's epilogue where the product takes the vec4 kernel or a
/// word product (one pass over the output instead of two), else by a broadcast add inside the
/// same node.
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let mut inputs = vec![x, weight];
    inputs.extend(bias);
    if let Some(v) = super::autocast::lower("linear", &inputs)? {
        return super::autocast::suspended(|| linear(&v[0], &v[1], v.get(2)));
    }
    if weight.rank() != 2 {
        return Err(Error::InvalidArgument {
            op: "linear",
            msg: format!("weight must be 2-D, got shape {:?}", weight.shape()),
        });
    }
    let wt = weight.t()?;
    let Some(b) = bias else {
        return x.matmul(&wt);
    };
    same_device("linear", x, b)?;
    crate::graph::record(
        "AddmmBackward0",
        &[b, x, &wt],
        || matmul_forward(x, &wt, Some(b)),
        |_| linear_backward(x, &wt, b),
    )
}

/// `relu(linear(x, weight, bias))` exactly as PyTorch runs it: an `AddmmBackward0` node, then a
/// `ReluBackward0` node saving its output, the linear's output allocated before the ReLU's and
/// freed after it, so that the graph, the values and every allocator statistic are those of
/// the two ops. Where the product takes the f32 vec4 kernel with the bias in its epilogue, the
/// same epilogue clamps at zero and writes the ReLU's output: one pass instead of two, and the
/// linear's output, which nothing can read (it is dropped here), is never written. Elsewhere
/// (other kernels, f16, autocast, the CPU) it is `linear` and then `relu`.
/// (The ReLU's output is then allocated inside the product's frames, with the ReLU's frame
/// on top, where PyTorch's would sit beside them, and in `Sequential` under the Linear's
/// index rather than the ReLU's: the one difference a snapshot shows.)
/// On the H100 (MLP 784-4096-4096-10, batch 512) the f32 SGD step went from 1.730-1.735 to
/// 1.718-1.721 ms with it.
pub fn linear_relu(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    // Under autocast, `linear` casts its operands (and the casts' lifetimes would move).
    let eligible = !super::autocast::applies(x)
        && x.rank() == 2
        && weight.rank() == 2
        && x.dtype() == DType::F32
        && weight.dtype() == DType::F32
        && !x.device().is_cpu();
    let (Some(b), true) = (bias, eligible) else {
        return linear(x, weight, bias)?.relu();
    };
    same_device("linear", x, weight)?;
    same_device("linear", x, b)?;
    let wt = weight.t()?;
    let relu = UnaryOp::Relu;
    let shape = [x.shape()[0], weight.shape()[0]];
    let alloc = || {
        let _frame = crate::alloc::kiln_scope(
            || crate::alloc::op_frame_name(relu.backward_name(), false),
            "kiln",
        );
        Tensor::empty(&shape, DType::F32, x.device())
    };
    let mut ex = Extras {
        relu: Some(FusedRelu {
            alloc: &alloc,
            out: None,
        }),
        ..Extras::default()
    };
    let y = crate::graph::record(
        "AddmmBackward0",
        &[b, x, &wt],
        || matmul_impl(x, &wt, Some(b), true, &mut ex),
        |_| linear_backward(x, &wt, b),
    )?;
    match ex.relu.and_then(|r| r.out) {
        Some(r) => crate::graph::record(
            relu.backward_name(),
            &[&y],
            || Ok(r),
            |out| super::grad::unary(&y, out, relu),
        ),
        None => y.relu(),
    }
}

/// The backward of `linear`'s `AddmmBackward0` node over (bias, x, weight^T).
fn linear_backward(x: &Tensor, wt: &Tensor, b: &Tensor) -> Result<crate::graph::BackwardFn> {
    let mut product = matmul_grads(x, wt)?;
    let bias_shape = b.shape().to_vec();
    Ok(Box::new(move |g, needs| {
        // With the weight's gradient, the bias's comes from its product's kernel where
        // that kernel can sum `g`'s rows in passing (`matmul_row_sums`).
        // (f32 only: elsewhere the order of the ops stays as it was.)
        let fuse = needs[0]
            && needs[2]
            && g.rank() == 2
            && g.dtype() == DType::F32
            && bias_shape.len() == 1;
        // x's gradient with a ReLU's formula applied, where the ReLU before this layer
        // offered it and the product's kernel can (Note [Backward epilogues]).
        let mask = relu_mask(1);
        // Unfused, the bias's gradient comes first, before the products, as it always has.
        let mut gb = match needs[0] && !fuse {
            true => Some(crate::ops::sum_to(g, &bias_shape)?),
            false => None,
        };
        let (rest, sums, masked) = product(g, &needs[1..], fuse, mask.as_ref())?;
        if masked {
            crate::graph::accept(1);
        }
        if fuse {
            gb = Some(match sums {
                Some(s) => s,
                None => crate::ops::sum_to(g, &bias_shape)?,
            });
        }
        let mut grads = vec![gb];
        grads.extend(rest);
        Ok(grads)
    }))
}
