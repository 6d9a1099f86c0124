// layer_norm's input gradient, a workgroup per row, from the saved mean and rstd: with
// g = dy * w and xh = (x - mean) * rstd,
//   dx = rstd * (g - (xh * sum(g * xh) + sum(g)) / n),
// one read of x and dy for the two sums and one more to write dx.
{{COMMON}}

@group(0) @binding(0) var<storage, read_write> x: array<{{E}}>;
@group(0) @binding(1) var<storage, read_write> w: array<{{E}}>;
@group(0) @binding(2) var<storage, read_write> dy: array<{{E}}>;
@group(0) @binding(3) var<storage, read_write> stats: array<f32>;
@group(0) @binding(4) var<storage, read_write> dx: array<{{E}}>;

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
    let gbase = row * p.units;
    let mean = {{W}}(stats[row]);
    let rstd = stats[p.rows + row];
    var a = {{W}}(0.0);
    var c = {{W}}(0.0);
    for (var u = li; u < p.units; u += WG) {
        let g = {{W}}(dy[gbase + u]) * weight_at(u);
        a += g * ({{W}}(x[base + u]) - mean) * rstd;
        c += g;
    }
    let s = sum2(lanes(a), lanes(c), li);
    let inv_n = 1.0 / f32(p.n);
    for (var u = li; u < p.units; u += WG) {
        let g = {{W}}(dy[gbase + u]) * weight_at(u);
        let xh = ({{W}}(x[base + u]) - mean) * rstd;
        dx[gbase + u] = {{E}}(rstd * (g - (xh * s.x + {{W}}(s.y)) * inv_n));
    }
}
