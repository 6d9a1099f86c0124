// gather along one dim: out[c] = x[c with coordinate `dim` replaced by index[c]], for every
// coordinate c of `out` (whose shape is the index's). index_select and embedding are gathers
// over a broadcast index view. An index outside [0, size) writes 0 and raises the device's
// assert flag, which the next sync point turns into an error naming the op.
{{ENABLES}}
struct Params {
    numel: u32,
    rank: u32,
    dim: u32,
    x_off: u32,
    idx_off: u32,
    size: u32,
    pad0: u32,
    pad1: u32,
    shape: array<vec4<u32>, 2>,
    sx: array<vec4<u32>, 2>,
    si: array<vec4<u32>, 2>,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> x: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> index: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<{{T}}>;
@group(0) @binding(3) var<storage, read_write> flag: array<atomic<u32>>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let e = gid.x + gid.y * nw.x * 256u;
    if e >= p.numel {
        return;
    }
    var rem = e;
    var ox = p.x_off;
    var oi = p.idx_off;
    var c_dim = 0u;
    for (var d = i32(p.rank) - 1; d >= 0; d--) {
        let q = u32(d) / 4u;
        let r = u32(d) % 4u;
        let n = p.shape[q][r];
        let c = rem % n;
        rem = rem / n;
        oi += c * p.si[q][r];
        if u32(d) != p.dim {
            ox += c * p.sx[q][r];
        }
    }
    let i = index[oi];
    if i < 0 || u32(i) >= p.size {
        atomicMax(&flag[0], 1u);
        out[e] = {{T}}(0);
        return;
    }
    let q = p.dim / 4u;
    let r = p.dim % 4u;
    out[e] = x[ox + u32(i) * p.sx[q][r]];
}
