//! The README's example: tensors on the best device and PyTorch's memory numbers.
//!
//! `cargo run --example quickstart`

use kiln::{DType, Device, Tensor};

fn main() -> kiln::Result<()> {
    let dev = Device::best()?; // KILN_DEVICE=vulkan:0|gl:0|metal:0|cpu overrides
    let x = Tensor::ones(&[1000, 1000], DType::F32, &dev)?;
    assert_eq!(dev.memory_allocated(), 4_000_256); // 3.81 MiB, as in PyTorch
    assert_eq!(dev.memory_reserved(), 20 << 20); // one 20 MiB segment
    let y = (&x.t()? + &x)?.gelu()?.sum(&[1], false)?; // views, broadcasting, kernels
    println!("{:?}", &y.to_vec::<f32>()?[..4]);
    drop((x, y));
    dev.empty_cache();
    print!("{}", dev.memory_summary(false));
    Ok(())
}
