//! A product's backward (`MmBackward0`): its two gradients, with the sums of `g`'s rows and
//! ReLU's backward formula taken in the kernels' epilogues where they can (Note [Backward
//! epilogues]).

use super::isize_shape;
use super::matmul::{matmul, matmul_impl, matmul_row_sums, Extras};
use crate::tensor::Tensor;
use crate::Result;

/// `ga = g @ b^T`, `gb = a^T @ g` on the operands promoted to matrices, summed over broadcast
/// batch dims. Where `b` is a transposed view (a Linear's `w.t()`), `gb` is computed as
/// `(g^T @ a)^T` so that it comes back contiguous after the transpose's backward, as PyTorch's
/// `mm_mat2_backward` arranges.
pub(super) fn matmul_backward(a: &Tensor, b: &Tensor) -> Result<crate::graph::BackwardFn> {
    let mut grads = matmul_grads(a, b)?;
    Ok(Box::new(move |g, needs| {
        let mask = relu_mask(0);
        let (grads, _, masked) = grads(g, needs, false, mask.as_ref())?;
        if masked {
            crate::graph::accept(0);
        }
        Ok(grads)
    }))
}

/// `matmul_backward`'s gradients; with `col_sums`, also `g`'s sums over its rows where the
/// product `g^T @ a` computes them in passing (`matmul_row_sums`), else `None`.
/// With `mask`, `ga` with `ReluBackward0`'s formula applied where a kernel could (the last
/// value says whether it was: Note [Backward epilogues]).
type ProductGrads =
    Box<dyn FnMut(&Tensor, &[bool], bool, Option<&Tensor>) -> Result<ProductOut> + Send + Sync>;

/// The gradients of a product, the sums of `g`'s rows where asked and computed, and whether
/// the mask was applied to `ga`.
pub(super) type ProductOut = (Vec<Option<Tensor>>, Option<Tensor>, bool);

/// See `matmul_backward`.
pub(super) fn matmul_grads(a: &Tensor, b: &Tensor) -> Result<ProductGrads> {
    use crate::graph::save;
    use crate::ops::sum_to;
    let (sa, sb) = (a.shape().to_vec(), b.shape().to_vec());
    let b_transposed = b.rank() == 2 && b.strides()[0] == 1 && b.strides()[1] != 1;
    let a_s = b.requires_grad().then(|| save(a)).transpose()?;
    let b_s = a.requires_grad().then(|| save(b)).transpose()?;
    Ok(Box::new(move |g, needs, col_sums, mask| {
        let mut sums = None;
        let mut masked = false;
        let promote = |t: Tensor, vector_dim: isize| -> Result<Tensor> {
            if t.rank() == 1 {
                t.unsqueeze(vector_dim)
            } else {
                Ok(t)
            }
        };
        let mut gp = g.clone();
        if sa.len() == 1 {
            gp = gp.unsqueeze(if sb.len() == 1 { 0 } else { -2 })?;
        }
        if sb.len() == 1 {
            gp = gp.unsqueeze(-1)?;
        }
        // (A classifier head's two gradients go out in one dispatch where that is faster:
        // `matmul_narrow::grouped`.)
        // (Both products' pads of `g` made once: `matmul::sharing_pads`.)
        let (ga, gb) = super::matmul::sharing_pads(&gp, || {
            super::matmul_narrow::grouped(|| {
                let ga = match needs[0] {
                    true => {
                        let bp = promote(b_s.as_ref().expect("saved").get()?, 1)?;
                        let ga = match mask {
                            Some(mask) if sa.len() == 2 && sb.len() == 2 => {
                                let (ga, applied) = matmul_masked(&gp, &bp.t()?, mask)?;
                                masked = applied;
                                ga
                            }
                            _ => gp.matmul(&bp.transpose(-2, -1)?)?,
                        };
                        let pa: Vec<usize> = if sa.len() == 1 {
                            vec![1, sa[0]]
                        } else {
                            sa.clone()
                        };
                        Some(sum_to(&ga, &pa)?.reshape(&isize_shape(&sa))?)
                    }
                    false => None,
                };
                let gb = match needs[1] {
                    true => {
                        let ap = promote(a_s.as_ref().expect("saved").get()?, 0)?;
                        let pb: Vec<usize> = if sb.len() == 1 {
                            vec![sb[0], 1]
                        } else {
                            sb.clone()
                        };
                        let column_major = b_transposed && ap.rank() == 2 && gp.rank() == 2;
                        let gb = if column_major && col_sums {
                            let (product, s) = matmul_row_sums(&gp.t()?, &ap)?;
                            sums = s;
                            product.t()?
                        } else if column_major {
                            gp.t()?.matmul(&ap)?.t()?
                        } else {
                            ap.transpose(-2, -1)?.matmul(&gp)?
                        };
                        Some(sum_to(&gb, &pb)?.reshape(&isize_shape(&sb))?)
                    }
                    false => None,
                };
                Ok((ga, gb))
            })
        })?;
        Ok((vec![ga, gb], sums, masked))
    }))
}

/// The ReLU mask offered for edge `edge` of the backward running now (Note [Backward
/// epilogues]).
pub(super) fn relu_mask(edge: usize) -> Option<Tensor> {
    match crate::graph::offered(edge)? {
        crate::graph::Epilogue::ReluMask(t) => Some(t),
        _ => None,
    }
}

/// `a @ b` for two matrices (in a backward: no autograd, no autocast), with `mask`'s ReLU
/// formula applied in the kernel's epilogue where the kernel that runs can; whether it was.
fn matmul_masked(a: &Tensor, b: &Tensor, mask: &Tensor) -> Result<(Tensor, bool)> {
    if crate::graph::needs_grad(&[a, b]) || super::autocast::applies(a) {
        return Ok((matmul(a, b)?, false));
    }
    let mut ex = Extras {
        mask: Some(mask),
        ..Extras::default()
    };
    // (Recorded as `matmul` records it, for the profiler's and the snapshots' op names; no
    // node is made, since no operand needs a gradient.)
    let out = crate::graph::record(
        "MmBackward0",
        &[a, b],
        || matmul_impl(a, b, None, true, &mut ex),
        |_| Err(crate::graph::no_node("matmul_masked")),
    )?;
    Ok((out, ex.masked))
}
