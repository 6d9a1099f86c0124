// The backward of softmax and log_softmax over rows of a contiguous output y and gradient g
// (PyTorch's `_softmax_backward_data`, `_log_softmax_backward_data`):
// log_softmax: dx = g - exp(y) * sum(g); softmax: dx = y * (g - sum(g * y)).
// - `main`: one invocation per row, for short rows (a classifier's classes).
// - `rows_tree`: a workgroup of 256 per row (invocation t takes units t, t + 256, ..., a
//   tree in workgroup memory adds their sums), for long rows (ImageNet's 1000 classes).
// Either is one launch and one output, as PyTorch's; the composite formula would be four
// launches and three temporaries. A unit is a vec4 of the dtype where rows are whole vec4s at
// vec4-aligned offsets (`{{TX}}` is then `vec4<{{T}}>`, and `inner` and the offsets count
// vec4s), else one element, carried in lane x of a vec4 whose other lanes are 0 (they add
// nothing to the sums and are not stored).
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

@group(0) @binding(0) var<storage, read_write> y: array<{{TX}}>;
@group(0) @binding(1) var<storage, read_write> g: array<{{TX}}>;
@group(0) @binding(2) var<storage, read_write> out: array<{{TX}}>;

fn load_y(at: u32) -> vec4<f32> {
    {{LOAD_Y}}
}

fn load_g(at: u32) -> vec4<f32> {
    {{LOAD_G}}
}

fn store(at: u32, v: vec4<f32>) {
    {{STORE}}
}

// Unit `at`'s gradient given the row's sum.
fn grad_at(at: u32, s: f32) -> vec4<f32> {
    let gj = load_g(p.g_off + at);
    let yj = load_y(p.y_off + at);
    if p.log != 0u {
        return gj - exp(yj) * s;
    }
    return yj * (gj - s);
}

// Unit `at`'s term of the row's sum.
fn term_at(at: u32) -> f32 {
    let gj = load_g(p.g_off + at);
    if p.log != 0u {
        return dot(gj, vec4<f32>(1.0));
    }
    return dot(gj, load_y(p.y_off + at));
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let r = gid.x + gid.y * nw.x * 64u;
    if r >= p.rows {
        return;
    }
    let base = r * p.inner;
    var s = 0.0;
    for (var j = 0u; j < p.inner; j++) {
        s += term_at(base + j);
    }
    for (var j = 0u; j < p.inner; j++) {
        store(p.out_off + base + j, grad_at(base + j, s));
    }
}

var<workgroup> partial: array<f32, 256>;

// The sum of a workgroup of 256's terms `s`, in every invocation.
fn row_sum(t: u32, s: f32) -> f32 {
    partial[t] = s;
    workgroupBarrier();
    for (var k = 128u; k > 0u; k >>= 1u) {
        if t < k {
            partial[t] += partial[t + k];
        }
        workgroupBarrier();
    }
    return partial[0];
}

@compute @workgroup_size(256)
fn rows_tree(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let r = wid.x + wid.y * nw.x;
    // (The whole workgroup leaves together: the barriers below stay uniform.)
    if r >= p.rows {
        return;
    }
    let base = r * p.inner;
    var s = 0.0;
    for (var j = t; j < p.inner; j += 256u) {
        s += term_at(base + j);
    }
    let total = row_sum(t, s);
    for (var j = t; j < p.inner; j += 256u) {
        store(p.out_off + base + j, grad_at(base + j, total));
    }
}
