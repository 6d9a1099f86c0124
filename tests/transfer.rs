//! Pinned memory and copies between the host and every GPU present: round trips of random data
//! of many sizes on every path (pageable, pinned non-blocking, cross-device `copy_`, chunked),
//! reuse of staging blocks only after their copies, ordering with queued kernels, reads of
//! pinned tensors in flight, events, the `Future` of a transfer, and the host stats after each
//! step. Against the host data as the reference.

use kiln::{DType, Device, PinnedKind, Tensor};

fn gpus() -> Vec<Device> {
    let devices = kiln::device::test_devices()
        .expect("KILN_REQUIRE_GPU=1 and no GPU adapter (install mesa-vulkan-drivers)");
    devices.into_iter().filter(|d| !d.is_cpu()).collect()
}

/// Deterministic pseudo-random f32s (an LCG; the values only need to differ).
fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

fn host_stat(d: &Device, key: &str) -> i64 {
    d.host_memory_stats().to_map()[key]
}

/// Sizes around the edges: empty, odd byte counts (bool), one word, a staging chunk and more.
const SIZES: [usize; 8] = [0, 1, 3, 5, 255, 1024, 16 * 1024 + 1, 40 * 1024 + 7];
const CHUNK: u64 = 64 * 1024;

#[test]
fn round_trips_of_many_sizes_on_every_path() {
    let cpu = Device::cpu().unwrap();
    for gpu in gpus() {
        gpu.set_staging_chunk_bytes(CHUNK);
        for (i, &n) in SIZES.iter().enumerate() {
            let x = data(n, i as u32);
            let host = Tensor::from_slice(&x, &[n], &cpu).unwrap();
            // Pageable, both ways (more than two chunks for the largest sizes).
            let g = host.to_device(&gpu).unwrap();
            assert_eq!(
                g.to_vec::<f32>().unwrap(),
                x,
                "pageable round trip, n = {n}"
            );
            // Pinned, non-blocking both ways.
            let pinned = host.pin_memory(&gpu).unwrap();
            assert!(n == 0 || pinned.is_pinned());
            let g2 = pinned.to_device_non_blocking(&gpu).unwrap();
            let back = g2.to_device_non_blocking(&cpu).unwrap();
            assert!(n == 0 || back.pinned_kind() == Some(PinnedKind::Download));
            assert_eq!(
                back.to_vec::<f32>().unwrap(),
                x,
                "pinned round trip, n = {n}"
            );
            // copy_ across devices into existing tensors.
            let dst = Tensor::zeros(&[n], DType::F32, &cpu).unwrap();
            dst.copy_(&g2).unwrap();
            assert_eq!(dst.to_vec::<f32>().unwrap(), x);
            let gdst = Tensor::zeros(&[n], DType::F32, &gpu).unwrap();
            gdst.copy_(&dst).unwrap();
            assert_eq!(gdst.to_vec::<f32>().unwrap(), x);
            // Odd byte counts: bools through the pinned paths.
            let flags: Vec<bool> = x.iter().map(|v| *v > 0.0).collect();
            let hb = Tensor::from_slice(&flags, &[n], &cpu).unwrap();
            let gb = hb
                .pin_memory(&gpu)
                .unwrap()
                .to_device_non_blocking(&gpu)
                .unwrap();
            assert_eq!(gb.to_vec::<bool>().unwrap(), flags, "bool n = {n}");
            let pb = Tensor::empty_pinned(&[n], DType::Bool, &gpu, PinnedKind::Download).unwrap();
            pb.copy_non_blocking_(&gb).unwrap().wait().unwrap();
            assert_eq!(pb.to_vec::<bool>().unwrap(), flags);
        }
        gpu.synchronize().unwrap();
    }
}

#[test]
fn views_and_mismatched_kinds_still_copy_correctly() {
    let cpu = Device::cpu().unwrap();
    for gpu in gpus() {
        let x = data(12 * 7, 3);
        let host = Tensor::from_slice(&x, &[12, 7], &cpu).unwrap();
        let g = host.to_device(&gpu).unwrap();
        // A transposed GPU view into pinned memory, and a narrowed pinned view up.
        let t = g.t().unwrap();
        let want = host
            .t()
            .unwrap()
            .contiguous()
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let p = t.to_device_non_blocking(&cpu).unwrap();
        assert_eq!(p.to_vec::<f32>().unwrap(), want);
        let pinned = host.pin_memory(&gpu).unwrap();
        let rows = pinned.narrow(0, 3, 5).unwrap();
        let up = rows.to_device_non_blocking(&gpu).unwrap();
        assert_eq!(up.to_vec::<f32>().unwrap(), x[3 * 7..8 * 7].to_vec());
        // Download memory as an upload source, upload memory as a download target.
        let down = Tensor::empty_pinned(&[12, 7], DType::F32, &gpu, PinnedKind::Download).unwrap();
        down.copy_(&host).unwrap();
        assert_eq!(
            down.to_device_non_blocking(&gpu)
                .unwrap()
                .to_vec::<f32>()
                .unwrap(),
            x
        );
        let upmem = Tensor::empty_pinned(&[12, 7], DType::F32, &gpu, PinnedKind::Upload).unwrap();
        upmem.copy_non_blocking_(&g).unwrap().wait().unwrap();
        assert_eq!(upmem.to_vec::<f32>().unwrap(), x);
        // CPU ops read pinned tensors in place.
        let doubled = (&pinned * &pinned).unwrap();
        let want: Vec<f32> = x.iter().map(|v| v * v).collect();
        assert_eq!(doubled.to_vec::<f32>().unwrap(), want);
    }
}

#[test]
fn pinned_tensors_in_flight_are_never_read_stale_or_written_torn() {
    let cpu = Device::cpu().unwrap();
    for gpu in gpus() {
        let n = 64 * 1024;
        let x = data(n, 9);
        let g = Tensor::from_slice(&x, &[n], &gpu).unwrap();
        // Queue work, then read its result into pinned memory and read that at once: the host
        // access waits for the copy.
        let y = g.mul_scalar(2.0).unwrap().exp().unwrap();
        let want: Vec<f32> = y.to_vec().unwrap();
        for _ in 0..3 {
            let y = g.mul_scalar(2.0).unwrap().exp().unwrap();
            let h = y.to_device_non_blocking(&cpu).unwrap();
            assert_eq!(h.to_vec::<f32>().unwrap(), want);
            let h2 = y.to_device_non_blocking(&cpu).unwrap();
            let s = h2.sum(&[0], false).unwrap().item::<f32>().unwrap();
            let exact: f64 = want.iter().map(|&v| v as f64).sum();
            assert!((s as f64 - exact).abs() < 1e-3 * exact.abs());
        }
        // Overwrite a pinned source right after its upload started: the upload carries the old
        // values, the write waits for it.
        let p = Tensor::from_slice(&x, &[n], &cpu)
            .unwrap()
            .pin_memory(&gpu)
            .unwrap();
        let up = p.to_device_non_blocking(&gpu).unwrap();
        p.fill_(7.0).unwrap();
        assert_eq!(up.to_vec::<f32>().unwrap(), x);
        assert!(p.to_vec::<f32>().unwrap().iter().all(|&v| v == 7.0));
    }
}

#[test]
fn copies_stay_in_order_with_queued_kernels() {
    let cpu = Device::cpu().unwrap();
    for gpu in gpus() {
        let n = 4096;
        let old = data(n, 1);
        let new = data(n, 2);
        let a = Tensor::from_slice(&old, &[n], &gpu).unwrap();
        // A kernel reading `a` is queued; then `a` is overwritten by a non-blocking upload and by
        // a pageable one. The kernel must see the old values.
        let b = a.mul_scalar(3.0).unwrap();
        let pinned = Tensor::from_slice(&new, &[n], &cpu)
            .unwrap()
            .pin_memory(&gpu)
            .unwrap();
        a.copy_non_blocking_(&pinned).unwrap();
        let c = a.mul_scalar(3.0).unwrap();
        a.copy_(&Tensor::from_slice(&old, &[n], &cpu).unwrap())
            .unwrap();
        let triple = |v: &[f32]| v.iter().map(|x| x * 3.0).collect::<Vec<f32>>();
        assert_eq!(b.to_vec::<f32>().unwrap(), triple(&old));
        assert_eq!(c.to_vec::<f32>().unwrap(), triple(&new));
        assert_eq!(a.to_vec::<f32>().unwrap(), old);
        // A block freed while a kernel reading it is queued, reused for an upload at once.
        let t = Tensor::from_slice(&old, &[n], &gpu).unwrap();
        let e = t.exp().unwrap();
        drop(t);
        let u = Tensor::from_slice(&new, &[n], &gpu).unwrap();
        let want: Vec<f32> = old.iter().map(|v| v.exp()).collect();
        let got = e.to_vec::<f32>().unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-6 * w.abs().max(1.0));
        }
        assert_eq!(u.to_vec::<f32>().unwrap(), new);
    }
}

#[test]
fn staging_blocks_are_reused_only_after_their_copies_and_stats_follow() {
    let cpu = Device::cpu().unwrap();
    for gpu in gpus() {
        gpu.synchronize().unwrap();
        gpu.empty_host_cache();
        gpu.reset_accumulated_host_memory_stats();
        assert_eq!(host_stat(&gpu, "allocations.current"), 0);
        let n = 1000; // 4000 bytes -> a 4096-byte block
        let x = Tensor::from_slice(&data(n, 5), &[n], &cpu).unwrap();
        let before = host_stat(&gpu, "num_host_alloc");
        let p = Tensor::empty_pinned(&[n], DType::F32, &gpu, PinnedKind::Upload).unwrap();
        assert_eq!(host_stat(&gpu, "num_host_alloc"), before + 1);
        assert_eq!(host_stat(&gpu, "active_bytes.current"), 4096);
        p.copy_(&x).unwrap();
        // Queue a lot of work first so that the upload is likely still queued when `p` goes.
        let big = Tensor::ones(&[256, 256], DType::F32, &gpu).unwrap();
        let mut acc = big.clone();
        for _ in 0..8 {
            acc = acc.matmul(&big).unwrap().mul_scalar(1.0 / 256.0).unwrap();
        }
        let up = Tensor::zeros(&[n], DType::F32, &gpu).unwrap();
        let t = up.copy_non_blocking_(&p).unwrap();
        drop(p);
        let pending = !t.is_ready();
        // While its copy may run, the block stays checked out and is not handed out again.
        let q = Tensor::empty_pinned(&[n], DType::F32, &gpu, PinnedKind::Upload).unwrap();
        if pending {
            assert_eq!(
                host_stat(&gpu, "num_host_alloc"),
                before + 2,
                "a pinned block was reused while its copy was queued"
            );
        }
        t.wait().unwrap();
        assert!(t.is_ready());
        assert!(up.to_vec::<f32>().unwrap() == x.to_vec::<f32>().unwrap());
        drop(q);
        let allocs = host_stat(&gpu, "num_host_alloc");
        // After completion, the same size is served from the cache.
        let r = Tensor::empty_pinned(&[n], DType::F32, &gpu, PinnedKind::Upload).unwrap();
        assert_eq!(host_stat(&gpu, "num_host_alloc"), allocs);
        drop(r);
        assert_eq!(host_stat(&gpu, "active_requests.current"), 0);
        let cached = host_stat(&gpu, "allocations.current");
        assert!(cached >= 1);
        gpu.empty_host_cache();
        assert_eq!(host_stat(&gpu, "allocations.current"), 0);
        assert_eq!(host_stat(&gpu, "num_host_free"), cached);
        drop(acc);
    }
}

#[test]
fn events_and_futures_complete() {
    let cpu = Device::cpu().unwrap();
    for gpu in gpus() {
        let x = data(1 << 16, 4);
        let g = Tensor::from_slice(&x, &[x.len()], &gpu).unwrap();
        let y = g.exp().unwrap();
        let e = gpu.record_event().unwrap();
        e.synchronize().unwrap();
        assert!(e.query());
        let p = Tensor::empty_pinned(&[x.len()], DType::F32, &gpu, PinnedKind::Download).unwrap();
        let t = p.copy_non_blocking_(&y).unwrap();
        pollster::block_on(t).unwrap();
        let want: Vec<f32> = x.iter().map(|v| v.exp()).collect();
        let got = p.to_vec::<f32>().unwrap();
        assert!(got
            .iter()
            .zip(&want)
            .all(|(a, b)| (a - b).abs() <= 1e-6 * b.abs()));
        // The CPU device's events are always complete.
        assert!(cpu.record_event().unwrap().query());
        // Pinning a GPU tensor is an error that names the device.
        let err = g.pin_memory(&gpu).unwrap_err().to_string();
        assert!(err.contains("only CPU tensors"), "{err}");
        assert!(Tensor::empty_pinned(&[4], DType::F32, &cpu, PinnedKind::Upload).is_err());
    }
}

#[test]
fn data_loader_batches_match_the_dataset_on_every_device() {
    use kiln::data::{synthetic_glyphs, DataLoader, LoaderOptions};
    use std::sync::Arc;
    let set = Arc::new(synthetic_glyphs(50, 7));
    let px = set.side * set.side;
    let mut devices = gpus();
    devices.push(Device::cpu().unwrap());
    for dev in devices {
        for pin in [true, false] {
            let opts = LoaderOptions {
                batch_size: 16,
                pin_memory: pin,
                prefetch: 2,
                num_workers: if pin { 3 } else { 1 },
                ..Default::default()
            };
            let mut loader = DataLoader::new(set.clone(), &dev, opts.clone()).unwrap();
            assert_eq!(loader.len(), 4);
            let mut images = Vec::new();
            let mut labels = Vec::new();
            let mut sizes = Vec::new();
            for b in loader.iter() {
                let (x, y) = b.unwrap();
                assert!(x.device() == &dev && y.device() == &dev);
                assert_eq!(&x.shape()[1..], &[1, set.side, set.side]);
                sizes.push(x.shape()[0]);
                images.extend(x.to_vec::<f32>().unwrap());
                labels.extend(y.to_vec::<i32>().unwrap());
            }
            assert_eq!(sizes, vec![16, 16, 16, 2]);
            assert!(images == set.images, "pin_memory {pin} on {}", dev.name());
            assert_eq!(labels, set.labels);
            // Shuffled epochs: permutations of the data, different each epoch, the same for the
            // same seed; drop_last drops the short batch.
            let shuffled = LoaderOptions {
                shuffle: true,
                drop_last: true,
                ..opts
            };
            let mut a = DataLoader::new(set.clone(), &dev, shuffled.clone()).unwrap();
            let mut b = DataLoader::new(set.clone(), &dev, shuffled).unwrap();
            let epoch = |l: &mut DataLoader<_>| -> Vec<Vec<f32>> {
                l.iter()
                    .flat_map(|batch| {
                        let x = batch.unwrap().0.to_vec::<f32>().unwrap();
                        x.chunks(px).map(<[f32]>::to_vec).collect::<Vec<_>>()
                    })
                    .collect()
            };
            let (e1, e2, f1) = (epoch(&mut a), epoch(&mut a), epoch(&mut b));
            assert_eq!(e1.len(), 48);
            assert_eq!(e1, f1, "same seed, same order");
            assert_ne!(e1, e2, "a fresh permutation each epoch");
            for img in &e1 {
                assert!((0..set.len()).any(|i| set.image(i) == img.as_slice()));
            }
        }
    }
}

/// A GPU copy moves whole words: an odd count of f16s or bools (a byte count that is not a
/// multiple of 4) once recursed until the stack overflowed. Every odd size round-trips.
#[test]
fn odd_byte_counts_reach_the_gpu() {
    let cpu = Device::cpu().unwrap();
    for dev in gpus() {
        let f16 = dev.adapter_info().is_some_and(|a| a.features.shader_f16);
        for n in [1usize, 3, 5, 703, 1001] {
            let v = data(n, n as u32);
            let x = Tensor::from_slice(&v, &[n], &cpu).unwrap();
            let mut dtypes = vec![DType::Bool];
            if f16 {
                dtypes.push(DType::F16);
            }
            for dtype in dtypes {
                let want = x.gt_scalar(0.0).unwrap().to_dtype(DType::F32).unwrap();
                let (src, want) = match dtype {
                    DType::Bool => (x.gt_scalar(0.0).unwrap(), want),
                    _ => {
                        let h = x.to_dtype(dtype).unwrap();
                        (h.clone(), h.to_dtype(DType::F32).unwrap())
                    }
                };
                let on_gpu = src.to_device(&dev).unwrap();
                let back = on_gpu
                    .to_dtype(DType::F32)
                    .unwrap()
                    .to_device(&cpu)
                    .unwrap();
                assert_eq!(
                    back.to_vec::<f32>().unwrap(),
                    want.to_vec::<f32>().unwrap(),
                    "{n} {dtype} on {}",
                    dev.name()
                );
                // Arithmetic on it sees exactly n elements.
                let s = on_gpu.to_dtype(DType::F32).unwrap().sum_all().unwrap();
                let want_sum: f32 = want.to_vec::<f32>().unwrap().iter().sum();
                assert!((s.item::<f32>().unwrap() - want_sum).abs() < 1e-3 * n as f32);
            }
        }
    }
}

/// Rows of an f16 matrix of odd width start inside a 4-byte word; copying such a view to the
/// host reads from the word's start and skips what is before it (a buffer copy moves whole
/// words from aligned offsets), blocking or not.
#[test]
fn views_starting_inside_a_word_download() {
    let cpu = Device::cpu().unwrap();
    for gpu in gpus() {
        if !gpu.adapter_info().is_some_and(|i| i.features.shader_f16) {
            continue;
        }
        let x: Vec<half::f16> = (0..5 * 7)
            .map(|i| half::f16::from_f32(i as f32 - 9.5))
            .collect();
        let g = Tensor::from_slice(&x, &[5, 7], &gpu).unwrap();
        for i in 0..5 {
            let want = x[i * 7..(i + 1) * 7].to_vec();
            let row = g.narrow(0, i, 1).unwrap();
            let blocking = row.to_device(&cpu).unwrap().to_vec::<half::f16>().unwrap();
            assert_eq!(blocking, want, "{gpu:?}: row {i}");
            assert_eq!(row.to_vec::<half::f16>().unwrap(), want, "{gpu:?}: row {i}");
            let pinned = row.to_device_non_blocking(&cpu).unwrap();
            assert_eq!(
                pinned.to_vec::<half::f16>().unwrap(),
                want,
                "{gpu:?}: row {i}, pinned"
            );
        }
    }
}
