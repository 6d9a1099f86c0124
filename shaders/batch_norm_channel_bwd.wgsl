// The backward's per-channel values from the sums of a channel's chunks, s = (sum(g),
// sum(g * (x - mean))), and the forward's statistics b1 = [mean, invstd, scale, shift]: the
// weight's and the bias's gradients, and the input gradient's coefficients (a, b, d) with
// dx = g * a + x * b + d.
struct Grads {
    weight: f32,
    bias: f32,
    coef: vec3<f32>,
}

fn grads(c: u32, s: vec2<f32>) -> Grads {
    let mean = b1[p.o0 + c];
    let invstd = b1[p.o0 + p.c + c];
    // weight * invstd, the forward's scale.
    let a = b1[p.o0 + 2u * p.c + c];
    var b = 0.0;
    var d = 0.0;
    if p.training == 1u {
        // dx = a * (g - mean(g) - xhat * mean(g * xhat)).
        let k = s.y * invstd * invstd / p.m;
        b = -a * k;
        d = a * (k * mean - s.x / p.m);
    }
    return Grads(s.y * invstd, s.x, vec3<f32>(a, b, d));
}
