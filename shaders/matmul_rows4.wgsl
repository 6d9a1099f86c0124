// `rows4`: `matmul_narrow.wgsl`'s `rows` (out[m, 0..n] for n <= 16, + bias[j] where flagged)
// where A is row-major and B is a row-major W read transposed (`sak == 1`, `sbk == 1`: a
// Linear's classifier head `h @ W^T`), on 16-byte loads along K, four rows a workgroup: each of
// A's vectors serves every column and each of W's the four rows. The invocations' shares of K
// are added by subgroup operations, then across the subgroups in shared memory. Offsets, A's
// and W's row strides and K are multiples of 4 (`ops/matmul_narrow.rs` checks); for adapters
// with subgroups (of 4 to 128 invocations, as WebGPU has them: at most 64 a workgroup here).
// On the H100 the head's 512x10 by K = 4096 takes 10 us here against `rows`' 21.
{{ENABLES}}
{{PARAMS}}
@group(0) @binding(0) var<storage, read_write> a: array<vec4<{{T}}>>;
@group(0) @binding(1) var<storage, read_write> b: array<vec4<{{T}}>>;
@group(0) @binding(2) var<storage, read_write> out: array<{{T}}>;
@group(0) @binding(3) var<storage, read_write> bias: array<{{T}}>;

// Subgroup s's sums of column j, one vec4 of the four rows.
var<workgroup> sums: array<array<vec4<f32>, 16>, 64>;

// Vector q of W's row j (its last row past n: those sums are not stored).
fn w4(j: u32, q: u32) -> vec4<f32> {
    return vec4<f32>(b[(p.off_b + min(j, p.n - 1u) * p.sbn) / 4u + q]);
}

// Column j's dot products with the four rows' vectors at q.
fn dots(x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>, j: u32, q: u32) -> vec4<f32> {
    let w = w4(j, q);
    return vec4<f32>(dot(x0, w), dot(x1, w), dot(x2, w), dot(x3, w));
}

// Columns j..j+3 summed over the subgroup, kept by its first invocation.
fn keep(sg: u32, lane: u32, j: u32, c0: vec4<f32>, c1: vec4<f32>, c2: vec4<f32>, c3: vec4<f32>) {
    let s0 = subgroupAdd(c0);
    let s1 = subgroupAdd(c1);
    let s2 = subgroupAdd(c2);
    let s3 = subgroupAdd(c3);
    if lane == 0u {
        sums[sg][j] = s0;
        sums[sg][j + 1u] = s1;
        sums[sg][j + 2u] = s2;
        sums[sg][j + 3u] = s3;
    }
}

@compute @workgroup_size(256)
fn rows4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32, @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) nsg: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let r0 = 4u * (wg.x + wg.y * p.groups_x);
    if r0 >= p.m {
        return;
    }
    // Rows r0..r0+3 of A (the last one repeated past m), in vectors.
    let rows = (min(vec4<u32>(r0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.m - 1u)) * p.sam
        + vec4<u32>(p.off_a)) / 4u;
    var c0 = vec4<f32>();
    var c1 = vec4<f32>();
    var c2 = vec4<f32>();
    var c3 = vec4<f32>();
    var c4 = vec4<f32>();
    var c5 = vec4<f32>();
    var c6 = vec4<f32>();
    var c7 = vec4<f32>();
    var c8 = vec4<f32>();
    var c9 = vec4<f32>();
    var c10 = vec4<f32>();
    var c11 = vec4<f32>();
    var c12 = vec4<f32>();
    var c13 = vec4<f32>();
    var c14 = vec4<f32>();
    var c15 = vec4<f32>();
    for (var q = t; q < p.k / 4u; q += 256u) {
        let x0 = vec4<f32>(a[rows.x + q]);
        let x1 = vec4<f32>(a[rows.y + q]);
        let x2 = vec4<f32>(a[rows.z + q]);
        let x3 = vec4<f32>(a[rows.w + q]);
        c0 += dots(x0, x1, x2, x3, 0u, q);
        c1 += dots(x0, x1, x2, x3, 1u, q);
        c2 += dots(x0, x1, x2, x3, 2u, q);
        c3 += dots(x0, x1, x2, x3, 3u, q);
        if p.n > 4u {
            c4 += dots(x0, x1, x2, x3, 4u, q);
            c5 += dots(x0, x1, x2, x3, 5u, q);
            c6 += dots(x0, x1, x2, x3, 6u, q);
            c7 += dots(x0, x1, x2, x3, 7u, q);
        }
        if p.n > 8u {
            c8 += dots(x0, x1, x2, x3, 8u, q);
            c9 += dots(x0, x1, x2, x3, 9u, q);
            c10 += dots(x0, x1, x2, x3, 10u, q);
            c11 += dots(x0, x1, x2, x3, 11u, q);
        }
        if p.n > 12u {
            c12 += dots(x0, x1, x2, x3, 12u, q);
            c13 += dots(x0, x1, x2, x3, 13u, q);
            c14 += dots(x0, x1, x2, x3, 14u, q);
            c15 += dots(x0, x1, x2, x3, 15u, q);
        }
    }
    keep(sg, lane, 0u, c0, c1, c2, c3);
    if p.n > 4u {
        keep(sg, lane, 4u, c4, c5, c6, c7);
    }
    if p.n > 8u {
        keep(sg, lane, 8u, c8, c9, c10, c11);
    }
    if p.n > 12u {
        keep(sg, lane, 12u, c12, c13, c14, c15);
    }
    workgroupBarrier();
    if t < 64u {
        let r = t / 16u;
        let j = t % 16u;
        if j < p.n && r0 + r < p.m {
            var v = 0.0;
            for (var s = 0u; s < nsg; s++) {
                v += sums[s][j][r];
            }
            if (p.flags & 1u) != 0u {
                v += f32(bias[p.off_bias + j]);
            }
            out[p.off_out + (r0 + r) * p.n + j] = {{T}}(v);
        }
    }
}
