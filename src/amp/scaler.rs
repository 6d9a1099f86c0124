//! `GradScaler`, PyTorch's `torch.amp.GradScaler`: the loss is multiplied by a scale so that
//! small f16 gradients do not flush to zero; before the optimizer steps, the gradients are
//! unscaled and checked for inf/NaN on the device (seven gradients to a kernel, PyTorch's
//! `_amp_foreach_non_finite_check_and_unscale_`), and the step reads the one `found_inf` flag
//! back: one host read per step, however many parameters. A step whose gradients overflowed is
//! skipped (parameters and optimizer state untouched) and the scale backs off; after
//! `growth_interval` clean steps it grows.
//!
//! The scale is kept on the host as the f32 PyTorch keeps on the device (every change is the
//! same f32 arithmetic as `_amp_update_scale_`), and reaches kernels as an immediate: `update`
//! needs no device work and `get_scale` no sync, while the figures stay PyTorch's bit for bit.

use crate::kernels::{launch, Kernel, AMP_MULTI};
use crate::ops::{BinaryOp, CmpOp};
use crate::optim::Optimizer;
use crate::tensor::{DType, Tensor};
use crate::{no_grad, Error, Result};
use std::collections::{BTreeMap, HashMap};

/// Where an optimizer is in the iteration (PyTorch's `OptState`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Stage {
    #[default]
    Ready,
    Unscaled,
    Stepped,
}

#[derive(Default)]
struct OptimizerState {
    stage: Stage,
    /// One 0-d f32 flag per device its gradients live on (1.0: an inf or NaN was found).
    found_inf: Vec<Tensor>,
    /// The flags' sum once read to the host (by `step`).
    found_inf_host: Option<f64>,
}

/// Dynamic loss scaling with PyTorch's defaults: scale 2^16, growth x2 after 2000 clean steps,
/// backoff x0.5 on an overflow.
pub struct GradScaler {
    enabled: bool,
    init_scale: f64,
    growth_factor: f64,
    backoff_factor: f64,
    growth_interval: u32,
    init_growth_tracker: u32,
    /// PyTorch's `_scale` (an f32), made by the first `scale`.
    scale: Option<f32>,
    growth_tracker: u32,
    /// By optimizer identity (its address, as PyTorch keys by `id(optimizer)`).
    per_optimizer: HashMap<usize, OptimizerState>,
}

impl Default for GradScaler {
    fn default() -> Self {
        GradScaler {
            enabled: true,
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            init_growth_tracker: 0,
            scale: None,
            growth_tracker: 0,
            per_optimizer: HashMap::new(),
        }
    }
}

const SCALE_NONE: &str = "This may indicate your script did not use scaler.scale(loss or outputs) earlier in the iteration.";

fn key<O: Optimizer + ?Sized>(optimizer: &O) -> usize {
    (optimizer as *const O).cast::<()>() as usize
}

fn invalid(op: &'static str, msg: impl Into<String>) -> Error {
    Error::InvalidArgument {
        op,
        msg: msg.into(),
    }
}

impl GradScaler {
    /// PyTorch's defaults (`GradScaler("cuda")`).
    pub fn new() -> GradScaler {
        GradScaler::default()
    }

    /// All of PyTorch's constructor arguments; growth must exceed 1 and backoff lie below it.
    pub fn with_options(
        init_scale: f64,
        growth_factor: f64,
        backoff_factor: f64,
        growth_interval: u32,
        enabled: bool,
    ) -> Result<GradScaler> {
        if growth_factor.is_nan() || growth_factor <= 1.0 {
            return Err(invalid("GradScaler", "The growth factor must be > 1.0."));
        }
        if backoff_factor.is_nan() || backoff_factor >= 1.0 {
            return Err(invalid("GradScaler", "The backoff factor must be < 1.0."));
        }
        if growth_interval == 0 {
            return Err(invalid("GradScaler", "growth_interval must be positive."));
        }
        Ok(GradScaler {
            enabled,
            init_scale,
            growth_factor,
            backoff_factor,
            growth_interval,
            ..GradScaler::default()
        })
    }

    /// `GradScaler(enabled=...)`: disabled, every method passes through.
    pub fn enabled(mut self, enabled: bool) -> GradScaler {
        self.enabled = enabled;
        self
    }

    /// Whether the scaler scales at all (`enabled=False` makes every call a pass-through).
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// `outputs * scale` (the scale made on first use). A 0-d f16 loss comes back in f32, as
    /// PyTorch's type promotion against its 0-d f32 scale gives.
    pub fn scale(&mut self, outputs: &Tensor) -> Result<Tensor> {
        if !self.enabled {
            return Ok(outputs.clone());
        }
        let scale = *self.scale.get_or_insert_with(|| {
            self.growth_tracker = self.init_growth_tracker;
            self.init_scale as f32
        });
        let outputs = match outputs.rank() == 0 && outputs.dtype() == DType::F16 {
            true => outputs.to_dtype(DType::F32)?,
            false => outputs.clone(),
        };
        outputs.mul_scalar(scale as f64)
    }

    /// Divides the optimizer's gradients by the scale in place and records whether any was
    /// inf or NaN (on the device: no host read). Call it before clipping gradients; `step`
    /// calls it when it has not been called.
    pub fn unscale_<O: Optimizer + ?Sized>(&mut self, optimizer: &O) -> Result<()> {
        const OP: &str = "GradScaler.unscale_";
        if !self.enabled {
            return Ok(());
        }
        let Some(scale) = self.scale else {
            return Err(invalid(
                OP,
                format!("Attempted unscale_ but _scale is None. {SCALE_NONE}"),
            ));
        };
        let state = self.per_optimizer.entry(key(optimizer)).or_default();
        match state.stage {
            Stage::Unscaled => {
                return Err(invalid(
                    OP,
                    "unscale_() has already been called on this optimizer since the last update().",
                ))
            }
            Stage::Stepped => return Err(invalid(OP, "unscale_() is being called after step().")),
            Stage::Ready => {}
        }
        let grads: Vec<Tensor> = optimizer.params().iter().filter_map(|p| p.grad()).collect();
        if let Some(g) = grads.iter().find(|g| g.dtype() != DType::F32) {
            // PyTorch refuses f16 gradients here (allow_fp16=False): f16 parameters would lose
            // the small updates loss scaling exists to keep. Keep f32 parameters under autocast.
            return Err(Error::UnsupportedDType {
                op: OP,
                dtype: g.dtype(),
                why: "Attempting to unscale FP16 gradients.".into(),
            });
        }
        // PyTorch's `scale.double().reciprocal().float()`.
        let inv_scale = (1.0 / scale as f64) as f32;
        // One flag per device; gradients of whole vec4s on a GPU go `AMP_MULTI` to a launch,
        // as PyTorch's foreach kernel takes the list, the rest one by one.
        let mut per_device: Vec<(Tensor, Vec<Tensor>)> = Vec::new();
        no_grad(|| -> Result<()> {
            for g in &grads {
                let i = match per_device
                    .iter()
                    .position(|(f, _)| f.device() == g.device())
                {
                    Some(i) => i,
                    None => {
                        let f = Tensor::zeros(&[], DType::F32, g.device())?;
                        per_device.push((f, Vec::new()));
                        per_device.len() - 1
                    }
                };
                let (flag, many) = &mut per_device[i];
                match multi_eligible(g) {
                    true => many.push(g.clone()),
                    false => unscale_one(g, flag, inv_scale)?,
                }
            }
            for (flag, many) in &per_device {
                for chunk in many.chunks(AMP_MULTI) {
                    unscale_many(chunk, flag, inv_scale)?;
                }
            }
            Ok(())
        })?;
        state.found_inf = per_device.into_iter().map(|(f, _)| f).collect();
        state.found_inf_host = None;
        state.stage = Stage::Unscaled;
        Ok(())
    }

    /// Unscales (unless `unscale_` ran), reads the inf flag back (the iteration's one host
    /// read) and steps the optimizer only if every gradient was finite. Returns whether it
    /// stepped.
    pub fn step<O: Optimizer + ?Sized>(&mut self, optimizer: &mut O) -> Result<bool> {
        const OP: &str = "GradScaler.step";
        if !self.enabled {
            optimizer.step()?;
            return Ok(true);
        }
        if self.scale.is_none() {
            return Err(invalid(
                OP,
                format!("Attempted step but _scale is None. {SCALE_NONE}"),
            ));
        }
        let k = key(optimizer);
        if self.per_optimizer.get(&k).map(|s| s.stage) == Some(Stage::Stepped) {
            return Err(invalid(
                OP,
                "step() has already been called since the last update().",
            ));
        }
        if self
            .per_optimizer
            .get(&k)
            .is_none_or(|s| s.stage == Stage::Ready)
        {
            self.unscale_(&*optimizer)?;
        }
        let state = self.per_optimizer.get_mut(&k).expect("unscale_ made it");
        let found = read_found(state)?;
        let stepped = found == 0.0;
        if stepped {
            optimizer.step()?;
        }
        state.stage = Stage::Stepped;
        Ok(stepped)
    }

    /// Backs the scale off if any optimizer met an inf or NaN this iteration, else counts a
    /// clean step and grows the scale every `growth_interval` of them; `Some(s)` sets it to
    /// `s` instead. Then every optimizer is ready for the next iteration.
    pub fn update(&mut self, new_scale: Option<f64>) -> Result<()> {
        const OP: &str = "GradScaler.update";
        if !self.enabled {
            return Ok(());
        }
        let Some(scale) = self.scale else {
            return Err(invalid(
                OP,
                format!("Attempted update but _scale is None. {SCALE_NONE}"),
            ));
        };
        if let Some(s) = new_scale {
            self.scale = Some(s as f32);
        } else {
            let mut recorded = 0;
            let mut found = 0.0;
            for state in self.per_optimizer.values_mut() {
                if !state.found_inf.is_empty() {
                    recorded += 1;
                    found += read_found(state)?;
                }
            }
            if recorded == 0 {
                return Err(invalid(OP, "No inf checks were recorded prior to update."));
            }
            // `_amp_update_scale_`: f32 scale, f64 factors.
            if found != 0.0 {
                self.scale = Some((scale as f64 * self.backoff_factor) as f32);
                self.growth_tracker = 0;
            } else {
                let successful = self.growth_tracker + 1;
                if successful == self.growth_interval {
                    let grown = (scale as f64 * self.growth_factor) as f32;
                    if grown.is_finite() {
                        self.scale = Some(grown);
                    }
                    self.growth_tracker = 0;
                } else {
                    self.growth_tracker = successful;
                }
            }
        }
        self.per_optimizer.clear();
        Ok(())
    }

    /// The current scale (the initial one before the first `scale`; 1.0 when disabled).
    pub fn get_scale(&self) -> f64 {
        match (self.enabled, self.scale) {
            (false, _) => 1.0,
            (true, Some(s)) => s as f64,
            (true, None) => self.init_scale,
        }
    }

    /// Clean steps since the scale last changed (PyTorch's `_growth_tracker`).
    pub fn get_growth_tracker(&self) -> u32 {
        match self.scale {
            Some(_) => self.growth_tracker,
            None => self.init_growth_tracker,
        }
    }

    /// The factor the scale grows by after `growth_interval` steps without inf or NaN.
    pub fn get_growth_factor(&self) -> f64 {
        self.growth_factor
    }

    /// The factor the scale shrinks by after a step with inf or NaN.
    pub fn get_backoff_factor(&self) -> f64 {
        self.backoff_factor
    }

    /// Steps without inf or NaN before the scale grows.
    pub fn get_growth_interval(&self) -> u32 {
        self.growth_interval
    }

    /// PyTorch's keys: `scale`, `growth_factor`, `backoff_factor`, `growth_interval`,
    /// `_growth_tracker`; empty when disabled.
    pub fn state_dict(&self) -> BTreeMap<String, f64> {
        if !self.enabled {
            return BTreeMap::new();
        }
        [
            ("scale", self.get_scale()),
            ("growth_factor", self.growth_factor),
            ("backoff_factor", self.backoff_factor),
            ("growth_interval", self.growth_interval as f64),
            ("_growth_tracker", self.get_growth_tracker() as f64),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Restores `state_dict`'s figures; every key is checked before anything changes.
    pub fn load_state_dict(&mut self, state: &BTreeMap<String, f64>) -> Result<()> {
        const OP: &str = "GradScaler.load_state_dict";
        if !self.enabled {
            return Ok(());
        }
        if state.is_empty() {
            return Err(invalid(OP, "The source state dict is empty, possibly because it was saved from a disabled instance of GradScaler."));
        }
        let get = |k: &str| {
            state
                .get(k)
                .copied()
                .ok_or_else(|| invalid(OP, format!("missing key {k:?}")))
        };
        let (scale, growth, backoff) =
            (get("scale")?, get("growth_factor")?, get("backoff_factor")?);
        let (interval, tracker) = (get("growth_interval")?, get("_growth_tracker")?);
        let whole = |v: f64| v >= 0.0 && v.fract() == 0.0 && v <= u32::MAX as f64;
        if !whole(interval) || interval == 0.0 || !whole(tracker) {
            return Err(invalid(
                OP,
                format!("growth_interval {interval} and _growth_tracker {tracker} must be whole"),
            ));
        }
        self.init_scale = scale;
        self.growth_factor = growth;
        self.backoff_factor = backoff;
        self.growth_interval = interval as u32;
        self.init_growth_tracker = tracker as u32;
        if self.scale.is_some() {
            self.scale = Some(scale as f32);
            self.growth_tracker = tracker as u32;
        }
        Ok(())
    }
}

/// The sum of an optimizer's inf flags, read to the host once and remembered.
fn read_found(state: &mut OptimizerState) -> Result<f64> {
    if let Some(f) = state.found_inf_host {
        return Ok(f);
    }
    let mut sum = 0.0;
    // A dry run reads no values: it takes the ordinary path, a step with finite gradients
    // (Note [Dry runs]), and the staging chunks the reads would.
    if state.found_inf.iter().any(|f| f.device().is_dry_run()) {
        for flag in &state.found_inf {
            let bytes = (flag.numel() * flag.dtype().size_bytes()) as u64;
            crate::device::planned_staging(
                flag.device(),
                bytes.next_multiple_of(4),
                crate::host::PinnedKind::Download,
            )?;
        }
        return Ok(sum);
    }
    for flag in &state.found_inf {
        sum += flag.item::<f32>()? as f64;
    }
    state.found_inf_host = Some(sum);
    Ok(sum)
}

/// A gradient `unscale_many` takes: contiguous on a GPU, whole vec4s at a vec4 offset, every
/// count and offset a u32.
fn multi_eligible(g: &Tensor) -> bool {
    let offset = g.layout().offset;
    !g.device().is_cpu()
        && g.numel() > 0
        && g.is_contiguous()
        && g.numel().is_multiple_of(4)
        && offset.is_multiple_of(4)
        && g.numel() < u32::MAX as usize
        && offset < u32::MAX as usize
}

/// `unscale_one` for up to `AMP_MULTI` gradients of one device (`multi_eligible`) in one
/// launch of `shaders/amp_multi.wgsl`.
fn unscale_many(grads: &[Tensor], found_inf: &Tensor, inv_scale: f32) -> Result<()> {
    let Some(first) = grads.first() else {
        return Ok(());
    };
    let mut imm = Vec::with_capacity(2 * AMP_MULTI + 2);
    let mut blocks = Vec::with_capacity(AMP_MULTI + 1);
    let mut groups = 0u64;
    for j in 0..AMP_MULTI {
        // An unused slot binds the first gradient again, with nothing to do.
        let g = grads.get(j);
        let n = g.map_or(0, |g| g.numel() / 4);
        imm.push(n as u32);
        imm.push(g.map_or(0, |g| g.layout().offset / 4) as u32);
        blocks.push(&g.unwrap_or(first).storage.block);
        groups += (n as u64).div_ceil(256);
    }
    imm.push(inv_scale.to_bits());
    imm.push(found_inf.layout().offset as u32);
    blocks.push(&found_inf.storage.block);
    launch(Kernel::AmpUnscaleMulti, &blocks, &imm, groups * 256)?;
    for g in grads {
        g.bump_version();
    }
    Ok(())
}

/// `g *= inv_scale` in place, raising `found_inf` (0-d f32) if any element was inf or NaN.
/// One kernel on a GPU; tensor ops elsewhere (the reference the kernel is tested against).
fn unscale_one(g: &Tensor, found_inf: &Tensor, inv_scale: f32) -> Result<()> {
    if g.numel() == 0 {
        return Ok(());
    }
    let offset = g.layout().offset;
    let fits = g.numel() < u32::MAX as usize && offset < u32::MAX as usize;
    if !g.device().is_cpu() && g.is_contiguous() && fits {
        let vec4 = g.numel().is_multiple_of(4) && offset.is_multiple_of(4);
        let w = if vec4 { 4 } else { 1 };
        let imm = [
            (g.numel() / w) as u32,
            (offset / w) as u32,
            inv_scale.to_bits(),
            found_inf.layout().offset as u32,
        ];
        launch(
            Kernel::AmpUnscale(vec4),
            &[&g.storage.block, &found_inf.storage.block],
            &imm,
            (g.numel() / w) as u64,
        )?;
        g.bump_version();
        return Ok(());
    }
    // 0 * x is NaN exactly where x is inf or NaN; so is the sum of those products.
    let probe = g.mul_scalar(0.0)?.sum_all()?;
    let non_finite = crate::ops::compare(&probe, &probe, CmpOp::Ne)?.to_dtype(DType::F32)?;
    crate::ops::binary_(found_inf, &non_finite, BinaryOp::Maximum)?;
    g.mul_scalar_(inv_scale as f64)
}
