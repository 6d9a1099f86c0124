// Peer of kiln's `bench --suite train` row "MLP 784-128-10 b64 SGD-momentum step f32" on Burn
// 0.22.1's wgpu backend (fusion, autotune, autodiff): Linear-ReLU-Linear, cross-entropy, SGD
// with momentum 0.9 (no dampening, as PyTorch's), lr 0.01; 5 warm-up steps, then 20 timed
// steps ended by a sync, best of 3 rounds.
use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::momentum::MomentumConfig;
use burn::optim::{GradientsParams, SgdConfig};
use burn::tensor::{Device, DeviceKind, Distribution, Int, Tensor};
use std::time::Instant;

#[derive(Module, Debug)]
struct Mlp {
    l1: Linear,
    act: Relu,
    l2: Linear,
}

impl Mlp {
    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.l2.forward(self.act.forward(self.l1.forward(x)))
    }
}

fn main() {
    let dev = Device::wgpu(DeviceKind::Cpu).autodiff();
    let mut model = Mlp {
        l1: LinearConfig::new(784, 128).init(&dev),
        act: Relu::new(),
        l2: LinearConfig::new(128, 10).init(&dev),
    };
    let mut opt = SgdConfig::new()
        .with_momentum(Some(MomentumConfig::new().with_dampening(0.0)))
        .init();
    let x = Tensor::<2>::random([64, 784], Distribution::Default, &dev);
    let y = Tensor::<1, Int>::random([64], Distribution::Uniform(0.0, 10.0), &dev);
    let loss_fn = CrossEntropyLossConfig::new().init(&dev);
    let mut step = |model: Mlp| {
        let loss = loss_fn.forward(model.forward(x.clone()), y.clone());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        opt.step(0.01, model, grads)
    };
    for _ in 0..5 {
        model = step(model);
    }
    dev.sync().unwrap();
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..20 {
            model = step(model);
        }
        dev.sync().unwrap();
        best = best.min(t.elapsed().as_secs_f64() / 20.0);
    }
    println!("burn MLP 784-128-10 b64 SGD-momentum step f32 (wall clock) {:.3} ms", best * 1e3);
}
