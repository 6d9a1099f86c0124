//! Batch normalisation (PyTorch's `F.batch_norm`) over dim 1 of [N, C, ...].
//!
//! On a GPU, f32 and f16 inputs (f16 with f32 parameters) take the fused path: three launches forward (per-channel partial sums,
//! a per-channel finalize that also updates the running statistics, one elementwise pass) and
//! three backward, saving only the input and a [4, C] block of statistics, as PyTorch's native
//! kernel does. The composite formula built from reductions and broadcasts saved five
//! activation-sized tensors and took about fifteen launches; it stays as the reference (the CPU
//! device, other dtypes) and the tests hold the fused path to it.

use super::{same_device, u32_of};
use crate::kernels::{launch, launch_groups, BatchNormPass, Kernel};
use crate::tensor::{DType, Tensor};
use crate::{Error, Result};

const OP: &str = "batch_norm";

/// Batch normalisation of `x` [N, C, ...] per channel: with the batch's statistics in training
/// (updating `running_mean`/`running_var` in place with `momentum` and the unbiased variance,
/// where given) and with the running statistics in evaluation. f16 input takes f32 parameters
/// (autocast's activations with a module's f32 weights, as PyTorch's kernels): the statistics
/// and arithmetic f32, the output f16. Under autocast nothing is cast (batch_norm is on none of
/// PyTorch's lists).
#[allow(clippy::too_many_arguments)]
pub fn batch_norm(
    x: &Tensor,
    running_mean: Option<&Tensor>,
    running_var: Option<&Tensor>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    training: bool,
    momentum: f64,
    eps: f64,
) -> Result<Tensor> {
    let running = [running_mean, running_var];
    batch_norm_counted(
        x,
        running,
        [weight, bias],
        training,
        [momentum, eps],
        false,
        None,
    )
}

/// `relu(batch_norm(...))` in one node (`NativeBatchNormReluBackward0`): on the fused GPU path
/// the ReLU costs no pass of its own either way (the forward's elementwise pass clamps; the
/// backward's two passes zero the gradient where the output was <= 0, recomputing the
/// output from the saved input and statistics, so nothing more is saved). The same values as
/// the two ops; elsewhere it is the two ops. ResNet's blocks call it through
/// `Module::forward_relu`.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_relu(
    x: &Tensor,
    running_mean: Option<&Tensor>,
    running_var: Option<&Tensor>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    training: bool,
    momentum: f64,
    eps: f64,
) -> Result<Tensor> {
    let running = [running_mean, running_var];
    batch_norm_counted(
        x,
        running,
        [weight, bias],
        training,
        [momentum, eps],
        true,
        None,
    )
}

/// `batch_norm` (or with `relu`, `batch_norm_relu`) that, in training, also adds 1 to
/// `counter` where one is given, as a module's `num_batches_tracked += 1` after the call: on
/// the fused path inside the partial sums' launch (a ResNet-50 step made 53 launches of that
/// add), elsewhere as that add.
pub(crate) fn batch_norm_counted(
    x: &Tensor,
    running: [Option<&Tensor>; 2],
    affine: [Option<&Tensor>; 2],
    training: bool,
    hyper: [f64; 2],
    relu: bool,
    counter: Option<&Tensor>,
) -> Result<Tensor> {
    let fusable = counter.filter(|t| {
        training
            && t.dtype() == DType::I32
            && t.numel() == 1
            && t.is_contiguous()
            && t.device() == x.device()
    });
    let (y, counted) = normalise(x, running, affine, training, hyper, relu, fusable)?;
    if let (true, false, Some(counter)) = (training, counted, counter) {
        crate::no_grad(|| counter.add_scalar_(1.0))?;
    }
    Ok(y)
}

/// The normalisation, and whether it added 1 to `counter` (only the fused path does).
fn normalise(
    x: &Tensor,
    [running_mean, running_var]: [Option<&Tensor>; 2],
    [weight, bias]: [Option<&Tensor>; 2],
    training: bool,
    [momentum, eps]: [f64; 2],
    relu: bool,
    counter: Option<&Tensor>,
) -> Result<(Tensor, bool)> {
    let params = check(x, running_mean, running_var, weight, bias, training)?;
    let c = x.shape()[1];
    let ones;
    let zeros;
    let weight = match weight {
        Some(w) => w,
        None => {
            ones = Tensor::ones(&[c], params, x.device())?;
            &ones
        }
    };
    let bias = match bias {
        Some(b) => b,
        None => {
            zeros = Tensor::zeros(&[c], params, x.device())?;
            &zeros
        }
    };
    let running = running_mean.zip(running_var);
    if fused_suits(x, running, weight, bias) {
        let y = fused(
            x,
            running,
            weight,
            bias,
            training,
            [momentum, eps],
            relu,
            counter,
        )?;
        return Ok((y, counter.is_some()));
    }
    // Mixed (f16 input, f32 parameters): the reference in the parameters' dtype, the output
    // back in the input's.
    // Autocast stays out of the formula's steps (its reductions are on the f32 list).
    let y = super::autocast::suspended(|| {
        let xp = x.to_dtype(params)?;
        let y = composite(&xp, running, weight, bias, training, momentum, eps)?;
        let y = if relu { y.relu()? } else { y };
        y.to_dtype(x.dtype())
    })?;
    Ok((y, false))
}

/// Checks the operands; returns the parameters' dtype (the input's where none is given).
fn check(
    x: &Tensor,
    running_mean: Option<&Tensor>,
    running_var: Option<&Tensor>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    training: bool,
) -> Result<DType> {
    if x.rank() < 2 {
        return Err(Error::InvalidArgument {
            op: OP,
            msg: format!(
                "expected an input of 2 or more dims [N, C, ...], got {:?}",
                x.shape()
            ),
        });
    }
    if !x.dtype().is_float() {
        return Err(Error::UnsupportedDType {
            op: OP,
            dtype: x.dtype(),
            why: "(a float op)".into(),
        });
    }
    let c = x.shape()[1];
    for t in [running_mean, running_var, weight, bias]
        .into_iter()
        .flatten()
    {
        if t.numel() != c || t.rank() != 1 {
            return Err(Error::ShapeMismatch {
                op: OP,
                lhs: x.shape().to_vec(),
                rhs: t.shape().to_vec(),
            });
        }
        same_device(OP, x, t)?;
    }
    // As PyTorch's kernels: the parameters and running statistics share one dtype, the input's
    // or, for f16 input (autocast's activations), f32.
    let params = [weight, bias, running_mean, running_var]
        .into_iter()
        .flatten()
        .map(|t| t.dtype())
        .next()
        .unwrap_or(x.dtype());
    let mixed = x.dtype() == DType::F16 && params == DType::F32;
    for t in [weight, bias, running_mean, running_var]
        .into_iter()
        .flatten()
    {
        if t.dtype() != params || (params != x.dtype() && !mixed) {
            return Err(Error::DTypeMismatch {
                op: OP,
                expected: if mixed { params } else { x.dtype() },
                got: t.dtype(),
            });
        }
    }
    if running_mean.is_some() != running_var.is_some() {
        return Err(Error::InvalidArgument {
            op: OP,
            msg: "running_mean and running_var must be given together".into(),
        });
    }
    if !training && running_mean.is_none() {
        return Err(Error::InvalidArgument {
            op: OP,
            msg: "running_mean and running_var must be defined in evaluation mode".into(),
        });
    }
    if training && x.numel() / c.max(1) <= 1 {
        return Err(Error::InvalidArgument {
            op: OP,
            msg: format!(
                "Expected more than 1 value per channel when training, got input size {:?}",
                x.shape()
            ),
        });
    }
    Ok(params)
}

/// The fused kernels take an f32 or f16 input with f32 per-channel tensors (1-D, contiguous)
/// on a GPU, and sizes that index in 32 bits.
fn fused_suits(
    x: &Tensor,
    running: Option<(&Tensor, &Tensor)>,
    weight: &Tensor,
    bias: &Tensor,
) -> bool {
    let mut per_channel = vec![weight, bias];
    if let Some((mean, var)) = running {
        per_channel.extend([mean, var]);
    }
    !x.device().is_cpu()
        && x.numel() > 0
        && x.numel() < u32::MAX as usize / 2
        && matches!(x.dtype(), DType::F32 | DType::F16)
        && per_channel
            .iter()
            .all(|t| t.dtype() == DType::F32 && t.is_contiguous())
}

/// The reference formula from reductions and broadcasts (the CPU device, f16, f64).
fn composite(
    x: &Tensor,
    running: Option<(&Tensor, &Tensor)>,
    weight: &Tensor,
    bias: &Tensor,
    training: bool,
    momentum: f64,
    eps: f64,
) -> Result<Tensor> {
    let c = x.shape()[1] as isize;
    // [1, C, 1, 1] (or [1, C]) for broadcasting.
    let mut bshape = vec![1isize; x.rank()];
    bshape[1] = c;
    let dims: Vec<isize> = (0..x.rank() as isize).filter(|&d| d != 1).collect();
    let (mean, var) = match (training, running) {
        (false, Some((rm, rv))) => (rm.reshape(&bshape)?, rv.reshape(&bshape)?),
        _ => {
            let mean = x.mean(&dims, true)?;
            let var = x.var(&dims, 0, true)?;
            if let Some((rm, rv)) = running {
                let n = (x.numel() / x.shape()[1]) as f64;
                crate::no_grad(|| -> Result<()> {
                    let m = momentum;
                    let unbiased = var.reshape(&[c])?.mul_scalar(n / (n - 1.0).max(1.0))?;
                    rm.mul_scalar_(1.0 - m)?;
                    rm.add_(&mean.reshape(&[c])?.mul_scalar(m)?)?;
                    rv.mul_scalar_(1.0 - m)?;
                    rv.add_(&unbiased.mul_scalar(m)?)
                })?;
            }
            (mean, var)
        }
    };
    let xhat = x.sub(&mean)?.mul(&var.add_scalar(eps)?.rsqrt()?)?;
    xhat.mul(&weight.reshape(&bshape)?)?
        .add(&bias.reshape(&bshape)?)
}

/// x viewed as [N, C, S] in units of one f32 or one vec4.
struct Shape {
    c: usize,
    /// S and N * S in units.
    s: usize,
    m: usize,
    /// Elements per channel.
    m_elems: usize,
    vec4: bool,
    unit: usize,
}

impl Shape {
    /// The shape of contiguous `x` (and of `g`, its gradient, also contiguous): vec4 units
    /// where rows and both offsets allow.
    fn of(x: &Tensor, g: Option<&Tensor>) -> Shape {
        let (n, c) = (x.shape()[0], x.shape()[1]);
        let s = x.numel() / (n * c).max(1);
        let vec4 = s.is_multiple_of(4)
            && x.layout().offset.is_multiple_of(4)
            && g.is_none_or(|g| g.layout().offset.is_multiple_of(4));
        let unit = if vec4 { 4 } else { 1 };
        Shape {
            c,
            s: s / unit,
            m: n * s / unit,
            m_elems: n * s,
            vec4,
            unit,
        }
    }

    /// (chunks, units per chunk): enough workgroups to fill a large GPU (about 1024 in all)
    /// without chunks of fewer than 1024 units.
    fn chunks(&self) -> (usize, usize) {
        let want = 1024usize.div_ceil(self.c).min(self.m.div_ceil(1024)).max(1);
        let len = self.m.div_ceil(want);
        (self.m.div_ceil(len), len)
    }
}

fn f32_bits(v: f64) -> u32 {
    (v as f32).to_bits()
}

/// The per-channel finalize after the partial sums: its tensors (`finalize`'s after the
/// partials), whether it is training's, and (momentum, eps).
struct Then<'a> {
    blocks: [&'a Tensor; 5],
    training: bool,
    hyper: [f64; 2],
}

/// Partial sums per (channel, chunk): of x (forward) or of g and g * (x - mean) (backward),
/// then the per-channel finalize `then` over them: in the same launch where the device can
/// (Note [Folded finalize]), else in a launch of its own. Returns the partials.
/// With `relu` (backward only), g is zeroed where the forward's output was <= 0 (a NaN output passes it).
/// With `counter` (forward only), the launch also adds 1 to it.
fn reduce(
    x: &Tensor,
    g: Option<&Tensor>,
    stats: Option<&Tensor>,
    sh: &Shape,
    (relu, counter): (bool, Option<&Tensor>),
    then: Then<'_>,
) -> Result<Tensor> {
    let (chunks, len) = sh.chunks();
    let backward = g.is_some();
    // The forward's extra row holds each channel's shift.
    let rows = chunks * sh.c + if backward { 0 } else { sh.c };
    let part = Tensor::empty(&[rows, 2], DType::F32, x.device())?;
    let pass = |finalize| BatchNormPass::Reduce {
        backward,
        vec4: sh.vec4,
        relu: relu && backward,
        half: x.dtype() == DType::F16,
        count: counter.is_some() && !backward,
        finalize,
    };
    let fold = folds(x.device(), sh.c, pass(true).bindings());
    let mut imm = vec![
        u32_of(OP, sh.c)?,
        u32_of(OP, sh.s)?,
        u32_of(OP, sh.m)?,
        u32_of(OP, len)?,
        u32_of(OP, x.layout().offset / sh.unit)?,
        u32_of(OP, g.map_or(0, |g| g.layout().offset / sh.unit))?,
        u32_of(OP, stats.map_or(0, |s| s.layout().offset))?,
        u32_of(OP, chunks * sh.c)?,
        0,
        u32_of(OP, counter.map_or(0, |t| t.layout().offset))?,
        0,
        0,
    ];
    imm.extend(finalize_immediates(&then, chunks, sh)?);
    let mut blocks = vec![&x.storage.block];
    if let (Some(g), Some(stats)) = (g, stats) {
        blocks.push(&g.storage.block);
        blocks.push(&stats.storage.block);
    }
    blocks.push(&part.storage.block);
    if let (Some(counter), false) = (counter, backward) {
        blocks.push(&counter.storage.block);
    }
    if fold {
        blocks.extend(then.blocks.iter().map(|t| &t.storage.block));
    }
    launch_groups(
        Kernel::BatchNorm(pass(fold)),
        &blocks,
        &imm,
        (u32_of(OP, sh.c)?, u32_of(OP, chunks)?, 1),
    )?;
    if !fold {
        finalize(backward, &part, then, chunks, sh)?;
    }
    Ok(part)
}

/// Whether the partial sums of `c` channels on `device` take the finalize in their launch:
/// a GPU with `bindings` storage buffers a stage, at most `ARRIVALS` channels, and not turned
/// off with `force_variant("batch norm finalize", "launch")` (for measuring both).
fn folds(device: &crate::Device, c: usize, bindings: u32) -> bool {
    let Some(info) = device.adapter_info() else {
        return false;
    };
    c <= crate::kernels::ARRIVALS
        && bindings <= info.limits.max_storage_buffers_per_shader_stage
        && crate::kernels::tune::forced_name("batch norm finalize").as_deref() != Some("launch")
}

/// The finalize's immediates (`Fin` in `shaders/batch_norm_fin.wgsl`, then a pad): channels,
/// chunks, elements per channel, eps, momentum, training, the offsets of b1..b5.
fn finalize_immediates(then: &Then<'_>, chunks: usize, sh: &Shape) -> Result<Vec<u32>> {
    let [momentum, eps] = then.hyper;
    let mut imm = vec![
        u32_of(OP, sh.c)?,
        u32_of(OP, chunks)?,
        f32_bits(sh.m_elems as f64),
        f32_bits(eps),
        f32_bits(momentum),
        then.training as u32,
    ];
    for t in then.blocks {
        imm.push(u32_of(OP, t.layout().offset)?);
    }
    imm.push(0);
    Ok(imm)
}

/// out = x * co[0] + co[1] (forward) or g * co[0] + x * co[1] + co[2] (backward), per channel.
/// With `relu`: the forward clamps at zero; the backward masks g where the forward's output,
/// recomputed from `stats` (`Some` exactly then), was <= 0.
fn apply(
    x: &Tensor,
    g: Option<&Tensor>,
    co: &Tensor,
    co_off: usize,
    sh: &Shape,
    relu: bool,
    stats: Option<&Tensor>,
) -> Result<Tensor> {
    let out = Tensor::empty(x.shape(), x.dtype(), x.device())?;
    let units = x.numel() / sh.unit;
    let imm = [
        u32_of(OP, units)?,
        u32_of(OP, sh.c)?,
        u32_of(OP, sh.s)?,
        u32_of(OP, x.layout().offset / sh.unit)?,
        u32_of(OP, g.map_or(0, |g| g.layout().offset / sh.unit))?,
        u32_of(OP, co.layout().offset + co_off)?,
        u32_of(OP, stats.map_or(0, |t| t.layout().offset))?,
        0,
        0,
        0,
        0,
        0,
    ];
    let kernel = Kernel::BatchNorm(BatchNormPass::Apply {
        backward: g.is_some(),
        vec4: sh.vec4,
        relu,
        half: x.dtype() == DType::F16,
    });
    let mut blocks = vec![&x.storage.block, &co.storage.block, &out.storage.block];
    if let Some(g) = g {
        blocks.push(&g.storage.block);
        if let (true, Some(stats)) = (relu, stats) {
            blocks.push(&stats.storage.block);
        }
    }
    launch(kernel, &blocks, &imm, units as u64)?;
    Ok(out)
}

/// The per-channel pass in a launch of its own, over the partials `part` (or, in evaluation,
/// the statistics, with no chunks): `shaders/batch_norm_finalize.wgsl`.
fn finalize(
    backward: bool,
    part: &Tensor,
    then: Then<'_>,
    chunks: usize,
    sh: &Shape,
) -> Result<()> {
    let imm = finalize_immediates(&then, chunks, sh)?;
    let storage: Vec<_> = std::iter::once(part)
        .chain(then.blocks)
        .map(|t| &t.storage.block)
        .collect();
    launch(
        Kernel::BatchNorm(BatchNormPass::Finalize { backward }),
        &storage,
        &imm,
        sh.c as u64,
    )
}

#[allow(clippy::too_many_arguments)]
fn fused(
    x: &Tensor,
    running: Option<(&Tensor, &Tensor)>,
    weight: &Tensor,
    bias: &Tensor,
    training: bool,
    [momentum, eps]: [f64; 2],
    relu: bool,
    counter: Option<&Tensor>,
) -> Result<Tensor> {
    // The forward's contiguous input and statistics, for the backward builder (which is given
    // only the output).
    let forward_state = std::cell::RefCell::new(None);
    let node = if relu {
        "NativeBatchNormReluBackward0"
    } else {
        "NativeBatchNormBackward0"
    };
    crate::graph::record(
        node,
        &[x, weight, bias],
        || {
            let x = x.contiguous()?;
            let sh = Shape::of(&x, None);
            let stats = Tensor::empty(&[4, sh.c], DType::F32, x.device())?;
            // Training without running statistics writes the update into scratch.
            let scratch;
            let (rm, rv) = match running {
                Some(r) => r,
                None => {
                    scratch = Tensor::zeros(&[2, sh.c], DType::F32, x.device())?;
                    (&scratch, &scratch)
                }
            };
            let then = Then {
                blocks: [weight, bias, rm, rv, &stats],
                training,
                hyper: [momentum, eps],
            };
            match training {
                true => drop(reduce(&x, None, None, &sh, (false, counter), then)?),
                false => finalize(false, &stats, then, 0, &sh)?,
            }
            if let Some(counter) = counter {
                counter.bump_version();
            }
            if training {
                if let Some((rm, rv)) = running {
                    rm.bump_version();
                    rv.bump_version();
                }
            }
            let y = apply(&x, None, &stats, 2 * sh.c, &sh, relu, None)?;
            *forward_state.borrow_mut() = Some((x, stats));
            Ok(y)
        },
        |_| {
            let (x, stats) = forward_state
                .borrow_mut()
                .take()
                .expect("the forward leaves its statistics");
            let xs = crate::graph::save(&x)?;
            let ss = crate::graph::save(&stats)?;
            Ok(Box::new(move |g: &Tensor, needs: &[bool]| {
                let x = xs.get()?;
                let stats = ss.get()?;
                // The gradient in the input's dtype (the output's), contiguous.
                let g = g.to_dtype(x.dtype())?.contiguous()?;
                let sh = Shape::of(&x, Some(&g));
                let c = sh.c;
                let gw = Tensor::empty(&[c], DType::F32, x.device())?;
                let gb = Tensor::empty(&[c], DType::F32, x.device())?;
                let coef = Tensor::empty(&[3, c], DType::F32, x.device())?;
                let then = Then {
                    blocks: [&stats, &stats, &gw, &gb, &coef],
                    training,
                    hyper: [0.0, 0.0],
                };
                drop(reduce(&x, Some(&g), Some(&stats), &sh, (relu, None), then)?);
                let gx = needs[0]
                    .then(|| apply(&x, Some(&g), &coef, 0, &sh, relu, Some(&stats)))
                    .transpose()?;
                Ok(vec![gx, needs[1].then_some(gw), needs[2].then_some(gb)])
            }) as crate::graph::BackwardFn)
        },
    )
}
