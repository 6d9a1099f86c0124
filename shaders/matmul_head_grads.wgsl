// A classifier head's two gradients in one dispatch (`ops/matmul_narrow.rs`, `grouped`): its
// weight's, `g^T @ h` with the bias's beside it (`cols` of `matmul_narrow.wgsl`, immediates
// `hp.p`), and its input's, `g @ W` with ReLU's mask (`short4` of `matmul_short4.wgsl`,
// `hp.q`). Both read `g` (binding 0); neither reads what the other writes. Launched apart, the
// second waits for the first to drain, and each is a few workgroups a streaming
// multiprocessor with little to hide their latency; here `cols`'s workgroups come first and
// `short4`'s fill the machine beside them.
{{ENABLES}}
{{PARAMS}}
{{COLS}}
{{SHORT4}}
@compute @workgroup_size(256)
fn head_grads(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    if wg.x < hp.p.split {
        cols_at(wg.x, t);
        return;
    }
    // `short4`'s workgroups of 64x4, hp.q.split of them along x.
    let w = wg.x - hp.p.split;
    let gx = hp.q.split;
    short4_at(vec3<u32>((w % gx) * 64u + t % 64u, (w / gx) * 4u + t / 64u, 0u));
}
