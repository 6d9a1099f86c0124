// Batch normalisation's per-channel pass, one invocation per channel, after the partial sums.
// `forward`: the batch statistics (training) or the running ones (evaluation), written as
// stats [4, C] = (mean, invstd, scale, shift) with y = x * scale + shift; in training the
// running statistics are updated in place (momentum, unbiased variance), as PyTorch does.
// `backward`: the weight's and bias's gradients and the input gradient's coefficients
// coef [3, C] = (a, b, d) with dx = g * a + x * b + d. The elementwise passes with this pass
// folded in (`batch_norm_apply_folded.wgsl`) compute the same per channel.
{{PARAMS}}
@group(0) @binding(0) var<storage, read_write> part: array<vec2<f32>>;
@group(0) @binding(1) var<storage, read_write> b1: array<f32>;
@group(0) @binding(2) var<storage, read_write> b2: array<f32>;
@group(0) @binding(3) var<storage, read_write> b3: array<f32>;
@group(0) @binding(4) var<storage, read_write> b4: array<f32>;
@group(0) @binding(5) var<storage, read_write> b5: array<f32>;

{{CHANNEL}}
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
    var mo: Moments;
    if p.training == 1u {
        let mv = batch_moments(sums(c), part[p.chunks * p.c + c].x);
        mo = moments(c, mv.x, mv.y);
        update_running(c, mo);
    } else {
        mo = moments(c, b3[p.o2 + c], b4[p.o3 + c]);
    }
    b5[p.o4 + c] = mo.mean;
    b5[p.o4 + p.c + c] = mo.invstd;
    b5[p.o4 + 2u * p.c + c] = mo.scale;
    b5[p.o4 + 3u * p.c + c] = mo.shift;
}

// b1: stats, b3: grad_weight, b4: grad_bias, b5: coef (b2 unused).
@compute @workgroup_size(256)
fn backward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    if c >= p.c {
        return;
    }
    let gr = grads(c, sums(c));
    b3[p.o2 + c] = gr.weight;
    b4[p.o3 + c] = gr.bias;
    b5[p.o4 + c] = gr.coef.x;
    b5[p.o4 + p.c + c] = gr.coef.y;
    b5[p.o4 + 2u * p.c + c] = gr.coef.z;
}
