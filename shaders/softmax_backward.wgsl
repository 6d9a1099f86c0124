// The backward of softmax and log_softmax over rows of a contiguous output y and gradient g
// (PyTorch's `_softmax_backward_data`, `_log_softmax_backward_data`), one invocation per row:
// log_softmax: dx = g - exp(y) * sum(g); softmax: dx = y * (g - sum(g * y)). For short rows (a
// classifier's classes), where the composite backward is four launches of tiny kernels.
{{ENABLES}}
struct Params {
    rows: u32,
    inner: u32,
    y_off: u32,
    g_off: u32,
    out_off: u32,
    log: u32,
    pad0: u32,
    pad1: u32,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> y: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> g: array<{{T}}>;
@group(0) @binding(2) var<storage, read_write> out: array<{{T}}>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let r = gid.x + gid.y * nw.x * 64u;
    if r >= p.rows {
        return;
    }
    let base = r * p.inner;
    var s = 0.0;
    for (var j = 0u; j < p.inner; j++) {
        let gj = f32(g[p.g_off + base + j]);
        if p.log != 0u {
            s += gj;
        } else {
            s += gj * f32(y[p.y_off + base + j]);
        }
    }
    for (var j = 0u; j < p.inner; j++) {
        let gj = f32(g[p.g_off + base + j]);
        let yj = f32(y[p.y_off + base + j]);
        var v: f32;
        if p.log != 0u {
            v = gj - exp(yj) * s;
        } else {
            v = yj * (gj - s);
        }
        out[p.out_off + base + j] = {{T}}(v);
    }
}
