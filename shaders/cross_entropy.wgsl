// cross_entropy as log_softmax then nll_loss (mean reduction), each pair of kernels in one
// (`ops/loss.rs`, `cross_entropy`; Note [Backward epilogues] for the backward):
// - `forward` (one workgroup): each invocation takes rows i, i + 256, ..: the row's max, the
//   sum of exp(x - max), then log_softmax's output y = (x - max) - log(sum) written whole
//   (rounded to the dtype, as log_softmax's kernel stores it), and -y[i, target[i]] (the stored
//   value, as nll_loss reads it) summed over the rows whose target is not ignore_index; the
//   workgroup adds the sums and counts up, the loss is their quotient and total_weight the
//   count. A target outside [0, C) that is not ignore_index raises the device's assert flag
//   and counts nothing, as `nll.wgsl` does.
// - `backward`: the logits' gradient, nll_loss's backward (-g / total_weight at each counted
//   row's target) with log_softmax's backward applied (minus exp(y) times the row's sum of that
//   gradient): dx[i, j] = s_i * ([j == t_i] - exp(y[i, j])), s_i = -g / total_weight on a
//   counted row, 0 on an ignored one.
{{ENABLES}}
{{COMMON}}

@group(0) @binding(0) var<storage, read_write> x: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> labels: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<{{T}}>;
@group(0) @binding(3) var<storage, read_write> total: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<{{T}}>;
@group(0) @binding(5) var<storage, read_write> flag: array<atomic<u32>>;

@compute @workgroup_size(256)
fn forward(@builtin(local_invocation_index) t: u32) {
    var s = 0.0;
    var count = 0.0;
    for (var i = t; i < p.n; i += 256u) {
        let row = p.x_off + i * p.s0;
        var m = f32(x[row]);
        for (var j = 1u; j < p.c; j++) {
            m = max(m, f32(x[row + j * p.s1]));
        }
        var e = 0.0;
        for (var j = 0u; j < p.c; j++) {
            e += exp(f32(x[row + j * p.s1]) - m);
        }
        // (x - max) - log(sum), in that order: a row of huge equal values gives -log(C), not
        // the 0 that x - (max + log(sum)) rounds to.
        let lse = log(e);
        let yrow = p.y_off + i * p.c;
        for (var j = 0u; j < p.c; j++) {
            y[yrow + j] = {{T}}((f32(x[row + j * p.s1]) - m) - lse);
        }
        let ti = counted_target(i);
        if ti >= 0 {
            s -= f32({{T}}((f32(x[row + u32(ti) * p.s1]) - m) - lse));
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
    let ti = labels[p.t_off + i * p.st];
    var s = 0.0;
    if ti != p.ignore && ti >= 0 && u32(ti) < p.c {
        s = -f32(x[p.x_off]) / total[p.tw_off];
    }
    let hit = select(0.0, 1.0, ti == i32(j));
    out[p.out_off + e] = {{T}}(s * (hit - exp(f32(y[p.y_off + e]))));
}
