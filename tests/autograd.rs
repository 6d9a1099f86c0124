//! Gradients of every differentiable op: against central finite differences in f64 on the CPU
//! device, and the GPU's (f32) against the CPU's on every adapter.

use kiln::{DType, Device, Tensor};

fn gpus() -> Vec<Device> {
    kiln::device::test_devices()
        .expect("KILN_REQUIRE_GPU=1 and no GPU adapter")
        .into_iter()
        .filter(|d| !d.is_cpu())
        .collect()
}

/// A small deterministic generator (independent of kiln's).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[derive(Clone, Copy)]
enum Range {
    /// Uniform in [-1, 1].
    Any,
    /// Uniform in [0.5, 1.5] (log, sqrt, pow bases, divisors).
    Positive,
    /// Magnitudes in [0.2, 1] with either sign (kinks at 0: relu, abs).
    AwayFromZero,
}

type Op = fn(&[Tensor]) -> kiln::Result<Tensor>;

struct Case {
    name: &'static str,
    shapes: Vec<Vec<usize>>,
    range: Range,
    f: Op,
}

fn case(name: &'static str, shapes: &[&[usize]], range: Range, f: Op) -> Case {
    Case {
        name,
        shapes: shapes.iter().map(|s| s.to_vec()).collect(),
        range,
        f,
    }
}

fn values(rng: &mut Lcg, n: usize, range: Range) -> Vec<f64> {
    (0..n)
        .map(|_| {
            let u = rng.next();
            match range {
                Range::Any => 2.0 * u - 1.0,
                Range::Positive => 0.5 + u,
                Range::AwayFromZero => {
                    let m = 0.2 + 0.8 * rng.next();
                    if u < 0.5 {
                        -m
                    } else {
                        m
                    }
                }
            }
        })
        .collect()
}

/// `sum(f(inputs) * w)` and, when `grad`, the inputs' gradients.
fn run(
    f: Op,
    data: &[Vec<f64>],
    shapes: &[Vec<usize>],
    w: &[f64],
    dtype: DType,
    dev: &Device,
    grad: bool,
) -> (f64, Vec<Vec<f64>>) {
    let inputs: Vec<Tensor> = data
        .iter()
        .zip(shapes)
        .map(|(d, s)| {
            Tensor::from_f64_slice(d, s, dtype, dev)
                .unwrap()
                .requires_grad_(grad)
                .unwrap()
        })
        .collect();
    let y = f(&inputs).unwrap();
    let wt = Tensor::from_f64_slice(w, y.shape(), dtype, dev).unwrap();
    let loss = y.mul(&wt).unwrap().sum_all().unwrap();
    let value = loss.to_f64_vec().unwrap()[0];
    if !grad {
        return (value, vec![]);
    }
    loss.backward().unwrap();
    let grads = inputs
        .iter()
        .map(|t| match t.grad() {
            Some(g) => {
                assert_eq!(g.shape(), t.shape());
                g.to_f64_vec().unwrap()
            }
            None => vec![0.0; t.numel()],
        })
        .collect();
    (value, grads)
}

fn check(c: &Case) {
    let cpu = Device::cpu().unwrap();
    let mut rng = Lcg(0x5eed ^ c.name.len() as u64);
    let data: Vec<Vec<f64>> = c
        .shapes
        .iter()
        .map(|s| values(&mut rng, s.iter().product(), c.range))
        .collect();
    let probe: Vec<Tensor> = data
        .iter()
        .zip(&c.shapes)
        .map(|(d, s)| Tensor::from_f64_slice(d, s, DType::F64, &cpu).unwrap())
        .collect();
    let out_n = (c.f)(&probe).unwrap().numel();
    let w = values(&mut rng, out_n, Range::Any);

    let (_, analytic) = run(c.f, &data, &c.shapes, &w, DType::F64, &cpu, true);
    let eps = 1e-6;
    for (i, d) in data.iter().enumerate() {
        for j in 0..d.len() {
            let mut plus = data.clone();
            plus[i][j] += eps;
            let mut minus = data.clone();
            minus[i][j] -= eps;
            let lp = run(c.f, &plus, &c.shapes, &w, DType::F64, &cpu, false).0;
            let lm = run(c.f, &minus, &c.shapes, &w, DType::F64, &cpu, false).0;
            let numeric = (lp - lm) / (2.0 * eps);
            let a = analytic[i][j];
            assert!(
                (a - numeric).abs() <= 1e-6 + 1e-5 * numeric.abs(),
                "{}: d/d input {i}[{j}]: autograd {a}, finite differences {numeric}",
                c.name
            );
        }
    }

    for dev in gpus() {
        let (_, on_gpu) = run(c.f, &data, &c.shapes, &w, DType::F32, &dev, true);
        for (i, (g, want)) in on_gpu.iter().zip(&analytic).enumerate() {
            for (j, (a, b)) in g.iter().zip(want).enumerate() {
                assert!(
                    (a - b).abs() <= 2e-3 + 2e-3 * b.abs(),
                    "{} on {dev:?}: d/d input {i}[{j}]: {a}, CPU f64 {b}",
                    c.name
                );
            }
        }
    }
}

fn t(x: &[Tensor], i: usize) -> &Tensor {
    &x[i]
}

#[test]
fn unary_ops() {
    use Range::*;
    let cases = [
        case("neg", &[&[2, 3]], Any, |x| t(x, 0).neg()),
        case("abs", &[&[2, 3]], AwayFromZero, |x| t(x, 0).abs()),
        case("exp", &[&[2, 3]], Any, |x| t(x, 0).exp()),
        case("log", &[&[2, 3]], Positive, |x| t(x, 0).log()),
        case("sqrt", &[&[2, 3]], Positive, |x| t(x, 0).sqrt()),
        case("rsqrt", &[&[2, 3]], Positive, |x| t(x, 0).rsqrt()),
        case("reciprocal", &[&[2, 3]], Positive, |x| t(x, 0).reciprocal()),
        case("square", &[&[2, 3]], Any, |x| t(x, 0).square()),
        case("sin", &[&[2, 3]], Any, |x| t(x, 0).sin()),
        case("cos", &[&[2, 3]], Any, |x| t(x, 0).cos()),
        case("tanh", &[&[2, 3]], Any, |x| t(x, 0).tanh()),
        case("sigmoid", &[&[2, 3]], Any, |x| t(x, 0).sigmoid()),
        case("relu", &[&[2, 3]], AwayFromZero, |x| t(x, 0).relu()),
        case("gelu", &[&[2, 3]], Any, |x| t(x, 0).gelu()),
        case("gelu_tanh", &[&[2, 3]], Any, |x| t(x, 0).gelu_tanh()),
        case("silu", &[&[2, 3]], Any, |x| t(x, 0).silu()),
        case("clamp", &[&[3, 4]], Any, |x| t(x, 0).clamp(-0.5, 0.5)),
        case("contiguous", &[&[3, 4]], Any, |x| {
            t(x, 0).t()?.contiguous()?.exp()
        }),
    ];
    for c in &cases {
        check(c);
    }
}

#[test]
fn binary_and_scalar_ops_with_broadcasting() {
    use Range::*;
    let cases = [
        case("add", &[&[2, 3], &[3]], Any, |x| t(x, 0).add(t(x, 1))),
        case("sub", &[&[2, 1], &[1, 3]], Any, |x| t(x, 0).sub(t(x, 1))),
        case("mul", &[&[2, 3], &[2, 1]], Any, |x| t(x, 0).mul(t(x, 1))),
        case("div", &[&[2, 3], &[3]], Positive, |x| t(x, 0).div(t(x, 1))),
        case("pow", &[&[2, 3], &[2, 3]], Positive, |x| {
            t(x, 0).pow(t(x, 1))
        }),
        case("maximum", &[&[2, 3], &[2, 3]], Any, |x| {
            t(x, 0).maximum(t(x, 1))
        }),
        case("minimum", &[&[4], &[2, 4]], Any, |x| {
            t(x, 0).minimum(t(x, 1))
        }),
        case("add_relu", &[&[2, 3], &[3]], Any, |x| {
            t(x, 0).add_relu(t(x, 1))
        }),
        case("same operand twice", &[&[3]], Any, |x| t(x, 0).mul(t(x, 0))),
        case("scalars", &[&[2, 3]], Positive, |x| {
            t(x, 0)
                .add_scalar(1.0)?
                .sub_scalar(0.5)?
                .mul_scalar(3.0)?
                .div_scalar(2.0)?
                .pow_scalar(1.5)
        }),
        case("addcmul", &[&[3], &[3], &[3]], Any, |x| {
            t(x, 0).addcmul(t(x, 1), t(x, 2), 0.5)
        }),
        case("addcdiv", &[&[3], &[3], &[3]], Positive, |x| {
            t(x, 0).addcdiv(t(x, 1), t(x, 2), 0.5)
        }),
        case("lerp", &[&[3], &[3]], Any, |x| t(x, 0).lerp(t(x, 1), 0.3)),
        case("where", &[&[2, 3], &[3]], Any, |x| {
            let cond = t(x, 0).detach().gt_scalar(0.0)?;
            kiln::ops::where_(&cond, t(x, 0), t(x, 1))
        }),
        case("masked_fill", &[&[2, 3]], Any, |x| {
            let mask = t(x, 0).detach().lt_scalar(0.0)?;
            t(x, 0).masked_fill(&mask, 2.0)?.mul(t(x, 0))
        }),
    ];
    for c in &cases {
        check(c);
    }
}

#[test]
fn views() {
    use Range::*;
    let cases = [
        case("transpose", &[&[2, 3]], Any, |x| t(x, 0).t()?.exp()),
        case("permute", &[&[2, 3, 4]], Any, |x| {
            t(x, 0).permute(&[2, 0, 1])?.sin()
        }),
        case("narrow", &[&[4, 3]], Any, |x| {
            t(x, 0).narrow(0, 1, 2)?.exp()
        }),
        case("expand", &[&[3, 1]], Any, |x| {
            t(x, 0).expand(&[2, 3, 4])?.sin()
        }),
        case("reshape of a transpose", &[&[2, 3]], Any, |x| {
            t(x, 0).t()?.reshape(&[6])?.sin()
        }),
        case("view", &[&[2, 3]], Any, |x| t(x, 0).view(&[3, 2])?.sin()),
        case("squeeze unsqueeze flatten", &[&[2, 1, 3]], Any, |x| {
            t(x, 0)
                .squeeze(Some(1))?
                .unsqueeze(0)?
                .flatten(0, -1)?
                .sin()
        }),
        case("cat", &[&[2, 3], &[1, 3]], Any, |x| {
            Tensor::cat(&[t(x, 0).clone(), t(x, 1).clone()], 0)?.sin()
        }),
        case("stack", &[&[3], &[3]], Any, |x| {
            Tensor::stack(&[t(x, 0).clone(), t(x, 1).exp()?], 1)
        }),
        case("split", &[&[5, 2]], Any, |x| {
            let parts = t(x, 0).split(2, 0)?;
            parts[0]
                .sin()?
                .sum(&[0], false)?
                .add(&parts[2].sum(&[0], false)?)
        }),
    ];
    for c in &cases {
        check(c);
    }
}

#[test]
fn reductions_and_softmax() {
    use Range::*;
    let cases = [
        case("sum", &[&[2, 3, 4]], Any, |x| t(x, 0).sum(&[0, 2], false)),
        case("sum keepdim", &[&[2, 3]], Any, |x| t(x, 0).sum(&[1], true)),
        case("sum_all", &[&[2, 3]], Any, |x| t(x, 0).sum_all()),
        case("mean", &[&[2, 3, 4]], Any, |x| t(x, 0).mean(&[1], false)),
        case("prod", &[&[2, 3]], Positive, |x| t(x, 0).prod(&[1], false)),
        case("amax", &[&[3, 4]], Any, |x| t(x, 0).amax(&[1], false)),
        case("amin", &[&[3, 4]], Any, |x| t(x, 0).amin(&[0], true)),
        case("max_dim", &[&[3, 4]], Any, |x| {
            Ok(t(x, 0).max_dim(1, false)?.0)
        }),
        case("min_dim keepdim", &[&[3, 4]], Any, |x| {
            Ok(t(x, 0).min_dim(0, true)?.0)
        }),
        case("var", &[&[3, 4]], Any, |x| t(x, 0).var(&[1], 1, false)),
        case("std", &[&[3, 4]], Any, |x| t(x, 0).std(&[], 1, false)),
        case("softmax", &[&[3, 5]], Any, |x| t(x, 0).softmax(-1)),
        case("softmax dim 0", &[&[3, 5]], Any, |x| t(x, 0).softmax(0)),
        case("log_softmax", &[&[3, 5]], Any, |x| t(x, 0).log_softmax(1)),
    ];
    for c in &cases {
        check(c);
    }
}

#[test]
fn matmul_and_indexing() {
    use Range::*;
    let cases = [
        case("mm", &[&[3, 4], &[4, 5]], Any, |x| t(x, 0).matmul(t(x, 1))),
        case("linear (x @ w.t())", &[&[3, 4], &[5, 4]], Any, |x| {
            t(x, 0).matmul(&t(x, 1).t()?)
        }),
        case("vector @ matrix", &[&[4], &[4, 5]], Any, |x| {
            t(x, 0).matmul(t(x, 1))
        }),
        case("matrix @ vector", &[&[3, 4], &[4]], Any, |x| {
            t(x, 0).matmul(t(x, 1))
        }),
        case("dot", &[&[4], &[4]], Any, |x| t(x, 0).matmul(t(x, 1))),
        case("batched broadcast", &[&[2, 3, 4], &[4, 5]], Any, |x| {
            t(x, 0).matmul(t(x, 1))
        }),
        case("batched both", &[&[2, 1, 3, 4], &[3, 4, 2]], Any, |x| {
            t(x, 0).matmul(t(x, 1))
        }),
        case("gather", &[&[3, 4]], Any, |x| {
            let idx = Tensor::from_slice(&[0i32, 3, 3, 1, 2, 0], &[3, 2], x[0].device())?;
            t(x, 0).gather(1, &idx)
        }),
        case("index_select", &[&[4, 3]], Any, |x| {
            let idx = Tensor::from_slice(&[2i32, 0, 2], &[3], x[0].device())?;
            t(x, 0).index_select(0, &idx)
        }),
        case("embedding", &[&[5, 3]], Any, |x| {
            let ids = Tensor::from_slice(&[4i32, 1, 1, 0], &[2, 2], x[0].device())?;
            kiln::ops::embedding(t(x, 0), &ids)
        }),
        case("scatter_add", &[&[3, 4], &[3, 2]], Any, |x| {
            let idx = Tensor::from_slice(&[0i32, 3, 3, 3, 2, 0], &[3, 2], x[0].device())?;
            t(x, 0).scatter_add(1, &idx, t(x, 1))
        }),
    ];
    for c in &cases {
        check(c);
    }
}

#[test]
fn convolution_and_pooling() {
    use kiln::ops::{avg_pool2d, conv2d, max_pool2d, Conv2dParams};
    use Range::*;
    let cases = [
        case("conv2d", &[&[2, 2, 5, 5], &[3, 2, 3, 3], &[3]], Any, |x| {
            conv2d(t(x, 0), t(x, 1), Some(t(x, 2)), Conv2dParams::default())
        }),
        case(
            "conv2d stride padding dilation",
            &[&[1, 2, 6, 5], &[2, 2, 2, 3]],
            Any,
            |x| {
                let p = Conv2dParams {
                    stride: (2, 1),
                    padding: (1, 2),
                    dilation: (2, 1),
                    groups: 1,
                };
                conv2d(t(x, 0), t(x, 1), None, p)
            },
        ),
        case("conv2d groups", &[&[1, 4, 4, 4], &[6, 2, 3, 3]], Any, |x| {
            let p = Conv2dParams {
                padding: (1, 1),
                groups: 2,
                ..Default::default()
            };
            conv2d(t(x, 0), t(x, 1), None, p)
        }),
        case("max_pool2d", &[&[2, 2, 4, 6]], Any, |x| {
            max_pool2d(t(x, 0), (2, 2), (2, 2), (0, 0))
        }),
        case(
            "max_pool2d overlapping padded",
            &[&[1, 2, 5, 5]],
            Any,
            |x| max_pool2d(t(x, 0), (3, 3), (2, 2), (1, 1)),
        ),
        case("avg_pool2d", &[&[1, 2, 5, 5]], Any, |x| {
            avg_pool2d(t(x, 0), (3, 3), (2, 2), (1, 1))
        }),
    ];
    for c in &cases {
        check(c);
    }
}

/// Gradients of narrowed views of one tensor, which the engine writes into one buffer of the
/// tensor's gradient (`slice_into`, as PyTorch's `SplitBackward0` writes one tensor): disjoint
/// slices (`split`), an overlapping one, the tensor used whole too (its gradient arriving
/// before or after the slices'), and a slice whose output retains its gradient, on every GPU
/// against the formula; with the engine's fusions off too.
#[test]
fn narrowed_views_gradients_sum_into_their_input() {
    let mut rng = Lcg(9);
    let values: Vec<f32> = (0..4 * 9).map(|_| rng.next() as f32 * 2.0 - 1.0).collect();
    // d/dx of 2 a + 3 b + c^2 over the three column blocks, + 5 x(:, 2..6), + 7 x when whole.
    let want = |whole: bool| -> Vec<f32> {
        (0..4 * 9)
            .map(|e| {
                let (j, v) = (e % 9, values[e]);
                let block = [2.0, 3.0, 2.0 * v][j / 3];
                let overlap = if (2..6).contains(&j) { 5.0 } else { 0.0 };
                block + overlap + if whole { 7.0 } else { 0.0 }
            })
            .collect()
    };
    for dev in gpus() {
        for fused in [true, false] {
            for whole in [None, Some(true), Some(false)] {
                kiln::autograd::set_backward_epilogues(fused);
                let x = Tensor::from_vec(values.clone(), &[4, 9], &dev)
                    .unwrap()
                    .requires_grad_(true)
                    .unwrap();
                let parts = x.split(3, 1).unwrap();
                parts[1].retain_grad().unwrap();
                let mut loss = parts[0].mul_scalar(2.0).unwrap().sum(&[], false).unwrap();
                let early = x.mul_scalar(7.0).unwrap().sum(&[], false).unwrap();
                if whole == Some(true) {
                    loss = early.add(&loss).unwrap();
                }
                for term in [
                    parts[1].mul_scalar(3.0).unwrap(),
                    parts[2].mul(&parts[2]).unwrap(),
                    x.narrow(1, 2, 4).unwrap().mul_scalar(5.0).unwrap(),
                ] {
                    loss = loss.add(&term.sum(&[], false).unwrap()).unwrap();
                }
                if whole == Some(false) {
                    loss = loss.add(&early).unwrap();
                }
                loss.backward().unwrap();
                kiln::autograd::set_backward_epilogues(true);
                let got = x.grad().unwrap().to_vec::<f32>().unwrap();
                let w = want(whole.is_some());
                for (e, (a, b)) in got.iter().zip(&w).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-5,
                        "{dev:?} fused {fused} whole {whole:?} element {e}: {a} vs {b}"
                    );
                }
                let kept = parts[1].grad().unwrap().to_vec::<f32>().unwrap();
                assert!(kept.iter().all(|&v| v == 3.0), "{dev:?}: {kept:?}");
            }
        }
    }
}
