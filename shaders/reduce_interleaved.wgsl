// A workgroup of 64 per chunk, invocation t reading units t, t + 64, ... (so that neighbouring
// invocations read neighbouring memory) into its own partial: 64 outputs per chunk, merged by
// the next pass; no workgroup memory and no barrier. For CPUs running the shader with wide
// vectors across invocations.
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let w = gid.x + gid.y * nw.x * 64u;
    if w >= p.rows * p.chunks * 64u {
        return;
    }
    let s = partial(w / 64u, w % 64u, 64u);
    out[w] = {{TO}}({{HSUM}} * p.scale);
}
