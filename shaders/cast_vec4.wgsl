// A contiguous float cast four elements per invocation (f32 <-> f16): the casts autocast makes
// of every weight and of every weight gradient each step, at HBM speed where the strided
// predicate kernel reads and writes one scalar per invocation. Counts and offsets in vec4s.
{{ENABLES}}

struct Params {
    n: u32,
    in_off: u32,
    out_off: u32,
    pad0: u32,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> x: array<vec4<{{I}}>>;
@group(0) @binding(1) var<storage, read_write> out: array<vec4<{{O}}>>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = gid.x + gid.y * nw.x * 256u;
    if i >= p.n {
        return;
    }
    out[p.out_off + i] = vec4<{{O}}>(x[p.in_off + i]);
}
