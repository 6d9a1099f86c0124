//! `nn::MultiheadAttention` against a host reference written from PyTorch's definition (f64
//! loops), on every device: PyTorch's parameter names, `[T, B, E]` and `batch_first` inputs,
//! a bool mask that hides where True, and a float mask.

use kiln::nn::{Module, MultiheadAttention};
use kiln::{DType, Device, Tensor};

fn devices() -> Vec<Device> {
    kiln::device::test_devices().expect("KILN_REQUIRE_GPU=1 and no GPU adapter")
}

fn host(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
        .into_iter()
        .map(f64::from)
        .collect()
}

/// y = x W^T + b for rows of x.
fn project(x: &[f64], w: &[f64], b: &[f64], e: usize) -> Vec<f64> {
    x.chunks(e)
        .flat_map(|row| {
            (0..e).map(move |o| b[o] + (0..e).map(|i| row[i] * w[o * e + i]).sum::<f64>())
        })
        .collect()
}

/// The reference for batch-first `x` [B, T, E] (self-attention), `hide[i][j]` masking.
fn reference(
    m: &MultiheadAttention,
    x: &[f64],
    bt: (usize, usize),
    hide: &dyn Fn(usize, usize) -> bool,
) -> Vec<f64> {
    let (b, t) = bt;
    let w = host(&m.in_proj_weight);
    let bias = host(m.in_proj_bias.as_ref().unwrap());
    let e = (w.len() / 3).isqrt();
    let (h, d) = (m.num_heads, e / m.num_heads);
    let part = |i: usize| {
        project(
            x,
            &w[i * e * e..(i + 1) * e * e],
            &bias[i * e..(i + 1) * e],
            e,
        )
    };
    let (q, k, v) = (part(0), part(1), part(2));
    let mut y = vec![0.0; b * t * e];
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..t {
                let at = |r: usize, c: usize| (bi * t + r) * e + hi * d + c;
                let scores: Vec<f64> = (0..t)
                    .map(|j| match hide(i, j) {
                        true => f64::NEG_INFINITY,
                        false => {
                            (0..d).map(|c| q[at(i, c)] * k[at(j, c)]).sum::<f64>()
                                / (d as f64).sqrt()
                        }
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let ex: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = ex.iter().sum();
                for c in 0..d {
                    y[at(i, c)] = (0..t).map(|j| ex[j] / total * v[at(j, c)]).sum();
                }
            }
        }
    }
    let ow = host(&m.out_proj.weight);
    let ob = host(m.out_proj.bias.as_ref().unwrap());
    project(&y, &ow, &ob, e)
}

#[test]
fn matches_pytorchs_definition() {
    let (b, t, e) = (2, 5, 8);
    for dev in devices() {
        dev.manual_seed(1);
        let mut m = MultiheadAttention::new(e, 2, &dev).unwrap();
        let names: Vec<String> = m.named_parameters().into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            [
                "in_proj_weight",
                "in_proj_bias",
                "out_proj.weight",
                "out_proj.bias"
            ]
        );
        // Non-zero biases, so that the reference checks where they enter.
        for (_, p) in m.tensors_mut() {
            if p.rank() == 1 {
                *p = Tensor::rand(p.shape(), DType::F32, &dev)
                    .unwrap()
                    .requires_grad_(true)
                    .unwrap();
            }
        }
        let xb = Tensor::randn(&[b, t, e], DType::F32, &dev).unwrap();
        let x = host(&xb);
        let tol = 1e-4;
        let close = |got: &[f64], want: &[f64], what: &str| {
            let worst = got
                .iter()
                .zip(want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            assert!(worst < tol, "{dev:?} {what}: {worst}");
        };
        // [T, B, E] input (PyTorch's default), no mask.
        let y = m.forward(&xb.transpose(0, 1).unwrap()).unwrap();
        assert_eq!(y.shape(), &[t, b, e]);
        let got = host(&y.transpose(0, 1).unwrap().contiguous().unwrap());
        close(&got, &reference(&m, &x, (b, t), &|_, _| false), "no mask");
        // batch_first with a bool mask hiding the future (True = hidden).
        m.batch_first = true;
        let hide: Vec<f32> = (0..t * t)
            .map(|n| ((n % t) > (n / t)) as u8 as f32)
            .collect();
        let mask = Tensor::from_slice(&hide, &[t, t], &dev)
            .unwrap()
            .to_dtype(DType::Bool)
            .unwrap();
        let y = m.attend(&xb, &xb, &xb, Some(&mask), false).unwrap();
        let want = reference(&m, &x, (b, t), &|i, j| j > i);
        close(&host(&y), &want, "bool mask");
        // The same as a float mask, and as is_causal.
        let float = Tensor::zeros(&[t, t], DType::F32, &dev)
            .unwrap()
            .masked_fill(&mask, f64::NEG_INFINITY)
            .unwrap();
        close(
            &host(&m.attend(&xb, &xb, &xb, Some(&float), false).unwrap()),
            &want,
            "float mask",
        );
        close(
            &host(&m.attend(&xb, &xb, &xb, None, true).unwrap()),
            &want,
            "is_causal",
        );
        assert!(MultiheadAttention::new(8, 3, &dev).is_err());
    }
}
