// One invocation per chunk, reading it front to back (four accumulators); no workgroup memory
// and no barrier. What a CPU running the shader (lavapipe, llvmpipe) wants: a barrier there
// switches between every SIMD slice of the workgroup.
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let w = gid.x + gid.y * nw.x * 64u;
    if w >= p.rows * p.chunks {
        return;
    }
    let row = w / p.chunks;
    let start = row * p.inner + (w % p.chunks) * p.chunk_len;
    let end = row * p.inner + min((w % p.chunks + 1u) * p.chunk_len, p.inner);
    var s0 = {{ACC}}(identity());
    var s1 = s0;
    var s2 = s0;
    var s3 = s0;
    var j = start;
    for (; j + 3u < end; j += 4u) {
        s0 = combine(s0, load(j));
        s1 = combine(s1, load(j + 1u));
        s2 = combine(s2, load(j + 2u));
        s3 = combine(s3, load(j + 3u));
    }
    for (; j < end; j++) {
        s0 = combine(s0, load(j));
    }
    let s = combine(combine(s0, s1), combine(s2, s3));
    out[w] = {{TO}}({{HSUM}} * p.scale);
}
