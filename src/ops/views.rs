//! Bindings of views for kernels that take a view's offset as an immediate, where its block is
//! larger than one storage binding (Note [Windows] in `kernels/launch.rs`): the window covering
//! the view's elements instead of the whole block, and the views' spans that make a launch's
//! windows (rows of a reduction, indices of an elementwise op's outermost dim).

use crate::kernels::{past_one_binding, whole, window_bytes, window_covering, window_from, Window};
use crate::tensor::Tensor;
use crate::Result;

/// Elements view `t` spans from its offset: its last element's distance plus one (0 when
/// empty). Strides are never negative.
pub(crate) fn extent(t: &Tensor) -> usize {
    if t.numel() == 0 {
        return 0;
    }
    1 + t
        .shape()
        .iter()
        .zip(t.strides())
        .map(|(&n, &s)| (n - 1) * s)
        .sum::<usize>()
}

/// Whether the elements of view `t` fit one window (always on the CPU device).
pub(crate) fn fits(t: &Tensor) -> bool {
    t.device().adapter_info().is_none()
        || (extent(t) * t.dtype().size_bytes()) as u64 <= window_bytes(t.device())
}

/// The binding of view `t` for a kernel that reads it from an offset it is given: the whole
/// block where that fits one binding, else the window covering the view's elements; and the
/// view's offset in elements there.
pub(crate) fn bind_view(t: &Tensor) -> Result<(Window<'_>, usize)> {
    let block = &t.storage.block;
    if !past_one_binding(block) {
        return Ok((whole(block), t.layout().offset));
    }
    let es = t.dtype().size_bytes();
    let first = (t.layout().offset * es) as u64;
    let (w, before) = window_covering(block, first, first + (extent(t) * es) as u64)?;
    Ok((w, before as usize / es))
}

/// The binding of output `t` for a kernel that writes it from its binding's first element:
/// the whole block where `t` starts it and fits one binding, else the window from `t`'s first
/// element (on the binding alignment: `aligned_rows` spans start there). `op` names the launch
/// where it does not.
pub(crate) fn bind_out<'t>(t: &'t Tensor, op: &'static str) -> Result<Window<'t>> {
    let block = &t.storage.block;
    if t.layout().offset == 0 && !past_one_binding(block) {
        return Ok(whole(block));
    }
    let es = t.dtype().size_bytes();
    let first = (t.layout().offset * es) as u64;
    window_from(block, first, first + (extent(t) * es) as u64, op)
}

/// An elementwise launch (`kernel`, one element a step: not in vec4s) where an operand is larger
/// than one binding, as launches over windows of the outermost of the coalesced dims `c`
/// (Note [Windows] in `kernels/launch.rs`): each binds the elements its indices of that dim
/// span in each operand (a narrowed view of the logits, a row of them, a misaligned one), the
/// output's window from its first element (its spans start on the binding alignment). In place,
/// `out` is `a`. Where one index of that dim spans more than a window (a transpose's view), an
/// in-place launch over two dims runs over blocks of both (`block_windows`); otherwise this
/// returns false, launching nothing.
pub(super) fn outer_windows<'a>(
    kernel: crate::kernels::ElementwiseKernel,
    [a, out]: [&'a Tensor; 2],
    b: Option<&'a Tensor>,
    scalar: Option<f64>,
    c: &super::Coalesced,
    op: &'static str,
) -> Result<bool> {
    use crate::kernels::{aligned_rows, launch, spans, Kernel, PER_THREAD};
    let (outer, rest) = (c.shape[0], &c.shape[1..]);
    let inner: usize = rest.iter().product();
    // Elements one index of the outer dim spans in operand `k` (strides as coalesced).
    let span = |k: usize| -> usize {
        1 + rest
            .iter()
            .zip(&c.strides[k][1..])
            .map(|(&n, &s)| (n - 1) * s)
            .sum::<usize>()
    };
    let operands: Vec<(usize, &'a Tensor)> = [Some((0, a)), b.map(|b| (1, b))]
        .into_iter()
        .flatten()
        .collect();
    // An index's bytes in the widest operand: its stride or its span, whichever is longer.
    let widest = operands
        .iter()
        .map(|&(k, t)| c.strides[k][0].max(span(k)) * t.dtype().size_bytes())
        .chain([inner * out.dtype().size_bytes()])
        .max()
        .unwrap_or(1);
    let Ok(per) = aligned_rows(a.device(), inner * out.dtype().size_bytes(), widest) else {
        if kernel.inplace && c.shape.len() == 2 {
            block_windows(kernel, &operands, scalar, c, op)?;
            return Ok(true);
        }
        return Ok(false);
    };
    // The window of operand `k` over outer indices first..end, and its offset there.
    fn part<'t>(
        t: &'t Tensor,
        (stride, span): (usize, usize),
        (first, end): (usize, usize),
        op: &'static str,
    ) -> Result<(Window<'t>, u32)> {
        let es = t.dtype().size_bytes();
        let at = |i: usize| ((t.layout().offset + i * stride) * es) as u64;
        let (w, before) = window_covering(
            &t.storage.block,
            at(first),
            at(end - 1) + (span * es) as u64,
        )?;
        Ok((w, super::u32_of(op, before as usize / es)?))
    }
    let part = |(k, t): (usize, &'a Tensor), s| part(t, (c.strides[k][0], span(k)), s, op);
    for (first, end) in spans(outer, per) {
        let (wa, off_a) = part(operands[0], (first, end))?;
        let mut blocks = vec![wa];
        let off_b = match operands.get(1) {
            Some(&ob) => {
                let (wb, off_b) = part(ob, (first, end))?;
                blocks.push(wb);
                off_b
            }
            None => super::scalar_word(a.dtype(), scalar),
        };
        if !kernel.inplace {
            let es = out.dtype().size_bytes();
            let at = |i: usize| ((out.layout().offset + i * inner) * es) as u64;
            blocks.push(window_from(&out.storage.block, at(first), at(end), op)?);
        }
        let mut shape = c.shape.clone();
        shape[0] = end - first;
        let dims = super::Coalesced {
            shape,
            strides: c.strides.clone(),
            contiguous: c.contiguous,
        };
        let n = (end - first) * inner;
        let imm = super::strided_header(op, n, &dims, off_a, off_b)?;
        launch(
            Kernel::Elementwise(kernel),
            &blocks,
            &imm,
            (n as u64).div_ceil(PER_THREAD as u64),
        )?;
    }
    Ok(true)
}

/// An in-place elementwise launch over two coalesced dims `c` (operands `(k, tensor)`: `a`,
/// written, and `b`) where an index of neither dim fits one window alone (a copy into a
/// contiguous tensor from a transposed view of one larger than a binding), as launches over
/// blocks of both dims: each operand's block spans at most half a window along each.
fn block_windows(
    kernel: crate::kernels::ElementwiseKernel,
    operands: &[(usize, &Tensor)],
    scalar: Option<f64>,
    c: &super::Coalesced,
    op: &'static str,
) -> Result<()> {
    use crate::kernels::{launch, spans, Kernel, PER_THREAD};
    let half = |t: &Tensor| window_bytes(t.device()) as usize / t.dtype().size_bytes() / 2;
    // Indices of dim `d` whose elements span at most half a window in every operand.
    let per = |d: usize| {
        operands
            .iter()
            .map(|&(k, t)| half(t) / c.strides[k][d].max(1) + 1)
            .min()
            .unwrap_or(1)
            .min(c.shape[d])
    };
    let (rows, cols) = (per(0), per(1));
    for (i0, i1) in spans(c.shape[0], rows) {
        for (j0, j1) in spans(c.shape[1], cols) {
            let mut blocks = Vec::new();
            let mut offsets = Vec::new();
            for &(k, t) in operands {
                let (s0, s1) = (c.strides[k][0], c.strides[k][1]);
                let es = t.dtype().size_bytes();
                let first = t.layout().offset + i0 * s0 + j0 * s1;
                let last = first + (i1 - i0 - 1) * s0 + (j1 - j0 - 1) * s1;
                let (w, before) = window_covering(
                    &t.storage.block,
                    (first * es) as u64,
                    ((last + 1) * es) as u64,
                )?;
                blocks.push(w);
                offsets.push(super::u32_of(op, before as usize / es)?);
            }
            let off_b = match offsets.get(1) {
                Some(&o) => o,
                None => super::scalar_word(operands[0].1.dtype(), scalar),
            };
            let dims = super::Coalesced {
                shape: vec![i1 - i0, j1 - j0],
                strides: c.strides.clone(),
                contiguous: false,
            };
            let n = (i1 - i0) * (j1 - j0);
            let imm = super::strided_header(op, n, &dims, offsets[0], off_b)?;
            launch(
                Kernel::Elementwise(crate::kernels::ElementwiseKernel {
                    contiguous: false,
                    ..kernel
                }),
                &blocks,
                &imm,
                (n as u64).div_ceil(PER_THREAD as u64),
            )?;
        }
    }
    Ok(())
}
