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
    let chunk = w / 64u;
    let t = w % 64u;
    let row = chunk / p.chunks;
    let start = (chunk % p.chunks) * p.chunk_len;
    let end = min(start + p.chunk_len, p.inner);
    let base = row * p.inner;
    var s0 = {{ACC}}(identity());
    var s1 = s0;
    var s2 = s0;
    var s3 = s0;
    var j = start + t;
    for (; j + 192u < end; j += 256u) {
        s0 = combine(s0, load(base + j));
        s1 = combine(s1, load(base + j + 64u));
        s2 = combine(s2, load(base + j + 128u));
        s3 = combine(s3, load(base + j + 192u));
    }
    for (; j < end; j += 64u) {
        s0 = combine(s0, load(base + j));
    }
    let s = combine(combine(s0, s1), combine(s2, s3));
    out[w] = {{TO}}({{HSUM}} * p.scale);
}
