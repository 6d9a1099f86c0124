//! `scaled_dot_product_attention`: the flash-attention kernels of every GPU adapter against the
//! CPU device's composite (forward, the three gradients, masks, causality, dropout replayed),
//! the composite against finite differences, PyTorch's safe softmax on fully masked rows,
//! PyTorch's errors, and the fused path's memory (no `L x S` matrix).

use kiln::ops::scaled_dot_product_attention as sdpa;
use kiln::{DType, Device, Error, Tensor};

fn devices() -> Vec<Device> {
    kiln::device::test_devices().expect("KILN_REQUIRE_GPU=1 and no GPU adapter")
}

/// The adapters where the flash kernels run: every GPU adapter but wgpu's GL backend (whose
/// llvmpipe takes the composite; see `ops/attention.rs`).
fn fused() -> Vec<Device> {
    devices()
        .into_iter()
        .filter(|d| {
            d.adapter_info()
                .is_some_and(|a| a.backend != wgpu::Backend::Gl)
        })
        .collect()
}

/// Deterministic values in [-1, 1) from a seed (an LCG), the same on every device.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn tensor(shape: &[usize], seed: u64, dtype: DType, dev: &Device) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_slice(&values(n, seed), shape, dev)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

fn host(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap()
}

fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs() / (1.0 + b.abs()))
        .fold(0.0f32, f32::max);
    assert!(
        worst <= tol && got.iter().all(|v| v.is_finite()),
        "{what}: worst relative error {worst} > {tol}"
    );
}

/// One call: the mask kind, the shapes, and the options.
struct Case {
    q: Vec<usize>,
    k: Vec<usize>,
    v: Vec<usize>,
    mask: Option<(Vec<usize>, bool)>,
    causal: bool,
    dropout: f64,
    scale: Option<f64>,
}

impl Case {
    fn new(q: &[usize], k: &[usize], v: &[usize]) -> Case {
        Case {
            q: q.to_vec(),
            k: k.to_vec(),
            v: v.to_vec(),
            mask: None,
            causal: false,
            dropout: 0.0,
            scale: None,
        }
    }
}

/// The bool mask of `shape`: every third position false, and the first row entirely false
/// (a fully masked row).
fn bool_mask(shape: &[usize], dev: &Device) -> Tensor {
    let n: usize = shape.iter().product();
    let cols = *shape.last().unwrap();
    let keep: Vec<f32> = (0..n)
        .map(|e| if e < cols || e % 3 == 1 { 0.0 } else { 1.0 })
        .collect();
    Tensor::from_slice(&keep, shape, dev)
        .unwrap()
        .gt_scalar(0.5)
        .unwrap()
}

/// Output and the three gradients (for an upstream gradient of the output's shape) on `dev`.
fn run(case: &Case, dtype: DType, dev: &Device) -> Vec<Vec<f32>> {
    dev.manual_seed(7);
    let leaf = |shape: &[usize], seed| {
        tensor(shape, seed, dtype, dev)
            .requires_grad_(true)
            .unwrap()
    };
    let (q, k, v) = (leaf(&case.q, 1), leaf(&case.k, 2), leaf(&case.v, 3));
    let mask = case.mask.as_ref().map(|(shape, boolean)| match boolean {
        true => bool_mask(shape, dev),
        false => tensor(shape, 4, dtype, dev),
    });
    let out = sdpa(
        &q,
        &k,
        &v,
        mask.as_ref(),
        case.dropout,
        case.causal,
        case.scale,
    )
    .unwrap();
    let g = tensor(out.shape(), 5, dtype, dev);
    out.backward_with(&g, false).unwrap();
    vec![
        host(&out),
        host(&q.grad().unwrap()),
        host(&k.grad().unwrap()),
        host(&v.grad().unwrap()),
    ]
}

fn cases() -> Vec<Case> {
    let mut cases = vec![Case::new(&[2, 3, 37, 16], &[2, 3, 45, 16], &[2, 3, 45, 16])];
    let mut causal = Case::new(&[1, 2, 70, 32], &[1, 2, 70, 32], &[1, 2, 70, 32]);
    causal.causal = true;
    cases.push(causal);
    let mut masked = Case::new(&[2, 2, 33, 24], &[2, 2, 20, 24], &[2, 2, 20, 40]);
    masked.mask = Some((vec![2, 1, 33, 20], true));
    cases.push(masked);
    let mut additive = Case::new(&[2, 2, 9, 8], &[2, 2, 11, 8], &[2, 2, 11, 8]);
    additive.mask = Some((vec![9, 11], false));
    additive.scale = Some(0.3);
    cases.push(additive);
    let mut dropout = Case::new(&[2, 2, 40, 16], &[2, 2, 40, 16], &[2, 2, 40, 16]);
    dropout.dropout = 0.3;
    dropout.causal = true;
    cases.push(dropout);
    // Rank 3 and rank 2, a head dim in the 128 class, and one past it (the composite).
    cases.push(Case::new(&[3, 5, 8], &[3, 6, 8], &[3, 6, 4]));
    cases.push(Case::new(&[5, 8], &[7, 8], &[7, 8]));
    cases.push(Case::new(
        &[1, 1, 10, 100],
        &[1, 1, 12, 100],
        &[1, 1, 12, 100],
    ));
    cases.push(Case::new(&[1, 1, 4, 130], &[1, 1, 5, 130], &[1, 1, 5, 130]));
    cases
}

#[test]
fn fused_kernels_match_the_cpu_composite() {
    let cpu = Device::cpu().unwrap();
    for dev in fused() {
        for (n, case) in cases().iter().enumerate() {
            let want = run(case, DType::F32, &cpu);
            let got = run(case, DType::F32, &dev);
            for (what, (g, w)) in ["out", "dq", "dk", "dv"].iter().zip(got.iter().zip(&want)) {
                assert_close(&format!("{dev:?} case {n} {what}"), g, w, 2e-4);
            }
        }
    }
}

/// The SIMT passes with 2 and 4 invocations a row (and 1, which GPUs with subgroups no longer
/// take in the backward passes), 128 rows a workgroup and staged tiles of 8 and 16 rows (the
/// GPUs' choices), forced on every adapter with subgroups: masks, causality over several
/// workgroups and tiles, dropout, and head dims in three classes.
#[test]
fn split_rows_match_the_cpu_composite() {
    let cpu = Device::cpu().unwrap();
    let mut all: Vec<Case> = cases().into_iter().take(5).collect();
    let mut long = Case::new(&[1, 2, 150, 64], &[1, 2, 150, 64], &[1, 2, 150, 64]);
    long.causal = true;
    all.push(long);
    let want: Vec<_> = all.iter().map(|c| run(c, DType::F32, &cpu)).collect();
    for dev in fused() {
        if !dev.adapter_info().is_some_and(|a| a.features.subgroups) {
            continue;
        }
        for (split, rows, tile) in [
            ("1", "64", "32"),
            ("2", "64", "16"),
            ("4", "64", "32"),
            ("1", "128", "16"),
            ("2", "128", "32"),
            ("1", "128", "8"),
            ("4", "64", "16"),
            ("2", "64", "8"),
        ] {
            kiln::kernels::tune::force_variant("flash split", Some(split));
            kiln::kernels::tune::force_variant("flash rows", Some(rows));
            kiln::kernels::tune::force_variant("flash tile", Some(tile));
            for (n, (case, want)) in all.iter().zip(&want).enumerate() {
                let got = run(case, DType::F32, &dev);
                for (what, (g, w)) in ["out", "dq", "dk", "dv"].iter().zip(got.iter().zip(want)) {
                    assert_close(
                        &format!("{dev:?} split {split} rows {rows} tile {tile} case {n} {what}"),
                        g,
                        w,
                        2e-4,
                    );
                }
            }
        }
        kiln::kernels::tune::force_variant("flash split", None);
        kiln::kernels::tune::force_variant("flash rows", None);
        kiln::kernels::tune::force_variant("flash tile", None);
    }
}

/// wgpu's GL backend runs the composite: one small case against the CPU device's.
#[test]
fn the_gl_composite_matches_the_cpu() {
    let cpu = Device::cpu().unwrap();
    let gl = devices().into_iter().filter(|d| {
        d.adapter_info()
            .is_some_and(|a| a.backend == wgpu::Backend::Gl)
    });
    for dev in gl {
        let mut case = Case::new(&[1, 2, 5, 8], &[1, 2, 6, 8], &[1, 2, 6, 8]);
        case.causal = true;
        let want = run(&case, DType::F32, &cpu);
        let got = run(&case, DType::F32, &dev);
        for (what, (g, w)) in ["out", "dq", "dk", "dv"].iter().zip(got.iter().zip(&want)) {
            assert_close(&format!("{dev:?} {what}"), g, w, 2e-4);
        }
    }
}

#[test]
fn f16_kernels_match_the_cpu_composite_in_f32() {
    let cpu = Device::cpu().unwrap();
    for dev in fused() {
        if !dev.adapter_info().is_some_and(|a| a.features.shader_f16) {
            continue;
        }
        // Where f16 runs on cooperative matrices, every case and longer causal ones (several
        // workgroups of 64 rows and tiles of 32 keys, GPT-2's head dim, a ragged end).
        let coop = dev
            .adapter_info()
            .is_some_and(|a| a.features.cooperative_matrix);
        let mut all = cases();
        if coop {
            for (t, d) in [(200, 64), (131, 32), (96, 16)] {
                let mut long = Case::new(&[2, 3, t, d], &[2, 3, t, d], &[2, 3, t, d]);
                long.causal = t != 96;
                all.push(long);
            }
            let mut masked = Case::new(&[1, 2, 150, 64], &[1, 2, 170, 64], &[1, 2, 170, 64]);
            masked.mask = Some((vec![1, 2, 150, 170], false));
            masked.dropout = 0.2;
            all.push(masked);
        } else {
            all.truncate(3);
        }
        for case in &all {
            let want = run(case, DType::F32, &cpu);
            let got = run(case, DType::F16, &dev);
            for (what, (g, w)) in ["out", "dq", "dk", "dv"].iter().zip(got.iter().zip(&want)) {
                assert_close(&format!("{dev:?} f16 {what}"), g, w, 3e-2);
            }
        }
    }
}

/// Output and gradients of attention over [1, 2, 300, 64] under an additive mask that hides
/// the keys after each query (causality) and grows by 0.375 a key (12 a tile of 32), so that every row's running maximum passes the
/// forward's lazy-rescale threshold again in every tile it sees (`flash_attn_coop_fwd.wgsl`).
fn growing_maximum(dtype: DType, dev: &Device) -> Vec<Vec<f32>> {
    let (t, d) = (300, 64);
    let ramp: Vec<f32> = (0..t * t)
        .map(|e| match e % t <= e / t {
            true => 0.375 * (e % t) as f32,
            false => f32::NEG_INFINITY,
        })
        .collect();
    let mask = Tensor::from_slice(&ramp, &[t, t], dev)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let leaf = |seed| {
        tensor(&[1, 2, t, d], seed, dtype, dev)
            .requires_grad_(true)
            .unwrap()
    };
    let (q, k, v) = (leaf(1), leaf(2), leaf(3));
    let out = sdpa(&q, &k, &v, Some(&mask), 0.0, false, None).unwrap();
    out.backward_with(&tensor(&[1, 2, t, d], 5, dtype, dev), false)
        .unwrap();
    [out, q.grad().unwrap(), k.grad().unwrap(), v.grad().unwrap()]
        .iter()
        .map(host)
        .collect()
}

#[test]
fn a_running_maximum_that_keeps_growing_matches_the_cpu() {
    let want = growing_maximum(DType::F32, &Device::cpu().unwrap());
    for dev in fused() {
        let f16 = dev.adapter_info().is_some_and(|a| a.features.shader_f16);
        for (dtype, tol) in [(DType::F32, 2e-4), (DType::F16, 3e-2)] {
            if dtype == DType::F16 && !f16 {
                continue;
            }
            let got = growing_maximum(dtype, &dev);
            for (what, (g, w)) in ["out", "dq", "dk", "dv"].iter().zip(got.iter().zip(&want)) {
                assert_close(&format!("{dev:?} {dtype:?} {what}"), g, w, tol);
            }
        }
    }
}

#[test]
fn a_noncontiguous_query_reads_through_its_strides() {
    for dev in devices() {
        // [B, L, H, E] viewed as [B, H, L, E], as a transformer splits its heads.
        let qs = tensor(&[2, 9, 3, 16], 1, DType::F32, &dev);
        let q = qs.transpose(1, 2).unwrap();
        let k = tensor(&[2, 3, 9, 16], 2, DType::F32, &dev);
        let v = tensor(&[2, 3, 9, 16], 3, DType::F32, &dev);
        let got = sdpa(&q, &k, &v, None, 0.0, true, None).unwrap();
        let want = sdpa(&q.contiguous().unwrap(), &k, &v, None, 0.0, true, None).unwrap();
        assert_close(&format!("{dev:?}"), &host(&got), &host(&want), 1e-6);
    }
}

/// The output, its layout, and the gradient of a [B, T, 3 x H x D] projection whose thirds are
/// split into q, k and v heads as GPT-2 splits them, for an upstream gradient laid out
/// token-major or contiguous.
fn split_heads(dev: &Device, dtype: DType, token_major_grad: bool) -> (bool, Vec<f32>, Vec<f32>) {
    let (b, t, h, d) = (2, 70, 3, 32);
    dev.manual_seed(11);
    let qkv = tensor(&[b, t, 3 * h * d], 1, dtype, dev)
        .requires_grad_(true)
        .unwrap();
    let heads = |i: usize| {
        qkv.narrow(2, i * h * d, h * d)
            .unwrap()
            .reshape(&[b as isize, t as isize, h as isize, d as isize])
            .unwrap()
            .transpose(1, 2)
            .unwrap()
    };
    let out = sdpa(&heads(0), &heads(1), &heads(2), None, 0.2, true, None).unwrap();
    let g = tensor(&[b, t, h, d], 5, dtype, dev)
        .transpose(1, 2)
        .unwrap();
    let g = match token_major_grad {
        true => g,
        false => g.contiguous().unwrap(),
    };
    out.backward_with(&g, false).unwrap();
    let token_major = out.transpose(1, 2).unwrap().is_contiguous();
    (token_major, host(&out), host(&qkv.grad().unwrap()))
}

/// Heads split from one projection: the fused kernels lay the output out as q is (its
/// transpose back to [B, T, H, D] is contiguous, as PyTorch's flash attention makes it), and
/// the output and the projection's gradient match the CPU device's, with dropout replayed,
/// whichever layout the upstream gradient has; in f16 too where the adapter has it (GPT-2's
/// shapes take the cooperative-matrix kernels where there are some).
#[test]
fn heads_split_from_one_projection_come_back_token_major() {
    let cpu = Device::cpu().unwrap();
    let (_, want_out, want_grad) = split_heads(&cpu, DType::F32, true);
    for dev in fused() {
        let f16 = dev.adapter_info().is_some_and(|a| a.features.shader_f16);
        for (dtype, tol) in [(DType::F32, 2e-4), (DType::F16, 3e-2)] {
            if dtype == DType::F16 && !f16 {
                continue;
            }
            for token_major_grad in [true, false] {
                let (token_major, out, grad) = split_heads(&dev, dtype, token_major_grad);
                let what = format!("{dev:?} {dtype:?} token-major gradient {token_major_grad}");
                assert!(token_major, "{what}: the output is not laid out as q");
                assert_close(&format!("{what}: out"), &out, &want_out, tol);
                assert_close(&format!("{what}: d qkv"), &grad, &want_grad, tol);
            }
        }
    }
}

#[test]
fn fully_masked_rows_give_zeros_and_zero_gradients() {
    for dev in devices() {
        let q = tensor(&[1, 1, 4, 8], 1, DType::F32, &dev)
            .requires_grad_(true)
            .unwrap();
        let k = tensor(&[1, 1, 6, 8], 2, DType::F32, &dev)
            .requires_grad_(true)
            .unwrap();
        let v = tensor(&[1, 1, 6, 8], 3, DType::F32, &dev);
        let mask = bool_mask(&[4, 6], &dev);
        let out = sdpa(&q, &k, &v, Some(&mask), 0.0, false, None).unwrap();
        let o = host(&out);
        assert!(o[..8].iter().all(|&x| x == 0.0), "{dev:?}: {:?}", &o[..8]);
        assert!(o.iter().all(|x| x.is_finite()));
        out.sum_all().unwrap().backward().unwrap();
        let dq = host(&q.grad().unwrap());
        assert!(dq[..8].iter().all(|&x| x == 0.0) && dq.iter().all(|x| x.is_finite()));
        assert!(host(&k.grad().unwrap()).iter().all(|x| x.is_finite()));
    }
}

#[test]
fn dropout_is_replayed_and_scales_what_it_keeps() {
    for dev in devices() {
        let q = tensor(&[1, 2, 16, 8], 1, DType::F32, &dev);
        let k = tensor(&[1, 2, 16, 8], 2, DType::F32, &dev);
        let v = Tensor::ones(&[1, 2, 16, 8], DType::F32, &dev).unwrap();
        dev.manual_seed(3);
        let a = host(&sdpa(&q, &k, &v, None, 0.5, false, None).unwrap());
        let b = host(&sdpa(&q, &k, &v, None, 0.5, false, None).unwrap());
        dev.manual_seed(3);
        let again = host(&sdpa(&q, &k, &v, None, 0.5, false, None).unwrap());
        assert_eq!(a, again, "{dev:?}: a reseeded draw repeats");
        assert_ne!(a, b, "{dev:?}: consecutive draws differ");
        // With v all ones each output is the kept probability mass times 2: on average 1.
        let mean = a.iter().sum::<f32>() / a.len() as f32;
        assert!((mean - 1.0).abs() < 0.25, "{dev:?}: mean {mean}");
    }
}

/// The composite (the reference) against central differences, in f64 on the CPU device.
#[test]
fn the_reference_gradients_match_finite_differences() {
    let dev = Device::cpu().unwrap();
    let shapes = [[1usize, 2, 3, 4], [1, 2, 5, 4], [1, 2, 5, 3]];
    let mask = bool_mask(&[3, 5], &dev);
    let base: Vec<Vec<f32>> = (0..3)
        .map(|i| values(shapes[i].iter().product(), i as u64 + 1))
        .collect();
    let loss = |inputs: &[Vec<f32>], grad: bool| {
        let ts: Vec<Tensor> = (0..3)
            .map(|i| {
                Tensor::from_slice(&inputs[i], &shapes[i], &dev)
                    .unwrap()
                    .to_dtype(DType::F64)
                    .unwrap()
                    .requires_grad_(grad)
                    .unwrap()
            })
            .collect();
        let out = sdpa(&ts[0], &ts[1], &ts[2], Some(&mask), 0.0, false, Some(0.7)).unwrap();
        let w = tensor(out.shape(), 9, DType::F64, &dev);
        let l = out.mul(&w).unwrap().sum_all().unwrap();
        (l, ts)
    };
    let (l, ts) = loss(&base, true);
    l.backward().unwrap();
    for i in 0..3 {
        let analytic = ts[i].grad().unwrap().to_vec::<f64>().unwrap();
        for e in 0..base[i].len() {
            let h = 1e-3f32;
            let mut up = base.clone();
            up[i][e] += h;
            let mut down = base.clone();
            down[i][e] -= h;
            let f = |x: &[Vec<f32>]| loss(x, false).0.item::<f64>().unwrap();
            let numeric = (f(&up) - f(&down)) / (2.0 * h as f64);
            assert!(
                (numeric - analytic[e]).abs() < 1e-3,
                "input {i} element {e}: {numeric} vs {}",
                analytic[e]
            );
        }
    }
}

#[test]
fn bad_inputs_get_pytorchs_errors_and_leave_the_device_intact() {
    for dev in devices() {
        let q = tensor(&[1, 2, 4, 8], 1, DType::F32, &dev);
        let k = tensor(&[1, 2, 5, 8], 2, DType::F32, &dev);
        let v = tensor(&[1, 2, 5, 8], 3, DType::F32, &dev);
        let before = dev.memory_allocated();
        let bad_k = tensor(&[1, 2, 5, 6], 2, DType::F32, &dev);
        let bad_v = tensor(&[1, 2, 4, 8], 3, DType::F32, &dev);
        let int_mask = Tensor::zeros(&[4, 5], DType::I32, &dev).unwrap();
        let wide_mask = Tensor::zeros(&[4, 6], DType::Bool, &dev).unwrap();
        let mask = Tensor::zeros(&[4, 5], DType::Bool, &dev).unwrap();
        let cases: Vec<(&str, kiln::Result<Tensor>)> = vec![
            ("head dims", sdpa(&q, &bad_k, &v, None, 0.0, false, None)),
            (
                "key/value lengths",
                sdpa(&q, &k, &bad_v, None, 0.0, false, None),
            ),
            ("dropout 1", sdpa(&q, &k, &v, None, 1.0, false, None)),
            ("dropout < 0", sdpa(&q, &k, &v, None, -0.1, false, None)),
            (
                "mask dtype",
                sdpa(&q, &k, &v, Some(&int_mask), 0.0, false, None),
            ),
            (
                "mask shape",
                sdpa(&q, &k, &v, Some(&wide_mask), 0.0, false, None),
            ),
            (
                "mask and causal",
                sdpa(&q, &k, &v, Some(&mask), 0.0, true, None),
            ),
            (
                "rank 1",
                sdpa(&q.reshape(&[-1]).unwrap(), &k, &v, None, 0.0, false, None),
            ),
        ];
        for (what, r) in cases {
            match r {
                Err(Error::ShapeMismatch { op, .. }) | Err(Error::InvalidArgument { op, .. }) => {
                    assert_eq!(op, "scaled_dot_product_attention", "{what}")
                }
                other => panic!("{dev:?} {what}: {other:?}"),
            }
        }
        let half = q.to_dtype(DType::F16);
        if let Ok(h) = half {
            let r = sdpa(&h, &k, &v, None, 0.0, false, None);
            assert!(
                matches!(r, Err(Error::InvalidArgument { .. })),
                "dtypes: {r:?}"
            );
        }
        if !dev.is_cpu() {
            let kc = tensor(&[1, 2, 5, 8], 2, DType::F32, &Device::cpu().unwrap());
            let r = sdpa(&q, &kc, &v, None, 0.0, false, None);
            assert!(
                matches!(r, Err(Error::DeviceMismatch { .. })),
                "devices: {r:?}"
            );
        }
        drop((bad_k, bad_v, int_mask, wide_mask, mask));
        assert_eq!(dev.memory_allocated(), before, "{dev:?}: nothing leaked");
        assert!(sdpa(&q, &k, &v, None, 0.0, false, None).is_ok());
    }
}

/// The fused path never allocates the `L x S` scores: forward and backward at L = S = 512
/// stay far below the 1 MiB one score matrix takes (the composite needs several).
#[test]
fn the_fused_path_holds_no_score_matrix() {
    for dev in fused() {
        let shape = [1, 1, 512, 16];
        let q = tensor(&shape, 1, DType::F32, &dev)
            .requires_grad_(true)
            .unwrap();
        let k = tensor(&shape, 2, DType::F32, &dev)
            .requires_grad_(true)
            .unwrap();
        let v = tensor(&shape, 3, DType::F32, &dev)
            .requires_grad_(true)
            .unwrap();
        let g = tensor(&shape, 4, DType::F32, &dev);
        dev.synchronize().unwrap();
        dev.reset_peak_memory_stats();
        let base = dev.memory_allocated();
        let out = sdpa(&q, &k, &v, None, 0.0, true, None).unwrap();
        out.backward_with(&g, false).unwrap();
        let above = dev.max_memory_allocated() - base;
        let scores = 512 * 512 * 4;
        assert!(
            above < scores / 4,
            "{dev:?}: {above} bytes above the inputs"
        );
    }
}
