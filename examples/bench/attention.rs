//! `--suite attention`: `scaled_dot_product_attention` at PyTorch's anchor shape (B8 H12 T1024
//! D64, causal; a small shape on CPU adapters), forward and forward + backward, f16 and f32, and
//! the memory forward + backward holds above q, k and v. FLOPs are counted as the anchor counts
//! them: 4 B H T^2 D forward, half of it when causal, 3.5x that for forward + backward. Then
//! the anchor's layer_norm (8192x768: GB/s of one read and one write, and forward + backward
//! time) and gelu(tanh) (8192x3072), smaller on CPU adapters.

use crate::{gpu_time, is_software, Row};
use kiln::ops::scaled_dot_product_attention as sdpa;
use kiln::{DType, Device, Tensor};

pub fn attention_suite(dev: &Device, rows: &mut Vec<Row>) -> kiln::Result<()> {
    let (b, h, t, d) = if is_software(dev) {
        (1, 2, 128, 32)
    } else {
        (8, 12, 1024, 64)
    };
    let mut dtypes = vec![DType::F32];
    if dev.adapter_info().is_some_and(|a| a.features.shader_f16) {
        dtypes.insert(0, DType::F16);
    }
    let fwd_flops = 4.0 * (b * h * t * t * d) as f64 / 2.0;
    let shape = [b, h, t, d];
    for dtype in dtypes {
        let leaf =
            || -> kiln::Result<Tensor> { Tensor::randn(&shape, dtype, dev)?.requires_grad_(true) };
        let (q, k, v) = (leaf()?, leaf()?, leaf()?);
        let g = Tensor::randn(&shape, dtype, dev)?;
        let name = format!("sdpa {dtype} B{b} H{h} T{t} D{d} causal");
        let mut push = |case: String, value: f64, unit: &'static str| {
            rows.push(Row {
                adapter: dev.name(),
                suite: "attention",
                case,
                value,
                unit,
            })
        };
        let forward = || kiln::no_grad(|| sdpa(&q, &k, &v, None, 0.0, true, None));
        let (secs, stamped) = gpu_time(dev, 10, forward)?;
        let clock = if stamped { "timestamps" } else { "wall clock" };
        push(
            format!("{name} forward ({clock})"),
            fwd_flops / secs / 1e12,
            "TFLOP/s",
        );
        let both = || -> kiln::Result<Tensor> {
            for x in [&q, &k, &v] {
                x.zero_grad(true)?;
            }
            let out = sdpa(&q, &k, &v, None, 0.0, true, None)?;
            out.backward_with(&g, false)?;
            Ok(out)
        };
        let (secs, stamped) = gpu_time(dev, 5, both)?;
        let clock = if stamped { "timestamps" } else { "wall clock" };
        push(
            format!("{name} forward + backward ({clock})"),
            3.5 * fwd_flops / secs / 1e12,
            "TFLOP/s",
        );
        for x in [&q, &k, &v] {
            x.zero_grad(true)?;
        }
        dev.synchronize()?;
        dev.reset_peak_memory_stats();
        let base = dev.memory_allocated();
        both()?;
        dev.synchronize()?;
        let above = (dev.max_memory_allocated() - base) as f64 / (1 << 20) as f64;
        push(
            format!("{name} forward + backward: memory above q, k, v"),
            above,
            "MiB",
        );
    }
    norm_rows(dev, rows)
}

/// layer_norm over 768 features (forward GB/s counting x read and y written, as the anchor;
/// forward + backward in microseconds) and gelu(tanh) over 3072 (GB/s), per float dtype.
fn norm_rows(dev: &Device, rows: &mut Vec<Row>) -> kiln::Result<()> {
    let tokens = if is_software(dev) { 256 } else { 8192 };
    let mut dtypes = vec![DType::F32];
    if dev.adapter_info().is_some_and(|a| a.features.shader_f16) {
        dtypes.push(DType::F16);
    }
    for dtype in dtypes {
        let mut push = |case: String, value: f64, unit: &'static str| {
            rows.push(Row {
                adapter: dev.name(),
                suite: "attention",
                case,
                value,
                unit,
            })
        };
        let param = |t: Tensor| t.to_dtype(dtype)?.detach().requires_grad_(true);
        let w = Some(param(Tensor::ones(&[768], DType::F32, dev)?)?);
        let b = Some(param(Tensor::zeros(&[768], DType::F32, dev)?)?);
        let x = Tensor::randn(&[tokens, 768], dtype, dev)?.requires_grad_(true)?;
        let g = Tensor::randn(&[tokens, 768], dtype, dev)?;
        let norm = || kiln::ops::layer_norm(&x, &[768], w.as_ref(), b.as_ref(), 1e-5);
        let bytes = 2.0 * (x.numel() * dtype.size_bytes()) as f64;
        let (secs, stamped) = gpu_time(dev, 50, || kiln::no_grad(norm))?;
        let clock = if stamped { "timestamps" } else { "wall clock" };
        let name = format!("layer_norm {dtype} {tokens}x768");
        push(
            format!("{name} forward ({clock})"),
            bytes / secs / 1e9,
            "GB/s",
        );
        let both = || -> kiln::Result<Tensor> {
            for t in [Some(&x), w.as_ref(), b.as_ref()].into_iter().flatten() {
                t.zero_grad(true)?;
            }
            let y = norm()?;
            y.backward_with(&g, false)?;
            Ok(y)
        };
        let (secs, stamped) = gpu_time(dev, 50, both)?;
        let clock = if stamped { "timestamps" } else { "wall clock" };
        push(
            format!("{name} forward + backward ({clock})"),
            secs * 1e6,
            "us",
        );
        let y = Tensor::randn(&[tokens, 3072], dtype, dev)?;
        let bytes = 2.0 * (y.numel() * dtype.size_bytes()) as f64;
        let (secs, stamped) = gpu_time(dev, 50, || y.gelu_tanh())?;
        let clock = if stamped { "timestamps" } else { "wall clock" };
        push(
            format!("gelu(tanh) {dtype} {tokens}x3072 ({clock})"),
            bytes / secs / 1e9,
            "GB/s",
        );
    }
    Ok(())
}
