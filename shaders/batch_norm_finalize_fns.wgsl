// Batch normalisation's per-channel finalize, channel `c` at a time, after the partial sums:
// by one invocation per channel (`batch_norm_finalize.wgsl`), or by the last workgroup of a
// channel's partial sums to finish (`batch_norm_reduce.wgsl` with the finalize folded in).
// `forward`: the batch statistics (training) or the running ones (evaluation), written as
// stats [4, C] = (mean, invstd, scale, shift) with y = x * scale + shift; in training the
// running statistics are updated in place (momentum, unbiased variance), as PyTorch does.
// `backward`: the weight's and bias's gradients and the input gradient's coefficients
// coef [3, C] = (a, b, d) with dx = g * a + x * b + d.
// The including shader declares `Fin` (`batch_norm_fin.wgsl`), `part` (array<vec2<f32>>) and
// b1..b5 (array<f32>).
fn sums(q: Fin, c: u32) -> vec2<f32> {
    var s = vec2<f32>(0.0);
    for (var j = 0u; j < q.chunks; j++) {
        s += part[j * q.c + c];
    }
    return s;
}

// b1: weight, b2: bias, b3: running_mean, b4: running_var, b5: stats.
fn finalize_forward(q: Fin, c: u32) {
    var mean: f32;
    var var_b: f32;
    if q.training == 1u {
        let s = sums(q, c);
        let k = part[q.chunks * q.c + c].x;
        let dmean = s.x / q.m;
        mean = k + dmean;
        var_b = max(s.y / q.m - dmean * dmean, 0.0);
        let rm = b3[q.o2 + c];
        let rv = b4[q.o3 + c];
        b3[q.o2 + c] = (1.0 - q.momentum) * rm + q.momentum * mean;
        b4[q.o3 + c] = (1.0 - q.momentum) * rv + q.momentum * var_b * q.m / max(q.m - 1.0, 1.0);
    } else {
        mean = b3[q.o2 + c];
        var_b = b4[q.o3 + c];
    }
    let invstd = 1.0 / sqrt(var_b + q.eps);
    let scale = invstd * b1[q.o0 + c];
    b5[q.o4 + c] = mean;
    b5[q.o4 + q.c + c] = invstd;
    b5[q.o4 + 2u * q.c + c] = scale;
    b5[q.o4 + 3u * q.c + c] = b2[q.o1 + c] - mean * scale;
}

// b1: stats, b3: grad_weight, b4: grad_bias, b5: coef (b2 unused).
fn finalize_backward(q: Fin, c: u32) {
    let s = sums(q, c);
    let mean = b1[q.o0 + c];
    let invstd = b1[q.o0 + q.c + c];
    // weight * invstd, the forward's scale.
    let a = b1[q.o0 + 2u * q.c + c];
    b3[q.o2 + c] = s.y * invstd;
    b4[q.o3 + c] = s.x;
    var b = 0.0;
    var d = 0.0;
    if q.training == 1u {
        // dx = a * (g - mean(g) - xhat * mean(g * xhat)).
        let k = s.y * invstd * invstd / q.m;
        b = -a * k;
        d = a * (k * mean - s.x / q.m);
    }
    b5[q.o4 + c] = a;
    b5[q.o4 + q.c + c] = b;
    b5[q.o4 + 2u * q.c + c] = d;
}
