// The fused optimizers' kernels over elements (or vec4s) of `{{E}}`, one dispatch per parameter:
// each element is read and written once (`optim_math.wgsl` precedes this file).

@group(0) @binding(0) var<storage, read_write> param: array<{{E}}>;
@group(0) @binding(1) var<storage, read_write> grad: array<{{E}}>;
@group(0) @binding(2) var<storage, read_write> m: array<{{E}}>;
@group(0) @binding(3) var<storage, read_write> v: array<{{E}}>;

@compute @workgroup_size(256)
fn sgd(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = gid.x + gid.y * nw.x * 256u;
    if i >= p.n {
        return;
    }
    let momentum = (p.flags & 4u) != 0u;
    var m_in = {{W}}();
    if momentum && (p.flags & 2u) == 0u {
        m_in = {{W}}(m[p.m_off + i]);
    }
    let u = sgd_math({{W}}(param[p.p_off + i]), {{W}}(grad[p.g_off + i]), m_in);
    if momentum {
        m[p.m_off + i] = {{E}}(u.m);
    }
    param[p.p_off + i] = {{E}}(u.w);
}

@compute @workgroup_size(256)
fn adam(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = gid.x + gid.y * nw.x * 256u;
    if i >= p.n {
        return;
    }
    let u = adam_math(
        {{W}}(param[p.p_off + i]),
        {{W}}(grad[p.g_off + i]),
        {{W}}(m[p.m_off + i]),
        {{W}}(v[p.v_off + i]),
    );
    m[p.m_off + i] = {{E}}(u.m);
    v[p.v_off + i] = {{E}}(u.v);
    param[p.p_off + i] = {{E}}(u.w);
}
