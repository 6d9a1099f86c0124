//! Optimizers in the image of `torch.optim`: SGD (momentum, dampening, nesterov, weight decay)
//! and Adam/AdamW. State (momentum buffers, Adam's moments) is created on the first `step`, so
//! it shows up in the memory timeline there, as in PyTorch. On a GPU each parameter is updated
//! by one fused kernel (`shaders/optim.wgsl`), and SGD steps up to five parameters of whole
//! vec4s in one launch (`shaders/optim_multi.wgsl`, PyTorch's foreach step); the CPU device
//! composes the same formulas from tensor ops, which makes it the reference the fused kernels
//! are tested against.
//!
//! # What is here
//!
//! `mod.rs` holds the `Optimizer` trait, the fused launch and state-dict staging; `sgd.rs` and
//! `adam.rs` the two optimizers. On a GPU each parameter is updated by one fused kernel (f32 or
//! f16 storage, f32 math; state in the parameter's dtype, as PyTorch keeps it), and SGD updates up
//! to six parameters of vec4s per launch (five on GL, whose llvmpipe binds 16 storage buffers; a
//! partial last vec4, such as a 10-element bias, is read whole and its elements past the count
//! written back as read). Hyperparameters are checked as `torch.optim` checks them, at
//! construction and at every step; `state_dict`/`load_state_dict` carry PyTorch's `param_groups`
//! and are staged before anything changes.

mod adam;
mod sgd;

pub use adam::Adam;
pub use sgd::Sgd;

use crate::alloc::MemoryCategory;
use crate::kernels::{launch, Kernel, OptimKernel};
use crate::nn::StateDict;
use crate::tensor::{DType, Tensor};
use crate::{no_grad, Error, Result};

/// What every optimizer offers.
pub trait Optimizer {
    /// One update of every parameter that has a gradient.
    fn step(&mut self) -> Result<()>;

    /// The parameters it updates.
    fn params(&self) -> &[Tensor];

    /// Drops (`set_to_none`, PyTorch's default since 2.0) or zeroes every gradient.
    fn zero_grad(&self, set_to_none: bool) -> Result<()> {
        for p in self.params() {
            p.zero_grad(set_to_none)?;
        }
        Ok(())
    }

    /// The state tensors with PyTorch's names (`state.{i}.momentum_buffer`, `exp_avg`, ...).
    fn state_tensors(&self) -> Vec<(String, Tensor)> {
        self.state_dict().tensors
    }

    /// `optimizer.state_dict()`: the state tensors by PyTorch's names (handles, not copies) and
    /// PyTorch's `param_groups` as metadata: `type`, `param_groups.0.params` (`[0, 1, ...]`)
    /// and every hyperparameter as `param_groups.0.{name}`, each float written so that it
    /// parses back to the same bits.
    fn state_dict(&self) -> StateDict;

    /// `optimizer.load_state_dict(state)`: hyperparameters and state tensors (copied onto each
    /// parameter's device and dtype). Everything is checked and staged first (the optimizer
    /// type, the parameter count, every key, shape and hyperparameter): on any error the
    /// optimizer is left exactly as it was.
    fn load_state_dict(&mut self, state: &StateDict) -> Result<()>;
}

/// A hyperparameter check of `torch.optim` (which raises `ValueError`), stricter in one way:
/// values must also be finite, since an infinite or NaN rate silently destroys every parameter.
fn check_hyper(op: &'static str, what: &str, value: f64, ok: bool) -> Result<()> {
    if ok && value.is_finite() {
        return Ok(());
    }
    Err(Error::InvalidArgument {
        op,
        msg: format!("Invalid {what}: {value:?}"),
    })
}

fn invalid(op: &'static str, msg: String) -> Error {
    Error::InvalidArgument { op, msg }
}

/// Writes `x` so that `parse::<f64>()` gives back the same bits (`{:?}` is the shortest
/// round-tripping form).
fn float_text(x: f64) -> String {
    format!("{x:?}")
}

/// The metadata value `param_groups.0.{key}`, parsed.
fn group_value<T: std::str::FromStr>(op: &'static str, state: &StateDict, key: &str) -> Result<T> {
    let full = format!("param_groups.0.{key}");
    let text = state
        .metadata
        .get(&full)
        .ok_or_else(|| invalid(op, format!("missing key {full:?}")))?;
    text.trim()
        .parse()
        .map_err(|_| invalid(op, format!("{full}: cannot parse {text:?}")))
}

/// `[a, b, ...]` of numbers.
fn parse_list<T: std::str::FromStr>(op: &'static str, key: &str, text: &str) -> Result<Vec<T>> {
    let inner = text
        .trim()
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .ok_or_else(|| invalid(op, format!("{key}: expected a list, got {text:?}")))?;
    inner
        .split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(|x| {
            x.parse()
                .map_err(|_| invalid(op, format!("{key}: cannot parse {x:?}")))
        })
        .collect()
}

fn list_text(values: impl IntoIterator<Item = String>) -> String {
    format!("[{}]", values.into_iter().collect::<Vec<_>>().join(", "))
}

/// The checks every optimizer's `load_state_dict` starts with: the type, and one parameter
/// group holding as many parameters as the optimizer has (PyTorch's wording).
fn check_groups(op: &'static str, state: &StateDict, kind: &str, params: usize) -> Result<()> {
    match state.metadata.get("type") {
        Some(t) if t == kind => {}
        Some(t) => {
            return Err(invalid(
                op,
                format!("the state dict is of a {t} optimizer, this one is {kind}"),
            ))
        }
        None => return Err(invalid(op, "missing key \"type\"".into())),
    }
    let ids: Vec<usize> = parse_list(
        op,
        "param_groups.0.params",
        &group_value::<String>(op, state, "params")?,
    )?;
    if ids != (0..params).collect::<Vec<_>>() {
        return Err(invalid(
            op,
            format!("loaded state dict contains a parameter group that doesn't match the size of optimizer's group ({} parameters saved, {params} here)", ids.len()),
        ));
    }
    if let Some(k) = state
        .metadata
        .keys()
        .find(|k| *k != "type" && !k.starts_with("param_groups.0."))
    {
        return Err(invalid(op, format!("unexpected key {k:?}")));
    }
    Ok(())
}

/// Per state name, per parameter, the staged tensor; per parameter, the step count.
type Staged = (Vec<Vec<Option<Tensor>>>, Vec<Option<u64>>);

/// The state tensors of `state`, staged: `slots[name][i]` is a fresh tensor on parameter i's
/// device and dtype. Every key must be `state.{i}.{name}` for a parameter i and one of `names`,
/// with parameter i's shape (`step` entries, 0-d, are returned apart as whole numbers).
fn stage_state(
    op: &'static str,
    state: &StateDict,
    params: &[Tensor],
    names: &[&str],
) -> Result<Staged> {
    let mut slots = vec![vec![None; params.len()]; names.len()];
    let mut steps = vec![None; params.len()];
    for (key, t) in &state.tensors {
        let parsed = key
            .strip_prefix("state.")
            .and_then(|r| r.split_once('.'))
            .and_then(|(i, n)| Some((i.parse::<usize>().ok()?, n)));
        let Some((i, name)) = parsed else {
            return Err(invalid(op, format!("unexpected key {key:?}")));
        };
        let p = params
            .get(i)
            .ok_or_else(|| invalid(op, format!("{key}: there is no parameter {i}")))?;
        if !t.dtype().is_float() {
            return Err(invalid(
                op,
                format!("{key}: expected a float tensor, got {}", t.dtype()),
            ));
        }
        if name == "step" {
            let v = match t.shape() {
                [] | [1] => t.to_f64_vec()?[0],
                s => {
                    return Err(invalid(
                        op,
                        format!("{key}: expected a scalar, got shape {s:?}"),
                    ))
                }
            };
            if !(v >= 0.0 && v.fract() == 0.0 && v < 2f64.powi(53)) {
                return Err(invalid(op, format!("{key}: {v} is not a step count")));
            }
            steps[i] = Some(v as u64);
            continue;
        }
        let Some(slot) = names.iter().position(|n| *n == name) else {
            return Err(invalid(op, format!("unexpected key {key:?}")));
        };
        if t.shape() != p.shape() {
            return Err(invalid(
                op,
                format!(
                    "{key}: shape {:?} does not match the parameter's {:?}",
                    t.shape(),
                    p.shape()
                ),
            ));
        }
        // A fresh tensor, never an alias of the state dict's (the caller may reuse it).
        let staged = no_grad(|| crate::ops::copy(&t.to_device(p.device())?.to_dtype(p.dtype())?))?;
        staged.mark(MemoryCategory::OptimizerState);
        slots[slot][i] = Some(staged);
    }
    Ok((slots, steps))
}

/// Whether the fused kernel can run: every tensor of one float dtype (f32, or f16 with the math
/// in f32), contiguous, on a GPU, 32-bit sized.
fn fusable(tensors: &[&Tensor]) -> bool {
    let dtype = tensors.first().map(|t| t.dtype());
    tensors.iter().all(|t| {
        Some(t.dtype()) == dtype
            && matches!(t.dtype(), DType::F32 | DType::F16)
            && t.is_contiguous()
            && !t.device().is_cpu()
            && t.numel() < u32::MAX as usize
            && t.layout().offset < u32::MAX as usize
    })
}

#[allow(clippy::too_many_arguments)]
fn fused(
    kind: OptimKernel,
    p: &Tensor,
    g: &Tensor,
    m: Option<&Tensor>,
    v: Option<&Tensor>,
    flags: u32,
    floats: [f32; 7],
) -> Result<()> {
    // The widest kernel every count and offset allows: eight f32 a invocation as 64-bit words
    // on a CPU adapter (`words_fit`), else four (vec4 loads), else one.
    let all = [Some(p), Some(g), m, v];
    let fits = |w: usize| {
        p.numel().is_multiple_of(w)
            && all
                .iter()
                .flatten()
                .all(|t| t.layout().offset.is_multiple_of(w))
    };
    let w = if words_fit(p) && fits(8) {
        8
    } else if fits(4) {
        4
    } else {
        1
    };
    let kind = kind.widened(w);
    let off = |t: Option<&Tensor>| t.map_or(0, |t| (t.layout().offset / w) as u32);
    let mut imm = vec![
        (p.numel() / w) as u32,
        (p.layout().offset / w) as u32,
        (g.layout().offset / w) as u32,
        off(m),
        off(v),
        flags,
    ];
    imm.extend(floats.iter().map(|f| f.to_bits()));
    imm.extend([0, 0, 0]);
    let pb = &p.storage.block;
    let mb = m.map_or(pb, |t| &t.storage.block);
    let vb = v.map_or(pb, |t| &t.storage.block);
    launch(
        Kernel::Optim(kind, p.dtype()),
        &[pb, &g.storage.block, mb, vb],
        &imm,
        (p.numel() / w) as u64,
    )?;
    p.bump_version();
    Ok(())
}

/// Whether `p` lives on a CPU adapter (lavapipe, GL's llvmpipe). There each parameter gets
/// its own launch: llvmpipe runs every case of the multi-parameter kernel's switch under a
/// mask, so six slots cost six passes' loads (the lavapipe MLP's SGD step: 3.9 ms in one
/// launch, 2.0 in four). It is a rule, not a measurement: the update is in place, and timing
/// candidates would need scratch copies of the parameters, which would show in the memory
/// statistics of the first step.
fn on_cpu_adapter(p: &Tensor) -> bool {
    crate::kernels::tune::on_cpu_adapter(p.device())
}

/// Whether the optimizers' 64-bit word kernels (`OptimKernel::SgdWords`) serve `p`: f32 on a
/// CPU adapter with 64-bit integers, where a storage access costs the same whatever its width
/// (the products' `reg4x8_wide` for the same reason; the lavapipe MLP's SGD step 2.0 -> 1.3
/// ms). GPUs keep the vec4 kernels, which reach their memory bandwidth.
fn words_fit(p: &Tensor) -> bool {
    p.dtype() == DType::F32
        && on_cpu_adapter(p)
        && p.device()
            .adapter_info()
            .is_some_and(|i| i.features.shader_int64)
}

fn check_params(op: &'static str, params: &[Tensor]) -> Result<()> {
    for p in params {
        if !p.requires_grad() || !p.is_leaf() {
            return Err(Error::InvalidArgument {
                op,
                msg: format!(
                    "can't optimize a non-leaf Tensor or one that does not require grad ({:?})",
                    p.shape()
                ),
            });
        }
    }
    Ok(())
}

/// `type` and `param_groups.0.*` for one group holding every parameter.
fn group_metadata<const N: usize>(
    kind: &str,
    params: usize,
    group: [(&str, String); N],
) -> std::collections::BTreeMap<String, String> {
    let mut m: std::collections::BTreeMap<String, String> = group
        .into_iter()
        .map(|(k, v)| (format!("param_groups.0.{k}"), v))
        .collect();
    m.insert("type".into(), kind.into());
    m.insert(
        "param_groups.0.params".into(),
        list_text((0..params).map(|i| i.to_string())),
    );
    m
}
