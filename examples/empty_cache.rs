//! The numbers PyTorch users expect from `empty_cache` (the example of PyTorch's own docs and
//! forums): a 1000x1000 f32 tensor shows 3.81 MiB allocated and 20 MiB reserved; after `drop`,
//! 0 allocated and still 20 MiB reserved (the cache keeps the segment); after `empty_cache`,
//! 0 reserved.
//!
//!     cargo run --example empty_cache [-- SPEC]

use kiln::{DType, Device, Tensor};

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

fn main() -> kiln::Result<()> {
    let args = clap::Command::new("empty_cache")
        .about("What empty_cache returns to the driver, step by step")
        .arg(clap::Arg::new("device").help("vulkan:0, gl:0, cpu, ... (default: the best adapter)"))
        .get_matches();
    let dev = match args.get_one::<String>("device") {
        Some(spec) => Device::from_spec(spec)?,
        None => Device::best()?,
    };
    let show = |when: &str| {
        println!(
            "{when:<28} memory_allocated {:>6.2} MiB   memory_reserved {:>6.2} MiB",
            mib(dev.memory_allocated()),
            mib(dev.memory_reserved())
        )
    };
    println!("{}", dev.name());
    show("start");
    let x = Tensor::zeros(&[1000, 1000], DType::F32, &dev)?;
    show("1000x1000 f32 tensor");
    drop(x);
    show("after drop");
    dev.empty_cache();
    show("after empty_cache");
    Ok(())
}
