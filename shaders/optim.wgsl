// Fused optimizer updates, one dispatch per parameter, reading and writing each element once:
// SGD (momentum, dampening, nesterov, weight decay) and Adam/AdamW, with PyTorch's formulas
// (torch.optim, foreach=False). All tensors are contiguous and of one dtype, `{{E}}` (f32 or f16,
// or a vec4 of either); arithmetic runs in f32 (`{{W}}`, PyTorch's opmath) and results are
// rounded to the stored dtype. Offsets are in elements (or vec4s).
{{ENABLES}}

struct Params {
    n: u32,
    p_off: u32,
    g_off: u32,
    m_off: u32,
    v_off: u32,
    // SGD: bit 0 nesterov, bit 1 first step (the momentum buffer starts as the gradient),
    // bit 2 momentum in use. Adam: bit 0 AdamW (decoupled weight decay).
    flags: u32,
    lr: f32,
    weight_decay: f32,
    // SGD: momentum, dampening. Adam: beta1, beta2.
    a: f32,
    b: f32,
    // Adam: eps, 1 - beta1^t, sqrt(1 - beta2^t).
    eps: f32,
    bias1: f32,
    bias2_sqrt: f32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

var<immediate> p: Params;

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
    let w = {{W}}(param[p.p_off + i]);
    var d = {{W}}(grad[p.g_off + i]) + p.weight_decay * w;
    if (p.flags & 4u) != 0u {
        var buf = d;
        if (p.flags & 2u) == 0u {
            buf = p.a * {{W}}(m[p.m_off + i]) + (1.0 - p.b) * d;
        }
        m[p.m_off + i] = {{E}}(buf);
        if (p.flags & 1u) != 0u {
            d = d + p.a * buf;
        } else {
            d = buf;
        }
    }
    param[p.p_off + i] = {{E}}(w - p.lr * d);
}

@compute @workgroup_size(256)
fn adam(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = gid.x + gid.y * nw.x * 256u;
    if i >= p.n {
        return;
    }
    var w = {{W}}(param[p.p_off + i]);
    var g = {{W}}(grad[p.g_off + i]);
    if (p.flags & 1u) != 0u {
        w = w * (1.0 - p.lr * p.weight_decay);
    } else {
        g = g + p.weight_decay * w;
    }
    let m1 = p.a * {{W}}(m[p.m_off + i]) + (1.0 - p.a) * g;
    let v1 = p.b * {{W}}(v[p.v_off + i]) + (1.0 - p.b) * g * g;
    m[p.m_off + i] = {{E}}(m1);
    v[p.v_off + i] = {{E}}(v1);
    let denom = sqrt(v1) / p.bias2_sqrt + p.eps;
    param[p.p_off + i] = {{E}}(w - (p.lr / p.bias1) * m1 / denom);
}
