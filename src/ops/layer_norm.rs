//! `layer_norm` over the trailing dims (`torch.nn.functional.layer_norm`): on GPUs one fused
//! launch forward (`shaders/layer_norm_fwd.wgsl`, saving each row's mean and rstd as PyTorch
//! does) and one per backward gradient (the input's; the weight's and bias's partial sums,
//! then a sum over chunks); the composite formula on the CPU device, which is the reference,
//! and for dtypes the kernels do not take.

use super::{same_device, u32_of};
use crate::kernels::{
    launch_groups, launch_wg, Kernel, LayerNormKernel, LayerNormPass, LAYER_NORM_WG,
};
use crate::tensor::{DType, Tensor};
use crate::{Error, Result};
use std::sync::atomic::{AtomicU8, Ordering};

const OP: &str = "layer_norm";

/// `torch.nn.functional.layer_norm(x, normalized_shape, weight, bias, eps)`: normalises over the
/// last `normalized_shape.len()` dims of `x` (biased variance, `eps` inside the square root),
/// then scales by `weight` and shifts by `bias`, each of `normalized_shape` where given. Under
/// autocast it runs in f32, as PyTorch's. Mixed float dtypes outside autocast take the weight
/// and bias in `x`'s dtype (their gradients flow back through the cast).
///
/// ```
/// # fn main() -> kiln::Result<()> {
/// use kiln::{Device, DType, Tensor};
/// let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 5.0], &[2, 2], &Device::cpu()?)?;
/// let y = kiln::ops::layer_norm(&x, &[2], None, None, 1e-5)?;
/// let got: Vec<f32> = y.to_vec()?;
/// assert!((got[0] + 1.0).abs() < 1e-4 && (got[3] - 1.0).abs() < 1e-4);
/// # Ok(())
/// # }
/// ```
pub fn layer_norm(
    x: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    check(x, normalized_shape, weight, bias)?;
    let params: Vec<&Tensor> = weight.into_iter().chain(bias).collect();
    let mut all = vec![x];
    all.extend(&params);
    if let Some(v) = super::autocast::fp32(&all)? {
        let w = weight.map(|_| &v[1]);
        let b = bias.map(|_| &v[v.len() - 1]);
        return super::autocast::suspended(|| layer_norm(&v[0], normalized_shape, w, b, eps));
    }
    // The weight and bias in x's dtype (a recorded cast, so that their gradients reach them).
    let cast = |t: Option<&Tensor>| -> Result<Option<Tensor>> {
        t.map(|t| match t.dtype() == x.dtype() {
            true => Ok(t.clone()),
            false => t.to_dtype(x.dtype()),
        })
        .transpose()
    };
    let (w, b) = (cast(weight)?, cast(bias)?);
    let n: usize = normalized_shape.iter().product();
    match fused_fits(x, n) {
        true => fused(x, normalized_shape, w.as_ref(), b.as_ref(), eps),
        false => composite(x, normalized_shape, w.as_ref(), b.as_ref(), eps),
    }
}

/// PyTorch's checks, in its words.
fn check(
    x: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
) -> Result<()> {
    if !x.dtype().is_float() {
        return Err(Error::UnsupportedDType {
            op: OP,
            dtype: x.dtype(),
            why: "(a float op)".into(),
        });
    }
    let k = normalized_shape.len();
    if k == 0 {
        return Err(Error::InvalidArgument {
            op: OP,
            msg: "Expected normalized_shape to be at least 1-dimensional, i.e., containing at \
                  least one element, but got normalized_shape = []"
                .into(),
        });
    }
    // Shape errors are `ShapeMismatch` (the operand's shape, then normalized_shape), where
    // PyTorch says "Given normalized_shape=[4], expected input with shape [*, 4], but got
    // input of size[2, 3]" and "Expected weight to be of same shape as normalized_shape".
    let r = x.rank();
    if r < k || x.shape()[r - k..] != *normalized_shape {
        return Err(Error::ShapeMismatch {
            op: OP,
            lhs: x.shape().to_vec(),
            rhs: normalized_shape.to_vec(),
        });
    }
    for t in [weight, bias] {
        let Some(t) = t else { continue };
        if t.shape() != normalized_shape {
            return Err(Error::ShapeMismatch {
                op: OP,
                lhs: t.shape().to_vec(),
                rhs: normalized_shape.to_vec(),
            });
        }
        if !t.dtype().is_float() {
            return Err(Error::DTypeMismatch {
                op: OP,
                expected: x.dtype(),
                got: t.dtype(),
            });
        }
        same_device(OP, x, t)?;
    }
    Ok(())
}

/// The formula of ops: the CPU device's reference (its autograd is the ops' own).
fn composite(
    x: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    let dims: Vec<isize> = (0..normalized_shape.len() as isize)
        .map(|i| -1 - i)
        .collect();
    let mean = x.mean(&dims, true)?;
    let var = x.var(&dims, 0, true)?;
    let mut y = x.sub(&mean)?.mul(&var.add_scalar(eps)?.rsqrt()?)?;
    if let Some(w) = weight {
        y = y.mul(w)?;
    }
    if let Some(b) = bias {
        y = y.add(b)?;
    }
    Ok(y)
}

/// Whether the fused kernels take `x`: a GPU, f32 or f16, a non-empty row, every index
/// within 32 bits and the weight-gradient grid within the adapter's limits.
fn fused_fits(x: &Tensor, n: usize) -> bool {
    let Some(info) = x.device().adapter_info() else {
        return false;
    };
    matches!(x.dtype(), DType::F32 | DType::F16)
        && x.numel() > 0
        && n > 0
        && x.numel() + x.layout.offset <= u32::MAX as usize
        && n.div_ceil(64) <= info.limits.max_compute_workgroups_per_dimension as usize
        && info.limits.max_immediate_size >= 48
        && info.limits.max_compute_workgroup_storage_size >= 4096
}

/// The kernel form forced by `force_layer_norm_serial` or `KILN_LAYER_NORM_FORM=tree|serial`
/// (read once): 0 unread, 1 by the adapter, 2 tree, 3 serial.
static FORCED_FORM: AtomicU8 = AtomicU8::new(0);

fn forced_form() -> Option<bool> {
    let mut f = FORCED_FORM.load(Ordering::Relaxed);
    if f == 0 {
        f = match std::env::var("KILN_LAYER_NORM_FORM").as_deref() {
            Ok("tree") => 2,
            Ok("serial") => 3,
            _ => 1,
        };
        FORCED_FORM.store(f, Ordering::Relaxed);
    }
    (f >= 2).then_some(f == 3)
}

/// Forces the kernels' form: a row per invocation (`Some(true)`), a workgroup per row
/// (`Some(false)`), or by the adapter (`None`: serial on CPU adapters), for tests and
/// benchmarks.
#[doc(hidden)]
pub fn force_layer_norm_serial(serial: Option<bool>) {
    let f = match serial {
        None => 1,
        Some(false) => 2,
        Some(true) => 3,
    };
    FORCED_FORM.store(f, Ordering::Relaxed);
}

/// x as rows, the immediates of every pass and the kernels' unit.
struct Rows {
    x: Tensor,
    w: Option<Tensor>,
    b: Option<Tensor>,
    n: usize,
    vec4: bool,
    eps: f32,
    /// A row per invocation (CPU adapters: lavapipe ran the workgroup-per-row form at 17 ms
    /// for 1280 rows of 64, its barriers being coroutine switches there).
    serial: bool,
}

impl Rows {
    fn new(x: &Tensor, n: usize, w: Option<&Tensor>, b: Option<&Tensor>, eps: f64) -> Result<Rows> {
        let x = x.contiguous()?;
        let w = w.map(|t| t.contiguous()).transpose()?;
        let b = b.map(|t| t.contiguous()).transpose()?;
        let aligned =
            |t: &Option<Tensor>| t.as_ref().is_none_or(|t| t.layout.offset.is_multiple_of(4));
        let vec4 =
            n.is_multiple_of(4) && x.layout.offset.is_multiple_of(4) && aligned(&w) && aligned(&b);
        let serial =
            forced_form().unwrap_or_else(|| crate::kernels::tune::on_cpu_adapter(x.device()));
        Ok(Rows {
            serial,
            x,
            w,
            b,
            n,
            vec4,
            eps: eps as f32,
        })
    }

    fn rows(&self) -> usize {
        self.x.numel() / self.n
    }

    fn unit(&self) -> usize {
        if self.vec4 {
            4
        } else {
            1
        }
    }

    fn kernel(&self, pass: LayerNormPass) -> Kernel {
        Kernel::LayerNorm(LayerNormKernel {
            pass,
            dtype: self.x.dtype(),
            vec4: self.vec4,
            serial: self.serial && pass != LayerNormPass::BackwardParams,
        })
    }

    /// `shaders/layer_norm_common.wgsl`'s `Params`.
    fn immediates(&self, chunk_len: usize) -> Result<Vec<u32>> {
        let u = self.unit();
        let off = |t: &Option<Tensor>| t.as_ref().map_or(0, |t| t.layout.offset / u);
        let flags = self.w.is_some() as u32 | (self.b.is_some() as u32) << 1;
        Ok(vec![
            u32_of(OP, self.rows())?,
            u32_of(OP, self.n / u)?,
            u32_of(OP, self.n)?,
            u32_of(OP, self.x.layout.offset / u)?,
            u32_of(OP, off(&self.w))?,
            u32_of(OP, off(&self.b))?,
            flags,
            self.eps.to_bits(),
            u32_of(OP, chunk_len)?,
            0,
            0,
            0,
        ])
    }

    /// A workgroup per row.
    fn launch_rows(
        &self,
        pass: LayerNormPass,
        blocks: &[&crate::device::DeviceBlock],
    ) -> Result<()> {
        let imm = self.immediates(0)?;
        match self.serial {
            true => launch_wg(self.kernel(pass), blocks, &imm, self.rows() as u64, 64),
            false => {
                let threads = self.rows() as u64 * LAYER_NORM_WG as u64;
                launch_wg(self.kernel(pass), blocks, &imm, threads, LAYER_NORM_WG)
            }
        }
    }

    /// y and the `[2, rows]` f32 means and rstds.
    fn forward(&self) -> Result<(Tensor, Tensor)> {
        let y = Tensor::empty(self.x.shape(), self.x.dtype(), self.x.device())?;
        let stats = Tensor::empty(&[2, self.rows()], DType::F32, self.x.device())?;
        let xb = &self.x.storage.block;
        let w = self.w.as_ref().map_or(xb, |t| &t.storage.block);
        let b = self.b.as_ref().map_or(xb, |t| &t.storage.block);
        let blocks = [xb, w, b, &y.storage.block, &stats.storage.block];
        self.launch_rows(LayerNormPass::Forward, &blocks)?;
        Ok((y, stats))
    }

    fn input_grad(&self, dy: &Tensor, stats: &Tensor) -> Result<Tensor> {
        let dx = Tensor::empty(self.x.shape(), self.x.dtype(), self.x.device())?;
        let xb = &self.x.storage.block;
        let w = self.w.as_ref().map_or(xb, |t| &t.storage.block);
        let blocks = [
            xb,
            w,
            &dy.storage.block,
            &stats.storage.block,
            &dx.storage.block,
        ];
        self.launch_rows(LayerNormPass::BackwardInput, &blocks)?;
        Ok(dx)
    }

    /// The weight's and the bias's gradients (`[n]` each, f32): per-chunk partial sums of 64
    /// rows or more (at most 1024 chunks), summed over the chunks.
    fn param_grads(&self, dy: &Tensor, stats: &Tensor) -> Result<(Tensor, Tensor)> {
        let chunks = self.rows().div_ceil(64).min(1024);
        let chunk_len = self.rows().div_ceil(chunks);
        let part = Tensor::empty(&[2, chunks, self.n], DType::F32, self.x.device())?;
        let xb = &self.x.storage.block;
        let blocks = [
            xb,
            xb,
            &dy.storage.block,
            &stats.storage.block,
            &part.storage.block,
        ];
        let groups = (
            u32_of(OP, (self.n / self.unit()).div_ceil(64))?,
            u32_of(OP, chunks)?,
            1,
        );
        let kernel = self.kernel(LayerNormPass::BackwardParams);
        launch_groups(kernel, &blocks, &self.immediates(chunk_len)?, groups)?;
        let sums = part.sum(&[1], false)?;
        Ok((sums.narrow(0, 0, 1)?, sums.narrow(0, 1, 1)?))
    }
}

/// The fused path: one forward launch, and a node whose backward runs the input-gradient pass
/// and, where the weight or bias needs one, the parameter pass.
fn fused(
    x: &Tensor,
    normalized_shape: &[usize],
    w: Option<&Tensor>,
    b: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    const NAME: &str = "NativeLayerNormBackward0";
    let n: usize = normalized_shape.iter().product();
    let rows = Rows::new(x, n, w, b, eps)?;
    let stats_cell = std::cell::RefCell::new(None);
    let forward = || -> Result<Tensor> {
        let (y, stats) = rows.forward()?;
        *stats_cell.borrow_mut() = Some(stats);
        Ok(y)
    };
    let mut inputs = vec![x];
    inputs.extend(w);
    inputs.extend(b);
    let (has_w, has_b) = (w.is_some(), b.is_some());
    let shape = normalized_shape.to_vec();
    crate::graph::record(NAME, &inputs, forward, |_| {
        let x = crate::graph::save(&rows.x)?;
        let w = rows.w.as_ref().map(crate::graph::save).transpose()?;
        let stats = stats_cell.borrow_mut().take().ok_or(Error::Autograd {
            op: OP,
            msg: "the forward pass left no statistics".into(),
        })?;
        let stats = crate::graph::save(&stats)?;
        let (n, vec4, eps, serial) = (rows.n, rows.vec4, rows.eps, rows.serial);
        Ok(Box::new(move |g: &Tensor, needs: &[bool]| {
            let rows = Rows {
                x: x.get()?,
                w: w.as_ref().map(|w| w.get()).transpose()?,
                b: None,
                n,
                vec4,
                eps,
                serial,
            };
            let (dy, stats) = (g.contiguous()?, stats.get()?);
            let mut grads = vec![None; needs.len()];
            if needs[0] {
                grads[0] = Some(rows.input_grad(&dy, &stats)?);
            }
            if needs[1..].iter().any(|&need| need) {
                let (dw, db) = rows.param_grads(&dy, &stats)?;
                let dtype = rows.x.dtype();
                let as_param = |t: Tensor| t.reshape(&super::isize_shape(&shape))?.to_dtype(dtype);
                if has_w && needs[1] {
                    grads[1] = Some(as_param(dw)?);
                }
                let at = 1 + has_w as usize;
                if has_b && needs[at] {
                    grads[at] = Some(as_param(db)?);
                }
            }
            Ok(grads)
        }))
    })
}
