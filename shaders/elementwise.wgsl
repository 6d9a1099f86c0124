// Elementwise kernel template: unary, binary and binary-with-scalar ops over strided inputs
// (any view, broadcast included) into a fresh contiguous output. `src/kernels/elementwise.rs`
// fills the {{...}} slots per (op, dtypes, contiguity); every variant is validated by naga.
//
// Immediates: element count, rank, element offsets of a and b (for the scalar form, off_b holds
// the scalar's bits), then shape and strides (in elements) of up to 8 dims, packed in vec4s.
{{ENABLES}}
struct Params {
    numel: u32,
    rank: u32,
    off_a: u32,
    off_b: u32,
    shape: array<vec4<u32>, 2>,
    stride_a: array<vec4<u32>, 2>,
    stride_b: array<vec4<u32>, 2>,
}

var<immediate> p: Params;

{{BINDINGS}}

// Storage offsets of output element i in a and b: unravel i over the shape, innermost last.
fn offsets(i: u32) -> vec2<u32> {
    var rem = i;
    var oa = p.off_a;
    var ob = p.off_b;
    for (var d = i32(p.rank) - 1; d >= 0; d--) {
        let q = u32(d) / 4u;
        let r = u32(d) % 4u;
        let n = p.shape[q][r];
        let c = rem % n;
        rem = rem / n;
        oa += c * p.stride_a[q][r];
        ob += c * p.stride_b[q][r];
    }
    return vec2<u32>(oa, ob);
}

{{HELPERS}}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let base = gid.x + gid.y * nw.x * 256u;
    let total = nw.x * nw.y * 256u;
    for (var k = 0u; k < {{PER_THREAD}}u; k++) {
        let i = base + k * total;
        if i >= p.numel {
            return;
        }
        {{BODY}}
    }
}
