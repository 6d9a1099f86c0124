// `short4`: a product with a K of 16 or less (the head's input gradient `g @ W`, K = 10) where
// B is row-major on whole vec4s: `matmul_narrow.wgsl`'s `short` four columns at a time, so that
// each of B's 16-byte vectors serves four rows and each of A's elements (the same across a
// subgroup) four columns, and the stores are 16 bytes. One invocation per four columns and
// four rows (256 columns by 16 rows per workgroup), K walked serially. B's offset and row
// stride, N, and the output's offset are multiples of 4 (`ops/matmul_narrow.rs` checks).
// Its bindings: A, B, the output and the mask, at 0 to 3 alone; at 0 and 4 to 6 in
// `matmul_head_grads.wgsl`, whose A (binding 0) it shares with `cols`.
{{ENABLES}}
{{PARAMS}}
{{SHORT4_A}}
@group(0) @binding({{SHORT4_B}}) var<storage, read_write> b4: array<vec4<{{T}}>>;
@group(0) @binding({{SHORT4_OUT}}) var<storage, read_write> out4: array<vec4<{{T}}>>;
// The narrow kernels' fourth binding: here only the mask of flag bit 2 (ReluBackward0's
// formula: the product kept where the ReLU's saved output, [m, n] contiguous at an offset of
// whole vec4s, is not <= 0).
@group(0) @binding({{SHORT4_MASK}}) var<storage, read_write> mask4: array<vec4<{{T}}>>;

@compute @workgroup_size(64, 4)
fn short4(@builtin(global_invocation_id) g: vec3<u32>) {
    short4_at(g);
}

// The invocation at global id `g` of `short4`'s grid.
fn short4_at(g: vec3<u32>) {
    let j4 = g.x;
    let r0 = 4u * g.y;
    if 4u * j4 >= p.n || r0 >= p.m {
        return;
    }
    // Rows r0..r0+3 of A (the last one repeated past m).
    let rows = min(vec4<u32>(r0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.m - 1u)) * p.sam
        + vec4<u32>(p.off_a);
    let b0 = p.off_b / 4u + j4;
    let sbk4 = p.sbk / 4u;
    var acc0 = vec4<f32>();
    var acc1 = vec4<f32>();
    var acc2 = vec4<f32>();
    var acc3 = vec4<f32>();
    for (var k = 0u; k < p.k; k++) {
        let w = vec4<f32>(b4[b0 + k * sbk4]);
        let at = rows + vec4<u32>(k * p.sak);
        acc0 = fma(vec4<f32>(f32(a[at.x])), w, acc0);
        acc1 = fma(vec4<f32>(f32(a[at.y])), w, acc1);
        acc2 = fma(vec4<f32>(f32(a[at.z])), w, acc2);
        acc3 = fma(vec4<f32>(f32(a[at.w])), w, acc3);
    }
    let row = (p.off_out + r0 * p.n) / 4u + j4;
    let n4 = p.n / 4u;
    store_short4(row, acc0);
    if r0 + 1u < p.m {
        store_short4(row + n4, acc1);
    }
    if r0 + 2u < p.m {
        store_short4(row + 2u * n4, acc2);
    }
    if r0 + 3u < p.m {
        store_short4(row + 3u * n4, acc3);
    }
}

// Vector `at` of the output (the mask's vector at the same place, past its offset).
fn store_short4(at: u32, acc: vec4<f32>) {
    var v = vec4<{{T}}>(acc);
    if (p.flags & 4u) != 0u {
        let mask = mask4[p.off_bias / 4u + (at - p.off_out / 4u)];
        v = select(v, vec4<{{T}}>(), mask <= vec4<{{T}}>());
    }
    out4[at] = v;
}
