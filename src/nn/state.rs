//! State dicts in the safetensors format (the `safetensors` crate), the files PyTorch writes and
//! reads with `safetensors.torch.save_file(model.state_dict(), path)` / `load_file`: names are
//! the module paths (`0.weight`), data little-endian and row-major.

use super::Module;
use crate::tensor::{DType, Tensor};
use crate::{Device, Error, Result};
use safetensors::{Dtype, View};
use std::borrow::Cow;
use std::path::Path;

fn st_error(op: &'static str, path: &Path, e: impl std::fmt::Display) -> Error {
    Error::InvalidArgument {
        op,
        msg: format!("{}: {e}", path.display()),
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

/// Writes named tensors (any devices; a sync point) to a safetensors file.
pub fn save_safetensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<()> {
    let bytes = tensors
        .iter()
        .map(|(name, t)| {
            let data = t.contiguous_bytes()?;
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
    safetensors::serialize_to_file(bytes.iter().map(|(n, b)| (n.as_str(), b)), None, path)
        .map_err(|e| st_error("save_safetensors", path, e))
}

/// Reads every tensor of a safetensors file onto `device`, in the file's order of names.
pub fn load_safetensors(path: &Path, device: &Device) -> Result<Vec<(String, Tensor)>> {
    let buffer = std::fs::read(path).map_err(|e| st_error("load_safetensors", path, e))?;
    let st = safetensors::SafeTensors::deserialize(&buffer)
        .map_err(|e| st_error("load_safetensors", path, e))?;
    let mut out = Vec::new();
    let mut names = st.names();
    names.sort();
    for name in names {
        let view = st
            .tensor(name)
            .map_err(|e| st_error("load_safetensors", path, e))?;
        if view.dtype() == Dtype::I64 {
            // PyTorch's integer buffers (BatchNorm's num_batches_tracked) are int64; kiln's
            // integers are 32-bit, so the values are narrowed, and refused if they do not fit.
            let wide: Vec<i64> = view
                .data()
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect();
            let narrow = wide
                .iter()
                .map(|&v| i32::try_from(v))
                .collect::<std::result::Result<Vec<i32>, _>>()
                .map_err(|_| {
                    st_error(
                        "load_safetensors",
                        path,
                        format!("{name}: an int64 value does not fit kiln's i32"),
                    )
                })?;
            let bytes: Vec<u8> = narrow.iter().flat_map(|v| v.to_le_bytes()).collect();
            let t = Tensor::from_le_bytes(&bytes, view.shape(), DType::I32, device)?;
            out.push((name.to_string(), t));
            continue;
        }
        let dtype = from_st(view.dtype()).ok_or_else(|| {
            st_error(
                "load_safetensors",
                path,
                format!("{name}: dtype {:?} is not one kiln has", view.dtype()),
            )
        })?;
        let t = Tensor::from_le_bytes(view.data(), view.shape(), dtype, device)?;
        out.push((name.to_string(), t));
    }
    Ok(out)
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
    let missing: Vec<&String> = targets
        .iter()
        .map(|(n, _)| n)
        .filter(|n| !state.iter().any(|(s, _)| s == *n))
        .collect();
    let unexpected: Vec<&String> = state
        .iter()
        .map(|(n, _)| n)
        .filter(|n| !targets.iter().any(|(t, _)| t == *n))
        .collect();
    if !missing.is_empty() || !unexpected.is_empty() {
        return Err(Error::InvalidArgument {
            op: "load_state_dict",
            msg: format!("missing keys {missing:?}, unexpected keys {unexpected:?}"),
        });
    }
    for (name, target) in targets.iter_mut() {
        let (_, src) = state
            .iter()
            .find(|(s, _)| s == name)
            .expect("checked above");
        if src.shape() != target.shape() {
            return Err(Error::ShapeMismatch {
                op: "load_state_dict",
                lhs: target.shape().to_vec(),
                rhs: src.shape().to_vec(),
            });
        }
        let src = src.to_device(target.device())?.to_dtype(target.dtype())?;
        crate::no_grad(|| target.copy_(&src))?;
    }
    Ok(())
}
