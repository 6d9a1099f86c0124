//! Batch normalisation's elementwise passes with the per-channel pass folded in
//! (`shaders/batch_norm_apply_folded.wgsl`), and the per-channel arithmetic they share with the
//! finalize pass (`shaders/batch_norm_channel_*.wgsl`). In training, a ResNet-50 step launches
//! the finalize pass 106 times; folded, each elementwise pass works out its channels' values
//! from the partial sums itself.

/// The immediates of the finalize pass and the folded passes.
pub(super) const PARAMS: &str = include_str!("../../shaders/batch_norm_params.wgsl");
/// The forward's per-channel statistics and the running statistics' update.
pub(super) const FORWARD_CHANNEL: &str = include_str!("../../shaders/batch_norm_channel_fwd.wgsl");
/// The backward's per-channel gradients and coefficients.
pub(super) const BACKWARD_CHANNEL: &str = include_str!("../../shaders/batch_norm_channel_bwd.wgsl");

/// The most planes (n, c) one workgroup's 256 units may lie in.
pub const FOLDED_MAX_PLANES: usize = 8;

/// Whether a folded pass takes units of `s` a plane with `chunks` partial sums a channel: the
/// planes a workgroup can touch, each with its chunks, fit its 256 invocations.
pub fn folded_fits(s: usize, chunks: usize) -> bool {
    let planes = 255 / s.max(1) + 2;
    planes <= FOLDED_MAX_PLANES && planes * chunks <= 256
}

/// The folded pass's WGSL before `{{V}}` is specialised.
pub(super) fn source(backward: bool, relu: bool) -> String {
    let (bindings, channel, body) = if backward {
        (
            "@group(0) @binding(1) var<storage, read_write> b1: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<{{V}}>;
@group(0) @binding(3) var<storage, read_write> g: array<{{V}}>;
@group(0) @binding(4) var<storage, read_write> part: array<vec2<f32>>;
@group(0) @binding(5) var<storage, read_write> b3: array<f32>;
@group(0) @binding(6) var<storage, read_write> b4: array<f32>;",
            format!(
                "{BACKWARD_CHANNEL}
// The coefficients (a, b, d) of channel c; `writes`: also its weight's and bias's gradients.
fn channel(c: u32, s: vec2<f32>, writes: bool) -> vec4<f32> {{
    let gr = grads(c, s);
    if writes {{
        b3[p.o2 + c] = gr.weight;
        b4[p.o3 + c] = gr.bias;
    }}
    return vec4<f32>(gr.coef, 0.0);
}}
"
            ),
            if relu {
                "let xv = x[p.x_off + i];
    let c = (i / p.s) % p.c;
    let y = normalised(xv, b1[p.o0 + 2u * p.c + c], b1[p.o0 + 3u * p.c + c]);
    let gv = select(g[p.g_off + i], {{V}}(0.0), y <= {{V}}(0.0));
    out[i] = gv * co.x + xv * co.y + co.z;"
            } else {
                "out[i] = g[p.g_off + i] * co.x + x[p.x_off + i] * co.y + co.z;"
            },
        )
    } else {
        (
            "@group(0) @binding(1) var<storage, read_write> b5: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<{{V}}>;
@group(0) @binding(3) var<storage, read_write> part: array<vec2<f32>>;
@group(0) @binding(4) var<storage, read_write> b1: array<f32>;
@group(0) @binding(5) var<storage, read_write> b2: array<f32>;
@group(0) @binding(6) var<storage, read_write> b3: array<f32>;
@group(0) @binding(7) var<storage, read_write> b4: array<f32>;",
            format!(
                "{FORWARD_CHANNEL}
// The (scale, shift) of channel c; `writes`: also its statistics and running statistics.
fn channel(c: u32, s: vec2<f32>, writes: bool) -> vec4<f32> {{
    let mv = batch_moments(s, part[p.chunks * p.c + c].x);
    let mo = moments(c, mv.x, mv.y);
    if writes {{
        update_running(c, mo);
        b5[p.o4 + c] = mo.mean;
        b5[p.o4 + p.c + c] = mo.invstd;
        b5[p.o4 + 2u * p.c + c] = mo.scale;
        b5[p.o4 + 3u * p.c + c] = mo.shift;
    }}
    return vec4<f32>(mo.scale, mo.shift, 0.0, 0.0);
}}
"
            ),
            if relu {
                "out[i] = max(normalised(x[p.x_off + i], co.x, co.y), {{V}}(0.0));"
            } else {
                "out[i] = x[p.x_off + i] * co.x + co.y;"
            },
        )
    };
    let helpers = if relu {
        super::batch_norm::NORMALISED
    } else {
        ""
    };
    include_str!("../../shaders/batch_norm_apply_folded.wgsl")
        .replace("{{PARAMS}}", PARAMS)
        .replace("{{BINDINGS}}", bindings)
        .replace("{{CHANNEL}}", &format!("{channel}{helpers}"))
        .replace("{{BODY}}", body)
}
