// `a + b` of an f32 and an f16 tensor into f32, four elements per invocation: under autocast a
// residual stream (f32) plus a block's output (f16), as PyTorch's add promotes inside its one
// kernel, where kiln cast the f16 operand to a fresh f32 tensor first (24 casts of [8192, 768]
// a GPT-2 step). f16 -> f32 is exact, so the sum is the promoted add's to the bit. Contiguous
// operands of one shape; counts and offsets in vec4s.
enable f16;

struct Params {
    n: u32,
    a_off: u32,
    b_off: u32,
    out_off: u32,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> a: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> b: array<vec4<f16>>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = gid.x + gid.y * nw.x * 256u;
    if i >= p.n {
        return;
    }
    out[p.out_off + i] = a[p.a_off + i] + vec4<f32>(b[p.b_off + i]);
}
