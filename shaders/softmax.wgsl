// softmax / log_softmax over rows of `units` (vec4s, or single elements padded into vec4 lanes
// with -inf, whose exp is 0). One pass keeps a running (max, sum of exp), rescaled as the max
// grows; a second pass writes. `main` comes from softmax_tree.wgsl (a workgroup per row, its
// invocations' pairs merged by a tree) or softmax_serial.wgsl (an invocation per row).
//
// Extreme rows give PyTorch's answers, decided on the bits (drivers may assume no inf/NaN in
// float compares): a row with a NaN or +inf, or whose elements are all -inf, is all NaN; a row
// of huge finite values (-3.3e38 everywhere) is exactly uniform, because the max starts at -inf
// rather than at a large negative number and empty partial sums are never rescaled.
{{ENABLES}}

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

// -inf and NaN made at run time from a zero immediate, so that no constant folding meets them.
fn neg_inf() -> f32 {
    return bitcast<f32>(p.pad0 | 0xff800000u);
}

fn nan() -> f32 {
    return bitcast<f32>(p.pad0 | 0x7fc00000u);
}

// 1 for each lane that is NaN or +inf.
fn bad_lanes(v: vec4<f32>) -> u32 {
    let b = bitcast<vec4<u32>>(v);
    let nan = (b & vec4<u32>(0x7fffffffu)) > vec4<u32>(0x7f800000u);
    let pos_inf = b == vec4<u32>(0x7f800000u);
    return u32(any(nan | pos_inf));
}

// s * exp(m - nm), where an empty sum stays 0 (m = nm = -inf would make exp(NaN)).
fn rescale(s: f32, m: f32, nm: f32) -> f32 {
    if s == 0.0 {
        return 0.0;
    }
    return s * exp(m - nm);
}

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

// The running (max, sum) after the units v: skips a unit of -inf while the max is -inf.
fn accumulate(m: ptr<function, f32>, s: ptr<function, f32>, v: vec4<f32>) {
    let nm = max(*m, max(max(v.x, v.y), max(v.z, v.w)));
    if bitcast<u32>(nm) != 0xff800000u {
        *s = rescale(*s, *m, nm) + dot(exp(v - vec4<f32>(nm)), vec4<f32>(1.0));
        *m = nm;
    }
}

// Writes row `base`'s `units` from its max and sum (all NaN for a bad row, as PyTorch).
fn write_row(base: u32, first: u32, step: u32, mx: f32, sum: f32, bad: u32) {
    if bad != 0u || bitcast<u32>(mx) == 0xff800000u {
        for (var j = first; j < p.units; j += step) {
            store(base + j, vec4<f32>(nan()));
        }
        return;
    }
    let log_sum = log(sum);
    for (var j = first; j < p.units; j += step) {
        let v = load(base + j) - vec4<f32>(mx);
        if p.log == 1u {
            store(base + j, v - vec4<f32>(log_sum));
        } else {
            store(base + j, exp(v) / sum);
        }
    }
}

{{MAIN}}
