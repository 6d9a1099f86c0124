//! Initialisers with PyTorch's formulas (`torch.nn.init`). They draw from the device's
//! generator, so `device.manual_seed(seed)` makes them repeat.

use crate::tensor::{DType, Tensor};
use crate::{Device, Error, Result};

/// `(fan_in, fan_out)` of a weight: dims 1 and 0 times the receptive field (dims 2..).
pub fn fans(shape: &[usize]) -> Result<(usize, usize)> {
    if shape.len() < 2 {
        return Err(Error::InvalidArgument {
            op: "init",
            msg: format!("fan in and fan out need at least 2 dims, got {shape:?}"),
        });
    }
    let field: usize = shape[2..].iter().product();
    Ok((shape[1] * field, shape[0] * field))
}

/// The gain of a nonlinearity (`torch.nn.init.calculate_gain`).
pub fn gain(nonlinearity: &str, negative_slope: f64) -> f64 {
    match nonlinearity {
        "relu" => 2f64.sqrt(),
        "leaky_relu" => (2.0 / (1.0 + negative_slope * negative_slope)).sqrt(),
        "tanh" => 5.0 / 3.0,
        "selu" => 0.75,
        _ => 1.0,
    }
}

/// Kaiming (He) uniform on `fan_in`: U(-b, b), b = gain * sqrt(3 / fan_in).
pub fn kaiming_uniform(
    shape: &[usize],
    a: f64,
    nonlinearity: &str,
    dtype: DType,
    device: &Device,
) -> Result<Tensor> {
    let (fan_in, _) = fans(shape)?;
    let bound = gain(nonlinearity, a) * (3.0 / fan_in.max(1) as f64).sqrt();
    Tensor::uniform(shape, -bound, bound, dtype, device)
}

/// Kaiming (He) normal on `fan_in`: N(0, gain / sqrt(fan_in)).
pub fn kaiming_normal(
    shape: &[usize],
    nonlinearity: &str,
    dtype: DType,
    device: &Device,
) -> Result<Tensor> {
    let (fan_in, _) = fans(shape)?;
    let std = gain(nonlinearity, 0.0) / (fan_in.max(1) as f64).sqrt();
    Tensor::normal(shape, 0.0, std, dtype, device)
}

/// Xavier (Glorot) uniform: U(-b, b), b = gain * sqrt(6 / (fan_in + fan_out)).
pub fn xavier_uniform(shape: &[usize], gain: f64, dtype: DType, device: &Device) -> Result<Tensor> {
    let (fan_in, fan_out) = fans(shape)?;
    let bound = gain * (6.0 / (fan_in + fan_out).max(1) as f64).sqrt();
    Tensor::uniform(shape, -bound, bound, dtype, device)
}

/// Xavier (Glorot) normal: N(0, gain * sqrt(2 / (fan_in + fan_out))).
pub fn xavier_normal(shape: &[usize], gain: f64, dtype: DType, device: &Device) -> Result<Tensor> {
    let (fan_in, fan_out) = fans(shape)?;
    let std = gain * (2.0 / (fan_in + fan_out).max(1) as f64).sqrt();
    Tensor::normal(shape, 0.0, std, dtype, device)
}
