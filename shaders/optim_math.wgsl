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

// SGD's update of one element (or vec4) from its weight, gradient and momentum buffer (the
// latter unread on the first step): the new weight and buffer.
struct SgdOut {
    w: {{W}},
    m: {{W}},
}

fn sgd_math(w: {{W}}, g: {{W}}, m_in: {{W}}) -> SgdOut {
    var d = g + p.weight_decay * w;
    var buf = d;
    if (p.flags & 4u) != 0u {
        if (p.flags & 2u) == 0u {
            buf = p.a * m_in + (1.0 - p.b) * d;
        }
        if (p.flags & 1u) != 0u {
            d = d + p.a * buf;
        } else {
            d = buf;
        }
    }
    return SgdOut(w - p.lr * d, buf);
}

// Adam's (AdamW's) update of one element (or vec4): the new weight and moments.
struct AdamOut {
    w: {{W}},
    m: {{W}},
    v: {{W}},
}

fn adam_math(w_in: {{W}}, g_in: {{W}}, m_in: {{W}}, v_in: {{W}}) -> AdamOut {
    var w = w_in;
    var g = g_in;
    if (p.flags & 1u) != 0u {
        w = w * (1.0 - p.lr * p.weight_decay);
    } else {
        g = g + p.weight_decay * w;
    }
    let m1 = p.a * m_in + (1.0 - p.a) * g;
    let v1 = p.b * v_in + (1.0 - p.b) * g * g;
    let denom = sqrt(v1) / p.bias2_sqrt + p.eps;
    return AdamOut(w - (p.lr / p.bias1) * m1 / denom, m1, v1);
}

