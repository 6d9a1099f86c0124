// A workgroup of 256 per chunk: invocation t reads units t, t + 256, ... (four accumulators,
// four loads in flight), then a tree in workgroup memory merges the 256 partials (eight
// barriers). The default: what a GPU with wide SIMD and cheap barriers wants.
var<workgroup> acc: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let w = wid.x + wid.y * nw.x;
    if w >= p.rows * p.chunks {
        return;
    }
    let s = partial(w, t, 256u);
    acc[t] = {{HSUM}};
    workgroupBarrier();
    for (var k = 128u; k > 0u; k >>= 1u) {
        if t < k {
            acc[t] = combine1(acc[t], acc[t + k]);
        }
        workgroupBarrier();
    }
    if t == 0u {
        out[w] = {{TO}}(acc[0] * p.scale);
    }
}
