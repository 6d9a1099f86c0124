//! Indexing ops on every device against the CPU device, and out-of-range indices: an error, not
//! garbage (at once on the CPU, at the next sync point on a GPU; the device stays usable).

use kiln::{DType, Device, Error, Tensor};

fn devices() -> Vec<Device> {
    kiln::device::test_devices().expect("KILN_REQUIRE_GPU=1 and no GPU adapter")
}

#[test]
fn gather_index_select_embedding_one_hot() {
    let cpu = Device::cpu().unwrap();
    for dev in devices() {
        let x = Tensor::arange(0.0, 24.0, 1.0, DType::F32, &dev)
            .unwrap()
            .view(&[4, 6])
            .unwrap();
        let idx = Tensor::from_slice(&[3i32, 0, 0, 2], &[4], &dev).unwrap();
        let rows = x.index_select(0, &idx).unwrap();
        assert_eq!(rows.shape(), &[4, 6]);
        assert_eq!(
            rows.to_vec::<f32>().unwrap()[..7],
            [18.0, 19.0, 20.0, 21.0, 22.0, 23.0, 0.0]
        );
        let cols = x.t().unwrap().index_select(1, &idx).unwrap(); // through a transposed view
        assert_eq!(cols.shape(), &[6, 4]);
        assert_eq!(cols.to_vec::<f32>().unwrap()[..4], [18.0, 0.0, 0.0, 12.0]);
        // torch.gather(x, 1, [[0, 5], [2, 2], [1, 0], [5, 4]])
        let g = Tensor::from_slice(&[0i32, 5, 2, 2, 1, 0, 5, 4], &[4, 2], &dev).unwrap();
        assert_eq!(
            x.gather(1, &g).unwrap().to_vec::<f32>().unwrap(),
            vec![0.0, 5.0, 8.0, 8.0, 13.0, 12.0, 23.0, 22.0]
        );
        let w = Tensor::arange(0.0, 10.0, 1.0, DType::F32, &dev)
            .unwrap()
            .view(&[5, 2])
            .unwrap();
        let ids = Tensor::from_slice(&[4i32, 1, 1, 0], &[2, 2], &dev).unwrap();
        let e = kiln::ops::embedding(&w, &ids).unwrap();
        assert_eq!(e.shape(), &[2, 2, 2]);
        assert_eq!(
            e.to_vec::<f32>().unwrap(),
            vec![8.0, 9.0, 2.0, 3.0, 2.0, 3.0, 0.0, 1.0]
        );
        let oh =
            kiln::ops::one_hot(&Tensor::from_slice(&[2i32, 0], &[2], &dev).unwrap(), 3).unwrap();
        assert_eq!(oh.to_vec::<i32>().unwrap(), vec![0, 0, 1, 1, 0, 0]);
        // Random gathers against the CPU, f32 and i32 values.
        let values: Vec<i32> = (0..300).map(|i| (i * 7919 % 1000) - 500).collect();
        let picks: Vec<i32> = (0..150).map(|i| i * 31 % 15).collect();
        let run = |d: &Device| {
            let v = Tensor::from_slice(&values, &[20, 15], d).unwrap();
            let p = Tensor::from_slice(&picks, &[10, 15], d).unwrap();
            v.narrow(0, 2, 10)
                .unwrap()
                .gather(1, &p.narrow(0, 0, 10).unwrap().narrow(1, 0, 9).unwrap())
                .unwrap()
                .to_vec::<i32>()
                .unwrap()
        };
        assert_eq!(run(&dev), run(&cpu), "{dev:?}");
    }
}

#[test]
fn out_of_range_indices_are_errors_and_the_device_stays_usable() {
    for dev in devices() {
        let x = Tensor::ones(&[4, 3], DType::F32, &dev).unwrap();
        let bad = Tensor::from_slice(&[1i32, 4], &[2], &dev).unwrap();
        let result = x.index_select(0, &bad).and_then(|t| t.to_vec::<f32>());
        let e = result.unwrap_err();
        match (&e, dev.is_cpu()) {
            (
                Error::IndexOutOfRange {
                    index: 4, size: 4, ..
                },
                true,
            ) => {}
            (Error::DeviceAssert { ops, .. }, false) => {
                assert!(ops.contains("index_select"), "{e}")
            }
            _ => panic!("{dev:?}: {e}"),
        }
        let neg = Tensor::from_slice(&[-1i32], &[1], &dev).unwrap();
        assert!(
            x.index_select(0, &neg)
                .and_then(|t| t.to_vec::<f32>())
                .is_err(),
            "{dev:?}: negative index"
        );
        // The flag was cleared: good indices work again, and other tensors are intact.
        let good = Tensor::from_slice(&[3i32, 0], &[2], &dev).unwrap();
        assert_eq!(
            x.index_select(0, &good).unwrap().to_vec::<f32>().unwrap(),
            vec![1.0; 6]
        );
        dev.synchronize().unwrap();
        assert!(matches!(
            kiln::ops::one_hot(&bad, 4),
            Err(Error::IndexOutOfRange { op: "one_hot", .. })
        ));
        let f = Tensor::zeros(&[2], DType::F32, &dev).unwrap();
        assert!(matches!(
            x.index_select(0, &f),
            Err(Error::DTypeMismatch { .. })
        ));
    }
}

#[test]
fn scatter_add_accumulates_collisions_like_pytorch() {
    let cpu = Device::cpu().unwrap();
    for dev in devices() {
        // torch.zeros(3, 4).scatter_add(0, [[0, 1, 2, 0], [2, 2, 0, 1]], ones(2, 4))
        let x = Tensor::zeros(&[3, 4], DType::F32, &dev).unwrap();
        let idx = Tensor::from_slice(&[0i32, 1, 2, 0, 2, 2, 0, 1], &[2, 4], &dev).unwrap();
        let src = Tensor::ones(&[2, 4], DType::F32, &dev).unwrap();
        let y = x.scatter_add(0, &idx, &src).unwrap();
        assert_eq!(
            y.to_vec::<f32>().unwrap(),
            vec![1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0]
        );
        assert_eq!(
            x.to_vec::<f32>().unwrap(),
            vec![0.0; 12],
            "the input is untouched"
        );
        // Heavy collisions (a histogram of 10000 values into 7 bins), f32 and i32, against the CPU.
        let bins: Vec<i32> = (0..10_000).map(|i| i * 7919 % 7).collect();
        for dtype in [DType::F32, DType::I32] {
            let run = |d: &Device| {
                let hist = Tensor::zeros(&[7], dtype, d).unwrap();
                let idx = Tensor::from_slice(&bins, &[10_000], d).unwrap();
                let ones = Tensor::ones(&[10_000], dtype, d).unwrap();
                hist.scatter_add(0, &idx, &ones)
                    .unwrap()
                    .to_f64_vec()
                    .unwrap()
            };
            let (got, want) = (run(&dev), run(&cpu));
            assert_eq!(got, want, "{dev:?} {dtype}");
            assert_eq!(got.iter().sum::<f64>(), 10_000.0);
        }
        let bad = Tensor::from_slice(&[0i32, 3, 0, 0], &[1, 4], &dev).unwrap();
        let r = x.scatter_add(0, &bad, &src).and_then(|t| t.to_vec::<f32>());
        assert!(r.is_err(), "{dev:?}: index 3 of 3 rows");
        assert!(
            x.scatter_add(0, &idx, &src)
                .unwrap()
                .to_vec::<f32>()
                .is_ok(),
            "{dev:?}: usable after"
        );
    }
}
