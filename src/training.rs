//! Training checkpoints that resume bit for bit: the model's state dict, the optimizer's state
//! and `param_groups`, GradScaler's state, the device generator and the loader's epoch and
//! position, in one safetensors file (tensors as tensors, scalars in the header's metadata),
//! written atomically. PyTorch users write this as
//!
//! ```python
//! torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
//!             "scaler": scaler.state_dict(), "rng": torch.cuda.get_rng_state(),
//!             "loader": loader.state_dict(), "epoch": epoch}, path)
//! ```
//!
//! and restore each part with its own `load_state_dict`, which can leave a model loaded and an
//! optimizer not when the second part does not fit. Here one call restores everything and checks
//! everything first: every key, shape and dtype, every hyperparameter, the scaler's figures and
//! the loader's position. Any error leaves every part exactly as it was.
//!
//! The file's keys: `model.{name}` and `optimizer.state.{i}.{name}` tensors; metadata
//! `format`, `optimizer.type`, `optimizer.param_groups.0.*`, `scaler.*`, `generator.seed`,
//! `generator.offset`, `loader.*` and the caller's own `extra.*`.

use crate::amp::GradScaler;
use crate::data::{LoaderState, Resumable};
use crate::nn::{stage_strict, StateDict};
use crate::optim::Optimizer;
use crate::tensor::Tensor;
use crate::{Device, Error, Result, RngState};
use std::collections::BTreeMap;
use std::path::Path;

/// The `format` metadata of kiln's training checkpoints.
pub const CHECKPOINT_FORMAT: &str = "kiln.training-checkpoint.v1";

/// The parts of a training run a checkpoint holds. Leave a part `None` to neither save nor
/// restore it; `model` is the model's state dict (`nn::state_dict(&model)`: handles that share
/// the parameters' storage, so restoring copies into the live parameters).
#[derive(Default)]
pub struct Checkpoint<'a> {
    /// The model's state dict (`nn::state_dict(&model)`).
    pub model: Vec<(String, Tensor)>,
    /// The optimizer whose state and `param_groups` are saved.
    pub optimizer: Option<&'a mut dyn Optimizer>,
    /// The GradScaler whose scale and counters are saved.
    pub scaler: Option<&'a mut GradScaler>,
    /// The loader whose epoch and position are saved.
    pub loader: Option<&'a mut dyn Resumable>,
    /// The device whose generator is saved and restored.
    pub generator: Option<Device>,
    /// The caller's own scalars (epoch, global step, best accuracy, ...): written by `save`,
    /// replaced by the file's by `load`.
    pub extra: BTreeMap<String, String>,
}

fn invalid(path: &Path, msg: String) -> Error {
    Error::InvalidFile {
        op: "load_checkpoint",
        path: path.display().to_string(),
        msg,
    }
}

fn parse<T: std::str::FromStr>(
    path: &Path,
    meta: &BTreeMap<String, String>,
    key: &str,
) -> Result<T> {
    let text = meta
        .get(key)
        .ok_or_else(|| invalid(path, format!("missing key {key:?}")))?;
    text.parse()
        .map_err(|_| invalid(path, format!("{key}: cannot parse {text:?}")))
}

impl Checkpoint<'_> {
    /// Everything this checkpoint holds, as one state dict.
    pub fn state_dict(&self) -> StateDict {
        let mut out = StateDict::default();
        out.metadata
            .insert("format".into(), CHECKPOINT_FORMAT.into());
        out.extend(
            StateDict {
                tensors: self.model.clone(),
                metadata: BTreeMap::new(),
            }
            .prefixed("model."),
        );
        if let Some(opt) = self.optimizer.as_deref() {
            out.extend(opt.state_dict().prefixed("optimizer."));
        }
        if let Some(scaler) = self.scaler.as_deref() {
            // `enabled` is saved too: a disabled scaler's state is empty, as in PyTorch.
            out.metadata
                .insert("scaler.enabled".into(), scaler.is_enabled().to_string());
            for (k, v) in scaler.state_dict() {
                out.metadata.insert(format!("scaler.{k}"), format!("{v:?}"));
            }
        }
        if let Some(device) = &self.generator {
            let RngState { seed, offset } = device.get_rng_state();
            out.metadata
                .insert("generator.seed".into(), seed.to_string());
            out.metadata
                .insert("generator.offset".into(), offset.to_string());
        }
        if let Some(loader) = self.loader.as_deref() {
            let s = loader.loader_state();
            for (k, v) in [
                ("epoch", s.epoch.to_string()),
                ("position", s.position.to_string()),
                ("seed", s.seed.to_string()),
                ("batch_size", s.batch_size.to_string()),
                ("dataset_len", s.dataset_len.to_string()),
            ] {
                out.metadata.insert(format!("loader.{k}"), v);
            }
        }
        for (k, v) in &self.extra {
            out.metadata.insert(format!("extra.{k}"), v.clone());
        }
        out
    }

    /// Writes the checkpoint to `path` atomically (a temporary file beside it, flushed, then
    /// renamed over it): the file at `path` is the previous checkpoint or this one, whenever the
    /// process dies. A sync point: every tensor is read back.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        self.state_dict().save(path.as_ref())
    }

    /// Restores every part present in both this checkpoint and the file at `path`. Everything is
    /// read and checked first (the format, every model key, shape and dtype as a strict
    /// `load_state_dict`, the optimizer's type, keys, shapes and hyperparameters, the scaler's
    /// figures, the loader's position) and staged on the parts' devices; only then is anything
    /// changed. On an error every part is as it was.
    pub fn load(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let file = StateDict::load(path, &Device::cpu()?)?;
        let meta = &file.metadata;
        match meta.get("format") {
            Some(f) if f == CHECKPOINT_FORMAT => {}
            other => {
                return Err(invalid(
                    path,
                    format!("not a kiln training checkpoint (format {other:?}, expected {CHECKPOINT_FORMAT:?})"),
                ))
            }
        }

        // The model, strictly (`load_state_dict(strict=True)` plus equal dtypes), under the
        // file's `model.` names; staged on each target's device.
        let targets: Vec<(String, &Tensor)> = self
            .model
            .iter()
            .map(|(n, t)| (format!("model.{n}"), t))
            .collect();
        let named: Vec<(&str, &Tensor)> = targets.iter().map(|(n, t)| (n.as_str(), *t)).collect();
        let saved: Vec<(String, Tensor)> = file
            .tensors
            .iter()
            .filter(|(n, _)| n.starts_with("model."))
            .cloned()
            .collect();
        let staged =
            stage_strict("load_checkpoint", &named, &saved, true).map_err(|e| match e {
                Error::InvalidArgument { msg, .. } => invalid(path, msg),
                e => e,
            })?;

        // The scalar parts, parsed and checked.
        let scaler = match &self.scaler {
            Some(scaler) if scaler.is_enabled() => {
                let section = file.section("scaler.");
                let enabled: bool = parse(path, meta, "scaler.enabled")?;
                if !enabled {
                    return Err(invalid(
                        path,
                        "scaler: the checkpoint was saved with a disabled GradScaler".into(),
                    ));
                }
                let figures = section
                    .metadata
                    .iter()
                    .filter(|(k, _)| *k != "enabled")
                    .map(|(k, v)| {
                        let x: f64 = v.parse().map_err(|_| {
                            invalid(path, format!("scaler.{k}: cannot parse {v:?}"))
                        })?;
                        Ok((k.clone(), x))
                    })
                    .collect::<Result<BTreeMap<String, f64>>>()?;
                // The same checks the live scaler makes, on a scratch one.
                GradScaler::new().load_state_dict(&figures)?;
                Some(figures)
            }
            _ => None,
        };
        let generator = match &self.generator {
            Some(_) => Some(RngState {
                seed: parse(path, meta, "generator.seed")?,
                offset: parse(path, meta, "generator.offset")?,
            }),
            None => None,
        };
        let loader = match self.loader.as_deref() {
            Some(loader) => {
                let state = LoaderState {
                    epoch: parse(path, meta, "loader.epoch")?,
                    position: parse(path, meta, "loader.position")?,
                    seed: parse(path, meta, "loader.seed")?,
                    batch_size: parse(path, meta, "loader.batch_size")?,
                    dataset_len: parse(path, meta, "loader.dataset_len")?,
                };
                loader.check_loader_state(&state)?;
                Some(state)
            }
            None => None,
        };

        // The optimizer checks and stages everything before it changes: the last step that may
        // refuse the file.
        if let Some(opt) = self.optimizer.as_deref_mut() {
            opt.load_state_dict(&file.section("optimizer."))?;
        }

        // Commit.
        for ((_, target), src) in self.model.iter().zip(&staged) {
            crate::no_grad(|| target.copy_(src))?;
        }
        if let (Some(s), Some(figures)) = (self.scaler.as_deref_mut(), &scaler) {
            s.load_state_dict(figures)?;
        }
        if let (Some(d), Some(state)) = (&self.generator, generator) {
            d.set_rng_state(state);
        }
        if let (Some(l), Some(state)) = (self.loader.as_deref_mut(), &loader) {
            l.load_loader_state(state)?;
        }
        self.extra = file.section("extra.").metadata;
        Ok(())
    }
}
