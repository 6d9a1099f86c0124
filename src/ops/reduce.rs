//! Reductions over any set of dims, with `keepdim`: sum and mean (accumulated in f32 on the
//! GPU, f64 on the CPU reference).

use super::u32_of;
use crate::cpu;
use crate::kernels::{launch, Kernel, ReduceKernel, WORKGROUP};
use crate::tensor::{dim, DType, Layout, Tensor};
use crate::{Error, Result};

/// Elements one workgroup sums before the work is split across workgroups.
const PER_WORKGROUP: usize = 4096;
const MAX_CHUNKS: usize = 1024;

/// Sums `xp`'s rows of `inner` elements (reduced dims last) into contiguous `out`.
fn gpu_sum_rows(
    xp: &Tensor,
    out: &Tensor,
    inner: usize,
    scale: f32,
    op: &'static str,
) -> Result<()> {
    let rows = out.numel();
    let chunks = inner.div_ceil(PER_WORKGROUP).clamp(1, MAX_CHUNKS);
    let mut strides = vec![xp.layout.strides.clone()];
    let shape = Layout::coalesce(xp.shape(), &mut strides);
    if shape.len() > 8 {
        return Err(Error::InvalidArgument {
            op,
            msg: format!(
                "{} dims that cannot be merged; kernels index at most 8",
                shape.len()
            ),
        });
    }
    let contiguous = shape.len() <= 1 && strides[0].first().is_none_or(|&s| s == 1);
    let vector = contiguous && inner.is_multiple_of(4) && xp.layout.offset.is_multiple_of(4);
    // The vec4 form counts in vec4s.
    let unit = if vector { 4 } else { 1 };
    let first_out = if chunks == 1 { out.dtype } else { DType::F32 };
    let partial = if chunks == 1 {
        None
    } else {
        Some(Tensor::empty(&[rows * chunks], DType::F32, xp.device())?)
    };
    let target = partial.as_ref().unwrap_or(out);
    let mut imm = vec![
        u32_of(op, rows)?,
        u32_of(op, inner / unit)?,
        chunks as u32,
        u32_of(op, (inner / unit).div_ceil(chunks))?,
        shape.len() as u32,
        u32_of(op, xp.layout.offset / unit)?,
        if chunks == 1 {
            scale.to_bits()
        } else {
            1f32.to_bits()
        },
        0,
    ];
    for field in [&shape, &strides[0]] {
        let mut packed = [0u32; 8];
        for (slot, &v) in packed.iter_mut().zip(field.iter()) {
            *slot = u32_of(op, v)?;
        }
        imm.extend_from_slice(&packed);
    }
    let kernel = ReduceKernel {
        input: xp.dtype,
        output: first_out,
        contiguous,
        vector,
    };
    let groups = (rows * chunks) as u64 * WORKGROUP as u64;
    launch(
        Kernel::ReduceSum(kernel),
        &[&xp.storage.block, &target.storage.block],
        &imm,
        groups,
    )?;
    if let Some(partial) = partial {
        gpu_sum_rows(
            &Tensor {
                layout: Layout::contiguous(&[rows, chunks]),
                ..partial
            },
            out,
            chunks,
            scale,
            op,
        )?;
    }
    Ok(())
}

fn reduce(x: &Tensor, dims: &[isize], keepdim: bool, mean: bool) -> Result<Tensor> {
    let op = if mean { "mean" } else { "sum" };
    if !x.dtype.is_float() {
        return Err(Error::UnsupportedDType {
            op,
            dtype: x.dtype,
            why: "yet (PyTorch sums integers into int64, which kiln lacks)".into(),
        });
    }
    let rank = x.rank();
    let mut reduced = vec![false; rank];
    if dims.is_empty() {
        reduced.iter_mut().for_each(|r| *r = true);
    }
    for &d in dims {
        reduced[dim(op, d, rank)?] = true;
    }
    let kept: Vec<usize> = (0..rank).filter(|&i| !reduced[i]).collect();
    let gone: Vec<usize> = (0..rank).filter(|&i| reduced[i]).collect();
    let order: Vec<isize> = kept.iter().chain(&gone).map(|&i| i as isize).collect();
    let xp = x.permute(&order)?;
    let inner: usize = gone.iter().map(|&i| x.shape()[i]).product();
    let out_shape: Vec<usize> = if keepdim {
        (0..rank)
            .map(|i| if reduced[i] { 1 } else { x.shape()[i] })
            .collect()
    } else {
        kept.iter().map(|&i| x.shape()[i]).collect()
    };
    let out = Tensor::empty(&out_shape, x.dtype, x.device())?;
    if out.numel() == 0 {
        return Ok(out);
    }
    let scale = if mean { 1.0 / inner as f64 } else { 1.0 };
    if inner == 0 {
        // Sum of nothing is 0; mean of nothing is NaN (as in PyTorch).
        let word = match (mean, x.dtype) {
            (false, _) => 0,
            (true, DType::F16) => 0x7e00_7e00, // two f16 NaNs
            (true, _) => f32::NAN.to_bits(),
        };
        out.storage.block.fill_u32(word)?;
        return Ok(out);
    }
    if x.device().is_cpu() {
        cpu::sum_rows(&xp, &out, inner, scale);
    } else {
        gpu_sum_rows(&xp, &out, inner, scale as f32, op)?;
    }
    Ok(out)
}

impl Tensor {
    /// Sum over `dims` (all dims when empty), keeping them as size 1 with `keepdim`.
    pub fn sum(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        reduce(self, dims, keepdim, false)
    }

    /// Mean over `dims` (all dims when empty).
    pub fn mean(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        reduce(self, dims, keepdim, true)
    }

    /// Sum of every element, as a 0-d tensor.
    pub fn sum_all(&self) -> Result<Tensor> {
        reduce(self, &[], false, false)
    }
}
