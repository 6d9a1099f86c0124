// Batch normalisation's per-channel pass, one invocation per channel, after the partial sums
// (`batch_norm_finalize_fns.wgsl` says what each direction computes).
{{FIN}}

var<immediate> p: Fin;

@group(0) @binding(0) var<storage, read_write> part: array<vec2<f32>>;
@group(0) @binding(1) var<storage, read_write> b1: array<f32>;
@group(0) @binding(2) var<storage, read_write> b2: array<f32>;
@group(0) @binding(3) var<storage, read_write> b3: array<f32>;
@group(0) @binding(4) var<storage, read_write> b4: array<f32>;
@group(0) @binding(5) var<storage, read_write> b5: array<f32>;

{{FNS}}

@compute @workgroup_size(256)
fn forward(@builtin(global_invocation_id) gid: vec3<u32>) {
    if gid.x < p.c {
        finalize_forward(p, gid.x);
    }
}

@compute @workgroup_size(256)
fn backward(@builtin(global_invocation_id) gid: vec3<u32>) {
    if gid.x < p.c {
        finalize_backward(p, gid.x);
    }
}
