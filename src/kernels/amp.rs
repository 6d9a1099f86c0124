//! GradScaler's multi-gradient unscale (`shaders/amp_multi.wgsl`), its WGSL written out per
//! gradient slot: WGSL cannot index bindings, so each slot gets its own binding, count, offset
//! and case of the kernel's switch.

/// Gradients per launch of `Kernel::AmpUnscaleMulti`: with the flag, eight storage buffers,
/// WebGPU's floor for a shader stage.
pub const AMP_MULTI: usize = 7;

/// `shaders/amp_multi.wgsl` for `AMP_MULTI` gradients: per gradient a count and an offset, a
/// binding, and a case of the switch.
pub(crate) fn amp_multi_source() -> String {
    super::optim::multi_source(
        include_str!("../../shaders/amp_multi.wgsl"),
        AMP_MULTI,
        |j| {
            [
            format!("    n{j}: u32,\n    o{j}: u32,\n"),
            format!("@group(0) @binding({j}) var<storage, read_write> g{j}: array<vec4<f32>>;\n"),
            format!(
                "        case {j}u: {{\n            g{j}[p.o{j} + i] = unscaled(g{j}[p.o{j} + i]);\n        }}\n"
            ),
        ]
        },
    )
}
