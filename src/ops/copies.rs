//! Copies with their own kernels: a 2-D transpose or a batch of them (tiled through workgroup
//! memory, strided, or in 64-bit words, as the tuner picks), two such copies in one launch, and
//! rows copied between row strides with zero padding (`copy_rows`).

use super::{coalesce_for_kernel, gpu_elementwise_flat, u32_of, Coalesced};
use crate::base::UnaryOp;
use crate::kernels::{launch, launch_groups, tune, Form, Kernel, RowCopy};
use crate::tensor::{DType, Tensor};
use crate::Result;

/// How a `TransposeJob` copies: through a tile of workgroup memory (the default), strided
/// (the elementwise copy reading across rows: no barrier), or as 4x4 blocks of 64-bit words
/// (`shaders/transpose_words.wgsl`: no barrier, half the memory operations; 4-byte elements
/// where the adapter has 64-bit integers).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum TransposeCopy {
    Tiled,
    Strided,
    Words,
}

/// A copy of `a` into the contiguous `out` that is a 2-D transpose or a batch of them
/// (`transpose.wgsl`'s contract: `x` read down its rows, the output contiguous from its start).
#[derive(Clone, Copy)]
pub(super) struct TransposeJob {
    /// `[rows, cols, off, lda, sb, 0, 0, 0]`.
    imm: [u32; 8],
    batch: u32,
}

/// `a`'s copy into `out` as a `TransposeJob`, where the coalesced layouts `c` (operands
/// `[a, a, out]`) have that form and the grid fits.
pub(super) fn transpose_job(
    op: &'static str,
    a: &Tensor,
    out: &Tensor,
    c: &Coalesced,
) -> Result<Option<TransposeJob>> {
    let (shape, strides) = (&c.shape, &c.strides);
    let r = shape.len();
    let transposed = (r == 2 || r == 3)
        && out.layout.offset == 0
        && strides[0][r - 2] == 1
        && strides[2][r - 1] == 1
        && strides[2][r - 2] == shape[r - 1]
        && (r == 2 || strides[2][0] == shape[1] * shape[2]);
    if !transposed {
        return Ok(None);
    }
    let (batch, rows, cols) = match r {
        3 => (shape[0], shape[1], shape[2]),
        _ => (1, shape[0], shape[1]),
    };
    if rows.div_ceil(32) > 65535 || cols.div_ceil(32) > 65535 || batch > 65535 {
        return Ok(None);
    }
    let sb = if r == 3 { strides[0][0] } else { 0 };
    Ok(Some(TransposeJob {
        imm: [
            u32_of(op, rows)?,
            u32_of(op, cols)?,
            u32_of(op, a.layout.offset)?,
            u32_of(op, strides[0][r - 1])?,
            u32_of(op, sb)?,
            0,
            0,
            0,
        ],
        batch: batch as u32,
    }))
}

impl TransposeJob {
    /// The tuner's key: dtype and the size classes of batch, rows and columns.
    fn key(&self, d: DType) -> String {
        let (r, c) = (
            tune::class(self.imm[0] as usize),
            tune::class(self.imm[1] as usize),
        );
        match self.batch {
            1 => format!("{d} {r}x{c}"),
            b => format!("{d} {}x{r}x{c}", tune::class(b as usize)),
        }
    }

    /// The tuner's pick of how to copy `a` into `out` (coalesced as `c`); measuring runs the
    /// candidates on the operands.
    pub(super) fn pick(
        &self,
        a: &Tensor,
        out: &Tensor,
        c: &Coalesced,
        op: &'static str,
    ) -> Result<TransposeCopy> {
        let mut candidates = vec![
            (TransposeCopy::Tiled, "tiled"),
            (TransposeCopy::Strided, "strided"),
        ];
        let int64 = a
            .device()
            .adapter_info()
            .is_some_and(|i| i.features.shader_int64);
        let fits = self.imm[1] / 4 <= 65535;
        if int64 && fits && a.dtype.size_bytes() == 4 && self.imm[..5].iter().all(|v| v % 4 == 0) {
            candidates.push((TransposeCopy::Words, "words"));
        }
        // On a CPU adapter the barrier-free copies come first (the words, else the strided
        // copy: lavapipe's 2048^2 took 17.5 ms on words, 63 tiled); on GL's llvmpipe the tiled
        // copy is not a candidate.
        if tune::on_cpu_adapter(a.device()) {
            candidates.sort_by_key(|&(t, _)| match t {
                TransposeCopy::Words => 0,
                TransposeCopy::Strided => 1,
                TransposeCopy::Tiled => 2,
            });
            if tune::on_gl_cpu_adapter(a.device()) {
                candidates.retain(|&(t, _)| t != TransposeCopy::Tiled);
            }
        }
        let form = Form::Unary(UnaryOp::Identity);
        tune::pick(
            a.device(),
            "transpose",
            || self.key(a.dtype),
            out.numel() as u64,
            &candidates,
            |t| match t {
                TransposeCopy::Tiled => self.launch(a, out),
                TransposeCopy::Words => self.launch_words(a, out),
                TransposeCopy::Strided => {
                    gpu_elementwise_flat(form, a, None, None, out, false, c, op)
                }
            },
        )
    }

    /// The copy as 4x4 blocks of 64-bit words (the caller checked its conditions).
    pub(super) fn launch_words(&self, a: &Tensor, out: &Tensor) -> Result<()> {
        let (rows, cols) = (self.imm[0], self.imm[1]);
        launch_groups(
            Kernel::TransposeWords,
            &[&a.storage.block, &out.storage.block],
            &self.imm,
            ((rows / 4).div_ceil(64), cols / 4, self.batch),
        )
    }

    /// 32x32 tiles along rows and along columns.
    fn tiles(&self) -> (u32, u32) {
        (self.imm[0].div_ceil(32), self.imm[1].div_ceil(32))
    }

    /// The tiled copy on its own; 16-bit elements two to a word where every row and offset
    /// starts on a word.
    pub(super) fn launch(&self, a: &Tensor, out: &Tensor) -> Result<()> {
        let pairs = a.dtype.size_bytes() == 2 && self.imm[..5].iter().all(|v| v % 2 == 0);
        let (kernel, tile) = match pairs {
            true => (Kernel::TransposePairs, 64),
            false => (Kernel::Transpose(a.dtype), 32),
        };
        let (rows, cols) = (self.imm[0], self.imm[1]);
        launch_groups(
            kernel,
            &[&a.storage.block, &out.storage.block],
            &self.imm,
            (rows.div_ceil(tile), cols.div_ceil(tile), self.batch),
        )
    }
}

/// `a.contiguous()` and `b.contiguous()` for two GPU tensors of one float dtype whose copies
/// are batched transposes: one launch (`Kernel::TransposeTwo`, `b`'s tiles in workgroup layers
/// after `a`'s) where the tuner picks the tiled copy for `a`, else two copies. A convolution's
/// input goes to NHWC with its weight permuted beside it: on the H100 the weight's own launch
/// (147 KB) cost 9 us of the 3x3 64->64 forward's 331, a barrier and a kernel's ramp.
pub(crate) fn contiguous_two(a: &Tensor, b: &Tensor) -> Result<(Tensor, Tensor)> {
    const OP: &str = "contiguous";
    let separate = || Ok((a.contiguous()?, b.contiguous()?));
    if a.device().is_cpu()
        || a.device() != b.device()
        || a.dtype != b.dtype
        || !matches!(a.dtype, DType::F32 | DType::F16)
        || a.is_contiguous()
        || b.is_contiguous()
        || a.numel() == 0
        || b.numel() == 0
    {
        return separate();
    }
    let outs = [a, b].map(|t| Tensor::empty(t.shape(), t.dtype, t.device()));
    let [Ok(oa), Ok(ob)] = outs else {
        return separate();
    };
    let ca = coalesce_for_kernel(OP, a.shape(), &[&a.layout, &a.layout, &oa.layout])?;
    let cb = coalesce_for_kernel(OP, b.shape(), &[&b.layout, &b.layout, &ob.layout])?;
    let (Some(ja), Some(jb)) = (
        transpose_job(OP, a, &oa, &ca)?,
        transpose_job(OP, b, &ob, &cb)?,
    ) else {
        return separate();
    };
    let tiled = ja.pick(a, &oa, &ca, OP)? == TransposeCopy::Tiled;
    // b's tiles, numbered across a's (x, y) grid, fill the layers after a's batch.
    let ((ra, ca_tiles), (rb, cb_tiles)) = (ja.tiles(), jb.tiles());
    let layer = ra * ca_tiles;
    let extra = (rb * cb_tiles * jb.batch).div_ceil(layer);
    if !tiled || ja.batch + extra > 65535 {
        drop((oa, ob));
        return separate();
    }
    let mut imm = [0u32; 16];
    imm[..8].copy_from_slice(&ja.imm);
    imm[5] = ja.batch;
    imm[8..].copy_from_slice(&jb.imm);
    imm[13] = jb.batch;
    imm[14] = rb;
    imm[15] = cb_tiles;
    launch_groups(
        Kernel::TransposeTwo(a.dtype),
        &[
            &a.storage.block,
            &oa.storage.block,
            &b.storage.block,
            &ob.storage.block,
        ],
        &imm,
        (ra, ca_tiles, ja.batch + extra),
    )?;
    Ok((oa, ob))
}

/// `x` (2-D, unit stride along its rows) into a new contiguous `[rows, cols]` tensor of its
/// dtype: its first `cols` columns where that is fewer, zeros after its columns where more.
/// One pass: of `shaders/copy_rows.wgsl` in 16-byte vectors where every count and offset
/// allows, else of `shaders/copy_rows_vectors.wgsl`, which writes a 16-byte vector of the
/// output an invocation from four words (rows of whole words) or eight 2-byte elements (any
/// other 2-byte rows); `None` otherwise, or on the CPU, for the caller's elementwise path. No
/// graph is recorded: for copies inside an op.
pub(crate) fn copy_rows(x: &Tensor, cols: usize) -> Result<Option<Tensor>> {
    const OP: &str = "copy_rows";
    let [rows, x_cols] = *x.shape() else {
        return Ok(None);
    };
    let [stride, unit_stride] = *x.strides() else {
        return Ok(None);
    };
    if x.device().is_cpu() || (unit_stride != 1 && x_cols > 1) {
        return Ok(None);
    }
    let es = x.dtype().size_bytes();
    let copied = x_cols.min(cols);
    // (A fresh output starts at offset 0: only the source's counts and offset decide.)
    let bytes = [copied, cols, stride, x.layout.offset].map(|v| v * es);
    // 2-byte rows of any length (GPT-2's 50257 logits) in 2-byte units, two to a word
    // (`shaders/copy_rows_vectors.wgsl`).
    let halves = es == 2;
    let Some(unit) = [16, 4, 2]
        .into_iter()
        .filter(|&u| u > 2 || halves)
        .find(|&u| bytes.iter().all(|b| b.is_multiple_of(u)))
    else {
        return Ok(None);
    };
    let out = Tensor::empty(&[rows, cols], x.dtype(), x.device())?;
    let out_off = out.layout.offset * es / unit;
    let [copied, cols, stride, x_off] = bytes.map(|b| b / unit);
    let total = rows * cols;
    if total == 0 {
        return Ok(Some(out));
    }
    let windowed = [x, &out]
        .iter()
        .any(|t| crate::kernels::past_one_binding(&t.storage.block));
    // The count is set per launch: a windowed copy counts from each window's first row, and
    // checks its own indices.
    let mut imm = [0, cols, copied, stride, x_off, out_off, 0, 0]
        .into_iter()
        .map(|v| u32_of(OP, v))
        .collect::<Result<Vec<u32>>>()?;
    if !windowed {
        // Every word index the kernel forms fits a u32.
        u32_of(OP, x_off + (rows - 1) * stride + copied)?;
        imm[0] = u32_of(OP, total)?;
    }
    // Rows of words that are not whole vectors (GPT-2's f32 logits) are gathered four words to
    // a 16-byte store, as 2-byte rows eight elements to one (`shaders/copy_rows_vectors.wgsl`):
    // H200, an [8192, 50257] f32 copy, one word an invocation against four (BENCHMARKS.md).
    // `force_variant("copy rows", "words")` keeps one word an invocation, for comparison.
    let words = tune::forced_name("copy rows").as_deref() == Some("words");
    let (form, per) = match unit {
        16 => (RowCopy::Vectors, 1),
        4 if words => (RowCopy::Words, 1),
        4 => (RowCopy::WordsToVectors, 4),
        _ => (RowCopy::HalvesToVectors, 8),
    };
    if windowed {
        copy_row_windows(x, &out, (form, per, unit), imm)?;
        return Ok(Some(out));
    }
    let invocations = total.div_ceil(per);
    launch(
        Kernel::CopyRows(form),
        &[&x.storage.block, &out.storage.block],
        &imm,
        invocations as u64,
    )?;
    Ok(Some(out))
}

/// `copy_rows` of tensors larger than one binding (GPT-2's head from batch 21 at T1024), as
/// launches over windows of rows of both (Note [Windows] in `kernels/launch.rs`). A window of
/// the output starts at a row whose first byte is on the binding alignment, so the kernel's
/// 16-byte stores stay whole; the source's window passes its offset inside it. The last
/// vector of a window may run into the next window's first row with zeros, which that window's
/// launch, later on the queue, overwrites.
fn copy_row_windows(
    x: &Tensor,
    out: &Tensor,
    (form, per, unit): (RowCopy, usize, usize),
    mut imm: Vec<u32>,
) -> Result<()> {
    use crate::kernels::{window_covering, window_from};
    const OP: &str = "copy_rows";
    let [rows, cols] = *out.shape() else {
        unreachable!("copy_rows makes a matrix")
    };
    let es = x.dtype().size_bytes();
    let (copied, stride, x_off) = (imm[2] as usize, imm[3] as usize, imm[4] as usize);
    let per_window = crate::kernels::aligned_rows(x.device(), cols * es, stride * unit)?;
    let block = out.storage.block.block_size();
    for (first, end) in crate::kernels::spans(rows, per_window) {
        let o_end = ((end * cols * es) as u64).next_multiple_of(16).min(block);
        let o = window_from(&out.storage.block, (first * cols * es) as u64, o_end, OP)?;
        let unit_at = |row: usize| ((x_off + row * stride) * unit) as u64;
        let x_end = unit_at(end - 1) + (copied * unit) as u64;
        let (src, from) = window_covering(&x.storage.block, unit_at(first), x_end)?;
        imm[0] = u32_of(OP, (end - first) * (cols * es / unit))?;
        imm[4] = u32_of(OP, from as usize / unit)?;
        let invocations = (imm[0] as usize).div_ceil(per);
        launch(Kernel::CopyRows(form), &[src, o], &imm, invocations as u64)?;
    }
    Ok(())
}
