// GradScaler's unscale with the inf/NaN check over up to {{N}} f32 gradients in one launch, as
// PyTorch's `_amp_foreach_non_finite_check_and_unscale_` does over a list: the workgroups are
// dealt out to the gradients in order, ceil(n / 256) each (n in vec4s), so a workgroup works
// on one gradient and picks its binding once. Each element is multiplied by inv_scale; any
// that is not finite before scaling sets `found_inf` to 1.0 (a benign race). The gradients'
// counts and offsets are in vec4s; an unused slot has a count of 0.
struct Params {
{{FIELDS}}    inv_scale: f32,
    found_off: u32,
}

var<immediate> p: Params;

{{BINDINGS}}@group(0) @binding({{N}}) var<storage, read_write> found_inf: array<f32>;

fn unscaled(x: vec4<f32>) -> vec4<f32> {
    // Exponent bits all set: inf or NaN (bit tests survive any fast-math assumption).
    let bits = bitcast<vec4<u32>>(x) & vec4<u32>(0x7f800000u);
    if any(bits == vec4<u32>(0x7f800000u)) {
        found_inf[p.found_off] = 1.0;
    }
    return x * p.inv_scale;
}

// Element i of slot j (the entry point and the dealing: `multi_slot.wgsl`).
fn run(j: u32, i: u32) {
    switch j {
{{CASES}}        default: {}
    }
}

{{DEAL}}