//! Every kernel in the registry parses and validates with naga, as wgpu will compile it.

#[test]
fn every_kernel_validates() {
    for &k in kiln::kernels::Kernel::ALL {
        let info = kiln::kernels::validate(k).unwrap_or_else(|e| panic!("{}: {e}", k.name()));
        drop(info);
    }
}
