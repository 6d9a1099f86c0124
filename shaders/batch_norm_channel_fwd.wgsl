// The forward's per-channel statistics; b1 and b2 are the weight and the bias.
struct Moments {
    mean: f32,
    // The biased variance.
    var_b: f32,
    invstd: f32,
    scale: f32,
    shift: f32,
}

// The batch's mean and biased variance from the sums of a channel's chunks, s = (sum(x - k),
// sum((x - k)^2)) with the channel's shift k.
fn batch_moments(s: vec2<f32>, k: f32) -> vec2<f32> {
    let dmean = s.x / p.m;
    return vec2<f32>(k + dmean, max(s.y / p.m - dmean * dmean, 0.0));
}

fn moments(c: u32, mean: f32, var_b: f32) -> Moments {
    let invstd = 1.0 / sqrt(var_b + p.eps);
    let scale = invstd * b1[p.o0 + c];
    return Moments(mean, var_b, invstd, scale, b2[p.o1 + c] - mean * scale);
}

// The running statistics' update in place (b3: running_mean, b4: running_var), as PyTorch's:
// momentum and the unbiased variance.
fn update_running(c: u32, mo: Moments) {
    let rm = b3[p.o2 + c];
    let rv = b4[p.o3 + c];
    b3[p.o2 + c] = (1.0 - p.momentum) * rm + p.momentum * mo.mean;
    b4[p.o3 + c] = (1.0 - p.momentum) * rv + p.momentum * mo.var_b * p.m / max(p.m - 1.0, 1.0);
}
