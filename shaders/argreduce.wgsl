// argmax / argmin along rows (one workgroup per row): each invocation keeps the best (value,
// index) of its elements, then a tree merges them. Ties go to the lower index and NaN beats
// every number (its first occurrence wins), as in PyTorch. Writes the value and the index.
{{ENABLES}}
struct Params {
    rows: u32,
    inner: u32,
    rank: u32,
    off: u32,
    is_min: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
    shape: array<vec4<u32>, 2>,
    stride: array<vec4<u32>, 2>,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> x: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> values: array<{{T}}>;
@group(0) @binding(2) var<storage, read_write> indices: array<i32>;

var<workgroup> best_v: array<f32, 256>;
var<workgroup> best_i: array<u32, 256>;

fn offset(e: u32) -> u32 {
    var rem = e;
    var o = p.off;
    for (var d = i32(p.rank) - 1; d >= 0; d--) {
        let q = u32(d) / 4u;
        let r = u32(d) % 4u;
        let n = p.shape[q][r];
        o += (rem % n) * p.stride[q][r];
        rem = rem / n;
    }
    return o;
}

// NaN from the bits: `x != x` may be folded away under WGSL's floating-point rules.
fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

// Whether (v, i) should replace (bv, bi).
fn better(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    if bi == 0xffffffffu {
        return true;
    }
    let v_nan = is_nan(v);
    let b_nan = is_nan(bv);
    if v_nan || b_nan {
        return v_nan && (!b_nan || i < bi);
    }
    if v == bv {
        return i < bi;
    }
    return select(v > bv, v < bv, p.is_min == 1u);
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let row = wid.x + wid.y * nw.x;
    if row >= p.rows {
        return;
    }
    var bv = 0.0;
    var bi = 0xffffffffu;
    for (var j = t; j < p.inner; j += 256u) {
        let v = f32(x[offset(row * p.inner + j)]);
        if better(v, j, bv, bi) {
            bv = v;
            bi = j;
        }
    }
    best_v[t] = bv;
    best_i[t] = bi;
    workgroupBarrier();
    for (var k = 128u; k > 0u; k >>= 1u) {
        if t < k && best_i[t + k] != 0xffffffffu && better(best_v[t + k], best_i[t + k], best_v[t], best_i[t]) {
            best_v[t] = best_v[t + k];
            best_i[t] = best_i[t + k];
        }
        workgroupBarrier();
    }
    if t == 0u {
        values[row] = {{T}}(best_v[0]);
        indices[row] = i32(best_i[0]);
    }
}
