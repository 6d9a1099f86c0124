//! Devices and their allocators on every adapter present (and the CPU device): raw block
//! operations against the host, ordering of uploads with queued work, PyTorch's memory numbers,
//! out-of-memory that leaves the device usable, and thread safety.

use kiln::{Device, Error};

const MIB: u64 = 1 << 20;

fn devices() -> Vec<Device> {
    kiln::device::test_devices()
        .expect("KILN_REQUIRE_GPU=1 and no GPU adapter (install mesa-vulkan-drivers)")
}

fn words(bytes: &[u8]) -> Vec<u32> {
    bytemuck::pod_collect_to_vec(bytes)
}

#[test]
fn a_gpu_is_present_when_required() {
    if kiln::device::gpu_required() {
        assert!(
            !kiln::adapters().is_empty(),
            "KILN_REQUIRE_GPU=1 but wgpu found no adapter"
        );
        assert!(!Device::best().unwrap().is_cpu());
    }
}

/// One device per GPU: a GL adapter of a GPU that a native (Vulkan, Metal, DX12) adapter also
/// drives is not opened, while `all_adapters` (what the tests use) keeps it.
#[test]
fn all_gpus_opens_one_device_per_gpu() {
    let gpu = |name: &str| name.split('/').next().unwrap_or(name).trim().to_string();
    let listed = kiln::adapters();
    let native: Vec<String> = listed
        .iter()
        .filter(|a| a.backend != wgpu::Backend::Gl)
        .map(|a| gpu(&a.name))
        .collect();
    let specs = |ds: Vec<Device>| ds.iter().map(|d| d.spec().to_string()).collect::<Vec<_>>();
    let one_per_gpu = specs(Device::all_gpus());
    let every = specs(Device::all_adapters());
    for a in &listed {
        let duplicate = a.backend == wgpu::Backend::Gl && native.contains(&gpu(&a.name));
        if duplicate {
            assert!(
                !one_per_gpu.contains(&a.spec),
                "{} drives a GPU twice",
                a.spec
            );
        } else if every.contains(&a.spec) {
            // Anything else that opens is kept.
            assert!(one_per_gpu.contains(&a.spec), "{} was dropped", a.spec);
        }
        // Every adapter all_gpus opens, all_adapters opens too.
        if one_per_gpu.contains(&a.spec) {
            assert!(every.contains(&a.spec), "{}", a.spec);
        }
    }
}

#[test]
fn spec_selection_and_errors() {
    assert!(Device::from_spec("cpu").unwrap().is_cpu());
    let err = Device::from_spec("vulkan:99").unwrap_err();
    assert!(matches!(err, Error::NoSuchDevice { .. }));
    assert!(err.to_string().contains("available: cpu"), "{err}");
    // Every listed adapter either opens or says why, as a typed error (NVIDIA's GL adapter
    // through EGL on a headless H100 refuses: "Parent device is lost").
    for a in kiln::adapters() {
        match Device::from_spec(&a.spec) {
            Ok(d) => assert_eq!(d.spec(), a.spec),
            Err(e) => assert!(matches!(e, Error::RequestDevice { .. }), "{}: {e}", a.spec),
        }
    }
}

#[test]
fn fill_write_read_match_the_host() {
    for dev in devices() {
        for n_words in [1u64, 7, 256, 1000, 65_537, 1 << 20] {
            let block = dev.allocate(n_words * 4).unwrap();
            block.fill_u32(0xdead_beef).unwrap();
            let got = words(&block.read().unwrap());
            assert_eq!(
                got,
                vec![0xdead_beef; n_words as usize],
                "{dev:?} n={n_words}"
            );
            let data: Vec<u32> = (0..n_words as u32)
                .map(|i| i.wrapping_mul(2654435761))
                .collect();
            block.write(0, bytemuck::cast_slice(&data)).unwrap();
            assert_eq!(words(&block.read().unwrap()), data, "{dev:?} n={n_words}");
        }
        // Zero bytes: an empty block, no memory, no stats.
        let before = dev.memory_stats();
        let empty = dev.allocate(0).unwrap();
        assert!(empty.read().unwrap().is_empty());
        empty.fill_u32(1).unwrap();
        drop(empty);
        assert_eq!(dev.memory_stats(), before);
    }
}

/// Blocks of one segment written by different dispatches of one pass keep their own values:
/// parameters travel with each dispatch (immediates), not through `queue.write_buffer`.
#[test]
fn dispatches_in_one_pass_keep_their_own_parameters() {
    for dev in devices() {
        let blocks: Vec<_> = (0..8).map(|_| dev.allocate(1000).unwrap()).collect();
        let segments = dev.memory_stats()["segment.all.current"];
        assert_eq!(segments, 1, "{dev:?}: eight small blocks share one segment");
        for (i, b) in blocks.iter().enumerate() {
            b.fill_u32(i as u32 + 1).unwrap();
        }
        for (i, b) in blocks.iter().enumerate() {
            assert_eq!(
                words(&b.read().unwrap()),
                vec![i as u32 + 1; 250],
                "{dev:?}"
            );
        }
    }
}

/// The `queue.write_buffer` trap: an upload into a block that was freed and handed out again
/// while a kernel writing the old block is still queued must land after that kernel.
#[test]
fn uploads_stay_ordered_after_queued_work_on_a_reused_block() {
    for dev in devices() {
        let a = dev.allocate(4 * MIB).unwrap();
        a.fill_u32(7).unwrap(); // queued, not yet submitted
        let addr = a.address();
        drop(a);
        let b = dev.allocate(4 * MIB).unwrap();
        assert_eq!(
            b.address(),
            addr,
            "{dev:?}: the cached block is reused at once, as in PyTorch"
        );
        let data: Vec<u32> = (0..(MIB as u32)).collect();
        b.write(0, bytemuck::cast_slice(&data)).unwrap();
        assert_eq!(
            words(&b.read().unwrap()),
            data,
            "{dev:?}: the fill ran after the upload"
        );
        // And the other way round: a fill recorded after an upload wins.
        b.fill_u32(3).unwrap();
        assert_eq!(words(&b.read().unwrap()), vec![3; MIB as usize], "{dev:?}");
    }
}

/// PyTorch's familiar figures: a 1000x1000 f32 tensor is 3.81 MiB allocated, 20 MiB reserved;
/// after drop 0 allocated and 20 MiB reserved; after `empty_cache` nothing reserved.
#[test]
fn memory_numbers_match_pytorch() {
    for dev in devices() {
        let t = dev.allocate(1000 * 1000 * 4).unwrap();
        assert_eq!(dev.memory_allocated(), 4_000_256, "{dev:?}");
        assert_eq!(dev.memory_reserved(), 20 * MIB, "{dev:?}");
        assert_eq!(kiln::alloc::format_size(dev.memory_allocated()), "3.81 MiB");
        drop(t);
        let summary = dev.memory_summary(false);
        assert!(summary.contains("kiln memory summary"), "{summary}");
        assert!(
            summary.contains(
                "| GPU reserved memory   |  20480 KiB |  20480 KiB |  20480 KiB |      0 B   |"
            ),
            "{summary}"
        );
        assert!(
            summary.contains(
                "| Allocated memory      |      0 B   |   3906 KiB |   3906 KiB |   3906 KiB |"
            ),
            "{summary}"
        );
        // kiln's line after PyTorch's table: the cache holds one free 20 MiB block.
        assert!(
            summary.ends_with(
                "kiln: largest free cached block 20.00 MiB of 20.00 MiB reserved but unallocated\n"
            ),
            "{summary}"
        );
        assert_eq!(dev.memory_allocated(), 0);
        assert_eq!(dev.memory_reserved(), 20 * MIB);
        assert_eq!(dev.max_memory_allocated(), 4_000_256);
        dev.empty_cache();
        assert_eq!(dev.memory_reserved(), 0);
        assert_eq!(dev.max_memory_reserved(), 20 * MIB);
        dev.reset_peak_memory_stats();
        assert_eq!(dev.max_memory_allocated(), 0);
        let stats = dev.memory_stats();
        assert_eq!(stats.len(), 122);
        assert_eq!(stats["num_device_alloc"], 1);
        assert_eq!(stats["num_device_free"], 1);
        dev.reset_accumulated_memory_stats();
        assert_eq!(dev.memory_stats()["num_device_alloc"], 0);
    }
}

#[test]
fn out_of_memory_leaves_the_device_usable() {
    for dev in devices() {
        let keep = dev.allocate(3 * MIB).unwrap();
        keep.fill_u32(5).unwrap();
        dev.set_memory_limit(Some(64 * MIB));
        let err = dev.allocate(100 * MIB).unwrap_err();
        let Error::OutOfMemory(oom) = &err else {
            panic!("{dev:?}: {err}")
        };
        assert_eq!(oom.alloc_size, 100 * MIB);
        assert_eq!(oom.allowed, Some(64 * MIB));
        assert!(err.to_string().contains("64.00 MiB allowed; "), "{err}");
        let stats = dev.memory_stats();
        assert_eq!(stats["num_ooms"], 1);
        assert_eq!(stats["num_alloc_retries"], 1);
        // Too large for any buffer: a typed error before any statistic moves.
        dev.set_memory_limit(None);
        if let Some(info) = dev.adapter_info() {
            let before = dev.memory_stats();
            let err = dev.allocate(info.limits.max_buffer_size + 1).unwrap_err();
            assert!(matches!(err, Error::TooLarge { .. }), "{err}");
            assert_eq!(dev.memory_stats(), before);
        }
        // Still working: the old block kept its data, new ones work.
        assert_eq!(words(&keep.read().unwrap()), vec![5; 3 * MIB as usize / 4]);
        let fresh = dev.allocate(MIB).unwrap();
        fresh.fill_u32(9).unwrap();
        assert_eq!(words(&fresh.read().unwrap())[0], 9);
        dev.synchronize().unwrap();
    }
}

#[test]
fn capacity_is_reported_where_the_backend_can() {
    for dev in devices() {
        let (free, total) = dev.mem_get_info();
        if let Some(info) = dev.adapter_info() {
            if info.backend == wgpu::Backend::Vulkan {
                assert!(
                    total.is_some_and(|t| t > 0),
                    "{dev:?}: Vulkan reports heaps"
                );
            }
        }
        if let (Some(free), Some(total)) = (free, total) {
            assert!(free <= total);
        }
    }
}

#[test]
fn allocator_is_thread_safe() {
    for dev in devices() {
        std::thread::scope(|s| {
            for t in 0..4u32 {
                let dev = dev.clone();
                s.spawn(move || {
                    let mut live = Vec::new();
                    for i in 0..200u32 {
                        let size = 512 * (1 + (i * 7919 + t * 104729) % 4000) as u64;
                        live.push(dev.allocate(size).unwrap());
                        if i % 3 == 0 {
                            live.swap_remove((i as usize * 31) % live.len());
                        }
                    }
                    let last = live.last().unwrap();
                    last.fill_u32(t).unwrap();
                    assert_eq!(words(&last.read().unwrap())[0], t);
                });
            }
        });
        assert_eq!(dev.memory_allocated(), 0, "{dev:?}");
        let stats = dev.memory_stats();
        assert_eq!(
            stats["allocation.all.allocated"],
            stats["allocation.all.freed"]
        );
        assert_eq!(stats["active_bytes.all.current"], 0);
    }
}

#[test]
fn snapshot_and_history_on_a_device() {
    for dev in devices() {
        dev.record_memory_history(
            Some(kiln::alloc::HistoryEnabled::All),
            kiln::alloc::HistoryContext::All,
            kiln::alloc::HistoryStacks::Kiln,
            1000,
        );
        let b = {
            let _scope = kiln::alloc::push_scope("matmul", "model.rs", 3);
            dev.allocate(5 * MIB).unwrap()
        };
        let snap = dev.memory_snapshot();
        let seg = &snap.segments[0];
        assert_eq!(seg.total_size, 20 * MIB);
        assert_eq!(
            seg.blocks[0].state,
            kiln::alloc::BlockState::ActiveAllocated
        );
        assert_eq!(seg.blocks[0].frames[0].name, "matmul");
        assert_eq!(seg.blocks[0].address, b.address());
        let actions: Vec<_> = snap.device_traces[0].iter().map(|t| t.action).collect();
        assert_eq!(
            actions,
            [
                kiln::alloc::TraceAction::SegmentAlloc,
                kiln::alloc::TraceAction::Alloc
            ]
        );
        let json = snap.to_json();
        assert!(json.contains("\"action\": \"segment_alloc\""));
        drop(b);
    }
}

/// wgpu's default handlers panic; kiln's turn errors and device loss into `kiln::Error`s at the
/// next sync point, and the device goes on after a plain error.
#[test]
fn wgpu_errors_and_device_loss_become_kiln_errors() {
    for dev in devices() {
        let Some(raw) = kiln::device::raw_wgpu_device(&dev) else {
            continue;
        };
        // A validation error outside any scope: a mapped-at-creation buffer of odd size.
        let _bad = raw.create_buffer(&wgpu::BufferDescriptor {
            label: Some("invalid on purpose"),
            size: 3,
            usage: wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: true,
        });
        let err = dev.synchronize().unwrap_err();
        assert!(
            matches!(
                err,
                Error::Wgpu {
                    op: "synchronize",
                    ..
                }
            ),
            "{dev:?}: {err}"
        );
        dev.synchronize().unwrap();
        let block = dev.allocate(4096).unwrap();
        block.fill_u32(1).unwrap();
        assert_eq!(words(&block.read().unwrap())[0], 1);

        raw.destroy();
        let _ = raw.poll(wgpu::PollType::Poll);
        let err = dev.synchronize().unwrap_err();
        assert!(matches!(err, Error::DeviceLost { .. }), "{dev:?}: {err}");
        assert!(matches!(dev.allocate(4096), Err(Error::DeviceLost { .. })));
        assert!(matches!(block.read(), Err(Error::DeviceLost { .. })));
    }
}

#[test]
fn gpu_time_measures_queued_work_with_timestamps() {
    for dev in devices() {
        let block = dev.allocate(16 << 20).unwrap();
        let t = kiln::device::gpu_time(&dev, || {
            for _ in 0..4 {
                block.fill_u32(1)?;
            }
            Ok(())
        })
        .unwrap();
        let stamps = dev
            .adapter_info()
            .is_some_and(|a| a.features.timestamp_query);
        match t {
            Some(secs) => assert!(secs > 0.0 && secs < 10.0, "{dev:?}: {secs}"),
            None => assert!(
                !stamps || dev.is_cpu(),
                "{dev:?} has timestamps but gpu_time gave none"
            ),
        }
        assert_eq!(words(&block.read().unwrap())[0], 1);
    }
}
