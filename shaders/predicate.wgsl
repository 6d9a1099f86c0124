// Kernels around bool tensors (one byte per element, as in PyTorch; WGSL has no 8-bit storage,
// so bool buffers are array<u32> read and written a byte at a time):
//   compare: out_bool[e] = x OP y          (each invocation writes one word: four bools)
//   cast:    out[e] = TO(x)                (to bool: four per invocation, like compare)
//   select:  out[e] = cond[e] ? y : out[e] (in place on a contiguous output; y a tensor or a
//            scalar carried in off_b)
// Operands are strided/broadcast views (shape and strides in the immediates); the output is
// contiguous. {{...}} slots are filled by src/kernels/predicate.rs.
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

fn offsets(e: u32) -> vec2<u32> {
    var rem = e;
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

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = gid.x + gid.y * nw.x * 256u;
    {{BODY}}
}
