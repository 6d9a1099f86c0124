// nll_loss's backward as records, one a row: the row's factor -g / total_weight (0 on a row
// whose target counts for nothing) as f32 bits, then its target (-1 there), written at word
// out_off of `rec`: under autocast, into nll_loss's own f32 gradient, which is otherwise left
// unwritten; `cross_entropy_backward_words.wgsl` reads them when it applies the f32 copy's and
// log_softmax's backwards too (Note [Backward epilogues], `ops/loss.rs`).
{{ENABLES}}
{{COMMON}}

@group(0) @binding(0) var<storage, read_write> g: array<{{G}}>;
@group(0) @binding(1) var<storage, read_write> labels: array<i32>;
@group(0) @binding(2) var<storage, read_write> rec: array<u32>;
@group(0) @binding(3) var<storage, read_write> total: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = gid.x + gid.y * nw.x * 256u;
    if i >= p.n {
        return;
    }
    let ti = labels[p.t_off + i * p.st];
    var s = 0.0;
    var t = -1;
    if ti != p.ignore && ti >= 0 && u32(ti) < p.c {
        s = -f32(g[p.x_off]) / total[p.tw_off];
        t = ti;
    }
    rec[p.out_off + 2u * i] = bitcast<u32>(s);
    rec[p.out_off + 2u * i + 1u] = bitcast<u32>(t);
}
