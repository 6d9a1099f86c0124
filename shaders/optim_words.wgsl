// The fused optimizers over 64-bit words, a CPU adapter's kernels (`optim_math.wgsl` precedes
// this file): each invocation moves one `vec4<u64>` of every tensor, eight f32 elements, whose
// word j holds elements 2j (low half) and 2j + 1 (high half). Mesa's llvmpipe loads and stores
// a storage buffer one component at a time, whatever its width (`docs/lab/tuning.md`), so a
// word carries two f32 for the price of one. Counts and offsets are in `vec4<u64>`s (8 f32):
// the parameter's count and every offset must be multiples of 8 elements.

@group(0) @binding(0) var<storage, read_write> param: array<vec4<u64>>;
@group(0) @binding(1) var<storage, read_write> grad: array<vec4<u64>>;
@group(0) @binding(2) var<storage, read_write> m: array<vec4<u64>>;
@group(0) @binding(3) var<storage, read_write> v: array<vec4<u64>>;

// The even (low) and odd (high) elements of four words.
fn lo(x: vec4<u64>) -> vec4<f32> {
    return bitcast<vec4<f32>>(vec4<u32>(x & vec4<u64>(0xfffffffflu)));
}

fn hi(x: vec4<u64>) -> vec4<f32> {
    return bitcast<vec4<f32>>(vec4<u32>(x >> vec4<u32>(32u)));
}

fn pack(l: vec4<f32>, h: vec4<f32>) -> vec4<u64> {
    return vec4<u64>(bitcast<vec4<u32>>(l)) | (vec4<u64>(bitcast<vec4<u32>>(h)) << vec4<u32>(32u));
}

@compute @workgroup_size(256)
fn sgd(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = gid.x + gid.y * nw.x * 256u;
    if i >= p.n {
        return;
    }
    let momentum = (p.flags & 4u) != 0u;
    var m_in = vec4<u64>();
    if momentum && (p.flags & 2u) == 0u {
        m_in = m[p.m_off + i];
    }
    let w = param[p.p_off + i];
    let g = grad[p.g_off + i];
    let a = sgd_math(lo(w), lo(g), lo(m_in));
    let b = sgd_math(hi(w), hi(g), hi(m_in));
    if momentum {
        m[p.m_off + i] = pack(a.m, b.m);
    }
    param[p.p_off + i] = pack(a.w, b.w);
}

@compute @workgroup_size(256)
fn adam(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = gid.x + gid.y * nw.x * 256u;
    if i >= p.n {
        return;
    }
    let w = param[p.p_off + i];
    let g = grad[p.g_off + i];
    let m_in = m[p.m_off + i];
    let v_in = v[p.v_off + i];
    let a = adam_math(lo(w), lo(g), lo(m_in), lo(v_in));
    let b = adam_math(hi(w), hi(g), hi(m_in), hi(v_in));
    m[p.m_off + i] = pack(a.m, b.m);
    v[p.v_off + i] = pack(a.v, b.v);
    param[p.p_off + i] = pack(a.w, b.w);
}
