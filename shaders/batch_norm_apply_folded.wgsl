// Batch normalisation's elementwise pass with the per-channel pass folded in (training), over
// [N, C, S] (contiguous, S in `{{V}}` units): the forward's output or the backward's input
// gradient, as `batch_norm_apply.wgsl` computes them. A finalize pass launched apart cost about
// 5 us a layer on the H200, mostly the launch (docs/lab/convolution.md).
//
// Each workgroup takes 256 units, which lie in a few planes (n, c). Its invocations first load
// the chunks' partial sums of those planes' channels, one each, and one invocation a plane adds
// them in chunk order, as the finalize pass does, so every workgroup works out the same bits.
// The workgroup where the plane (0, c) starts writes what the finalize pass wrote: forward,
// the statistics [4, C] and the running statistics' update; backward, the weight's and the
// bias's gradients.
{{PARAMS}}
@group(0) @binding(0) var<storage, read_write> x: array<{{V}}>;
{{BINDINGS}}
{{CHANNEL}}
// The planes a workgroup's 256 units can lie in (the host checks that s >= 256 / (MAX_PLANES
// - 2) and that the planes' chunks fit 256 invocations).
const MAX_PLANES: u32 = 8u;

var<workgroup> red: array<vec2<f32>, 256>;
var<workgroup> coef: array<vec4<f32>, MAX_PLANES>;

@compute @workgroup_size(256)
fn main(
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nw: vec3<u32>,
) {
    let w0 = (wid.x + wid.y * nw.x) * 256u;
    let first = min(w0, p.n - 1u) / p.s;
    let planes = min(min(w0 + 255u, p.n - 1u) / p.s - first + 1u, MAX_PLANES);
    var v = vec2<f32>(0.0);
    if li / p.chunks < planes {
        v = part[(li % p.chunks) * p.c + (first + li / p.chunks) % p.c];
    }
    red[li] = v;
    workgroupBarrier();
    if li < planes {
        let plane = first + li;
        var s = vec2<f32>(0.0);
        for (var j = 0u; j < p.chunks; j++) {
            s += red[li * p.chunks + j];
        }
        coef[li] = channel(plane % p.c, s, plane < p.c && plane * p.s >= w0);
    }
    workgroupBarrier();
    let i = w0 + li;
    if i >= p.n {
        return;
    }
    let co = coef[min(i / p.s - first, MAX_PLANES - 1u)];
    {{BODY}}
}
