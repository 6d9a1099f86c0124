// nll_loss with the mean reduction, as PyTorch's two kernels compute it: `forward` (one
// workgroup) sums -log_probs[i, target[i]] over the rows whose target is not ignore_index and
// divides by their count (PyTorch's total_weight, kept for the backward; 0 / 0 is NaN when every
// target is ignored); `backward` writes the gradient of the whole [N, C] input,
// -g / total_weight at each row's target and zero elsewhere. A target outside [0, C) that is not
// ignore_index raises the device's assert flag (CUDA's device-side assert) and counts nothing.
{{ENABLES}}
{{COMMON}}

@group(0) @binding(0) var<storage, read_write> x: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> labels: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<{{T}}>;
@group(0) @binding(3) var<storage, read_write> total: array<f32>;
@group(0) @binding(4) var<storage, read_write> flag: array<atomic<u32>>;

@compute @workgroup_size(256)
fn forward(@builtin(local_invocation_index) t: u32) {
    var s = 0.0;
    var count = 0.0;
    for (var i = t; i < p.n; i += 256u) {
        let ti = counted_target(i);
        if ti >= 0 {
            s -= f32(x[p.x_off + i * p.s0 + u32(ti) * p.s1]);
            count += 1.0;
        }
    }
    finish(t, s, count);
}

@compute @workgroup_size(256)
fn backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let at = element(gid, nw);
    if at.x >= p.n * p.c {
        return;
    }
    let e = at.x;
    let i = at.y;
    let j = at.z;
    var v = 0.0;
    if labels[p.t_off + i * p.st] == i32(j) {
        v = -f32(x[p.x_off]) / total[p.tw_off];
    }
    out[p.out_off + e] = {{T}}(v);
}
