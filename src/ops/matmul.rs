//! matmul with PyTorch's rules: 1-D operands are promoted (and the added dim removed after),
//! batch dims broadcast, inputs of any strides (a transpose is read in place, not copied).

use super::matmul_choice::{coop_tile, forced_tile, scalar_forced, split_k, vec4_eligible};
use super::matmul_grad::matmul_backward;
use super::{isize_shape, same_device, u32_of};
use crate::kernels::{
    launch_groups, tune, CoopLayout, CoopTile, Epilogue, Kernel, Operands, UboWindows, Vec4Layout,
};
use crate::tensor::{broadcast_shapes, contiguous_strides, Layout, Tensor};
use crate::{DType, Error, Result};

/// Batched operands with one batch dim: (batch, stride) per operand after coalescing.
struct Batched {
    a: Tensor,
    b: Tensor,
    batch: usize,
    sab: usize,
    sbb: usize,
}

/// Brings `a` [.., m, k] and `b` [.., k, n] (already broadcast to one batch shape) to a single
/// batch dim: by coalescing strides where the layout allows, else by copying.
fn flatten_batch(a: Tensor, b: Tensor, batch_shape: &[usize]) -> Result<Batched> {
    let nb = batch_shape.len();
    let batch: usize = batch_shape.iter().product();
    let mut strides = vec![
        a.strides()[..nb].to_vec(),
        b.strides()[..nb].to_vec(),
        contiguous_strides(batch_shape),
    ];
    let shape = Layout::coalesce(batch_shape, &mut strides);
    if shape.len() <= 1 {
        let first = |s: &Vec<usize>| s.first().copied().unwrap_or(0);
        let (sab, sbb) = (first(&strides[0]), first(&strides[1]));
        return Ok(Batched {
            a,
            b,
            batch,
            sab,
            sbb,
        });
    }
    let (m, k, n) = (a.shape()[nb], a.shape()[nb + 1], b.shape()[nb + 1]);
    let a = a.reshape(&[batch as isize, m as isize, k as isize])?;
    let b = b.reshape(&[batch as isize, k as isize, n as isize])?;
    let (sab, sbb) = (a.strides()[0], b.strides()[0]);
    Ok(Batched {
        a,
        b,
        batch,
        sab,
        sbb,
    })
}

/// `a @ b`.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if let Some(v) = super::autocast::lower("matmul", &[a, b])? {
        return super::autocast::suspended(|| matmul(&v[0], &v[1]));
    }
    crate::graph::record(
        "MmBackward0",
        &[a, b],
        || matmul_forward(a, b, None),
        |_| matmul_backward(a, b),
    )
}

/// A ReLU for the product's epilogue (`linear_relu`): `alloc` makes its output; `out` holds it
/// once a kernel has written it.
pub(super) struct FusedRelu<'a> {
    pub(super) alloc: &'a dyn Fn() -> Result<Tensor>,
    pub(super) out: Option<Tensor>,
}

/// What a product's kernel may do besides the product where it can, and what it did.
#[derive(Default)]
pub(super) struct Extras<'a> {
    /// Write the sums of `a`'s rows here (f32, contiguous); `written` where a kernel did
    /// (`matmul_row_sums`).
    pub(super) sums: Option<&'a Tensor>,
    pub(super) written: bool,
    /// The ReLU of the result (`linear_relu`).
    pub(super) relu: Option<FusedRelu<'a>>,
    /// `ReluBackward0`'s formula (Note [Backward epilogues]): the product kept where this
    /// tensor of the product's shape is not <= 0, zero elsewhere; `masked` where a kernel did.
    pub(super) mask: Option<&'a Tensor>,
    pub(super) masked: bool,
}

/// Whether `mask` can be read by a product's epilogue over an [m, n] output of `a`'s dtype:
/// contiguous, on `a`'s device, with an offset of whole 16-byte vectors.
pub(super) fn mask_fits(mask: &Tensor, a: &Tensor, m: usize, n: usize) -> bool {
    mask.shape() == [m, n]
        && mask.dtype() == a.dtype()
        && mask.is_contiguous()
        && mask.layout().offset.is_multiple_of(4)
        && mask.device() == a.device()
}

/// A 2-D f16 product that misses the tensor-core kernel only because M, K or N is not a whole
/// number of its tiles (an MLP's 784-wide input: `x @ W1^T` with K = 784, `g^T @ x` with
/// N = 784): the ragged dim padded with zeros to whole tiles (copies of the operands, each in
/// its own orientation) and, for N, the first n columns of the product kept (one copy).
/// Splitting K instead would round two partial sums to f16 and lose up to 6e-3 to
/// cancellation (measured on the H100); splitting N into the whole tiles on tensor cores and
/// the rest on the SIMT kernel cost `g^T @ x` 153 us on the H100 (the 16-column rest 80 us,
/// the concatenation 34) where the SIMT kernel alone had taken 346 us.
fn coop_split(
    a: &Tensor,
    b: &Tensor,
    [m, n, k]: [usize; 3],
    bias: Option<&Tensor>,
) -> Result<Option<Tensor>> {
    let Some(info) = crate::kernels::coop_f16(a.device()) else {
        return Ok(None);
    };
    if a.dtype() != DType::F16 || a.rank() != 2 || b.rank() != 2 {
        return Ok(None);
    }
    let unit = |s: &[usize]| s[0] == 1 || s[1] == 1;
    if !unit(a.strides()) || !unit(b.strides()) {
        return Ok(None);
    }
    let layout = CoopLayout {
        a_t: a.strides()[1] != 1,
        b_t: b.strides()[1] != 1,
    };
    let shared = info.limits.max_compute_workgroup_storage_size;
    let tiles = CoopTile::for_layout(layout, m.div_ceil(128) * n.div_ceil(128));
    let Some(t) = tiles
        .iter()
        .find(|t| m.is_multiple_of(t.block_m() as usize) && t.valid(shared))
        .or_else(|| tiles.iter().find(|t| t.valid(shared)))
    else {
        return Ok(None);
    };
    let (kc, nc) = (k - k % t.k_step() as usize, n - n % t.block_n() as usize);
    let mp = m.next_multiple_of(t.block_m() as usize);
    if kc == 0 || nc == 0 || (kc == k && nc == n && mp == m) {
        return Ok(None);
    }
    // `x` (or its transpose, as stored) copied into zeros with dim `d` of the product's
    // orientation grown to `size`.
    // In one pass where the rows are whole 4-byte words (`super::copy_rows`), else a fill and
    // a copy. Growing dim 0 is growing one long row of the flattened operand.
    let pad = |x: &Tensor, d: usize, transposed: bool, size: usize| -> Result<Tensor> {
        let stored = if transposed { x.t()? } else { x.clone() };
        let d = if transposed { 1 - d } else { d };
        let mut shape = stored.shape().to_vec();
        let len = shape[d];
        shape[d] = size;
        let fast = match d {
            1 => super::copy_rows(&stored, size)?,
            _ if stored.is_contiguous() => {
                let flat = stored.reshape(&[1, stored.numel() as isize])?;
                super::copy_rows(&flat, size * shape[1])?
            }
            _ => None,
        };
        let p = match fast {
            Some(p) => p.reshape(&isize_shape(&shape))?,
            None => {
                let p = Tensor::zeros(&shape, DType::F16, x.device())?;
                p.narrow(d as isize, 0, len)?.copy_(&stored)?;
                p
            }
        };
        if transposed {
            p.t()
        } else {
            Ok(p)
        }
    };
    if mp > m {
        // A ragged M (GPT-2's tied head: `g^T @ h`, M = 50257 logits): A padded with zero rows,
        // the product's padded [mp, n] cut to its first m rows (a contiguous view) and the bias
        // added after. The SIMT kernel took this product 49.5 ms on the H200.
        let ap = pad(a, 0, layout.a_t, mp)?;
        let out = match coop_split(&ap, b, [mp, n, k], None)? {
            Some(out) => out,
            None => matmul_forward(&ap, b, None)?,
        };
        return add_bias(out.narrow(0, 0, m)?, bias).map(Some);
    }
    if nc < n {
        let bp = pad(b, 1, layout.b_t, nc + t.block_n() as usize)?;
        let out = matmul_forward(a, &bp, None)?;
        // (`contiguous` copies the kept rows word by word, `super::copy_rows`.)
        return add_bias(out.narrow(1, 0, n)?.contiguous()?, bias).map(Some);
    }
    let kp = kc + t.k_step() as usize;
    let (ap, bp) = (pad(a, 1, layout.a_t, kp)?, pad(b, 0, layout.b_t, kp)?);
    // The padded product has the same [m, n]: its kernel can add the bias.
    matmul_forward(&ap, &bp, bias).map(Some)
}

/// `a @ b`, plus `bias` (broadcast against the result) where given: in the kernel's epilogue
/// where the vec4 kernel runs and the bias is a contiguous f32 row of n, else by an add.
pub(super) fn matmul_forward(a: &Tensor, b: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    matmul_with(a, b, bias, true)
}

/// `matmul_forward`, with the narrow kernel (`narrow_product`) among the choices or not.
pub(super) fn matmul_with(
    a: &Tensor,
    b: &Tensor,
    bias: Option<&Tensor>,
    narrow: bool,
) -> Result<Tensor> {
    matmul_impl(a, b, bias, narrow, &mut Extras::default())
}

/// `a @ b` for two f32 matrices on a GPU, and the sums of `a`'s rows where the product's
/// kernel gives them in passing (`Epilogue::RowSums`: a column-major `a`, a row-major
/// `b`), else `None`. A Linear's backward asks it for `g^T @ x` and gets its bias gradient.
/// Outside autograd and autocast only (the backward's products are neither).
pub(super) fn matmul_row_sums(a: &Tensor, b: &Tensor) -> Result<(Tensor, Option<Tensor>)> {
    let eligible = a.rank() == 2
        && b.rank() == 2
        && a.dtype() == DType::F32
        && !a.device().is_cpu()
        && !crate::graph::needs_grad(&[a, b])
        && [
            super::autocast::DeviceType::Gpu,
            super::autocast::DeviceType::Cpu,
        ]
        .iter()
        .all(|&d| !super::autocast::is_autocast_enabled(d));
    if !eligible {
        return Ok((matmul(a, b)?, None));
    }
    let sums = Tensor::empty(&[a.shape()[0]], DType::F32, a.device())?;
    let mut ex = Extras {
        sums: Some(&sums),
        ..Extras::default()
    };
    let out = matmul_impl(a, b, None, true, &mut ex)?;
    let written = ex.written;
    Ok((out, written.then_some(sums)))
}

/// `matmul_with`, and what `ex` asks where the kernel that runs can (see `Extras`): the sums
/// of `a`'s rows (`matmul_row_sums`), the ReLU of the result into `relu.out` (`linear_relu`;
/// the returned product is then left unwritten), or a backward ReLU mask on the result.
pub(super) fn matmul_impl(
    a: &Tensor,
    b: &Tensor,
    mut bias: Option<&Tensor>,
    narrow: bool,
    ex: &mut Extras,
) -> Result<Tensor> {
    const OP: &str = "matmul";
    same_device(OP, a, b)?;
    if a.dtype() != b.dtype() {
        return Err(Error::DTypeMismatch {
            op: OP,
            expected: a.dtype(),
            got: b.dtype(),
        });
    }
    if !a.dtype().is_float() {
        return Err(Error::UnsupportedDType {
            op: OP,
            dtype: a.dtype(),
            why: "(a float op, as on CUDA)".into(),
        });
    }
    if a.rank() == 0 || b.rank() == 0 {
        return Err(Error::InvalidArgument {
            op: OP,
            msg: "both arguments to matmul need to be at least 1D".into(),
        });
    }
    let a2 = if a.rank() == 1 {
        a.unsqueeze(0)?
    } else {
        a.clone()
    };
    let b2 = if b.rank() == 1 {
        b.unsqueeze(1)?
    } else {
        b.clone()
    };
    let (ra, rb) = (a2.rank(), b2.rank());
    let (m, k) = (a2.shape()[ra - 2], a2.shape()[ra - 1]);
    let (k2, n) = (b2.shape()[rb - 2], b2.shape()[rb - 1]);
    if k != k2 {
        return Err(Error::ShapeMismatch {
            op: OP,
            lhs: a.shape().to_vec(),
            rhs: b.shape().to_vec(),
        });
    }
    let batch_shape = broadcast_shapes(OP, &a2.shape()[..ra - 2], &b2.shape()[..rb - 2])?;
    if narrow && a.rank() == 2 && b.rank() == 2 {
        if let Some(out) = super::matmul_narrow::narrow_product(a, b, [m, n, k], bias, ex)? {
            return Ok(out);
        }
    }
    // Few output tiles over a long contraction (an MLP's last layer: 512x4096 @ 4096x10): s
    // independent chunks of K as a batched product (views, no copies), then a sum over them.
    // In f16 the chunks' partial sums would each be rounded to f16 (measured: 2e-3 relative
    // error at K = 4096); the product runs in f32 instead (one rounding at the end, as cuBLAS
    // accumulates), which on the H100 took the 512x4096x10 head from 528 us to 29 us.
    let split = split_k(a, m, n, k, &batch_shape);
    if a.dtype() == DType::F16 && split.is_some() {
        let wide = |t: &Tensor| super::predicate::to_dtype(t, DType::F32);
        let out = matmul_forward(&wide(a)?, &wide(b)?, None)?;
        return add_bias(super::predicate::to_dtype(&out, DType::F16)?, bias);
    }
    let chunks = split.and_then(|s| {
        let ks = (k / s) as isize;
        let parts = a2.view(&[m as isize, s as isize, ks]).ok()?;
        let bparts = b2.view(&[s as isize, ks, n as isize]).ok()?;
        Some((parts.permute(&[1, 0, 2]).ok()?, bparts))
    });
    if let Some((parts, bparts)) = chunks {
        let sum = matmul_forward(&parts, &bparts, None)?.sum(&[0], false)?;
        let mut shape: Vec<isize> = Vec::new();
        if a.rank() > 1 {
            shape.push(m as isize);
        }
        if b.rank() > 1 {
            shape.push(n as isize);
        }
        return add_bias(sum.reshape(&shape)?, bias);
    }
    // Two matrices: the bias goes with the product (into a tensor-core kernel's epilogue
    // where it can); a vector operand's product is reshaped first.
    let matrices = a.rank() == 2 && b.rank() == 2;
    if let Some(out) = coop_split(&a2, &b2, [m, n, k], bias.filter(|_| matrices))? {
        return match (a.rank(), b.rank()) {
            (1, _) => add_bias(out.reshape(&[n as isize])?, bias),
            (_, 1) => add_bias(out.reshape(&[m as isize])?, bias),
            _ => Ok(out),
        };
    }
    let full = |tail: [usize; 2]| {
        batch_shape
            .iter()
            .copied()
            .chain(tail)
            .collect::<Vec<usize>>()
    };
    let a3 = a2.expand(&full([m, k]))?;
    let b3 = b2.expand(&full([k, n]))?;
    let out = Tensor::empty(&full([m, n]), a.dtype(), a.device())?;
    if out.numel() > 0 && k == 0 {
        // An empty contraction sums nothing: zeros, as in PyTorch.
        out.storage.block.fill_u32(0)?;
    } else if out.numel() > 0 {
        let flat = flatten_batch(a3, b3, &batch_shape)?;
        let (fa, fb) = (&flat.a, &flat.b);
        let (ra, rb) = (fa.rank(), fb.rank());
        let (sam, sak) = (fa.strides()[ra - 2], fa.strides()[ra - 1]);
        let (sbk, sbn) = (fb.strides()[rb - 2], fb.strides()[rb - 1]);
        if a.device().is_cpu() {
            crate::ops::ready_on_host(&[fa, fb])?;
            crate::cpu::matmul(
                fa,
                fb,
                &out,
                [m, n, k, flat.batch],
                [flat.sab, sam, sak],
                [flat.sbb, sbk, sbn],
            );
        } else if let Some((tile, layout, lda, ldb)) = coop_tile(
            a,
            [m, n, k, flat.batch],
            fa,
            fb,
            [sam, sak, sbk, sbn, flat.sab, flat.sbb],
        ) {
            // Tensor cores: f32 accumulators, rounded to f16 in the kernel, the bias added
            // before the rounding where it is a row of n f16 values on whole 16-byte vectors.
            let fused = bias.filter(|t| {
                t.dtype() == DType::F16
                    && t.shape() == [n]
                    && t.strides() == [1]
                    && t.layout().offset.is_multiple_of(8)
                    && t.device() == a.device()
            });
            let imm = [
                m,
                n,
                k,
                flat.batch,
                fa.layout().offset,
                flat.sab,
                lda,
                fb.layout().offset,
                flat.sbb,
                ldb,
                fused.is_some() as usize,
                fused.map_or(0, |t| t.layout().offset),
            ]
            .iter()
            .map(|&v| u32_of(OP, v))
            .collect::<Result<Vec<u32>>>()?;
            let groups = (
                n as u32 / tile.block_n(),
                m as u32 / tile.block_m(),
                u32_of(OP, flat.batch)?,
            );
            launch_groups(
                Kernel::MatmulCoop(tile, layout),
                &[
                    &fa.storage.block,
                    &fb.storage.block,
                    &out.storage.block,
                    fused.map_or(&fa.storage.block, |t| &t.storage.block),
                ],
                &imm,
                groups,
            )?;
            if fused.is_some() {
                bias = None;
            }
        } else {
            // 128x128 tiles where the product fills them (KILN_MATMUL_TILE=64 forces 64).
            // 128-tiles once there are enough of them to spread (measured on the H100: the
            // 128-tile kernel wins from 64 tiles on); else 64.
            let tiles = m.div_ceil(128) * n.div_ceil(128) * flat.batch;
            let big = match forced_tile() {
                0 => m >= 128 && n >= 128 && tiles >= 64,
                t => t == 128,
            };
            // Padded shared rows where the device gives a workgroup 33 KiB.
            let info = a.device().adapter_info();
            let padded =
                info.is_some_and(|i| i.limits.max_compute_workgroup_storage_size >= 33 * 1024);
            // Not on GL: Mesa's llvmpipe takes ~90 s to compile each 128-tile variant's GLSL
            // from a cold cache (holding wgpu's GL context lock all along); GL is kiln's
            // compatibility backend and keeps to one variant, the scalar kernel.
            let gl = info.is_some_and(|i| i.backend == wgpu::Backend::Gl);
            let vec4 = big
                && !gl
                && !scalar_forced()
                && a.dtype() == DType::F32
                && vec4_eligible(
                    [m, n, k],
                    [fa.layout().offset, flat.sab, sam, sak],
                    [fb.layout().offset, flat.sbb, sbk, sbn],
                );
            // The bias rides in the epilogue where it is one contiguous f32 row of n.
            let fused_bias = bias.filter(|t| {
                vec4 && t.dtype() == DType::F32
                    && t.shape() == [n]
                    && t.strides() == [1]
                    && t.layout().offset.is_multiple_of(4)
            });
            // The word products add a bias row of their dtype in their epilogue too.
            let wide_bias =
                bias.filter(|t| t.dtype() == a.dtype() && t.shape() == [n] && t.strides() == [1]);
            let default = match (vec4, big) {
                (true, _) => Simt::Vec4,
                (false, true) => Simt::Tile128,
                (false, false) => Simt::Tile64,
            };
            // A's row sums ride with the column-major A by row-major B kernel, one product.
            let layout = Vec4Layout::of(sak, sbn);
            let sums = ex.sums.filter(|t| {
                layout.operands == Operands::ColRow
                    && flat.batch == 1
                    && fused_bias.is_none()
                    && t.shape() == [m]
                    && t.layout().offset.is_multiple_of(4)
            });
            // A backward ReLU mask rides in the vec4 kernels' epilogue, in the fourth binding
            // (the product has no bias or sums then).
            let mask = ex.mask.filter(|t| {
                vec4 && fused_bias.is_none()
                    && sums.is_none()
                    && flat.batch == 1
                    && mask_fits(t, a, m, n)
            });
            // With `relu_out`, `Simt::Vec4` writes the ReLU of the result there instead; with
            // `mask` (given only with a vec4 choice), the kernel applies it.
            // With `sliver`, one workgroup of the grid (the tuner's `prepare`: it compiles the
            // candidate's pipeline; the op's own launch writes every tile afterwards).
            let run_on =
                |choice: Simt, relu_out: Option<&Tensor>, mask: Option<&Tensor>, sliver: bool| {
                    let fused = match choice {
                        Simt::Wide(_) => wide_bias,
                        _ => fused_bias.filter(|_| choice.is_vec4()),
                    };
                    let sums = sums.filter(|_| choice == Simt::Vec4);
                    // Vec4ColA: A copied column-major first, so that the product runs the kernel
                    // with that layout compiled in (a transposed copy of A, then `Operands::ColRow`).
                    let col_a = match choice {
                        Simt::Vec4ColA => Some(crate::no_grad(|| fa.t()?.contiguous())?),
                        _ => None,
                    };
                    let (a_op, a_off, sam, sak) = match &col_a {
                        Some(t) => (t, t.layout().offset, 1, m),
                        None => (fa, fa.layout().offset, sam, sak),
                    };
                    let mut imm = vec![
                        m,
                        n,
                        k,
                        flat.batch,
                        a_off,
                        flat.sab,
                        sam,
                        sak,
                        fb.layout().offset,
                        flat.sbb,
                        sbk,
                        sbn,
                        fused.is_some() as usize | (sums.is_some() as usize) << 1,
                        fused.or(sums).or(mask).map_or(0, |t| t.layout().offset),
                    ];
                    let (tile, kernel) = match choice {
                        Simt::Vec4 if sums.is_some() => (
                            128,
                            Kernel::Matmul128Vec4(padded, layout.with(Epilogue::RowSums)),
                        ),
                        Simt::Vec4 if relu_out.is_some() => (
                            128,
                            Kernel::Matmul128Vec4(padded, layout.with(Epilogue::Relu)),
                        ),
                        // (A tile of 4 or 16 rows by 64 columns: the groups' x below.)
                        Simt::Wide(w) => (w.tile_m(), Kernel::MatmulWide(w)),
                        Simt::Vec4 | Simt::Vec4ColA => {
                            let layout = Vec4Layout::of(sak, sbn);
                            let layout = match mask {
                                Some(_) => layout.with(Epilogue::Mask),
                                None => layout,
                            };
                            (128, Kernel::Matmul128Vec4(padded, layout))
                        }
                        Simt::Tile128 => (128, Kernel::Matmul128(a.dtype(), padded)),
                        Simt::Tile64 => (64, Kernel::Matmul(a.dtype())),
                        Simt::Reg => (32, Kernel::MatmulReg(a.dtype())),
                    };
                    imm.resize(kernel.immediate_size() as usize / 4, 0);
                    let imm = imm
                        .into_iter()
                        .map(|v| u32_of(OP, v))
                        .collect::<Result<Vec<u32>>>()?;
                    let tile_n = match choice {
                        Simt::Wide(_) => crate::kernels::MatmulWide::TILE_N,
                        _ => tile,
                    };
                    let groups = (
                        // (The row sums' column of workgroups after the product's.)
                        (n.div_ceil(tile_n) + sums.is_some() as usize) as u32,
                        m.div_ceil(tile) as u32,
                        u32_of(OP, flat.batch)?,
                    );
                    let groups = if sliver { (1, 1, 1) } else { groups };
                    let dest = relu_out.unwrap_or(&out);
                    let mut blocks =
                        vec![&a_op.storage.block, &fb.storage.block, &dest.storage.block];
                    if choice.is_vec4() || matches!(choice, Simt::Wide(_)) {
                        // Without a bias, sums or a mask the fourth binding is a dummy (the flags
                        // are clear).
                        blocks.push(
                            fused
                                .or(sums)
                                .or(mask)
                                .map_or(&fa.storage.block, |t| &t.storage.block),
                        );
                    }
                    match choice {
                        Simt::Wide(w) => super::matmul_words::launch(
                            (w, kernel),
                            (a_off, sam, sak),
                            [m, k],
                            &blocks,
                            imm,
                            groups,
                            sliver,
                        ),
                        _ => launch_groups(kernel, &blocks, &imm, groups),
                    }
                };
            // The tile that fits the size, or the kernel without workgroup memory: measured per
            // adapter (a forced tile is not second-guessed).
            let mut candidates = vec![(default, default.name())];
            // A row-major A by a row-major B scatters A's slices into shared memory; copied
            // column-major first (one 2-D A), the product runs 10% faster on the H100 for the
            // price of the copy: measured against the plain kernel.
            if default == Simt::Vec4 && sak == 1 && sbn == 1 && fa.rank() == 2 {
                candidates.push((Simt::Vec4ColA, Simt::Vec4ColA.name()));
            }
            if forced_tile() == 0 {
                // Operands read as 64-bit words: a CPU adapter's candidates (with 64-bit
                // integers). On the H100 they won none of the 20 keys the ops and train suites
                // tune, so GPUs are not made to time them. On lavapipe they win every product
                // key but the smallest, so there the uniform form is the default where it fits
                // (first: what runs untuned and what another candidate must beat by
                // `tune::MARGIN`; timed second, behind the 16-row storage form, it lost the
                // MLP's layer-1 forward in three tunings of three, 4.5-4.7 ms against 3.9,
                // though forced it runs the `train` example as fast as when it wins), then the
                // 16-row and 4-row forms, reg4x4, and the workgroup-memory tiles last (100-400
                // ms a run there, and a compilation each, which the key's budget then rarely
                // affords).
                let words = tune::on_cpu_adapter(a.device())
                    && info.is_some_and(|i| i.features.shader_int64);
                let mut wide = Vec::new();
                if words && !gl {
                    let fitting = crate::kernels::MatmulWide::fitting(
                        a.dtype(),
                        [m, n, k],
                        (fa.layout().offset, flat.sab, sam, sak),
                        (fb.layout().offset, flat.sbb, sbk, sbn),
                    );
                    // A through the uniform scratch, where one tile's window fits it (a
                    // single batch: the window is one matrix's rows).
                    let ubo = fitting.first().map(|w| w.with_ubo_a()).filter(|w| {
                        flat.batch == 1
                            && UboWindows::new(a.dtype(), [m, k], sam, sak, w.tile_m()).rows > 0
                            && (fa.layout().offset * a.dtype().size_bytes()).is_multiple_of(4)
                    });
                    wide.extend(ubo);
                    wide.extend(fitting.into_iter().rev());
                }
                let tiles = candidates.len();
                candidates.extend(wide.iter().map(|&w| (Simt::Wide(w), w.candidate())));
                candidates.push((Simt::Reg, Simt::Reg.name()));
                if !wide.is_empty() {
                    // The tiles after the others.
                    candidates.rotate_left(tiles);
                }
            }
            let key = || {
                // Row-major where the last dim has unit stride.
                let major = |last: usize| if last == 1 { "row" } else { "col" };
                format!(
                    "{} {}x{}x{} batch {} a {} b {}",
                    a.dtype(),
                    tune::class(m),
                    tune::class(n),
                    tune::class(k),
                    tune::class(flat.batch),
                    major(sak),
                    major(sbn)
                )
            };
            // A forced tile runs the kernel it names untuned (no work to tune: the bench's
            // 128-tile check spent 2.3 s on lavapipe timing the one candidate it compiled);
            // `tune::force_variant` still picks among the candidates.
            let work = match forced_tile() {
                0 => (m * n * k * flat.batch) as u64,
                _ => 0,
            };
            let run = |choice: Simt, relu_out: Option<&Tensor>, mask: Option<&Tensor>| {
                run_on(choice, relu_out, mask, false)
            };
            let choice = tune::pick_prepared(
                a.device(),
                "matmul",
                key,
                work,
                &candidates,
                |c| run_on(c, None, None, true),
                |c| run(c, None, None),
            )?;
            // The ReLU rides in the epilogue after the bias: only where the bias did too, on
            // the plain vec4 kernel.
            let relu = ex.relu.as_mut().filter(|_| {
                choice == Simt::Vec4 && fused_bias.is_some() && a.rank() == 2 && b.rank() == 2
            });
            let mask = mask.filter(|_| choice.is_vec4());
            match relu {
                Some(relu) => {
                    let r = (relu.alloc)()?;
                    run(choice, Some(&r), None)?;
                    relu.out = Some(r);
                }
                None => run(choice, None, mask)?,
            }
            ex.written = choice == Simt::Vec4 && sums.is_some();
            ex.masked = mask.is_some();
            let fused = match choice {
                Simt::Wide(_) => wide_bias.is_some(),
                _ => choice.is_vec4() && fused_bias.is_some(),
            };
            if fused {
                // `linear` checked the bias's device.
                bias = None;
            }
        }
    }
    // Remove the dims that promoting 1-D operands added.
    let mut shape: Vec<isize> = batch_shape.iter().map(|&d| d as isize).collect();
    if a.rank() > 1 {
        shape.push(m as isize);
    }
    if b.rank() > 1 {
        shape.push(n as isize);
    }
    add_bias(out.reshape(&shape)?, bias)
}

/// The SIMT products: the vec4 128-tile kernel, the scalar 128- and 64-tile kernels, and the
/// kernel without workgroup memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Simt {
    Vec4,
    /// `Vec4` after a column-major copy of A (a row-major 2-D A by a row-major B).
    Vec4ColA,
    Tile128,
    Tile64,
    Reg,
    /// `Reg` over 64-bit words, 4x8 or 16x8 outputs an invocation (`kernels::MatmulWide`).
    Wide(crate::kernels::MatmulWide),
}

impl Simt {
    fn is_vec4(self) -> bool {
        matches!(self, Simt::Vec4 | Simt::Vec4ColA)
    }

    fn name(self) -> &'static str {
        match self {
            Simt::Vec4 => "tile128_vec4",
            Simt::Vec4ColA => "tile128_vec4_col_a",
            Simt::Tile128 => "tile128",
            Simt::Tile64 => "tile64",
            Simt::Reg => "reg4x4",
            Simt::Wide(w) => w.candidate(),
        }
    }
}

/// `out + bias` (broadcast), or `out` without one.
pub(super) fn add_bias(out: Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    match bias {
        Some(bias) => out.add(bias),
        None => Ok(out),
    }
}

impl Tensor {
    /// `self @ other` with PyTorch's broadcasting rules.
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        matmul(self, other)
    }
}
