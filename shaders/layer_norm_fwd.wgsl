// layer_norm's forward pass, a workgroup per row: one read of the row for its sums, taken
// about the row's first element (shifted sums keep the variance of rows whose mean dwarfs
// their spread), then one read and one write for y = (x - mean) * rstd * w + b. Writes the
// mean and rstd that the backward pass reads, as PyTorch saves them.
{{COMMON}}

@group(0) @binding(0) var<storage, read_write> x: array<{{E}}>;
@group(0) @binding(1) var<storage, read_write> w: array<{{E}}>;
@group(0) @binding(2) var<storage, read_write> b: array<{{E}}>;
@group(0) @binding(3) var<storage, read_write> y: array<{{E}}>;
@group(0) @binding(4) var<storage, read_write> stats: array<f32>;

fn bias_at(u: u32) -> {{W}} {
    if (p.flags & 2u) == 0u {
        return {{W}}(0.0);
    }
    return {{W}}(b[p.b_off + u]);
}

@compute @workgroup_size({{WG_SIZE}})
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nw: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = row_of(wid, nw, lid);
    let li = lane_of(lid);
    if row >= p.rows {
        return;
    }
    let base = p.x_off + row * p.units;
    let shift = {{W}}({{FIRST}});
    var s1 = {{W}}(0.0);
    var s2 = {{W}}(0.0);
    for (var u = li; u < p.units; u += WG) {
        let d = {{W}}(x[base + u]) - shift;
        s1 += d;
        s2 += d * d;
    }
    let s = sum2(lanes(s1), lanes(s2), li);
    let nf = f32(p.n);
    let m1 = s.x / nf;
    let mean = {{FIRST}} + m1;
    let rstd = inverseSqrt(max(s.y / nf - m1 * m1, 0.0) + p.eps);
    for (var u = li; u < p.units; u += WG) {
        let xh = ({{W}}(x[base + u]) - {{W}}(mean)) * rstd;
        y[row * p.units + u] = {{E}}(xh * weight_at(u) + bias_at(u));
    }
    if li == 0u {
        stats[row] = mean;
        stats[p.rows + row] = rstd;
    }
}
