// Batch normalisation's elementwise pass over [N, C, S] (contiguous, S in `{{V}}` units), with
// per-channel coefficients co[off + j * C + c]:
// - forward: y = x * scale + shift;
// - backward: dx = g * a + x * b + d;
// and with a fused ReLU, y = max(x * scale + shift, 0) and g masked where that output was not
// positive (recomputed from x and stats[off + 2C + c], stats[off + 3C + c]).
struct Params {
    n: u32,
    c: u32,
    s: u32,
    x_off: u32,
    g_off: u32,
    co_off: u32,
    stats_off: u32,
    pad1: u32,
    pad2: u32,
    pad3: u32,
    pad4: u32,
    pad5: u32,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> x: array<{{V}}>;
@group(0) @binding(1) var<storage, read_write> co: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<{{V}}>;
{{BINDINGS}}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = gid.x + gid.y * nw.x * 256u;
    if i >= p.n {
        return;
    }
    let c = (i / p.s) % p.c;
    {{BODY}}
}
