// Peer of kiln's `bench --suite ops` on a software adapter, on Burn 0.22.1's wgpu backend (its
// defaults: fusion and autotune on; `DeviceKind::Cpu` picks lavapipe). kiln's `wall_time`:
// 3 warm-up calls, a sync, then the best of 3 rounds of 5 calls each and a sync. Each of the 5
// calls gets its own input, so that fusion cannot read one input once for several calls. Every
// result is checked against the CPU once, and the sum's over sizes (Burn's sum of 2^20 or more
// elements is wrong on lavapipe: BENCHMARKS.md).
use burn::tensor::{DType, Device, DeviceKind, Distribution, Tensor};
use std::time::Instant;

fn wall<const D: usize>(dev: &Device, mut f: impl FnMut(usize) -> Tensor<D>) -> f64 {
    for i in 0..3 {
        let _ = f(i);
    }
    dev.sync().unwrap();
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        let keep: Vec<_> = (0..5).map(&mut f).collect();
        dev.sync().unwrap();
        best = best.min(t.elapsed().as_secs_f64() / 5.0);
        drop(keep);
    }
    best
}

fn host<const D: usize>(t: &Tensor<D>) -> Vec<f32> {
    t.clone().cast(DType::F32).into_data().try_into_vec::<f32>().unwrap()
}

fn inputs<const D: usize>(shape: [usize; D], dev: &Device) -> Vec<Tensor<D>> {
    (0..6).map(|_| Tensor::<D>::random(shape, Distribution::Default, dev)).collect()
}

fn main() {
    let dev = Device::wgpu(DeviceKind::Cpu);
    let rounds: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(1);
    // The sum, checked over sizes: its value against the CPU's and its time per call.
    for log2 in [16usize, 18, 20, 22] {
        let n = 1usize << log2;
        let xs = inputs([n], &dev);
        let want: f64 = host(&xs[0]).iter().map(|&v| v as f64).sum();
        let got = host(&xs[0].clone().sum())[0] as f64;
        let t = wall(&dev, |i| xs[i].clone().sum());
        let ok = (got - want).abs() <= 1e-3 * want.abs();
        println!(
            "burn sum n=2^{log2}: {got:.1} (CPU {want:.1}, correct: {ok}), {:.3} ms a call",
            t * 1e3
        );
    }
    let n = 1usize << 22;
    let (xs, a) = (inputs([n], &dev), inputs([n], &dev).remove(0));
    let (side, s, m) = (2048usize, 1024usize, 256usize);
    let ts = inputs([side, side], &dev);
    let ss = inputs([s, s], &dev);
    for _ in 0..rounds {
        let t = wall(&dev, |i| xs[i].clone() * 2.0);
        println!("burn y=2x n=2^22 (wall clock) {:.3} GB/s", 8.0 * n as f64 / t / 1e9);
        let t = wall(&dev, |i| xs[i].clone() + a.clone());
        println!("burn a+b n=2^22 (wall clock) {:.3} GB/s", 12.0 * n as f64 / t / 1e9);
        let t = wall(&dev, |i| xs[i].clone().sum());
        println!("burn sum n=2^22 (wall clock) {:.3} GB/s (over n)", 4.0 * n as f64 / t / 1e9);
        // Transpose to contiguous: the transposed view through an elementwise op.
        let (x, y) = (host(&ts[0]), host(&(ts[0].clone().transpose() * 1.0)));
        let ok = (0..side).all(|i| (0..side).step_by(97).all(|j| y[i * side + j] == x[j * side + i]));
        let t = wall(&dev, |i| ts[i].clone().transpose() * 1.0);
        let gbs = 8.0 * (side * side) as f64 / t / 1e9;
        println!("burn transpose 2048^2 contiguous (wall clock) {gbs:.3} GB/s (correct: {ok})");
        let (x, y) = (host(&ss[0]), host(&burn::tensor::activation::softmax(ss[0].clone(), 1)));
        let mx = x[..s].iter().cloned().fold(f32::MIN, f32::max);
        let z: f64 = x[..s].iter().map(|&v| ((v - mx) as f64).exp()).sum();
        let ok = (0..s).all(|j| (y[j] as f64 - ((x[j] - mx) as f64).exp() / z).abs() < 1e-6);
        let t = wall(&dev, |i| burn::tensor::activation::softmax(ss[i].clone(), 1));
        let gbs = 8.0 * (s * s) as f64 / t / 1e9;
        println!("burn softmax 1024^2 (dim -1) (wall clock) {gbs:.3} GB/s (row 0 correct: {ok})");
        for dtype in [DType::F32, DType::F16] {
            let ms: Vec<_> = inputs([m, m], &dev).into_iter().map(|t| t.cast(dtype)).collect();
            let (a, b, c) = (host(&ms[0]), host(&ms[1]), host(&ms[0].clone().matmul(ms[1].clone())));
            let mut worst = 0f64;
            for i in (0..m).step_by(17) {
                for j in (0..m).step_by(13) {
                    let r: f64 = (0..m).map(|k| a[i * m + k] as f64 * b[k * m + j] as f64).sum();
                    worst = worst.max((c[i * m + j] as f64 - r).abs() / r.abs().max(1.0));
                }
            }
            let t = wall(&dev, |i| ms[i].clone().matmul(ms[i + 1].clone()));
            let tf = 2.0 * (m * m * m) as f64 / t / 1e12;
            println!("burn matmul {dtype:?} 256 (wall clock) {tf:.5} TFLOP/s (worst relative error {worst:.1e})");
        }
    }
}
