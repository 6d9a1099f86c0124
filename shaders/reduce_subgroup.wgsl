// A workgroup of 256 per chunk, read as the tree's, merged by subgroup operations: each
// subgroup reduces its partials in registers and one barrier hands the per-subgroup results to
// invocation 0. For adapters with subgroups (NVIDIA's 32, AMD's 32/64, Intel's 8-32, lavapipe's
// 8); max and min keep NaN by a subgroup vote.
var<workgroup> acc: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>, @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) nsg: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let w = wid.x + wid.y * nw.x;
    if w >= p.rows * p.chunks {
        return;
    }
    let s = partial(w, t, 256u);
    let v: f32 = {{HSUM}};
    let r = {{SUBGROUP}};
    if lane == 0u {
        acc[sg] = r;
    }
    workgroupBarrier();
    if t == 0u {
        var total = acc[0];
        for (var i = 1u; i < nsg; i++) {
            total = combine1(total, acc[i]);
        }
        out[w] = {{TO}}(total * p.scale);
    }
}
