// scatter_add into a fresh contiguous copy of self: out[c with coordinate dim replaced by
// index[c]] += src[c], for every coordinate c of the index (src made contiguous in the index's
// shape). Several c may hit one element, so the add is atomic: native for i32, a
// compare-exchange loop on the bits for f32 (WGSL has no float atomics). A bad index skips
// its element and raises the device's assert flag.
struct Params {
    numel: u32,
    rank: u32,
    dim: u32,
    out_off: u32,
    idx_off: u32,
    size: u32,
    pad0: u32,
    pad1: u32,
    shape: array<vec4<u32>, 2>,
    so: array<vec4<u32>, 2>,
    si: array<vec4<u32>, 2>,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> src: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> index: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<atomic<{{ATOMIC}}>>;
@group(0) @binding(3) var<storage, read_write> flag: array<atomic<u32>>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let e = gid.x + gid.y * nw.x * 256u;
    if e >= p.numel {
        return;
    }
    var rem = e;
    var oo = p.out_off;
    var oi = p.idx_off;
    for (var d = i32(p.rank) - 1; d >= 0; d--) {
        let q = u32(d) / 4u;
        let r = u32(d) % 4u;
        let n = p.shape[q][r];
        let c = rem % n;
        rem = rem / n;
        oi += c * p.si[q][r];
        if u32(d) != p.dim {
            oo += c * p.so[q][r];
        }
    }
    let i = index[oi];
    if i < 0 || u32(i) >= p.size {
        atomicMax(&flag[0], 1u);
        return;
    }
    let at = oo + u32(i) * p.so[p.dim / 4u][p.dim % 4u];
    {{ADD}}
}
