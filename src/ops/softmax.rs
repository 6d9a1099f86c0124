//! softmax and log_softmax along one dim: numerically stable (max subtracted), one pass per row
//! on the GPU with an online max and sum; f64 on the CPU reference.

use super::{coalesce_for_kernel, pack_dims, u32_of};
use crate::kernels::{launch_wg, tune, Kernel, Operand, RowLayout, SoftmaxKernel, WORKGROUP};
use crate::tensor::{dim, Tensor};
use crate::{Error, Result};

fn softmax_impl(x: &Tensor, d: isize, log: bool) -> Result<Tensor> {
    let op = if log { "log_softmax" } else { "softmax" };
    if !x.dtype.is_float() {
        return Err(Error::UnsupportedDType {
            op,
            dtype: x.dtype,
            why: "(a float op)".into(),
        });
    }
    // A 0-d tensor is a row of one (PyTorch accepts dim 0 and -1 for it).
    let scalar = x.rank() == 0;
    let d = dim(op, d, x.rank().max(1))?;
    let x = if scalar { x.reshape(&[1])? } else { x.clone() };
    // The softmax dim last; rows are then `inner` consecutive elements of the permuted view.
    let mut order: Vec<isize> = (0..x.rank() as isize)
        .filter(|&i| i != d as isize)
        .collect();
    order.push(d as isize);
    let xp = x.permute(&order)?;
    let inner = x.shape()[d];
    let out = Tensor::empty(xp.shape(), x.dtype, x.device())?;
    if out.numel() > 0 {
        let rows = out.numel() / inner;
        if x.device().is_cpu() {
            xp.host_ready()?;
            crate::cpu::softmax_rows(&xp, &out, inner, log);
        } else {
            let c = coalesce_for_kernel(op, xp.shape(), &[&xp.layout])?;
            let contiguous = c.contiguous;
            let vector =
                contiguous && inner.is_multiple_of(4) && xp.layout.offset.is_multiple_of(4);
            // Contiguous rows that are not whole vec4s (GPT-2's 50257 logits): the workgroup
            // per row reads them 16 bytes at a time (`RowLayout::Words`).
            let words = contiguous && !vector && words_fit(x.dtype, &[xp.layout.offset]);
            let unit = if vector { 4 } else { 1 };
            let mut imm = vec![
                u32_of(op, rows)?,
                u32_of(op, inner / unit)?,
                c.shape.len() as u32,
                u32_of(op, xp.layout.offset / unit)?,
                log as u32,
                0,
                0,
                0,
            ];
            let windowed = (vector || words)
                && [&xp, &out]
                    .iter()
                    .any(|t| crate::kernels::past_one_binding(&t.storage.block));
            if !windowed {
                // (Windows of contiguous rows need no dims; their count may pass 32 bits.)
                pack_dims(&mut imm, &[&c.shape, &c.strides[0]], op)?;
            }
            let run = |serial: bool| {
                let operands = [&xp.storage.block, &out.storage.block];
                launch_rows(x.dtype, (vector, words, serial), operands, &imm, rows)
            };
            let key = || {
                let layout = match (vector, words) {
                    (true, _) => "vec4",
                    (false, true) => "words",
                    (false, false) => "strided",
                };
                let (r, n) = (tune::class(rows), tune::class(inner));
                format!("{} {layout} rows {r} inner {n}", x.dtype)
            };
            // The workgroup tree first on a GPU, the serial loop on a CPU adapter (lavapipe:
            // tree 61.6 ms, serial 10.9 for 1024^2), the tree not at all on GL's llvmpipe;
            // but a row too long for llvmpipe's loop limit takes the tree alone there. The
            // serial kernel reads and writes each unit, strided units through a loop over
            // the dims (entered and left).
            let per_unit = if vector { 1 } else { c.shape.len() + 2 };
            let serial_fits = tune::loops_fit(x.device(), 2 * (inner / unit) * per_unit + 8);
            let candidates: Vec<(bool, &str)> = if !serial_fits {
                vec![(false, "tree")]
            } else if tune::on_gl_cpu_adapter(x.device()) {
                vec![(true, "serial")]
            } else if tune::on_cpu_adapter(x.device()) {
                vec![(true, "serial"), (false, "tree")]
            } else {
                vec![(false, "tree"), (true, "serial")]
            };
            if windowed {
                // (The first candidate: the tuner would time whole launches.)
                let rows_of = RowsOf { rows, inner, unit };
                forward_windows(&xp, &out, rows_of, (vector, words, candidates[0].0), imm)?;
            } else {
                let work = out.numel() as u64;
                let serial = tune::pick(x.device(), "softmax", key, work, &candidates, run)?;
                run(serial)?;
            }
        }
    }
    // Back to the input's dim order, contiguous as PyTorch returns it.
    let mut inverse = vec![0isize; order.len()];
    for (i, &o) in order.iter().enumerate() {
        inverse[o as usize] = i as isize;
    }
    let result = out.permute(&inverse)?.contiguous()?;
    if scalar {
        return result.reshape(&[]);
    }
    Ok(result)
}

/// One forward launch over `rows` rows of `x` into `o` (whole blocks or windows of them): an
/// invocation per row (`serial`) or a workgroup per row, in the layout `vector` and `words`
/// choose (the words kernel binds both operands twice, as words and as 16-byte chunks).
fn launch_rows<'a, O: Operand<'a> + Copy>(
    dtype: crate::tensor::DType,
    (vector, words, serial): (bool, bool, bool),
    [x, o]: [O; 2],
    imm: &[u32],
    rows: usize,
) -> Result<()> {
    let layout = RowLayout::of(vector, words, serial);
    let kernel = Kernel::Softmax(SoftmaxKernel {
        dtype,
        layout,
        serial,
    });
    let (threads, workgroup) = match serial {
        true => (rows as u64, 64),
        false => (rows as u64 * WORKGROUP as u64, WORKGROUP),
    };
    match layout {
        RowLayout::Words => launch_wg(kernel, &[x, o, x, o], imm, threads, workgroup),
        _ => launch_wg(kernel, &[x, o], imm, threads, workgroup),
    }
}

/// Rows of a softmax: how many, their length, and the elements of a kernel's unit.
#[derive(Clone, Copy)]
struct RowsOf {
    rows: usize,
    inner: usize,
    unit: usize,
}

/// The forward over contiguous rows larger than one binding (GPT-2's f16 logits from batch 21
/// at T1024), as launches over windows of rows (Note [Windows] in `kernels/launch.rs`). A
/// window of the output starts at a row whose first byte is on the binding alignment; the
/// input's window passes its offset inside it (a whole 16-byte chunk where the words kernel
/// runs, as `words_fit` asked of the whole).
fn forward_windows(
    xp: &Tensor,
    out: &Tensor,
    RowsOf { rows, inner, unit }: RowsOf,
    layout: (bool, bool, bool),
    mut imm: Vec<u32>,
) -> Result<()> {
    use crate::kernels::{window_covering, window_from};
    const OP: &str = "softmax";
    let es = xp.dtype.size_bytes();
    let row_bytes = inner * es;
    let per = crate::kernels::aligned_rows(xp.device(), row_bytes, row_bytes)?;
    let x_first = xp.layout.offset * es;
    for (first, end) in crate::kernels::spans(rows, per) {
        let (at, len) = (first * row_bytes, (end - first) * row_bytes);
        let o = window_from(&out.storage.block, at as u64, (at + len) as u64, OP)?;
        let (x, from) = window_covering(
            &xp.storage.block,
            (x_first + at) as u64,
            (x_first + at + len) as u64,
        )?;
        if layout.1 && from % 16 != 0 {
            return Err(Error::InvalidArgument {
                op: OP,
                msg: format!("row {first} of [{rows}, {inner}] starts inside a 16-byte chunk"),
            });
        }
        imm[0] = u32_of(OP, end - first)?;
        imm[3] = u32_of(OP, from as usize / (es * unit))?;
        launch_rows(xp.dtype, layout, [x, o], &imm, end - first)?;
    }
    Ok(())
}

/// The backward in one launch (`shaders/softmax_backward.wgsl`), on a GPU, where the dim is
/// the last of a contiguous output: an invocation per row ("serial") where rows are short (64
/// or fewer), else that or a workgroup per row ("tree"), measured per adapter (the tree first
/// on a GPU, the serial loop first on a CPU adapter, where it also wins the forward, and
/// alone on GL's llvmpipe); `None` elsewhere. One output and no temporaries, as PyTorch's
/// kernel: long rows used to take the composite formula on GPUs, whose three temporaries made
/// the allocator's statistics of a 3000-class cross_entropy on the H100 differ from the fused
/// kernel's (lavapipe, a CPU adapter, took the serial loop and agreed). Rows of whole vec4s at
/// vec4-aligned offsets are read and written a vec4 at a time.
fn backward_rows(y: &Tensor, g: &Tensor, d: isize, log: bool) -> Result<Option<Tensor>> {
    const OP: &str = "softmax_backward";
    if y.device().is_cpu() {
        return Ok(None);
    }
    let last = y.rank() >= 1 && dim(OP, d, y.rank())? == y.rank() - 1;
    let inner = y.shape().last().copied().unwrap_or(1);
    if !last || !y.is_contiguous() || g.shape() != y.shape() || g.dtype() != y.dtype() {
        return Ok(None);
    }
    let g = g.contiguous()?;
    let out = Tensor::empty(y.shape(), y.dtype, y.device())?;
    let rows = y.numel() / inner.max(1);
    if rows == 0 || inner == 0 {
        return Ok(Some(out));
    }
    // Whole vec4s of the dtype at vec4-aligned offsets: the kernels read and write vec4 units.
    let offsets = [y.layout.offset, g.layout.offset, out.layout.offset];
    let vec4 = inner.is_multiple_of(4) && offsets.iter().all(|o| o.is_multiple_of(4));
    // Else 16-byte chunks inside the rows where the offsets allow (`RowLayout::Words`).
    let words = !vec4 && words_fit(y.dtype, &offsets);
    let unit = if vec4 { 4 } else { 1 };
    let imm = [
        u32_of(OP, rows)?,
        u32_of(OP, inner / unit)?,
        u32_of(OP, y.layout.offset / unit)?,
        u32_of(OP, g.layout.offset / unit)?,
        u32_of(OP, out.layout.offset / unit)?,
        log as u32,
        0,
        0,
    ];
    u32_of(OP, y.layout.offset.max(g.layout.offset) + y.numel())?;
    let (yb, gb, ob) = (&y.storage.block, &g.storage.block, &out.storage.block);
    let run = |serial: bool| {
        let (threads, workgroup) = match serial {
            true => (rows as u64, 64),
            false => (rows as u64 * 256, 256),
        };
        let layout = RowLayout::of(vec4, words, serial);
        let kernel = Kernel::SoftmaxBackward(SoftmaxKernel {
            dtype: y.dtype,
            layout,
            serial,
        });
        let blocks: &[&crate::device::DeviceBlock] = match layout {
            RowLayout::Words => &[yb, gb, ob, yb, gb, ob],
            _ => &[yb, gb, ob],
        };
        launch_wg(kernel, blocks, &imm, threads, workgroup)
    };
    // A row too long for llvmpipe's loop limit (two loops over its units) takes the tree.
    let candidates: Vec<(bool, &str)> = if !tune::loops_fit(y.device(), 2 * (inner / unit) + 8) {
        vec![(false, "tree")]
    } else if inner <= 64 || tune::on_gl_cpu_adapter(y.device()) {
        vec![(true, "serial")]
    } else if tune::on_cpu_adapter(y.device()) {
        vec![(true, "serial"), (false, "tree")]
    } else {
        vec![(false, "tree"), (true, "serial")]
    };
    let key = || {
        let layout = match (vec4, words) {
            (true, _) => "vec4",
            (false, true) => "words",
            (false, false) => "scalar",
        };
        let (r, n) = (tune::class(rows), tune::class(inner));
        format!("{} {layout} rows {r} inner {n}", y.dtype)
    };
    let work = out.numel() as u64;
    let serial = tune::pick(y.device(), "softmax backward", key, work, &candidates, run)?;
    run(serial)?;
    Ok(Some(out))
}

/// Whether rows of `dtype` whose tensors start at element `offsets` can take the words kernels
/// (`RowLayout::Words`): 2- or 4-byte floats, every offset a whole 16-byte chunk.
fn words_fit(dtype: crate::tensor::DType, offsets: &[usize]) -> bool {
    let es = dtype.size_bytes();
    matches!(es, 2 | 4) && offsets.iter().all(|o| (o * es).is_multiple_of(16))
}

/// softmax: dx = y * (g - sum(g * y)); log_softmax: dx = g - exp(y) * sum(g), along `d`.
/// Both read only the output, which is what PyTorch saves.
fn softmax_recorded(x: &Tensor, d: isize, log: bool) -> Result<Tensor> {
    softmax_recorded_with(x, d, log, || softmax_impl(x, d, log))
}

/// `softmax_recorded` whose output `forward` makes (`cross_entropy`'s fused kernel writes
/// log_softmax's output later, in nll_loss's launch). log_softmax's formula, along the last
/// dim of a matrix, can ride in nll_loss's backward kernel (Note [Backward epilogues]).
pub(super) fn softmax_recorded_with(
    x: &Tensor,
    d: isize,
    log: bool,
    forward: impl FnOnce() -> Result<Tensor>,
) -> Result<Tensor> {
    let name = if log {
        "LogSoftmaxBackward0"
    } else {
        "SoftmaxBackward0"
    };
    crate::graph::record(name, &[x], forward, |out| {
        let saved = std::sync::Arc::new(crate::graph::save_output(out, name)?);
        if log && out.rank() == 2 && dim("log_softmax", d, 2)? == 1 {
            crate::graph::offer_fusion(crate::graph::Fusable::LogSoftmaxRows(
                std::sync::Arc::downgrade(&saved),
            ));
        }
        let f: crate::graph::BackwardFn = Box::new(move |g, _| {
            let y = saved.get()?;
            if let Some(gx) = backward_rows(&y, g, d, log)? {
                return Ok(vec![Some(gx)]);
            }
            let dd = if y.rank() == 0 { -1 } else { d };
            let y = if y.rank() == 0 { y.reshape(&[1])? } else { y };
            let g1 = g.reshape(&y.shape().iter().map(|&n| n as isize).collect::<Vec<_>>())?;
            let gx = if log {
                g1.sub(&y.exp()?.mul(&g1.sum(&[dd], true)?)?)?
            } else {
                y.mul(&g1.sub(&g1.mul(&y)?.sum(&[dd], true)?)?)?
            };
            Ok(vec![Some(gx.reshape(
                &g.shape().iter().map(|&n| n as isize).collect::<Vec<_>>(),
            )?)])
        });
        Ok(f)
    })
}

impl Tensor {
    /// softmax along `dim`.
    pub fn softmax(&self, dim: isize) -> Result<Tensor> {
        super::autocast::fp32_unary(self, |x| softmax_recorded(x, dim, false))
    }

    /// log_softmax along `dim` (x - max - log(sum(exp(x - max)))).
    pub fn log_softmax(&self, dim: isize) -> Result<Tensor> {
        super::autocast::fp32_unary(self, |x| softmax_recorded(x, dim, true))
    }
}
