// What the fused layer-norm kernels share (`layer_norm_fwd.wgsl`, `layer_norm_bwd.wgsl`,
// `layer_norm_wgrad.wgsl`): rows of `units` contiguous units ({{E}}: one element, or a vec4 of
// them where the row is whole vec4s at aligned offsets), f32 arithmetic ({{W}}) whatever the
// storage dtype, and the per-row statistics: mean at `row`, rstd at `rows + row` of `stats`.
{{ENABLES}}
struct Params {
    rows: u32,
    // The row's length in units, and in elements (the mean's divisor).
    units: u32,
    n: u32,
    // Offsets of x (and dy), of the weight and of the bias, in units.
    x_off: u32,
    w_off: u32,
    b_off: u32,
    // Bit 0: an affine weight; bit 1: a bias.
    flags: u32,
    eps: f32,
    // The weight-gradient partials: rows per chunk.
    chunk_len: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

var<immediate> p: Params;

// A workgroup of 128 invocations per row (`tree`: sums merged in workgroup memory), or one
// invocation per row and 64 rows per workgroup (`serial`: no barriers, which CPU adapters run
// far faster). WG is the stride of a row's loop: 128, or 1.
const WG: u32 = {{WG}}u;

// The sum of a unit's lanes.
fn lanes(v: {{W}}) -> f32 {
    {{LANES}}
}

// The row of invocation `lid` of workgroup `wid` (grids past 65535 workgroups fold into y).
fn row_of(wid: vec3<u32>, nw: vec3<u32>, lid: u32) -> u32 {
    {{ROW}}
}

// The invocation's first unit of its row.
fn lane_of(lid: u32) -> u32 {
    {{LANE}}
}

fn weight_at(u: u32) -> {{W}} {
    if (p.flags & 1u) == 0u {
        return {{W}}(1.0);
    }
    return {{W}}(w[p.w_off + u]);
}

var<workgroup> red: array<vec2<f32>, 128>;

// The workgroup's sums of (a, b) by a tree in workgroup memory, in every invocation; called
// by the whole workgroup (the workgroup-per-row form).
fn sum2_tree(a: f32, b: f32, li: u32) -> vec2<f32> {
    red[li] = vec2<f32>(a, b);
    for (var s = WG / 2u; s > 0u; s /= 2u) {
        workgroupBarrier();
        if li < s {
            red[li] += red[li + s];
        }
    }
    workgroupBarrier();
    let total = red[0];
    workgroupBarrier();
    return total;
}

// The row's sums of (a, b), in every invocation of the row: the tree, or, a row per
// invocation, (a, b) themselves.
fn sum2(a: f32, b: f32, li: u32) -> vec2<f32> {
    {{SUM2}}
}
