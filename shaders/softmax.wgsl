// softmax / log_softmax over rows of `units` (vec4s, or single elements padded into vec4 lanes
// with NEG, whose exp is 0). One workgroup per row: one pass keeps a running (max, sum of exp)
// per invocation, rescaled as the max grows; a tree merges the pairs; a second pass writes.
{{ENABLES}}
const NEG: f32 = -3.0e38;

struct Params {
    rows: u32,
    units: u32,
    rank: u32,
    off: u32,
    log: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
    shape: array<vec4<u32>, 2>,
    stride: array<vec4<u32>, 2>,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> x: array<{{TX}}>;
@group(0) @binding(1) var<storage, read_write> out: array<{{TX}}>;

var<workgroup> red_m: array<f32, 256>;
var<workgroup> red_s: array<f32, 256>;

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

fn load(e: u32) -> vec4<f32> {
    {{LOAD}}
}

fn store(e: u32, v: vec4<f32>) {
    {{STORE}}
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let row = wid.x + wid.y * nw.x;
    if row >= p.rows {
        return;
    }
    let base = row * p.units;
    var m = NEG;
    var s = 0.0;
    for (var j = t; j < p.units; j += 256u) {
        let v = load(base + j);
        let nm = max(m, max(max(v.x, v.y), max(v.z, v.w)));
        s = s * exp(m - nm) + dot(exp(v - vec4<f32>(nm)), vec4<f32>(1.0));
        m = nm;
    }
    red_m[t] = m;
    red_s[t] = s;
    workgroupBarrier();
    for (var k = 128u; k > 0u; k >>= 1u) {
        if t < k {
            let m1 = red_m[t];
            let m2 = red_m[t + k];
            let nm = max(m1, m2);
            red_s[t] = red_s[t] * exp(m1 - nm) + red_s[t + k] * exp(m2 - nm);
            red_m[t] = nm;
        }
        workgroupBarrier();
    }
    let mx = red_m[0];
    let sum = red_s[0];
    let log_sum = log(sum);
    for (var j = t; j < p.units; j += 256u) {
        let v = load(base + j) - vec4<f32>(mx);
        if p.log == 1u {
            store(base + j, v - vec4<f32>(log_sum));
        } else {
            store(base + j, exp(v) / sum);
        }
    }
}
