//! The CPU reference device: every op as a simple strided loop in f64 (floats) or i64
//! (integers). It is the oracle for tests and the fallback where there is no GPU; it knows
//! nothing of the GPU.

pub(crate) mod random;

use crate::base::{BinaryOp, CmpOp, Conv2dParams, UnaryOp};
use crate::tensor::{DType, Element, Layout, Tensor};

/// Storage offsets (in elements) of every element of `layout`, in row-major order.
pub(crate) fn offsets(layout: &Layout) -> Vec<usize> {
    let n = layout.numel();
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let rank = layout.rank();
    let mut idx = vec![0usize; rank];
    let mut off = layout.offset;
    for _ in 0..n {
        out.push(off);
        for d in (0..rank).rev() {
            idx[d] += 1;
            off += layout.strides[d];
            if idx[d] < layout.shape[d] {
                break;
            }
            off -= layout.strides[d] * layout.shape[d];
            idx[d] = 0;
        }
    }
    out
}

fn base(t: &Tensor) -> *mut u8 {
    t.storage.block.host_ptr().unwrap_or(std::ptr::null_mut())
}

/// Reads element `i` (in elements) of `t`'s storage as f64.
fn load(t: &Tensor, i: usize) -> f64 {
    let w = t.dtype.size_bytes();
    // SAFETY: `i` comes from the tensor's own layout, inside its block.
    let bytes = unsafe { std::slice::from_raw_parts(base(t).add(i * w), w) };
    match t.dtype {
        DType::F32 => f32::read_le(bytes).to_f64(),
        DType::F64 => f64::read_le(bytes),
        DType::F16 => half::f16::read_le(bytes).to_f64(),
        DType::I32 => i32::read_le(bytes).to_f64(),
        DType::U32 => u32::read_le(bytes).to_f64(),
        DType::Bool => bool::read_le(bytes).to_f64(),
    }
}

/// Writes `v` (rounded, or wrapped for integers) to element `i` of `t`'s storage.
fn store(t: &Tensor, i: usize, v: f64) {
    let mut bytes = Vec::with_capacity(8);
    match t.dtype {
        DType::F32 => (v as f32).write_le(&mut bytes),
        DType::F64 => v.write_le(&mut bytes),
        DType::F16 => half::f16::from_f64(v).write_le(&mut bytes),
        DType::I32 => (v as i64 as i32).write_le(&mut bytes),
        DType::U32 => (v as i64 as u32).write_le(&mut bytes),
        DType::Bool => (v != 0.0).write_le(&mut bytes),
    }
    // SAFETY: as in `load`; the output is a fresh tensor no one else reads.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), base(t).add(i * bytes.len()), bytes.len())
    };
}

/// `out` may be `x` itself (in place): each element is read before it is written.
pub(crate) fn unary(x: &Tensor, out: &Tensor, op: UnaryOp) {
    for (ix, io) in offsets(&x.layout).into_iter().zip(offsets(&out.layout)) {
        store(out, io, op.cpu(load(x, ix)));
    }
}

fn binary_value(op: BinaryOp, dtype: DType, x: f64, y: f64) -> f64 {
    if dtype.is_float() {
        op.cpu(x, y)
    } else {
        op.cpu_int(x as i64, y as i64) as f64
    }
}

/// `a` and `b` already broadcast to `out`'s shape; `out` may be `a` (in place).
pub(crate) fn binary(a: &Tensor, b: &Tensor, out: &Tensor, op: BinaryOp) {
    let (oa, ob, oo) = (offsets(&a.layout), offsets(&b.layout), offsets(&out.layout));
    for ((ia, ib), io) in oa.into_iter().zip(ob).zip(oo) {
        store(
            out,
            io,
            binary_value(op, out.dtype, load(a, ia), load(b, ib)),
        );
    }
}

pub(crate) fn binary_scalar(a: &Tensor, s: f64, out: &Tensor, op: BinaryOp) {
    for (ia, io) in offsets(&a.layout).into_iter().zip(offsets(&out.layout)) {
        store(out, io, binary_value(op, out.dtype, load(a, ia), s));
    }
}

/// Folds each row of `inner` trailing elements of `x` (reduced dims last) with `f` from
/// `identity` into contiguous `out`, scaled by `scale`. In f64.
pub(crate) fn reduce_rows(
    x: &Tensor,
    out: &Tensor,
    inner: usize,
    scale: f64,
    f: impl Fn(f64, f64) -> f64,
    identity: f64,
) {
    let offs = offsets(&x.layout);
    for (r, row) in offs.chunks(inner).enumerate() {
        let v = row.iter().fold(identity, |acc, &o| f(acc, load(x, o)));
        store(out, out.layout.offset + r, v * scale);
    }
}

/// The first extreme of each row (NaN counts as the extreme) and its index.
pub(crate) fn arg_reduce_rows(
    x: &Tensor,
    values: &Tensor,
    indices: &Tensor,
    inner: usize,
    is_min: bool,
) {
    let offs = offsets(&x.layout);
    for (r, row) in offs.chunks(inner).enumerate() {
        let mut best: Option<(f64, usize)> = None;
        for (j, &o) in row.iter().enumerate() {
            let v = load(x, o);
            let take = match best {
                None => true,
                Some((b, _)) if b.is_nan() => false,
                Some(_) if v.is_nan() => true,
                Some((b, _)) => {
                    if is_min {
                        v < b
                    } else {
                        v > b
                    }
                }
            };
            if take {
                best = Some((v, j));
            }
        }
        let (v, j) = best.expect("rows are not empty");
        store(values, r, v);
        store(indices, r, j as f64);
    }
}

/// softmax (or log_softmax) of each row of `inner` trailing elements of `x` into contiguous
/// `out`, in f64 with the max subtracted.
pub(crate) fn softmax_rows(x: &Tensor, out: &Tensor, inner: usize, log: bool) {
    let offs = offsets(&x.layout);
    for (r, row) in offs.chunks(inner).enumerate() {
        let v: Vec<f64> = row.iter().map(|&o| load(x, o)).collect();
        let m = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = v.iter().map(|&a| (a - m).exp()).sum();
        for (j, &a) in v.iter().enumerate() {
            let y = if log {
                a - m - sum.ln()
            } else {
                (a - m).exp() / sum
            };
            store(out, out.layout.offset + r * inner + j, y);
        }
    }
}

/// Batched matmul in f64: `dims` = [m, n, k, batch]; strides (batch, row, col) per operand in
/// elements; `out` contiguous [batch, m, n].
pub(crate) fn matmul(
    a: &Tensor,
    b: &Tensor,
    out: &Tensor,
    dims: [usize; 4],
    sa: [usize; 3],
    sb: [usize; 3],
) {
    let [m, n, k, batch] = dims;
    let (oa, ob) = (a.layout.offset, b.layout.offset);
    for bt in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let s: f64 = (0..k)
                    .map(|kk| {
                        load(a, oa + bt * sa[0] + i * sa[1] + kk * sa[2])
                            * load(b, ob + bt * sb[0] + kk * sb[1] + j * sb[2])
                    })
                    .sum();
                store(out, out.layout.offset + (bt * m + i) * n + j, s);
            }
        }
    }
}

/// `a OP b` (or `a OP s` when `b` is `None`) into the bool tensor `out`.
pub(crate) fn compare(a: &Tensor, b: Option<&Tensor>, s: f64, out: &Tensor, op: CmpOp) {
    let oa = offsets(&a.layout);
    let ob = b.map(|b| offsets(&b.layout));
    for (i, (ia, io)) in oa.into_iter().zip(offsets(&out.layout)).enumerate() {
        let y = match (b, &ob) {
            (Some(b), Some(ob)) => load(b, ob[i]),
            _ => s,
        };
        store(out, io, op.cpu(load(a, ia), y) as u8 as f64);
    }
}

/// Where `cond` holds, `out` takes `value`'s element (or `s`).
pub(crate) fn select(out: &Tensor, cond: &Tensor, value: Option<&Tensor>, s: f64) {
    let oc = offsets(&cond.layout);
    let ov = value.map(|v| offsets(&v.layout));
    for (i, (ic, io)) in oc.into_iter().zip(offsets(&out.layout)).enumerate() {
        if load(cond, ic) != 0.0 {
            let v = match (value, &ov) {
                (Some(v), Some(ov)) => load(v, ov[i]),
                _ => s,
            };
            store(out, io, v);
        }
    }
}

/// `out[c] = x[c with coordinate d replaced by index[c]]`; `Err(bad index)` if one is out of
/// range.
pub(crate) fn gather(x: &Tensor, d: usize, index: &Tensor, out: &Tensor) -> Result<(), i64> {
    let size = x.layout.shape[d] as i64;
    let (oi, oo) = (offsets(&index.layout), offsets(&out.layout));
    let rank = out.layout.rank();
    let mut coord = vec![0usize; rank];
    for (ii, io) in oi.into_iter().zip(oo) {
        let i = load(index, ii) as i64;
        if i < 0 || i >= size {
            return Err(i);
        }
        let off = x.layout.offset
            + coord
                .iter()
                .zip(&x.layout.strides)
                .enumerate()
                .map(|(k, (&c, &s))| if k == d { i as usize * s } else { c * s })
                .sum::<usize>();
        store(out, io, load(x, off));
        for k in (0..rank).rev() {
            coord[k] += 1;
            if coord[k] < out.layout.shape[k] {
                break;
            }
            coord[k] = 0;
        }
    }
    Ok(())
}

/// Direct convolution over contiguous NCHW `x` and [C_out, C_in/g, KH, KW] `w`, in f64.
pub(crate) fn conv2d(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, out: &Tensor, p: Conv2dParams) {
    let [n, cin, h, wd] = [
        x.layout.shape[0],
        x.layout.shape[1],
        x.layout.shape[2],
        x.layout.shape[3],
    ];
    let [cout, cin_g, kh, kw] = [
        w.layout.shape[0],
        w.layout.shape[1],
        w.layout.shape[2],
        w.layout.shape[3],
    ];
    let [oh, ow] = [out.layout.shape[2], out.layout.shape[3]];
    let cout_g = cout / p.groups;
    let mut e = out.layout.offset;
    for b in 0..n {
        for co in 0..cout {
            let g = co / cout_g;
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut acc = bias.map_or(0.0, |bt| load(bt, bt.layout.offset + co));
                    for ci in 0..cin_g {
                        let c = g * cin_g + ci;
                        for ky in 0..kh {
                            let iy = (oy * p.stride.0 + ky * p.dilation.0) as isize
                                - p.padding.0 as isize;
                            for kx in 0..kw {
                                let ix = (ox * p.stride.1 + kx * p.dilation.1) as isize
                                    - p.padding.1 as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                    continue;
                                }
                                let xv = load(
                                    x,
                                    x.layout.offset
                                        + ((b * cin + c) * h + iy as usize) * wd
                                        + ix as usize,
                                );
                                let wv = load(
                                    w,
                                    w.layout.offset + ((co * cin_g + ci) * kh + ky) * kw + kx,
                                );
                                acc += xv * wv;
                            }
                        }
                    }
                    store(out, e, acc);
                    e += 1;
                }
            }
        }
    }
}

/// Max (NaN propagates, padding ignored) or average (whole window) pooling, in f64.
pub(crate) fn pool2d(
    x: &Tensor,
    out: &Tensor,
    k: (usize, usize),
    s: (usize, usize),
    pad: (usize, usize),
    is_max: bool,
) {
    let [nc, h, w] = [
        x.layout.shape[0] * x.layout.shape[1],
        x.layout.shape[2],
        x.layout.shape[3],
    ];
    let [oh, ow] = [out.layout.shape[2], out.layout.shape[3]];
    let mut e = out.layout.offset;
    for plane in 0..nc {
        for oy in 0..oh {
            for ox in 0..ow {
                let (mut best, mut sum) = (f64::NEG_INFINITY, 0.0);
                for ky in 0..k.0 {
                    for kx in 0..k.1 {
                        let iy = (oy * s.0 + ky) as isize - pad.0 as isize;
                        let ix = (ox * s.1 + kx) as isize - pad.1 as isize;
                        if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                            continue;
                        }
                        let v = load(
                            x,
                            x.layout.offset + (plane * h + iy as usize) * w + ix as usize,
                        );
                        sum += v;
                        if v.is_nan() || (!best.is_nan() && v > best) {
                            best = v;
                        }
                    }
                }
                store(
                    out,
                    e,
                    if is_max {
                        best
                    } else {
                        sum / (k.0 * k.1) as f64
                    },
                );
                e += 1;
            }
        }
    }
}

/// `out[c with coordinate d replaced by index[c]] += src[e]` for each coordinate c (element e)
/// of the index, `src` contiguous in the index's shape; `Err(bad index)` when out of range.
pub(crate) fn scatter_add(out: &Tensor, d: usize, index: &Tensor, src: &Tensor) -> Result<(), i64> {
    let size = out.layout.shape[d] as i64;
    let rank = index.layout.rank();
    let mut coord = vec![0usize; rank];
    for (e, ii) in offsets(&index.layout).into_iter().enumerate() {
        let i = load(index, ii) as i64;
        if i < 0 || i >= size {
            return Err(i);
        }
        let off = out.layout.offset
            + coord
                .iter()
                .zip(&out.layout.strides)
                .enumerate()
                .map(|(k, (&c, &s))| if k == d { i as usize * s } else { c * s })
                .sum::<usize>();
        store(out, off, load(out, off) + load(src, src.layout.offset + e));
        for k in (0..rank).rev() {
            coord[k] += 1;
            if coord[k] < index.layout.shape[k] {
                break;
            }
            coord[k] = 0;
        }
    }
    Ok(())
}
