// Batch normalisation's per-channel pass, one invocation per channel, after the partial sums
// (`batch_norm_finalize_fns.wgsl` says what each direction computes).
struct Params {
    c: u32,
    chunks: u32,
    m: f32,
    eps: f32,
    momentum: f32,
    training: u32,
    o0: u32,
    o1: u32,
    o2: u32,
    o3: u32,
    o4: u32,
    pad0: u32,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> part: array<vec2<f32>>;
@group(0) @binding(1) var<storage, read_write> b1: array<f32>;
@group(0) @binding(2) var<storage, read_write> b2: array<f32>;
@group(0) @binding(3) var<storage, read_write> b3: array<f32>;
@group(0) @binding(4) var<storage, read_write> b4: array<f32>;
@group(0) @binding(5) var<storage, read_write> b5: array<f32>;

{{FNS}}

fn fin() -> Fin {
    return Fin(p.c, p.chunks, p.m, p.eps, p.momentum, p.training, p.o0, p.o1, p.o2, p.o3, p.o4);
}

@compute @workgroup_size(256)
fn forward(@builtin(global_invocation_id) gid: vec3<u32>) {
    if gid.x < p.c {
        finalize_forward(fin(), gid.x);
    }
}

@compute @workgroup_size(256)
fn backward(@builtin(global_invocation_id) gid: vec3<u32>) {
    if gid.x < p.c {
        finalize_backward(fin(), gid.x);
    }
}
