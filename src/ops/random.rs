//! `rand`, `randn` and friends from the device's counter-based generator (`manual_seed` as in
//! PyTorch). A draw reads (seed, offset) and advances the offset, so consecutive draws differ
//! and a reseeded run repeats exactly, on every adapter.

use super::u32_of;
use crate::kernels::{launch, Kernel};
use crate::tensor::{DType, Tensor};
use crate::{Device, Error, Result};

fn draw(
    shape: &[usize],
    dtype: DType,
    device: &Device,
    normal: bool,
    a: f64,
    b: f64,
) -> Result<Tensor> {
    let op = if normal { "randn" } else { "rand" };
    if !dtype.is_float() {
        return Err(Error::UnsupportedDType {
            op,
            dtype,
            why: "(random floats)".into(),
        });
    }
    let _scope = crate::alloc::kiln_scope(
        || if normal { "normal_" } else { "uniform_" }.into(),
        "kiln",
    );
    // An overflowing shape draws nothing here; `draw_at`'s allocation reports it.
    let n = shape
        .iter()
        .try_fold(1usize, |a, &b| a.checked_mul(b))
        .unwrap_or(0);
    let (seed, offset) = device.advance_rng(if normal { 2 * n as u64 } else { n as u64 });
    draw_at(shape, dtype, device, normal, (a, b), (seed, offset))
}

/// The draw of `shape` at the generator state `(seed, offset)`, which it does not advance:
/// element e is counter `offset + e` (`2e`, `2e + 1` for normal numbers). Dropout inside a
/// fused kernel draws the same counters, so a composite reference can replay its mask.
pub(crate) fn draw_at(
    shape: &[usize],
    dtype: DType,
    device: &Device,
    normal: bool,
    (a, b): (f64, f64),
    (seed, offset): (u64, u64),
) -> Result<Tensor> {
    let op = if normal { "randn" } else { "rand" };
    let out = Tensor::empty(shape, dtype, device)?;
    let n = out.numel();
    if n == 0 {
        return Ok(out);
    }
    if device.is_cpu() {
        let values: Vec<f64> = (0..n as u32)
            .map(|e| {
                crate::cpu::random::sample(seed, offset as u32, e, normal, a as f32, b as f32)
                    as f64
            })
            .collect();
        let filled = Tensor::from_f64_slice(&values, shape, dtype, device)?;
        return Ok(filled);
    }
    let imm = [
        u32_of(op, n)?,
        seed as u32,
        (seed >> 32) as u32,
        offset as u32,
        normal as u32,
        (a as f32).to_bits(),
        (b as f32).to_bits(),
        0,
    ];
    launch(Kernel::Random(dtype), &[&out.storage.block], &imm, n as u64)?;
    Ok(out)
}

impl Tensor {
    /// Uniform numbers in [0, 1).
    pub fn rand(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        draw(shape, dtype, device, false, 0.0, 1.0)
    }

    /// Standard normal numbers.
    pub fn randn(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        draw(shape, dtype, device, true, 0.0, 1.0)
    }

    /// Uniform numbers in [low, high).
    pub fn uniform(
        shape: &[usize],
        low: f64,
        high: f64,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        draw(shape, dtype, device, false, low, high)
    }

    /// Normal numbers with `mean` and `std`.
    pub fn normal(
        shape: &[usize],
        mean: f64,
        std: f64,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        draw(shape, dtype, device, true, mean, std)
    }

    /// `torch.rand_like`: uniform in [0, 1), this tensor's shape, dtype and device.
    pub fn rand_like(&self) -> Result<Tensor> {
        Self::rand(self.shape(), self.dtype, self.device())
    }

    /// `torch.randn_like`: standard normal, this tensor's shape, dtype and device.
    pub fn randn_like(&self) -> Result<Tensor> {
        Self::randn(self.shape(), self.dtype, self.device())
    }
}
