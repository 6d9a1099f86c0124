// Batched matmul with the contract of matmul.wgsl (same immediates, any strides, f32
// accumulation) and no workgroup memory: each invocation of an 8x8 workgroup computes a 4x4
// block of `out` (rows 4 * l.y + i, columns 4 * l.x + j of the workgroup's 32x32 tile) straight
// from the operands, so there is no staging and no barrier. What a CPU running the shader
// (lavapipe, llvmpipe) wants; built trusted: loads clamp their row and column into range (the
// extra rows and columns are computed and never stored), stores are guarded.
// (`store_row`: `matmul_store_row.wgsl`, put before this file by `Kernel::source`.)
@compute @workgroup_size(8, 8)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>) {
    let bt = wg.z;
    let m = wg.y * 32u + l.y * 4u;
    let n = wg.x * 32u + l.x * 4u;
    let a_base = p.off_a + bt * p.sab;
    let b_base = p.off_b + bt * p.sbb;
    // Clamped rows and columns: every load is in range.
    let ar = vec4<u32>(min(m, p.m - 1u), min(m + 1u, p.m - 1u), min(m + 2u, p.m - 1u), min(m + 3u, p.m - 1u)) * p.sam + vec4<u32>(a_base);
    let bc = vec4<u32>(min(n, p.n - 1u), min(n + 1u, p.n - 1u), min(n + 2u, p.n - 1u), min(n + 3u, p.n - 1u)) * p.sbn + vec4<u32>(b_base);
    var acc0 = vec4<f32>();
    var acc1 = vec4<f32>();
    var acc2 = vec4<f32>();
    var acc3 = vec4<f32>();
    for (var k = 0u; k < p.k; k++) {
        let ak = k * p.sak;
        let bk = k * p.sbk;
        let bv = vec4<f32>(f32(b[bc.x + bk]), f32(b[bc.y + bk]), f32(b[bc.z + bk]), f32(b[bc.w + bk]));
        acc0 += f32(a[ar.x + ak]) * bv;
        acc1 += f32(a[ar.y + ak]) * bv;
        acc2 += f32(a[ar.z + ak]) * bv;
        acc3 += f32(a[ar.w + ak]) * bv;
    }
    store_row(bt, m, n, acc0);
    store_row(bt, m + 1u, n, acc1);
    store_row(bt, m + 2u, n, acc2);
    store_row(bt, m + 3u, n, acc3);
}
