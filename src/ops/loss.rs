//! nll_loss as PyTorch's one op (`NllLossBackward0`) rather than a gather, a mean and a
//! negation: one kernel forward, one backward (`shaders/nll.wgsl`), on the device's assert flag
//! for a bad target as CUDA's device-side assert, and PyTorch's `ignore_index` (-100): rows
//! whose target is it count for nothing, and the mean is over the rest. The CPU device computes
//! the same sums on the host, where a bad target is an error at once.

use super::u32_of;
use crate::graph::Epilogue;
use crate::kernels::{launch, launch_groups, whole, Kernel, Window};
use crate::tensor::{DType, Tensor};
use crate::{Error, Result};

/// PyTorch's default `ignore_index`.
pub const IGNORE_INDEX: i32 = -100;

const OP: &str = "nll_loss";

/// The mean of `-log_probs[i, target[i]]` over the rows whose target is not `ignore_index`
/// (`log_probs` [N, C] of a float dtype, `target` [N] i32; checked by the caller).
pub fn nll_loss(log_probs: &Tensor, target: &Tensor, ignore_index: i32) -> Result<Tensor> {
    super::same_device(OP, log_probs, target)?;
    nll_recorded(log_probs, target, ignore_index, || {
        forward(log_probs, target, ignore_index)
    })
}

/// `nll_loss`'s node over the loss and total_weight `forward` makes.
fn nll_recorded(
    log_probs: &Tensor,
    target: &Tensor,
    ignore_index: i32,
    forward: impl FnOnce() -> Result<(Tensor, Tensor)>,
) -> Result<Tensor> {
    let total: std::cell::RefCell<Option<Tensor>> = std::cell::RefCell::new(None);
    crate::graph::record(
        "NllLossBackward0",
        &[log_probs, target],
        || {
            let (loss, tw) = forward()?;
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
            // PyTorch's NllLossBackward0 saves its input too (for its shape): held, and
            // unpacked in backward, as there, so that the same bytes stay alive (under
            // autocast it is the f32 copy of f16 log-probabilities) and an in-place write to
            // it is caught.
            let input = crate::graph::save(log_probs)?;
            let f: crate::graph::BackwardFn = Box::new(move |g, _| {
                let target = saved.get()?;
                let input = input.get()?;
                // With log_softmax's backward in the same kernel where it was offered (Note
                // [Backward epilogues]), and under autocast the f32 copy's backward between
                // them too.
                match crate::graph::offered(0) {
                    Some(Epilogue::LogSoftmaxRows(y)) => {
                        if let Some(grad) =
                            backward_through_log_softmax(g, &target, &tw, &y, ignore_index)?
                        {
                            crate::graph::accept(0);
                            return Ok(vec![Some(grad), None]);
                        }
                    }
                    Some(Epilogue::CastThen(to, then)) => {
                        if let Epilogue::LogSoftmaxRows(y) = *then {
                            let through = backward_through_copy(
                                g,
                                [&target, &tw],
                                (&y, to),
                                &input,
                                ignore_index,
                            )?;
                            if let Some((grad, finishes)) = through {
                                crate::graph::accept_with(0, finishes);
                                return Ok(vec![Some(grad), None]);
                            }
                        }
                    }
                    _ => {}
                }
                let grad = backward(g, &target, &tw, input.shape(), input.dtype(), ignore_index)?;
                Ok(vec![Some(grad), None])
            });
            Ok(f)
        },
    )
}

/// The immediates of `shaders/nll.wgsl` and `shaders/cross_entropy.wgsl` (their `Params`):
/// the [N, C] shape, `x` (the input with its two strides, or the upstream 0-d gradient with
/// none), the target, the output, total_weight, ignore_index, and log_softmax's output `y`
/// (the fused kernels only).
fn immediates(
    [n, c]: [usize; 2],
    x: &Tensor,
    target: &Tensor,
    [out, tw]: [&Tensor; 2],
    ignore: i32,
    y: Option<&Tensor>,
) -> Result<[u32; 16]> {
    let strides = match x.rank() {
        2 => [x.strides()[0], x.strides()[1]],
        _ => [0, 0],
    };
    // (An input larger than one binding runs in windows, which index from their own starts.)
    if !crate::kernels::past_one_binding(&x.storage.block) {
        u32_of(OP, super::end(x))?;
    }
    Ok([
        u32_of(OP, n)?,
        u32_of(OP, c)?,
        u32_of(OP, x.layout().offset)?,
        u32_of(OP, strides[0])?,
        u32_of(OP, strides[1])?,
        u32_of(OP, target.layout().offset)?,
        u32_of(OP, target.strides()[0])?,
        u32_of(OP, out.layout().offset)?,
        u32_of(OP, tw.layout().offset)?,
        ignore as u32,
        u32_of(OP, y.map_or(0, |y| y.layout().offset))?,
        0,
        0,
        0,
        0,
        0,
    ])
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
    let imm = immediates([n, c], lp, target, [&loss, &total], ignore, None)?;
    let blocks = [
        &lp.storage.block,
        &target.storage.block,
        &loss.storage.block,
        &total.storage.block,
    ];
    let window = crate::kernels::window_bytes(lp.device());
    let rows = window / (c as u64 * 4).max(1);
    let windowed = lp.storage.block.block_size() > window
        && lp.dtype() == DType::F32
        && lp.strides() == [c, 1]
        && rows > 0;
    match windowed {
        true => forward_windows(lp, &blocks, imm, rows as usize)?,
        // (A block too large for one binding fails here, naming the kernel.)
        false => launch(Kernel::Nll(lp.dtype(), false), &blocks, &imm, 256)?,
    }
    Ok((loss, total))
}

/// nll_loss's forward over an f32 `lp` [N, C] (row-major) larger than one binding: windows of
/// `rows` rows, each launch adding its sums to those before (`shaders/nll_common.wgsl`'s
/// `finish`, Note [Windows]). The sums are added in another order than one launch's.
fn forward_windows(
    lp: &Tensor,
    blocks: &[&crate::device::DeviceBlock; 4],
    mut imm: [u32; 16],
    rows: usize,
) -> Result<()> {
    use crate::kernels::{spans, window_covering};
    let (n, c) = (lp.shape()[0], lp.shape()[1]);
    let (offset, t_off, st) = (lp.layout().offset, imm[5] as usize, imm[6] as usize);
    for (first, end) in spans(n, rows) {
        let bytes = |row: usize| ((offset + row * c) * 4) as u64;
        let (x, before) = window_covering(blocks[0], bytes(first), bytes(end))?;
        imm[0] = u32_of(OP, end - first)?;
        imm[2] = u32_of(OP, before as usize / 4)?;
        imm[5] = u32_of(OP, t_off + first * st)?;
        imm[12] = match (first == 0, end == n) {
            (true, true) => 0,
            (true, false) => 1,
            (false, false) => 2,
            (false, true) => 3,
        };
        let operands = [x, whole(blocks[1]), whole(blocks[2]), whole(blocks[3])];
        launch_groups(Kernel::Nll(DType::F32, false), &operands, &imm, (1, 1, 1))?;
    }
    Ok(())
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
    let mut imm = immediates([n, c], &g, target, [&out, total], ignore, None)?;
    let (gb, tb, ob, wb) = (
        &g.storage.block,
        &target.storage.block,
        &out.storage.block,
        &total.storage.block,
    );
    let window = crate::kernels::window_bytes(out.device());
    let rows = window as usize / (c * dtype.size_bytes()).max(1);
    if ob.block_size() <= window || rows == 0 {
        // (A block too large for one binding fails here, naming the kernel.)
        launch(
            Kernel::Nll(dtype, true),
            &[gb, tb, ob, wb],
            &imm,
            numel as u64,
        )?;
        return Ok(out);
    }
    // Windows of rows of the fresh gradient (Note [Windows]).
    let (t_off, st) = (imm[5] as usize, imm[6] as usize);
    for (first, end) in crate::kernels::spans(n, rows) {
        let bytes = |row: usize| (row * c * dtype.size_bytes()) as u64;
        let (o, before) = crate::kernels::window_covering(ob, bytes(first), bytes(end))?;
        imm[0] = u32_of(OP, end - first)?;
        imm[5] = u32_of(OP, t_off + first * st)?;
        imm[7] = u32_of(OP, before as usize / dtype.size_bytes())?;
        launch(
            Kernel::Nll(dtype, true),
            &[whole(gb), whole(tb), o, whole(wb)],
            &imm,
            ((end - first) * c) as u64,
        )?;
    }
    Ok(out)
}

/// The largest [N, C] that `cross_entropy`'s forward takes in its one workgroup (256 rows at a
/// time, each walked serially three times); larger inputs take log_softmax's and nll_loss's
/// own kernels, which spread over the device.
const FUSED_ELEMENTS: usize = 1 << 16;

/// cross_entropy (mean reduction) over `logits` [N, C] (a float matrix; `target` [N] i32,
/// checked by the caller): log_softmax along dim 1 then nll_loss, with PyTorch's two nodes
/// (`LogSoftmaxBackward0` saving its output, `NllLossBackward0`), its allocations in its
/// order (log_softmax's output, then the loss and total_weight), and on a GPU for an input of
/// up to `FUSED_ELEMENTS`, one kernel for both forwards (`shaders/cross_entropy.wgsl`), whose
/// backward kernel takes both backwards where the engine offers log_softmax's formula. The
/// MLP's [512, 10] loss took four launches of about 7 us each on the H100.
pub fn cross_entropy(logits: &Tensor, target: &Tensor, ignore_index: i32) -> Result<Tensor> {
    super::same_device(OP, logits, target)?;
    let (n, c) = (logits.shape()[0], logits.shape()[1]);
    // The fused kernel writes log_softmax's output after its node saved it: under saved-tensor
    // hooks (which pack at the save) the two ops run apart.
    let fused = !logits.device().is_cpu()
        && matches!(logits.dtype(), DType::F32 | DType::F16)
        && c >= 1
        && n * c <= FUSED_ELEMENTS
        && !crate::graph::packing();
    if !fused {
        return nll_loss(&logits.log_softmax(1)?, target, ignore_index);
    }
    // (The caller has applied autocast's fp32 policy: `logits` is the kernel's input.)
    let lp = super::softmax::softmax_recorded_with(logits, 1, true, || {
        Tensor::empty(&[n, c], logits.dtype(), logits.device())
    })?;
    nll_recorded(&lp, target, ignore_index, || {
        let loss = Tensor::empty(&[], lp.dtype(), lp.device())?;
        let total = Tensor::empty(&[], DType::F32, lp.device())?;
        let imm = immediates(
            [n, c],
            logits,
            target,
            [&loss, &total],
            ignore_index,
            Some(&lp),
        )?;
        launch_groups(
            Kernel::CrossEntropy(lp.dtype(), false),
            &[
                &logits.storage.block,
                &target.storage.block,
                &loss.storage.block,
                &total.storage.block,
                &lp.storage.block,
            ],
            &imm,
            (1, 1, 1),
        )?;
        Ok((loss, total))
    })
}

/// The gradient of log_softmax's input [N, C] from nll_loss's upstream `g` (0-d), given
/// log_softmax's output `y`, on a GPU where `y` is a contiguous matrix; `None` elsewhere.
/// 16 bytes an invocation where `y` starts at a whole 16-byte chunk
/// (`shaders/cross_entropy_backward_words.wgsl`), else an element an invocation
/// (`shaders/cross_entropy.wgsl`, for a `g` of `y`'s dtype only).
fn backward_through_log_softmax(
    g: &Tensor,
    target: &Tensor,
    total: &Tensor,
    y: &Tensor,
    ignore: i32,
) -> Result<Option<Tensor>> {
    let words = words_fit(y);
    let fits = rows_fit(y, g) && (words || g.dtype() == y.dtype());
    if !fits {
        return Ok(None);
    }
    let (n, c) = (y.shape()[0], y.shape()[1]);
    let out = Tensor::empty(&[n, c], y.dtype(), y.device())?;
    if out.numel() == 0 {
        return Ok(Some(out));
    }
    let imm = immediates([n, c], g, target, [&out, total], ignore, Some(y))?;
    let (gb, tb, ob, wb, yb) = (
        &g.storage.block,
        &target.storage.block,
        &out.storage.block,
        &total.storage.block,
        &y.storage.block,
    );
    if words {
        launch_words((y, &out), [whole(gb), whole(tb), whole(wb)], imm, g.dtype())?;
    } else {
        let numel = u32_of(OP, n * c)? as u64;
        launch(
            Kernel::CrossEntropy(y.dtype(), true),
            &[gb, tb, ob, wb, yb],
            &imm,
            numel,
        )?;
    }
    Ok(Some(out))
}

/// Under autocast, nll_loss's backward on `copied` (autocast's f32 copy of log_softmax's f16
/// output `y`, of dtype `to`), with the copy's and log_softmax's backwards applied after it
/// (Note [Backward epilogues], through a cast): nll_loss's own gradient, of `copied`'s shape
/// and dtype, holding only a record a row (its factor and target: `shaders/nll_rows.wgsl`),
/// and the `Finish`es of the copy's step (its output allocated, the records copied there) and
/// of log_softmax's (its output allocated and written from the records and `y`:
/// `shaders/cross_entropy_backward_words.wgsl`). Each of the three blocks is the one PyTorch's
/// backwards allocate, in their order. `None` where `y` is not a contiguous matrix starting at
/// a 16-byte chunk on a GPU, or a row of `y` holds less than a record (8 bytes).
fn backward_through_copy(
    g: &Tensor,
    [target, total]: [&Tensor; 2],
    (y, to): (&Tensor, DType),
    copied: &Tensor,
    ignore: i32,
) -> Result<Option<(Tensor, Vec<crate::graph::Finish>)>> {
    let fits = rows_fit(y, g)
        && words_fit(y)
        && y.dtype() == to
        && copied.shape() == y.shape()
        && y.shape()[1] * y.dtype().size_bytes() >= 8
        && y.shape()[1] * copied.dtype().size_bytes() >= 8;
    if !fits {
        return Ok(None);
    }
    let (n, c) = (y.shape()[0], y.shape()[1]);
    // The records at the first word of a fresh tensor (its storage's start).
    let first_word = |t: &Tensor| u32_of(OP, t.layout().offset * t.dtype().size_bytes() / 4);
    let words = u32_of(OP, 2 * n)?;
    let records = Tensor::empty(copied.shape(), copied.dtype(), copied.device())?;
    if n > 0 {
        let mut imm = immediates([n, c], g, target, [&records, total], ignore, None)?;
        let (rec, at) = records_window(&records, first_word(&records)?, words)?;
        imm[7] = at;
        launch(
            Kernel::NllRows(g.dtype()),
            &[
                whole(&g.storage.block),
                whole(&target.storage.block),
                rec,
                whole(&total.storage.block),
            ],
            &imm,
            u32_of(OP, n)? as u64,
        )?;
    }
    // The copy's step: its f16 output, holding the records.
    let copy_step: crate::graph::Finish = Box::new(move |records: Tensor| {
        let out = Tensor::empty(records.shape(), to, records.device())?;
        if n > 0 {
            let (rec, from) = records_window(&records, first_word(&records)?, words)?;
            let (dst, at) = records_window(&out, first_word(&out)?, words)?;
            launch(
                Kernel::CopyRows(crate::kernels::RowCopy::Words),
                &[rec, dst],
                &[words, words, words, words, from, at, 0, 0],
                words as u64,
            )?;
        }
        Ok(out)
    });
    // log_softmax's step: its output, the gradient of the logits.
    let y = y.clone();
    let log_softmax_step: crate::graph::Finish = Box::new(move |records: Tensor| {
        let out = Tensor::empty(&[n, c], y.dtype(), y.device())?;
        if out.numel() == 0 {
            return Ok(out);
        }
        let mut imm = immediates(
            [n, c],
            &records,
            &records,
            [&out, &records],
            ignore,
            Some(&y),
        )?;
        // Only the records of `records` are read: their window is bound at every slot of it.
        let (rb, at) = records_window(&records, first_word(&records)?, words)?;
        imm[5] = at;
        imm[11] = 1;
        launch_words((&y, &out), [rb, rb, rb], imm, DType::F32)?;
        Ok(out)
    });
    Ok(Some((records, vec![copy_step, log_softmax_step])))
}

/// The window of `t`'s block holding `words` 4-byte words from word `first` of its storage
/// (the records at the start of nll_loss's gradient under autocast, or where they are copied),
/// and the word at which they start in it: the records are a few bytes a row of a tensor that
/// may be larger than one binding (Note [Windows]).
fn records_window(t: &Tensor, first: u32, words: u32) -> Result<(Window<'_>, u32)> {
    let start = first as u64 * 4;
    let (window, before) =
        crate::kernels::window_covering(&t.storage.block, start, start + words as u64 * 4)?;
    Ok((window, u32_of(OP, before as usize / 4)?))
}

/// Whether log_softmax's output `y` and the upstream `g` suit a fused backward: a contiguous
/// float matrix on a GPU, `g` on the same device.
fn rows_fit(y: &Tensor, g: &Tensor) -> bool {
    !y.device().is_cpu()
        && y.rank() == 2
        && y.is_contiguous()
        && g.device() == y.device()
        && matches!(y.dtype(), DType::F32 | DType::F16)
        && matches!(g.dtype(), DType::F32 | DType::F16)
}

/// Whether `y` starts at a whole 16-byte chunk (`Kernel::CrossEntropyWords`).
fn words_fit(y: &Tensor) -> bool {
    (y.layout().offset * y.dtype().size_bytes()).is_multiple_of(16)
}

/// `Kernel::CrossEntropyWords` over `y`'s chunks into `out` (both contiguous [N, C], starting
/// at whole chunks), the upstream gradient, the targets (or records) and total_weight bound as
/// `[g, t, w]`, `g` of dtype `g_dtype`. Where `y` or `out` is larger than one binding (GPT-2's
/// logits from batch 21 at T1024), launches over windows of rows (Note [Windows]): each window
/// of `out` starts at a row on the binding alignment, `y`'s passes its offset inside it, and
/// the rows' targets (or records) are read from the window's first row on.
fn launch_words(
    (y, out): (&Tensor, &Tensor),
    [g, t, w]: [Window<'_>; 3],
    mut imm: [u32; 16],
    g_dtype: DType,
) -> Result<()> {
    use crate::kernels::{aligned_rows, past_one_binding, window_covering, window_from};
    let kernel = Kernel::CrossEntropyWords(y.dtype(), g_dtype);
    let es = y.dtype().size_bytes();
    let chunk = 16 / es as u64;
    let (yb, ob) = (&y.storage.block, &out.storage.block);
    if !past_one_binding(yb) && !past_one_binding(ob) {
        let numel = u32_of(OP, y.numel())? as u64;
        return launch(
            kernel,
            &[g, t, whole(ob), w, whole(yb), whole(yb), whole(ob)],
            &imm,
            numel.div_ceil(chunk),
        );
    }
    let (n, c) = (y.shape()[0], y.shape()[1]);
    let per = aligned_rows(y.device(), c * es, c * es)?;
    let (y_first, t_off) = (y.layout().offset * es, imm[5] as usize);
    let t_step = match imm[11] {
        0 => imm[6] as usize,
        _ => 2,
    };
    for (first, end) in crate::kernels::spans(n, per) {
        let (at, len) = (first * c * es, (end - first) * c * es);
        let o = window_from(ob, at as u64, (at + len) as u64, OP)?;
        let (yw, from) = window_covering(yb, (y_first + at) as u64, (y_first + at + len) as u64)?;
        if from % 16 != 0 {
            return Err(Error::InvalidArgument {
                op: OP,
                msg: format!("row {first} of [{n}, {c}] starts inside a 16-byte chunk"),
            });
        }
        imm[0] = u32_of(OP, end - first)?;
        imm[5] = u32_of(OP, t_off + first * t_step)?;
        imm[7] = 0;
        imm[10] = u32_of(OP, from as usize / es)?;
        let numel = ((end - first) * c) as u64;
        launch(
            kernel,
            &[g, t, o, w, yw, yw, o],
            &imm,
            numel.div_ceil(chunk),
        )?;
    }
    Ok(())
}
