//! Reductions over any set of dims, with `keepdim`: sum, mean, prod, amax/amin (associative,
//! split across workgroups when rows are long; f32 accumulation on the GPU, f64 on the CPU),
//! and max/min with their indices (argmax/argmin).

use super::{coalesce_for_kernel, pack_dims, u32_of};
use crate::cpu;
use crate::graph::{save, save_output, BackwardFn};
use crate::kernels::{
    launch, launch_wg, tune, Kernel, ReduceKernel, ReduceOp, ReduceStrategy, WORKGROUP,
};
use crate::tensor::{dim, dims as dims_of, DType, Layout, Tensor};
use crate::{Error, Result};

/// Most chunks a row is split into per pass (more passes follow for longer rows).
const MAX_CHUNKS: usize = 1024;

/// The strategies autotuning tries on `device` (subgroups where the adapter has them; 32-byte
/// words where it has 64-bit integers and the rows are `wide`), the default first: the
/// workgroup tree on a GPU, the serial loop on a CPU adapter. There a workgroup runs on one
/// thread and each barrier of the tree switches coroutines: lavapipe's tuned reductions never
/// chose the tree, and the untuned small ones (a classifier's bias gradient, `[64, 10]` summed
/// over its rows) took 0.31 ms on it.
fn strategies(device: &crate::Device, wide: bool) -> Vec<(ReduceStrategy, &'static str)> {
    let info = device.adapter_info();
    let features = info.map(|a| a.features);
    let subgroups = features.is_some_and(|f| f.subgroups);
    let wide = wide && features.is_some_and(|f| f.shader_int64);
    let mut all: Vec<(ReduceStrategy, &'static str)> = ReduceStrategy::ALL
        .into_iter()
        .filter(|&s| s != ReduceStrategy::Subgroup || subgroups)
        .filter(|&s| s != ReduceStrategy::SerialWide || wide)
        .map(|s| (s, s.name()))
        .collect();
    if tune::on_cpu_adapter(device) {
        // (A stable sort: the others keep their order.)
        all.sort_by_key(|&(s, _)| s != ReduceStrategy::Serial);
    }
    all
}

/// Whether `xp`'s rows of `inner` may be read as 32-byte words: contiguous f32 rows of whole
/// words from a word-aligned offset.
fn wide_rows(xp: &Tensor, inner: usize) -> bool {
    xp.dtype == DType::F32
        && xp.is_contiguous()
        && inner.is_multiple_of(8)
        && xp.layout.offset.is_multiple_of(8)
}

/// One reduction of rows: the op, the rows' length, the factor the results take (a mean's
/// 1 / n) and the op's name for errors.
#[derive(Clone, Copy)]
struct Rows {
    rop: ReduceOp,
    inner: usize,
    scale: f32,
    op: &'static str,
}

impl Rows {
    /// The same reduction over rows of `inner`, scaled by `scale`.
    fn len(self, inner: usize, scale: f32) -> Rows {
        Rows {
            inner,
            scale,
            ..self
        }
    }
}

/// Reduces `xp`'s rows of `r.inner` elements (reduced dims last) into contiguous `out`, with the
/// strategy autotuning picks for this size class on this adapter.
fn gpu_reduce_rows(r: Rows, xp: &Tensor, out: &Tensor) -> Result<()> {
    let Rows { rop, inner, .. } = r;
    let rows = out.numel();
    if !super::views::fits(xp) {
        match xp.is_contiguous() {
            true => return reduce_windows(r, xp, out),
            false => {
                if reduce_across_windows(r, xp, out)? {
                    return Ok(());
                }
            }
        }
    }
    let wide = wide_rows(xp, inner);
    let layout = if !xp.is_contiguous() {
        "strided"
    } else if wide {
        "vec8"
    } else if inner.is_multiple_of(4) && xp.layout.offset.is_multiple_of(4) {
        "vec4"
    } else {
        "contig"
    };
    let key = || {
        format!(
            "{} {} {layout} rows {} inner {}",
            rop.name(),
            xp.dtype,
            tune::class(rows),
            tune::class(inner)
        )
    };
    let strategy = tune::pick(
        xp.device(),
        "reduce",
        key,
        (rows * inner) as u64,
        &strategies(xp.device(), wide),
        |s| reduce_rows_with(s, r, xp, out),
    )?;
    reduce_rows_with(strategy, r, xp, out)
}

/// `gpu_reduce_rows` over contiguous `xp` larger than one binding (Note [Windows] in
/// `kernels/launch.rs`): over windows of its rows where a window holds enough of them (the
/// logits' sums, maxima), each into its rows of `out` (from a row on the binding alignment);
/// longer rows (a whole tensor's sum) as rows of `chunk` elements and a tail, reduced into
/// partials that are reduced in turn.
fn reduce_windows(r: Rows, xp: &Tensor, out: &Tensor) -> Result<()> {
    let Rows { inner, scale, .. } = r;
    let rows = out.numel();
    let es = xp.dtype.size_bytes();
    let x2 = xp.reshape(&[rows as isize, inner as isize])?;
    let o1 = out.reshape(&[rows as isize])?;
    let window = crate::kernels::window_bytes(xp.device()) as usize;
    if let Ok(per) = crate::kernels::aligned_rows(xp.device(), out.dtype.size_bytes(), inner * es) {
        for (first, end) in crate::kernels::spans(rows, per) {
            let (x, o) = (
                x2.narrow(0, first, end - first)?,
                o1.narrow(0, first, end - first)?,
            );
            gpu_reduce_rows(r, &x, &o)?;
        }
        return Ok(());
    }
    // Rows of `chunk` elements and a tail, each one's partial in f32, row by row: 128 chunks
    // fit one window, so that the chunks' windows of rows hold whole alignment steps.
    let chunk = window / (128 * es);
    let (whole, tail) = (inner / chunk, inner % chunk);
    let parts = whole + (tail > 0) as usize;
    let partial = Tensor::empty(&[rows, parts], DType::F32, xp.device())?;
    for i in 0..rows {
        let row = x2.narrow(0, i, 1)?;
        let p = partial.narrow(0, i, 1)?.reshape(&[parts as isize])?;
        if whole > 0 {
            let body = row.narrow(1, 0, whole * chunk)?;
            let body = body.reshape(&[whole as isize, chunk as isize])?;
            let sums = Tensor::empty(&[whole], DType::F32, xp.device())?;
            gpu_reduce_rows(r.len(chunk, 1.0), &body, &sums)?;
            p.narrow(0, 0, whole)?.copy_(&sums)?;
        }
        if tail > 0 {
            let last = Tensor::empty(&[1], DType::F32, xp.device())?;
            let tail_of = row.narrow(1, whole * chunk, tail)?;
            gpu_reduce_rows(r.len(tail, 1.0), &tail_of, &last)?;
            p.narrow(0, whole, 1)?.copy_(&last)?;
        }
    }
    gpu_reduce_rows(r.len(parts, scale), &partial, out)
}

/// `gpu_reduce_rows` over strided `xp` larger than one binding whose reduced elements are
/// further apart than its rows' (a sum over the leading dim of [n, 50257] logits: `xp` is the
/// transposed view), over windows of the reduced dim: each window's reduction of every row
/// into f32 partials, reduced in turn. Returns false, launching nothing, where `xp` is not two
/// dims so laid out once coalesced, or a window would not hold one index of the reduced dim.
fn reduce_across_windows(r: Rows, xp: &Tensor, out: &Tensor) -> Result<bool> {
    let Rows {
        inner, scale, op, ..
    } = r;
    let rows = out.numel();
    let c = coalesce_for_kernel(op, xp.shape(), &[&xp.layout])?;
    let (sr, sk) = match (&c.shape[..], &c.strides[0][..]) {
        (&[r, k], &[sr, sk]) if r == rows && k == inner && sk > sr => (sr, sk),
        _ => return Ok(false),
    };
    let window = crate::kernels::window_bytes(xp.device()) as usize / xp.dtype.size_bytes();
    // Indices of the reduced dim a window holds beside every row.
    let Some(room) = window.checked_sub((rows - 1) * sr + 1) else {
        return Ok(false);
    };
    let per = room / sk + 1;
    let spans: Vec<(usize, usize)> = crate::kernels::spans(inner, per).collect();
    let partial = Tensor::empty(&[spans.len(), rows], DType::F32, xp.device())?;
    for (i, &(first, end)) in spans.iter().enumerate() {
        let view = xp.as_strided(
            &[rows, end - first],
            &[sr, sk],
            xp.layout.offset + first * sk,
        );
        let part = Tensor::empty(&[rows], DType::F32, xp.device())?;
        gpu_reduce_rows(r.len(end - first, 1.0), &view, &part)?;
        partial
            .narrow(0, i, 1)?
            .reshape(&[rows as isize])?
            .copy_(&part)?;
    }
    gpu_reduce_rows(r.len(spans.len(), scale), &partial.t()?, out)?;
    Ok(true)
}

/// `gpu_reduce_rows` with `strategy`: one pass, or one per level of partials.
fn reduce_rows_with(strategy: ReduceStrategy, r: Rows, xp: &Tensor, out: &Tensor) -> Result<()> {
    let Rows {
        rop,
        inner,
        scale,
        op,
    } = r;
    let rows = out.numel();
    // (Autotuning offers 32-byte words only for rows that have them.)
    let strategy = match strategy {
        ReduceStrategy::SerialWide if !wide_rows(xp, inner) => ReduceStrategy::Serial,
        s => s,
    };
    let c = coalesce_for_kernel(op, xp.shape(), &[&xp.layout])?;
    let (contiguous, shape, strides) = (c.contiguous, &c.shape, &c.strides[0]);
    let vector = contiguous && inner.is_multiple_of(4) && xp.layout.offset.is_multiple_of(4);
    // The vec4 form counts in vec4s, the 32-byte words in eights.
    let unit = match strategy {
        ReduceStrategy::SerialWide => 8,
        _ if vector => 4,
        _ => 1,
    };
    let chunks = (inner / unit)
        .div_ceil(strategy.chunk_units())
        .clamp(1, MAX_CHUNKS);
    // Partials per row: one per chunk, or (interleaved) one per invocation.
    let per_row = chunks * strategy.outputs_per_chunk();
    let first_out = if per_row == 1 { out.dtype } else { DType::F32 };
    let partial = if per_row == 1 {
        None
    } else {
        Some(Tensor::empty(&[rows * per_row], DType::F32, xp.device())?)
    };
    let target = partial.as_ref().unwrap_or(out);
    let scale_bits = if per_row == 1 {
        scale.to_bits()
    } else {
        1f32.to_bits()
    };
    // (Past one binding, the window of xp's rows: `gpu_reduce_rows` makes them fit.)
    let (xw, x_off) = super::views::bind_view(xp)?;
    let mut imm = vec![
        u32_of(op, rows)?,
        u32_of(op, inner / unit)?,
        chunks as u32,
        u32_of(op, (inner / unit).div_ceil(chunks))?,
        shape.len() as u32,
        u32_of(op, x_off / unit)?,
        scale_bits,
        0,
    ];
    pack_dims(&mut imm, &[shape, strides], op)?;
    let kernel = ReduceKernel {
        op: rop,
        input: xp.dtype,
        output: first_out,
        contiguous,
        vector,
        strategy,
    };
    // A workgroup per chunk (tree, subgroup, interleaved) or an invocation per chunk (serial).
    let threads = (rows * chunks) as u64
        * match strategy {
            ReduceStrategy::Serial | ReduceStrategy::SerialWide => 1,
            s => s.workgroup() as u64,
        };
    let workgroup = strategy.workgroup();
    launch_wg(
        Kernel::Reduce(kernel),
        &[xw, super::views::bind_out(target, op)?],
        &imm,
        threads,
        workgroup,
    )?;
    if let Some(partial) = partial {
        let partial = Tensor {
            layout: Layout::contiguous(&[rows, per_row]),
            ..partial
        };
        // The interleaved pass leaves 64 partials per chunk; a serial pass merges them (another
        // interleaved one would leave as many as it read from a short row).
        let next = match strategy {
            ReduceStrategy::Interleaved | ReduceStrategy::SerialWide => ReduceStrategy::Serial,
            s => s,
        };
        reduce_rows_with(next, r.len(per_row, scale), &partial, out)?;
    }
    Ok(())
}

/// `x` permuted so the reduced dims come last, the row length, and the output shape.
fn rows_layout(
    x: &Tensor,
    dims: &[isize],
    keepdim: bool,
    op: &'static str,
) -> Result<(Tensor, usize, Vec<usize>)> {
    let rank = x.rank();
    let mut reduced = vec![dims.is_empty(); rank];
    for d in dims_of(op, dims, rank)? {
        reduced[d] = true;
    }
    let kept: Vec<usize> = (0..rank).filter(|&i| !reduced[i]).collect();
    let gone: Vec<usize> = (0..rank).filter(|&i| reduced[i]).collect();
    let order: Vec<isize> = kept.iter().chain(&gone).map(|&i| i as isize).collect();
    let inner = gone.iter().map(|&i| x.shape()[i]).product();
    let out_shape = if keepdim {
        (0..rank)
            .map(|i| if reduced[i] { 1 } else { x.shape()[i] })
            .collect()
    } else {
        kept.iter().map(|&i| x.shape()[i]).collect()
    };
    Ok((x.permute(&order)?, inner, out_shape))
}

/// The reduced dims of a rank-`rank` tensor, ascending (`dims` empty: all of them).
fn reduced_dims(dims: &[isize], rank: usize, op: &'static str) -> Result<Vec<usize>> {
    let mut reduced = vec![dims.is_empty(); rank];
    for d in dims_of(op, dims, rank)? {
        reduced[d] = true;
    }
    Ok((0..rank).filter(|&i| reduced[i]).collect())
}

/// A reduction's output gradient `g` brought back to the input's shape (a broadcast view).
fn expand_back(g: &Tensor, input: &[usize], reduced: &[usize], keepdim: bool) -> Result<Tensor> {
    let mut g = g.clone();
    if !keepdim {
        for &d in reduced {
            g = g.unsqueeze(d as isize)?;
        }
    }
    g.expand(input)
}

fn reduce(x: &Tensor, dims: &[isize], keepdim: bool, rop: ReduceOp, mean: bool) -> Result<Tensor> {
    // Autocast runs sum, mean and prod in f32 (max and min keep their dtype, as in PyTorch).
    if matches!(rop, ReduceOp::Sum | ReduceOp::Prod) {
        if let Some(v) = super::autocast::fp32(&[x])? {
            return reduce(&v[0], dims, keepdim, rop, mean);
        }
    }
    let name = match (mean, rop) {
        (true, _) => "MeanBackward1",
        (_, ReduceOp::Sum) => "SumBackward1",
        (_, ReduceOp::Prod) => "ProdBackward1",
        (_, ReduceOp::Max) => "AmaxBackward0",
        (_, ReduceOp::Min) => "AminBackward0",
    };
    crate::graph::record(
        name,
        &[x],
        || reduce_forward(x, dims, keepdim, rop, mean),
        |out| {
            let input = x.shape().to_vec();
            let reduced = reduced_dims(dims, x.rank(), name)?;
            let count: usize = reduced.iter().map(|&d| input[d]).product();
            let keep = matches!(rop, ReduceOp::Prod | ReduceOp::Max | ReduceOp::Min);
            let xs = keep.then(|| save(x)).transpose()?;
            let os = keep.then(|| save_output(out, name)).transpose()?;
            Ok(Box::new(move |g: &Tensor, _: &[bool]| {
                let ge = expand_back(g, &input, &reduced, keepdim)?;
                let gx = match (mean, rop) {
                    (true, _) => ge.div_scalar(count as f64)?,
                    (_, ReduceOp::Sum) => ge,
                    (_, rop) => {
                        let x = xs.as_ref().expect("saved").get()?;
                        let o = expand_back(
                            &os.as_ref().expect("saved").get()?,
                            &input,
                            &reduced,
                            keepdim,
                        )?;
                        if rop == ReduceOp::Prod {
                            // Nonzero inputs; PyTorch's zero-aware formula is not reproduced.
                            ge.mul(&o)?.div(&x)?
                        } else {
                            // Ties share the gradient evenly, as in PyTorch.
                            let hit = x.eq(&o)?.to_dtype(x.dtype())?;
                            let n = hit.sum(
                                &reduced.iter().map(|&d| d as isize).collect::<Vec<_>>(),
                                true,
                            )?;
                            ge.mul(&hit)?.div(&n)?
                        }
                    }
                };
                Ok(vec![Some(gx)])
            }) as BackwardFn)
        },
    )
}

fn reduce_forward(
    x: &Tensor,
    dims: &[isize],
    keepdim: bool,
    rop: ReduceOp,
    mean: bool,
) -> Result<Tensor> {
    let op = if mean { "mean" } else { rop.name() };
    if !x.dtype.is_float() {
        return Err(Error::UnsupportedDType {
            op,
            dtype: x.dtype,
            why: "yet (PyTorch reduces integers into int64, which kiln lacks)".into(),
        });
    }
    let (xp, inner, out_shape) = rows_layout(x, dims, keepdim, op)?;
    let out = Tensor::empty(&out_shape, x.dtype, x.device())?;
    if out.numel() == 0 {
        return Ok(out);
    }
    if inner == 0 {
        let value = match (mean, rop) {
            (true, _) => f64::NAN,
            (false, ReduceOp::Sum) => 0.0,
            (false, ReduceOp::Prod) => 1.0,
            (false, _) => {
                return Err(Error::InvalidArgument {
                    op,
                    msg: "cannot reduce over a dimension of size 0 (no identity)".into(),
                })
            }
        };
        out.fill_(value)?;
        return Ok(out);
    }
    let scale = if mean { 1.0 / inner as f64 } else { 1.0 };
    if x.device().is_cpu() {
        xp.host_ready()?;
        cpu::reduce_rows(
            &xp,
            &out,
            inner,
            scale,
            |a, b| rop.cpu(a, b),
            rop.cpu_identity(),
        );
    } else if let Some(cols) = leading_dims_sum(x, dims, rop)? {
        match super::views::fits(x) {
            true => gpu_sum_columns(x, &out, inner, cols, scale as f32, op)?,
            false => sum_column_windows(x, &out, inner, cols, scale, op)?,
        }
    } else {
        let r = Rows {
            rop,
            inner,
            scale: scale as f32,
            op,
        };
        gpu_reduce_rows(r, &xp, &out)?;
    }
    Ok(out)
}

/// The kept size where `x`'s reduction is an f32 or f16 sum over its leading dims with `x`
/// contiguous and the kept size in vec4s (a bias gradient, `grad.sum(0)`): the column kernel's
/// case.
fn leading_dims_sum(x: &Tensor, dims: &[isize], rop: ReduceOp) -> Result<Option<usize>> {
    let reduced = reduced_dims(dims, x.rank(), rop.name())?;
    let prefix = reduced.iter().enumerate().all(|(i, &d)| i == d);
    let cols: usize = x.shape()[reduced.len()..].iter().product();
    let fits = rop == ReduceOp::Sum
        && matches!(x.dtype, DType::F32 | DType::F16)
        && prefix
        && !reduced.is_empty()
        && reduced.len() < x.rank()
        && x.is_contiguous()
        && cols.is_multiple_of(4)
        && x.layout.offset.is_multiple_of(4);
    Ok(fits.then_some(cols))
}

/// Sums the `rows` leading rows of contiguous `x` (`rows x cols`) into `out`, coalesced: chunks
/// of rows to partial sums spread over the GPU, then the partials (see `shaders/colsum.wgsl`).
/// Measured on the H100 for [512, 4096]: 20 us, where the row kernel walking columns took 27.
fn gpu_sum_columns(
    x: &Tensor,
    out: &Tensor,
    rows: usize,
    cols: usize,
    scale: f32,
    op: &'static str,
) -> Result<()> {
    let blocks = (cols / 4).div_ceil(64);
    // About 1024 workgroups (256 left an H200 a quarter full: GPT-2's f16 bias gradients, [8192,
    // 2304], ran at 1.3 TB/s), each summing at least 16 rows, and at most 32 chunks: the
    // partials' pass has one workgroup per 256 columns (9 for 2304), and over 114 chunks it
    // took longer than the first pass had saved.
    let chunks = 1024usize
        .div_ceil(blocks)
        .min(32)
        .min(rows.div_ceil(16))
        .max(1);
    let chunk_len = rows.div_ceil(chunks);
    let chunks = rows.div_ceil(chunk_len);
    // Partials are f32 whatever the dtype; the input's and the result's are the tensors'.
    let pass = |input: &Tensor, target: &Tensor, rows: usize, len: usize, n: usize, s: f32| {
        let (in_w, in_off) = super::views::bind_view(input)?;
        let imm = [
            u32_of(op, rows)?,
            u32_of(op, cols / 4)?,
            u32_of(op, len)?,
            u32_of(op, in_off / 4)?,
            s.to_bits(),
            0,
            0,
            0,
        ];
        crate::kernels::launch_groups(
            Kernel::ColumnSum(input.dtype, target.dtype),
            &[in_w, super::views::bind_out(target, op)?],
            &imm,
            (u32_of(op, blocks)?, u32_of(op, n)?, 1),
        )
    };
    if chunks == 1 {
        return pass(x, out, rows, rows, 1, scale);
    }
    let partial = Tensor::empty(&[chunks, cols], DType::F32, x.device())?;
    pass(x, &partial, rows, chunk_len, chunks, 1.0)?;
    pass(&partial, out, chunks, chunks, 1, scale)
}

/// `gpu_sum_columns` over contiguous `x` ([rows, cols] once flattened) larger than one binding
/// (Note [Windows] in `kernels/launch.rs`): each window of rows summed into f32 columns of its
/// own, added up in f32, then scaled into `out`.
fn sum_column_windows(
    x: &Tensor,
    out: &Tensor,
    rows: usize,
    cols: usize,
    scale: f64,
    op: &'static str,
) -> Result<()> {
    let window = crate::kernels::window_bytes(x.device()) as usize;
    let per = (window / (cols * x.dtype.size_bytes())).max(1);
    let x2 = x.reshape(&[rows as isize, cols as isize])?;
    let mut acc: Option<Tensor> = None;
    for (first, end) in crate::kernels::spans(rows, per) {
        let part = Tensor::empty(&[cols], DType::F32, x.device())?;
        let rows_of = x2.narrow(0, first, end - first)?;
        gpu_sum_columns(&rows_of, &part, end - first, cols, 1.0, op)?;
        match &acc {
            Some(a) => a.add_(&part)?,
            None => acc = Some(part),
        }
    }
    let acc = acc.expect("a tensor past one binding has rows");
    out.reshape(&[cols as isize])?
        .copy_(&acc.mul_scalar(scale)?)
}

/// max or min along `d` with the index of the first extreme (NaN counts as the extreme).
fn arg_reduce(x: &Tensor, d: isize, keepdim: bool, is_min: bool) -> Result<(Tensor, Tensor)> {
    let needed = crate::graph::needs_grad(&[x]);
    let (mut values, indices) = crate::no_grad(|| arg_reduce_forward(x, d, keepdim, is_min))?;
    if needed {
        let name = if is_min {
            "MinBackward0"
        } else {
            "MaxBackward0"
        };
        let input = x.shape().to_vec();
        let saved = save(&indices)?;
        let dd = dim(name, d, x.rank())? as isize;
        let f: BackwardFn = Box::new(move |g, _| {
            let idx = saved.get()?;
            let (g, idx) = match keepdim || input.is_empty() {
                true => (g.clone(), idx),
                false => (g.unsqueeze(dd)?, idx.unsqueeze(dd)?),
            };
            let zeros = Tensor::zeros(&input, g.dtype(), g.device())?;
            Ok(vec![Some(zeros.scatter_add(dd, &idx, &g)?)])
        });
        crate::graph::attach(&mut values, name, &[x], f);
    }
    Ok((values, indices))
}

fn arg_reduce_forward(
    x: &Tensor,
    d: isize,
    keepdim: bool,
    is_min: bool,
) -> Result<(Tensor, Tensor)> {
    let op = if is_min { "min" } else { "max" };
    if !x.dtype.is_float() {
        return Err(Error::UnsupportedDType {
            op,
            dtype: x.dtype,
            why: "yet".into(),
        });
    }
    let (xp, inner, out_shape) = rows_layout(x, &[d], keepdim, op)?;
    let values = Tensor::empty(&out_shape, x.dtype, x.device())?;
    let indices = Tensor::empty(&out_shape, DType::I32, x.device())?;
    if values.numel() == 0 {
        return Ok((values, indices));
    }
    if inner == 0 {
        return Err(Error::InvalidArgument {
            op,
            msg: "cannot reduce over a dimension of size 0".into(),
        });
    }
    if x.device().is_cpu() {
        xp.host_ready()?;
        cpu::arg_reduce_rows(&xp, &values, &indices, inner, is_min);
    } else {
        gpu_arg_rows(&xp, [&values, &indices], inner, is_min, op)?;
    }
    Ok((values, indices))
}

/// The extreme of each of `xp`'s rows of `inner` (the reduced dim last) and its index, into
/// contiguous `values` and `indices`; where `xp` is contiguous and larger than one binding,
/// over windows of its rows (Note [Windows] in `kernels/launch.rs`: the logits' argmax).
fn gpu_arg_rows(
    xp: &Tensor,
    [values, indices]: [&Tensor; 2],
    inner: usize,
    is_min: bool,
    op: &'static str,
) -> Result<()> {
    let rows = values.numel();
    if !super::views::fits(xp) && xp.is_contiguous() && rows > 1 {
        let es = xp.dtype.size_bytes();
        // (Spans on the alignment of both outputs: the values' rows may be 2 bytes.)
        let out_es = values.dtype.size_bytes().min(4);
        let per = crate::kernels::aligned_rows(xp.device(), out_es, inner * es)?;
        let x2 = xp.reshape(&[rows as isize, inner as isize])?;
        let flat = |t: &Tensor| t.reshape(&[rows as isize]);
        let (v1, i1) = (flat(values)?, flat(indices)?);
        for (first, end) in crate::kernels::spans(rows, per) {
            let part = |t: &Tensor| t.narrow(0, first, end - first);
            gpu_arg_rows(&part(&x2)?, [&part(&v1)?, &part(&i1)?], inner, is_min, op)?;
        }
        return Ok(());
    }
    let c = coalesce_for_kernel(op, xp.shape(), &[&xp.layout])?;
    let (shape, strides) = (&c.shape, &c.strides[0]);
    let (xw, x_off) = super::views::bind_view(xp)?;
    let mut imm = vec![
        u32_of(op, rows)?,
        u32_of(op, inner)?,
        shape.len() as u32,
        u32_of(op, x_off)?,
        is_min as u32,
        0,
        0,
        0,
    ];
    pack_dims(&mut imm, &[shape, strides], op)?;
    let bind_out = super::views::bind_out;
    launch(
        Kernel::ArgReduce(xp.dtype),
        &[xw, bind_out(values, op)?, bind_out(indices, op)?],
        &imm,
        rows as u64 * WORKGROUP as u64,
    )
}

impl Tensor {
    /// Sum over `dims` (all dims when empty), keeping them as size 1 with `keepdim`.
    pub fn sum(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        reduce(self, dims, keepdim, ReduceOp::Sum, false)
    }

    /// Mean over `dims` (all dims when empty).
    pub fn mean(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        reduce(self, dims, keepdim, ReduceOp::Sum, true)
    }

    /// Sum of every element, as a 0-d tensor.
    pub fn sum_all(&self) -> Result<Tensor> {
        reduce(self, &[], false, ReduceOp::Sum, false)
    }

    /// Product over `dims` (all dims when empty).
    pub fn prod(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        reduce(self, dims, keepdim, ReduceOp::Prod, false)
    }

    /// Maximum over `dims` (all when empty); NaN propagates (`torch.amax`).
    pub fn amax(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        reduce(self, dims, keepdim, ReduceOp::Max, false)
    }

    /// Minimum over `dims` (all when empty); NaN propagates (`torch.amin`).
    pub fn amin(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        reduce(self, dims, keepdim, ReduceOp::Min, false)
    }

    /// `(values, indices)` of the maximum along `dim` (indices are i32; PyTorch's are int64).
    pub fn max_dim(&self, dim: isize, keepdim: bool) -> Result<(Tensor, Tensor)> {
        arg_reduce(self, dim, keepdim, false)
    }

    /// `(values, indices)` of the minimum along `dim`.
    pub fn min_dim(&self, dim: isize, keepdim: bool) -> Result<(Tensor, Tensor)> {
        arg_reduce(self, dim, keepdim, true)
    }

    /// Index of the first maximum along `dim`.
    pub fn argmax(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        Ok(arg_reduce(self, dim, keepdim, false)?.1)
    }

    /// Index of the first minimum along `dim`.
    pub fn argmin(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        Ok(arg_reduce(self, dim, keepdim, true)?.1)
    }
}

/// Sums `g` down to `shape` (the reverse of broadcasting).
pub(crate) fn sum_to(g: &Tensor, shape: &[usize]) -> Result<Tensor> {
    if g.shape() == shape {
        return Ok(g.clone());
    }
    let lead = g.rank() - shape.len();
    let mut dims: Vec<isize> = (0..lead as isize).collect();
    for (i, &n) in shape.iter().enumerate() {
        if n == 1 && g.shape()[lead + i] != 1 {
            dims.push((lead + i) as isize);
        }
    }
    let s = g.sum(&dims, true)?;
    s.reshape(&shape.iter().map(|&d| d as isize).collect::<Vec<_>>())
}
