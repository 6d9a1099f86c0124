// One invocation per chunk, reading it front to back; no workgroup memory and no barrier.
// What a CPU running the shader (lavapipe, llvmpipe) wants: a barrier there switches between
// every SIMD slice of the workgroup.
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let w = gid.x + gid.y * nw.x * 64u;
    if w >= p.rows * p.chunks {
        return;
    }
    let s = partial(w, 0u, 1u);
    out[w] = {{TO}}({{HSUM}} * p.scale);
}
