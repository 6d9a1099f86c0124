//! Autocast: the thread-local state and the per-op policy of PyTorch's `torch.autocast` for
//! f16 (ATen's Autocast dispatch key). The state lives here, in the ops layer, because ops read
//! it; the public API is `kiln::amp`. See Note [Autocast] in ARCHITECTURE.md.
//!
//! Policy, as PyTorch's CUDA autocast lists it (`autocast_mode.cpp`): matmul, linear and conv2d
//! ("lower precision") cast their float inputs to f16; softmax, log_softmax, the losses,
//! layer_norm, sum/mean/prod, exp, log and pow ("fp32") cast f16 inputs to f32; batch_norm is
//! on no list (its kernels take f16 input with f32 parameters, as PyTorch's);
//! binary ops of mixed float dtypes promote to the widest. f64 tensors are never cast (not
//! eligible, as in PyTorch). Outside an enabled region nothing is cast.

use super::predicate::to_dtype;
use crate::tensor::{DType, Tensor};
use crate::{Error, Result};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

/// The device types autocast is set for, as PyTorch's `device_type` strings (`"cuda"` is
/// every GPU kiln reaches; `"cpu"` the CPU device).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceType {
    /// Every GPU (PyTorch's `"cuda"`).
    Gpu,
    /// The CPU device (PyTorch's `"cpu"`).
    Cpu,
}

impl DeviceType {
    /// `"cuda"`, `"gpu"`, `"vulkan"`, `"metal"`, `"dx12"`, `"gl"` or `"cpu"`.
    pub fn parse(s: &str) -> Result<DeviceType> {
        match s {
            "cuda" | "gpu" | "vulkan" | "metal" | "dx12" | "gl" => Ok(DeviceType::Gpu),
            "cpu" => Ok(DeviceType::Cpu),
            _ => Err(Error::InvalidArgument {
                op: "autocast",
                msg: format!("unknown device_type {s:?} (expected \"cuda\", \"gpu\" or \"cpu\")"),
            }),
        }
    }

    fn of(t: &Tensor) -> DeviceType {
        if t.device().is_cpu() {
            DeviceType::Cpu
        } else {
            DeviceType::Gpu
        }
    }
}

/// A cached cast: the source (kept alive so its meta's address is not reused), the version it
/// had, and the cast.
struct CachedCast {
    source: Tensor,
    version: u64,
    cast: Tensor,
    /// Order of insertion: the cache frees in this order when the region ends, so that the
    /// allocator sees the same frees run after run (a dry run plans what the real run does).
    seq: u64,
}

#[derive(Default)]
struct State {
    /// The autocast dtype per device type while enabled.
    gpu: Option<DType>,
    cpu: Option<DType>,
    cache_enabled: bool,
    /// Open regions (enabled or not); the cache empties when the outermost one ends.
    nesting: usize,
    /// Casts of leaf tensors that require grad (weights), by their autograd meta and dtype.
    cache: HashMap<(usize, DType), CachedCast>,
    /// Casts cached so far (each one's `seq`).
    inserted: u64,
    /// Inside an op that autocast already handled, or inside backward: no casting.
    suspended: usize,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State { cache_enabled: true, ..State::default() });
}

/// Whether autocast is enabled for `device_type` on this thread.
pub fn is_autocast_enabled(device_type: DeviceType) -> bool {
    autocast_dtype(device_type).is_some()
}

/// The dtype autocast casts to for `device_type`, while enabled.
pub fn autocast_dtype(device_type: DeviceType) -> Option<DType> {
    STATE.with(|s| {
        let s = s.borrow();
        match device_type {
            DeviceType::Gpu => s.gpu,
            DeviceType::Cpu => s.cpu,
        }
    })
}

/// Cached casts alive now (PyTorch keeps them until the outermost region ends).
pub fn autocast_cache_len() -> usize {
    STATE.with(|s| s.borrow().cache.len())
}

/// An autocast region until dropped (`torch.autocast(...)` as a context manager). Regions nest;
/// one with `enabled = false` turns autocast off inside an enabled one, as in PyTorch.
#[must_use = "the region ends when the guard is dropped"]
pub struct AutocastGuard {
    device_type: DeviceType,
    previous: Option<DType>,
    previous_cache: bool,
    // Thread-local state: the guard must end on the thread that began it.
    _not_send: std::marker::PhantomData<*const ()>,
}

/// Begins an autocast region for `device_type`: ops on tensors of that device type follow the
/// policy for `dtype` (only f16: kiln has no bf16) until the guard drops.
pub fn autocast(device_type: DeviceType, dtype: DType, enabled: bool) -> Result<AutocastGuard> {
    autocast_with_cache(device_type, dtype, enabled, true)
}

/// `autocast` with PyTorch's `cache_enabled` argument.
pub fn autocast_with_cache(
    device_type: DeviceType,
    dtype: DType,
    enabled: bool,
    cache_enabled: bool,
) -> Result<AutocastGuard> {
    if enabled && dtype != DType::F16 {
        return Err(Error::UnsupportedDType {
            op: "autocast",
            dtype,
            why: "(autocast's lower precision dtype must be f16: kiln has no bf16)".into(),
        });
    }
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        let slot = match device_type {
            DeviceType::Gpu => &mut s.gpu,
            DeviceType::Cpu => &mut s.cpu,
        };
        let previous = std::mem::replace(slot, enabled.then_some(dtype));
        let previous_cache = std::mem::replace(&mut s.cache_enabled, cache_enabled);
        s.nesting += 1;
        Ok(AutocastGuard {
            device_type,
            previous,
            previous_cache,
            _not_send: std::marker::PhantomData,
        })
    })
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        // The cache is taken out of the state before it drops: dropping tensors frees memory,
        // which may record history and must not find the state borrowed.
        let freed = STATE.with(|s| {
            let mut s = s.borrow_mut();
            match self.device_type {
                DeviceType::Gpu => s.gpu = self.previous,
                DeviceType::Cpu => s.cpu = self.previous,
            }
            s.cache_enabled = self.previous_cache;
            s.nesting -= 1;
            match s.nesting {
                0 => std::mem::take(&mut s.cache),
                _ => HashMap::new(),
            }
        });
        let mut freed: Vec<CachedCast> = freed.into_values().collect();
        freed.sort_by_key(|c| c.seq);
        for cast in freed {
            drop(cast);
        }
    }
}

/// Runs `f` inside an autocast region (the closure form of `autocast`).
pub fn with_autocast<T>(
    device_type: DeviceType,
    dtype: DType,
    enabled: bool,
    f: impl FnOnce() -> T,
) -> Result<T> {
    let _guard = autocast(device_type, dtype, enabled)?;
    Ok(f())
}

/// Runs `f` with autocast suspended on this thread: the backward engine runs every backward
/// formula so (gradients keep the dtypes the forward chose, as in PyTorch), and an op whose
/// inputs autocast already cast runs its body so.
pub(crate) fn suspended<T>(f: impl FnOnce() -> T) -> T {
    struct Resume;
    impl Drop for Resume {
        fn drop(&mut self) {
            STATE.with(|s| s.borrow_mut().suspended -= 1);
        }
    }
    STATE.with(|s| s.borrow_mut().suspended += 1);
    let _resume = Resume;
    f()
}

/// The dtype to cast to for tensors of `t`'s device type, when a region is active.
/// Whether an op on `t` would be cast by autocast now (a region enabled for `t`'s device and
/// not suspended): what `lower` asks first.
pub(crate) fn applies(t: &Tensor) -> bool {
    active(t).is_some()
}

fn active(t: &Tensor) -> Option<DType> {
    STATE.with(|s| {
        let s = s.borrow();
        if s.suspended > 0 {
            return None;
        }
        match DeviceType::of(t) {
            DeviceType::Gpu => s.gpu,
            DeviceType::Cpu => s.cpu,
        }
    })
}

/// `t` cast to `dtype`, through the weight cast cache where PyTorch caches: f32 leaves that
/// require grad (weights), cast down, while the region allows caching. The cast keeps its graph
/// (`ToCopyBackward0`), so gradients reach the f32 weight.
fn cached_cast(op: &'static str, t: &Tensor, dtype: DType) -> Result<Tensor> {
    // Named after the op that autocast serves, not the cast inside it.
    t.device().check_dtype(op, dtype)?;
    let key = t
        .autograd
        .as_ref()
        .filter(|_| dtype == DType::F16 && t.dtype == DType::F32 && t.is_leaf())
        .filter(|_| t.requires_grad() && STATE.with(|s| s.borrow().cache_enabled))
        .map(|meta| (Arc::as_ptr(meta).cast::<()>() as usize, dtype));
    let Some(key) = key else {
        return to_dtype(t, dtype);
    };
    let hit = STATE.with(|s| {
        let s = s.borrow();
        s.cache.get(&key).and_then(|c| {
            (c.version == t.version() && c.source.shares_storage(t) && c.source.layout == t.layout)
                .then(|| c.cast.clone())
        })
    });
    if let Some(cast) = hit {
        return Ok(cast);
    }
    let cast = {
        let _frame = crate::alloc::kiln_scope(|| "autocast_cached_cast".into(), "kiln amp");
        to_dtype(t, dtype)?
    };
    let stale = STATE.with(|s| {
        let mut s = s.borrow_mut();
        let seq = s.inserted;
        s.inserted += 1;
        s.cache.insert(
            key,
            CachedCast {
                source: t.clone(),
                version: t.version(),
                cast: cast.clone(),
                seq,
            },
        )
    });
    drop(stale);
    Ok(cast)
}

fn eligible(t: &Tensor) -> bool {
    matches!(t.dtype, DType::F32 | DType::F16)
}

/// Lower-precision ops (matmul, linear, conv2d): the inputs cast to the autocast dtype, or
/// `None` when no region is active. The caller runs the op on them with autocast suspended
/// (also when nothing needed a cast), so that the op's own inner steps (split-K's sum) keep
/// its dtype.
pub(crate) fn lower(op: &'static str, inputs: &[&Tensor]) -> Result<Option<Vec<Tensor>>> {
    let Some(dtype) = inputs.first().and_then(|t| active(t)) else {
        return Ok(None);
    };
    inputs
        .iter()
        .map(|t| match eligible(t) && t.dtype != dtype {
            true => cached_cast(op, t, dtype),
            false => Ok((*t).clone()),
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// f32 ops (softmax, losses, norms, reductions, exp/log/pow): lower-precision inputs cast to
/// f32, or `None` when autocast does not apply.
pub(crate) fn fp32(inputs: &[&Tensor]) -> Result<Option<Vec<Tensor>>> {
    if inputs.iter().all(|t| t.dtype != DType::F16)
        || inputs.first().and_then(|t| active(t)).is_none()
    {
        return Ok(None);
    }
    inputs
        .iter()
        .map(|t| match t.dtype == DType::F16 {
            true => to_dtype(t, DType::F32),
            false => Ok((*t).clone()),
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// Binary ops of two float dtypes: both in the widest, or `None` when autocast does not apply.
pub(crate) fn promote(a: &Tensor, b: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
    if a.dtype == b.dtype || !a.dtype.is_float() || !b.dtype.is_float() || active(a).is_none() {
        return Ok(None);
    }
    let wide = if a.dtype.size_bytes() >= b.dtype.size_bytes() {
        a.dtype
    } else {
        b.dtype
    };
    Ok(Some((to_dtype(a, wide)?, to_dtype(b, wide)?)))
}

/// Runs a one-input f32-policy op: `f` on the input cast to f32 where autocast applies.
pub(crate) fn fp32_unary(x: &Tensor, f: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
    match fp32(&[x])? {
        Some(v) => suspended(|| f(&v[0])),
        None => f(x),
    }
}
