// SGD (momentum, dampening, nesterov, weight decay) over up to {{N}} parameters in one launch,
// as PyTorch's foreach SGD steps a parameter list: the workgroups are dealt out to the
// parameters in order, ceil(n / 256) each (n in vec4s), so a workgroup works on one parameter
// and picks its bindings once. The formulas are `optim.wgsl`'s `sgd`, element for element.
// Parameters, gradients and momentum buffers are contiguous vec4s of `{{T}}` (f32 math); counts
// and offsets in vec4s; an unused slot has a count of 0. A slot whose element count is not a
// multiple of 4 (a classifier's 10-element bias) has a partial last vec4: its elements past the
// count are written back as they were read (their storage's block holds them; nothing else in
// the launch writes them).
{{ENABLES}}

struct Params {
{{FIELDS}}    // Bit 0 nesterov, bit 2 momentum in use; bit 8 + j: slot j's first step (its momentum
    // buffer starts as the gradient); bits 16 + 2j, 17 + 2j: slot j's elements in its last
    // vec4 (0: all four).
    flags: u32,
    lr: f32,
    weight_decay: f32,
    momentum: f32,
    dampening: f32,
}

var<immediate> p: Params;

{{BINDINGS}}
struct Update {
    param: {{E}},
    buf: {{E}},
}

fn sgd(w_in: {{E}}, g_in: {{E}}, m_in: {{E}}, first: bool) -> Update {
    let w = {{W}}(w_in);
    var d = {{W}}(g_in) + p.weight_decay * w;
    var buf = d;
    if (p.flags & 4u) != 0u {
        if !first {
            buf = p.momentum * {{W}}(m_in) + (1.0 - p.dampening) * d;
        }
        if (p.flags & 1u) != 0u {
            d = d + p.momentum * buf;
        } else {
            d = buf;
        }
    }
    return Update({{E}}(w - p.lr * d), {{E}}(buf));
}

// Element i of slot j (the entry point and the dealing: `multi_slot.wgsl`).
fn run(j: u32, i: u32) {
    let momentum = (p.flags & 4u) != 0u;
    let first = (p.flags & (256u << j)) != 0u;
    let tail = (p.flags >> (16u + 2u * j)) & 3u;
    switch j {
{{CASES}}        default: {}
    }
}

{{DEAL}}