//! Products whose operands or output are larger than one storage binding, as launches over
//! windows of them (Note [Windows] in `kernels/launch.rs`): over windows of M where the output
//! or a row-major A is that large, over windows of K where a k-major operand is (into f32
//! partials on tensor cores, into products added together on the SIMT kernels). GPT-2's tied
//! head makes all three from batch 21 at T1024 in f16, from batch 11 in f32.

use super::matmul_plan::{Flat, Product};
use super::matmul_simt::SimtLaunch;
use super::u32_of;
use crate::kernels::{
    aligned_rows, launch_groups, past_one_binding, spans, whole, window_bytes, window_covering,
    window_from, CoopLayout, CoopTile, Kernel, Window,
};
use crate::tensor::Tensor;
use crate::{DType, Error, Result};

const OP: &str = "matmul";

/// The tensor-core product of one matrix whose output (or row-major A) is larger than one
/// binding, as launches over windows of rows of both (Note [Windows] in `kernels/launch.rs`):
/// each binds the rows of the output it writes and, A being row-major, the rows of A it reads
/// (a transposed A whole, its offset stepped to the window's first row). GPT-2's tied head makes such products from
/// batch 21 at T1024 (`x @ W^T` writes [B * 1024, 50304] f16, `g @ W` reads it).
pub(super) fn coop_rows(
    p: &Product,
    f: &Flat,
    out: &Tensor,
    (tile, layout): (CoopTile, CoopLayout),
    mut imm: Vec<u32>,
    bias: Option<&Tensor>,
) -> Result<()> {
    let window = window_bytes(out.device());
    let (n, k, e) = (p.n, p.k, p.a.dtype().size_bytes());
    let bm = tile.block_m() as usize;
    let (a_off, lda) = (imm[4] as usize, imm[6] as usize);
    let mut rows = window as usize / (n * e).max(1);
    if !layout.a_t {
        rows = rows.min(window as usize / (lda * e).max(1));
    }
    let rows = nonzero(rows / bm * bm, bm * n.max(lda) * e, window, TILE_ROWS)?;
    for (first, end) in spans(p.m, rows) {
        let at = |row: usize| (row * n * e) as u64;
        let o = window_from(&out.storage.block, at(first), at(end), OP)?;
        let (a, a_at) = slice_window(&f.a, (a_off, lda, k), !layout.a_t, (first, end))?;
        imm[0] = u32_of(OP, end - first)?;
        imm[4] = u32_of(OP, a_at)?;
        let groups = (
            n as u32 / tile.block_n(),
            u32_of(OP, (end - first) / bm)?,
            1,
        );
        launch_groups(
            Kernel::MatmulCoop(tile, layout),
            // (Without a bias, A's window stands in for its unread binding.)
            &[
                a,
                whole(&f.b.storage.block),
                o,
                bias.map_or(a, |t| whole(&t.storage.block)),
            ],
            &imm,
            groups,
        )?;
    }
    Ok(())
}

/// The tensor-core product of one matrix whose k-major operand (a transposed A, or a
/// row-major B) is larger than one binding, as launches over windows of K (Note [Windows] in
/// `kernels/launch.rs`): each multiplies one slice of K, its rows of that operand bound alone,
/// into an f32 partial, added into the first; the sum is rounded once to f16 into `out`, as
/// the unsplit kernel rounds. GPT-2's tied head makes such a product from batch 21 at T1024:
/// `g^T @ x` for the embedding's gradient reads the [B * 1024, 50304] f16 gradient as A.
pub(super) fn coop_k_windows(
    p: &Product,
    f: &Flat,
    out: &Tensor,
    (tile, layout): (CoopTile, CoopLayout),
    imm: Vec<u32>,
) -> Result<()> {
    let window = window_bytes(out.device());
    let (m, n, k, e) = (p.m, p.n, p.k, p.a.dtype().size_bytes());
    let (a_off, lda, b_off, ldb) = (
        imm[4] as usize,
        imm[6] as usize,
        imm[7] as usize,
        imm[9] as usize,
    );
    // Rows of K a window holds, of each k-major operand, in whole steps of the kernel's K.
    let mut rows = k;
    if layout.a_t {
        rows = rows.min(window as usize / (lda * e).max(1));
    }
    if !layout.b_t {
        rows = rows.min(window as usize / (ldb * e).max(1));
    }
    let step = tile.k_step() as usize;
    let rows = nonzero(
        rows / step * step,
        step * lda.max(ldb) * e,
        window,
        "bytes of one step of K of the product (one storage binding)",
    )?;
    let acc = Tensor::empty(&[m, n], DType::F32, out.device())?;
    let part = Tensor::empty(&[m, n], DType::F32, out.device())?;
    let mut imm = imm;
    imm[3] = 1;
    imm[10] = 0;
    for (first, end) in spans(k, rows) {
        let (a, a_at) = slice_window(&f.a, (a_off, lda, m), layout.a_t, (first, end))?;
        let (b, b_at) = slice_window(&f.b, (b_off, ldb, n), !layout.b_t, (first, end))?;
        imm[2] = u32_of(OP, end - first)?;
        imm[4] = u32_of(OP, a_at)?;
        imm[7] = u32_of(OP, b_at)?;
        let into = if first == 0 { &acc } else { &part };
        launch_groups(
            Kernel::MatmulCoopPartials(tile, layout),
            &[a, b, whole(&into.storage.block), a],
            &imm,
            (n as u32 / tile.block_n(), m as u32 / tile.block_m(), 1),
        )?;
        if first > 0 {
            super::inplace::binary_(&acc, &part, crate::base::BinaryOp::Add)?;
        }
    }
    drop(part);
    super::predicate::cast_into(&acc, out)
}

/// The SIMT product `l` of one matrix (`matmul_simt::simt`) where the output or an operand is
/// larger than one binding, as launches over windows (Note [Windows] in `kernels/launch.rs`):
/// - where the output, or a row-major A, is that large, over windows of M, each binding the
///   rows of the output it writes (from a row on the binding alignment) and of a row-major A
///   (a k-major A whole, its offset stepped to the window's first row);
/// - where a k-major A, or a row-major B, is, over windows of K, each binding its rows of those
///   operands: the first window's product goes into `out`, each later one into a second
///   product added into it.
///
/// GPT-2's f32 tied head makes all three from batch 11 at T1024: `x @ W^T` writes the
/// [B * 1024, 50260] logits, `g @ W` reads their padded gradient as A, `g^T @ x` as a
/// transposed A. Other operands past a binding (strided, or a k-major B as large) keep the
/// launch's own error.
pub(super) fn simt_windows(p: &Product, f: &Flat, l: SimtLaunch, out: &Tensor) -> Result<()> {
    let big = |t: &Tensor| past_one_binding(&t.storage.block);
    let e = p.a.dtype().size_bytes();
    let (a_rows, a_cols) = (f.sak == 1, f.sam == 1);
    let (b_rows, b_cols) = (f.sbn == 1, f.sbk == 1);
    let fourth = l.fourth.map(|t| whole(&t.storage.block));
    let window = window_bytes(out.device());
    let mut imm = l.imm.clone();
    let launch = |imm: &[usize], bindings: [Window; 4], rows: usize| {
        let words = imm
            .iter()
            .map(|&v| u32_of(OP, v))
            .collect::<Result<Vec<u32>>>()?;
        let groups = (
            u32_of(OP, p.n.div_ceil(l.tile.1))?,
            u32_of(OP, rows.div_ceil(l.tile.0))?,
            1,
        );
        let n = if l.four_bindings { 4 } else { 3 };
        launch_groups(l.kernel, &bindings[..n], &words, groups)
    };
    if (big(out) || (big(&f.a) && a_rows)) && (a_rows || a_cols) {
        // Whole tiles of rows, on the output's alignment (128 is a multiple of its step).
        let widest = if a_rows { f.sam * e } else { 0 };
        let rows = aligned_rows(out.device(), p.n * e, widest)? / 128 * 128;
        let rows = nonzero(rows, 128 * (p.n * e).max(widest), window, TILE_ROWS)?;
        for (first, end) in spans(p.m, rows) {
            let at = |row: usize| (row * p.n * e) as u64;
            let o = window_from(&out.storage.block, at(first), at(end), OP)?;
            let (a, a_at) = slice_window(&f.a, (l.imm[4], f.sam, p.k), a_rows, (first, end))?;
            imm[0] = end - first;
            imm[4] = a_at;
            launch(
                &imm,
                [a, whole(&f.b.storage.block), o, fourth.unwrap_or(a)],
                end - first,
            )?;
        }
        return Ok(());
    }
    let k_major = (big(&f.a) && a_cols) || (big(&f.b) && b_rows);
    if k_major && (a_rows || a_cols) && (b_rows || b_cols) && !big(out) {
        let mut rows = p.k;
        if a_cols {
            rows = rows.min(window as usize / (f.sak * e).max(1));
        }
        if b_rows {
            rows = rows.min(window as usize / (f.sbk * e).max(1));
        }
        let rows = nonzero(
            rows / 128 * 128,
            128 * (f.sak.max(f.sbk) * e),
            window,
            TILE_ROWS,
        )?;
        let part = Tensor::empty(&[p.m, p.n], p.a.dtype(), out.device())?;
        for (first, end) in spans(p.k, rows) {
            let (a, a_at) = slice_window(&f.a, (l.imm[4], f.sak, p.m), a_cols, (first, end))?;
            let (b, b_at) = slice_window(&f.b, (l.imm[8], f.sbk, p.n), b_rows, (first, end))?;
            imm[2] = end - first;
            imm[4] = a_at;
            imm[8] = b_at;
            let into = if first == 0 { out } else { &part };
            launch(&imm, [a, b, whole(&into.storage.block), a], p.m)?;
            if first > 0 {
                super::inplace::binary_(out, &part, crate::base::BinaryOp::Add)?;
            }
        }
        return Ok(());
    }
    let blocks = [&f.a, &f.b, out].map(|t| whole(&t.storage.block));
    launch(
        &l.imm,
        [blocks[0], blocks[1], blocks[2], fourth.unwrap_or(blocks[0])],
        p.m,
    )
}

/// What passes one binding where a window cannot hold one tile's rows.
const TILE_ROWS: &str = "bytes of one tile's rows of the product (one storage binding)";

/// `rows` a window holds, or the error that the least a launch takes (`bytes`, described by
/// `what`) passes one binding (`window` bytes).
fn nonzero(rows: usize, bytes: usize, window: u64, what: &'static str) -> Result<usize> {
    match rows {
        0 => Err(Error::TooLarge {
            op: OP,
            size_bytes: bytes as u64,
            limit_bytes: window,
            what,
        }),
        r => Ok(r),
    }
}

/// The binding of indices `first..end` of one dim of operand `t` (stored from `off` in rows
/// `ld` apart, `width` wide) and the offset of `first` in it: where the dim runs across the
/// rows (`across`: M of a row-major A, K of a k-major operand), those rows alone; where it runs
/// along them, the whole block with the offset stepped by `first`.
fn slice_window(
    t: &Tensor,
    (off, ld, width): (usize, usize, usize),
    across: bool,
    (first, end): (usize, usize),
) -> Result<(Window<'_>, usize)> {
    if !across {
        return Ok((whole(&t.storage.block), off + first));
    }
    let e = t.dtype().size_bytes();
    let at = |row: usize| ((off + row * ld) * e) as u64;
    let (w, before) = window_covering(
        &t.storage.block,
        at(first),
        at(end - 1) + (width * e) as u64,
    )?;
    Ok((w, before as usize / e))
}
