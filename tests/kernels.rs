//! Every kernel variant in the registry parses and validates with naga, as wgpu will compile it.

#[test]
fn every_kernel_validates() {
    let all = kiln::kernels::Kernel::all();
    assert!(all.len() > 100, "the registry lists its variants");
    for k in all {
        if let Err(e) = kiln::kernels::validate(&k) {
            panic!("{}: {e}\n{}", k.name(), k.source());
        }
    }
}
