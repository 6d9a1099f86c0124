// GradScaler's unscale with the inf/NaN check (PyTorch's
// `_amp_foreach_non_finite_check_and_unscale_`): every gradient element is multiplied by
// inv_scale in f32 (opmath) and written back in its own dtype; any element that is not finite
// before scaling sets `found_inf` to 1.0 (a benign race: every writer stores the same value).
// `{{E}}` is the stored element (f32 or vec4<f32>), `{{W}}` its f32 form, `{{U}}` its bits.
{{ENABLES}}

struct Params {
    // Elements (or vec4s) and the gradient's offset in the same unit.
    n: u32,
    off: u32,
    inv_scale: f32,
    // The found_inf word's offset (in f32s).
    found_off: u32,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> grad: array<{{E}}>;
@group(0) @binding(1) var<storage, read_write> found_inf: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = gid.x + gid.y * nw.x * 256u;
    if i >= p.n {
        return;
    }
    let x = {{W}}(grad[p.off + i]);
    // Exponent bits all set: inf or NaN (bit tests survive any fast-math assumption).
    let bits = bitcast<{{U}}>(x) & {{U}}(0x7f800000u);
    if any(bits == {{U}}(0x7f800000u)) {
        found_inf[p.found_off] = 1.0;
    }
    grad[p.off + i] = {{E}}(x * p.inv_scale);
}
