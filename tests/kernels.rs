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

/// The tensor-core kernels through naga's SPIR-V writer as wgpu runs them (trusted: no bounds
/// checks) and with checks: naga 30's writer has panicked on coop stores it did not expect.
#[test]
fn coop_kernels_write_spirv() {
    use kiln::kernels::{CoopLayout, CoopTile, Kernel};
    use naga::proc::{BoundsCheckPolicies, BoundsCheckPolicy};
    let products = CoopTile::ALL
        .into_iter()
        .flat_map(|t| CoopLayout::ALL.map(|l| Kernel::MatmulCoop(t, l)));
    let convs = CoopTile::CONV
        .into_iter()
        .flat_map(|t| [false, true].map(|flip| Kernel::ConvCoop(t, flip)));
    for k in products
        .chain(convs)
        .chain(CoopTile::WGRAD.map(Kernel::ConvCoopWgrad))
    {
        let info = kiln::kernels::validate(&k).unwrap();
        let module = naga::front::wgsl::parse_str(&k.source()).unwrap();
        for policy in [
            BoundsCheckPolicy::Unchecked,
            BoundsCheckPolicy::ReadZeroSkipWrite,
        ] {
            let options = naga::back::spv::Options {
                lang_version: (1, 6),
                bounds_check_policies: BoundsCheckPolicies {
                    index: policy,
                    buffer: policy,
                    image_load: policy,
                    binding_array: policy,
                },
                ..Default::default()
            };
            let words = naga::back::spv::write_vec(&module, &info, &options, None)
                .unwrap_or_else(|e| panic!("{}: {e}", k.name()));
            assert_eq!(words[0], 0x0723_0203, "{}: SPIR-V magic", k.name());
        }
    }
}
