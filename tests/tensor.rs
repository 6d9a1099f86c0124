//! Tensors on every device: constructors, host reads, zero-copy views and their errors, and
//! storage that shows up in the allocator's statistics as PyTorch's would.

use kiln::{DType, Device, Error, Tensor};

fn devices() -> Vec<Device> {
    kiln::device::test_devices().expect("KILN_REQUIRE_GPU=1 and no GPU adapter")
}

#[test]
fn constructors_and_reads() {
    for dev in devices() {
        let t = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], &dev).unwrap();
        assert_eq!(t.shape(), &[2, 3]);
        assert_eq!(
            t.to_vec::<f32>().unwrap(),
            vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
        );
        assert!(matches!(
            t.to_vec::<i32>(),
            Err(Error::DTypeMismatch { .. })
        ));
        assert_eq!(
            Tensor::full(&[3], 2.5, DType::F32, &dev)
                .unwrap()
                .to_vec::<f32>()
                .unwrap(),
            vec![2.5; 3]
        );
        assert_eq!(
            Tensor::ones(&[5], DType::I32, &dev)
                .unwrap()
                .to_vec::<i32>()
                .unwrap(),
            vec![1; 5]
        );
        assert_eq!(
            Tensor::zeros(&[3], DType::Bool, &dev)
                .unwrap()
                .to_vec::<bool>()
                .unwrap(),
            vec![false; 3]
        );
        assert_eq!(
            Tensor::ones(&[5], DType::Bool, &dev)
                .unwrap()
                .to_vec::<bool>()
                .unwrap(),
            vec![true; 5]
        );
        assert_eq!(
            Tensor::arange(0.0, 5.0, 2.0, DType::I32, &dev)
                .unwrap()
                .to_vec::<i32>()
                .unwrap(),
            vec![0, 2, 4]
        );
        assert_eq!(
            Tensor::from_slice(&[7u32], &[], &dev)
                .unwrap()
                .item::<u32>()
                .unwrap(),
            7
        );
        assert!(matches!(
            t.item::<f32>(),
            Err(Error::InvalidArgument { op: "item", .. })
        ));
        assert!(matches!(
            Tensor::from_slice(&[1.0f32; 5], &[2, 3], &dev),
            Err(Error::ShapeMismatch { .. })
        ));
        let empty = Tensor::zeros(&[0, 4], DType::F32, &dev).unwrap();
        assert!(empty.to_vec::<f32>().unwrap().is_empty());
        if dev.adapter_info().is_none_or(|a| a.features.shader_f16) {
            let h = Tensor::from_f64_slice(&[0.5, -1.25, 3.0], &[3], DType::F16, &dev).unwrap();
            assert_eq!(h.to_f64_vec().unwrap(), vec![0.5, -1.25, 3.0]);
            assert_eq!(
                Tensor::full(&[3], 1.5, DType::F16, &dev)
                    .unwrap()
                    .to_f64_vec()
                    .unwrap(),
                vec![1.5; 3]
            );
        } else {
            let e = Tensor::zeros(&[2], DType::F16, &dev).unwrap_err();
            assert!(matches!(e, Error::UnsupportedDType { .. }), "{e}");
        }
    }
}

/// A shape whose element or byte count overflows is refused with PyTorch's message (a wrapped
/// product made `[2^32, 2^32]` an empty tensor whose reads returned nothing), and nothing is
/// allocated; `from_slice` with such a shape fails the same way.
#[test]
fn shapes_whose_size_overflows_are_refused() {
    for dev in devices() {
        let before = dev.memory_allocated();
        for shape in [
            vec![1usize << 32, 1 << 32],
            vec![usize::MAX / 2, 3],
            vec![1 << 62, 4],
        ] {
            for dtype in [DType::F32, DType::I32] {
                match Tensor::zeros(&shape, dtype, &dev) {
                    Err(Error::InvalidArgument {
                        op: "empty" | "full",
                        msg,
                    }) => {
                        assert!(msg.contains("overflowed"), "{msg}")
                    }
                    other => panic!("{shape:?} {dtype:?} on {}: {other:?}", dev.name()),
                }
            }
        }
        let empty: [f32; 0] = [];
        assert!(Tensor::from_slice(&empty, &[1 << 32, 1 << 32], &dev).is_err());
        assert_eq!(dev.memory_allocated(), before);
    }
}

#[test]
fn views_share_storage_and_follow_pytorch() {
    for dev in devices() {
        let t = Tensor::arange(0.0, 24.0, 1.0, DType::F32, &dev)
            .unwrap()
            .view(&[2, 3, 4])
            .unwrap();
        let tt = t.transpose(0, 2).unwrap();
        assert!(tt.shares_storage(&t) && !tt.is_contiguous());
        assert_eq!(tt.shape(), &[4, 3, 2]);
        assert_eq!(tt.strides(), &[1, 4, 12]);
        assert_eq!(tt.to_vec::<f32>().unwrap()[..4], [0.0, 12.0, 4.0, 16.0]);
        // A view of a transpose that cannot be a view: an error, while reshape copies.
        assert!(matches!(
            tt.view(&[-1]),
            Err(Error::InvalidArgument { op: "view", .. })
        ));
        let flat = tt.reshape(&[-1]).unwrap();
        assert!(!flat.shares_storage(&t));
        assert_eq!(flat.to_vec::<f32>().unwrap().len(), 24);
        let c = t.contiguous().unwrap();
        assert!(
            c.shares_storage(&t),
            "contiguous is a no-op on a contiguous tensor"
        );
        let n = t.narrow(2, 1, 2).unwrap();
        assert_eq!(
            n.to_vec::<f32>().unwrap(),
            vec![1.0, 2.0, 5.0, 6.0, 9.0, 10.0, 13.0, 14.0, 17.0, 18.0, 21.0, 22.0]
        );
        assert!(matches!(
            t.narrow(2, 3, 2),
            Err(Error::IndexOutOfRange { .. })
        ));
        let p = t.permute(&[1, 2, 0]).unwrap();
        assert_eq!(p.shape(), &[3, 4, 2]);
        assert!(t.permute(&[0, 0, 1]).is_err());
        let u = t.unsqueeze(1).unwrap();
        assert_eq!(u.shape(), &[2, 1, 3, 4]);
        assert_eq!(u.squeeze(Some(1)).unwrap().shape(), &[2, 3, 4]);
        assert_eq!(u.squeeze(None).unwrap().shape(), &[2, 3, 4]);
        assert_eq!(t.flatten(1, -1).unwrap().shape(), &[2, 12]);
        let row = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], &dev).unwrap();
        let e = row.expand(&[2, 3]).unwrap();
        assert_eq!(e.strides(), &[0, 1]);
        assert_eq!(
            e.to_vec::<f32>().unwrap(),
            vec![1.0, 2.0, 3.0, 1.0, 2.0, 3.0]
        );
        assert!(matches!(
            row.expand(&[2, 4]),
            Err(Error::ShapeMismatch { .. })
        ));
        let m = Tensor::zeros(&[2, 3], DType::F32, &dev).unwrap();
        assert_eq!(m.t().unwrap().shape(), &[3, 2]);
        assert!(t.t().is_err());
    }
}

#[test]
fn storage_goes_through_the_caching_allocator() {
    for dev in devices() {
        dev.empty_cache();
        let before = dev.memory_allocated();
        let t = Tensor::zeros(&[1000, 1000], DType::F32, &dev).unwrap();
        assert_eq!(
            dev.memory_allocated() - before,
            4_000_256,
            "{dev:?}: 3.81 MiB, as in PyTorch"
        );
        let v = t.t().unwrap();
        assert_eq!(
            dev.memory_allocated() - before,
            4_000_256,
            "a view allocates nothing"
        );
        let s = (&v + &v).unwrap();
        assert_eq!(dev.memory_allocated() - before, 2 * 4_000_256);
        drop((t, v, s));
        assert_eq!(dev.memory_allocated(), before);
        let h = Tensor::zeros(&[1000], DType::Bool, &dev).unwrap();
        assert_eq!(
            dev.memory_allocated() - before,
            1024,
            "1000 bools are 1000 bytes, rounded to 1024"
        );
        drop(h);
    }
}

#[test]
fn to_device_round_trips() {
    let cpu = Device::cpu().unwrap();
    for dev in devices() {
        let t = Tensor::from_slice(&[1.0f32, -2.0, 3.5], &[3], &cpu).unwrap();
        let g = t.to_device(&dev).unwrap();
        assert_eq!(g.device(), &dev);
        assert_eq!(
            g.to_device(&cpu).unwrap().to_vec::<f32>().unwrap(),
            vec![1.0, -2.0, 3.5]
        );
        let strided = Tensor::arange(0.0, 6.0, 1.0, DType::F32, &dev)
            .unwrap()
            .view(&[2, 3])
            .unwrap()
            .t()
            .unwrap();
        assert_eq!(
            strided.to_device(&cpu).unwrap().to_vec::<f32>().unwrap(),
            vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
        );
    }
}
