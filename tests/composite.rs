//! Random numbers, constructors and composite ops on every device, against the CPU device and
//! PyTorch's definitions.

use kiln::{DType, Device, Tensor};

fn devices() -> Vec<Device> {
    kiln::device::test_devices().expect("KILN_REQUIRE_GPU=1 and no GPU adapter")
}

#[test]
fn rand_is_the_same_on_every_device_and_reseeds() {
    let cpu = Device::cpu().unwrap();
    cpu.manual_seed(1234);
    let want = Tensor::rand(&[1000], DType::F32, &cpu)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let want_n = Tensor::randn(&[1000], DType::F32, &cpu)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    for dev in devices() {
        dev.manual_seed(1234);
        let u = Tensor::rand(&[1000], DType::F32, &dev)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        assert_eq!(
            u, want,
            "{dev:?}: uniform draws are bit-identical across devices"
        );
        let n = Tensor::randn(&[1000], DType::F32, &dev)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        for (a, b) in n.iter().zip(&want_n) {
            assert!((a - b).abs() < 1e-4, "{dev:?}: {a} vs {b}");
        }
        // Consecutive draws differ; reseeding repeats.
        let again = Tensor::rand(&[1000], DType::F32, &dev)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        assert_ne!(again, u);
        dev.manual_seed(1234);
        assert_eq!(
            Tensor::rand(&[1000], DType::F32, &dev)
                .unwrap()
                .to_vec::<f32>()
                .unwrap(),
            u
        );
        // Statistics of a large draw.
        let big = Tensor::randn(&[1 << 16], DType::F32, &dev).unwrap();
        let mean = big.mean(&[], false).unwrap().item::<f32>().unwrap();
        let std = big.std(&[], 1, false).unwrap().item::<f32>().unwrap();
        assert!(
            mean.abs() < 0.02 && (std - 1.0).abs() < 0.02,
            "{dev:?}: mean {mean} std {std}"
        );
        let u = Tensor::uniform(&[1 << 16], -2.0, 3.0, DType::F32, &dev)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        assert!(u.iter().all(|&x| (-2.0..3.0).contains(&x)));
        assert!(Tensor::rand(&[2], DType::I32, &dev).is_err());
    }
}

#[test]
fn constructors_and_composites_follow_pytorch() {
    for dev in devices() {
        let l = Tensor::linspace(0.0, 1.0, 5, DType::F32, &dev).unwrap();
        assert_eq!(l.to_vec::<f32>().unwrap(), vec![0.0, 0.25, 0.5, 0.75, 1.0]);
        let e = Tensor::eye(2, 3, DType::F32, &dev).unwrap();
        assert_eq!(
            e.to_vec::<f32>().unwrap(),
            vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
        );
        let a = Tensor::arange(0.0, 6.0, 1.0, DType::F32, &dev)
            .unwrap()
            .view(&[2, 3])
            .unwrap();
        let b = Tensor::arange(6.0, 10.0, 1.0, DType::F32, &dev)
            .unwrap()
            .view(&[2, 2])
            .unwrap();
        let c = Tensor::cat(&[a.clone(), b.clone()], 1).unwrap();
        assert_eq!(c.shape(), &[2, 5]);
        assert_eq!(
            c.to_vec::<f32>().unwrap(),
            vec![0.0, 1.0, 2.0, 6.0, 7.0, 3.0, 4.0, 5.0, 8.0, 9.0]
        );
        assert!(matches!(
            Tensor::cat(&[a.clone(), b.clone()], 0),
            Err(kiln::Error::ShapeMismatch { .. })
        ));
        let s = Tensor::stack(&[a.clone(), a.clone()], 0).unwrap();
        assert_eq!(s.shape(), &[2, 2, 3]);
        let s1 = Tensor::stack(&[a.clone(), a.neg().unwrap()], -1).unwrap();
        assert_eq!(s1.shape(), &[2, 3, 2]);
        assert_eq!(s1.to_vec::<f32>().unwrap()[..4], [0.0, -0.0, 1.0, -1.0]);
        let parts = c.split(2, 1).unwrap();
        assert_eq!(
            parts.iter().map(|p| p.shape()[1]).collect::<Vec<_>>(),
            vec![2, 2, 1]
        );
        assert!(parts[1].shares_storage(&c));
        let chunks = c.chunk(2, 1).unwrap();
        assert_eq!(
            chunks.iter().map(|p| p.shape()[1]).collect::<Vec<_>>(),
            vec![3, 2]
        );
        // var/std with Bessel's correction, as torch.var (WGSL division may be 2.5 ulp off).
        let near = |got: Vec<f32>, want: &[f32]| {
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(want) {
                assert!(
                    (g - w).abs() <= 1e-6 * w.abs().max(1.0),
                    "{dev:?}: {got:?} vs {want:?}"
                );
            }
        };
        let v = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], &dev).unwrap();
        near(
            v.var(&[], 1, false).unwrap().to_vec::<f32>().unwrap(),
            &[5.0 / 3.0],
        );
        near(
            v.var(&[1], 0, false).unwrap().to_vec::<f32>().unwrap(),
            &[0.25, 0.25],
        );
        near(
            v.std(&[0], 1, true).unwrap().to_vec::<f32>().unwrap(),
            &[2f32.sqrt(); 2],
        );
        let t = Tensor::full(&[2], 1.0, DType::F32, &dev).unwrap();
        let x = Tensor::from_slice(&[2.0f32, 3.0], &[2], &dev).unwrap();
        assert_eq!(
            t.addcmul(&x, &x, 0.5).unwrap().to_vec::<f32>().unwrap(),
            vec![3.0, 5.5]
        );
        assert_eq!(
            t.addcdiv(&x, &x, 2.0).unwrap().to_vec::<f32>().unwrap(),
            vec![3.0, 3.0]
        );
        assert_eq!(
            t.lerp(&x, 0.5).unwrap().to_vec::<f32>().unwrap(),
            vec![1.5, 2.0]
        );
        assert_eq!(
            x.clamp(2.5, 10.0).unwrap().to_vec::<f32>().unwrap(),
            vec![2.5, 3.0]
        );
    }
}
