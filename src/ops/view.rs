//! Views: new layouts over the same storage, never a copy (except `reshape` and `contiguous`
//! when a view is impossible, as in PyTorch).

use crate::tensor::{contiguous_strides, dim, numel, Layout, Tensor};
use crate::{Error, Result};

impl Tensor {
    fn with_layout(&self, layout: Layout) -> Tensor {
        Tensor {
            storage: self.storage.clone(),
            layout,
            dtype: self.dtype,
            autograd: None,
        }
    }

    /// Runs the view `f` and records the view's gradient map as its backward. `back` builds
    /// that map and runs only when a node is recorded: views are on every op's path (matmul,
    /// reductions and the engine use them), so nothing is captured otherwise.
    fn view_op<B>(
        &self,
        name: &'static str,
        f: impl FnOnce() -> Result<Tensor>,
        back: impl FnOnce() -> B,
    ) -> Result<Tensor>
    where
        B: Fn(&Tensor) -> Result<Tensor> + Send + Sync + 'static,
    {
        crate::graph::record(name, &[self], f, |_| {
            let back = back();
            Ok(Box::new(move |g: &Tensor, _: &[bool]| {
                Ok(vec![Some(back(g)?)])
            }))
        })
    }

    /// The gradient map of the views that only reshape: back to this tensor's shape.
    fn reshape_back(&self) -> impl Fn(&Tensor) -> Result<Tensor> + Send + Sync + 'static {
        let input: Vec<isize> = self.shape().iter().map(|&d| d as isize).collect();
        move |g| g.reshape(&input)
    }

    /// Resolves one `-1` in `shape` against the element count.
    fn infer_shape(&self, op: &'static str, shape: &[isize]) -> Result<Vec<usize>> {
        let bad = || Error::ShapeMismatch {
            op,
            lhs: self.shape().to_vec(),
            rhs: shape.iter().map(|&d| d.max(0) as usize).collect(),
        };
        if shape.iter().any(|&d| d < -1) {
            return Err(bad());
        }
        let given: Vec<usize> = shape
            .iter()
            .filter(|&&d| d >= 0)
            .map(|&d| d as usize)
            .collect();
        crate::tensor::checked_numel(op, &given)?;
        let known: usize = given.iter().product();
        let holes = shape.iter().filter(|&&d| d == -1).count();
        if holes > 1 {
            return Err(bad());
        }
        let out: Vec<usize> = if holes == 1 {
            if known == 0 || !self.numel().is_multiple_of(known) {
                return Err(bad());
            }
            shape
                .iter()
                .map(|&d| {
                    if d == -1 {
                        self.numel() / known
                    } else {
                        d as usize
                    }
                })
                .collect()
        } else {
            shape.iter().map(|&d| d as usize).collect()
        };
        if numel(&out) != self.numel() {
            return Err(bad());
        }
        Ok(out)
    }

    /// A view with `shape` (one dim may be -1); an error where no view is possible.
    pub fn view(&self, shape: &[isize]) -> Result<Tensor> {
        self.view_op(
            "ViewBackward0",
            || {
        let shape = self.infer_shape("view", shape)?;
        let strides = self.layout.view_strides(&shape).ok_or_else(|| Error::InvalidArgument {
            op: "view",
            msg: format!(
                "view size {shape:?} is not compatible with input tensor's size {:?} and stride {:?}; use reshape",
                self.shape(),
                self.strides()
            ),
        })?;
        Ok(self.with_layout(Layout {
            shape,
            strides,
            offset: self.layout.offset,
        }))
    },
            || self.reshape_back(),
        )
    }

    /// A view where possible, else a contiguous copy.
    pub fn reshape(&self, shape: &[isize]) -> Result<Tensor> {
        self.view_op(
            "ViewBackward0",
            || {
                let target = self.infer_shape("reshape", shape)?;
                match self.layout.view_strides(&target) {
                    Some(strides) => Ok(self.with_layout(Layout {
                        shape: target,
                        strides,
                        offset: self.layout.offset,
                    })),
                    None => {
                        let c = self.contiguous()?;
                        Ok(c.with_layout(Layout {
                            strides: contiguous_strides(&target),
                            shape: target,
                            offset: c.layout.offset,
                        }))
                    }
                }
            },
            || self.reshape_back(),
        )
    }

    /// Swaps two dims.
    pub fn transpose(&self, d0: isize, d1: isize) -> Result<Tensor> {
        self.view_op(
            "TransposeBackward0",
            || {
                let (a, b) = (
                    dim("transpose", d0, self.rank())?,
                    dim("transpose", d1, self.rank())?,
                );
                let mut l = self.layout.clone();
                if l.rank() > 0 {
                    l.shape.swap(a, b);
                    l.strides.swap(a, b);
                }
                Ok(self.with_layout(l))
            },
            || move |g: &Tensor| g.transpose(d0, d1),
        )
    }

    /// The transpose of a matrix (rank <= 2).
    pub fn t(&self) -> Result<Tensor> {
        match self.rank() {
            0 | 1 => Ok(self.clone()),
            2 => self.transpose(0, 1),
            r => Err(Error::InvalidArgument {
                op: "t",
                msg: format!("expects a tensor with <= 2 dimensions, got {r}"),
            }),
        }
    }

    /// Reorders dims: dim i of the result is dim `dims[i]` of `self`.
    pub fn permute(&self, dims: &[isize]) -> Result<Tensor> {
        self.view_op(
            "PermuteBackward0",
            || {
                if dims.len() != self.rank() {
                    return Err(Error::InvalidArgument {
                        op: "permute",
                        msg: format!("{} dims for a tensor of rank {}", dims.len(), self.rank()),
                    });
                }
                // PyTorch: "permute(): duplicate dims are not allowed."
                let resolved =
                    crate::tensor::dims("permute", dims, self.rank()).map_err(|e| match e {
                        Error::InvalidArgument { .. } => Error::InvalidArgument {
                            op: "permute",
                            msg: format!("duplicate dims are not allowed: {dims:?}"),
                        },
                        e => e,
                    })?;
                let shape = resolved.iter().map(|&d| self.layout.shape[d]).collect();
                let strides = resolved.iter().map(|&d| self.layout.strides[d]).collect();
                Ok(self.with_layout(Layout {
                    shape,
                    strides,
                    offset: self.layout.offset,
                }))
            },
            || {
                let inverse = inverse_permutation(dims, self.rank());
                move |g: &Tensor| g.permute(&inverse)
            },
        )
    }

    /// Elements `start..start + len` of dim `d`.
    pub fn narrow(&self, d: isize, start: usize, len: usize) -> Result<Tensor> {
        self.view_op(
            "NarrowBackward0",
            || {
                let d = dim("narrow", d, self.rank())?;
                let size = self.layout.shape[d];
                if start.checked_add(len).is_none_or(|end| end > size) {
                    return Err(Error::IndexOutOfRange {
                        op: "narrow",
                        index: i64::try_from(start.saturating_add(len)).unwrap_or(i64::MAX),
                        size,
                        what: "end",
                    });
                }
                let mut l = self.layout.clone();
                l.shape[d] = len;
                if len > 0 {
                    l.offset += start * l.strides[d];
                }
                Ok(self.with_layout(l))
            },
            || {
                let input = self.shape().to_vec();
                if let Ok(dd) = dim("narrow", d, input.len()) {
                    crate::graph::offer_fusion(crate::graph::Fusable::Slice(dd, start));
                }
                move |g: &Tensor| narrow_backward(g, &input, d, start)
            },
        )
    }

    /// Broadcasts to `shape` without copying (stride 0 on expanded dims).
    pub fn expand(&self, shape: &[usize]) -> Result<Tensor> {
        self.view_op(
            "ExpandBackward0",
            || Ok(self.with_layout(self.layout.broadcast_to("expand", shape)?)),
            || {
                let input = self.shape().to_vec();
                move |g: &Tensor| crate::ops::sum_to(g, &input)
            },
        )
    }

    /// `expand` to `shape` by NumPy's rules: a view with stride 0 along broadcast dims.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        self.expand(shape)
    }

    /// Removes dim `d` if its size is 1 (PyTorch leaves other sizes alone); `None`: all size-1 dims.
    pub fn squeeze(&self, d: Option<isize>) -> Result<Tensor> {
        self.view_op(
            "SqueezeBackward0",
            || {
                let mut l = self.layout.clone();
                match d {
                    Some(d) => {
                        let d = dim("squeeze", d, self.rank())?;
                        if self.rank() > 0 && l.shape[d] == 1 {
                            l.shape.remove(d);
                            l.strides.remove(d);
                        }
                    }
                    None => {
                        let keep: Vec<usize> =
                            (0..self.rank()).filter(|&i| l.shape[i] != 1).collect();
                        l.shape = keep.iter().map(|&i| self.layout.shape[i]).collect();
                        l.strides = keep.iter().map(|&i| self.layout.strides[i]).collect();
                    }
                }
                Ok(self.with_layout(l))
            },
            || self.reshape_back(),
        )
    }

    /// Inserts a dim of size 1 at `d` (in `0..=rank`, negative counts from the end).
    pub fn unsqueeze(&self, d: isize) -> Result<Tensor> {
        self.view_op(
            "UnsqueezeBackward0",
            || {
                let d = dim("unsqueeze", d, self.rank() + 1)?;
                let mut l = self.layout.clone();
                let stride = if d < self.rank() {
                    l.strides[d] * l.shape[d]
                } else {
                    1
                };
                l.shape.insert(d, 1);
                l.strides.insert(d, stride);
                Ok(self.with_layout(l))
            },
            || self.reshape_back(),
        )
    }

    /// Flattens dims `start..=end` into one (a view where possible).
    pub fn flatten(&self, start: isize, end: isize) -> Result<Tensor> {
        if self.rank() == 0 {
            return self.reshape(&[1]);
        }
        let (s, e) = (
            dim("flatten", start, self.rank())?,
            dim("flatten", end, self.rank())?,
        );
        if s > e {
            return Err(Error::InvalidArgument {
                op: "flatten",
                msg: format!(
                    "flatten() has invalid args: start_dim ({s}) cannot come after end_dim ({e})"
                ),
            });
        }
        let mut shape: Vec<isize> = self.shape()[..s].iter().map(|&d| d as isize).collect();
        shape.push(self.shape()[s..=e].iter().product::<usize>() as isize);
        shape.extend(self.shape()[e + 1..].iter().map(|&d| d as isize));
        self.reshape(&shape)
    }

    /// `self` if already contiguous, else a contiguous copy.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        crate::ops::copy(self)
    }
}

/// `inverse[dims[i]] = i`, for valid `dims` (an invalid permutation fails in `permute` itself).
fn inverse_permutation(dims: &[isize], rank: usize) -> Vec<isize> {
    let mut inverse = vec![0isize; rank];
    for (i, &d) in dims.iter().enumerate() {
        let d = if d < 0 { d + rank as isize } else { d };
        if let Some(slot) = usize::try_from(d).ok().and_then(|d| inverse.get_mut(d)) {
            *slot = i as isize;
        }
    }
    inverse
}

/// The gradient of `narrow`: zeros of the input's shape with `g` in the narrowed slice.
fn narrow_backward(g: &Tensor, input: &[usize], d: isize, start: usize) -> Result<Tensor> {
    let out = Tensor::zeros(input, g.dtype(), g.device())?;
    out.narrow(d, start, g.shape()[dim("narrow", d, g.rank())?])?
        .copy_(g)?;
    Ok(out)
}

impl Tensor {
    /// A view with an explicit layout over the same storage, recorded by no graph: the
    /// backward formulas of convolution and pooling walk windows this way. The caller keeps the
    /// layout inside the storage.
    pub(crate) fn as_strided(&self, shape: &[usize], strides: &[usize], offset: usize) -> Tensor {
        self.with_layout(Layout {
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            offset,
        })
    }
}

/// A shape as `reshape` and `view` take it.
pub(crate) fn isize_shape(s: &[usize]) -> Vec<isize> {
    s.iter().map(|&d| d as isize).collect()
}
