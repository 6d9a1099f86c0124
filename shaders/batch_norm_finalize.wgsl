// Batch normalisation's per-channel pass, one invocation per channel, after the partial sums.
// `forward`: the batch statistics (training) or the running ones (evaluation), written as
// stats [4, C] = (mean, invstd, scale, shift) with y = x * scale + shift; in training the
// running statistics are updated in place (momentum, unbiased variance), as PyTorch does.
// `backward`: the weight's and bias's gradients and the input gradient's coefficients
// coef [3, C] = (a, b, d) with dx = g * a + x * b + d.
struct Params {
    c: u32,
    chunks: u32,
    // Elements per channel (N * H * W) as f32.
    m: f32,
    eps: f32,
    momentum: f32,
    training: u32,
    // Offsets in f32s of the operands bound below.
    o0: u32,
    o1: u32,
    o2: u32,
    o3: u32,
    o4: u32,
    pad0: u32,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> part: array<vec2<f32>>;
@group(0) @binding(1) var<storage, read_write> b1: array<f32>;
@group(0) @binding(2) var<storage, read_write> b2: array<f32>;
@group(0) @binding(3) var<storage, read_write> b3: array<f32>;
@group(0) @binding(4) var<storage, read_write> b4: array<f32>;
@group(0) @binding(5) var<storage, read_write> b5: array<f32>;

fn sums(c: u32) -> vec2<f32> {
    var s = vec2<f32>(0.0);
    for (var j = 0u; j < p.chunks; j++) {
        s += part[j * p.c + c];
    }
    return s;
}

// b1: weight, b2: bias, b3: running_mean, b4: running_var, b5: stats.
@compute @workgroup_size(256)
fn forward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    if c >= p.c {
        return;
    }
    var mean: f32;
    var var_b: f32;
    if p.training == 1u {
        let s = sums(c);
        let k = part[p.chunks * p.c + c].x;
        let dmean = s.x / p.m;
        mean = k + dmean;
        var_b = max(s.y / p.m - dmean * dmean, 0.0);
        let rm = b3[p.o2 + c];
        let rv = b4[p.o3 + c];
        b3[p.o2 + c] = (1.0 - p.momentum) * rm + p.momentum * mean;
        b4[p.o3 + c] = (1.0 - p.momentum) * rv + p.momentum * var_b * p.m / max(p.m - 1.0, 1.0);
    } else {
        mean = b3[p.o2 + c];
        var_b = b4[p.o3 + c];
    }
    let invstd = 1.0 / sqrt(var_b + p.eps);
    let scale = invstd * b1[p.o0 + c];
    b5[p.o4 + c] = mean;
    b5[p.o4 + p.c + c] = invstd;
    b5[p.o4 + 2u * p.c + c] = scale;
    b5[p.o4 + 3u * p.c + c] = b2[p.o1 + c] - mean * scale;
}

// b1: stats, b3: grad_weight, b4: grad_bias, b5: coef (b2 unused).
@compute @workgroup_size(256)
fn backward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    if c >= p.c {
        return;
    }
    let s = sums(c);
    let mean = b1[p.o0 + c];
    let invstd = b1[p.o0 + p.c + c];
    // weight * invstd, the forward's scale.
    let a = b1[p.o0 + 2u * p.c + c];
    b3[p.o2 + c] = s.y * invstd;
    b4[p.o3 + c] = s.x;
    var b = 0.0;
    var d = 0.0;
    if p.training == 1u {
        // dx = a * (g - mean(g) - xhat * mean(g * xhat)).
        let k = s.y * invstd * invstd / p.m;
        b = -a * k;
        d = a * (k * mean - s.x / p.m);
    }
    b5[p.o4 + c] = a;
    b5[p.o4 + p.c + c] = b;
    b5[p.o4 + 2u * p.c + c] = d;
}
