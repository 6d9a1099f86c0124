//! Tensors larger than one storage binding whose kernels bind windows of them (Note [Windows]
//! in `src/kernels/launch.rs`): a contiguous cast in chunks, and cross_entropy of f16 logits
//! under autocast, whose f32 copy of the log-probabilities and nll_loss's f32 gradient are the
//! tensors GPT-2's step makes too large for one binding from batch 11 at T1024. They run on
//! adapters whose binding limit is small enough for the host to check the results (lavapipe's
//! 128 MiB), against the formulas in f64; each fails with a too-large binding without windows.

use kiln::amp::{with_autocast, DeviceType};
use kiln::nn::cross_entropy;
use kiln::{DType, Device, Tensor};

/// GPU devices with f16 whose binding limit (bytes) is at most 256 MiB: larger ones would
/// need tensors the host takes minutes to check.
fn small_binding_gpus() -> Vec<(Device, u64)> {
    kiln::device::test_devices()
        .expect("KILN_REQUIRE_GPU=1 and no GPU adapter")
        .into_iter()
        .filter_map(|d| {
            let info = d.adapter_info()?;
            let limit = info.limits.max_storage_buffer_binding_size;
            (info.features.shader_f16 && limit <= 256 << 20).then_some((d, limit))
        })
        .collect()
}

#[test]
fn a_cast_larger_than_one_binding_runs_in_chunks() {
    let cpu = Device::cpu().unwrap();
    for (dev, limit) in small_binding_gpus() {
        // An f32 output past the limit, read from a view 12 elements into its block.
        let n = (limit as usize / 4 + 4096).next_multiple_of(4) + 16;
        let values: Vec<f32> = (0..n)
            .map(|i| ((i % 4093) as f32 - 2046.0) * 0.25)
            .collect();
        let x = Tensor::from_slice(&values, &[n], &cpu)
            .unwrap()
            .to_dtype(DType::F16)
            .unwrap()
            .to_device(&dev)
            .unwrap();
        let view = x.narrow(0, 12, n - 16).unwrap();
        let y = view.to_dtype(DType::F32).unwrap();
        assert!((y.numel() * 4) as u64 > limit);
        let got = y.to_vec::<f32>().unwrap();
        let bad = got.iter().zip(&values[12..n - 4]).position(|(a, b)| a != b);
        assert_eq!(bad, None, "{dev:?}: the f16 -> f32 cast differs");
        // And back: f32 -> f16 from an input past the limit.
        let back = y.to_dtype(DType::F16).unwrap().to_device(&cpu).unwrap();
        let back = back.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(back, got, "{dev:?}: the f32 -> f16 cast differs");
    }
}

/// The loss and gradient of cross_entropy over f16 logits `x` (as f32 `xs`, [n, c]) with
/// `labels` (-100 ignored), in f64: the loss and, for each row of `rows`, its gradient.
fn reference(xs: &[f32], c: usize, labels: &[i32], rows: &[usize]) -> (f64, Vec<Vec<f64>>) {
    let count = labels.iter().filter(|&&t| t != -100).count() as f64;
    let lse = |i: usize| {
        let row = &xs[i * c..(i + 1) * c];
        let m = row.iter().fold(f32::MIN, |a, &b| a.max(b)) as f64;
        m + row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln()
    };
    let loss = labels
        .iter()
        .enumerate()
        .filter(|(_, &t)| t != -100)
        .map(|(i, &t)| lse(i) - xs[i * c + t as usize] as f64)
        .sum::<f64>()
        / count;
    let grads = rows
        .iter()
        .map(|&i| {
            let l = lse(i);
            (0..c)
                .map(|j| match labels[i] {
                    -100 => 0.0,
                    t => ((xs[i * c + j] as f64 - l).exp() - (t == j as i32) as u8 as f64) / count,
                })
                .collect()
        })
        .collect();
    (loss, grads)
}

/// GPT-2's loss at a size past one binding: [n, 50257] f16 logits whose f32 copy passes the
/// limit, so nll_loss's forward takes two windows of rows. With the fused backward (records at
/// the start of nll_loss's gradient) and with epilogues off (nll_loss's whole gradient written
/// in windows, then the copy's backward cast in chunks), against f64.
#[test]
fn cross_entropy_past_one_binding_under_autocast_matches_f64() {
    let cpu = Device::cpu().unwrap();
    for (dev, limit) in small_binding_gpus() {
        let c = 50257usize;
        let n = (limit as usize).div_ceil(c * 4) + 40;
        cpu.manual_seed(11);
        let x16 = Tensor::randn(&[n, c], DType::F32, &cpu)
            .unwrap()
            .mul_scalar(2.0)
            .unwrap()
            .to_dtype(DType::F16)
            .unwrap();
        let xs = x16.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        let labels: Vec<i32> = (0..n as i32)
            .map(|i| match i % 97 {
                5 => -100,
                _ => ((i as i64 * 7919) % c as i64) as i32,
            })
            .collect();
        // Rows at both ends, an ignored one, and both sides of the windows' boundary.
        let window_rows = (limit as usize - 256) / (c * 4);
        let rows = [0, 5, window_rows - 1, window_rows, window_rows + 1, n - 1];
        let (loss, grads) = reference(&xs, c, &labels, &rows);
        let y = Tensor::from_slice(&labels, &[n], &dev).unwrap();
        for fused in [true, false] {
            kiln::autograd::set_backward_epilogues(fused);
            let x = x16.to_device(&dev).unwrap().requires_grad_(true).unwrap();
            let l = with_autocast(DeviceType::Gpu, DType::F16, true, || cross_entropy(&x, &y))
                .unwrap()
                .unwrap();
            l.backward().unwrap();
            kiln::autograd::set_backward_epilogues(true);
            let got = l.item::<f32>().unwrap() as f64;
            assert!(
                (got - loss).abs() <= 2e-4 * loss.abs(),
                "{dev:?} fused {fused}: loss {got} against {loss}"
            );
            let g = x.grad().unwrap();
            for (&i, want) in rows.iter().zip(&grads) {
                let row = g
                    .narrow(0, i, 1)
                    .unwrap()
                    .to_dtype(DType::F32)
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap();
                let worst = row
                    .iter()
                    .zip(want)
                    .fold(0f64, |m, (&a, &b)| m.max((a as f64 - b).abs()));
                // The largest entries are -1 / count + p / count (1.4e-3, f16 steps of 9.5e-7):
                // their rounding here is 5e-8.
                assert!(
                    worst <= 2e-7,
                    "{dev:?} fused {fused}: row {i} off by {worst}"
                );
            }
        }
    }
}

/// The windowed loss allocates as the dry run of it plans: the same steps on the device and on
/// its planning twin (which checks the target's bindings and launches nothing) leave equal
/// allocator statistics. The windows add no allocation of their own.
#[test]
fn a_windowed_loss_plans_as_it_runs() {
    let steps = |dev: &Device, n: usize| -> kiln::Result<()> {
        let c = 50257usize;
        let labels: Vec<i32> = (0..n as i32).map(|i| (i * 31) % c as i32).collect();
        let y = Tensor::from_slice(&labels, &[n], dev)?;
        let x = Tensor::zeros(&[n, c], DType::F16, dev)?.requires_grad_(true)?;
        let l = with_autocast(DeviceType::Gpu, DType::F16, true, || cross_entropy(&x, &y))??;
        l.backward()?;
        drop((l, x));
        dev.synchronize()
    };
    for (dev, limit) in small_binding_gpus() {
        let n = (limit as usize).div_ceil(50257 * 4) + 40;
        let plan = dev.planning_twin().unwrap();
        steps(&dev, n).unwrap();
        steps(&plan, n).unwrap();
        let (real, dry) = (dev.memory_stats(), plan.memory_stats());
        assert!(
            real["allocated_bytes.all.peak"] as u64 > 2 * limit,
            "{dev:?}"
        );
        for (key, value) in &real {
            assert_eq!(dry.get(key), Some(value), "{dev:?}: {key}");
        }
    }
}
