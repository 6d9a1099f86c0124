//! `--suite attention`: `scaled_dot_product_attention` at PyTorch's anchor shape (B8 H12 T1024
//! D64, causal; a small shape on CPU adapters), forward and forward + backward, f16 and f32, and
//! the memory forward + backward holds above q, k and v. FLOPs are counted as the anchor counts
//! them: 4 B H T^2 D forward, half of it when causal, 3.5x that for forward + backward.

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
    Ok(())
}
