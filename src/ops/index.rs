//! Indexing: gather, index_select, embedding, one_hot. Indices are i32 (PyTorch's are int64).
//! An index out of range is an error: at once on the CPU; on a GPU, at the next sync point
//! (`Error::DeviceAssert`, the element written as 0), as CUDA reports device-side asserts but
//! without poisoning the device. See Note [Device asserts] in ARCHITECTURE.md.

use super::{pack_dims, same_device, u32_of};
use crate::kernels::{launch, Kernel};
use crate::tensor::{dim, DType, Layout, Tensor};
use crate::{Error, Result};

fn check_index_dtype(op: &'static str, index: &Tensor) -> Result<()> {
    if index.dtype() != DType::I32 {
        return Err(Error::DTypeMismatch {
            op,
            expected: DType::I32,
            got: index.dtype(),
        });
    }
    Ok(())
}

/// `out[c] = x[c with coordinate d replaced by index[c]]`; `out` has the index's shape.
pub fn gather(x: &Tensor, d: isize, index: &Tensor) -> Result<Tensor> {
    crate::graph::record(
        "GatherBackward0",
        &[x],
        || gather_forward(x, d, index),
        |_| {
            let input = x.shape().to_vec();
            let idx = crate::graph::save(index)?;
            Ok(Box::new(move |g: &Tensor, _: &[bool]| {
                let zeros = Tensor::zeros(&input, g.dtype(), g.device())?;
                Ok(vec![Some(scatter_add(&zeros, d, &idx.get()?, g)?)])
            }) as crate::graph::BackwardFn)
        },
    )
}

fn gather_forward(x: &Tensor, d: isize, index: &Tensor) -> Result<Tensor> {
    const OP: &str = "gather";
    same_device(OP, x, index)?;
    check_index_dtype(OP, index)?;
    let d = dim(OP, d, x.rank())?;
    let fits = index.rank() == x.rank()
        && (0..x.rank()).all(|i| i == d || index.shape()[i] <= x.shape()[i]);
    if !fits {
        return Err(Error::ShapeMismatch {
            op: OP,
            lhs: x.shape().to_vec(),
            rhs: index.shape().to_vec(),
        });
    }
    if x.rank() > 8 {
        return Err(Error::InvalidArgument {
            op: OP,
            msg: format!("{} dims; kernels index at most 8", x.rank()),
        });
    }
    if x.dtype() == DType::Bool {
        return Err(Error::UnsupportedDType {
            op: OP,
            dtype: DType::Bool,
            why: "yet".into(),
        });
    }
    let out = Tensor::empty(index.shape(), x.dtype(), x.device())?;
    if out.numel() == 0 {
        return Ok(out);
    }
    let size = x.shape()[d];
    if x.device().is_cpu() {
        crate::ops::ready_on_host(&[x, index])?;
        crate::cpu::gather(x, d, index, &out).map_err(|bad| Error::IndexOutOfRange {
            op: OP,
            index: bad,
            size,
            what: "index",
        })?;
        return Ok(out);
    }
    let mut imm = vec![
        u32_of(OP, out.numel())?,
        x.rank() as u32,
        d as u32,
        u32_of(OP, x.layout().offset)?,
        u32_of(OP, index.layout().offset)?,
        u32_of(OP, size)?,
        0,
        0,
    ];
    pack_dims(&mut imm, &[index.shape(), x.strides(), index.strides()], OP)?;
    launch(
        Kernel::Gather(x.dtype()),
        &[&x.storage.block, &index.storage.block, &out.storage.block],
        &imm,
        out.numel() as u64,
    )?;
    Ok(out)
}

/// The entries of `x` at positions `index` (1-D) along `d`.
pub fn index_select(x: &Tensor, d: isize, index: &Tensor) -> Result<Tensor> {
    const OP: &str = "index_select";
    check_index_dtype(OP, index)?;
    if index.rank() != 1 {
        return Err(Error::InvalidArgument {
            op: OP,
            msg: format!("index must be 1-D, got shape {:?}", index.shape()),
        });
    }
    let d = dim(OP, d, x.rank())?;
    let mut shape = x.shape().to_vec();
    shape[d] = index.shape()[0];
    // The index seen with the output's shape: stride 0 everywhere but along `d`.
    let mut strides = vec![0; shape.len()];
    strides[d] = index.strides()[0];
    let view = Tensor {
        layout: Layout {
            shape,
            strides,
            offset: index.layout().offset,
        },
        ..index.clone()
    };
    gather(x, d as isize, &view)
}

/// Rows of `weight` [num_embeddings, dim] for each id: shape `ids.shape + [dim]`.
pub fn embedding(weight: &Tensor, ids: &Tensor) -> Result<Tensor> {
    if weight.rank() != 2 {
        return Err(Error::InvalidArgument {
            op: "embedding",
            msg: format!("weight must be 2-D, got shape {:?}", weight.shape()),
        });
    }
    let flat = ids.reshape(&[-1])?;
    let rows = index_select(weight, 0, &flat)?;
    let shape: Vec<isize> = ids
        .shape()
        .iter()
        .chain([&weight.shape()[1]])
        .map(|&s| s as isize)
        .collect();
    rows.reshape(&shape)
}

/// One-hot i32 encoding with `num_classes` classes (a sync point: the ids are checked on the
/// host first, as PyTorch's one_hot also does).
pub fn one_hot(ids: &Tensor, num_classes: usize) -> Result<Tensor> {
    const OP: &str = "one_hot";
    check_index_dtype(OP, ids)?;
    if let Some(&bad) = ids
        .to_vec::<i32>()?
        .iter()
        .find(|&&i| i < 0 || i as usize >= num_classes)
    {
        return Err(Error::IndexOutOfRange {
            op: OP,
            index: bad as i64,
            size: num_classes,
            what: "class value",
        });
    }
    let classes = Tensor::arange(0.0, num_classes as f64, 1.0, DType::I32, ids.device())?;
    ids.unsqueeze(-1)?.eq(&classes)?.to_dtype(DType::I32)
}

impl Tensor {
    /// `torch.gather`: `out[i][j] = self[index[i][j]][j]` along `dim` (for dim 0), `index` of i32.
    pub fn gather(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        gather(self, dim, index)
    }

    /// `torch.index_select`: the slices of `dim` that `index` (1-D, i32) names, in its order.
    pub fn index_select(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        index_select(self, dim, index)
    }
}

/// A copy of `x` with `src` added at `index` along `d` (`x.scatter_add(d, index, src)`):
/// `out[c with coordinate d replaced by index[c]] += src[c]` for every coordinate c of `index`.
/// f32 and i32; colliding indices accumulate (atomically on a GPU, so f32 sums may differ from
/// a sequential order in the last bits).
pub fn scatter_add(x: &Tensor, d: isize, index: &Tensor, src: &Tensor) -> Result<Tensor> {
    crate::graph::record(
        "ScatterAddBackward0",
        &[x, src],
        || scatter_add_forward(x, d, index, src),
        |_| {
            let idx = crate::graph::save(index)?;
            Ok(Box::new(move |g: &Tensor, needs: &[bool]| {
                let gs = needs[1].then(|| gather(g, d, &idx.get()?)).transpose()?;
                Ok(vec![Some(g.clone()), gs])
            }) as crate::graph::BackwardFn)
        },
    )
}

fn scatter_add_forward(x: &Tensor, d: isize, index: &Tensor, src: &Tensor) -> Result<Tensor> {
    const OP: &str = "scatter_add";
    same_device(OP, x, index)?;
    same_device(OP, x, src)?;
    check_index_dtype(OP, index)?;
    if src.dtype() != x.dtype() {
        return Err(Error::DTypeMismatch {
            op: OP,
            expected: x.dtype(),
            got: src.dtype(),
        });
    }
    let cpu_f64 = x.dtype() == DType::F64 && x.device().is_cpu();
    if !cpu_f64 && !matches!(x.dtype(), DType::F32 | DType::I32) {
        return Err(Error::UnsupportedDType {
            op: OP,
            dtype: x.dtype(),
            why: "(f32 and i32 only: WGSL atomics)".into(),
        });
    }
    let d = dim(OP, d, x.rank())?;
    let fits = index.rank() == x.rank()
        && src.rank() == x.rank()
        && (0..x.rank()).all(|i| {
            index.shape()[i] <= src.shape()[i] && (i == d || index.shape()[i] <= x.shape()[i])
        });
    if !fits || x.rank() > 8 {
        return Err(Error::ShapeMismatch {
            op: OP,
            lhs: x.shape().to_vec(),
            rhs: index.shape().to_vec(),
        });
    }
    let out = super::copy(x)?;
    if index.numel() == 0 {
        return Ok(out);
    }
    // src restricted to the index's shape, contiguous: element e of the index reads src[e].
    let mut src = src.clone();
    for (i, &n) in index.shape().iter().enumerate() {
        src = src.narrow(i as isize, 0, n)?;
    }
    let src = super::copy(&src)?;
    let size = x.shape()[d];
    if x.device().is_cpu() {
        crate::ops::ready_on_host(&[&out, index, &src])?;
        crate::cpu::scatter_add(&out, d, index, &src).map_err(|bad| Error::IndexOutOfRange {
            op: OP,
            index: bad,
            size,
            what: "index",
        })?;
        return Ok(out);
    }
    let mut imm = vec![
        u32_of(OP, index.numel())?,
        x.rank() as u32,
        d as u32,
        0,
        u32_of(OP, index.layout().offset)?,
        u32_of(OP, size)?,
        0,
        0,
    ];
    pack_dims(
        &mut imm,
        &[index.shape(), out.strides(), index.strides()],
        OP,
    )?;
    launch(
        Kernel::ScatterAdd(x.dtype()),
        &[&src.storage.block, &index.storage.block, &out.storage.block],
        &imm,
        index.numel() as u64,
    )?;
    Ok(out)
}

impl Tensor {
    /// `torch.scatter_add` (out of place): a copy of `self` with `src`'s values added at `index` along `dim`.
    pub fn scatter_add(&self, dim: isize, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        scatter_add(self, dim, index, src)
    }
}
