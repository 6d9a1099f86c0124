//! nn layers against their definitions, state dicts in safetensors files, the optimizers'
//! state appearing on the first step, and SGD's multi-parameter launches against the CPU.

#[path = "common/observe.rs"]
mod observe;
use kiln::nn::{
    load_safetensors, load_state_dict, save_safetensors, state_dict, BatchNorm, Dropout, LayerNorm,
    Linear, LstmCell, Module, Relu, Sequential,
};
use kiln::optim::{Adam, Optimizer, Sgd};
use kiln::{DType, Device, Tensor};
use observe::{kernel_trace, stats_delta};

fn devices() -> Vec<Device> {
    kiln::device::test_devices().expect("KILN_REQUIRE_GPU=1 and no GPU adapter")
}

/// A normal f32 tensor of each shape, drawn in order from `dev`'s generator.
fn randn_each(shapes: &[&[usize]], dev: &Device) -> Vec<Tensor> {
    shapes
        .iter()
        .map(|s| Tensor::randn(s, DType::F32, dev).unwrap())
        .collect()
}

fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol)
}

#[test]
fn linear_is_x_wt_plus_b_and_initialised_in_bounds() {
    for dev in devices() {
        dev.manual_seed(1);
        let l = Linear::new(3, 2, true, &dev).unwrap();
        let w = l.weight.to_vec::<f32>().unwrap();
        let b = l.bias.as_ref().unwrap().to_vec::<f32>().unwrap();
        let bound = 1.0 / 3f32.sqrt();
        assert!(w.iter().chain(&b).all(|v| v.abs() <= bound));
        let x = [1.0f32, -2.0, 0.5];
        let y = l
            .forward(&Tensor::from_slice(&x, &[1, 3], &dev).unwrap())
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let want: Vec<f32> = (0..2)
            .map(|o| (0..3).map(|i| w[o * 3 + i] * x[i]).sum::<f32>() + b[o])
            .collect();
        assert!(close(&y, &want, 1e-5), "{dev:?}: {y:?} vs {want:?}");
    }
}

#[test]
fn batchnorm_normalises_and_tracks_running_stats() {
    for dev in devices() {
        let mut bn = BatchNorm::new(2, &dev).unwrap();
        let data = [1.0f32, 10.0, 3.0, 20.0, 5.0, 30.0, 7.0, 40.0];
        let x = Tensor::from_slice(&data, &[4, 2], &dev).unwrap();
        let y = bn.forward(&x).unwrap().to_vec::<f32>().unwrap();
        // Column 0: mean 4, biased var 5.
        let z = |v: f32| (v - 4.0) / (5.0f32 + 1e-5).sqrt();
        assert!(close(
            &[y[0], y[2], y[4], y[6]],
            &[z(1.0), z(3.0), z(5.0), z(7.0)],
            1e-4
        ));
        // running_mean = 0.9 * 0 + 0.1 * mean; running_var = 0.9 + 0.1 * unbiased var (20/3).
        let rm = bn.running_mean.to_vec::<f32>().unwrap();
        let rv = bn.running_var.to_vec::<f32>().unwrap();
        assert!(close(&rm, &[0.4, 2.5], 1e-5), "{rm:?}");
        assert!(close(&[rv[0]], &[0.9 + 0.1 * 20.0 / 3.0], 1e-4), "{rv:?}");
        bn.eval();
        let e = bn.forward(&x).unwrap().to_vec::<f32>().unwrap();
        let want = (1.0 - 0.4) / (rv[0] + 1e-5).sqrt();
        assert!(
            (e[0] - want).abs() < 1e-4,
            "{dev:?}: eval uses running stats"
        );
    }
}

/// The fused GPU batch norm (f32) against the composite formula on the CPU device: output,
/// running statistics, and the gradients of input, weight and bias, in training and in
/// evaluation, for 2-D and 4-D inputs, rows of vec4s and not, several chunks per channel,
/// an input at an offset and a non-contiguous one; and the same with the ReLU fused into its
/// passes (`batch_norm_relu`, outputs of both signs) against the CPU's batch norm and ReLU.
#[test]
fn batch_norm_fused_matches_the_cpu_reference() {
    use kiln::ops::{batch_norm, batch_norm_relu};
    let cpu = Device::cpu().unwrap();
    let vals = |n: usize, seed: u64, shift: f32| -> Vec<f32> {
        (0..n)
            .map(|i| {
                ((((i as u64 + 1) * (seed * 2654435761 + 97)) % 1000) as f32 / 250.0 - 2.0) + shift
            })
            .collect()
    };
    // (full shape, batch rows taken from 1, permuted to non-contiguous)
    // [4, 16, 7, 7]: rows of 49 scalars; [32, 4, 16, 16]: two chunks a channel, and a
    // workgroup's units across five planes.
    let cases: [(&[usize], Option<usize>, bool); 9] = [
        (&[4, 6], None, false),
        (&[3, 5, 7, 5], None, false),
        (&[2, 8, 16, 16], None, false),
        (&[8, 2, 32, 32], None, false),
        (&[4, 16, 7, 7], None, false),
        (&[32, 4, 16, 16], None, false),
        (&[3, 3, 4, 4], Some(2), false),
        (&[4, 3, 3, 3], Some(3), false),
        (&[2, 4, 6, 5], None, true),
    ];
    for dev in devices().into_iter().filter(|d| !d.is_cpu()) {
        for (k, &(shape, rows, permuted)) in cases.iter().enumerate() {
            let c = shape[1];
            let n: usize = shape.iter().product();
            let xv = vals(n, k as u64 + 3, 3.0);
            let rv = vals(n, k as u64 + 11, 0.0);
            let wv = vals(c, 5, 1.0);
            let bv = vals(c, 7, 0.0);
            let run = |d: &Device, training: bool, relu: bool| -> Vec<Vec<f32>> {
                let op = if relu { batch_norm_relu } else { batch_norm };
                let mut x = Tensor::from_slice(&xv, shape, d).unwrap();
                if permuted {
                    // The same logical [N, C, H, W] read through transposed storage.
                    let sw = [shape[0], shape[1], shape[3], shape[2]];
                    x = Tensor::from_slice(&xv, &sw, d)
                        .unwrap()
                        .transpose(2, 3)
                        .unwrap();
                }
                if let Some(r) = rows {
                    x = x.narrow(0, 1, r).unwrap();
                }
                let x = x.requires_grad_(true).unwrap();
                let w = Tensor::from_slice(&wv, &[c], d)
                    .unwrap()
                    .requires_grad_(true)
                    .unwrap();
                let b = Tensor::from_slice(&bv, &[c], d)
                    .unwrap()
                    .requires_grad_(true)
                    .unwrap();
                let rm = Tensor::from_slice(&vals(c, 9, 0.5), &[c], d).unwrap();
                let rvar = Tensor::from_slice(&vals(c, 13, 3.0), &[c], d).unwrap();
                let y = op(
                    &x,
                    Some(&rm),
                    Some(&rvar),
                    Some(&w),
                    Some(&b),
                    training,
                    0.1,
                    1e-5,
                )
                .unwrap();
                let r = Tensor::from_slice(&rv[..y.numel()], y.shape(), d).unwrap();
                y.mul(&r)
                    .unwrap()
                    .sum(&[], false)
                    .unwrap()
                    .backward()
                    .unwrap();
                [
                    y,
                    x.grad().unwrap(),
                    w.grad().unwrap(),
                    b.grad().unwrap(),
                    rm,
                    rvar,
                ]
                .iter()
                .map(|t| t.contiguous().unwrap().to_vec::<f32>().unwrap())
                .collect()
            };
            // The finalize folded into the partial sums' launch (where the device can), and
            // in a launch of its own.
            let passes = [(true, false), (false, false), (true, true), (false, true)]
                .into_iter()
                .flat_map(|p| [(p, None), (p, Some("launch"))]);
            for ((training, relu), finalize) in passes {
                kiln::kernels::tune::force_variant("batch norm finalize", finalize);
                let got = run(&dev, training, relu);
                kiln::kernels::tune::force_variant("batch norm finalize", None);
                let want = run(&cpu, training, relu);
                if relu {
                    let zeros = got[0].iter().filter(|&&v| v == 0.0).count();
                    assert!(zeros > 0 && zeros < got[0].len(), "{shape:?}: both signs");
                }
                let names = [
                    "y",
                    "x.grad",
                    "weight.grad",
                    "bias.grad",
                    "running_mean",
                    "running_var",
                ];
                for ((g, w), name) in got.iter().zip(&want).zip(names) {
                    let scale = w.iter().fold(1.0f32, |m, v| m.max(v.abs()));
                    assert!(
                        close(g, w, 2e-4 * scale),
                        "{dev:?} {shape:?} rows {rows:?} training {training} relu {relu} finalize {finalize:?}: {name}: {:?} vs {:?}",
                        &g[..g.len().min(8)],
                        &w[..w.len().min(8)]
                    );
                }
            }
        }
        // PyTorch's checks.
        let one = Tensor::ones(&[1, 3], DType::F32, &dev).unwrap();
        let w = Tensor::ones(&[3], DType::F32, &dev).unwrap();
        let e = batch_norm(&one, None, None, Some(&w), None, true, 0.1, 1e-5).unwrap_err();
        assert!(
            e.to_string().contains("more than 1 value per channel"),
            "{e}"
        );
        let x = Tensor::ones(&[2, 4], DType::F32, &dev).unwrap();
        let e = batch_norm(&x, None, None, Some(&w), None, true, 0.1, 1e-5).unwrap_err();
        assert!(
            matches!(
                e,
                kiln::Error::ShapeMismatch {
                    op: "batch_norm",
                    ..
                }
            ),
            "{e}"
        );
        let e = batch_norm(&x, None, None, None, None, false, 0.1, 1e-5).unwrap_err();
        assert!(e.to_string().contains("evaluation"), "{e}");
    }
}

/// Batch norm of an f16 input with f32 parameters and running statistics (autocast's
/// activations with a module's weights, as PyTorch's kernels take them): the fused f16 passes
/// (f32 statistics) against the CPU's f32 formula on the same f16 values, in training and
/// evaluation, with and without the ReLU, vec4 rows and not; the output and the input's
/// gradient f16, the parameters' gradients and the running statistics f32. Dtypes PyTorch
/// refuses (f32 input with f16 parameters, parameters of two dtypes) are errors.
#[test]
fn batch_norm_of_f16_input_with_f32_parameters_matches_the_cpu() {
    use kiln::ops::{batch_norm, batch_norm_relu};
    let cpu = Device::cpu().unwrap();
    let vals = |n: usize, seed: u64, shift: f64| -> Vec<f64> {
        (0..n)
            .map(|i| {
                (((i as u64 + 1) * (seed * 2654435761 + 97)) % 1000) as f64 / 250.0 - 2.0 + shift
            })
            .collect()
    };
    let gpus = devices().into_iter().filter(|d| !d.is_cpu());
    for dev in gpus.filter(|d| d.adapter_info().is_some_and(|a| a.features.shader_f16)) {
        for (k, shape) in [&[4usize, 6, 8, 8][..], &[3, 5, 7, 5], &[16, 3]]
            .iter()
            .enumerate()
        {
            let c = shape[1];
            let n: usize = shape.iter().product();
            let run = |d: &Device, training: bool, relu: bool| -> Vec<(DType, Vec<f64>)> {
                let f16 = |v: Vec<f64>| Tensor::from_f64_slice(&v, shape, DType::F16, d).unwrap();
                let f32 = |v: Vec<f64>| Tensor::from_f64_slice(&v, &[c], DType::F32, d).unwrap();
                let x = f16(vals(n, k as u64 + 3, 1.0))
                    .requires_grad_(true)
                    .unwrap();
                let w = f32(vals(c, 5, 1.0)).requires_grad_(true).unwrap();
                let b = f32(vals(c, 7, 0.0)).requires_grad_(true).unwrap();
                let (rm, rv) = (f32(vals(c, 9, 0.5)), f32(vals(c, 13, 3.0)));
                let op = if relu { batch_norm_relu } else { batch_norm };
                let y = op(
                    &x,
                    Some(&rm),
                    Some(&rv),
                    Some(&w),
                    Some(&b),
                    training,
                    0.1,
                    1e-5,
                )
                .unwrap();
                y.backward_with(&f16(vals(n, k as u64 + 11, 0.0)), false)
                    .unwrap();
                [
                    y,
                    x.grad().unwrap(),
                    w.grad().unwrap(),
                    b.grad().unwrap(),
                    rm,
                    rv,
                ]
                .iter()
                .map(|t| (t.dtype(), t.to_f64_vec().unwrap()))
                .collect()
            };
            for (training, relu) in [(true, false), (false, false), (true, true), (false, true)] {
                let (got, want) = (run(&dev, training, relu), run(&cpu, training, relu));
                let names = [
                    "y",
                    "x.grad",
                    "weight.grad",
                    "bias.grad",
                    "running_mean",
                    "running_var",
                ];
                let dtypes = [
                    DType::F16,
                    DType::F16,
                    DType::F32,
                    DType::F32,
                    DType::F32,
                    DType::F32,
                ];
                for (((g, w), name), dtype) in got.iter().zip(&want).zip(names).zip(dtypes) {
                    assert_eq!(g.0, dtype, "{name}");
                    let scale = w.1.iter().fold(1.0f64, |m, v| m.max(v.abs()));
                    let ok = g.1.len() == w.1.len()
                        && g.1
                            .iter()
                            .zip(&w.1)
                            .all(|(a, b)| (a - b).abs() <= 4e-3 * scale);
                    assert!(
                        ok,
                        "{dev:?} {shape:?} training {training} relu {relu}: {name}: {:?} vs {:?}",
                        &g.1[..g.1.len().min(8)],
                        &w.1[..w.1.len().min(8)]
                    );
                }
            }
        }
        let x16 = Tensor::ones(&[4, 3], DType::F16, &dev).unwrap();
        let x32 = Tensor::ones(&[4, 3], DType::F32, &dev).unwrap();
        let (w16, w32) = (
            Tensor::ones(&[3], DType::F16, &dev).unwrap(),
            Tensor::ones(&[3], DType::F32, &dev).unwrap(),
        );
        for (x, w, b) in [(&x32, &w16, &w16), (&x16, &w16, &w32)] {
            let e = batch_norm(x, None, None, Some(w), Some(b), true, 0.1, 1e-5).unwrap_err();
            assert!(
                matches!(
                    e,
                    kiln::Error::DTypeMismatch {
                        op: "batch_norm",
                        ..
                    }
                ),
                "{e}"
            );
        }
    }
}

#[test]
fn layernorm_dropout_and_lstm() {
    for dev in devices() {
        let ln = LayerNorm::new(4, &dev).unwrap();
        let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[1, 4], &dev).unwrap();
        let y = ln.forward(&x).unwrap().to_vec::<f32>().unwrap();
        let s = (1.25f32 + 1e-5).sqrt();
        assert!(
            close(&y, &[-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s], 1e-4),
            "{y:?}"
        );

        dev.manual_seed(5);
        let mut drop = Dropout::new(0.5).unwrap();
        let ones = Tensor::ones(&[4096], DType::F32, &dev).unwrap();
        let d = drop.forward(&ones).unwrap().to_vec::<f32>().unwrap();
        assert!(d.iter().all(|&v| v == 0.0 || v == 2.0));
        let kept = d.iter().filter(|&&v| v == 2.0).count();
        assert!((1800..2300).contains(&kept), "{kept}");
        drop.eval();
        assert_eq!(
            drop.forward(&ones).unwrap().to_vec::<f32>().unwrap(),
            vec![1.0; 4096]
        );

        let cell = LstmCell::new(3, 5, &dev).unwrap();
        let (h, c) = cell.zero_state(2).unwrap();
        let x = Tensor::randn(&[2, 3], DType::F32, &dev).unwrap();
        let (h1, c1) = cell.step(&x, (&h, &c)).unwrap();
        assert_eq!(h1.shape(), [2, 5]);
        // From a zero state: c = i * g, h = o * tanh(c), each gate from x @ w_ih^T + b.
        let gates = x
            .matmul(&cell.weight_ih.t().unwrap())
            .unwrap()
            .add(&cell.bias_ih)
            .unwrap()
            .add(&cell.bias_hh)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let sig = |v: f32| 1.0 / (1.0 + (-v).exp());
        let (i0, g0, o0) = (gates[0], gates[10], gates[15]);
        let c_want = sig(i0) * g0.tanh();
        let cv = c1.to_vec::<f32>().unwrap();
        let hv = h1.to_vec::<f32>().unwrap();
        assert!((cv[0] - c_want).abs() < 1e-4 && (hv[0] - sig(o0) * c_want.tanh()).abs() < 1e-4);
    }
}

#[test]
fn state_dicts_round_trip_through_safetensors_files() {
    let dir = std::env::temp_dir().join(format!("kiln-st-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (k, dev) in devices().into_iter().enumerate() {
        dev.manual_seed(9);
        let model = Sequential::new()
            .push(Linear::new(4, 3, true, &dev).unwrap())
            .push(Relu)
            .push(BatchNorm::new(3, &dev).unwrap());
        let path = dir.join(format!("model{k}.safetensors"));
        save_safetensors(&path, &state_dict(&model)).unwrap();

        // The file is safetensors as PyTorch reads it: an 8-byte header length, JSON, data.
        let bytes = std::fs::read(&path).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        assert_eq!(header["0.weight"]["dtype"], "F32");
        assert_eq!(header["0.weight"]["shape"], serde_json::json!([3, 4]));
        assert!(header.get("2.running_var").is_some());
        let off = header["0.bias"]["data_offsets"][0].as_u64().unwrap() as usize;
        let first = f32::from_le_bytes(bytes[8 + n + off..8 + n + off + 4].try_into().unwrap());
        let bias = model.layers[0].named_parameters()[1]
            .1
            .to_vec::<f32>()
            .unwrap();
        assert_eq!(first, bias[0]);

        dev.manual_seed(10);
        let mut other = Sequential::new()
            .push(Linear::new(4, 3, true, &dev).unwrap())
            .push(Relu)
            .push(BatchNorm::new(3, &dev).unwrap());
        let loaded = load_safetensors(&path, &Device::cpu().unwrap()).unwrap();
        load_state_dict(&mut other, &loaded).unwrap();
        for ((n1, a), (n2, b)) in state_dict(&model).iter().zip(state_dict(&other)) {
            assert_eq!(n1, &n2);
            assert_eq!(a.to_f64_vec().unwrap(), b.to_f64_vec().unwrap(), "{n1}");
        }
        assert!(other.parameters()[0].requires_grad(), "still a parameter");
        let wrong = vec![(
            "0.weight".to_string(),
            Tensor::zeros(&[2, 2], DType::F32, &dev).unwrap(),
        )];
        assert!(load_state_dict(&mut other, &wrong).is_err());
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn adam_state_appears_on_the_first_step() {
    for dev in devices() {
        let l = Linear::new(64, 64, false, &dev).unwrap();
        let mut opt = Adam::new(l.parameters(), 1e-3).unwrap();
        let x = Tensor::randn(&[8, 64], DType::F32, &dev).unwrap();
        l.forward(&x)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let before = dev.memory_allocated();
        assert!(opt.state_tensors().is_empty());
        opt.step().unwrap();
        assert_eq!(
            dev.memory_allocated() - before,
            2 * 64 * 64 * 4,
            "{dev:?}: exp_avg, exp_avg_sq"
        );
        let names: Vec<String> = opt.state_tensors().into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            ["state.0.step", "state.0.exp_avg", "state.0.exp_avg_sq"]
        );
    }
}

/// torchvision's counts and names: resnet50 has 25,557,032 parameters (97.5 MiB) in 161
/// tensors and 320 state-dict entries; resnet18 11,689,512.
#[test]
fn resnets_have_torchvisions_parameters_and_names() {
    use kiln::nn::models::{resnet18, resnet50};
    let cpu = Device::cpu().unwrap();
    let count = |m: &dyn Module| m.parameters().iter().map(|p| p.numel()).sum::<usize>();
    let r50 = resnet50(1000, &cpu).unwrap();
    assert_eq!(count(&r50), 25_557_032);
    assert_eq!(r50.named_parameters().len(), 161);
    let sd = state_dict(&r50);
    assert_eq!(sd.len(), 320);
    let names: Vec<&str> = sd.iter().map(|(n, _)| n.as_str()).collect();
    for want in [
        "conv1.weight",
        "bn1.running_mean",
        "bn1.num_batches_tracked",
        "layer1.0.conv1.weight",
        "layer1.0.downsample.0.weight",
        "layer1.0.downsample.1.running_var",
        "layer2.3.bn3.bias",
        "layer3.5.conv2.weight",
        "layer4.2.conv3.weight",
        "fc.weight",
        "fc.bias",
    ] {
        assert!(names.contains(&want), "{want} missing");
    }
    let shape = |n: &str| sd.iter().find(|(k, _)| k == n).unwrap().1.shape().to_vec();
    assert_eq!(shape("layer2.0.conv2.weight"), [128, 128, 3, 3]);
    assert_eq!(shape("layer4.0.downsample.0.weight"), [2048, 1024, 1, 1]);
    assert_eq!(shape("fc.weight"), [1000, 2048]);
    assert_eq!(count(&resnet18(1000, &cpu).unwrap()), 11_689_512);
}

/// resnet18 (48x48 inputs) on every adapter against the CPU device with the same weights: logits, BatchNorm's
/// running statistics, and the gradients of the first and last layers after one backward.
#[test]
fn resnet18_matches_the_cpu_forward_and_backward() {
    use kiln::nn::models::resnet18;
    let cpu = Device::cpu().unwrap();
    cpu.manual_seed(3);
    let reference = resnet18(10, &cpu).unwrap();
    let x_host: Vec<f32> = (0..2 * 3 * 48 * 48)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
        .collect();
    let run = |model: &dyn Module, dev: &Device| {
        let x = Tensor::from_slice(&x_host, &[2, 3, 48, 48], dev).unwrap();
        let y = model.forward(&x).unwrap();
        let labels = Tensor::from_slice(&[3i32, 7], &[2], dev).unwrap();
        kiln::nn::cross_entropy(&y, &labels)
            .unwrap()
            .backward()
            .unwrap();
        let sd = state_dict(model);
        let get = |n: &str| sd.iter().find(|(k, _)| k == n).unwrap().1.clone();
        let grad = |n: &str| {
            model
                .named_parameters()
                .into_iter()
                .find(|(k, _)| k == n)
                .unwrap()
                .1
                .grad()
                .unwrap()
        };
        [
            y.detach(),
            get("layer3.1.bn2.running_var"),
            grad("conv1.weight"),
            grad("layer2.0.downsample.0.weight"),
            grad("fc.weight"),
        ]
        .map(|t| t.to_vec::<f32>().unwrap())
    };
    let want = run(&reference, &cpu);
    for dev in devices().into_iter().filter(|d| !d.is_cpu()) {
        let mut model = resnet18(10, &dev).unwrap();
        load_state_dict(&mut model, &state_dict(&resnet18_fresh(&cpu))).unwrap();
        let got = run(&model, &dev);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let scale = w.iter().fold(0f32, |m, v| m.max(v.abs()));
            // Gradients pass back through 20 train-mode BatchNorms, the last over 8 values
            // each: f32 on the GPU and f64 on the CPU drift apart there by up to 1% (the direct
            // and the GEMM convolution agree with each other to 1e-5).
            let tol = if i >= 2 { 2e-2 } else { 2e-3 };
            assert!(
                close(g, w, tol * scale.max(1e-3)),
                "{dev:?} output {i}: {:?} vs {:?}",
                &g[..4.min(g.len())],
                &w[..4.min(w.len())]
            );
        }
    }
}

/// The reference's initial weights again (the same seed on the CPU device).
fn resnet18_fresh(cpu: &Device) -> impl Module {
    cpu.manual_seed(3);
    kiln::nn::models::resnet18(10, cpu).unwrap()
}

#[test]
fn adaptive_average_pooling_and_batchnorm_bookkeeping() {
    use kiln::nn::{AdaptiveAvgPool2d, BatchNorm2d};
    for dev in devices() {
        // 1x1x5x3 -> (2, 2): rows 0..3 and 2..5, columns 0..2 and 1..3 (PyTorch's windows).
        let x: Vec<f32> = (0..15).map(|v| v as f32).collect();
        let t = Tensor::from_slice(&x, &[1, 1, 5, 3], &dev).unwrap();
        let y = AdaptiveAvgPool2d::new((2, 2)).forward(&t).unwrap();
        let cell = |r: std::ops::Range<usize>, c: std::ops::Range<usize>| {
            let n = (r.len() * c.len()) as f32;
            let mut sum = 0.0;
            for i in r {
                for j in c.clone() {
                    sum += x[i * 3 + j];
                }
            }
            sum / n
        };
        let want = [
            cell(0..3, 0..2),
            cell(0..3, 1..3),
            cell(2..5, 0..2),
            cell(2..5, 1..3),
        ];
        assert!(close(&y.to_vec::<f32>().unwrap(), &want, 1e-5), "{dev:?}");
        let g = AdaptiveAvgPool2d::new((1, 1)).forward(&t).unwrap();
        assert_eq!(g.shape(), &[1, 1, 1, 1]);

        let mut bn = BatchNorm2d::new(1, &dev).unwrap();
        for _ in 0..3 {
            bn.forward(&t).unwrap();
        }
        bn.eval();
        bn.forward(&t).unwrap();
        assert_eq!(bn.num_batches_tracked.to_vec::<i32>().unwrap(), [3]);
    }
}

/// A torchvision-style file: BatchNorm's int64 `num_batches_tracked` loads (narrowed to i32).
#[test]
fn int64_buffers_load_from_safetensors() {
    let dir = std::env::temp_dir().join(format!("kiln-i64-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bn.safetensors");
    let header = r#"{"n":{"dtype":"I64","shape":[],"data_offsets":[0,8]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header.as_bytes());
    bytes.extend(7i64.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let cpu = Device::cpu().unwrap();
    let t = load_safetensors(&path, &cpu).unwrap();
    assert_eq!(t[0].1.dtype(), DType::I32);
    assert_eq!(t[0].1.to_vec::<i32>().unwrap(), [7]);
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header.as_bytes());
    bytes.extend((1i64 << 40).to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    assert!(
        load_safetensors(&path, &cpu).is_err(),
        "2^40 does not fit an i32"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// nll_loss's own backward kernel (four elements an invocation, rows crossing inside a group
/// of four, a count that is not a multiple of four, ignored rows), on log-probabilities that
/// are a leaf (no log_softmax before it to fuse with), in f32 and f16, against the CPU.
#[test]
fn nll_loss_backward_on_a_leaf_matches_the_cpu() {
    use kiln::nn::nll_loss;
    let cpu = Device::cpu().unwrap();
    for dev in devices().into_iter().filter(|d| !d.is_cpu()) {
        for (n, c) in [(37usize, 10usize), (5, 3), (3, 1001)] {
            let values: Vec<f32> = (0..n * c)
                .map(|i| -((i * 7919 % 1000) as f32) / 200.0)
                .collect();
            let targets: Vec<i32> = (0..n as i32)
                .map(|i| if i % 5 == 3 { -100 } else { (i * 7) % c as i32 })
                .collect();
            for dtype in [DType::F32, DType::F16] {
                let f16 = dev.adapter_info().is_some_and(|a| a.features.shader_f16);
                if dtype == DType::F16 && !f16 {
                    continue;
                }
                let grad = |d: &Device| {
                    let lp = Tensor::from_slice(&values, &[n, c], d)
                        .unwrap()
                        .to_dtype(dtype)
                        .unwrap()
                        .requires_grad_(true)
                        .unwrap();
                    let y = Tensor::from_slice(&targets, &[n], d).unwrap();
                    nll_loss(&lp, &y).unwrap().backward().unwrap();
                    lp.grad().unwrap().to_f64_vec().unwrap()
                };
                assert_eq!(grad(&dev), grad(&cpu), "{dev:?} {dtype} [{n}, {c}]");
            }
        }
    }
}

/// cross_entropy (log_softmax, then nll_loss as one op) against its definition in f64: the
/// mean over the rows whose target is not -100 (PyTorch's ignore_index), and the logits'
/// gradient (softmax - one_hot) / count on those rows, zero on the ignored ones; softmax's
/// own backward against y * (w - sum(w * y)); every target ignored gives NaN, as in PyTorch.
#[test]
fn nll_and_cross_entropy_match_their_definitions() {
    use kiln::nn::{cross_entropy, nll_loss};
    let (n, c) = (37usize, 10usize);
    let logits: Vec<f32> = (0..n * c)
        .map(|i| ((i * 7919 % 1000) as f32 / 100.0 - 5.0) * 0.7)
        .collect();
    let targets: Vec<i32> = (0..n as i32)
        .map(|i| if i % 5 == 3 { -100 } else { (i * 3) % c as i32 })
        .collect();
    // The reference, in f64.
    let mut loss = 0.0f64;
    let mut grad = vec![0.0f64; n * c];
    let count = targets.iter().filter(|&&t| t != -100).count() as f64;
    for i in 0..n {
        let row = &logits[i * c..(i + 1) * c];
        let max = row.iter().fold(f64::MIN, |m, &v| m.max(v as f64));
        let z: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
        if targets[i] == -100 {
            continue;
        }
        let t = targets[i] as usize;
        loss -= (row[t] as f64 - max) - z.ln();
        for j in 0..c {
            let p = (row[j] as f64 - max).exp() / z;
            grad[i * c + j] = (p - (j == t) as u8 as f64) / count;
        }
    }
    loss /= count;
    for dev in devices() {
        let x = Tensor::from_slice(&logits, &[n, c], &dev)
            .unwrap()
            .requires_grad_(true)
            .unwrap();
        let y = Tensor::from_slice(&targets, &[n], &dev).unwrap();
        let l = cross_entropy(&x, &y).unwrap();
        assert_eq!(l.grad_fn_name(), Some("NllLossBackward0"), "{dev:?}");
        let got = l.item::<f32>().unwrap() as f64;
        assert!(
            (got - loss).abs() < 1e-5 * (1.0 + loss.abs()),
            "{dev:?}: loss {got} vs {loss}"
        );
        l.backward().unwrap();
        let g = x.grad().unwrap().to_vec::<f32>().unwrap();
        for (k, (a, b)) in g.iter().zip(&grad).enumerate() {
            assert!(
                (*a as f64 - b).abs() < 1e-6,
                "{dev:?}: grad {k}: {a} vs {b}"
            );
        }
        // softmax's backward: d/dx sum(softmax(x) * w) = y * (w - sum(w * y)) per row.
        let w: Vec<f32> = (0..n * c).map(|i| (i % 7) as f32 - 3.0).collect();
        let x2 = Tensor::from_slice(&logits, &[n, c], &dev)
            .unwrap()
            .requires_grad_(true)
            .unwrap();
        let wt = Tensor::from_slice(&w, &[n, c], &dev).unwrap();
        let s = x2.softmax(1).unwrap();
        s.mul(&wt).unwrap().sum_all().unwrap().backward().unwrap();
        let yv = s.to_vec::<f32>().unwrap();
        let g2 = x2.grad().unwrap().to_vec::<f32>().unwrap();
        for i in 0..n {
            let dot: f64 = (0..c)
                .map(|j| w[i * c + j] as f64 * yv[i * c + j] as f64)
                .sum();
            for j in 0..c {
                let want = yv[i * c + j] as f64 * (w[i * c + j] as f64 - dot);
                let got = g2[i * c + j] as f64;
                assert!(
                    (got - want).abs() < 1e-5,
                    "{dev:?}: softmax grad {i},{j}: {got} vs {want}"
                );
            }
        }
        // Every target ignored: NaN.
        let lp = x.detach().log_softmax(1).unwrap();
        let none = Tensor::from_slice(&vec![-100i32; n], &[n], &dev).unwrap();
        assert!(
            nll_loss(&lp, &none)
                .unwrap()
                .item::<f32>()
                .unwrap()
                .is_nan(),
            "{dev:?}"
        );
    }
}

/// A target outside [0, C) that is not -100: an error naming nll_loss (at once on the CPU, at
/// the next sync point on a GPU), and the device and other tensors intact afterwards.
#[test]
fn nll_loss_rejects_a_target_out_of_range() {
    use kiln::nn::nll_loss;
    use kiln::Error;
    for dev in devices() {
        let lp = Tensor::zeros(&[3, 4], DType::F32, &dev).unwrap();
        for bad in [4i32, -1] {
            let t = Tensor::from_slice(&[0i32, bad, 2], &[3], &dev).unwrap();
            let e = nll_loss(&lp, &t).and_then(|l| l.item::<f32>()).unwrap_err();
            match (&e, dev.is_cpu()) {
                (Error::IndexOutOfRange { op: "nll_loss", .. }, true) => {}
                (Error::DeviceAssert { ops, .. }, false) => {
                    assert!(ops.contains("nll_loss"), "{e}")
                }
                _ => panic!("{dev:?}: {e}"),
            }
        }
        let good = Tensor::from_slice(&[0i32, 3, 2], &[3], &dev).unwrap();
        assert_eq!(nll_loss(&lp, &good).unwrap().item::<f32>().unwrap(), 0.0);
        assert_eq!(lp.to_vec::<f32>().unwrap(), vec![0.0; 12]);
    }
}

/// SGD steps parameters six (five on GL) to a launch (`optim_sgd_multi`, as PyTorch's foreach
/// SGD steps a list; forced on the CPU adapters, which launch one each), counts that are not a
/// multiple of 4 included: every configuration matches the CPU device's tensor-op formulas,
/// with one parameter's momentum buffer created a step later than the others' (its first step
/// shares a launch with the others' later steps). Then the same with one launch per
/// parameter, each the widest kernel its count allows (64-bit words, vec4s, elements).
#[test]
fn sgd_steps_many_parameters_per_launch_like_the_cpu_reference() {
    for launch in ["multi", "per_parameter"] {
        kiln::kernels::tune::force_variant("sgd", Some(launch));
        sgd_steps_like_the_cpu_reference(launch);
    }
    kiln::kernels::tune::force_variant("sgd", None);
}

fn sgd_steps_like_the_cpu_reference(launch: &str) {
    let cpu = Device::cpu().unwrap();
    // Eight parameters: a launch of six (one of them ten elements, a partial last vec4), then
    // one of two (six elements); on GL five, then three.
    let shapes: [&[usize]; 8] = [
        &[64, 32],
        &[32],
        &[16, 8],
        &[10],
        &[8],
        &[4, 4],
        &[12],
        &[6],
    ];
    cpu.manual_seed(3);
    let init = randn_each(&shapes, &cpu);
    let grads: Vec<Vec<Tensor>> = (0..3).map(|_| randn_each(&shapes, &cpu)).collect();
    // (momentum, dampening, weight decay, nesterov)
    let configs = [
        (0.9, 0.1, 0.01, false),
        (0.9, 0.0, 0.0, true),
        (0.0, 0.0, 0.05, false),
    ];
    let run = |dev: &Device, (momentum, dampening, wd, nesterov): (f64, f64, f64, bool)| {
        let params: Vec<Tensor> = init
            .iter()
            .map(|t| t.to_device(dev).unwrap().requires_grad_(true).unwrap())
            .collect();
        let mut opt = Sgd::new(params.clone(), 0.1)
            .unwrap()
            .momentum(momentum)
            .unwrap()
            .dampening(dampening)
            .unwrap()
            .weight_decay(wd)
            .unwrap()
            .nesterov(nesterov)
            .unwrap();
        for (step, gs) in grads.iter().enumerate() {
            for (i, (p, g)) in params.iter().zip(gs).enumerate() {
                // Parameter 2 has no gradient on the first step.
                let g = (step > 0 || i != 2).then(|| g.to_device(dev).unwrap());
                p.set_grad(g).unwrap();
            }
            opt.step().unwrap();
        }
        let state: Vec<Vec<f32>> = opt
            .state_tensors()
            .iter()
            .map(|(_, t)| t.to_vec::<f32>().unwrap())
            .collect();
        let params: Vec<Vec<f32>> = params.iter().map(|p| p.to_vec::<f32>().unwrap()).collect();
        (params, state)
    };
    for dev in devices().into_iter().filter(|d| !d.is_cpu()) {
        for config in configs {
            let (gp, gs) = run(&dev, config);
            let (cp, cs) = run(&cpu, config);
            assert_eq!(gs.len(), cs.len(), "{dev:?} {config:?}: state tensors");
            for (i, (g, c)) in gp.iter().chain(&gs).zip(cp.iter().chain(&cs)).enumerate() {
                for (a, b) in g.iter().zip(c) {
                    assert!(
                        (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                        "{dev:?} {config:?} tensor {i}: {a} vs {b}"
                    );
                }
            }
        }
        // The parameters went to the multi-parameter kernel, or each to its own (64-bit words
        // for f32 on a CPU adapter with 64-bit integers).
        if dev.adapter_info().unwrap().features.timestamp_query {
            let p: Vec<Tensor> = init
                .iter()
                .map(|t| t.to_device(&dev).unwrap().requires_grad_(true).unwrap())
                .collect();
            for (p, g) in p.iter().zip(&grads[0]) {
                p.set_grad(Some(g.to_device(&dev).unwrap())).unwrap();
            }
            let mut opt = Sgd::new(p, 0.1).unwrap().momentum(0.9).unwrap();
            let options = kiln::profiler::ProfileOptions {
                devices: vec![dev.clone()],
                profile_memory: false,
            };
            let (_, prof) = kiln::profiler::profile(&options, || {
                opt.step()?;
                dev.synchronize()
            })
            .unwrap();
            let trace = prof.chrome_trace_json();
            let info = dev.adapter_info().unwrap();
            let words = info.features.shader_int64 && info.device_type == wgpu::DeviceType::Cpu;
            let multi = launch == "multi";
            assert_eq!(trace.contains("optim_sgd_multi"), multi, "{dev:?}: {trace}");
            assert_eq!(trace.contains("optim_sgd_f32"), !multi, "{dev:?}: {trace}");
            assert_eq!(
                trace.contains("optim_sgd_f32_words"),
                !multi && words,
                "{dev:?}: {trace}"
            );
        }
    }
}

/// Adam and AdamW over parameters whose counts take each kernel width: 64 and 8 elements
/// (64-bit words on a CPU adapter with 64-bit integers, vec4s elsewhere), 12 (vec4s), 6
/// (elements), one of them a view at an offset of 8; three steps against the CPU device.
#[test]
fn adam_steps_every_kernel_width_like_the_cpu_reference() {
    let cpu = Device::cpu().unwrap();
    cpu.manual_seed(4);
    let shapes: [&[usize]; 4] = [&[8, 8], &[12], &[6], &[8]];
    let init = randn_each(&shapes, &cpu);
    let grads: Vec<Vec<Tensor>> = (0..3).map(|_| randn_each(&shapes, &cpu)).collect();
    let run = |dev: &Device, decoupled: bool| {
        let mut params: Vec<Tensor> = init
            .iter()
            .map(|t| t.to_device(dev).unwrap().requires_grad_(true).unwrap())
            .collect();
        // The last parameter: elements 8..16 of a larger tensor.
        let base = Tensor::zeros(&[24], DType::F32, dev).unwrap();
        let view = base.narrow(0, 8, 8).unwrap();
        view.copy_(&params[3].detach()).unwrap();
        params[3] = view.requires_grad_(true).unwrap();
        let mut opt = match decoupled {
            true => Adam::adamw(params.clone(), 0.05).unwrap(),
            false => Adam::new(params.clone(), 0.05).unwrap(),
        }
        .weight_decay(0.1)
        .unwrap();
        for gs in &grads {
            for (p, g) in params.iter().zip(gs) {
                p.set_grad(Some(g.to_device(dev).unwrap())).unwrap();
            }
            opt.step().unwrap();
        }
        let mut out: Vec<Vec<f32>> = params.iter().map(|p| p.to_vec::<f32>().unwrap()).collect();
        out.extend(
            opt.state_tensors()
                .iter()
                .filter(|(_, t)| t.numel() > 1)
                .map(|(_, t)| t.to_vec::<f32>().unwrap()),
        );
        out.push(base.to_vec::<f32>().unwrap());
        out
    };
    for dev in devices().into_iter().filter(|d| !d.is_cpu()) {
        for decoupled in [false, true] {
            let (g, c) = (run(&dev, decoupled), run(&cpu, decoupled));
            assert_eq!(g.len(), c.len(), "{dev:?}");
            for (i, (g, c)) in g.iter().zip(&c).enumerate() {
                for (a, b) in g.iter().zip(c) {
                    assert!(
                        (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                        "{dev:?} AdamW {decoupled} tensor {i}: {a} vs {b}"
                    );
                }
            }
        }
        let info = dev.adapter_info().unwrap();
        if info.features.timestamp_query {
            let options = kiln::profiler::ProfileOptions {
                devices: vec![dev.clone()],
                profile_memory: false,
            };
            let (_, prof) = kiln::profiler::profile(&options, || {
                run(&dev, false);
                Ok(())
            })
            .unwrap();
            let trace = prof.chrome_trace_json();
            let words = info.features.shader_int64 && info.device_type == wgpu::DeviceType::Cpu;
            assert_eq!(trace.contains("optim_adam_f32_words"), words, "{dev:?}");
            assert!(trace.contains("optim_adam_f32_vec4"), "{dev:?}");
            assert!(trace.contains("optim_adam_f32\""), "{dev:?}: {trace}");
        }
    }
}

/// A parameter of ten elements that is a view of a larger tensor: SGD's multi-parameter kernel
/// reads its partial last vec4 whole and must write the two elements past the view back as
/// they were.
#[test]
fn sgd_partial_vec4_leaves_a_views_neighbours_alone() {
    // The CPU adapters launch one parameter at a time unless told.
    kiln::kernels::tune::force_variant("sgd", Some("multi"));
    for dev in devices().into_iter().filter(|d| !d.is_cpu()) {
        let base: Vec<f32> = (0..16).map(|i| i as f32 * 0.25 - 1.0).collect();
        let base_t = Tensor::from_vec(base.clone(), &[16], &dev).unwrap();
        let p = base_t
            .narrow(0, 0, 10)
            .unwrap()
            .requires_grad_(true)
            .unwrap();
        let q = Tensor::ones(&[8], DType::F32, &dev)
            .unwrap()
            .requires_grad_(true)
            .unwrap();
        let gp: Vec<f32> = (0..10).map(|i| 0.5 - i as f32 * 0.125).collect();
        // Weight decay, so that the update moves an element even where its gradient is zero.
        let mut opt = Sgd::new(vec![p.clone(), q.clone()], 0.1)
            .unwrap()
            .momentum(0.9)
            .unwrap()
            .weight_decay(0.5)
            .unwrap();
        for _ in 0..2 {
            p.set_grad(Some(Tensor::from_vec(gp.clone(), &[10], &dev).unwrap()))
                .unwrap();
            q.set_grad(Some(Tensor::ones(&[8], DType::F32, &dev).unwrap()))
                .unwrap();
            opt.step().unwrap();
        }
        // PyTorch's two steps: d = g + wd w; the buffer starts as d, then 0.9 buf + d.
        let got = base_t.to_vec::<f32>().unwrap();
        for i in 0..16 {
            let want = match i < 10 {
                true => {
                    let d1 = gp[i] + 0.5 * base[i];
                    let w1 = base[i] - 0.1 * d1;
                    w1 - 0.1 * (0.9 * d1 + gp[i] + 0.5 * w1)
                }
                false => base[i],
            };
            assert!(
                (got[i] - want).abs() <= 1e-6,
                "{dev:?} element {i}: {} vs {want}",
                got[i]
            );
        }
    }
}

/// cross_entropy's fused kernels (Note [Backward epilogues], `shaders/cross_entropy.wgsl`)
/// against the two ops they stand for, `nll_loss(log_softmax(x))` with the backward epilogues
/// off, on each GPU: the loss and gradient (strided logits, ignored rows), the nodes, every
/// allocator statistic of a forward and backward, and the kernels that run (one forward, one
/// backward, against four); a target out of range is the device assert nll_loss raises. With
/// 10, 16, 37 and 3000 classes.
#[test]
fn cross_entropy_fuses_its_two_ops() {
    // (3000 classes in 20 rows: within the fused kernel's 2^16 elements.)
    for (n, c) in [(300, 10), (300, 16), (300, 37), (20, 3000)] {
        cross_entropy_fuses_its_two_ops_with(n, c);
    }
}

fn cross_entropy_fuses_its_two_ops_with(n: usize, c: usize) {
    use kiln::nn::{cross_entropy, nll_loss};
    use kiln::Error;
    let cpu = Device::cpu().unwrap();
    cpu.manual_seed(5);
    // Logits read through a transpose (strides 1, n).
    let wide = Tensor::randn(&[c, n], DType::F32, &cpu).unwrap();
    let targets: Vec<i32> = (0..n as i32)
        .map(|i| if i % 7 == 2 { -100 } else { (i * 3) % c as i32 })
        .collect();
    for dev in devices().into_iter().filter(|d| !d.is_cpu()) {
        let y = Tensor::from_slice(&targets, &[n], &dev).unwrap();
        let run = |fused: bool| {
            kiln::autograd::set_backward_epilogues(fused);
            let x = wide.to_device(&dev).unwrap().requires_grad_(true).unwrap();
            let l = match fused {
                true => cross_entropy(&x.t().unwrap(), &y).unwrap(),
                false => nll_loss(&x.t().unwrap().log_softmax(1).unwrap(), &y).unwrap(),
            };
            assert_eq!(l.grad_fn_name(), Some("NllLossBackward0"));
            l.backward().unwrap();
            kiln::autograd::set_backward_epilogues(true);
            let g = x.grad().unwrap().to_vec::<f32>().unwrap();
            (l.item::<f32>().unwrap(), g)
        };
        let stats = |fused: bool| stats_delta(&dev, || run(fused));
        let ((fused, fused_stats), (plain, plain_stats)) = (stats(true), stats(false));
        assert_eq!(
            fused_stats, plain_stats,
            "{dev:?} C={c}: allocator statistics"
        );
        assert!(
            (fused.0 - plain.0).abs() < 1e-6,
            "{dev:?} C={c}: {fused:?} {plain:?}"
        );
        assert!(close(&fused.1, &plain.1, 1e-7), "{dev:?} C={c}: gradients");
        assert!(fused.1.iter().any(|v| *v != 0.0));

        if dev.adapter_info().unwrap().features.timestamp_query {
            let trace = |fused: bool| {
                let t = kernel_trace(&dev, || Ok(run(fused)));
                [
                    "cross_entropy_forward_f32",
                    "cross_entropy_backward_f32",
                    "softmax_f32",
                    // (Its serial kernel, or its tree: C = 3000 on a GPU.)
                    "softmax_backward_f32|softmax_backward_tree_f32",
                    "nll_loss_forward_f32",
                    "nll_loss_backward_f32",
                ]
                .map(|k| k.split('|').any(|k| t.contains(k)))
            };
            let (on, off) = (true, false);
            assert_eq!(trace(true), [on, on, off, off, off, off], "{dev:?}");
            assert_eq!(trace(false), [off, off, on, on, on, on], "{dev:?}");
        }

        // A target outside [0, C): nll_loss's device assert, the device usable after it.
        let x = Tensor::zeros(&[3, 4], DType::F32, &dev).unwrap();
        let bad = Tensor::from_slice(&[0i32, 4, 2], &[3], &dev).unwrap();
        match cross_entropy(&x, &bad).and_then(|l| l.item::<f32>()) {
            Err(Error::DeviceAssert { ops, .. }) => assert!(ops.contains("nll_loss"), "{ops}"),
            other => panic!("{dev:?}: {other:?}"),
        }
        let good = Tensor::from_slice(&[0i32, 3, 2], &[3], &dev).unwrap();
        let l = cross_entropy(&x, &good).unwrap().item::<f32>().unwrap();
        assert!((l - 4f32.ln()).abs() < 1e-6, "{dev:?}: {l}");
    }
}
