//! `scaled_dot_product_attention` with PyTorch's semantics: q `[..., L, E]`, k `[..., S, E]`,
//! v `[..., S, Ev]` with the same leading dims, an optional mask broadcastable to
//! `[..., L, S]` (bool: `true` attends; float: added to the scores), `is_causal` (query i sees
//! keys j <= i), dropout on the probabilities from the device generator, and `scale` (default
//! `1 / sqrt(E)`). A row whose every key is masked gives zeros, as PyTorch's safe softmax does.
//!
//! On a GPU, head dims up to 128 run the flash-attention kernels (`kernels/attention.rs`):
//! the forward pass saves only the output and one log-sum-exp per row, and the backward pass
//! recomputes the probabilities tile by tile, so no `L x S` matrix is ever allocated. The
//! dropout mask is a pure function of (seed, offset, position) and is replayed, not stored.
//! Everything else (the CPU device, wider heads) takes the composite: the scores, a safe
//! softmax, dropout drawn at the same counters, and the product with v, through autograd.
//! The composite on the CPU device is the reference the kernels are tested against.

use super::u32_of;
use crate::device::DeviceBlock;
use crate::kernels::{launch_groups, FlashAttnKernel, FlashPass, Kernel};
use crate::tensor::{DType, Tensor};
use crate::{Error, Result};

const OP: &str = "scaled_dot_product_attention";

/// What the checks settle about one call.
#[derive(Clone)]
struct Plan {
    lead: Vec<usize>,
    lq: usize,
    lk: usize,
    d: usize,
    dv: usize,
    scale: f64,
    causal: bool,
    dropout: f64,
}

/// `torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal,
/// scale)`. Returns `[..., L, Ev]` in q's dtype. Under autocast it runs in the autocast dtype,
/// as PyTorch's lower-precision ops do. A float mask gets no gradient.
pub fn scaled_dot_product_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    attn_mask: Option<&Tensor>,
    dropout_p: f64,
    is_causal: bool,
    scale: Option<f64>,
) -> Result<Tensor> {
    if let Some(cast) = super::autocast::lower(OP, &[q, k, v])? {
        return super::autocast::suspended(|| {
            attention(
                &cast[0], &cast[1], &cast[2], attn_mask, dropout_p, is_causal, scale,
            )
        });
    }
    attention(q, k, v, attn_mask, dropout_p, is_causal, scale)
}

fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    attn_mask: Option<&Tensor>,
    dropout_p: f64,
    is_causal: bool,
    scale: Option<f64>,
) -> Result<Tensor> {
    let plan = check(q, k, v, attn_mask, dropout_p, is_causal, scale)?;
    let mask = attn_mask.map(additive_mask).transpose()?;
    let rows: usize = plan.lead.iter().product();
    if rows * plan.lq == 0 || plan.lk == 0 {
        // No queries, or no keys to attend (every row fully masked): zeros, as PyTorch.
        let mut shape = plan.lead.clone();
        shape.extend([plan.lq, plan.dv]);
        return Tensor::zeros(&shape, q.dtype(), q.device());
    }
    // Dropout's counters: one per score, drawn now, replayed by backward.
    let rng =
        (plan.dropout > 0.0).then(|| q.device().advance_rng((rows * plan.lq * plan.lk) as u64));
    if flash_fits(q, k, v, &plan) {
        flash(q, k, v, mask.as_ref(), &plan, rng)
    } else {
        composite(q, k, v, mask.as_ref(), &plan, rng)
    }
}

/// PyTorch's checks, with its wording where it has one.
fn check(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    dropout_p: f64,
    is_causal: bool,
    scale: Option<f64>,
) -> Result<Plan> {
    for (name, t) in [("key", k), ("value", v)] {
        if t.dtype() != q.dtype() {
            return Err(Error::InvalidArgument {
                op: OP,
                msg: format!(
                    "Expected query, key, and value to have the same dtype, but got query.dtype: \
                     {} {name}.dtype: {} instead.",
                    q.dtype(),
                    t.dtype()
                ),
            });
        }
        same_device(q, t)?;
    }
    if !q.dtype().is_float() {
        return Err(Error::UnsupportedDType {
            op: OP,
            dtype: q.dtype(),
            why: "(query, key and value must be floating point)".into(),
        });
    }
    if q.rank() < 2 || k.rank() != q.rank() || v.rank() != q.rank() {
        return Err(Error::InvalidArgument {
            op: OP,
            msg: format!(
                "expected query, key and value of one rank, at least 2, got {:?}, {:?} and {:?}",
                q.shape(),
                k.shape(),
                v.shape()
            ),
        });
    }
    let r = q.rank();
    let lead = q.shape()[..r - 2].to_vec();
    let (lq, d) = (q.shape()[r - 2], q.shape()[r - 1]);
    let (lk, dk) = (k.shape()[r - 2], k.shape()[r - 1]);
    let (lv, dv) = (v.shape()[r - 2], v.shape()[r - 1]);
    if k.shape()[..r - 2] != lead[..] || v.shape()[..r - 2] != lead[..] || dk != d || lv != lk {
        return Err(Error::ShapeMismatch {
            op: OP,
            lhs: q.shape().to_vec(),
            rhs: if dk != d || k.shape()[..r - 2] != lead[..] {
                k.shape().to_vec()
            } else {
                v.shape().to_vec()
            },
        });
    }
    if !(0.0..1.0).contains(&dropout_p) {
        return Err(Error::InvalidArgument {
            op: OP,
            msg: format!("dropout probability has to be between 0 and 1, but got {dropout_p}"),
        });
    }
    if let Some(m) = mask {
        if is_causal {
            return Err(Error::InvalidArgument {
                op: OP,
                msg: "_scaled_dot_product_attention: Explicit attn_mask should not be set when \
                      is_causal=True"
                    .into(),
            });
        }
        if m.dtype() != DType::Bool && m.dtype() != q.dtype() {
            return Err(Error::InvalidArgument {
                op: OP,
                msg: format!(
                    "Expected attn_mask dtype to be bool or float or to match query dtype, but \
                     got attn_mask.dtype: {} and query.dtype: {} instead.",
                    m.dtype(),
                    q.dtype()
                ),
            });
        }
        same_device(q, m)?;
        let mut full = lead.clone();
        full.extend([lq, lk]);
        if m.broadcast_to(&full).is_err() {
            return Err(Error::ShapeMismatch {
                op: OP,
                lhs: m.shape().to_vec(),
                rhs: full,
            });
        }
    }
    let scale = scale.unwrap_or(1.0 / (d as f64).sqrt());
    if !scale.is_finite() {
        return Err(Error::InvalidArgument {
            op: OP,
            msg: format!("scale must be finite, got {scale}"),
        });
    }
    Ok(Plan {
        lead,
        lq,
        lk,
        d,
        dv,
        scale,
        causal: is_causal,
        dropout: dropout_p,
    })
}

fn same_device(q: &Tensor, t: &Tensor) -> Result<()> {
    match t.device().spec() == q.device().spec() {
        true => Ok(()),
        false => Err(Error::DeviceMismatch {
            op: OP,
            expected: q.device().spec().into(),
            got: t.device().spec().into(),
        }),
    }
}

/// The mask as f32 scores to add: a bool mask's `false` becomes -inf. Its shape is the
/// mask's own (broadcast dims stay 1), so nothing `L x S`-sized is made that was not there.
fn additive_mask(m: &Tensor) -> Result<Tensor> {
    if m.dtype() == DType::Bool {
        let zero = Tensor::zeros(&[], DType::F32, m.device())?;
        let neg = Tensor::full(&[], f64::NEG_INFINITY, DType::F32, m.device())?;
        return super::where_(m, &zero, &neg);
    }
    m.detach().to_dtype(DType::F32)
}

/// The composite: scores, safe softmax, dropout at the same counters as the kernels, product.
/// Every step records autograd, so its gradient is autograd's.
fn composite(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    plan: &Plan,
    rng: Option<(u64, u64)>,
) -> Result<Tensor> {
    let dev = q.device();
    let r = q.rank() as isize;
    let mut s = q
        .matmul(&k.transpose(r - 2, r - 1)?)?
        .mul_scalar(plan.scale)?;
    if let Some(m) = mask {
        s = s.add(&m.to_dtype(s.dtype())?)?;
    }
    if plan.causal {
        let (lq, lk) = (plan.lq, plan.lk);
        let above: Vec<f32> = (0..lq * lk)
            .map(|e| {
                if e % lk > e / lk {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        let causal = Tensor::from_slice(&above, &[lq, lk], dev)?.to_dtype(s.dtype())?;
        s = s.add(&causal)?;
    }
    // Safe softmax: a row of -inf scores gives zeros, not NaN (and a zero gradient).
    let dead = s.detach().amax(&[-1], true)?.eq_scalar(f64::NEG_INFINITY)?;
    let probs = s
        .masked_fill(&dead, 0.0)?
        .softmax(-1)?
        .masked_fill(&dead, 0.0)?;
    let probs = match rng {
        Some(state) => {
            let shape = probs.shape().to_vec();
            let u = super::random::draw_at(&shape, DType::F32, dev, false, (0.0, 1.0), state)?;
            let keep = u
                .ge_scalar(plan.dropout)?
                .to_dtype(probs.dtype())?
                .mul_scalar(1.0 / (1.0 - plan.dropout))?;
            probs.mul(&keep)?
        }
        None => probs,
    };
    probs.matmul(v)
}

/// Whether the flash kernels take this call: a GPU whose workgroups and immediates they fit,
/// head dims up to 128, f32 or f16, and every index within 32 bits. Not on wgpu's GL backend:
/// its llvmpipe takes about 50 s to compile each of these kernels cold (lavapipe, the same
/// LLVM through Vulkan, about 1 s), so GL runs the composite, as it does without the 128-tile
/// products.
fn flash_fits(q: &Tensor, k: &Tensor, v: &Tensor, plan: &Plan) -> bool {
    let Some(info) = q.device().adapter_info() else {
        return false;
    };
    let rows: usize = plan.lead.iter().product();
    let counters = rows
        .checked_mul(plan.lq)
        .and_then(|n| n.checked_mul(plan.lk));
    info.backend != wgpu::Backend::Gl
        && FlashAttnKernel::for_dims(FlashPass::Forward, q.dtype(), plan.d, plan.dv).is_some()
        && matches!(q.dtype(), DType::F32 | DType::F16)
        && info.limits.max_immediate_size >= 128
        && info.limits.max_storage_buffers_per_shader_stage >= 8
        && info.limits.max_compute_workgroup_storage_size >= 17 * 1024
        && rows <= info.limits.max_compute_workgroups_per_dimension as usize
        && counters.is_some_and(|c| c <= u32::MAX as usize)
        && [q, k, v]
            .iter()
            .all(|t| t.storage.block.block_size() / 2 <= u32::MAX as u64)
}

/// A tensor's leading strides as (b, h) of the flattened rows `n = b * heads + h`, for a
/// `[lead..., rows, cols]` view with up to two leading dims.
fn lead_strides(t: &Tensor, lead: usize) -> (usize, usize) {
    let s = t.strides();
    match lead {
        0 => (0, 0),
        1 => (s[0], 0),
        _ => (s[0], s[1]),
    }
}

/// q, k and v (and the mask) as the kernels read them: at most two leading dims (more are
/// flattened into the first, by a view where the strides allow, else a copy) and a unit-stride
/// last dim (else a copy).
fn kernel_view(t: &Tensor, lead: &[usize]) -> Result<Tensor> {
    let r = t.rank();
    let t = if lead.len() > 2 {
        let outer: usize = lead[..lead.len() - 1].iter().product();
        let mut shape = vec![outer as isize, lead[lead.len() - 1] as isize];
        shape.extend(t.shape()[r - 2..].iter().map(|&n| n as isize));
        t.reshape(&shape)?
    } else {
        t.clone()
    };
    match t.strides().last() == Some(&1) || t.shape().last() == Some(&1) {
        true => Ok(t),
        false => t.contiguous(),
    }
}

/// Whether the passes launch their row blocks along x, in order: on a CPU adapter,
/// where heads first with the heaviest blocks first ran a quarter slower (lavapipe, B1 H2
/// T128: llvmpipe's two threads took the heavy blocks together).
fn blocks_first(q: &Tensor) -> bool {
    crate::kernels::tune::on_cpu_adapter(q.device())
}

/// Invocations a row for `pass`'s SIMT kernel (`FlashAttnKernel::split`): as `forced_per_pass`
/// ("flash split") where forced, else SPLIT_DEFAULT on a GPU with subgroups and 1 elsewhere (a
/// CPU adapter, whose rows gain nothing from fewer registers, or an adapter without
/// subgroups). A split the kernel cannot take falls back to 1.
fn split(q: &Tensor, pass: FlashPass) -> u32 {
    if let Some(s) = forced_per_pass("flash split", pass) {
        return s;
    }
    let subgroups = q
        .device()
        .adapter_info()
        .is_some_and(|info| info.features.subgroups);
    match subgroups && !blocks_first(q) {
        true => SPLIT_DEFAULT[pass_index(pass)],
        false => 1,
    }
}

/// Rows a workgroup for `pass`'s SIMT kernel: as `forced_per_pass` ("flash rows") where
/// forced, else ROWS_DEFAULT on a GPU and 64 on a CPU adapter.
fn rows(q: &Tensor, pass: FlashPass) -> u32 {
    match forced_per_pass("flash rows", pass) {
        Some(r) => r,
        None if blocks_first(q) => 64,
        None => ROWS_DEFAULT[pass_index(pass)],
    }
}

/// Rows of a staged tile for `pass`'s SIMT kernel: as `forced_per_pass` ("flash tile") where
/// forced, else TILE_DEFAULT on a GPU and the kernel's default (32; 16 for the widest heads)
/// on a CPU adapter, whose compile time and speed were measured there.
fn tile(q: &Tensor, pass: FlashPass) -> u32 {
    match forced_per_pass("flash tile", pass) {
        Some(t) => t,
        None if blocks_first(q) => 32,
        None => TILE_DEFAULT[pass_index(pass)],
    }
}

/// Rows of a staged tile on GPUs, by pass (forward, dQ, dK/dV). H200, B8 H12 T1024 D64 causal
/// f32, TFLOP/s (docs/lab/attention.md): the forward 14.7 at 32 rows, 16.1 at 16, 16.75 at 8,
/// 10.4 at 64; forward + backward 14.4 with every pass at 32, 15.25 at 16, 15.5 with the
/// forward at 8, 10.2 at 64. NVIDIA's compiler unrolls the forward's loops over a tile (255
/// registers, 5911 instructions at 32 rows); the backward passes keep theirs rolled and gain
/// less (dQ or dK/dV alone at 16: +1.6%).
const TILE_DEFAULT: [u32; 3] = [8, 16, 16];

/// `force_variant(family, ..)`'s number for `pass` (or `KILN_FORCE_VARIANT`'s), for comparing
/// kernels by hand: one for every pass ("2"), or one each for the forward, dQ and dK/dV
/// passes ("2;2;4"). A name that is no number is 0, which no kernel takes.
fn forced_per_pass(family: &str, pass: FlashPass) -> Option<u32> {
    let forced = crate::kernels::tune::forced_name(family)?;
    let each: Vec<&str> = forced.split(';').collect();
    let at = pass_index(pass).min(each.len() - 1);
    Some(each[at].trim().parse().unwrap_or(0))
}

/// The index of `pass` in the per-pass tables: forward, dQ, dK/dV.
fn pass_index(pass: FlashPass) -> usize {
    match pass {
        FlashPass::Forward => 0,
        FlashPass::BackwardDq => 1,
        FlashPass::BackwardDkDv => 2,
    }
}

/// Rows a workgroup on GPUs, by pass (forward, dQ, dK/dV). H200, B8 H12 T1024 D64 causal
/// f32, TFLOP/s (docs/lab/attention.md): the forward 13.0 at 64, 14.7 at 128 (each staged
/// tile serves twice the rows); forward + backward with the backward passes at 128 fell from
/// 13.9 to 11.2 (dK/dV alone at 128: 11.5).
const ROWS_DEFAULT: [u32; 3] = [128, 64, 64];

/// Invocations a row on GPUs with subgroups, by pass (forward, dQ, dK/dV). H200, B8 H12 T1024
/// D64 causal f32, TFLOP/s (docs/lab/attention.md): the forward 13.0 at 1, 12.3 at 2, 10.6 at
/// 4; forward + backward 7.8 with every pass at 1, 13.4 at 2 (10.3 at 4). The backward passes
/// hold 192 and 256 registers a row: two invocations a row halve that, and an SM holds twice
/// the rows.
const SPLIT_DEFAULT: [u32; 3] = [1, 2, 2];

/// The immediates every pass shares (`shaders/flash_attn_common.wgsl`'s `Params`).
fn params(
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    mask: Option<&Tensor>,
    plan: &Plan,
    rng: Option<(u64, u64)>,
    token_major: bool,
) -> Result<Vec<u32>> {
    let lead = q.rank() - 2;
    let rows: usize = q.shape()[..lead].iter().product();
    let heads = if lead == 2 { q.shape()[1] } else { 1 };
    let mut imm = vec![
        u32_of(OP, rows)?,
        u32_of(OP, heads)?,
        u32_of(OP, plan.lq)?,
        u32_of(OP, plan.lk)?,
        u32_of(OP, plan.d)?,
        u32_of(OP, plan.dv)?,
    ];
    for t in [q, k, v] {
        let (sb, sh) = lead_strides(t, lead);
        imm.extend([
            u32_of(OP, sb)?,
            u32_of(OP, sh)?,
            u32_of(OP, t.strides()[lead])?,
        ]);
    }
    for t in [q, k, v] {
        imm.push(u32_of(OP, t.layout.offset)?);
    }
    let mut flags = plan.causal as u32;
    match mask {
        Some(m) => {
            let (sb, sh) = lead_strides(m, lead);
            let st = m.strides();
            for x in [sb, sh, st[lead], st[lead + 1], m.layout.offset] {
                imm.push(u32_of(OP, x)?);
            }
            flags |= 2;
        }
        None => imm.extend([0; 5]),
    }
    let (seed, offset) = rng.unwrap_or((0, 0));
    if rng.is_some() {
        flags |= 4;
    }
    if token_major {
        flags |= 8;
    }
    imm.extend([
        flags,
        (plan.scale as f32).to_bits(),
        (plan.dropout as f32).to_bits(),
        seed as u32,
        (seed >> 32) as u32,
        offset as u32,
        0,
        0,
        0,
    ]);
    Ok(imm)
}

/// The fused path: one forward launch, and a node whose backward runs the two backward passes.
fn flash(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    plan: &Plan,
    rng: Option<(u64, u64)>,
) -> Result<Tensor> {
    let stats_cell = std::cell::RefCell::new(None);
    let forward = || -> Result<Tensor> {
        let (o, stats) = flash_forward(q, k, v, mask, plan, rng)?;
        *stats_cell.borrow_mut() = Some(stats);
        Ok(o)
    };
    crate::graph::record(
        "ScaledDotProductFlashAttentionBackward0",
        &[q, k, v],
        forward,
        |out| {
            let saved: Vec<_> = [q, k, v]
                .iter()
                .map(|t| crate::graph::save(t))
                .collect::<Result<_>>()?;
            let o = crate::graph::save_output(out, "ScaledDotProductFlashAttentionBackward0")?;
            let stats = stats_cell.borrow_mut().take().ok_or(Error::Autograd {
                op: OP,
                msg: "the forward pass left no log-sum-exps".into(),
            })?;
            let stats = crate::graph::save(&stats)?;
            let mask = mask.cloned();
            let plan = plan.clone();
            Ok(Box::new(move |g: &Tensor, needs: &[bool]| {
                let (q, k, v) = (saved[0].get()?, saved[1].get()?, saved[2].get()?);
                let grads = flash_backward(
                    (&q, &k, &v),
                    (&o.get()?, g, &stats.get()?),
                    mask.as_ref(),
                    &plan,
                    rng,
                )?;
                Ok(grads
                    .into_iter()
                    .zip(needs)
                    .map(|(g, &need)| need.then_some(g))
                    .collect())
            }))
        },
    )
}

/// q, k, v and the mask as the kernels read them, and the immediates every pass shares.
struct Bound {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Option<Tensor>,
    imm: Vec<u32>,
    rows: usize,
    /// Whether the outputs (and the output's gradient) are laid out [b, len, heads, width]
    /// (`shaders/flash_attn_common.wgsl`'s `row_out`): where q's heads lie closer in memory
    /// than its positions, as in a transformer's q split from one [b, len, 3 x heads x d]
    /// projection. PyTorch's flash attention allocates its output as q is laid out, so that
    /// `y.transpose(1, 2).contiguous()` before the output projection copies nothing (a GPT-2
    /// step kept twelve 12 MiB copies alive to its peak), and its q, k and v gradients too.
    token_major: bool,
    /// The workgroup memory of a device whose f16 passes may run on cooperative matrices.
    coop_limit: Option<u32>,
}

impl Bound {
    fn new(
        (q, k, v): (&Tensor, &Tensor, &Tensor),
        mask: Option<&Tensor>,
        plan: &Plan,
        rng: Option<(u64, u64)>,
    ) -> Result<Bound> {
        let (q, k, v) = (
            kernel_view(q, &plan.lead)?,
            kernel_view(k, &plan.lead)?,
            kernel_view(v, &plan.lead)?,
        );
        let mask = mask.map(|m| full_mask(m, plan, &q)).transpose()?;
        let token_major = plan.lead.len() == 2 && q.strides()[1] < q.strides()[2];
        let imm = params((&q, &k, &v), mask.as_ref(), plan, rng, token_major)?;
        let rows = plan.lead.iter().product();
        let coop_limit = crate::kernels::coop_f16(q.device())
            .filter(|_| !simt_forced() && rows_of_eight((&q, &k, &v), plan))
            .map(|info| info.limits.max_compute_workgroup_storage_size);
        Ok(Bound {
            q,
            k,
            v,
            mask,
            imm,
            rows,
            token_major,
            coop_limit,
        })
    }

    /// A new output of `len` rows of `width` per (b, h), in the kernels' layout: contiguous
    /// [lead..., len, width], or token-major viewed as [b, heads, len, width].
    fn empty_output(&self, plan: &Plan, len: usize, width: usize) -> Result<Tensor> {
        let (dtype, dev) = (self.q.dtype(), self.q.device());
        if self.token_major {
            let (b, h) = (plan.lead[0], plan.lead[1]);
            return Tensor::empty(&[b, len, h, width], dtype, dev)?.transpose(1, 2);
        }
        let mut shape = plan.lead.clone();
        shape.extend([len, width]);
        Tensor::empty(&shape, dtype, dev)
    }

    /// `t` (shaped as the output) in the kernels' output layout from its first element:
    /// itself where it is, else a copy (the kernels address outputs without an offset).
    fn as_output(&self, t: &Tensor) -> Result<Tensor> {
        // The memory order the kernels address: [b, len, heads, width] when token-major.
        let memory = match self.token_major {
            true => t.transpose(1, 2)?,
            false => t.clone(),
        };
        if t.layout.offset == 0 && memory.is_contiguous() {
            return Ok(t.clone());
        }
        let copy = super::copy(&memory)?;
        match self.token_major {
            true => copy.transpose(1, 2),
            false => Ok(copy),
        }
    }

    /// Runs `pass` with q, k, v, the mask and then `outputs` bound, a workgroup per 64 of
    /// `along` rows and per (b, h). Without a mask q's block takes the mask's binding: the
    /// kernels read it only under the mask's flag.
    fn launch(
        &self,
        pass: FlashPass,
        plan: &Plan,
        outputs: &[&DeviceBlock],
        along: usize,
    ) -> Result<()> {
        let simt = FlashAttnKernel::for_dims(pass, self.q.dtype(), plan.d, plan.dv).ok_or(
            Error::InvalidArgument {
                op: OP,
                msg: "no flash kernel for these head dims".into(),
            },
        )?;
        let simt = simt.with_split(split(&self.q, pass)).unwrap_or(simt);
        let simt = simt.with_rows(rows(&self.q, pass)).unwrap_or(simt);
        let simt = simt.with_tile(tile(&self.q, pass)).unwrap_or(simt);
        let kernel = match blocks_first(&self.q) {
            true => simt.blocks_first(),
            false => self
                .coop_limit
                .and_then(|limit| simt.on_coop(limit))
                .unwrap_or(simt),
        };
        let mask = self.mask.as_ref().unwrap_or(&self.q);
        let mut blocks = vec![
            &self.q.storage.block,
            &self.k.storage.block,
            &self.v.storage.block,
            &mask.storage.block,
        ];
        blocks.extend_from_slice(outputs);
        let (row_blocks, heads) = (
            u32_of(OP, along.div_ceil(kernel.rows as usize))?,
            u32_of(OP, self.rows)?,
        );
        // The (b, h) along x and the row blocks along y, the heaviest first under causality;
        // on a CPU adapter the blocks along x (`flash_attn_common.wgsl`'s `block_row`).
        let groups = match blocks_first(&self.q) {
            true => (row_blocks, heads, 1),
            false => (heads, row_blocks, 1),
        };
        launch_groups(Kernel::FlashAttn(kernel), &blocks, &self.imm, groups)
    }
}

/// Whether every row of q, k and v starts at a multiple of eight elements and the head dims are
/// multiples of eight: the cooperative-matrix kernels read and write rows as 16-byte vectors.
fn rows_of_eight((q, k, v): (&Tensor, &Tensor, &Tensor), plan: &Plan) -> bool {
    let lead = q.rank() - 2;
    plan.d.is_multiple_of(8)
        && plan.dv.is_multiple_of(8)
        && [q, k, v].iter().all(|t| {
            let (sb, sh) = lead_strides(t, lead);
            [sb, sh, t.strides()[lead], t.layout.offset]
                .iter()
                .all(|x| x.is_multiple_of(8))
        })
}

/// Whether `KILN_FLASH_SIMT` (read once) keeps f16 attention off cooperative matrices, for
/// comparing the two kernels on one device.
fn simt_forced() -> bool {
    static FORCED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FORCED.get_or_init(|| std::env::var_os("KILN_FLASH_SIMT").is_some())
}

fn flash_forward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    plan: &Plan,
    rng: Option<(u64, u64)>,
) -> Result<(Tensor, Tensor)> {
    let bound = Bound::new((q, k, v), mask, plan, rng)?;
    let o = bound.empty_output(plan, plan.lq, plan.dv)?;
    let stats = Tensor::empty(&[2, bound.rows, plan.lq], DType::F32, q.device())?;
    let outputs = [&o.storage.block, &stats.storage.block];
    bound.launch(FlashPass::Forward, plan, &outputs, plan.lq)?;
    Ok((o, stats))
}

/// The additive mask broadcast to the kernels' `[lead..., L, S]` (stride 0 where it repeats),
/// flattened as q's view is.
fn full_mask(m: &Tensor, plan: &Plan, qv: &Tensor) -> Result<Tensor> {
    let mut full = plan.lead.clone();
    full.extend([plan.lq, plan.lk]);
    let b = m.broadcast_to(&full)?;
    if plan.lead.len() <= 2 {
        return Ok(b);
    }
    let mut shape: Vec<isize> = qv.shape()[..2].iter().map(|&n| n as isize).collect();
    shape.extend([plan.lq as isize, plan.lk as isize]);
    b.reshape(&shape)
}

fn flash_backward(
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    (o, g, stats): (&Tensor, &Tensor, &Tensor),
    mask: Option<&Tensor>,
    plan: &Plan,
    rng: Option<(u64, u64)>,
) -> Result<Vec<Tensor>> {
    let bound = Bound::new((q, k, v), mask, plan, rng)?;
    let g = bound.as_output(&g.to_dtype(q.dtype())?)?;
    let o = bound.as_output(o)?;
    let dq = bound.empty_output(plan, plan.lq, plan.d)?;
    let dk = bound.empty_output(plan, plan.lk, plan.d)?;
    let dv = bound.empty_output(plan, plan.lk, plan.dv)?;
    let (gb, sb) = (&g.storage.block, &stats.storage.block);
    let outputs = [&o.storage.block, gb, sb, &dq.storage.block];
    bound.launch(FlashPass::BackwardDq, plan, &outputs, plan.lq)?;
    let outputs = [gb, sb, &dk.storage.block, &dv.storage.block];
    bound.launch(FlashPass::BackwardDkDv, plan, &outputs, plan.lk)?;
    Ok(vec![dq, dk, dv])
}
