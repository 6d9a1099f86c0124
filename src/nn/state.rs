//! State dicts in the safetensors format (the `safetensors` crate), the files PyTorch writes and
//! reads with `safetensors.torch.save_file(model.state_dict(), path)` / `load_file`: names are
//! the module paths (`0.weight`), data little-endian and row-major.

use super::Module;
use crate::base::io_error;
use crate::tensor::{DType, Tensor};
use crate::{Device, Error, Result};
use safetensors::{Dtype, View};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

fn st_error(op: &'static str, path: &Path, e: impl std::fmt::Display) -> Error {
    Error::InvalidFile {
        op,
        path: path.display().to_string(),
        msg: e.to_string(),
    }
}

/// Named tensors with the string metadata a safetensors header carries: how optimizers,
/// GradScaler, generators and loaders put their state next to a model's (PyTorch keeps these in
/// one pickled dict; safetensors keeps tensors as tensors and scalars as header metadata).
#[derive(Clone, Default)]
pub struct StateDict {
    /// Named tensors, in order.
    pub tensors: Vec<(String, Tensor)>,
    /// String metadata (hyperparameters, counters, versions).
    pub metadata: BTreeMap<String, String>,
}

impl StateDict {
    /// The tensor named `key`.
    pub fn tensor(&self, key: &str) -> Option<&Tensor> {
        self.tensors.iter().find(|(n, _)| n == key).map(|(_, t)| t)
    }

    /// Every key with `prefix` added (`model.` + `0.weight`), to nest one state in another.
    pub fn prefixed(self, prefix: &str) -> StateDict {
        StateDict {
            tensors: self
                .tensors
                .into_iter()
                .map(|(n, t)| (format!("{prefix}{n}"), t))
                .collect(),
            metadata: self
                .metadata
                .into_iter()
                .map(|(k, v)| (format!("{prefix}{k}"), v))
                .collect(),
        }
    }

    /// The entries under `prefix`, with the prefix removed.
    pub fn section(&self, prefix: &str) -> StateDict {
        StateDict {
            tensors: self
                .tensors
                .iter()
                .filter_map(|(n, t)| Some((n.strip_prefix(prefix)?.to_string(), t.clone())))
                .collect(),
            metadata: self
                .metadata
                .iter()
                .filter_map(|(k, v)| Some((k.strip_prefix(prefix)?.to_string(), v.clone())))
                .collect(),
        }
    }

    /// Adds another state's entries.
    pub fn extend(&mut self, other: StateDict) {
        self.tensors.extend(other.tensors);
        self.metadata.extend(other.metadata);
    }

    /// Writes the tensors and the metadata to a safetensors file, atomically.
    pub fn save(&self, path: &Path) -> Result<()> {
        write_safetensors(path, &self.tensors, &self.metadata)
    }

    /// Reads a safetensors file (tensors onto `device`, metadata as written). A file that is
    /// truncated or corrupted is an `InvalidFile` error; nothing is allocated for it.
    pub fn load(path: &Path, device: &Device) -> Result<StateDict> {
        let (host, metadata) = read_safetensors(path, &|_| true)?;
        let tensors = host
            .into_iter()
            .map(|(name, h)| Ok((name, h.upload(device)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(StateDict { tensors, metadata })
    }
}

/// A tensor's bytes, read once, as safetensors sees them.
struct Bytes {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl View for &Bytes {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn to_st(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::F16 => Dtype::F16,
        DType::I32 => Dtype::I32,
        DType::U32 => Dtype::U32,
        DType::Bool => Dtype::BOOL,
    }
}

fn from_st(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::F16 => DType::F16,
        Dtype::I32 => DType::I32,
        Dtype::U32 => DType::U32,
        Dtype::BOOL => DType::Bool,
        _ => return None,
    })
}

/// A tensor read from a file, still in host memory: its name, shape and dtype can be checked
/// against what it will be loaded into before anything is allocated or changed.
struct HostTensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

impl HostTensor {
    fn upload(&self, device: &Device) -> Result<Tensor> {
        Tensor::from_le_bytes(&self.bytes, &self.shape, self.dtype, device)
    }
}

fn write_safetensors(
    path: &Path,
    tensors: &[(String, Tensor)],
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    const OP: &str = "save_safetensors";
    let mut names = std::collections::HashSet::new();
    let bytes = tensors
        .iter()
        .map(|(name, t)| {
            if !names.insert(name.as_str()) {
                return Err(Error::InvalidArgument {
                    op: OP,
                    msg: format!("the name {name:?} is used twice"),
                });
            }
            let data = t.to_le_bytes()?;
            Ok((
                name.clone(),
                Bytes {
                    dtype: to_st(t.dtype()),
                    shape: t.shape().to_vec(),
                    data,
                },
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    let info = (!metadata.is_empty()).then(|| {
        metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    });
    // Streamed onto the temporary file (no second copy of every tensor in memory).
    crate::base::write_atomic_with(OP, path, |tmp| {
        safetensors::serialize_to_file(bytes.iter().map(|(n, b)| (n.as_str(), b)), info, tmp)
            .map_err(|e| io_error(OP, tmp, e))
    })
}

/// Reads and validates a whole safetensors file into host memory: the header's offsets, shapes
/// and dtypes against the data (the safetensors crate refuses truncated files, overlapping or
/// short data, headers over 100 MB and sizes that overflow), and the dtypes against kiln's.
/// A file's tensors in host memory, with its metadata.
type HostFile = (Vec<(String, HostTensor)>, BTreeMap<String, String>);

fn read_safetensors(path: &Path, keep: &dyn Fn(&str) -> bool) -> Result<HostFile> {
    const OP: &str = "load_safetensors";
    let buffer = std::fs::read(path).map_err(|e| io_error(OP, path, e))?;
    // One parse of the header: it validates offsets, shapes and the buffer's length, and holds
    // both the tensors' places and the metadata.
    let (n, header) =
        safetensors::SafeTensors::read_metadata(&buffer).map_err(|e| st_error(OP, path, e))?;
    let data = &buffer[8 + n..];
    let metadata: BTreeMap<String, String> = header
        .metadata()
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut infos: Vec<(String, &safetensors::tensor::TensorInfo)> =
        header.tensors().into_iter().collect();
    infos.sort_by(|a, b| a.0.cmp(&b.0));
    infos.retain(|(name, _)| keep(name));
    let mut out = Vec::with_capacity(infos.len());
    for (name, info) in infos {
        let raw = &data[info.data_offsets.0..info.data_offsets.1];
        let (dtype, bytes) = if info.dtype == Dtype::I64 {
            // PyTorch's integer buffers (BatchNorm's num_batches_tracked) are int64; kiln's
            // integers are 32-bit, so the values are narrowed, and refused if they do not fit.
            let narrow = raw
                .chunks_exact(8)
                .map(|c| i32::try_from(i64::from_le_bytes(c.try_into().expect("8 bytes"))))
                .collect::<std::result::Result<Vec<i32>, _>>()
                .map_err(|_| {
                    st_error(
                        OP,
                        path,
                        format!("{name}: an int64 value does not fit kiln's i32"),
                    )
                })?;
            (
                DType::I32,
                narrow.iter().flat_map(|v| v.to_le_bytes()).collect(),
            )
        } else if info.dtype == Dtype::BF16 {
            // How most published weights ship. kiln has no bf16 dtype: each value widens to
            // f32 exactly (its 16 bits become the high half), and loading into a model converts
            // to the parameter's dtype as for any other source.
            crate::tensor::checked_numel(OP, &info.shape)?;
            let wide = raw
                .chunks_exact(2)
                .flat_map(|c| ((u16::from_le_bytes([c[0], c[1]]) as u32) << 16).to_le_bytes())
                .collect();
            (DType::F32, wide)
        } else {
            let dtype = from_st(info.dtype).ok_or_else(|| {
                st_error(
                    OP,
                    path,
                    format!("{name}: dtype {:?} is not one kiln has", info.dtype),
                )
            })?;
            crate::tensor::checked_numel(OP, &info.shape)?;
            (dtype, raw.to_vec())
        };
        out.push((
            name,
            HostTensor {
                dtype,
                shape: info.shape.clone(),
                bytes,
            },
        ));
    }
    Ok((out, metadata))
}

/// Writes named tensors (any devices; a sync point) to a safetensors file, atomically: the file
/// at `path` is the old one or the new one at every moment, never a torn one.
pub fn save_safetensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<()> {
    write_safetensors(path, tensors, &BTreeMap::new())
}

/// Reads every tensor of a safetensors file onto `device`, in the file's order of names. BF16
/// tensors arrive as f32 (exactly); `load_state_dict` then converts to each parameter's dtype.
pub fn load_safetensors(path: &Path, device: &Device) -> Result<Vec<(String, Tensor)>> {
    Ok(StateDict::load(path, device)?.tensors)
}

/// `load_safetensors` of the tensors whose names `keep` accepts; the others are neither
/// converted nor uploaded (a checkpoint's buffers of dtypes kiln lacks, such as GPT-2's u8
/// attention masks).
pub(crate) fn load_safetensors_where(
    path: &Path,
    device: &Device,
    keep: &dyn Fn(&str) -> bool,
) -> Result<Vec<(String, Tensor)>> {
    let (host, _) = read_safetensors(path, keep)?;
    host.into_iter()
        .map(|(name, h)| Ok((name, h.upload(device)?)))
        .collect()
}

/// `model.state_dict()`: parameters and buffers by path (detached handles).
pub fn state_dict(model: &dyn Module) -> Vec<(String, Tensor)> {
    model
        .named_parameters()
        .into_iter()
        .chain(model.named_buffers())
        .map(|(n, t)| (n, t.detach()))
        .collect()
}

/// `model.load_state_dict(state, strict=True)`: copies each tensor into the parameter or buffer
/// of that path (shapes must match; missing or unexpected names are errors, as with strict).
pub fn load_state_dict(model: &mut dyn Module, state: &[(String, Tensor)]) -> Result<()> {
    let mut targets = model.tensors_mut();
    let named: Vec<(&str, &Tensor)> = targets.iter().map(|(n, t)| (n.as_str(), &**t)).collect();
    let staged = stage_strict("load_state_dict", &named, state, false)?;
    for ((_, target), src) in targets.iter_mut().zip(staged) {
        crate::no_grad(|| target.copy_(&src))?;
    }
    Ok(())
}

/// `load_state_dict(strict=True)`'s checks and staging, before anything changes: the same names
/// (missing and unexpected ones listed), the same shapes (and dtypes with `exact_dtype`), and
/// each source copied onto its target's device and dtype. Returns the staged tensors in
/// `targets`' order; a bad key or an OOM leaves every target as it was (no partial load).
pub(crate) fn stage_strict(
    op: &'static str,
    targets: &[(&str, &Tensor)],
    state: &[(String, Tensor)],
    exact_dtype: bool,
) -> Result<Vec<Tensor>> {
    let source = |name: &str| state.iter().find(|(s, _)| s == name).map(|(_, t)| t);
    let missing: Vec<&str> = targets
        .iter()
        .map(|(n, _)| *n)
        .filter(|n| source(n).is_none())
        .collect();
    let unexpected: Vec<&String> = state
        .iter()
        .map(|(n, _)| n)
        .filter(|n| !targets.iter().any(|(t, _)| t == n))
        .collect();
    if !missing.is_empty() || !unexpected.is_empty() {
        return Err(Error::InvalidArgument {
            op,
            msg: format!("missing keys {missing:?}, unexpected keys {unexpected:?}"),
        });
    }
    targets
        .iter()
        .map(|&(name, target)| {
            let src = source(name).expect("checked above");
            if src.shape() != target.shape() {
                return Err(Error::InvalidArgument {
                    op,
                    msg: format!(
                        "size mismatch for {name}: copying a param with shape {:?}, the shape in the current model is {:?}",
                        src.shape(),
                        target.shape()
                    ),
                });
            }
            if exact_dtype && src.dtype() != target.dtype() {
                return Err(Error::InvalidArgument {
                    op,
                    msg: format!(
                        "dtype mismatch for {name}: copying a param of dtype {}, the dtype in the current model is {}",
                        src.dtype(),
                        target.dtype()
                    ),
                });
            }
            src.to_device(target.device())?.to_dtype(target.dtype())
        })
        .collect()
}
