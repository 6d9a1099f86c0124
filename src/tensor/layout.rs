//! Layout: shape, strides in elements, and the offset of element 0 in elements. Views change
//! only the layout; they never copy.

use crate::base::DType;
use crate::{Error, Result};

/// Dimensions the GPU kernels index directly; more are coalesced or refused.
pub const MAX_KERNEL_RANK: usize = 6;

/// A view of storage: shape, strides in elements, and an offset in elements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The size of each dim.
    pub shape: Vec<usize>,
    /// Strides in elements (not bytes). A stride of 0 repeats an element (broadcast).
    pub strides: Vec<usize>,
    /// Offset of element 0 from the start of the storage, in elements.
    pub offset: usize,
}

pub(crate) fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1].max(1);
    }
    strides
}

pub(crate) fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// The element count of `shape`, or an error where the product of its non-zero sizes does not
/// fit an `i64` (PyTorch's `safe_compute_numel`). Every layout kiln makes passes through here
/// or through `storage_bytes`, so `numel`, strides and spans of a live tensor never overflow,
/// even on shapes with a zero-sized dim (a view of them could drop the zero).
pub(crate) fn checked_numel(op: &'static str, shape: &[usize]) -> Result<usize> {
    if nonzero_numel(shape).is_none() {
        return Err(Error::InvalidArgument {
            op,
            msg: format!("numel: integer multiplication overflow with sizes={shape:?}"),
        });
    }
    Ok(numel(shape))
}

/// The product of `shape`'s non-zero sizes where it fits an `i64`.
fn nonzero_numel(shape: &[usize]) -> Option<usize> {
    shape
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .filter(|&n| n <= i64::MAX as usize)
}

/// Resolves a list of possibly negative dims against `rank`, refusing duplicates as PyTorch
/// does ("dim 0 appears multiple times in the list of dims"). The result keeps the list's order.
pub(crate) fn dims(op: &'static str, list: &[isize], rank: usize) -> Result<Vec<usize>> {
    let mut seen = vec![false; rank.max(1)];
    list.iter()
        .map(|&d| {
            let i = dim(op, d, rank)?;
            if std::mem::replace(&mut seen[i], true) {
                return Err(Error::InvalidArgument {
                    op,
                    msg: format!("dim {i} appears multiple times in the list of dims"),
                });
            }
            Ok(i)
        })
        .collect()
}

/// The bytes a contiguous tensor of `shape` and `dtype` needs, or PyTorch's error when the
/// element count or the byte count overflows (a wrapped product would make a huge shape look
/// empty, and reads of it return nothing instead of failing).
pub(crate) fn storage_bytes(op: &'static str, shape: &[usize], dtype: DType) -> Result<u64> {
    nonzero_numel(shape)
        .and_then(|n| n.checked_mul(dtype.size_bytes()))
        .map(|b| if shape.contains(&0) { 0 } else { b })
        .and_then(|b| u64::try_from(b).ok())
        .ok_or_else(|| Error::InvalidArgument {
            op,
            msg: format!("Storage size calculation overflowed with sizes={shape:?}"),
        })
}

/// Resolves a possibly negative dim against `rank`.
pub(crate) fn dim(op: &'static str, d: isize, rank: usize) -> Result<usize> {
    let r = rank as isize;
    let i = if d < 0 { d + r } else { d };
    if i < 0 || i >= r.max(1) || (rank == 0 && i != 0) {
        return Err(Error::IndexOutOfRange {
            op,
            index: d as i64,
            size: rank,
            what: "dim",
        });
    }
    Ok(i as usize)
}

/// NumPy/PyTorch broadcasting of two shapes.
pub(crate) fn broadcast_shapes(op: &'static str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(Error::ShapeMismatch {
                    op,
                    lhs: a.to_vec(),
                    rhs: b.to_vec(),
                })
            }
        };
    }
    checked_numel(op, &out)?;
    Ok(out)
}

impl Layout {
    /// The row-major layout of `shape` at offset 0.
    pub fn contiguous(shape: &[usize]) -> Self {
        Layout {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
        }
    }

    /// The number of dims.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    /// Row-major with no gaps (size-1 dims may have any stride).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1;
        for (&n, &s) in self.shape.iter().zip(&self.strides).rev() {
            if n != 1 && s != expected {
                return false;
            }
            expected *= n;
        }
        true
    }

    /// One past the largest element offset the layout reaches (0 when empty).
    pub fn storage_span(&self) -> usize {
        if self.numel() == 0 {
            return 0;
        }
        self.offset
            + self
                .shape
                .iter()
                .zip(&self.strides)
                .map(|(&n, &s)| (n - 1) * s)
                .sum::<usize>()
            + 1
    }

    /// This layout viewed as `shape` (right-aligned), with stride 0 on broadcast dims.
    pub fn broadcast_to(&self, op: &'static str, shape: &[usize]) -> Result<Layout> {
        checked_numel(op, shape)?;
        if shape.len() < self.rank() {
            return Err(Error::ShapeMismatch {
                op,
                lhs: self.shape.clone(),
                rhs: shape.to_vec(),
            });
        }
        let pad = shape.len() - self.rank();
        let mut strides = vec![0; shape.len()];
        for i in 0..shape.len() {
            if i < pad {
                continue;
            }
            let (n, s) = (self.shape[i - pad], self.strides[i - pad]);
            strides[i] = if n == shape[i] {
                s
            } else if n == 1 {
                0
            } else {
                return Err(Error::ShapeMismatch {
                    op,
                    lhs: self.shape.clone(),
                    rhs: shape.to_vec(),
                });
            };
        }
        Ok(Layout {
            shape: shape.to_vec(),
            strides,
            offset: self.offset,
        })
    }

    /// Strides for viewing this layout as `shape` without a copy, if possible (PyTorch's
    /// `computeStride`): `None` means a view is impossible and `reshape` must copy.
    pub fn view_strides(&self, shape: &[usize]) -> Option<Vec<usize>> {
        if self.numel() == 0 || self.rank() == 0 {
            return Some(contiguous_strides(shape));
        }
        let mut new_strides = vec![0; shape.len()];
        let mut view_d = shape.len() as isize - 1;
        let mut chunk_base_stride = *self.strides.last()?;
        let mut tensor_numel = 1;
        let mut view_numel = 1;
        for tensor_d in (0..self.rank()).rev() {
            tensor_numel *= self.shape[tensor_d];
            if tensor_d == 0
                || (self.shape[tensor_d - 1] != 1
                    && self.strides[tensor_d - 1] != tensor_numel * chunk_base_stride)
            {
                while view_d >= 0 && (view_numel < tensor_numel || shape[view_d as usize] == 1) {
                    new_strides[view_d as usize] = view_numel * chunk_base_stride;
                    view_numel *= shape[view_d as usize];
                    view_d -= 1;
                }
                if view_numel != tensor_numel {
                    return None;
                }
                if tensor_d > 0 {
                    chunk_base_stride = self.strides[tensor_d - 1];
                    tensor_numel = 1;
                    view_numel = 1;
                }
            }
        }
        if view_d != -1 {
            return None;
        }
        Some(new_strides)
    }

    /// Merges adjacent dims that iterate memory as one (and drops size-1 dims), so kernels see
    /// the fewest dims. Several layouts over the same shape are coalesced together.
    pub(crate) fn coalesce(shape: &[usize], strides: &mut [Vec<usize>]) -> Vec<usize> {
        let mut out_shape: Vec<usize> = Vec::new();
        let mut out_strides: Vec<Vec<usize>> = vec![Vec::new(); strides.len()];
        for d in 0..shape.len() {
            if shape[d] == 1 {
                continue;
            }
            let mergeable = !out_shape.is_empty()
                && strides
                    .iter()
                    .enumerate()
                    .all(|(k, s)| *out_strides[k].last().expect("non-empty") == s[d] * shape[d]);
            if mergeable {
                *out_shape.last_mut().expect("non-empty") *= shape[d];
                for (k, s) in strides.iter().enumerate() {
                    *out_strides[k].last_mut().expect("non-empty") = s[d];
                }
            } else {
                out_shape.push(shape[d]);
                for (k, s) in strides.iter().enumerate() {
                    out_strides[k].push(s[d]);
                }
            }
        }
        for (k, s) in strides.iter_mut().enumerate() {
            *s = std::mem::take(&mut out_strides[k]);
        }
        out_shape
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(
            broadcast_shapes("t", &[3, 1, 5], &[4, 1]).unwrap(),
            vec![3, 4, 5]
        );
        assert_eq!(broadcast_shapes("t", &[], &[2]).unwrap(), vec![2]);
        assert!(broadcast_shapes("t", &[3], &[4]).is_err());
    }

    #[test]
    fn views_follow_pytorch_compute_stride() {
        let l = Layout::contiguous(&[2, 3, 4]);
        assert_eq!(l.view_strides(&[6, 4]), Some(vec![4, 1]));
        let t = Layout {
            shape: vec![4, 3],
            strides: vec![1, 4],
            offset: 0,
        }; // a transpose
        assert_eq!(t.view_strides(&[12]), None);
        assert_eq!(t.view_strides(&[4, 3, 1]), Some(vec![1, 4, 4]));
    }

    #[test]
    fn coalesce_merges_contiguous_dims() {
        let mut s = vec![vec![12, 4, 1], vec![0, 4, 1]];
        let shape = Layout::coalesce(&[2, 3, 4], &mut s);
        assert_eq!(shape, vec![2, 12]);
        assert_eq!(s, vec![vec![12, 1], vec![0, 1]]);
    }
}
