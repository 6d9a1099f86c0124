//! Tensors larger than one storage binding whose kernels bind windows of them (Note [Windows]
//! in `src/kernels/launch.rs`): a contiguous cast in chunks, and cross_entropy of f16 logits
//! under autocast, whose f32 copy of the log-probabilities and nll_loss's f32 gradient are the
//! tensors GPT-2's step makes too large for one binding from batch 11 at T1024; then the f16
//! logits themselves (batch 21): their row copies, log_softmax and cross_entropy's backward,
//! and the head's tensor-core products; and the f32 head's products on the SIMT kernels (batch
//! 11 in f32). They run on adapters whose binding limit is small
//! enough for the host to check the results (lavapipe's 128 MiB; the products on adapters with
//! cooperative matrices, the H200's 2 GiB), against the formulas in f64; each fails with a
//! too-large binding without windows.

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

/// Rows of `t` (a matrix) as f64: `t` copied to the host as it is stored, converted there (a
/// kernel over a view binds the view's whole block).
fn rows_of(t: &Tensor, rows: &[usize]) -> Vec<Vec<f64>> {
    let host = t.to_device(&Device::cpu().unwrap()).unwrap();
    rows.iter()
        .map(|&i| {
            let row = host.narrow(0, i, 1).unwrap().to_dtype(DType::F32).unwrap();
            row.to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|&v| v as f64)
                .collect()
        })
        .collect()
}

/// Deterministic values of row i, column j (exact in f16).
fn value(i: usize, j: usize) -> f32 {
    ((i * 131 + j * 7) % 509) as f32 / 64.0 - 4.0
}

/// A matrix of `value`s as f16 on `dev`, made on the host (in f16 there: a debug build's CPU
/// casts of tens of millions of elements cost CI seconds).
fn matrix(n: usize, c: usize, dev: &Device) -> Tensor {
    let values: Vec<half::f16> = (0..n * c)
        .map(|e| half::f16::from_f32(value(e / c, e % c)))
        .collect();
    Tensor::from_slice(&values, &[n, c], dev).unwrap()
}

/// Rows at both ends and around the first windows' boundaries, for rows of `row_bytes` (the
/// windows hold at most `limit / row_bytes` rows).
fn probe_rows(n: usize, limit: u64, row_bytes: usize) -> Vec<usize> {
    let w = limit as usize / row_bytes;
    let mut rows: Vec<usize> = [0, 1, w / 2, w - 130, w - 1, w, w + 1, n - 2, n - 1]
        .into_iter()
        .filter(|&i| i < n)
        .collect();
    rows.dedup();
    rows
}

/// A matrix narrowed along its columns and made contiguous (`copy_rows`, GPT-2's head crops its
/// padded product so) where the source and the copy pass the binding limit: 2-byte rows of
/// 50257 from rows of 50304, in windows of rows.
#[test]
fn row_copies_past_one_binding_run_in_windows() {
    for (dev, limit) in small_binding_gpus() {
        // (f16 only: f32 rows take the same windows, and CI's two cores pay for each size.)
        let dtype = DType::F16;
        let (padded, c) = (50304usize, 50257usize);
        let es = dtype.size_bytes();
        let n = limit as usize / (c * es) + 30;
        let x = matrix(n, padded, &dev);
        let y = x.narrow(1, 0, c).unwrap().contiguous().unwrap();
        assert!((y.numel() * es) as u64 > limit);
        let rows = probe_rows(n, limit, c * es);
        for (&i, got) in rows.iter().zip(rows_of(&y, &rows)) {
            let want: Vec<f64> = (0..c).map(|j| value(i, j) as f64).collect();
            assert_eq!(got, want, "{dev:?}: row {i} of the copy");
        }
    }
}

/// log_softmax of f16 rows of 50257 (GPT-2's logits) past the binding limit, in windows of
/// rows, against f64.
#[test]
fn log_softmax_past_one_binding_runs_in_windows() {
    for (dev, limit) in small_binding_gpus() {
        // Relative: f16 outputs near -11 are steps of 2^-7 apart. (f16 only, as above.)
        let c = 50257usize;
        let n = limit as usize / (c * 2) + 30;
        let y = matrix(n, c, &dev).log_softmax(-1).unwrap();
        let rows = probe_rows(n, limit, c * 2);
        for (&i, got) in rows.iter().zip(rows_of(&y, &rows)) {
            let xs: Vec<f64> = (0..c).map(|j| value(i, j) as f64).collect();
            let m = xs.iter().fold(f64::MIN, |a, &b| a.max(b));
            let lse = m + xs.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
            let worst = got.iter().zip(&xs).fold(0f64, |w, (g, x)| {
                w.max((g - (x - lse)).abs() / (x - lse).abs().max(1.0))
            });
            assert!(worst <= 1e-3, "{dev:?}: row {i} off by {worst}");
        }
    }
}

/// cross_entropy under autocast of f16 logits that themselves pass the binding limit (GPT-2's
/// from batch 21 at T1024): log_softmax's f16 forward and the fused backward's f16 gradient run
/// in windows of rows too, against f64.
#[test]
fn cross_entropy_of_f16_logits_past_one_binding_matches_f64() {
    for (dev, limit) in small_binding_gpus() {
        let c = 50257usize;
        // (Rows in fours, as GPT-2's B * T: the f32 copy's cast takes whole vectors.)
        let n = (limit as usize / (c * 2) + 30).next_multiple_of(4);
        let x16 = matrix(n, c, &dev);
        let xs: Vec<f32> = (0..n * c).map(|e| value(e / c, e % c)).collect();
        let labels: Vec<i32> = (0..n as i32)
            .map(|i| match i % 97 {
                5 => -100,
                _ => ((i as i64 * 7919) % c as i64) as i32,
            })
            .collect();
        let rows = probe_rows(n, limit, c * 2);
        let (loss, grads) = reference(&xs, c, &labels, &rows);
        let y = Tensor::from_slice(&labels, &[n], &dev).unwrap();
        let x = x16.requires_grad_(true).unwrap();
        let l = with_autocast(DeviceType::Gpu, DType::F16, true, || cross_entropy(&x, &y))
            .unwrap()
            .unwrap();
        l.backward().unwrap();
        let got = l.item::<f32>().unwrap() as f64;
        assert!(
            (got - loss).abs() <= 2e-4 * loss.abs(),
            "{dev:?}: loss {got} against {loss}"
        );
        let g = x.grad().unwrap();
        for ((&i, want), got) in rows.iter().zip(&grads).zip(rows_of(&g, &rows)) {
            let worst = got
                .iter()
                .zip(want)
                .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
            // Gradient entries are at most 1 / count (7.3e-4 here), f16 steps of 4.8e-7.
            assert!(worst <= 2e-7, "{dev:?}: row {i} off by {worst}");
        }
    }
}

/// f16 tensor-core products whose operands or output pass the binding limit, in windows (Note
/// [Windows]): `x @ W^T` writing rows past it (GPT-2's head forward), `g @ W` reading a row-major
/// A past it, and `g^T @ x` reading a transposed A past it along K (the embedding's gradient),
/// at sampled entries against f64. Runs where the adapter has cooperative matrices (the H200:
/// 2 GiB bindings, about 5 GB of tensors).
#[test]
fn tensor_core_products_past_one_binding_run_in_windows() {
    let gpus = kiln::device::test_devices().expect("KILN_REQUIRE_GPU=1 and no GPU adapter");
    for dev in gpus {
        let Some(info) = dev.adapter_info() else {
            continue;
        };
        if !info.features.cooperative_matrix || !info.features.shader_f16 {
            continue;
        }
        let limit = info.limits.max_storage_buffer_binding_size as usize;
        // GPT-2's head: 768 wide, so that every product takes the tensor-core routes.
        let (v, d) = (50304usize, 768usize);
        let m = (limit / (v * 2) + 300).next_multiple_of(128);
        let cpu = Device::cpu().unwrap();
        let small = |rows: usize, seed: u64| {
            cpu.manual_seed(seed);
            // (Scaled so that g @ W, 50304 terms deep, stays within f16.)
            let t = Tensor::randn(&[rows, d], DType::F32, &cpu)
                .unwrap()
                .mul_scalar(0.1)
                .unwrap()
                .to_dtype(DType::F16)
                .unwrap();
            let host: Vec<f64> = t
                .to_dtype(DType::F32)
                .unwrap()
                .to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|&x| x as f64)
                .collect();
            (t.to_device(&dev).unwrap(), host)
        };
        let (x, xs) = small(m, 1);
        let (w, ws) = small(v, 2);
        // Against the sum of the terms' magnitudes (f32 sums) and the f16 rounding of the result.
        let close = |what: &str, got: f64, (want, size): (f64, f64)| {
            let tol = 1e-4 * size + 1e-3 * want.abs();
            assert!(
                (got - want).abs() <= tol,
                "{dev:?} {what}: {got} against {want}"
            );
        };
        let sums = |terms: &mut dyn Iterator<Item = f64>| {
            terms.fold((0.0, 0.0), |(s, a), t| (s + t, a + t.abs()))
        };
        // Rows on both sides of the output's first window (its rows of 100608 bytes).
        let w0 = limit / (v * 2) / 128 * 128;
        let probe = [0, w0 - 1, w0, m - 1];
        let cols = [0, 1, 777, v - 1];
        // x @ W^T: [m, 50304] f16 past the limit, from a row-major x and from a transposed one
        // (each window of rows reads its own rows of x).
        let xt = x.t().unwrap().contiguous().unwrap();
        for (what, a) in [("x", x.clone()), ("x^T^T", xt.t().unwrap())] {
            let logits = a.matmul(&w.t().unwrap()).unwrap();
            assert!(logits.numel() * 2 > limit);
            for (&i, row) in probe.iter().zip(rows_of(&logits, &probe)) {
                for &j in &cols {
                    let (a, b) = (&xs[i * d..(i + 1) * d], &ws[j * d..(j + 1) * d]);
                    let want = sums(&mut a.iter().zip(b).map(|(p, q)| p * q));
                    close(&format!("{what}: logits[{i}, {j}]"), row[j], want);
                }
            }
        }
        drop(xt);
        let logits = x.matmul(&w.t().unwrap()).unwrap();
        // g @ W, g (the logits) row-major past the limit.
        let g = logits;
        let gw = g.matmul(&w).unwrap();
        let g_rows = rows_of(&g, &probe);
        for ((&i, grow), out) in probe.iter().zip(&g_rows).zip(rows_of(&gw, &probe)) {
            for c in [0, 5, 400, d - 1] {
                let want = sums(&mut (0..v).map(|j| grow[j] * ws[j * d + c]));
                close(&format!("(g @ W)[{i}, {c}]"), out[c], want);
            }
        }
        // g^T @ x: K = m along the rows of g, read transposed.
        let gtx = g.t().unwrap().matmul(&x).unwrap();
        let gt_rows = rows_of(&gtx, &cols);
        let gh = g.to_device(&cpu).unwrap();
        drop(g);
        for (&j, out) in cols.iter().zip(gt_rows) {
            let column = gh.narrow(1, j, 1).unwrap().contiguous().unwrap();
            let column = column
                .to_dtype(DType::F32)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            let column: Vec<f64> = column.iter().map(|&x| x as f64).collect();
            for c in [0, 9, d - 1] {
                let want = sums(&mut (0..m).map(|i| column[i] * xs[i * d + c]));
                close(&format!("(g^T @ x)[{j}, {c}]"), out[c], want);
            }
        }
    }
}

/// f32 products on the SIMT kernels whose operands or output pass the binding limit, in windows
/// (Note [Windows]): GPT-2's f32 head at a smaller width and vocabulary (K 64, 4099 columns,
/// ragged as 50257 is): `x @ W^T` writing rows past it, `g @ W` reading a row-major A past it,
/// and `g^T @ x` reading a transposed A past it along K, at rows around the windows' boundaries
/// against f64.
#[test]
fn f32_products_past_one_binding_run_in_windows() {
    for (dev, limit) in small_binding_gpus() {
        let (v, d) = (4099usize, 64usize);
        let m = limit as usize / (v * 4) + 300;
        let host = |rows: usize, salt: usize| -> Vec<f32> {
            (0..rows * d)
                .map(|e| value(e / d + salt, e % d) / 8.0)
                .collect()
        };
        let (xs, ws) = (host(m, 0), host(v, 1000));
        let x = Tensor::from_slice(&xs, &[m, d], &dev).unwrap();
        let w = Tensor::from_slice(&ws, &[v, d], &dev).unwrap();
        let close = |what: &str, got: f64, want: f64, size: f64| {
            assert!(
                (got - want).abs() <= 1e-5 * size + 1e-5,
                "{dev:?} {what}: {got} against {want}"
            );
        };
        let dot = |a: &[f32], b: &mut dyn Iterator<Item = f64>| {
            a.iter().zip(b).fold((0.0, 0.0), |(s, z), (&p, q)| {
                (s + p as f64 * q, z + (p as f64 * q).abs())
            })
        };
        let probe = probe_rows(m, limit, v * 4);
        let cols = [0, 1, 777, v - 1];
        let g = x.matmul(&w.t().unwrap()).unwrap();
        assert!((g.numel() * 4) as u64 > limit);
        let g_rows = rows_of(&g, &probe);
        for (&i, row) in probe.iter().zip(&g_rows) {
            for &j in &cols {
                let (want, size) = dot(
                    &xs[i * d..(i + 1) * d],
                    &mut ws[j * d..(j + 1) * d].iter().map(|&q| q as f64),
                );
                close(&format!("(x @ W^T)[{i}, {j}]"), row[j], want, size);
            }
        }
        let gw = g.matmul(&w).unwrap();
        for ((&i, grow), out) in probe.iter().zip(&g_rows).zip(rows_of(&gw, &probe)) {
            for c in [0, 5, d - 1] {
                let col: Vec<f32> = grow.iter().map(|&q| q as f32).collect();
                let (want, size) = dot(&col, &mut (0..v).map(|j| ws[j * d + c] as f64));
                close(&format!("(g @ W)[{i}, {c}]"), out[c], want, size);
            }
        }
        // g^T @ x: K = m along the rows of g; its columns from the host copy.
        let gtx = g.t().unwrap().matmul(&x).unwrap();
        let gh = g.to_device(&Device::cpu().unwrap()).unwrap();
        drop(g);
        for (&j, out) in cols.iter().zip(rows_of(&gtx, &cols)) {
            let column = gh.narrow(1, j, 1).unwrap().contiguous().unwrap();
            let column = column.to_vec::<f32>().unwrap();
            for c in [0, 9, d - 1] {
                let (want, size) = dot(&column, &mut (0..m).map(|i| xs[i * d + c] as f64));
                close(&format!("(g^T @ x)[{j}, {c}]"), out[c], want, size);
            }
        }
    }
}

/// Reductions and elementwise ops over views of an f32 tensor past the binding limit (Note
/// [Windows]): the row-wise argmax, maximum, sum and mean (windows of rows), sums and maxima
/// over the rows (windows of them, as vectors of columns or strided), a transposed view copied
/// and mapped (blocks of both dims), the whole sum (a row longer than a window, in chunks), and relu of a misaligned row and of a narrowed view,
/// an add of two narrowed views (windows of the outermost dim), against f64 on the host.
#[test]
fn reductions_and_views_past_one_binding_run_in_windows() {
    for (dev, limit) in small_binding_gpus() {
        let c = 4099usize;
        let n = limit as usize / (c * 4) + 30;
        let host: Vec<f32> = (0..n * c).map(|e| value(e / c, e % c)).collect();
        let x = Tensor::from_slice(&host, &[n, c], &dev).unwrap();
        assert!((x.numel() * 4) as u64 > limit);
        let row = |i: usize| &host[i * c..(i + 1) * c];
        let probe = probe_rows(n, limit, c * 4);
        let at = |t: &Tensor| rows_of(&t.reshape(&[n as isize, 1]).unwrap(), &probe);
        let close = |what: &str, got: f64, want: f64, tol: f64| {
            assert!(
                (got - want).abs() <= tol,
                "{dev:?} {what}: {got} against {want}"
            );
        };
        let (values, indices) = x.max_dim(-1, false).unwrap();
        let (values, indices) = (at(&values), at(&indices.to_dtype(DType::F32).unwrap()));
        let amax = at(&x.amax(&[-1], false).unwrap());
        let sums = at(&x.sum(&[-1], false).unwrap());
        let means = at(&x.mean(&[-1], false).unwrap());
        for (k, &i) in probe.iter().enumerate() {
            let r = row(i);
            let (arg, max) =
                r.iter().enumerate().fold(
                    (0, f32::MIN),
                    |(a, m), (j, &v)| {
                        if v > m {
                            (j, v)
                        } else {
                            (a, m)
                        }
                    },
                );
            close(&format!("max_dim value {i}"), values[k][0], max as f64, 0.0);
            close(
                &format!("max_dim index {i}"),
                indices[k][0],
                arg as f64,
                0.0,
            );
            close(&format!("amax {i}"), amax[k][0], max as f64, 0.0);
            let sum: f64 = r.iter().map(|&v| v as f64).sum();
            close(&format!("sum {i}"), sums[k][0], sum, 1e-5 * 4.0 * c as f64);
            close(
                &format!("mean {i}"),
                means[k][0],
                sum / c as f64,
                1e-5 * 4.0,
            );
        }
        // The leading dim reduced over rows of 4099 (a strided view once permuted: windows of
        // the reduced dim, into partials).
        let col_sums = x.sum(&[0], false).unwrap().to_vec::<f32>().unwrap();
        let col_max = x.amax(&[0], false).unwrap().to_vec::<f32>().unwrap();
        for j in [0, 1, 777, c - 1] {
            let column = (0..n).map(|i| host[i * c + j]);
            let want: f64 = column.clone().map(|v| v as f64).sum();
            let max = column.fold(f32::MIN, f32::max);
            close(
                &format!("sum over rows {j}"),
                col_sums[j] as f64,
                want,
                1e-5 * 4.0 * n as f64,
            );
            close(
                &format!("max over rows {j}"),
                col_max[j] as f64,
                max as f64,
                0.0,
            );
        }
        // Column sums (the leading dim reduced) of the same values as rows of 4100.
        let m = n * c / 4100;
        let x4 = Tensor::from_slice(&host[..m * 4100], &[m, 4100], &dev).unwrap();
        let cols = x4.sum(&[0], false).unwrap().to_vec::<f32>().unwrap();
        for j in [0, 1, 777, 4099] {
            let want: f64 = (0..m).map(|i| host[i * 4100 + j] as f64).sum();
            close(
                &format!("column sum {j}"),
                cols[j] as f64,
                want,
                1e-5 * 4.0 * m as f64,
            );
        }
        drop(x4);
        let total: f64 = host.iter().map(|&v| v as f64).sum();
        let got = x.sum(&[], false).unwrap().to_vec::<f32>().unwrap()[0] as f64;
        close("sum of all", got, total, 1e-6 * 4.0 * (n * c) as f64);
        // A transpose's copy and an op on the transposed view (blocks of both dims, in place).
        let xt = x.t().unwrap().contiguous().unwrap();
        let rt = x.t().unwrap().neg().unwrap().relu().unwrap();
        let cols_t = [0, 1, 777, c - 1];
        for (k, (row, relu_row)) in rows_of(&xt, &cols_t)
            .iter()
            .zip(rows_of(&rt, &cols_t))
            .enumerate()
        {
            let j = cols_t[k];
            for &i in &probe {
                let v = host[i * c + j] as f64;
                close(&format!("x.t()[{j}, {i}]"), row[i], v, 0.0);
                close(
                    &format!("relu(-x.t())[{j}, {i}]"),
                    relu_row[i],
                    (-v).max(0.0),
                    0.0,
                );
            }
        }
        drop((xt, rt));
        // A misaligned row (its offset is odd) and narrowed views, elementwise.
        let last = x
            .narrow(0, n - 1, 1)
            .unwrap()
            .neg()
            .unwrap()
            .relu()
            .unwrap();
        for (j, v) in last.to_vec::<f32>().unwrap().iter().enumerate() {
            close(
                &format!("relu(-x[-1])[{j}]"),
                *v as f64,
                (-row(n - 1)[j]).max(0.0) as f64,
                0.0,
            );
        }
        let (left, right) = (x.narrow(1, 3, 100).unwrap(), x.narrow(1, 200, 100).unwrap());
        let relu = rows_of(&left.relu().unwrap(), &probe);
        let sum = rows_of(&left.add(&right).unwrap(), &probe);
        for (k, &i) in probe.iter().enumerate() {
            for j in [0, 1, 57, 99] {
                let (l, r) = (row(i)[3 + j] as f64, row(i)[200 + j] as f64);
                close(
                    &format!("relu(x[:, 3:103])[{i}, {j}]"),
                    relu[k][j],
                    l.max(0.0),
                    0.0,
                );
                close(
                    &format!("(x[:, 3:103] + x[:, 200:300])[{i}, {j}]"),
                    sum[k][j],
                    l + r,
                    0.0,
                );
            }
        }
    }
}

/// Elementwise ops over contiguous f16 tensors past the binding limit (GPT-2's logits from batch
/// 21 are such), in windows of vectors: a binary op, a scalar op, a unary op and an in-place
/// clamp, checked on the host around the windows' boundaries.
#[test]
fn elementwise_ops_past_one_binding_run_in_windows() {
    for (dev, limit) in small_binding_gpus() {
        let n = (limit as usize / 2 + 4096).next_multiple_of(4);
        let v = |e: usize| value(e / 509, e % 509);
        let x: Vec<half::f16> = (0..n).map(|e| half::f16::from_f32(v(e))).collect();
        let x = Tensor::from_slice(&x, &[n], &dev).unwrap();
        let half = x.mul_scalar(0.5).unwrap();
        let sum = x.add(&half).unwrap();
        let neg = sum.neg().unwrap();
        neg.clamp_(-3.0, 5.0).unwrap();
        // Element e, read back in its aligned 16 bytes.
        let at = |t: &Tensor, e: usize| {
            let chunk = t
                .narrow(0, e / 8 * 8, 8)
                .unwrap()
                .to_vec::<half::f16>()
                .unwrap();
            chunk[e % 8].to_f32()
        };
        // Elements around the first windows' ends (at most `limit` bytes each) and the last.
        let w = limit as usize / 2;
        let probe = [0, 1, w / 2 - 1, w / 2, w - 9, w - 8, w, w + 1, n - 1];
        for &e in &probe {
            // x and x / 2 are multiples of 1/128 below 8 in magnitude: exact in f16, and so is
            // their sum.
            let (want_h, want_s) = (v(e) * 0.5, v(e) * 1.5);
            assert_eq!(
                (at(&half, e), at(&sum, e)),
                (want_h, want_s),
                "{dev:?}: element {e}"
            );
            assert_eq!(
                at(&neg, e),
                (-want_s).clamp(-3.0, 5.0),
                "{dev:?}: element {e}"
            );
        }
    }
}
