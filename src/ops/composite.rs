//! Ops composed from primitives (STYLE: few primitives, many composites); each keeps its
//! composite as the reference when a fused kernel earns its place later.

use crate::tensor::{dim, DType, Tensor};
use crate::{Device, Error, Result};

impl Tensor {
    /// `steps` values from `start` to `end` inclusive.
    pub fn linspace(
        start: f64,
        end: f64,
        steps: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        // Refuse what the device cannot hold before building the values on the host.
        drop(Tensor::empty(&[steps], dtype, device)?);
        let step = if steps > 1 {
            (end - start) / (steps - 1) as f64
        } else {
            0.0
        };
        let values: Vec<f64> = (0..steps)
            .map(|i| {
                if i + 1 == steps {
                    end
                } else {
                    start + i as f64 * step
                }
            })
            .collect();
        Self::from_f64_slice(&values, &[steps], dtype, device)
    }

    /// The n x m identity matrix.
    pub fn eye(n: usize, m: usize, dtype: DType, device: &Device) -> Result<Tensor> {
        // The device tensor first: an overflowing or unaffordable size is its typed error, not
        // a host vector that aborts the process.
        let out = Tensor::zeros(&[n, m], dtype, device)?;
        if n.min(m) > 0 {
            let diagonal = Tensor::ones(&[n.min(m)], dtype, device)?;
            // The diagonal as a strided view: element i at i * (m + 1).
            out.as_strided(&[n.min(m)], &[m + 1], 0).copy_(&diagonal)?;
        }
        Ok(out)
    }

    /// Joins tensors along `dim`; all other dims must match.
    pub fn cat(tensors: &[Tensor], d: isize) -> Result<Tensor> {
        let refs: Vec<&Tensor> = tensors.iter().collect();
        let sizes: Vec<usize> = match tensors.first() {
            Some(t) => {
                let dd = dim("cat", d, t.rank())?;
                tensors
                    .iter()
                    .map(|t| t.shape().get(dd).copied().unwrap_or(0))
                    .collect()
            }
            None => vec![],
        };
        crate::graph::record(
            "CatBackward0",
            &refs,
            || Self::cat_forward(tensors, d),
            |_| {
                Ok(Box::new(move |g: &Tensor, needs: &[bool]| {
                    let mut at = 0;
                    let mut grads = Vec::with_capacity(sizes.len());
                    for (&n, &need) in sizes.iter().zip(needs) {
                        grads.push(need.then(|| g.narrow(d, at, n)).transpose()?);
                        at += n;
                    }
                    Ok(grads)
                }) as crate::graph::BackwardFn)
            },
        )
    }

    fn cat_forward(tensors: &[Tensor], d: isize) -> Result<Tensor> {
        const OP: &str = "cat";
        let first = tensors.first().ok_or_else(|| Error::InvalidArgument {
            op: OP,
            msg: "expected a non-empty list of tensors".into(),
        })?;
        let d = dim(OP, d, first.rank())?;
        let mut shape = first.shape().to_vec();
        shape[d] = 0;
        for t in tensors {
            super::same_device(OP, first, t)?;
            if t.dtype() != first.dtype() {
                return Err(Error::DTypeMismatch {
                    op: OP,
                    expected: first.dtype(),
                    got: t.dtype(),
                });
            }
            let fits = t.rank() == first.rank()
                && (0..t.rank()).all(|i| i == d || t.shape()[i] == first.shape()[i]);
            if !fits {
                return Err(Error::ShapeMismatch {
                    op: OP,
                    lhs: first.shape().to_vec(),
                    rhs: t.shape().to_vec(),
                });
            }
            shape[d] =
                shape[d]
                    .checked_add(t.shape()[d])
                    .ok_or_else(|| Error::InvalidArgument {
                        op: OP,
                        msg: format!("the size along dim {d} overflows"),
                    })?;
        }
        let out = Tensor::empty(&shape, first.dtype(), first.device())?;
        let mut at = 0;
        for t in tensors {
            let n = t.shape()[d];
            if n > 0 {
                out.narrow(d as isize, at, n)?.copy_(t)?;
            }
            at += n;
        }
        Ok(out)
    }

    /// Stacks equal-shaped tensors along a new dim `d`.
    pub fn stack(tensors: &[Tensor], d: isize) -> Result<Tensor> {
        let rank = tensors.first().map_or(0, |t| t.rank());
        let d = dim("stack", d, rank + 1)? as isize;
        let expanded = tensors
            .iter()
            .map(|t| t.unsqueeze(d))
            .collect::<Result<Vec<_>>>()?;
        Self::cat(&expanded, d)
    }

    /// Views of `size` elements along `dim` (the last one may be shorter).
    pub fn split(&self, size: usize, d: isize) -> Result<Vec<Tensor>> {
        if size == 0 {
            return Err(Error::InvalidArgument {
                op: "split",
                msg: "split size must be positive".into(),
            });
        }
        let dd = dim("split", d, self.rank())?;
        let n = self.shape()[dd];
        (0..n.div_ceil(size).max(1))
            .map(|i| self.narrow(d, i * size, size.min(n - i * size)))
            .collect()
    }

    /// `chunks` views along `dim` of equal size (the last may be smaller), as PyTorch's `chunk`.
    pub fn chunk(&self, chunks: usize, d: isize) -> Result<Vec<Tensor>> {
        if chunks == 0 {
            return Err(Error::InvalidArgument {
                op: "chunk",
                msg: "chunk expects a positive number of chunks".into(),
            });
        }
        let n = self.shape()[dim("chunk", d, self.rank())?];
        self.split(n.div_ceil(chunks).max(1), d)
    }

    /// Variance over `dims` with Bessel's correction `correction` (1: unbiased, PyTorch's default).
    pub fn var(&self, dims: &[isize], correction: usize, keepdim: bool) -> Result<Tensor> {
        let mean = self.mean(dims, true)?;
        let sq = (self - &mean)?.square()?;
        let n = (self.numel() / mean.numel().max(1)) as f64;
        sq.sum(dims, keepdim)?
            .div_scalar((n - correction as f64).max(0.0))
    }

    /// Standard deviation: `var(...).sqrt()`.
    pub fn std(&self, dims: &[isize], correction: usize, keepdim: bool) -> Result<Tensor> {
        self.var(dims, correction, keepdim)?.sqrt()
    }

    /// `self + value * t1 * t2`.
    pub fn addcmul(&self, t1: &Tensor, t2: &Tensor, value: f64) -> Result<Tensor> {
        self + &(t1 * t2)?.mul_scalar(value)?
    }

    /// `self + value * t1 / t2`.
    pub fn addcdiv(&self, t1: &Tensor, t2: &Tensor, value: f64) -> Result<Tensor> {
        self + &(t1 / t2)?.mul_scalar(value)?
    }

    /// `self + weight * (end - self)`.
    pub fn lerp(&self, end: &Tensor, weight: f64) -> Result<Tensor> {
        self + &(end - self)?.mul_scalar(weight)?
    }
}
