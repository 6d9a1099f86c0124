// Batched matmul out[b] = a[b] @ b[b] over any strides (transposed inputs are read through
// their strides, no copy), f32 accumulation. Each workgroup computes a 64x64 tile of `out`
// through 16-deep slices of a and b staged in shared memory; each of its 16x16 invocations
// owns a 4x4 sub-tile strided by 16 (rows l.y + 16i, columns l.x + 16j), so shared-memory reads
// are broadcast (a) or consecutive (b), and the stores are coalesced. Built as a trusted
// module: every index below is guarded explicitly.
var<workgroup> tile_a: array<array<f32, 64>, 16>;
var<workgroup> tile_b: array<array<f32, 64>, 16>;

// Columns n, n + 16, n + 32, n + 48 of row m.
fn store_row(bt: u32, m: u32, n: u32, v: vec4<f32>) {
    if m >= p.m {
        return;
    }
    let base = (bt * p.m + m) * p.n;
    for (var j = 0u; j < 4u; j++) {
        if n + 16u * j < p.n {
            out[base + n + 16u * j] = {{T}}(v[j]);
        }
    }
}

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let bt = wg.z;
    let m0 = wg.y * 64u;
    let n0 = wg.x * 64u;
    let a_base = p.off_a + bt * p.sab;
    let b_base = p.off_b + bt * p.sbb;
    // Row i of this invocation's 4x4 sub-tile is acc_i; its columns are the vec4 components.
    var acc0 = vec4<f32>();
    var acc1 = vec4<f32>();
    var acc2 = vec4<f32>();
    var acc3 = vec4<f32>();
    for (var k0 = 0u; k0 < p.k; k0 += 16u) {
        for (var r = 0u; r < 4u; r++) {
            let e = li + r * 256u;
            let mm = e / 16u;
            let kk = e % 16u;
            var v = 0.0;
            if m0 + mm < p.m && k0 + kk < p.k {
                v = f32(a[a_base + (m0 + mm) * p.sam + (k0 + kk) * p.sak]);
            }
            tile_a[kk][mm] = v;
        }
        for (var r = 0u; r < 4u; r++) {
            let e = li + r * 256u;
            let kk = e / 64u;
            let nn = e % 64u;
            var v = 0.0;
            if k0 + kk < p.k && n0 + nn < p.n {
                v = f32(b[b_base + (k0 + kk) * p.sbk + (n0 + nn) * p.sbn]);
            }
            tile_b[kk][nn] = v;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < 16u; kk++) {
            let av = vec4<f32>(tile_a[kk][l.y], tile_a[kk][l.y + 16u], tile_a[kk][l.y + 32u], tile_a[kk][l.y + 48u]);
            let bv = vec4<f32>(tile_b[kk][l.x], tile_b[kk][l.x + 16u], tile_b[kk][l.x + 32u], tile_b[kk][l.x + 48u]);
            acc0 += av.x * bv;
            acc1 += av.y * bv;
            acc2 += av.z * bv;
            acc3 += av.w * bv;
        }
        workgroupBarrier();
    }
    store_row(bt, m0 + l.y, n0 + l.x, acc0);
    store_row(bt, m0 + l.y + 16u, n0 + l.x, acc1);
    store_row(bt, m0 + l.y + 32u, n0 + l.x, acc2);
    store_row(bt, m0 + l.y + 48u, n0 + l.x, acc3);
}
