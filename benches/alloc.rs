//! Cached allocation + free through kiln's caching allocator against creating and destroying a
//! wgpu buffer of the same size, on the best adapter (and the policy alone, without a device).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use kiln::alloc::{AllocatorConfig, CachingAllocator, SimulatedSource};
use kiln::Device;

const SIZES: [u64; 3] = [4096, 4 << 20, 64 << 20];

fn bench_alloc(c: &mut Criterion) {
    let device = Device::best().expect("a device");
    let mut group = c.benchmark_group(format!("alloc/{}", device.name()));
    for size in SIZES {
        // Warm the cache so the loop measures the cached path.
        drop(device.allocate(size).unwrap());
        group.bench_with_input(BenchmarkId::new("cached_pair", size), &size, |b, &size| {
            b.iter(|| drop(device.allocate(std::hint::black_box(size)).unwrap()))
        });
        if let Some(raw) = kiln::device::raw_wgpu_device(&device) {
            group.bench_with_input(
                BenchmarkId::new("wgpu_create_destroy", size),
                &size,
                |b, &size| {
                    b.iter(|| {
                        let buf = raw.create_buffer(&wgpu::BufferDescriptor {
                            label: None,
                            size,
                            usage: wgpu::BufferUsages::STORAGE
                                | wgpu::BufferUsages::COPY_SRC
                                | wgpu::BufferUsages::COPY_DST,
                            mapped_at_creation: false,
                        });
                        buf.destroy();
                    })
                },
            );
        }
    }
    group.finish();

    let mut policy = CachingAllocator::new(SimulatedSource::new(None), AllocatorConfig::default());
    let warm = policy.malloc(4 << 20, 0).unwrap().unwrap();
    policy.free(warm.addr).unwrap();
    c.bench_function("alloc/policy_only/cached_pair/4194304", |b| {
        b.iter(|| {
            let blk = policy
                .malloc(std::hint::black_box(4 << 20), 0)
                .unwrap()
                .unwrap();
            policy.free(blk.addr).unwrap();
        })
    });
}

criterion_group!(benches, bench_alloc);
criterion_main!(benches);
